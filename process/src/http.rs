//! The health and metrics endpoints both binaries serve on `--metrics-bind`.
//!
//! ```text
//! --metrics-bind ":PORT" | "HOST:PORT" ─► parse_bind ─► SocketAddr (":PORT" = [::]:PORT, dual-stack)
//!                                                        │
//!   serve(addr, endpoints) ─► bind (from [::] to 0.0.0.0 where IPv6 is off) ─► axum task
//!        GET /healthz ─► Endpoints::healthz()   GET /livez ─► Endpoints::livez()   GET /readyz ─► Endpoints::readyz()
//!        GET /metrics ─► Endpoints::metrics(), OpenMetrics text
//! ```
//!
//! `:PORT` means every address of both families, as in Go's `net.Listen(":PORT")`: a socket bound to
//! `[::]` also accepts IPv4 (as `::ffff:a.b.c.d`), so the same default serves IPv4-only, IPv6-only and
//! dual-stack clusters' probes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::Error;

/// The content type of `/metrics`.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One probe's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// 200 when true, else 503.
    pub ok: bool,
    /// `text/plain; charset=utf-8` or `application/json`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Probe {
    /// A plain-text answer.
    pub fn text(ok: bool, body: impl Into<String>) -> Self {
        Self {
            ok,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// What a binary answers on its endpoints.
pub trait Endpoints: Send + Sync + 'static {
    /// `GET /healthz`: is the process alive (its loop not stalled)?
    fn healthz(&self) -> Probe;
    /// `GET /livez`: what a liveness probe asks; the same as `/healthz` unless a binary says otherwise.
    fn livez(&self) -> Probe {
        self.healthz()
    }
    /// `GET /readyz`: has it done its first job (initial sync, first plan applied)?
    fn readyz(&self) -> Probe;
    /// `GET /metrics`: the registry in OpenMetrics text.
    fn metrics(&self) -> String;
}

/// Parses `--metrics-bind`: `HOST:PORT`, or `:PORT` for every address of both families.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("[::]{text}")
    } else {
        text.to_string()
    };
    full.parse()
        .map_err(|e| format!("{text:?} is not an address like :10263, 127.0.0.1:10263 or [::1]:10263 ({e})"))
}

/// The router: `/healthz`, `/readyz` and `/metrics`.
pub fn router(endpoints: Arc<dyn Endpoints>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(endpoints)
}

/// Binds `addr` (from `[::]` to `0.0.0.0` where the host has IPv6 off) and serves the endpoints until
/// the task is aborted. Returns the bound address and the task.
pub async fn serve(
    addr: SocketAddr,
    endpoints: Arc<dyn Endpoints>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(_) if addr.ip().is_unspecified() && addr.is_ipv6() => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            tokio::net::TcpListener::bind(v4)
                .await
                .map_err(|source| Error::Bind { addr: v4, source })?
        }
        Err(source) => return Err(Error::Bind { addr, source }),
    };
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let app = router(endpoints);
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics server stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /healthz, /readyz and /metrics");
    Ok((bound, task))
}

fn answer(probe: Probe) -> Response {
    let code = if probe.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [
            ("content-type", probe.content_type),
            ("x-content-type-options", "nosniff"),
        ],
        probe.body,
    )
        .into_response()
}

async fn healthz(State(endpoints): State<Arc<dyn Endpoints>>) -> Response {
    answer(endpoints.healthz())
}

async fn livez(State(endpoints): State<Arc<dyn Endpoints>>) -> Response {
    answer(endpoints.livez())
}

async fn readyz(State(endpoints): State<Arc<dyn Endpoints>>) -> Response {
    answer(endpoints.readyz())
}

/// A scrape can read the kernel (the agent's traffic counters: a netlink dump, ~0.3 s at 10,000
/// Services), so it runs on the blocking pool, never on a runtime worker the sync loop shares.
async fn metrics(State(endpoints): State<Arc<dyn Endpoints>>) -> Response {
    match tokio::task::spawn_blocking(move || endpoints.metrics()).await {
        Ok(text) => ([("content-type", OPENMETRICS)], text).into_response(),
        Err(error) => {
            tracing::error!(%error, "rendering /metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn binds_parse_like_go() {
        let cases = [
            (":10262", Ok("[::]:10262")),
            (":10263", Ok("[::]:10263")),
            ("127.0.0.1:9", Ok("127.0.0.1:9")),
            ("[::1]:9", Ok("[::1]:9")),
            ("0.0.0.0:10262", Ok("0.0.0.0:10262")),
            ("10263", Err(())),
            ("localhost:10263", Err(())),
            (":99999", Err(())),
        ];
        for (text, want) in cases {
            let got = parse_bind(text).map(|a| a.to_string()).map_err(|_| ());
            assert_eq!(got, want.map(str::to_string), "{text}");
        }
        assert_eq!(
            parse_bind("10263").unwrap_err(),
            "\"10263\" is not an address like :10263, 127.0.0.1:10263 or [::1]:10263 (invalid socket address syntax)"
        );
    }

    struct Fixed;

    impl Endpoints for Fixed {
        fn healthz(&self) -> Probe {
            Probe::text(true, "ok\n")
        }
        fn readyz(&self) -> Probe {
            Probe::text(false, "initial sync not done\n")
        }
        fn metrics(&self) -> String {
            "switchyard_test_total 1\n# EOF\n".into()
        }
    }

    /// One HTTP/1.0 GET over a fresh connection to `addr`; the whole response.
    async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nhost: test\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok(response)
    }

    /// The default `:PORT` must answer probes over IPv6 as well as IPv4: kubelets of IPv6-only
    /// clusters probe the pod's IPv6 address (the controller once bound `0.0.0.0` for `:PORT`).
    #[tokio::test]
    async fn the_default_bind_answers_over_both_families() {
        let (bound, task) = serve(parse_bind(":0").unwrap(), Arc::new(Fixed)).await.unwrap();
        let port = bound.port();
        let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        let v4 = SocketAddr::from(([127, 0, 0, 1], port));
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            assert!(
                bound.is_ipv6(),
                "{bound}: IPv6 works here, so :PORT must bind [::]"
            );
            let response = get(v6, "/healthz").await.unwrap();
            assert!(response.starts_with("HTTP/1.0 200"), "{response}");
            assert!(response.ends_with("ok\n"), "{response}");
        } else {
            // A host with IPv6 off: the fallback to 0.0.0.0 is the only choice left.
            assert!(bound.is_ipv4(), "{bound}");
            eprintln!("note: IPv6 is off on this host; only the IPv4 fallback was checked");
        }
        let response = get(v4, "/readyz").await.unwrap();
        assert!(response.starts_with("HTTP/1.0 503"), "{response}");
        assert!(response.ends_with("initial sync not done\n"), "{response}");
        let response = get(v4, "/metrics").await.unwrap();
        assert!(response.contains(OPENMETRICS), "{response}");
        assert!(response.ends_with("# EOF\n"), "{response}");
        task.abort();
    }

    #[tokio::test]
    async fn a_taken_address_is_a_bind_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let error = serve(addr, Arc::new(Fixed)).await.unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with(&format!("binding {addr} for /healthz, /readyz and /metrics: ")),
            "{error}"
        );
    }
}
