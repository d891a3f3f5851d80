//! The live agent against the fake API server (HTTP level): it watches only its own plan and the
//! slices of its views, applies only complete views, writes status by server-side apply to the status
//! subresource, and keeps a deleted plan's rules for the grace period.

use std::time::Duration;

use http::Method;
use switchyard_agent::run::grace::GracePeriod;
use switchyard_agent::status_writer::WriterConfig;
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, status};
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, live_plan, plan, slice};
use switchyard_api::{IpFamily, NodeForwardingPlanSpec};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind};

use crate::fixtures::{base, edit, local_addrs};
use crate::live_support::{
    Agent, NODE, config, get, metric, plan_object, put_plan, put_slice, scratch, status_patches,
    stored_status, wait,
};

fn observed(server: &FakeApiServer, revision: &str) -> bool {
    stored_status(server, NODE).is_some_and(|s| s.observed_revision.as_deref() == Some(revision))
}

fn writer() -> WriterConfig {
    WriterConfig {
        min_interval: Duration::from_millis(100),
        progress_interval: Duration::from_millis(300),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(400),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_is_applied_and_status_is_server_side_applied_to_the_status_subresource() {
    let server = FakeApiServer::new();
    let spec = base();
    server.put(Kind::Plan, plan_object(NODE, &spec, Some("2026-01-01T00:00:00Z")));
    // Another node's plan: never read, never written.
    put_plan(&server, &plan("node-b", vec![]));
    let iptables = FakeIptables::new(&local_addrs());
    let tmp = scratch("ssa");
    let dir = tmp.path().to_path_buf();
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(Some(&dir), GracePeriod::Never),
        writer(),
    )
    .await;
    wait("the status of the first sync", || {
        observed(&server, &spec.revision)
    })
    .await;
    assert!(
        iptables
            .dump(IpFamily::IPv4)
            .contains("--to-destination 10.244.2.53:53")
    );

    let s = stored_status(&server, NODE).unwrap();
    let applied = s.conditions.iter().find(|c| c.type_ == APPLIED).unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        (status::TRUE, reasons::SYNCED)
    );
    assert_eq!((s.services, s.endpoints), (Some(3), Some(5)));

    // The exact requests: reads of this node's plans only, and status writes by server-side apply.
    let requests = server.requests();
    for r in &requests {
        assert!(
            r.path
                .starts_with("/apis/switchyard.io/v1alpha2/nodeforwardingplans"),
            "{r:?}"
        );
        match r.method {
            Method::GET if r.path.ends_with("/nodeforwardingplans") => assert!(
                r.query.contains("labelSelector=switchyard.io%2Fnode%3Dnode-a"),
                "every list and watch selects this node's objects: {r:?}"
            ),
            Method::GET => assert!(r.path.ends_with("/node-a"), "{r:?}"),
            Method::PATCH => {
                assert_eq!(
                    r.path,
                    "/apis/switchyard.io/v1alpha2/nodeforwardingplans/node-a/status"
                );
                let mut query: Vec<&str> = r.query.split('&').filter(|p| !p.is_empty()).collect();
                query.sort_unstable();
                assert_eq!(query, ["fieldManager=switchyard-agent", "force=true"]);
                assert_eq!(r.content_type.as_deref(), Some("application/apply-patch+yaml"));
                let body = r.body.as_ref().unwrap();
                let mut keys: Vec<&String> = body.as_object().unwrap().keys().collect();
                keys.sort_unstable();
                assert_eq!(keys, ["apiVersion", "kind", "metadata", "status"]);
                assert_eq!(body["apiVersion"], "switchyard.io/v1alpha2");
                assert_eq!(body["kind"], "NodeForwardingPlan");
                assert_eq!(body["metadata"], serde_json::json!({"name": "node-a"}));
            }
            _ => panic!("unexpected request {r:?}"),
        }
    }
    assert!(stored_status(&server, "node-b").is_none());
    let cache = std::fs::read_to_string(dir.join("plan.yaml")).unwrap();
    assert!(cache.contains(&spec.revision), "the applied plan is cached");

    // A spec change: applied, the status follows, latency observed from the trigger annotation.
    let next = edit(&spec, "ns1/web:http", |e| {
        e.endpoints[1].ip = "10.244.3.99".into()
    });
    server.put(Kind::Plan, plan_object(NODE, &next, Some("2026-01-01T00:00:01Z")));
    wait("the status to follow the spec", || {
        observed(&server, &next.revision)
    })
    .await;
    assert!(iptables.dump(IpFamily::IPv4).contains("10.244.3.99:8080"));
    let (code, text) = get(agent.addr(), "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(
        metric(
            &text,
            "switchyard_agent_network_programming_duration_seconds_count"
        ),
        Some(2.0),
        "{text}"
    );
    assert!(
        metric(&text, "switchyard_agent_plan_age_seconds").unwrap() > 1000.0,
        "written 2026-01-01 by the controller's managedFields: {text}"
    );
    assert!(metric(&text, "switchyard_agent_status_writes_total").unwrap() >= 2.0);

    // Our own status writes come back through the watch; they must not cause syncs or writes.
    let writes = status_patches(&server, NODE).len();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(status_patches(&server, NODE).len(), writes, "no write loop");
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn status_reason(server: &FakeApiServer, reason: &str) -> bool {
    stored_status(server, NODE).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == APPLIED && c.status == status::FALSE && c.reason == reason)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_are_applied_only_when_complete_and_follow_their_slices() {
    let server = FakeApiServer::new();
    let a = || entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80));
    let b = |ip: &str| entry("ns/b:p", "10.96.0.2", 80).with(ep(ip, 80));
    let live = live_plan(NODE, &["all", "zone-a"], vec![]);
    put_plan(&server, &live);
    put_slice(&server, &slice("all", 0, 2, vec![a()]));
    put_slice(&server, &slice("zone-a", 0, 1, vec![]));
    // Another zone's slice: the agent never reads it.
    put_slice(&server, &slice("zone-b", 0, 1, vec![b("10.244.9.9")]));
    let iptables = FakeIptables::new(&local_addrs());
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(None, GracePeriod::Never),
        writer(),
    )
    .await;
    wait("IncompleteView in the status", || {
        status_reason(&server, reasons::INCOMPLETE_VIEW)
    })
    .await;
    assert!(
        !iptables.dump(IpFamily::IPv4).contains("SWYD-"),
        "nothing applied from an incomplete view"
    );
    assert!(stored_status(&server, NODE).unwrap().observed_revision.is_none());
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/forwardingslices")
                && r.query
                    .contains("labelSelector=switchyard.io%2Fview+in+%28all%2Czone-a%29")),
        "{:?}",
        server
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.path, r.query))
            .collect::<Vec<_>>()
    );

    // The missing slice arrives: the view is complete and applied.
    put_slice(&server, &slice("all", 1, 2, vec![b("10.244.2.2")]));
    wait("the complete views", || observed(&server, &live.revision)).await;
    let dump = iptables.dump(IpFamily::IPv4);
    assert!(
        dump.contains("10.244.2.1:80") && dump.contains("10.244.2.2:80"),
        "{dump}"
    );
    assert!(!dump.contains("10.244.9.9"), "another zone's slice leaked in");
    let status = stored_status(&server, NODE).unwrap();
    assert_eq!(status.services, Some(2));
    assert_eq!(status.observed_slices.as_ref().map(|o| o.count), Some(3));

    // An endpoint change rewrites one slice and no plan: applied, and the digest follows.
    let digest = status.observed_slices.unwrap().digest;
    put_slice(&server, &slice("all", 1, 2, vec![b("10.244.2.3")]));
    wait("the changed slice", || {
        iptables.dump(IpFamily::IPv4).contains("10.244.2.3:80")
    })
    .await;
    wait("the new digest", || {
        stored_status(&server, NODE).is_some_and(|s| s.observed_slices.is_some_and(|o| o.digest != digest))
    })
    .await;

    // An endpoint of ns/b becomes local to this node under iTP=Local: the plan gains an override.
    let mut with_override = live_plan(
        NODE,
        &["all", "zone-a"],
        vec![
            entry("ns/b:p", "10.96.0.2", 80)
                .itp_local()
                .with(ep("10.244.1.7", 80).local())
                .with(ep("10.244.2.3", 80).not_cluster()),
        ],
    );
    with_override.endpoints_on_node = vec!["10.244.1.7".into()];
    switchyard_api::testing::finish(&mut with_override);
    put_plan(&server, &with_override);
    wait("the override", || observed(&server, &with_override.revision)).await;
    let dump = iptables.dump(IpFamily::IPv4);
    assert!(dump.contains("10.244.1.7:80"), "{dump}");
    // And goes again: back to the view's entry.
    put_plan(&server, &live);
    wait("the override removed", || observed(&server, &live.revision)).await;
    assert!(!iptables.dump(IpFamily::IPv4).contains("10.244.1.7:80"));

    // The view shrinks to one slice and ns/b is deleted: all-0001 is retired; its entries go like a
    // Service that is deleted.
    put_slice(&server, &slice("all", 0, 1, vec![a()]));
    server.remove(Kind::ForwardingSlice, "all-0001");
    wait("ns/b removed", || {
        !iptables.dump(IpFamily::IPv4).contains("10.244.2.3:80")
    })
    .await;
    assert!(iptables.dump(IpFamily::IPv4).contains("10.244.2.1:80"));
    wait("one entry left", || {
        stored_status(&server, NODE).is_some_and(|s| s.services == Some(1))
    })
    .await;
    agent.stop().await;
}

