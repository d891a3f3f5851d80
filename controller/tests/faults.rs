//! Fault 4 of the fault suite: the controller restarted in the middle of a rolling update, and two
//! replicas with leader election whose leader crashes or stops.
//!
//! ```text
//! test ─► FakeApiServer (Services, EndpointSlices, Nodes, plans, ForwardingSlices, the Lease)
//!           ▲ every request recorded (bodies too): no DELETE, no plan without views, no empty slice
//!           │
//!   Replica: its own thread and Tokio runtime ─► run(tagged client) ─► watches in, server-side apply out
//!     tagged client: notes (replica, method, path, when) of every request, then hands it to the server
//!     stop  = run's shutdown future resolves: writes stop, the lease is released
//!     crash = the runtime is dropped with every task run spawned, never polled again: nothing released
//!   while it runs: the stored plans composed with the stored slices, as an agent composes them
//!   at the end: the stored objects equal a fresh offline plan (Planner::build) of the final input
//! ```
// Test helpers outside #[test] functions may unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http::Method;
use k8s_openapi::{
    api::discovery::v1::{EndpointConditions, EndpointSlice},
    jiff::{SignedDuration, Timestamp},
};
use kube::client::Body;
use serde_json::Value;
use switchyard_api::{
    ForwardingSliceSpec, NodeForwardingPlanSpec,
    compose::{Composed, SliceRef, compose},
    slice::expected_name,
};
use switchyard_controller::{
    Config,
    live::{
        leader::Timing,
        run::{Options, Running, run},
    },
    output,
    planner::{Planner, Snapshot},
};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind, Recorded, eventually};
use switchyard_test_support::synthetic::{self, Shape, pod_ip};
use tokio::sync::oneshot;

/// The synthetic cluster of `shape` as the planner's input.
fn cluster(shape: &Shape) -> Snapshot {
    Snapshot::from(synthetic::cluster(shape).into_parts())
}

const PLANS: &str = "/apis/switchyard.io/v1alpha2/nodeforwardingplans";
const SLICES: &str = "/apis/switchyard.io/v1alpha2/forwardingslices";
const LEASE: &str = "switchyard-system/switchyard-controller";

/// Pods of each rolled Deployment (= endpoints per synthetic Service).
const REPLICAS: usize = 3;
/// A rolling update replaces each pod in four steps (see [`rollout_slice`]).
const STEPS: usize = 4 * REPLICAS;
/// The rolled Services: a plain ClusterIP one (bucket 50 of the synthetic mix) and an
/// externalTrafficPolicy=Local LoadBalancer (bucket 5), whose pods' nodes change the plans too.
const ROLLED: [usize; 2] = [50, 5];

fn shape(nodes: usize) -> Shape {
    Shape {
        nodes,
        services: 60,
        endpoints: REPLICAS,
        zones: 2,
        etp_local_percent: 10,
        itp_local_percent: 10,
        hinted_percent: 20,
    }
}

fn config() -> Config {
    Config {
        min_plan_interval: Duration::from_millis(100),
        max_object_bytes: 48 * 1024,
        write_qps: 1000.0,
        write_burst: 1000,
        ..Config::default()
    }
}

fn seed(server: &FakeApiServer, snapshot: &Snapshot) {
    server.seed(&snapshot.nodes, &snapshot.services, &snapshot.slices);
}

// ---------------------------------------------------------------------------------------------------
// Replicas: each on its own thread and runtime, so a crash can take every task it spawned with it.

/// One request as a replica sent it.
#[derive(Debug, Clone)]
struct Sent {
    method: Method,
    path: String,
    /// Wall clock, comparable with the Lease's renewTime and acquireTime.
    wall: Timestamp,
}

impl Sent {
    /// A write of a plan, a ForwardingSlice or an Event: what only the leader may do.
    fn is_leader_write(&self) -> bool {
        self.method != Method::GET
            && (self.path.starts_with(PLANS)
                || self.path.starts_with(SLICES)
                || self.path.contains("/events"))
    }
}

