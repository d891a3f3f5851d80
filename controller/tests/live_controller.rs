//! The live controller against a fake API server at the HTTP level (tower-test): the exact server-side
//! apply requests for slices and plans, no-op suppression, incremental writes (one slice per endpoint
//! change), deletions, hand edits, late watch echoes, back-off and leadership.
// Test helpers outside #[test] functions may unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use http::Method;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use serde_json::{Value, json};
use switchyard_controller::{
    Config,
    live::{
        leader::Timing,
        run::{Options, Running, run},
    },
    output::{plan_object, slice_object},
    planner::{Planner, Snapshot},
};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind, Recorded, eventually};
use switchyard_test_support::synthetic::{self, Shape, service, slice};
use tokio::sync::oneshot;

/// The synthetic cluster of `shape` as the planner's input.
fn cluster(shape: &Shape) -> Snapshot {
    Snapshot::from(synthetic::cluster(shape).into_parts())
}

const PLANS: &str = "/apis/switchyard.io/v1alpha2/nodeforwardingplans";
const SLICES: &str = "/apis/switchyard.io/v1alpha2/forwardingslices";

fn shape() -> Shape {
    Shape {
        nodes: 3,
        services: 20,
        endpoints: 3,
        zones: 2,
        etp_local_percent: 10,
        itp_local_percent: 10,
        hinted_percent: 20,
    }
}

fn config(max_object_bytes: usize) -> Config {
    Config {
        min_plan_interval: Duration::from_millis(100),
        max_object_bytes,
        write_qps: 1000.0,
        write_burst: 1000,
        ..Config::default()
    }
}

fn seed(server: &FakeApiServer, shape: &Shape) {
    let snapshot = cluster(shape);
    server.seed(&snapshot.nodes, &snapshot.services, &snapshot.slices);
}

struct Controller {
    server: FakeApiServer,
    running: Running,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    async fn start(server: &FakeApiServer, options: Options) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel();
        let client = server.client();
        let task = tokio::spawn(async move {
            run(
                client,
                options,
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
            server: server.clone(),
            running,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap();
    }

    fn plan_writes(&self) -> Vec<Recorded> {
        self.writes_to(PLANS)
    }

    fn slice_writes(&self) -> Vec<Recorded> {
        self.writes_to(SLICES)
    }

    /// Writes of plans and slices.
    fn writes(&self) -> Vec<Recorded> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| (r.path.starts_with(PLANS) || r.path.starts_with(SLICES)) && r.is_write())
            .collect()
    }

    fn writes_to(&self, prefix: &str) -> Vec<Recorded> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix) && r.is_write())
            .collect()
    }
}

/// Object names of writes (plans and slices alike).
fn names(writes: &[Recorded]) -> Vec<String> {
    writes
        .iter()
        .map(|r| r.path.rsplit('/').next().unwrap_or_default().to_string())
        .collect()
}

/// Waits until the write log has stayed the same for `quiet` (so "nothing more happens" is checked).
async fn settle(ctl: &Controller, quiet: Duration) {
    let mut last = ctl.writes().len();
    let mut since = tokio::time::Instant::now();
    let deadline = since + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = ctl.writes().len();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
    panic!("writes did not settle");
}