/// A slice the agent cannot decode (`spec.index` past u32: the CRD bounds it below only, so a real API
/// server accepts it; and an unknown field) keeps its last good copy programmed, the status says why
/// (`InvalidSlice`), the slice watch is never restarted for it, and the next good version is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_slice_keeps_its_last_good_rules_and_the_status_says_why() {
    let server = FakeApiServer::new();
    let a = |ip: &str| entry("ns/a:p", "10.96.0.1", 80).with(ep(ip, 80));
    let live = live_plan(NODE, &["all"], vec![]);
    put_plan(&server, &live);
    put_slice(&server, &slice("all", 0, 1, vec![a("10.244.2.1")]));
    let iptables = FakeIptables::new(&local_addrs());
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(None, GracePeriod::Never),
        writer(),
    )
    .await;
    wait("the first sync", || observed(&server, &live.revision)).await;

    let (name, spec) = slice("all", 0, 1, vec![a("10.244.2.9")]);
    let mut odd = crate::live_support::slice_object(&name, &spec, None);
    odd["spec"]["index"] = serde_json::json!(4_294_967_296_u64);
    odd["spec"]["someFutureField"] = serde_json::json!({"x": null});
    server.put(Kind::ForwardingSlice, odd);
    let degraded = |server: &FakeApiServer| {
        stored_status(server, NODE).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == DEGRADED && c.reason == reasons::INVALID_SLICE)
        })
    };
    wait("InvalidSlice in the status", || degraded(&server)).await;
    let status = stored_status(&server, NODE).unwrap();
    let failure = status
        .failures
        .iter()
        .find(|f| f.service == "ForwardingSlice all-0000")
        .unwrap_or_else(|| panic!("{:?}", status.failures));
    assert!(
        failure
            .reason
            .contains("cannot be read: spec.index: 4294967296 is out of range")
            && failure.reason.contains("last good revision"),
        "{failure:?}"
    );
    let dump = iptables.dump(IpFamily::IPv4);
    assert!(
        dump.contains("10.244.2.1:80") && !dump.contains("10.244.2.9"),
        "the last good rules stay: {dump}"
    );

    // The next good version is applied and the problem goes; the slice watch was listed once.
    put_slice(&server, &slice("all", 0, 1, vec![a("10.244.2.5")]));
    wait("the good version", || {
        iptables.dump(IpFamily::IPv4).contains("10.244.2.5:80")
    })
    .await;
    wait("the problem gone", || !degraded(&server)).await;
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/forwardingslices") && !r.query.contains("watch=true"))
        .count();
    assert_eq!(lists, 1, "the slice watch restarted (a relist)");
    agent.stop().await;
}