/// A client of `server` that notes every request in `sent` before passing it on unchanged. Must be
/// called on the runtime that will drive it (the client's tasks live there).
fn tagged_client(server: &FakeApiServer, sent: Arc<Mutex<Vec<Sent>>>) -> kube::Client {
    let inner = server.client();
    let (service, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            sent.lock().unwrap().push(Sent {
                method: request.method().clone(),
                path: request.uri().path().to_string(),
                wall: Timestamp::now(),
            });
            let inner = inner.clone();
            tokio::spawn(async move {
                match inner.send(request).await {
                    Ok(response) => respond.send_response(response),
                    Err(error) => respond.send_error(error),
                }
            });
        }
    });
    kube::Client::new(service, "default")
}

/// A controller process: `run` on its own thread and current-thread runtime.
struct Replica {
    name: String,
    running: Running,
    sent: Arc<Mutex<Vec<Sent>>>,
    stop: oneshot::Sender<()>,
    crash: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Replica {
    async fn start(server: &FakeApiServer, name: &str, options: Options) -> Self {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (started_tx, started_rx) = oneshot::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (crash, crash_rx) = oneshot::channel::<()>();
        let (server, log) = (server.clone(), Arc::clone(&sent));
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let client = tagged_client(&server, log);
                    let shutdown = async {
                        let _ = stop_rx.await;
                    };
                    tokio::select! {
                        biased;
                        // Also when the sender is dropped (a test that panicked).
                        _ = crash_rx => {}
                        result = run(client, options, shutdown, Some(started_tx)) => result.unwrap(),
                    }
                });
                // A current-thread runtime polls tasks only inside block_on: dropping it now drops the
                // election, the writer and the watches unpolled, as a killed process would.
                drop(runtime);
            })
            .unwrap();
        let running = started_rx.await.unwrap();
        Self {
            name: name.to_string(),
            running,
            sent,
            stop,
            crash,
            thread,
        }
    }

    fn leading(&self) -> bool {
        *self.running.leader.borrow()
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    fn leader_writes(&self) -> Vec<Sent> {
        self.sent().into_iter().filter(Sent::is_leader_write).collect()
    }

    /// Graceful stop: run's shutdown future resolves and run returns (the lease, if held, released).
    async fn stop(self) {
        let _ = self.stop.send(());
        Self::join(self.thread, self.crash).await;
    }

    /// Crash: the controller's tasks vanish mid-flight; nothing is released or flushed.
    async fn crash(self) {
        let _ = self.crash.send(());
        Self::join(self.thread, self.stop).await;
    }

    /// Waits for the thread; `keep` (the other signal) stays alive until then.
    async fn join(thread: std::thread::JoinHandle<()>, keep: oneshot::Sender<()>) {
        let joined = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await;
        drop(keep);
        joined.expect("the replica did not stop").unwrap().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------------
// The rolling update.

/// The EndpointSlice of rolled Service `s` after `step` of its rolling update (maxSurge 1,
/// maxUnavailable 0). Pod `j` is replaced in four steps: its successor appears (not ready), becomes
/// ready, the old pod starts terminating (serving, not ready), the old pod is gone. Successors run on
/// another node than their predecessor, so the nodes hosting the Service's endpoints change.
fn rollout_slice(s: usize, shape: &Shape, step: usize) -> EndpointSlice {
    let mut slice = synthetic::slice(s, shape, 0);
    let old = slice.endpoints.clone().unwrap_or_default();
    let conditions = |ready: bool, serving: bool, terminating: bool| {
        Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        })
    };
    let mut endpoints = Vec::new();
    for j in 0..REPLICAS {
        let done = step.saturating_sub(4 * j).min(4);
        if done < 4 {
            let mut pod = old[j].clone();
            if done == 3 {
                pod.conditions = conditions(false, true, true);
            }
            endpoints.push(pod);
        }
        if done >= 1 {
            let mut pod = old[(j + 1) % REPLICAS].clone();
            pod.addresses = vec![pod_ip(s, j, 1)];
            pod.conditions = conditions(done >= 2, done >= 2, false);
            endpoints.push(pod);
        }
    }
    slice.endpoints = Some(endpoints);
    slice
}