#[tokio::test]
async fn first_sync_creates_every_slice_then_every_plan_with_the_exact_server_side_apply_request() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(600)).await;

    let offline = Planner::build(&cluster(&shape), &config(48 * 1024)).unwrap();
    let want_slices: Vec<String> = offline.slice_names().into_keys().collect();
    assert_eq!(want_slices, ["all-0000", "zone-0-0000", "zone-1-0000"]);
    // Every slice first, then one PATCH per node; each with the field manager, force, and the apply
    // content type; each body exactly what the offline planner produces (same code path, spec only).
    let writes = ctl.writes();
    let written = names(&writes);
    assert_eq!(&written[..3], &want_slices[..]);
    let mut plans = written[3..].to_vec();
    plans.sort();
    assert_eq!(plans, vec!["node-0000", "node-0001", "node-0002"]);
    for write in &writes {
        assert_eq!(write.method, Method::PATCH);
        assert_eq!(write.query, "&force=true&fieldManager=switchyard-controller");
        assert_eq!(
            write.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        let name = write.path.rsplit('/').next().unwrap();
        let want = if write.path.starts_with(SLICES) {
            serde_json::to_value(slice_object(name, offline.slice(name).unwrap())).unwrap()
        } else {
            let uid = offline.node_info(name).unwrap().uid.clone();
            let want = serde_json::to_value(plan_object(
                name,
                uid.as_deref(),
                offline.node_plan(name).unwrap(),
            ))
            .unwrap();
            assert_eq!(want["metadata"]["ownerReferences"][0]["kind"], "Node");
            assert_eq!(want["metadata"]["ownerReferences"][0]["controller"], true);
            want
        };
        assert_eq!(write.body.as_ref().unwrap(), &want, "{name}");
        assert!(want.get("status").is_none());
    }
    assert!(ctl.running.health.is_ready());
    let metrics = ctl.running.metrics.render();
    for line in [
        "switchyard_controller_plans_written_total 3",
        "switchyard_controller_slices_written_total 3",
        "switchyard_controller_plans_restored_total 0",
        "switchyard_controller_slices_restored_total 0",
        "switchyard_controller_write_budget_qps 1000.0",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    ctl.stop().await;
}

#[tokio::test]
async fn unchanged_input_writes_nothing_even_after_a_restart() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;
    // An update that changes nothing the planner reads (a label) writes nothing.
    let mut svc = service(3, &shape());
    svc.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    server.put(Kind::Service, &svc);
    server.clear_requests();
    settle(&ctl, Duration::from_millis(500)).await;
    assert!(ctl.writes().is_empty(), "{:?}", names(&ctl.writes()));
    ctl.stop().await;

    // A new controller finds the slices and plans up to date and writes nothing.
    server.clear_requests();
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(10), || ctl.running.health.is_ready()).await);
    settle(&ctl, Duration::from_millis(500)).await;
    assert!(ctl.writes().is_empty(), "{:?}", names(&ctl.writes()));
    ctl.stop().await;
}

