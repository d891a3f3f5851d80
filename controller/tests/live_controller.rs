//! The live controller against a fake API server at the HTTP level (tower-test): the exact server-side
//! apply requests, no-op suppression, incremental writes, deletions, hand edits, back-off and leadership.
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
    output::objects,
    planner::Planner,
    synthetic::{Shape, cluster, service, slice},
    testing::fake_apiserver::{FakeApiServer, Kind, Recorded, eventually},
};
use tokio::sync::oneshot;

const PLANS: &str = "/apis/switchyard.io/v1alpha1/nodeforwardingplans";

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

fn config(max_plan_bytes: usize) -> Config {
    Config {
        min_plan_interval: Duration::from_millis(100),
        max_plan_bytes,
        write_qps: 1000.0,
        write_burst: 1000,
        ..Config::default()
    }
}

fn seed(server: &FakeApiServer, shape: &Shape) {
    let snapshot = cluster(shape);
    for node in &snapshot.nodes {
        server.put(Kind::Node, node);
    }
    for svc in &snapshot.services {
        server.put(Kind::Service, svc);
    }
    for s in &snapshot.slices {
        server.put(Kind::EndpointSlice, s);
    }
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
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(PLANS) && r.is_write())
            .collect()
    }
}

fn names(writes: &[Recorded]) -> Vec<String> {
    writes
        .iter()
        .map(|r| r.path.trim_start_matches(&format!("{PLANS}/")).to_string())
        .collect()
}

/// Waits until the plan-write log has stayed the same for `quiet` (so "nothing more happens" is checked).
async fn settle(ctl: &Controller, quiet: Duration) {
    let mut last = ctl.plan_writes().len();
    let mut since = tokio::time::Instant::now();
    let deadline = since + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = ctl.plan_writes().len();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
    panic!("plan writes did not settle");
}