fn deleted_gauge(text: &str) -> Option<f64> {
    metric(text, "switchyard_agent_plan_deleted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_plan_keeps_its_rules_for_the_grace_period_then_they_go() {
    let server = FakeApiServer::new();
    let spec = base();
    put_plan(&server, &spec);
    let iptables = FakeIptables::new(&local_addrs());
    let tmp = scratch("grace");
    let dir = tmp.path().to_path_buf();
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(Some(&dir), GracePeriod::For(Duration::from_millis(1500))),
        writer(),
    )
    .await;
    wait("the first sync", || observed(&server, &spec.revision)).await;
    let programmed = iptables.dump(IpFamily::IPv4);

    // Deleted and back within the grace period: the rules never move.
    server.remove(Kind::Plan, NODE);
    let addr = agent.addr();
    let deleted = wait_metric(addr, |t| deleted_gauge(t) == Some(1.0)).await;
    assert!(deleted.contains("switchyard_agent_plan_deleted_seconds"));
    assert_eq!(iptables.dump(IpFamily::IPv4), programmed, "rules kept");
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.method == Method::GET && r.path.ends_with("/nodeforwardingplans/node-a")),
        "the deletion was confirmed with a GET"
    );
    put_plan(&server, &spec);
    wait_metric(addr, |t| deleted_gauge(t) == Some(0.0)).await;
    wait("the status on the recreated plan", || {
        observed(&server, &spec.revision)
    })
    .await;
    assert_eq!(iptables.dump(IpFamily::IPv4), programmed);

    // Deleted for good: after the grace period the rules and the cache go.
    server.remove(Kind::Plan, NODE);
    // The rules go first, then the cache: wait for both (checking the cache right after the rules raced).
    wait("the rules and the cache to be removed", || {
        !iptables.dump(IpFamily::IPv4).contains("SWYD-") && !dir.join("plan.yaml").exists()
    })
    .await;
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(deleted_gauge(&text), Some(1.0), "{text}");

    // It comes back: applied as usual.
    put_plan(&server, &spec);
    wait("the plan applied again", || {
        iptables.dump(IpFamily::IPv4) == programmed
    })
    .await;
    agent.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_that_misses_the_plan_is_not_a_deletion() {
    let server = FakeApiServer::new();
    let spec = base();
    put_plan(&server, &spec);
    let iptables = FakeIptables::new(&local_addrs());
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(None, GracePeriod::For(Duration::from_millis(100))),
        writer(),
    )
    .await;
    wait("the first sync", || observed(&server, &spec.revision)).await;
    // The object loses its label (the watch no longer sees it) and the watch expires (410 Gone): the
    // relist misses it, but a GET finds it.
    let mut object = server.get(Kind::Plan, NODE).unwrap();
    object["metadata"]["labels"] = serde_json::json!({});
    server.put(Kind::Plan, object);
    server.clear_requests();
    server.expire_watches();
    wait("the GET that confirms", || {
        server
            .requests()
            .iter()
            .any(|r| r.method == Method::GET && r.path.ends_with("/nodeforwardingplans/node-a"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, text) = get(agent.addr(), "/metrics").await;
    assert_eq!(deleted_gauge(&text), Some(0.0), "{text}");
    assert!(iptables.dump(IpFamily::IPv4).contains("SWYD-"), "rules kept");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_for_another_node_is_refused_whole() {
    let server = FakeApiServer::new();
    let mut wrong: NodeForwardingPlanSpec = base();
    wrong.node_name = "node-b".into();
    server.put(Kind::Plan, plan_object(NODE, &wrong, None));
    let iptables = FakeIptables::new(&local_addrs());
    let agent = Agent::start(
        server.client(),
        &iptables,
        config(None, GracePeriod::Never),
        writer(),
    )
    .await;
    wait("InvalidPlan in the status", || {
        stored_status(&server, NODE).is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == APPLIED && c.reason == reasons::INVALID_PLAN && c.message.contains("node-b")
            })
        })
    })
    .await;
    assert!(!iptables.dump(IpFamily::IPv4).contains("SWYD-"));
    agent.stop().await;
}