#[tokio::test]
async fn one_endpoint_change_writes_the_one_slice_holding_it_and_only_the_plans_it_changes() {
    let server = FakeApiServer::new();
    let shape = Shape {
        services: 400,
        ..shape()
    };
    seed(&server, &shape);
    let budget = 16 * 1024;
    let ctl = Controller::start(&server, Options::new(config(budget))).await;
    assert!(eventually(Duration::from_secs(30), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(500)).await;
    assert!(
        server.keys(Kind::ForwardingSlice).len() >= 8,
        "expected several slices"
    );

    server.clear_requests();
    // Service 50 is a plain ClusterIP Service (the synthetic mix puts Local policies and hints on
    // 0-39 of every hundred): its first endpoint moves to a new pod IP on the same node.
    let changed = 50;
    let mut offline = Planner::build(&cluster(&shape), &config(budget)).unwrap();
    let mut updated = slice(changed, &shape, 1);
    let expected = offline
        .replan_service(
            &format!("bench/svc-{changed:05}"),
            Some(&service(changed, &shape)),
            &[&updated],
        )
        .unwrap();
    assert_eq!(expected.slices.len(), 1, "{expected:?}");
    assert_eq!(
        expected.plans.len(),
        1,
        "the node hosting the moved endpoint: its endpointsOnNode changed"
    );
    let trigger = "2026-11-29T10:00:00Z";
    updated.metadata.annotations = Some(
        [(
            "endpoints.kubernetes.io/last-change-trigger-time".to_string(),
            trigger.to_string(),
        )]
        .into(),
    );
    server.put(Kind::EndpointSlice, updated);
    settle(&ctl, Duration::from_millis(500)).await;
    let writes = ctl.writes();
    // The slice first, then the plan; nothing else.
    assert_eq!(
        names(&writes),
        vec![expected.slices[0].name.clone(), expected.plans[0].clone()]
    );
    // Every write carries the change's trigger time, for end-to-end network programming latency.
    for write in &writes {
        let annotation = &write.body.as_ref().unwrap()["metadata"]["annotations"]["switchyard.io/last-change-trigger-time"];
        assert_eq!(annotation, trigger, "{}", write.path);
    }
    let bytes: usize = writes.iter().map(|w| w.body_len).sum();
    assert!(
        bytes <= 64 * 1024,
        "{bytes} bytes written for one endpoint change"
    );
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_network_programming_duration_seconds_count 2"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn bursts_of_changes_never_take_our_own_late_echoes_for_outside_edits() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let mut cfg = config(48 * 1024);
    cfg.min_plan_interval = Duration::from_millis(20);
    let ctl = Controller::start(&server, Options::new(cfg)).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(300)).await;
    // Ten endpoint changes in quick succession, each moving pods between nodes (slices and plans change).
    for generation in 1..=10 {
        server.put(Kind::EndpointSlice, slice(2, &shape, generation));
        server.put(Kind::EndpointSlice, slice(3, &shape, generation));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    settle(&ctl, Duration::from_millis(500)).await;
    let metrics = ctl.running.metrics.render();
    for line in [
        "switchyard_controller_plans_restored_total 0",
        "switchyard_controller_slices_restored_total 0",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    // And the final state is the offline plan of the final input: the same plans, and every node
    // composes from the stored slices exactly what the offline plan gives it (the changed Services
    // live in their own Service slices; their packed copies stay as first written).
    let mut last = cluster(&shape);
    last.slices[2] = slice(2, &shape, 10);
    last.slices[3] = slice(3, &shape, 10);
    let offline = Planner::build(&last, &config(48 * 1024)).unwrap();
    let stored: Vec<(String, switchyard_api::ForwardingSliceSpec)> = server
        .keys(Kind::ForwardingSlice)
        .into_iter()
        .map(|name| {
            let spec =
                serde_json::from_value(server.get(Kind::ForwardingSlice, &name).unwrap()["spec"].clone());
            (name, spec.unwrap())
        })
        .collect();
    let refs: Vec<switchyard_api::compose::SliceRef<'_>> = stored
        .iter()
        .map(|(name, spec)| switchyard_api::compose::SliceRef { name, spec })
        .collect();
    assert!(
        stored.iter().any(|(_, s)| s.service.is_some()),
        "the changes went to Service slices"
    );
    for node in offline.node_names() {
        let plan = offline.node_plan(node).unwrap();
        let composed = switchyard_api::compose::compose(&plan, &refs).unwrap();
        assert_eq!(composed.spec.services, offline.oracle(node).unwrap(), "{node}");
    }
    for node in offline.node_names() {
        let want = serde_json::to_value(offline.node_plan(node).unwrap()).unwrap();
        assert_eq!(server.get(Kind::Plan, node).unwrap()["spec"], want);
    }
    ctl.stop().await;
}

#[tokio::test]
async fn node_deletion_deletes_its_plan_and_relists_never_do() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let mut options = Options::new(config(48 * 1024));
    options.orphan_sweep_period = Duration::from_millis(200);
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);

    // Watches restart (as after an API server restart): the relist finds the same cluster; nothing is deleted.
    server.close_watches();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(server.keys(Kind::Plan).len(), 3);

    server.remove(Kind::Node, "node-0001");
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0001")
            .is_none())
        .await
    );
    let deletes: Vec<Recorded> = ctl
        .plan_writes()
        .into_iter()
        .filter(|r| r.method == Method::DELETE)
        .collect();
    assert_eq!(names(&deletes), vec!["node-0001"]);
    // The deletion was confirmed with a GET of the Node first.
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.method == Method::GET && r.path == "/api/v1/nodes/node-0001")
    );
    ctl.stop().await;
}

#[tokio::test]
async fn a_node_delete_event_removes_its_plan_without_waiting_for_the_periodic_sweep() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let options = Options::new(config(48 * 1024));
    assert_eq!(options.orphan_sweep_period, Duration::from_secs(60));
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    // Past the sweep that runs at start: the next periodic one is a minute away.
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.remove(Kind::Node, "node-0002");
    assert!(
        eventually(Duration::from_secs(5), || server
            .get(Kind::Plan, "node-0002")
            .is_none())
        .await,
        "the plan of a deleted Node is still there"
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.method == Method::GET && r.path == "/api/v1/nodes/node-0002"),
        "deleted without confirming the Node is gone"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn hand_edited_or_deleted_plans_and_slices_are_restored() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;
    let original = server.get(Kind::Plan, "node-0002").unwrap();
    let original_slice = server.get(Kind::ForwardingSlice, "all-0000").unwrap();

    // Someone edits a spec but keeps the revision.
    let mut edited = original.clone();
    edited["spec"]["zone"] = json!("elsewhere");
    server.put(Kind::Plan, &edited);
    let mut edited = original_slice.clone();
    edited["spec"]["entries"][0]["port"] = json!(9999);
    server.put(Kind::ForwardingSlice, &edited);
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0002")
            .map(|p| p["spec"].clone())
            == Some(original["spec"].clone())
            && server
                .get(Kind::ForwardingSlice, "all-0000")
                .map(|s| s["spec"].clone())
                == Some(original_slice["spec"].clone()))
        .await
    );
    // Someone deletes a plan and a slice.
    server.remove(Kind::Plan, "node-0000");
    server.remove(Kind::ForwardingSlice, "all-0000");
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0000")
            .is_some()
            && server.get(Kind::ForwardingSlice, "all-0000").is_some())
        .await
    );
    let metrics = ctl.running.metrics.render();
    for line in [
        "switchyard_controller_plans_restored_total 2",
        "switchyard_controller_slices_restored_total 2",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    ctl.stop().await;
}

