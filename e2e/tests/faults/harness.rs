//! The fault suite's cluster: the example cluster in the lab, the fake API server serving it over HTTP,
//! the live controller writing plans and slices there, and one real agent per node reaching it through
//! a relay that a test can cut.
//!
//! ```text
//! examples/cluster.yaml ─► FakeApiServer (Nodes, Services, EndpointSlices) ◄── controller (in process)
//!        │                      ▲ HTTP 127.0.0.1:<port> (host namespace)
//!        ▼                      │
//!      Lab::up ── <id>-node-*: Relay at 127.0.0.1:<port> ─► `switchyard-lab agent run --node-name …
//!                                --kubeconfig … --state-dir …` ─► iptables / nftables ─► real packets
//! status: the agent's server-side apply on the fake server; metrics: GET /metrics inside the node
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_agent::sync::{Composition, LastGood, compose_plan};
use switchyard_api::{Backend, ForwardingSlice, NodeForwardingPlan, NodeForwardingPlanStatus};
use switchyard_controller::live::run::{Options, run};
use switchyard_e2e::relay::Relay;
use switchyard_e2e::{ChildHandle, ClusterDescription, Lab, Place};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind};
use tokio::sync::oneshot;

/// Where an agent serves /metrics inside its node's namespace.
const METRICS: &str = "127.0.0.1:10263";
/// How long agents get to apply a plan. After an API-server fault this includes the watch backoff of
/// the agent and of the controller (client-go's: 0.8 s doubling to 30 s, jitter up to twice that, reset
/// after 2 min without errors), so up to a minute passes before a watch is retried.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(120);

pub fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

/// Agent flags: short periods, so a test sees repairs and status within seconds; `overrides` (flag,
/// value) replace or add to them.
pub fn agent_flags(overrides: &[(String, String)]) -> Vec<String> {
    let mut flags: BTreeMap<String, String> = [
        ("--resync-period", "2s"),
        ("--min-sync-interval", "100ms"),
        ("--status-progress-interval", "1s"),
        ("--metrics-bind", METRICS),
    ]
    .iter()
    .map(|(flag, value)| (flag.to_string(), value.to_string()))
    .collect();
    flags.extend(overrides.iter().cloned());
    flags
        .into_iter()
        .flat_map(|(flag, value)| [flag, value])
        .collect()
}

struct NodeAgent {
    relay: Relay,
    agent: Option<ChildHandle>,
}

/// The example cluster run through the API server, in the lab.
pub struct ApiLab {
    pub lab: Lab,
    pub server: FakeApiServer,
    pub rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    controller: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    backend: Backend,
    agents: BTreeMap<String, NodeAgent>,
    dir: PathBuf,
    flags: Vec<(String, String)>,
    env: Vec<String>,
    /// The controller's `minPlanInterval`: short, so single changes land at once.
    min_plan_interval: Duration,
    /// Held while this cluster lives (dropped last): fault tests run one at a time, so one test's
    /// 10,000-Service restores do not starve another test's timing on a small machine.
    _serial: MutexGuard<'static, ()>,
}

static SERIAL: Mutex<()> = Mutex::new(());

impl ApiLab {
    /// Everything up, every agent applied; `None` when lab tests are skipped. `flags` (flag, value)
    /// override the agents' defaults; `env` (`NAME=value`) is added to their environment.
    pub fn up(test: &str, backend: Backend, flags: &[(&str, &str)], env: &[&str]) -> Option<ApiLab> {
        if !crate::common::lab_allowed(test) {
            return None;
        }
        let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let description = ClusterDescription::from_file(&repo("examples/cluster.yaml")).unwrap();
        let lab = Lab::up_with(description.clone(), crate::common::options()).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = FakeApiServer::new();
        server.seed(
            &description.nodes,
            &description.services,
            &description.endpoint_slices,
        );
        let (addr, _task) = rt.block_on(server.serve_http()).unwrap();
        let dir = lab.state_dir().join("fault-agents");
        std::fs::create_dir_all(&dir).unwrap();
        let mut api = ApiLab {
            lab,
            server,
            rt,
            addr,
            controller: None,
            backend,
            agents: BTreeMap::new(),
            dir,
            flags: flags
                .iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect(),
            env: env.iter().map(|s| s.to_string()).collect(),
            min_plan_interval: Duration::from_millis(200),
            _serial: serial,
        };
        api.start_controller();
        for cidr in ["203.0.113.0/24", "10.96.0.0/16"] {
            api.lab.client_route_via(cidr.parse().unwrap(), "node-a").unwrap();
        }
        let nodes: Vec<String> = api.lab.nodes().iter().map(|n| n.name.clone()).collect();
        for node in &nodes {
            let relay = Relay::start(api.lab.netns(&Place::node(node)).unwrap(), &[addr]).unwrap();
            api.agents.insert(node.clone(), NodeAgent { relay, agent: None });
            api.start_agent(node);
        }
        for node in &nodes {
            api.wait_applied(node, APPLY_TIMEOUT);
        }
        Some(api)
    }