/// The cluster's input after `step` of the rolling update.
fn rollout_input(shape: &Shape, step: usize) -> Snapshot {
    let mut snapshot = cluster(shape);
    for s in ROLLED {
        snapshot.slices[s] = rollout_slice(s, shape, step);
    }
    snapshot
}

fn entry_name(s: usize) -> String {
    format!("{}:http", synthetic::service_key(s))
}

// ---------------------------------------------------------------------------------------------------
// What is stored: its difference to the offline plan, and what agents would forward from it.

/// How the stored plans and slices differ from the offline plan of `input` (empty: converged): plans
/// exactly; slices by what every node composes from them (a live controller's packed slices may keep a
/// changed Service's old copy behind its Service slice, which an offline build does not have), and no
/// stored slice outside the layout.
fn differences(server: &FakeApiServer, input: &Snapshot) -> Vec<String> {
    let offline = Planner::build(input, &config()).unwrap();
    let mut out = Vec::new();
    let slices = offline.slices(None);
    let wanted: BTreeSet<&str> = slices.iter().map(|(name, _)| name.as_str()).collect();
    for name in server.keys(Kind::ForwardingSlice) {
        let service_slice = server
            .get(Kind::ForwardingSlice, &name)
            .and_then(|stored| serde_json::from_value::<ForwardingSliceSpec>(stored["spec"].clone()).ok())
            .is_some_and(|spec| spec.service.is_some() && expected_name(&spec) == name);
        if !wanted.contains(name.as_str()) && !service_slice {
            out.push(format!("slice {name} is not planned"));
        }
    }
    for (name, spec) in &slices {
        if server.get(Kind::ForwardingSlice, name).is_none() {
            out.push(format!("slice {name} is missing"));
        } else if spec.service.is_some() {
            out.push(format!("offline slice {name} is a Service slice"));
        }
    }
    let nodes: BTreeSet<String> = offline.node_names().map(str::to_string).collect();
    let stored: BTreeSet<String> = server.keys(Kind::Plan).into_iter().collect();
    if stored != nodes {
        out.push(format!("plans {stored:?}, nodes {nodes:?}"));
    }
    for node in &nodes {
        let want = serde_json::to_value(offline.node_plan(node).unwrap()).unwrap();
        if server.get(Kind::Plan, node).is_some_and(|p| p["spec"] != want) {
            out.push(format!("plan {node} differs"));
        }
    }
    for (node, composed) in agent_view(server) {
        let want = offline.oracle(&node).unwrap_or_default();
        match composed {
            Err(why) => out.push(format!("node {node} composes nothing: {why}")),
            Ok(composed) if composed.spec.services != want => {
                out.push(format!("node {node} forwards what the offline plan does not"));
            }
            Ok(_) => {}
        }
    }
    out
}

/// Every stored plan composed with the stored slices, as its node's agent composes them. Plans are
/// read first: the controller writes slices before the plans naming them, so slices read afterwards
/// are at least as new as the plans expect.
fn agent_view(server: &FakeApiServer) -> BTreeMap<String, Result<Composed, String>> {
    let plans: Vec<(String, NodeForwardingPlanSpec)> = server
        .keys(Kind::Plan)
        .into_iter()
        .filter_map(|node| {
            let stored = server.get(Kind::Plan, &node)?;
            Some((node, serde_json::from_value(stored["spec"].clone()).unwrap()))
        })
        .collect();
    let slices: Vec<(String, ForwardingSliceSpec)> = server
        .keys(Kind::ForwardingSlice)
        .into_iter()
        .filter_map(|name| {
            let stored = server.get(Kind::ForwardingSlice, &name)?;
            Some((name, serde_json::from_value(stored["spec"].clone()).unwrap()))
        })
        .collect();
    let refs: Vec<SliceRef<'_>> = slices
        .iter()
        .map(|(name, spec)| SliceRef { name, spec })
        .collect();
    plans
        .into_iter()
        .map(|(node, plan)| (node, compose(&plan, &refs)))
        .collect()
}

/// Ready endpoints of a rolled entry (used for Cluster-policy traffic, not terminating).
fn ready_endpoints(entry: &switchyard_api::ServicePlan) -> usize {
    entry
        .endpoints
        .iter()
        .filter(|e| e.cluster && !e.terminating)
        .count()
}