#[tokio::test]
async fn a_slice_nobody_wants_is_deleted() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    // Left over from an earlier layout: the view had two slices then.
    let (name, spec) = switchyard_api::testing::slice("all", 1, 2, vec![]);
    server.put(Kind::ForwardingSlice, slice_object(&name, spec));
    // The first two deletes fail: they back off (0.5 s, 1 s) like writes, never a tight loop.
    server.fail(Method::DELETE, "/forwardingslices/all-0001", 500, 2);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(
        eventually(Duration::from_secs(20), || server
            .get(Kind::ForwardingSlice, "all-0001")
            .is_none())
        .await
    );
    let deletes: Vec<Recorded> = ctl
        .slice_writes()
        .into_iter()
        .filter(|r| r.method == Method::DELETE)
        .collect();
    assert_eq!(names(&deletes), vec!["all-0001", "all-0001", "all-0001"]);
    assert!(
        deletes[2].at - deletes[0].at >= Duration::from_millis(1400),
        "backed off"
    );
    assert!(server.get(Kind::ForwardingSlice, "all-0000").is_some());
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_slices_deleted_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_controller_plan_write_failures_total 2"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn api_errors_back_off_instead_of_looping() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    server.fail(Method::PATCH, "/nodeforwardingplans/node-0001", 500, 3);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(
        eventually(Duration::from_secs(20), || server
            .get(Kind::Plan, "node-0001")
            .is_some())
        .await
    );
    let attempts: Vec<Recorded> = ctl
        .plan_writes()
        .into_iter()
        .filter(|r| r.path.ends_with("/node-0001"))
        .collect();
    // Three failures, then success: four attempts, spaced by the back-off (0.5 s, 1 s, 2 s), not a tight loop.
    assert_eq!(attempts.len(), 4);
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_plan_write_failures_total 3"),
        "{metrics}"
    );
    ctl.stop().await;
}

fn lease(holder: &str, renewed: Timestamp) -> Value {
    serde_json::to_value(Lease {
        metadata: ObjectMeta {
            name: Some("switchyard-controller".into()),
            namespace: Some("switchyard-system".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(1),
            ..LeaseSpec::default()
        }),
    })
    .unwrap()
}

#[tokio::test]
async fn only_the_lease_holder_writes() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    // Another replica holds a fresh lease.
    server.put(Kind::Lease, lease("other", Timestamp::now()));
    let mut options = Options::new(config(48 * 1024));
    options.leader_elect = true;
    options.identity = "me".into();
    options.timing = Timing {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    };
    let ctl = Controller::start(&server, options).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(ctl.writes().is_empty(), "a follower wrote");
    assert!(!*ctl.running.leader.borrow());

    // The other replica stops renewing: we take over and write.
    assert!(eventually(Duration::from_secs(10), || server.keys(Kind::Plan).len() == 3).await);
    assert!(*ctl.running.leader.borrow());
    let holder = server
        .get(Kind::Lease, "switchyard-system/switchyard-controller")
        .unwrap();
    assert_eq!(holder["spec"]["holderIdentity"], "me");

    // Someone else grabs the lease (as if our renewals had stalled): writes stop.
    server.put(
        Kind::Lease,
        lease(
            "usurper",
            Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(30),
        ),
    );
    assert!(eventually(Duration::from_secs(10), || !*ctl.running.leader.borrow()).await);
    server.clear_requests();
    server.put(Kind::EndpointSlice, slice(5, &shape(), 3));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        ctl.writes().is_empty(),
        "writes after losing the lease: {:?}",
        names(&ctl.writes())
    );

    // Shutdown releases a held lease; here it is not held, so it is left alone.
    ctl.stop().await;
    let lease = server
        .get(Kind::Lease, "switchyard-system/switchyard-controller")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "usurper");
}