    /// Starts the controller (in this process) against the fake API server.
    pub fn start_controller(&mut self) {
        let mut config =
            switchyard_controller::Config::load(&repo("examples/controller-config.yaml")).unwrap();
        config.default_backend = self.backend;
        config.min_plan_interval = self.min_plan_interval;
        // Writes are not what these faults are about: let a 10,000-Service change land at once.
        config.write_qps = 1000.0;
        config.write_burst = 1000;
        let options = Options::new(config);
        let _guard = self.rt.enter();
        let client = self.server.client();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = self.rt.spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = run(client, options, shutdown, None).await {
                eprintln!("controller: {error}");
            }
        });
        self.controller = Some((stop, task));
    }

    /// Restarts the controller with another `minPlanInterval`. A bulk change written faster than one
    /// round lands in one planning round only when rounds are far enough apart; with 200 ms rounds a
    /// 10,000-Service change put at a few hundred objects a second (a debug build on a busy machine)
    /// is spread so thin that fewer than `BATCH` Services of a packed slice change per round, and
    /// each gets a Service slice of its own: thousands of writes instead of one per packed slice.
    pub fn set_min_plan_interval(&mut self, interval: Duration) {
        self.stop_controller();
        self.min_plan_interval = interval;
        self.start_controller();
    }

    /// Stops the controller (as a rollout of its Deployment would).
    pub fn stop_controller(&mut self) {
        if let Some((stop, task)) = self.controller.take() {
            let _ = stop.send(());
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await });
        }
    }

    /// Ends the controller as a crash would: its task is dropped where it stands, nothing is flushed.
    pub fn crash_controller(&mut self) {
        if let Some((stop, task)) = self.controller.take() {
            task.abort();
            // Cancelled before its shutdown signal goes away, so no graceful path runs.
            let _ = self.rt.block_on(task);
            drop(stop);
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: agent\n\
             current-context: fake\nusers:\n- name: agent\n  user: {{}}\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The state directory of a node's agent (its plan cache).
    pub fn state_dir(&self, node: &str) -> PathBuf {
        self.dir.join(node)
    }

    /// Starts (or restarts, after SIGTERM) a node's agent, behind `prefix` (a command that ends by
    /// running the rest of its arguments, e.g. `unshare -m …`).
    /// `state` replaces its state directory.
    pub fn start_agent_with(&mut self, node: &str, prefix: &[&str], state: Option<PathBuf>) {
        self.stop_agent(node);
        let state = state.unwrap_or_else(|| self.state_dir(node));
        std::fs::create_dir_all(&state).unwrap();
        let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        if !self.env.is_empty() {
            argv.push("env".into());
            argv.extend(self.env.iter().cloned());
        }
        argv.extend([
            self.lab.options().lab_binary.display().to_string(),
            "agent".into(),
            "run".into(),
            "--node-name".into(),
            node.into(),
            "--kubeconfig".into(),
            self.kubeconfig().display().to_string(),
            "--state-dir".into(),
            state.display().to_string(),
        ]);
        argv.extend(agent_flags(&self.flags));
        let handle = self.lab.spawn_in(&Place::node(node), &argv).unwrap();
        self.agents.get_mut(node).unwrap().agent = Some(handle);
    }

    /// Starts (or restarts) a node's agent.
    pub fn start_agent(&mut self, node: &str) {
        self.start_agent_with(node, &[], None);
    }

    /// Stops a node's agent with SIGTERM (its rules stay).
    pub fn stop_agent(&mut self, node: &str) {
        if let Some(agent) = self.agents.get_mut(node).and_then(|a| a.agent.take()) {
            agent.stop(Duration::from_secs(5));
        }
    }

    /// Kills a node's agent with SIGKILL, and every process it started (as the kubelet kills a pod).
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(agent) = self.agents.get_mut(node).and_then(|a| a.agent.take()) {
            agent.kill_group();
        }
    }

    /// The agent process of a node.
    pub fn agent(&self, node: &str) -> &ChildHandle {
        self.agents[node].agent.as_ref().unwrap()
    }

    /// The API server becomes unreachable from a node.
    pub fn cut(&mut self, node: &str) {
        self.agents.get_mut(node).unwrap().relay.cut();
    }

    /// The API server is reachable from a node again.
    pub fn restore(&mut self, node: &str) {
        self.agents.get_mut(node).unwrap().relay.restore().unwrap();
    }

    /// The node's plan as stored, and the slices of the server.
    fn stored(&self, node: &str) -> Option<(NodeForwardingPlan, Vec<ForwardingSlice>)> {
        let plan: NodeForwardingPlan = serde_json::from_value(self.server.get(Kind::Plan, node)?).ok()?;
        let slices = self
            .server
            .keys(Kind::ForwardingSlice)
            .iter()
            .filter_map(|key| self.server.get(Kind::ForwardingSlice, key))
            .filter_map(|object| serde_json::from_value::<ForwardingSlice>(object).ok())
            .collect();
        Some((plan, slices))
    }

    /// What the node should have applied: (plan revision, slices digest).
    pub fn wanted(&self, node: &str) -> Option<(String, Option<String>)> {
        let (plan, slices) = self.stored(node)?;
        let slices: Vec<_> = slices
            .into_iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap_or_default(),
                    std::sync::Arc::new(s.spec),
                )
            })
            .collect();
        let spec = std::sync::Arc::new(plan.spec);
        match compose_plan(&spec, &slices, &mut LastGood::default()) {
            Composition::Ready { slices, .. } => Some((spec.revision.clone(), slices.map(|s| s.digest))),
            Composition::Incomplete(_) => None,
        }
    }

    /// The status the node's agent wrote.
    pub fn status(&self, node: &str) -> Option<NodeForwardingPlanStatus> {
        let object = self.server.get(Kind::Plan, node)?;
        serde_json::from_value(object.get("status")?.clone()).ok()
    }

    /// True when the node's status reports the current plan and slices applied.
    pub fn is_applied(&self, node: &str) -> bool {
        let (Some((revision, digest)), Some(status)) = (self.wanted(node), self.status(node)) else {
            return false;
        };
        switchyard_e2e::deployed::reports_applied(&status, &revision, digest.as_deref())
    }

    /// Waits until the node reports its current plan applied.
    pub fn wait_applied(&self, node: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.is_applied(node) {
            let agent = self.agents[node].agent.as_ref();
            assert!(
                Instant::now() < deadline,
                "{node}: plan {:?} not applied in {timeout:?}; status {:?}\nagent stderr:\n{}",
                self.wanted(node),
                self.status(node),
                tail(&agent.map(ChildHandle::stderr).unwrap_or_default(), 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `check` holds, failing with `what` after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !check(self) {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A metric of the node's agent (`name{labels}` as printed), or `None`.
    pub fn metric(&self, node: &str, name: &str) -> Option<f64> {
        let text = self.metrics(node)?;
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let (key, value) = line.rsplit_once(' ')?;
                (key == name).then(|| value.parse().ok()).flatten()
            })
    }

    /// The agent's /metrics text, fetched inside its namespace.
    pub fn metrics(&self, node: &str) -> Option<String> {
        switchyard_e2e::netns::in_netns(self.lab.netns(&Place::node(node)).ok()?, || {
            let mut stream = TcpStream::connect(METRICS).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(stream, "GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n").ok()?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).ok()?;
            answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
        })
        .ok()
        .flatten()
    }

    /// Runs a command in a node's namespace; stdout.
    pub fn exec(&self, node: &str, argv: &[&str]) -> std::process::Output {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        self.lab.exec_in(&Place::node(node), &argv).unwrap()
    }

    /// Adds or replaces an object on the API server (as a user or another controller would).
    pub fn put(&self, kind: Kind, object: impl serde::Serialize) {
        self.server.put(kind, object);
    }

    /// The node's agent's log so far.
    pub fn agent_log(&self, node: &str) -> String {
        self.agents[node]
            .agent
            .as_ref()
            .map(ChildHandle::stderr)
            .unwrap_or_default()
    }

    /// Every node name.
    pub fn nodes(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }
}

impl Drop for ApiLab {
    fn drop(&mut self) {
        for node in self.nodes() {
            self.stop_agent(&node);
        }
        self.stop_controller();
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A JSON object's field, for edits of stored objects.
pub fn stored_object(server: &FakeApiServer, kind: Kind, key: &str) -> Value {
    server
        .get(kind, key)
        .unwrap_or_else(|| panic!("{key} not stored"))
}

/// Marks checkout-new-1 (node-c) ready (the checkout Service moves from its serving terminating pod
/// to it) or not ready (back to checkout-old-1): a change the agents must pick up.
pub fn set_checkout_new_ready(api: &ApiLab, ready: bool) {
    let mut slice = stored_object(&api.server, Kind::EndpointSlice, "default/checkout-r1s2t");
    for endpoint in slice["endpoints"].as_array_mut().unwrap() {
        if endpoint["targetRef"]["name"] == "checkout-new-1" {
            endpoint["conditions"] =
                serde_json::json!({"ready": ready, "serving": ready, "terminating": false});
        }
    }
    api.put(Kind::EndpointSlice, slice);
}

/// The one pod answering three connections to the checkout Service from nginx-pod-3, if one did.
pub fn checkout_pod(api: &ApiLab) -> Option<String> {
    let tally = api
        .lab
        .probe_many(
            &Place::pod("nginx-pod-3"),
            switchyard_e2e::Proto::Tcp,
            "10.96.0.70:80".parse().unwrap(),
            3,
            Duration::from_secs(2),
        )
        .unwrap();
    (tally.total_answered() == 3 && tally.answered.len() == 1)
        .then(|| tally.answered.keys().next().cloned())
        .flatten()
}

/// True when checkout answers from `pod` only.
pub fn answers(api: &ApiLab, pod: &str) -> bool {
    checkout_pod(api).as_deref() == Some(pod)
}