/// What the rollout must never break, checked on the stored objects while it runs and on every write.
struct Invariants {
    /// Entries each node forwards (Services never change during the rollout).
    entries: BTreeMap<String, usize>,
    samples: usize,
    violations: Vec<String>,
}

impl Invariants {
    fn new(input: &Snapshot) -> Self {
        let offline = Planner::build(input, &config()).unwrap();
        let entries = offline
            .node_names()
            .map(|node| {
                let composed = offline.composed(node).unwrap().unwrap();
                (node.to_string(), composed.spec.services.len())
            })
            .collect();
        Self {
            entries,
            samples: 0,
            violations: Vec::new(),
        }
    }

    /// Every node has a plan that composes into every entry, each rolled Service with all its pods.
    fn sample(&mut self, server: &FakeApiServer, when: &str) {
        self.samples += 1;
        let view = agent_view(server);
        let nodes: Vec<&String> = view.keys().collect();
        if nodes != self.entries.keys().collect::<Vec<_>>() {
            self.violations.push(format!("{when}: plans {nodes:?}"));
        }
        for (node, composed) in view {
            let composed = match composed {
                Ok(composed) => composed,
                Err(error) => {
                    self.violations
                        .push(format!("{when}: {node}: views incomplete: {error}"));
                    continue;
                }
            };
            let entries = composed.spec.services.len();
            if Some(&entries) != self.entries.get(&node) {
                self.violations
                    .push(format!("{when}: {node} forwards {entries} entries"));
            }
            for s in ROLLED {
                let name = entry_name(s);
                let ready = composed
                    .spec
                    .services
                    .iter()
                    .find(|e| e.name == name)
                    .map_or(0, |e| ready_endpoints(e));
                if ready < REPLICAS {
                    self.violations
                        .push(format!("{when}: {node}: {name} has {ready} ready endpoints"));
                }
            }
        }
    }