#[tokio::test]
async fn shutdown_releases_the_lease() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let mut options = Options::new(config(48 * 1024));
    options.leader_elect = true;
    options.identity = "me".into();
    options.timing.retry_period = Duration::from_millis(100);
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(10), || *ctl.running.leader.borrow()).await);
    ctl.stop().await;
    let lease = server
        .get(Kind::Lease, "switchyard-system/switchyard-controller")
        .unwrap();
    assert!(
        lease["spec"].get("holderIdentity").is_none_or(Value::is_null),
        "{lease}"
    );
}

fn lease_options(timing: Timing) -> Options {
    let mut options = Options::new(config(48 * 1024));
    options.leader_elect = true;
    options.identity = "me".into();
    options.timing = timing;
    options
}

#[tokio::test]
async fn a_hung_lease_call_steps_the_leader_down_within_the_renew_deadline() {
    let timing = Timing {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(100),
    };
    // The lease's GET and PUT: a hung one must not keep this replica writing while another one takes the
    // lease over once it expires.
    for method in [Method::PUT, Method::GET] {
        let server = FakeApiServer::new();
        seed(&server, &shape());
        let ctl = Controller::start(&server, lease_options(timing)).await;
        assert!(eventually(Duration::from_secs(10), || server.keys(Kind::Plan).len() == 3).await);
        server.hang(method.clone(), "/leases/", None);
        let hung = tokio::time::Instant::now();
        assert!(
            eventually(Duration::from_secs(10), || !*ctl.running.leader.borrow()).await,
            "{method}: still leading"
        );
        // The last renew was at most one retry period before the hang; the slack is for a loaded machine,
        // well below the lease duration after which another replica may write.
        let after = hung.elapsed();
        assert!(
            after < timing.renew_deadline + Duration::from_millis(700),
            "{method}: stepped down after {after:?}"
        );
        server.clear_requests();
        server.put(Kind::EndpointSlice, slice(5, &shape(), 3));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            ctl.writes().is_empty(),
            "{method}: writes after stepping down: {:?}",
            names(&ctl.writes())
        );
        ctl.stop().await;
    }
}

#[tokio::test]
async fn losing_the_lease_mid_write_keeps_the_node_queued() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let mut options = lease_options(Timing {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(100),
    });
    // One write a second: the second node waits for the budget while the lease is lost.
    options.config.write_qps = 1.0;
    options.config.write_burst = 1;
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(10), || !server.keys(Kind::Plan).is_empty()).await);
    server.put(Kind::Lease, lease("usurper", Timestamp::now()));
    assert!(eventually(Duration::from_secs(5), || !*ctl.running.leader.borrow()).await);
    // The usurper stops renewing: once its lease expires we lead again and write every node, including
    // the one whose write was cut short.
    assert!(
        eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await,
        "{:?}",
        server.keys(Kind::Plan)
    );
    assert!(*ctl.running.leader.borrow());
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_plan_write_failures_total 0"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn a_plan_deleted_while_the_watch_was_down_is_recreated_after_the_relist() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;

    // The deletion's event is lost; only the relist after 410 Gone shows the plan missing.
    server.clear_requests();
    server.remove_unseen(Kind::Plan, "node-0002");
    server.expire_watches();
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0002")
            .is_some())
        .await,
        "the plan missing from the relist was not recreated"
    );
    settle(&ctl, Duration::from_millis(300)).await;
    assert_eq!(names(&ctl.plan_writes()), vec!["node-0002"]);
    ctl.stop().await;
}

/// Waits until the server received a request that matches.
async fn received(server: &FakeApiServer, matches: impl Fn(&Recorded) -> bool) -> bool {
    eventually(Duration::from_secs(10), || server.requests().iter().any(&matches)).await
}

