//! kube-proxy's own ports, so that whatever probes kube-proxy finds the agent there instead.
//!
//! ```text
//! --healthz-bind-address (:10256)            GET /healthz ─► AgentHealth::proxy_health(Included): 503 while
//!                                                            the node leaves or an update is stale
//!                                            GET /livez   ─► AgentHealth::proxy_health(Ignored)
//! --status-bind-address (127.0.0.1:10249)    GET /proxyMode ─► the backend in use (text)
//!                                            GET /metrics   ─► the agent's registry
//! each port: bind ─► taken (kube-proxy still holds it during a migration)? ─► PortState::Taken, logged
//!            once, status Degraded PortUnavailable, kube_proxy_port_bound{port} 0 ─► bind again every
//!            RETRY until it is free ─► PortState::Bound (logged, gauge 1), served until the agent stops
//! ```
//!
//! Cloud load balancers decide which nodes get an `externalTrafficPolicy: Cluster` Service's traffic by
//! probing `:10256/healthz` (GCE, Azure's shared probe, AWS, DigitalOcean), so a node without it loses
//! every such Service once kube-proxy is gone. During a move from kube-proxy both run on the node for a
//! while: the agent keeps forwarding and retrying, and takes the port the moment kube-proxy lets go.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::health::{AgentHealth, Eligibility};
use crate::counters::AppliedPlan;
use crate::metrics::{CodeLabel, LiveMetrics, PortLabel};

/// How often a taken port is tried again.
pub const RETRY: Duration = Duration::from_secs(1);

/// Whether a port is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortState {
    /// Not tried yet.
    Starting,
    /// Served at this address.
    Bound(SocketAddr),
    /// Could not be bound; tried again every [`RETRY`].
    Taken(String),
}

/// The state of one port, shared with the run loop (which reports it in the status).
#[derive(Debug, Clone)]
pub struct PortStatus {
    /// What the port is for, in words (`kube-proxy's health port`).
    pub what: &'static str,
    /// The address asked for.
    pub addr: SocketAddr,
    state: Arc<Mutex<PortState>>,
}

impl PortStatus {
    fn new(what: &'static str, addr: SocketAddr) -> Self {
        Self {
            what,
            addr,
            state: Arc::new(Mutex::new(PortState::Starting)),
        }
    }

    /// The port's state now.
    pub fn state(&self) -> PortState {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, state: PortState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }

    /// The problem to report while the port is not served.
    pub fn problem(&self) -> Option<String> {
        match self.state() {
            PortState::Taken(why) => Some(format!(
                "{} {} is not served ({why}; kube-proxy may still hold it): retrying every {} s",
                self.what,
                self.addr,
                RETRY.as_secs()
            )),
            PortState::Starting | PortState::Bound(_) => None,
        }
    }
}

/// What the two servers answer from.
#[derive(Clone)]
struct Shared {
    health: Arc<AgentHealth>,
    applied: AppliedPlan,
    registry: Arc<Registry>,
    metrics: LiveMetrics,
}

