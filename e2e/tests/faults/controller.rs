//! Fault 4 on real packets: the controller stopped and crashed in the middle of a rolling update while
//! traffic flows to the rolled Service and to the others. (`controller/tests/faults.rs` checks the same
//! at the API level in more detail, and leader failover between two replicas.)

use std::time::Duration;

use http::Method;
use serde_json::json;
use switchyard_api::Backend;
use switchyard_e2e::Place;
use switchyard_e2e::traffic::{Flow, Traffic};
use switchyard_test_support::fake_apiserver::Kind;

use crate::harness::{APPLY_TIMEOUT, ApiLab, stored_object};
use crate::stable_flows;

const CHECKOUT_SLICE: &str = "default/checkout-r1s2t";
const PODS: [&str; 3] = ["checkout-old-1", "checkout-old-2", "checkout-new-1"];

/// Conditions of one endpoint: ready, serving, terminating.
type State = (bool, bool, bool);
const READY: State = (true, true, false);
const DRAINING: State = (false, true, true);
const GONE: State = (false, false, true);
const STARTING: State = (false, false, false);

/// A rollout that moves the Service from the two old pods to the new one and back, one pod at a time,
/// always with a pod that can answer (ready, or serving while terminating).
const STEPS: [[State; 3]; 12] = [
    [READY, READY, STARTING],
    [READY, READY, READY],
    [DRAINING, READY, READY],
    [GONE, READY, READY],
    [GONE, DRAINING, READY],
    [GONE, GONE, READY],
    [STARTING, GONE, READY],
    [READY, STARTING, READY],
    [READY, READY, READY],
    [READY, READY, DRAINING],
    [READY, READY, GONE],
    [READY, READY, STARTING],
];

fn set_checkout(api: &ApiLab, states: &[State; 3]) {
    let mut slice = stored_object(&api.server, Kind::EndpointSlice, CHECKOUT_SLICE);
    for endpoint in slice["endpoints"].as_array_mut().unwrap() {
        let name = endpoint["targetRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(index) = PODS.iter().position(|p| *p == name) {
            let (ready, serving, terminating) = states[index];
            endpoint["conditions"] = json!({"ready": ready, "serving": serving, "terminating": terminating});
        }
    }
    api.put(Kind::EndpointSlice, slice);
}

#[test]
fn controller_restarts_during_a_rollout_lose_no_plan_and_no_connection() {
    let Some(mut api) = ApiLab::up("controller_restarts", Backend::Nftables, &[], &[]) else {
        return;
    };
    let mut flows = stable_flows();
    flows.push(Flow::tcp(Place::pod("nginx-pod-3"), "10.96.0.70:80", &["checkout"]).unwrap());
    api.server.clear_requests();
    let traffic = Traffic::start(&api.lab, &flows).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    traffic.phase("rollout");
    let mut restarts = Vec::new();
    for (step, states) in STEPS.iter().enumerate() {
        set_checkout(&api, states);
        match step {
            3 => {
                api.stop_controller();
                restarts.push("graceful");
            }
            7 => {
                api.crash_controller();
                restarts.push("crash");
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(1500));
        if matches!(step, 4 | 8) {
            api.start_controller();
        }
    }
    traffic.phase("after");
    for node in api.nodes() {
        api.wait_applied(&node, APPLY_TIMEOUT);
    }
    std::thread::sleep(Duration::from_secs(1));
    let report = traffic.stop();
    let (service_slices, deletes): (Vec<String>, Vec<String>) = api
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::DELETE)
        .filter(|r| r.path.contains("nodeforwardingplans") || r.path.contains("forwardingslices"))
        .map(|r| r.path)
        // A restarted controller packs every Service again and then deletes the Service slices the
        // old one wrote (their entries are in the packed slices by then): those deletes are expected.
        .partition(|path| {
            path.contains("forwardingslices/") && path.rsplit('/').next().is_some_and(|n| n.contains('.'))
        });
    switchyard_test_support::announce::announce(&format!(
        "{} ; {} rollout steps, controller {} meanwhile, {} plans or packed slices deleted, {} Service slices folded away",
        report.line("controller-restart-during-rollout"),
        STEPS.len(),
        restarts.join(" + "),
        deletes.len(),
        service_slices.len()
    ));
    assert!(deletes.is_empty(), "{deletes:?}");
    assert_eq!(report.total().failed, 0, "{:#?}", report.failures);
}