#[tokio::test]
async fn a_hung_relist_confirmation_does_not_block_event_intake() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let mut options = Options::new(config(48 * 1024));
    options.api_timeout = Duration::from_millis(300);
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;

    // The Services relist comes back empty; the list that would confirm it never answers.
    server.hang(Method::GET, "/api/v1/services", Some("limit=1"));
    for key in server.keys(Kind::Service) {
        server.remove_unseen(Kind::Service, &key);
    }
    server.expire_watches();
    assert!(
        received(&server, |r| r.path == "/api/v1/services"
            && r.query.split('&').any(|p| p == "limit=1"))
        .await
    );
    server.clear_requests();
    server.put(Kind::EndpointSlice, slice(5, &shape, 3));
    assert!(
        eventually(Duration::from_secs(10), || !ctl.writes().is_empty()).await,
        "the slice change was not taken in while the confirmation hung"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn a_hung_orphan_sweep_does_not_block_event_intake() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let mut options = Options::new(config(48 * 1024));
    options.api_timeout = Duration::from_millis(300);
    options.orphan_sweep_period = Duration::from_millis(200);
    let ctl = Controller::start(&server, options).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;

    // The GET that would confirm the Node is gone never answers.
    server.hang(Method::GET, "/api/v1/nodes/node-0001", None);
    server.remove(Kind::Node, "node-0001");
    assert!(
        received(&server, |r| r.method == Method::GET
            && r.path == "/api/v1/nodes/node-0001")
        .await
    );
    server.clear_requests();
    server.put(Kind::EndpointSlice, slice(5, &shape, 3));
    assert!(
        eventually(Duration::from_secs(10), || !ctl.writes().is_empty()).await,
        "the slice change was not taken in while the sweep hung"
    );
    // Nothing was deleted on a Node GET that never answered.
    assert!(server.get(Kind::Plan, "node-0001").is_some());
    ctl.stop().await;
}

/// `count` Services with a selector and no EndpointSlice (the NoEndpoints problem), named broken-N.
fn broken_services(server: &FakeApiServer, count: usize) {
    for i in 0..count {
        let mut svc = service(900 + i, &shape());
        svc.metadata.name = Some(format!("broken-{i}"));
        svc.spec.as_mut().unwrap().selector = Some([("app".to_string(), format!("broken-{i}"))].into());
        server.put(Kind::Service, &svc);
    }
}

#[tokio::test]
async fn a_broken_service_gets_one_warning_event_however_often_it_is_replanned() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    broken_services(&server, 1);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(10), || server.keys(Kind::Event).len() == 1).await);
    let key = &server.keys(Kind::Event)[0];
    let event = server.get(Kind::Event, key).unwrap();
    let service = server.get(Kind::Service, &service_key(&event)).unwrap();
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "NoEndpoints");
    assert_eq!(event["regarding"]["kind"], "Service");
    assert_eq!(event["regarding"]["name"], "broken-0");
    assert_eq!(event["regarding"]["uid"], service["metadata"]["uid"]);
    assert_eq!(event["reportingController"], "switchyard.io/controller");
    assert!(
        event["note"].as_str().unwrap().contains("matches no Pod"),
        "{event}"
    );

    // Re-planned again and again (its labels change): still that one Event, never patched.
    for round in 0..5 {
        let mut svc: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(server.get(Kind::Service, &service_key(&event)).unwrap()).unwrap();
        svc.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("round".into(), round.to_string());
        server.put(Kind::Service, &svc);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let events: Vec<Recorded> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/events") && r.is_write())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let text = ctl.running.metrics.render();
    assert!(
        text.contains("switchyard_controller_service_problems{reason=\"NoEndpoints\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_controller_service_problem_events_total{outcome=\"published\"} 1"),
        "{text}"
    );
    ctl.stop().await;
}

fn service_key(event: &Value) -> String {
    format!(
        "{}/{}",
        event["regarding"]["namespace"].as_str().unwrap(),
        event["regarding"]["name"].as_str().unwrap()
    )
}