/// The running servers: their states, and the tasks to stop.
#[derive(Debug, Default)]
pub struct KubeProxyPorts {
    /// One per configured port.
    pub ports: Vec<PortStatus>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KubeProxyPorts {
    /// Starts serving `healthz` (kube-proxy's `/healthz` and `/livez`) and `status` (`/proxyMode`,
    /// `/metrics`), each only when given; a port that is taken is retried in the background.
    pub fn start(
        healthz: Option<SocketAddr>,
        status: Option<SocketAddr>,
        health: Arc<AgentHealth>,
        applied: AppliedPlan,
        registry: Arc<Registry>,
        metrics: LiveMetrics,
    ) -> Self {
        let shared = Shared {
            health,
            applied,
            registry,
            metrics,
        };
        let mut ports = Self::default();
        if let Some(addr) = healthz {
            let router = Router::new()
                .route("/healthz", get(healthz_handler))
                .route("/livez", get(livez_handler))
                .with_state(shared.clone());
            ports.serve(
                PortStatus::new("kube-proxy's health port", addr),
                router,
                &shared.metrics,
            );
        }
        if let Some(addr) = status {
            let router = Router::new()
                .route("/proxyMode", get(proxy_mode_handler))
                .route("/metrics", get(metrics_handler))
                .with_state(shared.clone());
            ports.serve(
                PortStatus::new("kube-proxy's status port", addr),
                router,
                &shared.metrics,
            );
        }
        ports
    }

    fn serve(&mut self, port: PortStatus, router: Router, metrics: &LiveMetrics) {
        let gauge = metrics
            .kube_proxy_port_bound
            .get_or_create(&PortLabel {
                port: port.addr.port(),
            })
            .clone();
        let status = port.clone();
        self.tasks.push(tokio::spawn(async move {
            let listener = loop {
                match bind(status.addr).await {
                    Ok(listener) => break listener,
                    Err(error) => {
                        let why = error.to_string();
                        if status.state() != PortState::Taken(why.clone()) {
                            tracing::warn!(addr = %status.addr, %error, what = status.what,
                                "cannot serve the port; forwarding goes on, retrying every second");
                        }
                        status.set(PortState::Taken(why));
                        gauge.set(0);
                        tokio::time::sleep(RETRY).await;
                    }
                }
            };
            let bound = listener.local_addr().unwrap_or(status.addr);
            tracing::info!(addr = %bound, what = status.what, "serving kube-proxy's endpoints");
            status.set(PortState::Bound(bound));
            gauge.set(1);
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, what = status.what, "the server stopped");
            }
        }));
        self.ports.push(port);
    }

    /// What to report while some port is not served (one line per port).
    pub fn problem(&self) -> Option<String> {
        let problems: Vec<String> = self.ports.iter().filter_map(PortStatus::problem).collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Stops serving.
    pub fn stop(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for KubeProxyPorts {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds `addr`; `[::]` falls back to `0.0.0.0` where the host has IPv6 off.
async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Err(_) if addr.ip().is_unspecified() && addr.is_ipv6() => {
            tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], addr.port()))).await
        }
        result => result,
    }
}

fn json_answer(ok: bool, body: String) -> Response {
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [
            ("content-type", "application/json"),
            ("x-content-type-options", "nosniff"),
        ],
        body,
    )
        .into_response()
}

fn count(
    family: &prometheus_client::metrics::family::Family<
        CodeLabel,
        prometheus_client::metrics::counter::Counter,
    >,
    ok: bool,
) {
    family
        .get_or_create(&CodeLabel {
            code: if ok { 200 } else { 503 },
        })
        .inc();
}

async fn healthz_handler(State(shared): State<Shared>) -> Response {
    let health = shared.health.proxy_health(Eligibility::Included);
    count(&shared.metrics.healthz_total, health.healthy);
    json_answer(health.healthy, serde_json::to_string(&health).unwrap_or_default())
}

async fn livez_handler(State(shared): State<Shared>) -> Response {
    let health = shared.health.proxy_health(Eligibility::Ignored);
    count(&shared.metrics.livez_total, health.healthy);
    json_answer(health.healthy, serde_json::to_string(&health).unwrap_or_default())
}

/// kube-proxy answers its mode (`iptables`, `nftables`, `ipvs`) as plain text.
async fn proxy_mode_handler(State(shared): State<Shared>) -> Response {
    match shared.applied.get() {
        Some(applied) => (StatusCode::OK, applied.backend.as_str().to_string()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no plan applied yet\n").into_response(),
    }
}

async fn metrics_handler(State(shared): State<Shared>) -> Response {
    let registry = Arc::clone(&shared.registry);
    match tokio::task::spawn_blocking(move || super::http::render_metrics(&registry)).await {
        Ok(text) => ([("content-type", switchyard_process::http::OPENMETRICS)], text).into_response(),
        Err(error) => {
            tracing::error!(%error, "rendering /metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