    /// Samples for `period` (with the controller running or not).
    async fn watch(&mut self, server: &FakeApiServer, period: Duration, when: &str) {
        let until = tokio::time::Instant::now() + period;
        while tokio::time::Instant::now() < until {
            self.sample(server, when);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Samples until the stored objects equal the offline plan of `input`; how long that took.
    async fn until_converged(&mut self, server: &FakeApiServer, input: &Snapshot, when: &str) -> Duration {
        let start = Instant::now();
        let mut last = Vec::new();
        while start.elapsed() < Duration::from_secs(30) {
            self.sample(server, when);
            last = differences(server, input);
            if last.is_empty() {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{when}: not converged after 30 s: {last:?}");
    }
}

/// Writes the controller must never send during a rollout: a DELETE of a plan or slice, a plan without
/// views (an agent would apply it as "forward nothing"), a slice without entries or a rolled Service's
/// entry with fewer ready endpoints than pods (every view has entries and every state keeps them all).
fn bad_writes(requests: &[Recorded]) -> Vec<String> {
    let mut out = Vec::new();
    for write in requests.iter().filter(|r| r.is_write()) {
        let plan = write.path.starts_with(PLANS);
        if !(plan || write.path.starts_with(SLICES)) || write.path.ends_with("/status") {
            continue;
        }
        let what = format!("{} {}", write.method, write.path);
        // A Service slice (its name holds a '.') is deleted once its packed slice is written with
        // its entries (a fold, or a restarted controller packing everything again); every sample
        // checks what the nodes forward meanwhile.
        let service_slice = !plan && write.path.rsplit('/').next().is_some_and(|n| n.contains('.'));
        if write.method == Method::DELETE {
            if !service_slice {
                out.push(what);
            }
            continue;
        }
        let spec = write.body.as_ref().map_or(&Value::Null, |b| &b["spec"]);
        if plan {
            let plan: NodeForwardingPlanSpec = serde_json::from_value(spec.clone()).unwrap();
            if plan.views.is_empty() {
                out.push(format!("{what}: a plan without views"));
            }
            continue;
        }
        let slice: ForwardingSliceSpec = serde_json::from_value(spec.clone()).unwrap();
        if slice.entries.is_empty() && slice.service.is_none() {
            out.push(format!("{what}: a slice without entries"));
        }
        for entry in slice
            .entries
            .iter()
            .filter(|e| ROLLED.iter().any(|s| e.name == entry_name(*s)))
        {
            let ready = ready_endpoints(entry);
            if ready < REPLICAS {
                out.push(format!("{what}: {} with {ready} ready endpoints", entry.name));
            }
        }
    }
    out
}

/// Waits until no plan or slice write arrived for `quiet`.
async fn settle(server: &FakeApiServer, quiet: Duration) {
    let count = || {
        server
            .requests()
            .iter()
            .filter(|r| r.is_write() && (r.path.starts_with(PLANS) || r.path.starts_with(SLICES)))
            .count()
    };
    let (mut last, mut since) = (count(), Instant::now());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
    }
    panic!("writes did not settle");
}

/// What happens to the controller right after a rollout step is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Keeps running: the step is watched for a while (odd steps) or until it converged (even ones).
    Run,
    /// Graceful stop; the next steps happen while no controller runs.
    Stop,
    /// Killed mid-flight; the next steps happen while no controller runs.
    Crash,
    /// Killed mid-flight and started again at once.
    CrashAndStart,
    /// Started again (after this step was written while none ran).
    Start,
}

fn schedule(step: usize) -> Then {
    match step {
        3 => Then::Stop,
        4 => Then::Start,
        7 => Then::Crash,
        9 => Then::Start,
        10 => Then::CrashAndStart,
        _ => Then::Run,
    }
}

#[tokio::test]
async fn controller_restart_during_rollout_never_deletes_or_empties_a_plan_and_converges() {
    let server = FakeApiServer::new();
    let shape = shape(4);
    let first = rollout_input(&shape, 0);
    seed(&server, &first);
    let mut invariants = Invariants::new(&first);
    let mut incarnation = 0;
    let start = |incarnation: usize| {
        let server = server.clone();
        async move {
            Replica::start(
                &server,
                &format!("controller-{incarnation}"),
                Options::new(config()),
            )
            .await
        }
    };
    let mut controller = Some(start(incarnation).await);
    // Before the first sync there is nothing to check: no plan exists yet.
    assert!(
        eventually(Duration::from_secs(30), || differences(&server, &first)
            .is_empty())
        .await,
        "first sync: {:?}",
        differences(&server, &first)
    );
    invariants.sample(&server, "first sync");
    assert!(invariants.violations.is_empty(), "{:?}", invariants.violations);

    let (mut stops, mut crashes) = (0, 0);
    let mut writes_by: Vec<(String, usize)> = Vec::new();
    for step in 1..=STEPS {
        let when = format!("step {step}");
        let input = rollout_input(&shape, step);
        for s in ROLLED {
            server.put(Kind::EndpointSlice, rollout_slice(s, &shape, step));
        }
        match schedule(step) {
            // While none runs, or on odd steps: the next step comes before this one is written.
            Then::Run if controller.is_none() || step % 2 == 1 => {
                invariants.watch(&server, Duration::from_millis(150), &when).await;
            }
            Then::Run => {
                invariants.until_converged(&server, &input, &when).await;
            }
            then @ (Then::Stop | Then::Crash | Then::CrashAndStart) => {
                // Right after the change: its writes are queued or in flight.
                let replica = controller.take().unwrap();
                writes_by.push((replica.name.clone(), replica.leader_writes().len()));
                if then == Then::Stop {
                    replica.stop().await;
                    stops += 1;
                } else {
                    replica.crash().await;
                    crashes += 1;
                }
                invariants.watch(&server, Duration::from_millis(150), &when).await;
                if then == Then::CrashAndStart {
                    incarnation += 1;
                    controller = Some(start(incarnation).await);
                    invariants.watch(&server, Duration::from_millis(150), &when).await;
                }
            }
            Then::Start => {
                incarnation += 1;
                controller = Some(start(incarnation).await);
                invariants.watch(&server, Duration::from_millis(150), &when).await;
            }
        }
    }

    // The last state converges, and then nothing more is written.
    let last = rollout_input(&shape, STEPS);
    let took = invariants
        .until_converged(&server, &last, "after the rollout")
        .await;
    settle(&server, Duration::from_millis(500)).await;
    assert_eq!(differences(&server, &last), Vec::<String>::new());
    let replica = controller.take().unwrap();
    writes_by.push((replica.name.clone(), replica.leader_writes().len()));
    replica.stop().await;
    invariants.sample(&server, "stopped");

    let requests = server.requests();
    let writes = requests
        .iter()
        .filter(|r| r.is_write() && (r.path.starts_with(PLANS) || r.path.starts_with(SLICES)))
        .count();
    let bad = bad_writes(&requests);
    assert!(bad.is_empty(), "{} bad writes: {bad:#?}", bad.len());
    assert!(
        invariants.violations.is_empty(),
        "{} violations in {} samples: {:#?}",
        invariants.violations.len(),
        invariants.samples,
        invariants.violations
    );
    // The last incarnation caught up with what the crashed one left (an earlier one may be killed
    // before its first write on a slow machine).
    assert!(writes_by.last().is_some_and(|(_, n)| *n > 0), "{writes_by:?}");
    assert_eq!(stops + crashes, 3);
    switchyard_test_support::announce::announce(&format!(
        "fault: controller-restart-during-rollout: {STEPS} steps on {} Services, {} restarts ({stops} \
         graceful, {crashes} crashes), {writes} plan/slice writes ({}), 0 plans or slices deleted or \
         emptied, {} agent-view samples complete, converged {:.2} s after the last step",
        ROLLED.len(),
        stops + crashes,
        writes_by
            .iter()
            .map(|(name, n)| format!("{name}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        invariants.samples,
        took.as_secs_f64()
    ));
}

/// The checks above have teeth: a deleted plan, a plan without views, an emptied slice and a rolled
/// Service without its pods are each caught, on the stored objects and in the write log.
#[tokio::test]
async fn the_rollout_checks_catch_deleted_and_emptied_objects() {
    let server = FakeApiServer::new();
    let shape = shape(4);
    let input = rollout_input(&shape, 0);
    let offline = Planner::build(&input, &config()).unwrap();
    let mut written = Vec::new();
    let write = |method: Method, path: String, body: Option<Value>| Recorded {
        method,
        path,
        query: String::new(),
        content_type: None,
        body_len: 0,
        body,
        at: tokio::time::Instant::now(),
    };
    for (name, spec) in offline.slices(None) {
        let object = serde_json::to_value(output::slice_object(&name, spec)).unwrap();
        server.put(Kind::ForwardingSlice, &object);
        written.push(write(Method::PATCH, format!("{SLICES}/{name}"), Some(object)));
    }
    for node in offline.node_names() {
        let object = output::plan_object(node, None, offline.node_plan(node).unwrap());
        let object = serde_json::to_value(object).unwrap();
        server.put(Kind::Plan, &object);
        written.push(write(Method::PATCH, format!("{PLANS}/{node}"), Some(object)));
    }
    let mut invariants = Invariants::new(&input);
    invariants.sample(&server, "offline");
    assert_eq!(invariants.violations, Vec::<String>::new());
    assert_eq!(bad_writes(&written), Vec::<String>::new());
    assert!(differences(&server, &input).is_empty());

    let mut plan = server.get(Kind::Plan, "node-0001").unwrap();
    plan["spec"]["views"] = serde_json::json!([]);
    // A rolled Service down to one pod (in its slice), and another slice emptied.
    let mut rolled = rollout_slice(ROLLED[0], &shape, 0);
    rolled.endpoints.as_mut().unwrap().truncate(1);
    let mut fewer = input.clone();
    fewer.slices[ROLLED[0]] = rolled;
    let thinned = Planner::build(&fewer, &config()).unwrap().slices(None);
    let (name, spec) = thinned
        .iter()
        .find(|(_, spec)| spec.entries.iter().any(|e| e.name == entry_name(ROLLED[0])))
        .unwrap();
    let thinned = serde_json::to_value(output::slice_object(name, spec.clone())).unwrap();
    let emptied = server
        .keys(Kind::ForwardingSlice)
        .into_iter()
        .find(|other| other != name)
        .unwrap();
    let mut slice = server.get(Kind::ForwardingSlice, &emptied).unwrap();
    slice["spec"]["entries"] = serde_json::json!([]);
    let bad = [
        write(Method::DELETE, format!("{PLANS}/node-0002"), None),
        write(Method::PATCH, format!("{PLANS}/node-0001"), Some(plan.clone())),
        write(Method::PATCH, format!("{SLICES}/{emptied}"), Some(slice.clone())),
        write(Method::PATCH, format!("{SLICES}/{name}"), Some(thinned.clone())),
    ];
    assert_eq!(bad_writes(&bad).len(), 4, "{:?}", bad_writes(&bad));

    for (kind, object) in [
        (Kind::Plan, plan),
        (Kind::ForwardingSlice, slice),
        (Kind::ForwardingSlice, thinned),
    ] {
        server.put(kind, object);
    }
    server.remove(Kind::Plan, "node-0002");
    invariants.sample(&server, "tampered");
    let found = invariants.violations.join("\n");
    // The deleted plan, the plan without views, the emptied slice (on the nodes of its view), the
    // thinned Service.
    for want in ["plans [", "node-0001 forwards 0 entries", "has 1 ready endpoints"] {
        assert!(found.contains(want), "{want} not caught:\n{found}");
    }
    let short = invariants
        .violations
        .iter()
        .filter(|v| v.contains(" forwards ") && !v.contains("node-0001"))
        .count();
    assert!(short > 0, "the emptied slice {emptied} was not caught:\n{found}");
    assert!(!differences(&server, &input).is_empty());
}

// ---------------------------------------------------------------------------------------------------
// Two replicas.

const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(200),
};

fn replica_options(identity: &str) -> Options {
    let mut options = Options::new(config());
    options.leader_elect = true;
    options.identity = identity.into();
    options.timing = TIMING;
    options
}

/// The Lease's holder and its renewTime and acquireTime.
fn lease(server: &FakeApiServer) -> (Option<String>, Option<Timestamp>, Option<Timestamp>) {
    let Some(lease) = server.get(Kind::Lease, LEASE) else {
        return (None, None, None);
    };
    let time = |field: &str| {
        lease["spec"][field]
            .as_str()
            .map(|t| t.parse::<Timestamp>().unwrap())
    };
    (
        lease["spec"]["holderIdentity"].as_str().map(str::to_string),
        time("renewTime"),
        time("acquireTime"),
    )
}

/// How one takeover went.
struct Takeover {
    /// From the leader's end (crash, or the stop request) to the other replica leading.
    leading: Duration,
    /// From the leader's end to a change made right after it being stored.
    applied: Duration,
    /// Plan and slice writes of the new leader.
    writes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Crash,
    Stop,
}

/// Two replicas started together against one cluster: exactly one leads and writes, the other stays
/// silent; then the leader ends and the other takes over and applies a change made meanwhile.
async fn failover(end: End) -> Takeover {
    let server = FakeApiServer::new();
    let shape = shape(3);
    let mut input = cluster(&shape);
    seed(&server, &input);
    let (a, b) = tokio::join!(
        Replica::start(&server, "replica-a", replica_options("replica-a")),
        Replica::start(&server, "replica-b", replica_options("replica-b")),
    );
    assert!(eventually(Duration::from_secs(20), || a.leading() || b.leading()).await);
    let (leader, follower) = if a.leading() { (a, b) } else { (b, a) };

    // Both run through a first sync and a change: the leader alone writes, the holder of the Lease.
    let mut both_leading = 0;
    let mut converged = |server: &FakeApiServer, input: &Snapshot| {
        both_leading += usize::from(leader.leading() && follower.leading());
        differences(server, input).is_empty()
    };
    assert!(eventually(Duration::from_secs(30), || converged(&server, &input)).await);
    input.slices[ROLLED[0]] = synthetic::slice(ROLLED[0], &shape, 1);
    server.put(Kind::EndpointSlice, &input.slices[ROLLED[0]]);
    assert!(eventually(Duration::from_secs(30), || converged(&server, &input)).await);
    // A few lease rounds more: the follower keeps following.
    tokio::time::sleep(TIMING.retry_period * 5).await;
    assert_eq!(both_leading, 0, "both replicas led at once");
    assert!(leader.leading() && !follower.leading());
    assert_eq!(lease(&server).0.as_deref(), Some(leader.name.as_str()));
    assert!(!leader.leader_writes().is_empty());
    assert!(
        follower.leader_writes().is_empty(),
        "the follower wrote: {:?}",
        follower.leader_writes()
    );
    let plan_writes = server
        .requests()
        .iter()
        .filter(|r| r.is_write() && (r.path.starts_with(PLANS) || r.path.starts_with(SLICES)))
        .count();
    assert_eq!(
        plan_writes,
        leader
            .leader_writes()
            .iter()
            .filter(|s| !s.path.contains("/events"))
            .count(),
        "writes the leader did not send"
    );

    // The leader ends; a change comes right after.
    let old = leader.name.clone();
    let ended = Instant::now();
    match end {
        End::Crash => leader.crash().await,
        End::Stop => leader.stop().await,
    }
    let (holder, last_renew, _) = lease(&server);
    let last_renew = last_renew.unwrap();
    match end {
        End::Crash => assert_eq!(
            holder.as_deref(),
            Some(old.as_str()),
            "a crash released the lease"
        ),
        // Released, unless the follower already took it.
        End::Stop => assert_ne!(
            holder.as_deref(),
            Some(old.as_str()),
            "the lease was not released"
        ),
    }
    input.slices[ROLLED[0]] = synthetic::slice(ROLLED[0], &shape, 2);
    server.put(Kind::EndpointSlice, &input.slices[ROLLED[0]]);
    let limit = TIMING.lease_duration + TIMING.retry_period + Duration::from_secs(5);
    assert!(
        eventually(limit, || follower.leading()).await,
        "no takeover within {limit:?}"
    );
    let leading = ended.elapsed();
    assert!(
        eventually(limit, || differences(&server, &input).is_empty()).await,
        "the change was not applied within {limit:?}: {:?}",
        differences(&server, &input)
    );
    let applied = ended.elapsed();

    // The new leader holds the lease; after a crash it took it only once the old one expired, and it
    // wrote nothing before it held it.
    let (holder, _, acquired) = lease(&server);
    assert_eq!(holder.as_deref(), Some(follower.name.as_str()));
    let acquired = acquired.unwrap();
    let lease_duration = SignedDuration::try_from(TIMING.lease_duration).unwrap();
    if end == End::Crash {
        assert!(
            acquired >= last_renew + lease_duration,
            "taken over at {acquired}, the crashed leader's lease ran until {}",
            last_renew + lease_duration
        );
    }
    let writes = follower.leader_writes();
    assert!(!writes.is_empty());
    assert!(
        writes.iter().all(|w| w.wall >= acquired),
        "the new leader wrote before it held the lease: {writes:?}"
    );
    follower.stop().await;
    Takeover {
        leading,
        applied,
        writes: writes.len(),
    }
}

#[tokio::test]
async fn two_replicas_one_writer_and_failover_within_the_lease() {
    let crash = failover(End::Crash).await;
    let stop = failover(End::Stop).await;
    let limit = TIMING.lease_duration + TIMING.retry_period + Duration::from_secs(5);
    assert!(crash.applied <= limit, "{:?}", crash.applied);
    // A released lease is taken at the follower's next retry, not after the lease duration.
    assert!(
        stop.leading < TIMING.lease_duration,
        "took {:?} after a graceful stop",
        stop.leading
    );
    switchyard_test_support::announce::announce(&format!(
        "fault: leader-failover: 2 replicas, exactly one wrote, the follower none; leader crashed: \
         takeover {:.2} s, change applied {:.2} s ({} writes; lease {} s, retry {} ms); leader stopped: \
         lease released, takeover {:.2} s, change applied {:.2} s ({} writes)",
        crash.leading.as_secs_f64(),
        crash.applied.as_secs_f64(),
        crash.writes,
        TIMING.lease_duration.as_secs(),
        TIMING.retry_period.as_millis(),
        stop.leading.as_secs_f64(),
        stop.applied.as_secs_f64(),
        stop.writes,
    ));
}