#[tokio::test]
async fn many_broken_services_get_events_at_the_rate_limit_only() {
    use switchyard_controller::live::events::BURST;
    let server = FakeApiServer::new();
    seed(&server, &shape());
    broken_services(&server, 60);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(
        eventually(Duration::from_secs(10), || server.keys(Kind::Event).len()
            >= BURST as usize)
        .await
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let published = server.keys(Kind::Event).len();
    // The burst, and a few more at 0.5 per second (slack for a slow machine): not one per broken Service.
    assert!(
        (BURST as usize..=BURST as usize + 5).contains(&published),
        "{published} events"
    );
    let text = ctl.running.metrics.render();
    assert!(
        text.contains("switchyard_controller_service_problems{reason=\"NoEndpoints\"} 60"),
        "{text}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn a_dropped_run_stops_writing_instead_of_spinning() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(500)).await;
    // Dropped without its shutdown future resolving (an embedding that aborts the task): the writer
    // must take the closed stop channel as a stop, not as a reason to loop again.
    ctl.task.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The runtime of this test is this thread: what its tasks burn while it sleeps is this thread's.
    let before = thread_cpu_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let burnt = thread_cpu_ticks() - before;
    assert!(
        burnt < 20,
        "{burnt} CPU ticks in 1 s of an aborted controller: a task spins"
    );
    server.clear_requests();
    server.put(Kind::EndpointSlice, slice(50, &shape, 1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes: Vec<Recorded> = server
        .requests()
        .into_iter()
        .filter(|r| (r.path.starts_with(PLANS) || r.path.starts_with(SLICES)) && r.is_write())
        .collect();
    assert!(
        writes.is_empty(),
        "an aborted controller wrote {:?}",
        names(&writes)
    );
}

/// CPU time of the calling thread (user + system), in clock ticks (1/100 s).
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Whether node-0000 forwards Service `s`: its stored plan composed with the stored slices (false while
/// a view is incomplete).
fn forwarded(server: &FakeApiServer, s: usize) -> bool {
    let Some(plan) = server.get(Kind::Plan, "node-0000") else {
        return false;
    };
    let Ok(plan) = serde_json::from_value::<switchyard_api::NodeForwardingPlanSpec>(plan["spec"].clone())
    else {
        return false;
    };
    let stored: Vec<(String, switchyard_api::ForwardingSliceSpec)> = server
        .keys(Kind::ForwardingSlice)
        .into_iter()
        .filter_map(|name| {
            let spec = server.get(Kind::ForwardingSlice, &name)?["spec"].clone();
            Some((name, serde_json::from_value(spec).ok()?))
        })
        .collect();
    let refs: Vec<switchyard_api::compose::SliceRef<'_>> = stored
        .iter()
        .map(|(name, spec)| switchyard_api::compose::SliceRef { name, spec })
        .collect();
    let prefix = format!("bench/svc-{s:05}:");
    switchyard_api::compose::compose(&plan, &refs)
        .is_ok_and(|composed| composed.spec.services.iter().any(|e| e.name.starts_with(&prefix)))
}

/// The upstream conformance suite writes a Service status condition with `lastTransitionTime: null`
/// (the API server accepts it; k8s-openapi refuses it). Rewritten again and again, it never fails the
/// Service watch, and a Service created meanwhile is planned. A Service whose port does not decode
/// (the fake server stores anything) keeps its last good version, with a count and a Warning Event on
/// it; deleted, it goes.
#[tokio::test]
async fn a_null_status_condition_never_breaks_the_service_watch() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let ctl = Controller::start(&server, Options::new(config(48 * 1024))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    assert!(forwarded(&server, 5));

    for round in 0..5 {
        let mut conformance = serde_json::to_value(service(3, &shape)).unwrap();
        conformance["status"] = json!({
            "loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]},
            "conditions": [{"type": "StatusUpdate", "status": "True", "reason": "E2E",
                            "message": format!("Set from e2e test, round {round}"),
                            "lastTransitionTime": null}],
        });
        server.put(Kind::Service, conformance);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut broken = serde_json::to_value(service(5, &shape)).unwrap();
    broken["spec"]["ports"][0]["port"] = json!("eighty");
    server.put(Kind::Service, broken.clone());
    server.put(Kind::Service, service(20, &shape));
    server.put(Kind::EndpointSlice, slice(20, &shape, 0));
    assert!(
        eventually(Duration::from_secs(10), || forwarded(&server, 20)).await,
        "the Service created meanwhile was never planned"
    );
    assert!(
        forwarded(&server, 5),
        "the last good version of the broken Service stays planned"
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            server.keys(Kind::Event).iter().any(|key| {
                server
                    .get(Kind::Event, key)
                    .is_some_and(|e| e["reason"] == "Undecodable" && e["regarding"]["name"] == "svc-00005")
            })
        })
        .await,
        "a Warning Event on the Service that does not decode: {:?}",
        server.keys(Kind::Event)
    );
    let text = ctl.running.metrics.render();
    assert!(
        !text.contains("switchyard_controller_watch_errors_total{"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_controller_undecodable_objects_total{kind=\"Service\"} 1"),
        "{text}"
    );

    // Deleted while it does not decode: its entries go.
    server.remove(Kind::Service, "bench/svc-00005");
    assert!(
        eventually(Duration::from_secs(10), || !forwarded(&server, 5)).await,
        "the deleted Service is still planned"
    );
    ctl.stop().await;
}

/// Issue 44: a ServiceCIDR reaches every plan's header; one overlapping the pod CIDR is ignored with a
/// Warning Event on it, and the Services are planned as before. A Service whose externalIP the policy
/// refuses gets a Warning Event and no rule for it.
#[tokio::test]
async fn service_cidrs_reach_every_plan_and_refused_external_ips_get_an_event() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let service_cidr = |name: &str, cidr: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
               "metadata": {"name": name, "uid": format!("uid-{name}")},
               "spec": {"cidrs": [cidr]}})
    };
    server.put(Kind::ServiceCidr, service_cidr("kubernetes", "10.96.0.0/12"));
    server.put(Kind::ServiceCidr, service_cidr("on-pods", "10.244.0.0/16"));
    let mut exposed = service(950, &shape());
    exposed.metadata.name = Some("exposed".into());
    exposed.spec.as_mut().unwrap().external_ips = Some(vec!["198.51.100.7".into(), "203.0.113.7".into()]);
    server.put(Kind::Service, &exposed);
    let mut config = config(48 * 1024);
    config.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    config.external_ips =
        switchyard_controller::config::ExternalIpPolicy::AllowCidrs(vec!["203.0.113.0/24".parse().unwrap()]);
    let ctl = Controller::start(&server, Options::new(config)).await;
    let headers_have_the_range = || {
        let plans = server.keys(Kind::Plan);
        !plans.is_empty()
            && plans.iter().all(|key| {
                server
                    .get(Kind::Plan, key)
                    .is_some_and(|plan| plan["spec"]["cluster"]["serviceCIDRs"] == json!(["10.96.0.0/12"]))
            })
    };
    assert!(eventually(Duration::from_secs(10), headers_have_the_range).await);
    let event_about = |kind: &str, reason: &str| {
        server.keys(Kind::Event).iter().find_map(|key| {
            let event = server.get(Kind::Event, key)?;
            (event["regarding"]["kind"] == kind && event["reason"] == reason).then_some(event)
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || {
            event_about("ServiceCIDR", "ServiceCIDROverlapsPodCIDR").is_some()
                && event_about("Service", "ExternalIPNotAllowed").is_some()
        })
        .await,
        "events: {:?}",
        server.keys(Kind::Event)
    );
    let cidr_event = event_about("ServiceCIDR", "ServiceCIDROverlapsPodCIDR").unwrap();
    assert_eq!(cidr_event["type"], "Warning");
    assert_eq!(cidr_event["regarding"]["name"], "on-pods");
    let ip_event = event_about("Service", "ExternalIPNotAllowed").unwrap();
    assert_eq!(ip_event["regarding"]["name"], "exposed");
    assert!(
        ip_event["note"].as_str().unwrap().contains("198.51.100.7"),
        "{ip_event}"
    );
    // The slices hold the allowed externalIP and never the refused one.
    let slices: Vec<String> = server
        .keys(Kind::ForwardingSlice)
        .iter()
        .filter_map(|key| server.get(Kind::ForwardingSlice, key))
        .map(|slice| slice.to_string())
        .collect();
    assert!(
        slices.iter().any(|s| s.contains("203.0.113.7")),
        "the allowed one is served"
    );
    assert!(
        !slices.iter().any(|s| s.contains("198.51.100.7")),
        "the refused one has no rule"
    );
    let text = ctl.running.metrics.render();
    assert!(
        text.contains("switchyard_controller_ignored_service_cidrs{reason=\"ServiceCIDROverlapsPodCIDR\"} 1"),
        "{text}"
    );
    ctl.stop().await;
}
