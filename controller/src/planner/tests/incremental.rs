//! Re-planning one Service gives exactly what a full rebuild gives, and reports the slices and plans
//! that changed: a plain Service's endpoint change rewrites one slice and only the plans of nodes whose
//! own endpoint list changed.

use super::{assert_same_as_rebuild, config, plan, spec_of};
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
    let changes = planner
        .replan_service("ns1/web", Some(&web_after), &[&web_slice_after])
        .unwrap();
    assert!(changes.diagnostics.warnings.is_empty());
    assert_same_as_rebuild(
        &planner,
        &snapshot(
            vec![web_after, other_svc.clone()],
            vec![web_slice_after, other_slice.clone()],
        ),
        &config(),
    );
    // iTP=Local: node-c's endpoint started terminating, so node-c's Local endpoints changed; node-a
    // carries only its own Local endpoints (unchanged), not the whole entry, so its plan stays.
    assert_eq!(changes.plans, vec!["node-c"]);
    assert_eq!(changes.slices.len(), 1);
    assert!(changes.retired.is_empty());

    // Re-planning with the same input changes nothing.
    let (web_same, web_slice_same) = web(false);
    let changes = planner
        .replan_service("ns1/web", Some(&web_same), &[&web_slice_same])
        .unwrap();
    assert!(
        changes.plans.is_empty() && changes.slices.is_empty(),
        "{changes:?}"
    );

    // Deleting a Service removes its entries everywhere.
    let changes = planner.replan_service("ns1/web", None, &[]).unwrap();
    assert_eq!(changes.slices.len(), 1);
    // node-c's endpoint no longer serves, so it is in no entry: only node-a loses endpoints.
    assert_eq!(changes.plans, vec!["node-a"], "its endpoint and override went");
    assert_same_as_rebuild(&planner, &snapshot(vec![other_svc], vec![other_slice]), &config());
}

#[test]
fn an_endpoint_change_of_a_plain_service_rewrites_one_slice_and_no_plan() {
    let (other_svc, other_slice) = other();
    let mut planner = plan(&snapshot(vec![other_svc.clone()], vec![other_slice]));
    // The endpoint stays on node-b; only its port changes.
    let moved = slice(
        "ns1",
        "other",
        &[("", 8080, "TCP"), ("np", 81, "TCP")],
        vec![endpoint("10.244.2.5", "node-b")],
    );
    let changes = planner
        .replan_service("ns1/other", Some(&other_svc), &[&moved])
        .unwrap();
    assert_eq!(changes.slices.len(), 1, "{changes:?}");
    assert!(changes.plans.is_empty(), "{changes:?}");
    // A new endpoint on node-c changes node-c's endpoint list: one slice and one plan.
    let grown = slice(
        "ns1",
        "other",
        &[("", 8080, "TCP"), ("np", 81, "TCP")],
        vec![endpoint("10.244.2.5", "node-b"), endpoint("10.244.3.9", "node-c")],
    );
    let changes = planner
        .replan_service("ns1/other", Some(&other_svc), &[&grown])
        .unwrap();
    assert_eq!(
        (changes.slices.len(), changes.plans.clone()),
        (1, vec!["node-c".to_string()])
    );
    let on_c = spec_of(&planner, "node-c");
    assert!(
        on_c.services[0]
            .endpoints
            .iter()
            .any(|e| e.on_node && e.ip == "10.244.3.9")
    );
}

#[test]
fn adding_a_service_inserts_it_in_order() {
    let (other_svc, other_slice) = other();
    let mut planner = plan(&snapshot(vec![other_svc.clone()], vec![other_slice.clone()]));
    let (web_svc, web_slice) = web(true);
    planner
        .replan_service("ns1/web", Some(&web_svc), &[&web_slice])
        .unwrap();
    assert_same_as_rebuild(
        &planner,
        &snapshot(vec![web_svc, other_svc], vec![web_slice, other_slice]),
        &config(),
    );
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
    let overrides = |node: &str| planner.node_plan(node).unwrap().overrides.len();
    assert_eq!(
        (overrides("node-a"), overrides("node-b"), overrides("node-c")),
        (1, 1, 0)
    );
}

