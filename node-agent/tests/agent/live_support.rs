//! Helpers of the live-agent tests: plan objects as the controller writes them, an agent (the real
//! loop over the fake kernel) against the fake API server, and a tiny HTTP client for its endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::metrics::LiveMetrics;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::run::grace::GracePeriod;
use switchyard_agent::run::{RunConfig, RunIo, Running, run};
use switchyard_agent::source::api::ApiSource;
use switchyard_agent::status_writer::{self, WriterConfig};
use switchyard_agent::sync::{SyncConfig, SyncMetrics, Syncer, SystemClock};
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::names::{ANNOTATION_TRIGGER_TIME, LABEL_NODE, LABEL_VIEW};
use switchyard_api::{
    ForwardingSlice, ForwardingSliceSpec, NodeForwardingPlan, NodeForwardingPlanSpec,
    NodeForwardingPlanStatus,
};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind, eventually};
use tokio::sync::oneshot;

use crate::fixtures::local_addrs;

pub const NODE: &str = "node-a";
pub const WAIT: Duration = Duration::from_secs(15);

/// A plan object as the controller writes it: labelled, with the trigger annotation and a
/// managedFields entry of the controller.
pub fn plan_object(name: &str, spec: &NodeForwardingPlanSpec, trigger: Option<&str>) -> Value {
    let mut object = serde_json::to_value(NodeForwardingPlan::new(name, spec.clone())).unwrap();
    object["metadata"]["labels"] = json!({ LABEL_NODE: spec.node_name });
    if let Some(trigger) = trigger {
        object["metadata"]["annotations"] = json!({ ANNOTATION_TRIGGER_TIME: trigger });
    }
    object["metadata"]["managedFields"] = json!([{
        "manager": "switchyard-controller", "operation": "Apply", "apiVersion": "switchyard.io/v1alpha2",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}
    }]);
    object
}

/// Puts `spec` as the node's primary plan.
pub fn put_plan(server: &FakeApiServer, spec: &NodeForwardingPlanSpec) {
    server.put(Kind::Plan, plan_object(&spec.node_name, spec, None));
}

/// A slice object as the controller writes it: labelled with its view.
pub fn slice_object(name: &str, spec: &ForwardingSliceSpec, trigger: Option<&str>) -> Value {
    let mut object = serde_json::to_value(ForwardingSlice::new(name, spec.clone())).unwrap();
    object["metadata"]["labels"] = json!({ LABEL_VIEW: spec.view });
    if let Some(trigger) = trigger {
        object["metadata"]["annotations"] = json!({ ANNOTATION_TRIGGER_TIME: trigger });
    }
    object
}

/// Puts a slice (name, spec) as `switchyard_api::testing::slice` builds it.
pub fn put_slice(server: &FakeApiServer, slice: &(String, ForwardingSliceSpec)) {
    server.put(Kind::ForwardingSlice, slice_object(&slice.0, &slice.1, None));
}

/// The status stored on the fake server's object `name`.
pub fn stored_status(server: &FakeApiServer, name: &str) -> Option<NodeForwardingPlanStatus> {
    let object = server.get(Kind::Plan, name)?;
    serde_json::from_value(object.get("status")?.clone()).ok()
}

/// A syncer over `iptables` with real clocks (the loop's timers must move).
pub fn syncer(iptables: &FakeIptables) -> Syncer {
    let dataplane = IptablesDataplane::new(
        iptables.clone(),
        FixedAddrs(local_addrs()),
        HostFacts {
            random_fully: true,
            ..HostFacts::default()
        },
    );
    Syncer::new(
        Box::new(dataplane),
        Arc::new(SystemClock),
        SyncConfig::default(),
        SyncMetrics::default(),
    )
}

/// A scratch directory, removed when dropped (also when the test fails).
pub fn scratch(tag: &str) -> switchyard_test_support::scratch::TempDir {
    switchyard_test_support::scratch::dir(&format!("live-{tag}")).unwrap()
}

/// Settings for a test agent: fast timers, HTTP on an ephemeral port.
pub fn config(cache_dir: Option<&std::path::Path>, grace: GracePeriod) -> RunConfig {
    RunConfig {
        node_name: NODE.into(),
        status_file: None,
        resync_period: Duration::from_secs(30),
        min_sync_interval: Duration::ZERO,
        deletion_grace: grace,
        cache_file: cache_dir.map(switchyard_agent::source::cache::cache_path),
        metrics_bind: Some("127.0.0.1:0".parse().unwrap()),
        healthz_bind: Some("127.0.0.1:0".parse().unwrap()),
        status_bind: Some("127.0.0.1:0".parse().unwrap()),
        // The fake kernel has no counters; the real-kernel traffic tests turn them on.
        traffic: None,
    }
}

/// A running agent; stopped (rules left in the fake kernel) by `stop`.
pub struct Agent {
    pub running: Running,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// Starts the loop with the API source and the status writer on `client`.
    pub async fn start(
        client: kube::Client,
        iptables: &FakeIptables,
        config: RunConfig,
        writer: WriterConfig,
    ) -> Self {
        Self::start_api(client, syncer(iptables), config, writer).await
    }

    /// The same over any syncer (one with a fake conntrack table, say).
    pub async fn start_api(
        client: kube::Client,
        syncer: Syncer,
        config: RunConfig,
        writer: WriterConfig,
    ) -> Self {
        let metrics = LiveMetrics::default();
        let (sink, _writer) = status_writer::spawn(
            kube::Api::all(client.clone()),
            NODE.into(),
            writer,
            metrics.clone(),
        );
        let mut source = ApiSource::new(client, NODE);
        source.settle = Duration::from_millis(200);
        let io = RunIo {
            source: Box::new(source),
            status: Some(sink),
            metrics,
        };
        Self::start_syncer(syncer, config, io).await
    }

    /// Starts the loop with any plan source, status sink and metrics.
    pub async fn start_with(iptables: &FakeIptables, config: RunConfig, io: RunIo) -> Self {
        Self::start_syncer(syncer(iptables), config, io).await
    }

    async fn start_syncer(syncer: Syncer, config: RunConfig, io: RunIo) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            run(
                config,
                syncer,
                io,
                async {
                    let _ = stopped.await;
                },
                Some(started_tx),
            )
            .await
            .unwrap();
        });
        let running = started_rx.await.unwrap();
        Self {
            running,
            stop: Some(stop),
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.metrics_addr.unwrap()
    }

    /// Where kube-proxy's health port (`/healthz`, `/livez`) is served, once it is.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        match self.running.kube_proxy_ports.first()?.state() {
            switchyard_agent::run::kube_proxy_ports::PortState::Bound(addr) => Some(addr),
            _ => None,
        }
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// `GET path` over HTTP/1.0: (status code, body).
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Waits for `check`, panicking with `what` after [`WAIT`].
pub async fn wait(what: &str, check: impl FnMut() -> bool) {
    assert!(eventually(WAIT, check).await, "timed out waiting for {what}");
}

/// Waits for an HTTP condition.
pub async fn wait_http(what: &str, addr: SocketAddr, path: &str, want: u16) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (code, body) = get(addr, path).await;
        if code == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {path} answers {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// PATCH requests to the status subresource of `name`.
pub fn status_patches(server: &FakeApiServer, name: &str) -> Vec<Value> {
    let path = format!("/apis/switchyard.io/v1alpha2/nodeforwardingplans/{name}/status");
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PATCH && r.path == path)
        .filter_map(|r| r.body)
        .collect()
}

/// The number in a metrics line `name value`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
