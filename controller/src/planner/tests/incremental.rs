//! Re-planning one Service gives exactly what a full rebuild gives, and reports the nodes that changed.

use super::{config, plan};
use crate::planner::{
    Planner,
    fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, snapshot},
};

fn web(
    ready_c: bool,
) -> (
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::discovery::v1::EndpointSlice,
) {
    let svc = service("ns1", "web", "10.96.0.10", |s| {
        s.port("http", 80, "TCP").spec_mut().internal_traffic_policy = Some("Local".into());
    });
    let eps = slice(
        "ns1",
        "web",
        &[("http", 8080, "TCP")],
        vec![
            endpoint("10.244.1.5", "node-a"),
            endpoint("10.244.3.5", "node-c").conditions(ready_c, ready_c, !ready_c),
        ],
    );
    (svc, eps)
}

fn other() -> (
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::api::discovery::v1::EndpointSlice,
) {
    let svc = service("ns1", "other", "10.96.0.11", |s| {
        s.port("", 80, "TCP").node_port("np", 81, 30081);
    });
    let eps = slice(
        "ns1",
        "other",
        &[("", 80, "TCP"), ("np", 81, "TCP")],
        vec![endpoint("10.244.2.5", "node-b")],
    );
    (svc, eps)
}

#[test]
fn replanning_one_service_matches_a_full_rebuild() {
    let (web_before, web_slice_before) = web(true);
    let (other_svc, other_slice) = other();
    let mut planner = plan(&snapshot(
        vec![web_before, other_svc.clone()],
        vec![web_slice_before, other_slice.clone()],
    ));

    let (web_after, web_slice_after) = web(false);
    let (changed, diag) = planner
        .replan_service("ns1/web", Some(&web_after), &[&web_slice_after])
        .unwrap();
    assert!(diag.warnings.is_empty());
    let fresh = plan(&snapshot(
        vec![web_after, other_svc.clone()],
        vec![web_slice_after, other_slice.clone()],
    ));
    assert_eq!(planner.all_plans(), fresh.all_plans());
    // The endpoint list is in every node's plan, so every node changed.
    assert_eq!(changed, vec!["node-a", "node-b", "node-c"]);

    // Re-planning with the same input changes nothing.
    let (web_same, web_slice_same) = web(false);
    let (changed, _) = planner
        .replan_service("ns1/web", Some(&web_same), &[&web_slice_same])
        .unwrap();
    assert!(changed.is_empty());

    // Deleting a Service removes its entries everywhere.
    let (changed, _) = planner.replan_service("ns1/web", None, &[]).unwrap();
    assert_eq!(changed.len(), 3);
    let fresh = Planner::build(&snapshot(vec![other_svc], vec![other_slice]), &config()).unwrap();
    assert_eq!(planner.all_plans(), fresh.all_plans());
}

#[test]
fn adding_a_service_inserts_it_in_order() {
    let (other_svc, other_slice) = other();
    let mut planner = plan(&snapshot(vec![other_svc.clone()], vec![other_slice.clone()]));
    let (web_svc, web_slice) = web(true);
    planner
        .replan_service("ns1/web", Some(&web_svc), &[&web_slice])
        .unwrap();
    let fresh = plan(&snapshot(vec![web_svc, other_svc], vec![web_slice, other_slice]));
    assert_eq!(planner.all_plans(), fresh.all_plans());
    assert_eq!(planner.entry_count(), 3);
}

#[test]
fn node_hints_only_change_the_named_node() {
    let svc = service("ns1", "near", "10.96.0.12", |s| {
        s.port("", 80, "TCP");
    });
    let eps = slice(
        "ns1",
        "near",
        &[("", 80, "TCP")],
        vec![
            endpoint("10.244.1.5", "node-a").node_hints(&["node-a"]),
            endpoint("10.244.2.5", "node-b").node_hints(&["node-b"]),
        ],
    );
    let planner = plan(&snapshot(vec![svc], vec![eps]));
    let cluster_on = |node: &str| -> Vec<String> {
        super::ips(&super::entry_of(&planner, node, "ns1/near"), |e| e.cluster)
    };
    assert_eq!(cluster_on("node-a"), vec!["10.244.1.5"]);
    assert_eq!(cluster_on("node-b"), vec!["10.244.2.5"]);
    assert_eq!(
        cluster_on("node-c"),
        vec!["10.244.1.5", "10.244.2.5"],
        "no hint for node-c: no filtering"
    );
}