/// `service.kubernetes.io/headless` (any value) takes a Service out of every plan like a headless
/// one, and a slice carrying it adds no endpoints (kube-proxy's informers select
/// `!service.kubernetes.io/headless`); adding and removing the label live is a one-Service change.
#[test]
fn the_headless_label_on_a_service_or_its_slice_is_skipped_and_toggles_live() {
    use crate::planner::SkipReason;
    let labelled = |value: &str| {
        let (mut svc, _) = other();
        svc.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("service.kubernetes.io/headless".into(), value.into());
        svc
    };
    let (other_svc, other_slice) = other();
    let mut labelled_slice = other_slice.clone();
    labelled_slice
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("service.kubernetes.io/headless".into(), String::new());
    let names = |planner: &Planner| -> Vec<String> {
        let mut names: Vec<String> = spec_of(planner, "node-a")
            .services
            .iter()
            .map(|s| s.name.split(':').next().unwrap_or_default().to_owned())
            .collect();
        names.dedup();
        names
    };
    let endpoints = |planner: &Planner| -> usize {
        spec_of(planner, "node-a")
            .services
            .iter()
            .map(|s| s.endpoints.len())
            .sum()
    };

    // (case, service, slice, forwarded?, endpoints on node-a, skipped)
    let cases = [
        (
            "no label",
            other_svc.clone(),
            other_slice.clone(),
            true,
            2,
            vec![],
        ),
        (
            "label on the Service, empty value",
            labelled(""),
            other_slice.clone(),
            false,
            0,
            vec![("ns1/other".to_owned(), SkipReason::HeadlessLabel)],
        ),
        (
            "label on the Service, any value",
            labelled("true"),
            other_slice.clone(),
            false,
            0,
            vec![("ns1/other".to_owned(), SkipReason::HeadlessLabel)],
        ),
        (
            "label on its slice only: forwarded without endpoints",
            other_svc.clone(),
            labelled_slice.clone(),
            true,
            0,
            vec![("ns1/other-abc".to_owned(), SkipReason::SliceHeadlessLabel)],
        ),
    ];
    for (case, svc, eps, forwarded, want_endpoints, skipped) in cases {
        let planner = plan(&snapshot(vec![svc], vec![eps]));
        assert_eq!(
            names(&planner) == vec!["ns1/other".to_owned()],
            forwarded,
            "{case}: {:?}",
            names(&planner)
        );
        assert_eq!(endpoints(&planner), want_endpoints, "{case}");
        assert!(planner.diagnostics().warnings.is_empty(), "{case}");
        assert_eq!(planner.diagnostics().skipped, skipped, "{case}");
    }

    // Live: label added, then removed, each one re-planned Service, equal to a full rebuild.
    let mut planner = plan(&snapshot(vec![other_svc.clone()], vec![other_slice.clone()]));
    let down = labelled("");
    let changes = planner
        .replan_service("ns1/other", Some(&down), &[&other_slice])
        .unwrap();
    assert_eq!(changes.slices.len(), 1, "{changes:?}");
    assert!(names(&planner).is_empty());
    assert_same_as_rebuild(
        &planner,
        &snapshot(vec![down], vec![other_slice.clone()]),
        &config(),
    );
    let changes = planner
        .replan_service("ns1/other", Some(&other_svc), &[&other_slice])
        .unwrap();
    assert_eq!(changes.slices.len(), 1, "{changes:?}");
    assert_eq!(names(&planner), vec!["ns1/other".to_owned()]);
    assert_same_as_rebuild(&planner, &snapshot(vec![other_svc], vec![other_slice]), &config());
}
