//! One node's live plan object: header, views, `endpointsOnNode`, overrides, revision.
//!
//! ```text
//! node + config ─► header ─┬─ views [all, zone-<z>]            ┐
//! hosting ─────────────────┼─ endpointsOnNode (sorted)         │
//! overrides ───────────────┼─ localEndpoints (Local-only ones) ├─► bytes ≤ maxObjectBytes? ─► in the plan
//!                          └─ overrides (whole entries)        ┘                        no ─► every override moves
//!                                                                                            (whole) into the
//!                                                                                            node's own view
//! revision = hash(header, views, endpointsOnNode, localEndpoints, summary) + sum of override digests
//! ```
//!
//! The plan never lists what its views hold, so a change to a shared entry rewrites one slice and no
//! plan; a plan changes only when this node's own answer changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use switchyard_api::{
    ClusterSettings, LocalEndpoints, NodeForwardingPlanSpec, PlanSummary, View,
    revision::{EntrySum, revision_with},
};

use super::{EntryKey, NodeInfo, Override, nodes::local_traffic_cidrs, views::OBJECT_OVERHEAD_BYTES};
use crate::{Error, config::Config};

/// The computed shape of one node's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// Views, most general first.
    pub views: Vec<View>,
    /// The overrides live in the node's own view instead of the plan.
    pub overflow: bool,
    /// Counts of the overrides the plan object carries.
    pub summary: PlanSummary,
    /// The plan's revision.
    pub revision: String,
}

/// The header of a node's plan: everything but views, endpointsOnNode, entries, summary and revision.
pub fn header(node: &NodeInfo, config: &Config) -> NodeForwardingPlanSpec {
    NodeForwardingPlanSpec {
        node_name: node.name.clone(),
        zone: node.zone.clone(),
        node_ips: node.ips.iter().map(ToString::to_string).collect(),
        pod_cidrs: node.pod_cidrs.iter().map(ToString::to_string).collect(),
        backend: node.backend,
        cluster: ClusterSettings {
            detect_local: config.detect_local_mode,
            local_traffic_cidrs: local_traffic_cidrs(node, config)
                .iter()
                .map(ToString::to_string)
                .collect(),
            local_traffic_interface: config.detect_local_interface.clone(),
            service_cidrs: config.service_cidrs.iter().map(ToString::to_string).collect(),
            // Only the iptables backend has localhost NodePorts (kube-proxy's nftables mode never had
            // them; IPVS's glue does not either), so other nodes' plans do not change with it.
            localhost_node_ports: config.localhost_node_ports
                && node.backend == switchyard_api::Backend::Iptables,
            masquerade_all: config.masquerade_all,
            masquerade_bit: config.masquerade_bit,
            node_port_addresses: config.node_port_addresses_for(node.backend),
            ipvs_scheduler: (node.backend == switchyard_api::Backend::Ipvs)
                .then(|| config.ipvs_scheduler.clone()),
        },
        leaving: node.leaving.clone(),
        revision: String::new(),
        views: Vec::new(),
        endpoints_on_node: Vec::new(),
        local_endpoints: Vec::new(),
        summary: PlanSummary::default(),
        overrides: Vec::new(),
        services: Vec::new(),
    }
}

impl NodeLayout {
    /// Lays out one node's plan.
    pub fn compute<'a>(
        node: &NodeInfo,
        config: &Config,
        endpoints_on_node: impl Iterator<Item = &'a str>,
        overrides: &BTreeMap<EntryKey, Override>,
    ) -> Result<Self, Error> {
        let mut spec = header(node, config);
        let base_views = View::for_node(node.zone.as_deref());
        spec.views = base_views.iter().map(View::id).collect();
        spec.endpoints_on_node = endpoints_on_node.map(str::to_string).collect();
        spec.local_endpoints = local_endpoints(overrides);
        let mut sum = EntrySum::default();
        let mut bytes = 0;
        for o in overrides.values().filter(|o| o.local.is_none()) {
            sum.add(o.planned.fingerprint.digest);
            bytes += o.planned.fingerprint.bytes + 1;
        }
        let summary = PlanSummary::of(
            overrides
                .values()
                .filter(|o| o.local.is_none())
                .map(|o| &o.planned.entry),
        );
        spec.summary = summary;
        let header_bytes = serde_json::to_vec(&spec)
            .map_err(switchyard_api::Error::from)?
            .len();
        let overflow =
            !overrides.is_empty() && header_bytes + bytes + OBJECT_OVERHEAD_BYTES > config.max_object_bytes;
        let mut views: Vec<View> = base_views.into();
        if overflow {
            views.push(View::Node(node.name.clone()));
            spec.views = views.iter().map(View::id).collect();
            spec.local_endpoints = Vec::new();
            spec.summary = PlanSummary::default();
            sum = EntrySum::default();
        }
        let revision = revision_with(&spec, sum)?;
        Ok(Self {
            views,
            overflow,
            summary: spec.summary,
            revision,
        })
    }

    /// The plan object's spec.
    pub fn materialize<'a>(
        &self,
        node: &NodeInfo,
        config: &Config,
        endpoints_on_node: impl Iterator<Item = &'a str>,
        overrides: &BTreeMap<EntryKey, Override>,
    ) -> NodeForwardingPlanSpec {
        let mut spec = header(node, config);
        spec.views = self.views.iter().map(View::id).collect();
        spec.endpoints_on_node = endpoints_on_node.map(str::to_string).collect();
        spec.summary = self.summary;
        spec.revision = self.revision.clone();
        if !self.overflow {
            spec.local_endpoints = local_endpoints(overrides);
            spec.overrides = overrides
                .values()
                .filter(|o| o.local.is_none())
                .map(|o| Arc::clone(&o.planned.entry))
                .collect();
        }
        spec
    }
}

/// The Local-only overrides as the plan carries them, sorted by entry key.
fn local_endpoints(overrides: &BTreeMap<EntryKey, Override>) -> Vec<LocalEndpoints> {
    overrides
        .iter()
        .filter_map(|((name, protocol, family), o)| {
            Some(LocalEndpoints {
                name: name.clone(),
                protocol: *protocol,
                family: *family,
                endpoints: o.local.clone()?,
            })
        })
        .collect()
}
