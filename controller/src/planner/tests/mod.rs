//! Planner tests: kube-proxy's categorisation tables, golden plans, bad input, slices and overrides,
//! the per-node oracle, incremental re-planning, properties.

mod bad_input;
mod categorize;
mod golden;
mod incremental;
mod oracle;
mod problems;
mod properties;
mod semantics;
mod slicing;

use switchyard_api::{ForwardingSliceSpec, NodeForwardingPlanSpec, ServicePlan};

use super::{Planner, Snapshot};
use crate::config::Config;

/// A config with cluster CIDR 10.244.0.0/16.
pub fn config() -> Config {
    Config::parse("clusterCIDRs: [10.244.0.0/16]\n").unwrap()
}

/// Plans a snapshot with [`config`].
pub fn plan(snapshot: &Snapshot) -> Planner {
    Planner::build(snapshot, &config()).unwrap()
}

/// What a node forwards: its plan composed with its views' slices, checked against the per-node oracle
/// (so every semantics test also proves the composition exact).
pub fn spec_of(planner: &Planner, node: &str) -> NodeForwardingPlanSpec {
    let composed = planner.composed(node).unwrap().unwrap();
    assert!(composed.conflicts.is_empty(), "{:?}", composed.conflicts);
    assert_eq!(
        composed.spec.services,
        planner.oracle(node).unwrap(),
        "{node}: slices + overrides differ from the per-node oracle"
    );
    composed.spec
}

/// Every object the planner would write: slices by name, then plans by node.
pub fn all_objects(planner: &Planner) -> (Vec<(String, ForwardingSliceSpec)>, Vec<NodeForwardingPlanSpec>) {
    let plans = planner
        .node_names()
        .filter_map(|n| planner.node_plan(n))
        .collect();
    (planner.slices(None), plans)
}

/// Folds every Service slice back into its packed slice.
pub fn fold_all(planner: &mut Planner) -> super::Changes {
    let shadowed: Vec<String> = planner.shadowed().into_iter().map(|(name, _)| name).collect();
    planner.fold(&shadowed).unwrap()
}

/// Incremental = full rebuild, for a planner re-planned step by step to `snapshot`: every node
/// composes exactly its oracle; a rebuild that keeps the planner's layout (as the live controller's
/// rebuilds do) gives the same objects, Service slices and all; and folded back, it gives exactly what
/// a fresh build gives.
pub fn assert_same_as_rebuild(planner: &Planner, snapshot: &Snapshot, config: &Config) {
    for node in planner.node_names() {
        spec_of(planner, node);
    }
    let services: Vec<_> = snapshot.services.iter().collect();
    let slices: Vec<_> = snapshot.slices.iter().collect();
    let previous = planner.previous();
    let mut kept = Planner::build_after(
        &services,
        &slices,
        snapshot.nodes.iter(),
        config,
        Some(&previous),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        all_objects(&kept),
        all_objects(planner),
        "a rebuild keeps the layout"
    );
    fold_all(&mut kept);
    assert_eq!(kept.service_slice_count(), 0);
    let fresh = Planner::build(snapshot, config).unwrap();
    assert_eq!(
        all_objects(&kept),
        all_objects(&fresh),
        "folded back = a fresh build"
    );
}

/// One entry of a node's plan by name (first family/protocol match).
pub fn entry_of(planner: &Planner, node: &str, name: &str) -> ServicePlan {
    spec_of(planner, node)
        .services
        .into_iter()
        .find(|s| s.name == name)
        .map(|s| ServicePlan::clone(&s))
        .unwrap_or_else(|| panic!("{name} not planned on {node}"))
}

/// IPs of an entry's endpoints with the given flag.
pub fn ips(entry: &ServicePlan, pick: fn(&switchyard_api::PlanEndpoint) -> bool) -> Vec<String> {
    entry
        .endpoints
        .iter()
        .filter(|e| pick(e))
        .map(|e| e.ip.clone())
        .collect()
}
