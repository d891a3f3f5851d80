//! The agent's HTTP endpoints on `--metrics-bind` (default `:10263`; kube-proxy uses 10249 and 10256).
//!
//! ```text
//! GET /healthz ─► AgentHealth::report() ─► 200 | 503, JSON {lastUpdated, currentTime, nodeName, healthy,
//!                                                           observedRevision}
//! GET /readyz  ─► 200 after the first successful sync (cached plan or API), else 503
//! GET /metrics ─► the registry (SyncMetrics + LiveMetrics), OpenMetrics text
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::health::AgentHealth;
use crate::error::Error;

#[derive(Clone)]
struct AppState {
    health: Arc<AgentHealth>,
    registry: Arc<Registry>,
}

/// The router.
pub fn router(health: Arc<AgentHealth>, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState { health, registry })
}

/// Parses `--metrics-bind`: `HOST:PORT`, or `:PORT` for every address.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("[::]{text}")
    } else {
        text.to_string()
    };
    full.parse()
        .map_err(|e| format!("{text:?} is not an address like :10263 or 127.0.0.1:10263 ({e})"))
}

/// Binds `addr` (falling back from `[::]` to `0.0.0.0` where IPv6 is off) and serves until the task
/// is aborted. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<AgentHealth>,
    registry: Arc<Registry>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(_) if addr.ip().is_unspecified() && addr.is_ipv6() => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            tokio::net::TcpListener::bind(v4)
                .await
                .map_err(|source| Error::BindMetrics { addr: v4, source })?
        }
        Err(source) => return Err(Error::BindMetrics { addr, source }),
    };
    let bound = listener
        .local_addr()
        .map_err(|source| Error::BindMetrics { addr, source })?;
    let app = router(health, registry);
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics server stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /healthz, /readyz and /metrics");
    Ok((bound, task))
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let report = state.health.report();
    let code = if report.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::to_string(&report).unwrap_or_default();
    (
        code,
        [
            ("content-type", "application/json"),
            ("x-content-type-options", "nosniff"),
        ],
        body,
    )
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no plan applied yet\n")
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &state.registry).is_err() {
        text.clear();
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_parse_like_go() {
        assert_eq!(parse_bind(":10263").unwrap().to_string(), "[::]:10263");
        assert_eq!(parse_bind("127.0.0.1:9").unwrap().to_string(), "127.0.0.1:9");
        assert!(parse_bind("10263").is_err());
    }
}