#[tokio::test]
async fn first_sync_creates_every_plan_with_the_exact_server_side_apply_request() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(600)).await;

    // Exactly one PATCH per node, with the field manager, force, and the apply content type.
    let writes = ctl.plan_writes();
    let mut written = names(&writes);
    written.sort();
    assert_eq!(written, vec!["node-0000", "node-0001", "node-0002"]);
    let offline = Planner::build(&cluster(&shape), &config(1 << 20)).unwrap();
    for write in &writes {
        assert_eq!(write.method, Method::PATCH);
        assert_eq!(write.query, "&force=true&fieldManager=switchyard-controller");
        assert_eq!(
            write.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        // The body is what the offline planner produces for the node: same code path, spec only.
        let node = write.path.rsplit('/').next().unwrap();
        let want = serde_json::to_value(&objects(&offline.node_plan(node).unwrap())[0]).unwrap();
        assert_eq!(write.body.as_ref().unwrap(), &want);
        assert!(want.get("status").is_none());
        assert_eq!(want["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(want["metadata"]["ownerReferences"][0]["controller"], true);
    }
    assert!(ctl.running.health.is_ready());
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_plans_written_total 3"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn unchanged_input_writes_nothing_even_after_a_restart() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;
    // An update that changes nothing the planner reads (a label) writes nothing.
    let mut svc = service(3, &shape());
    svc.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    server.put(Kind::Service, &svc);
    server.clear_requests();
    settle(&ctl, Duration::from_millis(500)).await;
    assert!(ctl.plan_writes().is_empty(), "{:?}", ctl.plan_writes());
    ctl.stop().await;

    // A new controller finds the plans up to date and writes nothing.
    server.clear_requests();
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
    assert!(eventually(Duration::from_secs(10), || ctl.running.health.is_ready()).await);
    settle(&ctl, Duration::from_millis(500)).await;
    assert!(ctl.plan_writes().is_empty(), "{:?}", names(&ctl.plan_writes()));
    ctl.stop().await;
}

#[tokio::test]
async fn one_endpoint_change_writes_exactly_the_affected_shards() {
    let server = FakeApiServer::new();
    let shape = Shape {
        services: 400,
        ..shape()
    };
    seed(&server, &shape);
    let budget = 64 * 1024;
    let ctl = Controller::start(&server, Options::new(config(budget))).await;
    assert!(
        eventually(Duration::from_secs(30), || server.keys(Kind::Plan).len() >= 6).await,
        "{:?}",
        server.keys(Kind::Plan)
    );
    settle(&ctl, Duration::from_millis(500)).await;
    let shards = server.keys(Kind::Plan).len() / 3;
    assert!(shards >= 2, "expected sharded plans");

    server.clear_requests();
    let changed = 7;
    let mut updated = slice(changed, &shape, 1);
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
    // Every write carries the change's trigger time, for end-to-end network programming latency.
    for write in ctl.plan_writes() {
        let annotation = &write.body.as_ref().unwrap()["metadata"]["annotations"]["switchyard.io/last-change-trigger-time"];
        assert_eq!(annotation, trigger, "{}", write.path);
    }
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_network_programming_duration_seconds_count 3"),
        "{metrics}"
    );
    let writes = names(&ctl.plan_writes());
    // Per node: the shard holding the Service, then the primary (which lists shard revisions).
    let offline = Planner::build(&cluster(&shape), &config(budget)).unwrap();
    for node in ["node-0000", "node-0001", "node-0002"] {
        let holder = offline
            .node_plan(node)
            .unwrap()
            .objects
            .iter()
            .position(|o| {
                o.services
                    .iter()
                    .any(|s| s.name == format!("bench/svc-{changed:05}:http"))
            })
            .unwrap();
        let mine: Vec<&String> = writes.iter().filter(|n| n.starts_with(node)).collect();
        if holder == 0 {
            assert_eq!(mine, vec![node], "{writes:?}");
        } else {
            assert_eq!(
                mine,
                vec![&format!("{node}.shard-{holder}"), &node.to_string()],
                "{writes:?}"
            );
        }
    }
    ctl.stop().await;
}

#[tokio::test]
async fn node_deletion_deletes_its_plan_and_relists_never_do() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let mut options = Options::new(config(1 << 20));
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
async fn a_hand_edited_or_deleted_plan_is_restored() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
    assert!(eventually(Duration::from_secs(20), || server.keys(Kind::Plan).len() == 3).await);
    settle(&ctl, Duration::from_millis(400)).await;
    let original = server.get(Kind::Plan, "node-0002").unwrap();

    // Someone edits the spec but keeps the revision.
    let mut edited = original.clone();
    edited["spec"]["services"][0]["port"] = json!(9999);
    server.put(Kind::Plan, &edited);
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0002")
            .map(|p| p["spec"].clone())
            == Some(original["spec"].clone()))
        .await
    );
    // Someone deletes a plan.
    server.remove(Kind::Plan, "node-0000");
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, "node-0000")
            .is_some())
        .await
    );
    let metrics = ctl.running.metrics.render();
    assert!(
        metrics.contains("switchyard_controller_plans_restored_total 2"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn api_errors_back_off_instead_of_looping() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    server.fail(Method::PATCH, "/nodeforwardingplans/node-0001", 500, 3);
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
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
    let mut options = Options::new(config(1 << 20));
    options.leader_elect = true;
    options.identity = "me".into();
    options.timing = Timing {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    };
    let ctl = Controller::start(&server, options).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(ctl.plan_writes().is_empty(), "a follower wrote plans");
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
        ctl.plan_writes().is_empty(),
        "writes after losing the lease: {:?}",
        names(&ctl.plan_writes())
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
    let mut options = Options::new(config(1 << 20));
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
    let mut options = Options::new(config(1 << 20));
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
            ctl.plan_writes().is_empty(),
            "{method}: writes after stepping down: {:?}",
            names(&ctl.plan_writes())
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

fn sharded_shape() -> Shape {
    Shape {
        services: 400,
        ..shape()
    }
}

#[tokio::test]
async fn a_deleted_secondary_shard_is_recreated() {
    let server = FakeApiServer::new();
    seed(&server, &sharded_shape());
    let ctl = Controller::start(&server, Options::new(config(64 * 1024))).await;
    assert!(eventually(Duration::from_secs(30), || server.keys(Kind::Plan).len() >= 6).await);
    settle(&ctl, Duration::from_millis(500)).await;
    let shard = "node-0001.shard-1";
    let original = server.get(Kind::Plan, shard).expect("a secondary shard");

    server.clear_requests();
    server.remove(Kind::Plan, shard);
    assert!(
        eventually(Duration::from_secs(10), || server
            .get(Kind::Plan, shard)
            .is_some())
        .await,
        "{shard} was not recreated"
    );
    assert_eq!(server.get(Kind::Plan, shard).unwrap()["spec"], original["spec"]);
    settle(&ctl, Duration::from_millis(300)).await;
    assert_eq!(names(&ctl.plan_writes()), vec![shard]);
    ctl.stop().await;
}

#[tokio::test]
async fn a_plan_deleted_while_the_watch_was_down_is_recreated_after_the_relist() {
    let server = FakeApiServer::new();
    seed(&server, &shape());
    let ctl = Controller::start(&server, Options::new(config(1 << 20))).await;
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
    let mut options = Options::new(config(1 << 20));
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
        eventually(Duration::from_secs(10), || !ctl.plan_writes().is_empty()).await,
        "the slice change was not taken in while the confirmation hung"
    );
    ctl.stop().await;
}

#[tokio::test]
async fn a_hung_orphan_sweep_does_not_block_event_intake() {
    let server = FakeApiServer::new();
    let shape = shape();
    seed(&server, &shape);
    let mut options = Options::new(config(1 << 20));
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
        eventually(Duration::from_secs(10), || !ctl.plan_writes().is_empty()).await,
        "the slice change was not taken in while the sweep hung"
    );
    // Nothing was deleted on a Node GET that never answered.
    assert!(server.get(Kind::Plan, "node-0001").is_some());
    ctl.stop().await;
}
