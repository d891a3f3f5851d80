//! The planner: Services + EndpointSlices + Nodes + config → one `NodeForwardingPlanSpec` per node (or
//! several shards of one). Pure: no client, no async, no clock.
//!
//! ```text
//! Services ──► services::templates ─┐
//!                                   ├─► slots (one per ServicePort × family, sorted)
//! EndpointSlices ─► slices::collect ┘        │
//!                                            ├─► per zone:   topology::categorize(node = none, zone)  ─► base entry
//! Nodes ─► nodes::node_info ─────────────────┴─► per special node (hosts an endpoint / named in a hint)
//!                                                               topology::categorize(node, zone)       ─► override
//! node plan = zone's base entries with that node's overrides, split into shards, revisions from digests
//! ```
//!
//! Why slots and overrides: most entries come out identical on every node of a zone; only nodes hosting
//! one of the entry's endpoints (on-node flag, Local policies) or named in a node hint differ. Computing
//! the common answer once per zone and the exceptions per node keeps 1,000 nodes × 10,000 services to a
//! few hundred thousand categorisations, and revisions come from per-entry digests summed
//! ([`switchyard_api::revision`]), so no node's plan is ever serialised just to hash it.

mod diagnostics;
#[cfg(test)]
pub(crate) mod fixtures;
mod layout;
mod nodes;
mod services;
mod slices;
pub mod topology;

#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

pub use diagnostics::{Diagnostics, SkipReason, Warning};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
pub use layout::NodePlan;
pub use nodes::NodeInfo;
pub(crate) use nodes::node_info;
pub use slices::EndpointInfo;
use switchyard_api::{
    PlanEndpoint, ServicePlan,
    revision::{EntryFingerprint, fingerprint},
};

use self::{
    layout::{Layout, ZoneCache},
    services::PortTemplate,
    topology::categorize,
};
use crate::{Error, config::Config};

/// The cluster objects the planner reads.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `v1` Services.
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// `v1` Nodes.
    pub nodes: Vec<Node>,
}

/// One planned entry with its digest and size, shared by every node that gets the same answer.
#[derive(Debug, PartialEq, Eq)]
pub struct PlannedEntry {
    /// The entry.
    pub entry: ServicePlan,
    /// Its digest and serialised size.
    pub fingerprint: EntryFingerprint,
}

type Zone = Option<String>;

/// One ServicePort × family: the answers per zone and per special node.
#[derive(Debug)]
struct Slot {
    /// The Service it belongs to (`namespace/name`).
    service_key: String,
    /// Stable shard assignment: hash of the Service key, so all ports of a Service share a shard.
    shard_hash: u64,
    by_zone: HashMap<Zone, Arc<PlannedEntry>>,
    overrides: HashMap<String, Arc<PlannedEntry>>,
}

impl Slot {
    /// The entry's sort key (the same in every answer).
    fn key(&self) -> Option<(&str, switchyard_api::Protocol, switchyard_api::IpFamily)> {
        self.by_zone
            .values()
            .next()
            .or_else(|| self.overrides.values().next())
            .map(|p| p.entry.key())
    }
}

/// Everything planned for a snapshot; nodes' plans are materialised on demand.
#[derive(Debug)]
pub struct Planner {
    config: Config,
    /// Sorted by entry key.
    slots: Vec<Slot>,
    nodes: BTreeMap<String, NodeInfo>,
    layouts: BTreeMap<String, Layout>,
    diagnostics: Diagnostics,
}

impl Planner {
    /// Plans every node of the snapshot.
    pub fn build(snapshot: &Snapshot, config: &Config) -> Result<Self, Error> {
        let mut diag = Diagnostics::default();
        let mut nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
        for node in &snapshot.nodes {
            if let Some(info) = nodes::node_info(node, config, &mut diag) {
                if nodes.contains_key(&info.name) {
                    diag.warn(
                        "Node",
                        &info.name,
                        "appears twice in the input; second copy ignored",
                    );
                } else {
                    nodes.insert(info.name.clone(), info);
                }
            }
        }
        let services: Vec<&Service> = snapshot.services.iter().collect();
        let slices: Vec<&EndpointSlice> = snapshot.slices.iter().collect();
        let slots = plan_slots(&services, &slices, config, &nodes, &mut diag)?;
        let mut planner = Self {
            config: config.clone(),
            slots,
            nodes,
            layouts: BTreeMap::new(),
            diagnostics: Diagnostics::default(),
        };
        planner.relayout()?;
        diag.sort();
        planner.diagnostics = diag;
        Ok(planner)
    }

