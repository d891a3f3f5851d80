//! The agent's HTTP endpoints on `--metrics-bind` (default `:10263`; kube-proxy uses 10249 and 10256).
//!
//! ```text
//! GET /healthz ─► AgentHealth::report() ─► 200 | 503, JSON {lastUpdated, currentTime, nodeName, healthy,
//!                                                           observedRevision}
//! GET /livez   ─► kube-proxy's /livez (the DaemonSet's liveness probe: a leaving node's agent is never
//!                 restarted for it, and kube-proxy holding 10256 during a migration never fails it)
//! GET /readyz  ─► 200 after the first successful sync (cached plan or API), else 503
//! GET /metrics ─► the registry (SyncMetrics + LiveMetrics), OpenMetrics text
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use switchyard_process::http::{Endpoints, Probe};

use super::health::AgentHealth;
use crate::error::Error;

/// What the agent answers: its health report, its readiness, its registry.
struct AgentEndpoints {
    health: Arc<AgentHealth>,
    registry: Arc<Registry>,
}

impl Endpoints for AgentEndpoints {
    fn healthz(&self) -> Probe {
        let report = self.health.report();
        Probe {
            ok: report.healthy,
            content_type: "application/json",
            body: serde_json::to_string(&report).unwrap_or_default(),
        }
    }

    fn livez(&self) -> Probe {
        let health = self.health.proxy_health(super::health::Eligibility::Ignored);
        Probe {
            ok: health.healthy,
            content_type: "application/json",
            body: serde_json::to_string(&health).unwrap_or_default(),
        }
    }

    fn readyz(&self) -> Probe {
        if self.health.ready() {
            Probe::text(true, "ready\n")
        } else {
            Probe::text(false, "no plan applied yet\n")
        }
    }

    fn metrics(&self) -> String {
        render_metrics(&self.registry)
    }
}

/// The registry in OpenMetrics text (empty if it cannot be encoded).
pub fn render_metrics(registry: &Registry) -> String {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
        text.clear();
    }
    text
}

/// Binds `addr` (`:PORT` is `[::]:PORT`, falling back to `0.0.0.0` where IPv6 is off) and serves until
/// the task is aborted. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<AgentHealth>,
    registry: Arc<Registry>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    switchyard_process::http::serve(addr, Arc::new(AgentEndpoints { health, registry }))
        .await
        .map_err(Error::BindMetrics)
}