async fn wait_metric(addr: std::net::SocketAddr, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + crate::live_support::WAIT;
    loop {
        let (_, text) = get(addr, "/metrics").await;
        if check(&text) {
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn explain_reads_the_plan_and_only_its_views_slices_from_the_api_server() {
    use switchyard_agent::explain::{Destination, Outcome, Source, explain};
    let server = FakeApiServer::new();
    let a = entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80));
    let live = live_plan(NODE, &["all"], vec![]);
    // The status says what the agent applied: a node that fell back reads that backend's kernel.
    let mut object = crate::live_support::plan_object(NODE, &live, None);
    object["status"] = serde_json::json!({ "backend": "iptables" });
    server.put(Kind::Plan, object);
    put_slice(&server, &slice("all", 0, 1, vec![a]));
    put_slice(
        &server,
        &slice("zone-b", 0, 1, vec![entry("ns/b:p", "10.96.0.2", 80)]),
    );
    let (plan, slices, in_use) = switchyard_agent::start::fetch_plan(server.client(), NODE)
        .await
        .unwrap();
    assert_eq!(plan, live);
    assert_eq!(in_use, Some(switchyard_api::Backend::Iptables));
    let names: Vec<&str> = slices.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.len(), 1, "only the view's slice: {names:?}");
    use switchyard_agent::sync::{Composition, LastGood, compose_plan};
    let Composition::Ready { spec, .. } =
        compose_plan(&std::sync::Arc::new(plan), &slices, &mut LastGood::default())
    else {
        panic!("the view is complete");
    };
    let dest: Destination = "10.96.0.1:80".parse().unwrap();
    let (explanation, _, _) = explain(&spec, &dest, Source::Node, None).unwrap();
    assert!(
        matches!(&explanation.outcome, Outcome::Forwarded { endpoints } if endpoints[0].endpoint == "10.244.2.1:80"),
        "{}",
        explanation.text()
    );
    let missing = switchyard_agent::start::fetch_plan(server.client(), "node-x")
        .await
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("reading nodeforwardingplan node-x from the API server"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_inside_the_grace_period_resumes_it_instead_of_starting_again() {
    use switchyard_agent::run::grace::{marker_path, record};
    let server = FakeApiServer::new();
    let spec = base();
    put_plan(&server, &spec);
    let iptables = FakeIptables::new(&local_addrs());
    let tmp = scratch("grace-restart");
    let dir = tmp.path().to_path_buf();
    let grace = GracePeriod::For(Duration::from_secs(900));
    let first = Agent::start(server.client(), &iptables, config(Some(&dir), grace), writer()).await;
    wait("the first sync", || observed(&server, &spec.revision)).await;
    server.remove(Kind::Plan, NODE);
    let marker = marker_path(&switchyard_agent::source::cache::cache_path(&dir));
    wait("the deletion recorded on disk", || marker.exists()).await;
    first.stop().await;
    assert!(
        iptables.dump(IpFamily::IPv4).contains("SWYD-"),
        "rules kept through the stop"
    );

    // As if that deletion had happened 20 minutes ago: the restarted agent finds the plan still gone
    // and the 15-minute grace already over, so the rules and the cache go now, not in 15 minutes.
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(1200);
    std::fs::write(&marker, record(long_ago)).unwrap();
    let second = Agent::start(server.client(), &iptables, config(Some(&dir), grace), writer()).await;
    wait("the rules, the cache and the record to be removed", || {
        !iptables.dump(IpFamily::IPv4).contains("SWYD-")
            && !dir.join("plan.yaml").exists()
            && !marker.exists()
    })
    .await;
    second.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
