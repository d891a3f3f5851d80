//! The live agent without its API server: the cached plan (and its slices) is applied at start (before any request)
//! and kept through an outage; the status writer coalesces, backs off and catches up; `/healthz`,
//! `/readyz` and `/metrics`; the plan-file source feeding the same loop.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use switchyard_agent::metrics::{LiveMetrics, registry};
use switchyard_agent::run::RunIo;
use switchyard_agent::run::grace::GracePeriod;
use switchyard_agent::run::health::AgentHealth;
use switchyard_agent::source::file::FileSource;
use switchyard_agent::status_writer::{self, StatusReport, WriterConfig};
use switchyard_agent::sync::{FakeClock, SyncMetrics};
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::testing::{EntryExt, entry, ep, live_plan, slice};
use switchyard_api::{IpFamily, NodeForwardingPlan, NodeForwardingPlanStatus, ObservedSlices};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind};

use crate::fixtures::{base, local_addrs};
use crate::live_support::{
    Agent, NODE, config, get, metric, put_plan, put_slice, scratch, status_patches, stored_status, wait,
    wait_http,
};

fn writer() -> WriterConfig {
    WriterConfig {
        min_interval: Duration::from_millis(100),
        progress_interval: Duration::from_millis(300),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(400),
    }
}

/// A client whose API server is gone: connections to a port nothing listens on are refused.
fn unreachable_client() -> kube::Client {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_the_api_server_applies_the_cached_plan_and_keeps_forwarding() {
    let spec = base();
    let iptables = FakeIptables::new(&local_addrs());
    let tmp = scratch("restart");
    let dir = tmp.path().to_path_buf();

    // First life: the plan comes from the API server and is cached.
    let server = FakeApiServer::new();
    put_plan(&server, &spec);
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(Some(&dir), GracePeriod::Never),
        writer(),
    )
    .await;
    wait("the first sync", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_revision.as_deref() == Some(&spec.revision))
    })
    .await;
    let programmed = iptables.dump(IpFamily::IPv4);
    agent.stop().await;
    assert_eq!(
        iptables.dump(IpFamily::IPv4),
        programmed,
        "the rules stay on exit"
    );

    // Second life, the API server unreachable: the cache is applied and the agent becomes ready.
    let restores_before = iptables.restores().len();
    let agent = Agent::start(
        unreachable_client(),
        &iptables,
        config(Some(&dir), GracePeriod::For(Duration::from_millis(100))),
        writer(),
    )
    .await;
    let addr = agent.addr();
    wait_http("readiness from the cache", addr, "/readyz", 200).await;
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["observedRevision"], spec.revision.as_str());
    assert_eq!(health["nodeName"], NODE);
    let restores = iptables.restores();
    assert!(restores.len() > restores_before, "the cached plan was restored");
    assert!(
        restores[restores_before..]
            .iter()
            .all(|(_, payload)| !payload.contains("-F\n") && !payload.contains("-X SWYD-SERVICES")),
        "a restart replaces our chains, never flushes the tables"
    );
    assert_eq!(
        iptables.dump(IpFamily::IPv4),
        programmed,
        "the same rules: forwarding never interrupted"
    );
    // The outage goes on: no deletion is ever concluded from errors, so the short grace never fires.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(iptables.dump(IpFamily::IPv4), programmed);
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(
        metric(&text, "switchyard_agent_plan_deleted"),
        Some(0.0),
        "{text}"
    );
    agent.stop().await;

    // Third life, against a server that fails every request: the same.
    let failing = FakeApiServer::new();
    put_plan(&failing, &spec);
    failing.fail(Method::GET, "", 500, usize::MAX);
    failing.fail(Method::PATCH, "", 500, usize::MAX);
    let agent = Agent::start(
        failing.client(),
        &iptables,
        config(Some(&dir), GracePeriod::For(Duration::from_millis(100))),
        writer(),
    )
    .await;
    wait_http("readiness from the cache", agent.addr(), "/readyz", 200).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(iptables.dump(IpFamily::IPv4), programmed);
    let (_, text) = get(agent.addr(), "/metrics").await;
    assert!(
        metric(&text, "switchyard_agent_status_write_failures_total").unwrap() >= 1.0,
        "{text}"
    );
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_the_api_server_composes_the_cached_plan_and_slices() {
    let live = live_plan(NODE, &["all", "zone-a"], vec![]);
    let all = slice(
        "all",
        0,
        1,
        vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
    );
    let zone = slice(
        "zone-a",
        0,
        1,
        vec![entry("ns/b:p", "10.96.0.2", 80).with(ep("10.244.2.2", 80))],
    );
    let iptables = FakeIptables::new(&local_addrs());
    let tmp = scratch("restart-slices");
    let dir = tmp.path().to_path_buf();
    let server = FakeApiServer::new();
    put_plan(&server, &live);
    put_slice(&server, &all);
    put_slice(&server, &zone);
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(Some(&dir), GracePeriod::Never),
        writer(),
    )
    .await;
    wait("the first sync", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_slices.is_some_and(|o| o.count == 2))
    })
    .await;
    let programmed = iptables.dump(IpFamily::IPv4);
    assert!(programmed.contains("10.244.2.1:80") && programmed.contains("10.244.2.2:80"));
    agent.stop().await;
    let cache = std::fs::read_to_string(dir.join("plan.yaml")).unwrap();
    assert!(
        cache.contains("ForwardingSlice") && cache.contains(&zone.1.revision),
        "the slices are cached"
    );

    let agent = Agent::start(
        unreachable_client(),
        &iptables,
        config(Some(&dir), GracePeriod::Never),
        writer(),
    )
    .await;
    wait_http("readiness from the cache", agent.addr(), "/readyz", 200).await;
    let (_, body) = get(agent.addr(), "/healthz").await;
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["observedRevision"], live.revision.as_str());
    assert_eq!(
        iptables.dump(IpFamily::IPv4),
        programmed,
        "the same rules from the cache"
    );
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_goes_in_before_the_first_request() {
    let spec = base();
    let tmp = scratch("first");
    let dir = tmp.path().to_path_buf();
    let mut set = switchyard_agent::source::PlanSet::from_file(Arc::new(spec.clone()), vec![]);
    set.origin = switchyard_agent::source::Origin::Api;
    set.plan_meta.name = Some(NODE.into());
    switchyard_agent::source::cache::write(&dir.join("plan.yaml"), &set, switchyard_api::Backend::Iptables)
        .unwrap();
    let server = FakeApiServer::new();
    let iptables = FakeIptables::new(&local_addrs());
    let probe = iptables.clone();
    let seen = server.clone();
    // The source of this agent records, when it starts, whether the kernel already had the plan.
    struct Probe {
        iptables: FakeIptables,
        requests: FakeApiServer,
        answer: tokio::sync::mpsc::UnboundedSender<(bool, usize)>,
    }
    impl switchyard_agent::source::PlanSource for Probe {
        fn spawn(
            self: Box<Self>,
            _tx: switchyard_agent::source::UpdateSender,
        ) -> tokio::task::JoinHandle<()> {
            let programmed = self.iptables.dump(IpFamily::IPv4).contains("SWYD-");
            let _ = self.answer.send((programmed, self.requests.requests().len()));
            tokio::spawn(std::future::pending())
        }
        fn describe(&self) -> String {
            "probe".into()
        }
    }
    let (answer, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let io = RunIo {
        source: Box::new(Probe {
            iptables: probe,
            requests: seen,
            answer,
        }),
        status: None,
        metrics: LiveMetrics::default(),
    };
    let agent = Agent::start_with(&iptables, config(Some(&dir), GracePeriod::Never), io).await;
    assert_eq!(
        answers.recv().await.unwrap(),
        (true, 0),
        "programmed from the cache before the source started, no request made"
    );
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn report(revision: &str) -> StatusReport {
    StatusReport {
        uid: None,
        status: NodeForwardingPlanStatus {
            observed_revision: Some(revision.into()),
            ..Default::default()
        },
    }
}

fn observed_in(body: &serde_json::Value) -> String {
    body["status"]["observedRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_are_coalesced_backed_off_and_catch_up() {
    let server = FakeApiServer::new();
    put_plan(&server, &base());
    let metrics = LiveMetrics::default();
    let config = WriterConfig {
        min_interval: Duration::from_millis(300),
        progress_interval: Duration::from_millis(300),
        retry_min: Duration::from_millis(200),
        retry_max: Duration::from_millis(400),
    };
    let (sink, _task) = status_writer::spawn(
        kube::Api::<NodeForwardingPlan>::all(server.client()),
        NODE.into(),
        config,
        metrics.clone(),
    );

    // Three failures, then the API server is back: the latest report is written, once.
    server.fail(Method::PATCH, "/status", 500, 3);
    let start = tokio::time::Instant::now();
    sink.send_replace(Some(report("r1")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    sink.send_replace(Some(report("r2")));
    sink.send_replace(Some(report("r3")));
    wait("the write after the outage", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_revision.as_deref() == Some("r3"))
    })
    .await;
    let elapsed = start.elapsed();
    let patches = status_patches(&server, NODE);
    assert_eq!(patches.len(), 4, "3 failed attempts and 1 success: {patches:?}");
    assert_eq!(observed_in(&patches[0]), "r1");
    assert_eq!(observed_in(&patches[3]), "r3", "latest wins");
    // Backoff 200, 400, 400 ms (each at least the 300 ms interval): never a tight loop.
    assert!(elapsed >= Duration::from_millis(1000), "{elapsed:?}");
    assert_eq!(metrics.status_write_failures.get(), 3);
    wait("the write to be counted", || metrics.status_writes.get() == 1).await;

    // A burst: coalesced into at most one write per interval, the last one the latest report.
    for i in 0..20 {
        sink.send_replace(Some(report(&format!("burst-{i}"))));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait("the burst's last report", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_revision.as_deref() == Some("burst-19"))
    })
    .await;
    let burst = status_patches(&server, NODE).len() - 4;
    assert!((1..=3).contains(&burst), "20 reports in ~200 ms → {burst} writes");

    // The same report again: nothing written.
    sink.send_replace(Some(report("burst-19")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_patches(&server, NODE).len(), 4 + burst);

    // The plan is gone (404): no retry loop; the next report is tried once more.
    server.remove(Kind::Plan, NODE);
    sink.send_replace(Some(report("gone")));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(status_patches(&server, NODE).len(), 4 + burst + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slice_progress_is_reported_at_most_every_progress_interval_and_news_at_once() {
    let server = FakeApiServer::new();
    put_plan(&server, &base());
    let config = WriterConfig {
        min_interval: Duration::from_millis(50),
        progress_interval: Duration::from_millis(1500),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(400),
    };
    let (sink, _task) = status_writer::spawn(
        kube::Api::<NodeForwardingPlan>::all(server.client()),
        NODE.into(),
        config,
        LiveMetrics::default(),
    );
    let with_slices = |revision: &str, digest: &str| {
        let mut r = report(revision);
        r.status.observed_slices = Some(ObservedSlices {
            count: 3,
            digest: digest.into(),
        });
        r.status.last_sync_time = Some(format!("2026-01-01T00:00:0{}Z", digest.len() % 10));
        r
    };
    sink.send_replace(Some(with_slices("r1", "d1")));
    wait("the first report", || status_patches(&server, NODE).len() == 1).await;
    // Slices move on (every agent of the view syncs on every endpoint change): held back.
    let start = tokio::time::Instant::now();
    sink.send_replace(Some(with_slices("r1", "d2")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    sink.send_replace(Some(with_slices("r1", "d3-later")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        status_patches(&server, NODE).len(),
        1,
        "progress is not written at once"
    );
    wait("the progress after the interval", || {
        stored_status(&server, NODE)
            .is_some_and(|s| s.observed_slices.is_some_and(|o| o.digest == "d3-later"))
    })
    .await;
    assert!(
        start.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        status_patches(&server, NODE).len(),
        2,
        "one write for both progress reports"
    );
    // A new plan revision is news: written at once, even within the interval.
    let start = tokio::time::Instant::now();
    sink.send_replace(Some(with_slices("r2", "d4")));
    wait("the new revision", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_revision.as_deref() == Some("r2"))
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_kube_proxy_like_and_metrics_name_everything() {
    let clock = Arc::new(FakeClock::at_2026());
    let health = Arc::new(AgentHealth::new(NODE, Duration::from_secs(60), clock.clone()));
    let sync = SyncMetrics::default();
    let live = LiveMetrics::default();
    let registry = Arc::new(registry(&sync, &live, None));
    let (addr, server) =
        switchyard_agent::run::http::serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&health), registry)
            .await
            .unwrap();

    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(code, 200, "nothing queued yet: {body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"lastUpdated": null, "currentTime": "2026-01-01T00:00:00Z", "nodeName": NODE,
                           "healthy": true, "observedRevision": null})
    );

    health.synced(Some("rev-1".into()), &[]);
    assert_eq!(get(addr, "/readyz").await.0, 200);
    health.queued();
    clock.advance(Duration::from_secs(61));
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(
        code, 503,
        "an update queued for more than 2 × the resync period: {body}"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"lastUpdated": "2026-01-01T00:00:00Z", "currentTime": "2026-01-01T00:01:01Z",
                           "nodeName": NODE, "healthy": false, "observedRevision": "rev-1"})
    );
    health.synced(Some("rev-2".into()), &[]);
    assert_eq!(get(addr, "/healthz").await.0, 200);

    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "switchyard_agent_sync_duration_seconds",
        "switchyard_agent_sync_failures_total",
        "switchyard_agent_restore_failures",
        "switchyard_agent_rules",
        "switchyard_agent_drift_repairs_total",
        "switchyard_agent_plan_age_seconds",
        "switchyard_agent_network_programming_duration_seconds",
        "switchyard_agent_status_write_failures_total",
        "switchyard_agent_plan_deleted",
        "switchyard_agent_plan_deleted_seconds",
    ] {
        assert!(
            text.contains(&format!("\n{name}")) || text.contains(&format!("# TYPE {name}")),
            "{name}:\n{text}"
        );
    }
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_file_source_feeds_the_same_loop() {
    let tmp = scratch("file");
    let dir = tmp.path().to_path_buf();
    let spec = base();
    let path = dir.join("plan.yaml");
    std::fs::write(
        &path,
        serde_saphyr::to_string(&NodeForwardingPlan::new(NODE, spec.clone())).unwrap(),
    )
    .unwrap();
    let iptables = FakeIptables::new(&local_addrs());
    let mut config = config(None, GracePeriod::Never);
    config.status_file = Some(dir.join("status.yaml"));
    let io = RunIo {
        source: Box::new(FileSource {
            path: path.clone(),
            poll_interval: Duration::from_millis(20),
        }),
        status: None,
        metrics: LiveMetrics::default(),
    };
    let agent = Agent::start_with(&iptables, config, io).await;
    wait_http("readiness", agent.addr(), "/readyz", 200).await;
    let status = std::fs::read_to_string(dir.join("status.yaml")).unwrap();
    assert!(status.contains(&spec.revision), "{status}");
    assert!(iptables.dump(IpFamily::IPv4).contains("SWYD-SERVICES"));
    std::fs::write(&path, "spec: [").unwrap();
    wait("InvalidPlan in the status file", || {
        std::fs::read_to_string(dir.join("status.yaml")).is_ok_and(|s| s.contains("InvalidPlan"))
    })
    .await;
    assert!(
        iptables.dump(IpFamily::IPv4).contains("SWYD-SERVICES"),
        "rules stay"
    );
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
