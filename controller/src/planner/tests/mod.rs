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