    /// Re-plans one Service (`namespace/name`) after it or its slices changed (`service` is `None` when it
    /// was deleted). Returns the nodes whose plan changed, and what was wrong with the new input.
    pub fn replan_service(
        &mut self,
        service_key: &str,
        service: Option<&Service>,
        slices: &[&EndpointSlice],
    ) -> Result<(Vec<String>, Diagnostics), Error> {
        let mut diag = Diagnostics::default();
        let services: Vec<&Service> = service.into_iter().collect();
        let mut fresh = plan_slots(&services, slices, &self.config, &self.nodes, &mut diag)?;
        fresh.retain(|slot| slot.service_key == service_key);
        let (old, kept): (Vec<Slot>, Vec<Slot>) = std::mem::take(&mut self.slots)
            .into_iter()
            .partition(|slot| slot.service_key == service_key);
        self.slots = kept;
        let mut changed = Vec::new();
        let mut stale = Vec::new();
        for (name, info) in &self.nodes {
            let pick = |slots: &[Slot]| -> Vec<(u64, Arc<PlannedEntry>)> {
                slots
                    .iter()
                    .filter_map(|s| s.for_node(info).map(|p| (s.shard_hash, Arc::clone(p))))
                    .collect()
            };
            let (removed, added) = (pick(&old), pick(&fresh));
            let same = removed.len() == added.len()
                && removed
                    .iter()
                    .zip(&added)
                    .all(|((_, a), (_, b))| a.fingerprint == b.fingerprint);
            if same {
                continue;
            }
            changed.push(name.clone());
            let Some(layout) = self.layouts.get_mut(name) else {
                continue;
            };
            let removed_refs: Vec<(u64, &PlannedEntry)> =
                removed.iter().map(|(h, p)| (*h, p.as_ref())).collect();
            let added_refs: Vec<(u64, &PlannedEntry)> = added.iter().map(|(h, p)| (*h, p.as_ref())).collect();
            if !layout.apply_delta(info, &self.config, &removed_refs, &added_refs)? {
                stale.push(name.clone());
            }
        }
        for slot in fresh {
            let at = self.slots.partition_point(|s| s.key() < slot.key());
            self.slots.insert(at, slot);
        }
        if !stale.is_empty() {
            // A shard outgrew the budget: lay those nodes out anew (the shard count may double).
            self.relayout_nodes(&stale)?;
        }
        diag.sort();
        Ok((changed, diag))
    }

    /// Recomputes every node's layout and revisions from the slots' digests (no entry is re-planned).
    fn relayout(&mut self) -> Result<(), Error> {
        let all: Vec<String> = self.nodes.keys().cloned().collect();
        self.relayout_nodes(&all)
    }

    fn relayout_nodes(&mut self, names: &[String]) -> Result<(), Error> {
        let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let mut overrides: HashMap<&str, Vec<usize>> = HashMap::new();
        for (index, slot) in self.slots.iter().enumerate() {
            for node in slot.overrides.keys().filter(|n| wanted.contains(n.as_str())) {
                overrides.entry(node.as_str()).or_default().push(index);
            }
        }
        let mut cache = ZoneCache::default();
        for name in names {
            let Some(info) = self.nodes.get(name) else {
                continue;
            };
            let own = overrides.get(name.as_str()).map_or(&[][..], Vec::as_slice);
            let layout = Layout::compute(info, &self.config, &self.slots, own, &mut cache)?;
            self.layouts.insert(name.clone(), layout);
        }
        Ok(())
    }

    /// Names of the planned nodes, sorted.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The node's revision (the primary shard's), when the node is known.
    pub fn revision(&self, node: &str) -> Option<&str> {
        self.layouts.get(node).map(Layout::primary_revision)
    }

    /// How many objects the node's plan is split into.
    pub fn shard_count(&self, node: &str) -> Option<u32> {
        self.layouts.get(node).map(Layout::count)
    }

    /// Revisions of the node's plan objects, primary first.
    pub fn shard_revisions(&self, node: &str) -> Option<&[String]> {
        self.layouts.get(node).map(Layout::revisions)
    }

    /// Only the given shards of one node's plan, as (index, spec).
    pub fn node_shards(
        &self,
        node: &str,
        wanted: &BTreeSet<u32>,
    ) -> Option<Vec<(u32, switchyard_api::NodeForwardingPlanSpec)>> {
        let info = self.nodes.get(node)?;
        let layout = self.layouts.get(node)?;
        Some(layout.materialize_shards(info, &self.config, &self.slots, wanted))
    }

    /// The planner's view of a node (name, zone, IPs, pod CIDRs, backend, UID).
    pub fn node_info(&self, node: &str) -> Option<&NodeInfo> {
        self.nodes.get(node)
    }

    /// The plan objects of one node (one, or several shards), fully materialised.
    pub fn node_plan(&self, node: &str) -> Option<NodePlan> {
        let info = self.nodes.get(node)?;
        let layout = self.layouts.get(node)?;
        Some(layout.materialize(info, &self.config, &self.slots))
    }

