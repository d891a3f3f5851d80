//! Planner tests: kube-proxy's categorisation tables, golden plans, bad input, sharding, properties.

mod bad_input;
mod categorize;
mod golden;
mod incremental;
mod properties;
mod semantics;
mod sharding;

use switchyard_api::{NodeForwardingPlanSpec, ServicePlan};

use super::{NodePlan, Planner, Snapshot};
use crate::config::Config;

/// A config with cluster CIDR 10.244.0.0/16.
pub fn config() -> Config {
    Config::parse("clusterCIDRs: [10.244.0.0/16]\n").unwrap()
}

/// Plans a snapshot with [`config`].
pub fn plan(snapshot: &Snapshot) -> Planner {
    Planner::build(snapshot, &config()).unwrap()
}

/// The single (unsharded) spec of a node.
pub fn spec_of(planner: &Planner, node: &str) -> NodeForwardingPlanSpec {
    let NodePlan { mut objects, .. } = planner.node_plan(node).unwrap();
    assert_eq!(objects.len(), 1, "expected an unsharded plan");
    objects.remove(0)
}

/// One entry of a node's plan by name (first family/protocol match).
pub fn entry_of(planner: &Planner, node: &str, name: &str) -> ServicePlan {
    spec_of(planner, node)
        .services
        .into_iter()
        .find(|s| s.name == name)
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
