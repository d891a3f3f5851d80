//! Faults of the API server as the agents see it: gone for a minute (faults 1), answering errors or
//! answering slowly (fault 2). Traffic to Services whose endpoints do not change must not notice.

use std::time::Duration;

use http::Method;
use switchyard_api::{Backend, SyncMode};
use switchyard_e2e::traffic::Traffic;

use crate::harness::{APPLY_TIMEOUT, ApiLab, answers, set_checkout_new_ready};
use crate::{outage, stable_flows};

const FULL_SYNCS: &str = "switchyard_agent_syncs_total{mode=\"full\"}";
const STATUS_WRITE_FAILURES: &str = "switchyard_agent_status_write_failures_total";

fn full_syncs(api: &ApiLab) -> Vec<f64> {
    api.nodes()
        .iter()
        .map(|node| api.metric(node, FULL_SYNCS).unwrap_or(-1.0))
        .collect()
}

/// Fault 1: the API server is unreachable from every node for a minute (the relays are cut: connects
/// refused, open watches ended), then back; then again, and this time the plans changed meanwhile.
#[test]
fn api_server_outage_keeps_forwarding_and_status_catches_up() {
    let Some(mut api) = ApiLab::up("api_server_outage", Backend::Nftables, &[], &[]) else {
        return;
    };
    let nodes = api.nodes();
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let full_before = full_syncs(&api);

    traffic.phase("during");
    for node in &nodes {
        api.cut(node);
    }
    std::thread::sleep(outage());
    for node in &nodes {
        assert!(
            api.agent(node).is_running(),
            "{node}: the agent exited during the outage:\n{}",
            api.agent_log(node)
        );
    }
    traffic.phase("after");
    for node in &nodes {
        api.restore(node);
    }
    std::thread::sleep(Duration::from_secs(3));
    for node in &nodes {
        api.wait_applied(node, APPLY_TIMEOUT);
    }
    assert_eq!(
        full_syncs(&api),
        full_before,
        "an outage must not cause a full resync"
    );
    let report = traffic.stop();
    switchyard_test_support::announce::announce(&report.line("api-outage"));
    assert_eq!(report.total().failed, 0, "{:#?}", report.failures);
    assert!(report.phase("during").connections > 0);

    // The variant: the plan changes while the API server is away from the agents.
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    assert!(answers(&api, "checkout-old-1"));
    traffic.phase("during");
    for node in &nodes {
        api.cut(node);
    }
    set_checkout_new_ready(&api, true);
    std::thread::sleep(outage());
    assert!(
        answers(&api, "checkout-old-1"),
        "the agents cannot have seen the change"
    );
    traffic.phase("after");
    for node in &nodes {
        api.restore(node);
    }
    let back = std::time::Instant::now();
    for node in &nodes {
        api.wait_applied(node, APPLY_TIMEOUT);
        let status = api.status(node).unwrap();
        assert_eq!(
            status.last_sync_mode,
            Some(SyncMode::Partial),
            "{node}: {status:?}"
        );
    }
    let caught_up = back.elapsed();
    api.wait_for(
        "checkout to reach its ready pod",
        Duration::from_secs(10),
        |api| answers(api, "checkout-new-1"),
    );
    assert_eq!(
        full_syncs(&api),
        full_before,
        "a changed plan after an outage is a partial sync"
    );
    let report = traffic.stop();
    switchyard_test_support::announce::announce(&format!(
        "{} ; every status caught up {:.1} s after the API server was back (watch backoff)",
        report.line("api-outage-with-changed-plan"),
        caught_up.as_secs_f64()
    ));
    assert_eq!(report.total().failed, 0, "{:#?}", report.failures);
}

/// Fault 2: plan and slice watches and status writes answered with 500 and 429, then every such call
/// answered only after 10 s; meanwhile a Service changes. Forwarding is untouched, the failures show
/// in the agents' metrics, and everything converges once the server is well.
#[test]
fn api_server_errors_and_slow_answers_keep_forwarding() {
    let Some(api) = ApiLab::up("api_server_errors", Backend::Iptables, &[], &[]) else {
        return;
    };
    let nodes = api.nodes();
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(2));

    // Status writes refused: the agents still apply what they receive, and count the failures.
    traffic.phase("errors");
    api.server.fail(Method::PATCH, "/status", 429, usize::MAX);
    set_checkout_new_ready(&api, true);
    api.wait_for("checkout to reach its ready pod", APPLY_TIMEOUT, |api| {
        answers(api, "checkout-new-1")
    });
    // Plan and slice reads fail too, and the watches in flight end (as when an API server restarts):
    // the agents relist into errors, and cannot see the next change.
    api.server
        .fail(Method::GET, "/nodeforwardingplans", 500, usize::MAX);
    api.server.fail(Method::GET, "/forwardingslices", 500, usize::MAX);
    api.server.close_watches();
    set_checkout_new_ready(&api, false);
    std::thread::sleep(Duration::from_secs(20));
    for node in &nodes {
        assert!(api.agent(node).is_running(), "{node}:\n{}", api.agent_log(node));
    }

    traffic.phase("slow");
    api.server.clear_faults();
    api.server
        .slow(Method::GET, "/nodeforwardingplans", Duration::from_secs(10));
    api.server
        .slow(Method::GET, "/forwardingslices", Duration::from_secs(10));
    api.server.slow(Method::PATCH, "/status", Duration::from_secs(10));
    api.server.close_watches();
    std::thread::sleep(Duration::from_secs(30));

    traffic.phase("after");
    api.server.clear_faults();
    api.server.close_watches();
    // The controller's own watches of plans and slices failed too: it writes again once they are
    // back, and the agents follow.
    api.wait_for("checkout back on its terminating pod", APPLY_TIMEOUT, |api| {
        answers(api, "checkout-old-1")
    });
    for node in &nodes {
        api.wait_applied(node, APPLY_TIMEOUT);
        assert!(api.agent(node).is_running());
    }
    let failures: f64 = nodes
        .iter()
        .filter_map(|n| api.metric(n, STATUS_WRITE_FAILURES))
        .sum();
    let report = traffic.stop();
    switchyard_test_support::announce::announce(&format!(
        "{} ; status write failures counted: {failures}",
        report.line("api-errors-and-slow-answers")
    ));
    assert_eq!(report.total().failed, 0, "{:#?}", report.failures);
    assert!(
        failures > 0.0,
        "the refused status writes must show in the metrics"
    );
}