    /// Every node's plan, sorted by node name.
    pub fn all_plans(&self) -> Vec<NodePlan> {
        self.nodes.keys().filter_map(|n| self.node_plan(n)).collect()
    }

    /// Warnings and skipped Services of the last full build.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Number of entries (ServicePort × family) planned.
    pub fn entry_count(&self) -> usize {
        self.slots.len()
    }
}

/// Services and their slices → slots sorted by entry key.
fn plan_slots(
    services: &[&Service],
    slices: &[&EndpointSlice],
    config: &Config,
    nodes: &BTreeMap<String, NodeInfo>,
    diag: &mut Diagnostics,
) -> Result<Vec<Slot>, Error> {
    let mut templates: Vec<PortTemplate> = services
        .iter()
        .flat_map(|s| services::templates(s, config, diag))
        .collect();
    templates.sort_by(|a, b| a.entry.key().cmp(&b.entry.key()));
    templates.dedup_by(|b, a| {
        let duplicate = a.entry.key() == b.entry.key();
        if duplicate {
            diag.warn(
                "Service",
                &b.service_key,
                "appears twice in the input; second copy ignored",
            );
        }
        duplicate
    });
    let mut endpoints = slices::collect(slices, diag);
    // Slices of Services that exist but are not proxied (headless, another proxy's, invalid) are
    // expected and already explained by the Service's own warning, if any.
    let present: BTreeSet<String> = services.iter().filter_map(|s| services::key(s)).collect();
    let orphaned: BTreeSet<&str> = endpoints
        .keys()
        .map(|(service, ..)| service.as_str())
        .filter(|s| !present.contains(*s))
        .collect();
    for service in orphaned {
        // Transient in a live cluster (slice seen before its Service); worth a line offline.
        diag.warn(
            "EndpointSlice",
            service,
            "slices for a Service that is not in the input; ignored",
        );
    }
    let zones: BTreeSet<Zone> = nodes.values().map(|n| n.zone.clone()).collect();
    let mut slots = Vec::with_capacity(templates.len());
    for template in templates {
        let key = (
            template.service_key.clone(),
            template.port_name.clone(),
            template.entry.protocol,
            template.entry.family,
        );
        let eps = endpoints.remove(&key).unwrap_or_default();
        slots.push(plan_slot(template, eps, &zones, nodes)?);
    }
    Ok(slots)
}

/// Plans one slot: one answer per zone, plus one per node that hosts an endpoint or is named in a hint.
fn plan_slot(
    template: PortTemplate,
    endpoints: Vec<EndpointInfo>,
    zones: &BTreeSet<Zone>,
    nodes: &BTreeMap<String, NodeInfo>,
) -> Result<Slot, Error> {
    let mut by_zone = HashMap::with_capacity(zones.len());
    for zone in zones {
        let planned = planned_entry(&template, &endpoints, None, zone.as_deref())?;
        by_zone.insert(zone.clone(), Arc::new(planned));
    }
    let special: BTreeSet<&str> = endpoints
        .iter()
        .flat_map(|ep| ep.node.iter().chain(ep.node_hints.iter()))
        .map(String::as_str)
        .filter(|n| nodes.contains_key(*n))
        .collect();
    let mut overrides = HashMap::with_capacity(special.len());
    for node in special {
        let zone = nodes.get(node).and_then(|n| n.zone.as_deref());
        let planned = planned_entry(&template, &endpoints, Some(node), zone)?;
        overrides.insert(node.to_string(), Arc::new(planned));
    }
    let shard_hash = layout::shard_hash(&template.service_key);
    Ok(Slot {
        service_key: template.service_key,
        shard_hash,
        by_zone,
        overrides,
    })
}

fn planned_entry(
    template: &PortTemplate,
    endpoints: &[EndpointInfo],
    node: Option<&str>,
    zone: Option<&str>,
) -> Result<PlannedEntry, Error> {
    let categorized = categorize(endpoints, template.policies, node, zone);
    let mut entry = template.entry.clone();
    entry.has_endpoints = categorized.has_any;
    entry.endpoints = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| PlanEndpoint {
            ip: ep.ip.to_string(),
            port: ep.port,
            cluster: categorized.cluster[i],
            local: categorized.local[i],
            on_node: node.is_some() && ep.node.as_deref() == node,
            terminating: ep.terminating,
            weight: template
                .weights
                .as_ref()
                .zip(ep.node.as_ref())
                .and_then(|(weights, node)| weights.get(node).copied())
                .filter(|&w| w != 1),
        })
        .collect();
    let fingerprint = fingerprint(&entry)?;
    Ok(PlannedEntry { entry, fingerprint })
}

impl Slot {
    /// The entry a node gets.
    fn for_node(&self, node: &NodeInfo) -> Option<&Arc<PlannedEntry>> {
        self.overrides
            .get(&node.name)
            .or_else(|| self.by_zone.get(&node.zone))
    }
}
