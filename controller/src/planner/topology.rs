//! kube-proxy's endpoint selection (`CategorizeEndpoints`, `topologyModeFromHints`,
//! `availableForTopology` in `pkg/proxy/topology.go`), ported for one node.
//!
//! ```text
//! endpoints of one ServicePort/family + policies + (node, zone) ─► cluster set, local set, hasAnyEndpoints
//! ```
//!
//! Cluster policy: ready endpoints the topology mode allows; none → serving-and-terminating ones anywhere
//! (topology ignored). Local policy: local ready ones; none → local serving-and-terminating ones. Topology
//! applies to the Cluster set only.

use super::slices::EndpointInfo;

/// The policies that decide which sets a ServicePort uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policies {
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` (only when the Service is externally accessible).
    pub external_local: bool,
    /// NodePort, externalIP or LoadBalancer IP present for this port and family.
    pub externally_accessible: bool,
}

impl Policies {
    /// kube-proxy `UsesClusterEndpoints`: needed for Cluster internal traffic and, whenever external
    /// traffic is accepted, for the eTP=Local short-circuits of pod and host traffic.
    pub fn uses_cluster(&self) -> bool {
        !self.internal_local || self.externally_accessible
    }

    /// kube-proxy `UsesLocalEndpoints`.
    pub fn uses_local(&self) -> bool {
        self.internal_local || (self.external_local && self.externally_accessible)
    }
}

/// Which topology filter applies to the Cluster set on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyMode {
    /// No filtering.
    None,
    /// Only endpoints hinted for this node.
    PreferSameNode,
    /// Only endpoints hinted for this node's zone.
    PreferSameZone,
}

/// The outcome for one node, as membership flags parallel to the endpoint list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Categorized {
    /// Member of the Cluster set.
    pub cluster: Vec<bool>,
    /// Member of the Local set.
    pub local: Vec<bool>,
    /// Some usable endpoint exists anywhere.
    pub has_any: bool,
}

/// `node` is `None` for a node that hosts none of these endpoints and is named in no hint: every such
/// node of a zone gets the same answer, which the planner computes once per zone.
pub fn topology_mode(endpoints: &[EndpointInfo], node: Option<&str>, zone: Option<&str>) -> TopologyMode {
    let mut has_for_node = false;
    let mut all_have_node_hints = true;
    let mut has_for_zone = false;
    let mut all_have_zone_hints = true;
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        if ep.zone_hints.is_empty() {
            all_have_zone_hints = false;
        } else if zone.is_some_and(|z| ep.zone_hints.iter().any(|h| h == z)) {
            has_for_zone = true;
        }
        if ep.node_hints.is_empty() {
            all_have_node_hints = false;
        } else if node.is_some_and(|n| ep.node_hints.iter().any(|h| h == n)) {
            has_for_node = true;
        }
    }
    if all_have_node_hints && has_for_node {
        TopologyMode::PreferSameNode
    } else if all_have_zone_hints && has_for_zone {
        TopologyMode::PreferSameZone
    } else {
        TopologyMode::None
    }
}

fn available_for_topology(
    ep: &EndpointInfo,
    mode: TopologyMode,
    node: Option<&str>,
    zone: Option<&str>,
) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => node.is_some_and(|n| ep.node_hints.iter().any(|h| h == n)),
        TopologyMode::PreferSameZone => zone.is_some_and(|z| ep.zone_hints.iter().any(|h| h == z)),
    }
}

/// Categorises `endpoints` for one node.
pub fn categorize(
    endpoints: &[EndpointInfo],
    policies: Policies,
    node: Option<&str>,
    zone: Option<&str>,
) -> Categorized {
    let n = endpoints.len();
    let mut out = Categorized {
        cluster: vec![false; n],
        local: vec![false; n],
        has_any: false,
    };
    let is_local = |ep: &EndpointInfo| node.is_some() && ep.node.as_deref() == node;

    if policies.uses_cluster() {
        let mode = topology_mode(endpoints, node, zone);
        let mut any = false;
        for (i, ep) in endpoints.iter().enumerate() {
            if ep.ready && available_for_topology(ep, mode, node, zone) {
                out.cluster[i] = true;
                any = true;
            }
        }
        if !any {
            for (i, ep) in endpoints.iter().enumerate() {
                if ep.serving && ep.terminating {
                    out.cluster[i] = true;
                    any = true;
                }
            }
        }
        out.has_any = any;
    }

    if !policies.uses_local() {
        return out;
    }
    let mut has_local_ready = false;
    let mut has_local_serving_terminating = false;
    for ep in endpoints {
        if ep.ready {
            out.has_any = true;
            has_local_ready |= is_local(ep);
        } else if ep.serving && ep.terminating {
            out.has_any = true;
            has_local_serving_terminating |= is_local(ep);
        }
    }
    for (i, ep) in endpoints.iter().enumerate() {
        out.local[i] = is_local(ep)
            && if has_local_ready {
                ep.ready
            } else {
                has_local_serving_terminating && ep.serving && ep.terminating
            };
    }
    out
}
