//! The planner: Services + EndpointSlices + Nodes + config → ForwardingSlices (shared, per view) and
//! one `NodeForwardingPlanSpec` per node (header, views, overrides). Pure: no client, no async, no clock.
//!
//! ```text
//! Services ──► services::templates ─┐
//!                                   ├─► slots (one per ServicePort × family, by key)
//! EndpointSlices ─► slices::collect ┘        │
//!                                            ├─► per zone: categorize(node = none, zone)  ─► view answer
//!                                            │     same digest in every zone ─► view `all`, else `zone-<z>`
//! Nodes ─► nodes::node_info ─────────────────┴─► per node hosting an endpoint / named in a hint:
//!                                                  categorize(node, zone) ─► the oracle's answer
//! override(node) = oracle's answer ≠ view answer with onNode taken from endpointsOnNode  (hosting.rs)
//! views ─► views::ViewLayout (slices, revisions)       nodes ─► plans::NodeLayout (plan, revision)
//! ```
//!
//! Why: most entries come out identical on every node of a zone; only nodes hosting one of the entry's
//! endpoints under a Local policy, or named in a node hint, differ in a way that changes their rules
//! (a plain Service's endpoint on the node differs only in `onNode`, which the agent derives from the
//! plan's `endpointsOnNode`). So one endpoint change rewrites one slice (one per zone when hinted) and
//! at most the plans of the nodes whose own answer or endpoint list changed. The per-node answer
//! ([`Planner::oracle`]) stays as the test oracle: composing slices and plan must give exactly it.

mod diagnostics;
#[cfg(test)]
pub(crate) mod fixtures;
mod hosting;
pub mod leaving;
mod nodes;
mod plans;
pub mod problems;
pub mod service_cidrs;
mod services;
mod slices;
pub mod topology;
mod views;

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
pub use nodes::NodeInfo;
pub(crate) use nodes::node_info;
pub use problems::{ServiceProblem, service_of, snapshot_problems};
pub use slices::EndpointInfo;
use switchyard_api::{
    EndpointRef, ForwardingSliceSpec, IpFamily, NodeForwardingPlanSpec, PlanEndpoint, Protocol, ServicePlan,
    View,
    compose::{Composed, SliceRef, compose},
    revision::{EntryFingerprint, fingerprint},
    slice::view_of_name,
};
pub use views::service_hash;

use self::{
    hosting::Hosting,
    plans::NodeLayout,
    services::PortTemplate,
    topology::categorize,
    views::{Member, SliceId, ViewLayout},
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

impl From<(Vec<Service>, Vec<EndpointSlice>, Vec<Node>)> for Snapshot {
    fn from((services, slices, nodes): (Vec<Service>, Vec<EndpointSlice>, Vec<Node>)) -> Self {
        Self {
            services,
            slices,
            nodes,
        }
    }
}

/// One planned entry with its digest and size, shared by every node and view that gets the same answer.
#[derive(Debug, PartialEq, Eq)]
pub struct PlannedEntry {
    /// The entry.
    pub entry: Arc<ServicePlan>,
    /// Its digest and serialised size.
    pub fingerprint: EntryFingerprint,
}

/// An entry's identity: (ServicePortName, protocol, family).
pub type EntryKey = (String, Protocol, IpFamily);

/// A node's own answer for one entry, where it differs from its view's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Hash of the entry's Service (its slice when the node's overrides move into its own view).
    pub hash: u64,
    /// The answer.
    pub planned: Arc<PlannedEntry>,
    /// When the answer is the view's with only these endpoints `local`: what the plan carries instead
    /// of the whole entry (`localEndpoints`), so endpoint changes elsewhere leave the plan alone.
    pub local: Option<Vec<EndpointRef>>,
}

type Zone = Option<String>;

/// One ServicePort × family: the answer per zone and per node that hosts an endpoint or is hinted.
#[derive(Debug)]
struct Slot {
    /// The Service it belongs to (`namespace/name`).
    service_key: String,
    /// [`service_hash`] of it: all ports of a Service share a slice.
    hash: u64,
    /// What a node of each zone forwards when it hosts none of the endpoints and no hint names it.
    by_zone: BTreeMap<Zone, Arc<PlannedEntry>>,
    /// The answer of each node hosting an endpoint or named in a node hint (the oracle's), kept only
    /// where it is not its zone's answer with `onNode` set on the endpoints `hosts` puts on the node
    /// ([`Slot::derived`]): a plain Service's hosting nodes differ only in that, and keeping a copy of
    /// the entry for each of them cost 30 MB at 10,000 Services.
    special: HashMap<String, Arc<PlannedEntry>>,
    /// Each endpoint's IP and the (known) node the EndpointSlice puts it on.
    hosts: Vec<(String, Option<String>)>,
    /// Every zone's answer is the same: the entry lives once, in view `all`.
    all: bool,
}

impl Slot {
    /// The entry as view `view` holds it (`None` when it is not in that view).
    fn in_view(&self, view: &View) -> Option<&Arc<PlannedEntry>> {
        match view {
            View::All if self.all => self.by_zone.values().next(),
            View::Zone(zone) if !self.all => self.by_zone.get(zone),
            _ => None,
        }
    }

    /// The views holding this entry.
    fn views(&self) -> Vec<View> {
        if self.all {
            vec![View::All]
        } else {
            self.by_zone.keys().map(|z| View::Zone(z.clone())).collect()
        }
    }

    /// What the per-node planner gives `node` (the oracle).
    fn oracle(&self, node: &NodeInfo) -> Option<Arc<PlannedEntry>> {
        if let Some(own) = self.special.get(&node.name) {
            return Some(Arc::clone(own));
        }
        let view = self.by_zone.get(&node.zone)?;
        if self
            .hosts
            .iter()
            .any(|(_, host)| host.as_deref() == Some(&node.name))
        {
            return self.derived(view, &node.name).map(Arc::new);
        }
        Some(Arc::clone(view))
    }

    /// The answer of a node whose [`Slot::special`] entry was not kept.
    fn derived(&self, view: &PlannedEntry, node: &str) -> Option<PlannedEntry> {
        derive(view, &self.hosts, node)
    }
}

/// `view` with `onNode` on exactly the endpoints `hosts` puts on `node`.
fn derive(view: &PlannedEntry, hosts: &[(String, Option<String>)], node: &str) -> Option<PlannedEntry> {
    let mut entry = (*view.entry).clone();
    for (ep, (_, host)) in entry.endpoints.iter_mut().zip(hosts) {
        ep.on_node = host.as_deref() == Some(node);
    }
    let fingerprint = fingerprint(&entry).ok()?;
    Some(PlannedEntry {
        entry: Arc::new(entry),
        fingerprint,
    })
}

/// True when `planned`, `node`'s own answer, is what [`derive`] makes of its zone's answer `view`.
fn derivable(
    planned: &PlannedEntry,
    view: &PlannedEntry,
    hosts: &[(String, Option<String>)],
    node: &str,
) -> bool {
    planned.entry.endpoints.len() == hosts.len()
        && same_but_on_node_and_local(&planned.entry, &view.entry)
        && planned
            .entry
            .endpoints
            .iter()
            .zip(hosts)
            .all(|(ep, (_, host))| !ep.local && ep.on_node == (host.as_deref() == Some(node)))
}

/// A planner reduced to what [`Planner::changes_since`] compares: slice and plan revisions and the
/// slices each entry lives in.
#[derive(Debug, Clone, Default)]
pub struct Previous {
    slices: BTreeMap<String, String>,
    /// The views' layouts: what their packed slices hold stays as written across a rebuild.
    views: BTreeMap<View, ViewLayout>,
    plans: BTreeMap<String, String>,
    locations: HashMap<EntryKey, BTreeSet<String>>,
}

/// What one planning run changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Nodes whose plan is new or has a new revision, sorted.
    pub plans: Vec<String>,
    /// Slices that are new or have a new revision, sorted by name.
    pub slices: Vec<SliceChange>,
    /// Slices no longer wanted (a view shrank or went away), sorted.
    pub retired: Vec<String>,
    /// What the planner could not use in the re-planned input.
    pub diagnostics: Diagnostics,
}

/// One slice to write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SliceChange {
    /// Its name.
    pub name: String,
    /// It gained an entry another slice is about to lose (an entry moving between views): write it
    /// before the others, so no agent ever misses the entry in between.
    pub first: bool,
}

/// One Service to re-plan: its key, the Service (`None`: deleted) and its EndpointSlices.
pub type ServiceChange<'a> = (&'a str, Option<&'a Service>, Vec<&'a EndpointSlice>);

/// Everything planned for a snapshot; objects are materialised on demand.
#[derive(Debug)]
pub struct Planner {
    config: Config,
    slots: BTreeMap<EntryKey, Slot>,
    by_service: HashMap<String, Vec<EntryKey>>,
    nodes: BTreeMap<String, NodeInfo>,
    zones: BTreeSet<Zone>,
    hosting: Hosting,
    overrides: BTreeMap<String, BTreeMap<EntryKey, Override>>,
    plans: BTreeMap<String, NodeLayout>,
    views: BTreeMap<View, ViewLayout>,
    diagnostics: Diagnostics,
}

impl Planner {
    /// Plans every node and view of the snapshot.
    pub fn build(snapshot: &Snapshot, config: &Config) -> Result<Self, Error> {
        let services: Vec<&Service> = snapshot.services.iter().collect();
        let slices: Vec<&EndpointSlice> = snapshot.slices.iter().collect();
        Self::build_from(&services, &slices, snapshot.nodes.iter(), config)
    }

    /// Plans every node and view from borrowed objects (the live controller's caches, without copying
    /// them into a [`Snapshot`]).
    pub fn build_from<'a>(
        services: &[&Service],
        slices: &[&EndpointSlice],
        all_nodes: impl IntoIterator<Item = &'a Node>,
        config: &Config,
    ) -> Result<Self, Error> {
        Self::build_after(services, slices, all_nodes, config, None, &BTreeMap::new())
    }

    /// [`Self::build_from`], keeping what `previous`'s packed slices hold: a Service that changed
    /// since gets a Service slice, as it would have incrementally (so a rebuild after a Node joined does
    /// not rewrite every packed slice that a Service slice shadows). `existing` names the Service
    /// slices found in the cluster (view id → Service keys): they are kept, with current entries, until
    /// folded (a restarted controller adopts its predecessor's instead of deleting them unmatched).
    pub fn build_after<'a>(
        services: &[&Service],
        slices: &[&EndpointSlice],
        all_nodes: impl IntoIterator<Item = &'a Node>,
        config: &Config,
        previous: Option<&Previous>,
        existing: &BTreeMap<String, BTreeSet<String>>,
    ) -> Result<Self, Error> {
        let mut diag = Diagnostics::default();
        let mut nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
        for node in all_nodes {
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
        let zones: BTreeSet<Zone> = nodes.values().map(|n| n.zone.clone()).collect();
        // Zone `a` and zone `zone-a` would share view `zone-a` (a zone named `zone-…` is its own id):
        // their slices would overwrite each other, so say it.
        let mut ids: BTreeMap<String, &Zone> = BTreeMap::new();
        for zone in &zones {
            if let Some(other) = ids.insert(View::Zone(zone.clone()).id(), zone) {
                diag.warn(
                    "Node",
                    zone.as_deref().unwrap_or("<no zone>"),
                    format!(
                        "zones {:?} and {:?} share the view id {}: rename one of them (topology hints of the \
                         two zones are mixed up otherwise)",
                        other.as_deref().unwrap_or_default(),
                        zone.as_deref().unwrap_or_default(),
                        View::Zone(zone.clone()).id()
                    ),
                );
            }
        }
        let fresh = plan_slots(services, slices, config, &nodes, &zones, &mut diag)?;
        let mut planner = Self {
            config: config.clone(),
            slots: BTreeMap::new(),
            by_service: HashMap::new(),
            nodes,
            zones,
            hosting: Hosting::default(),
            overrides: BTreeMap::new(),
            plans: BTreeMap::new(),
            views: BTreeMap::new(),
            diagnostics: Diagnostics::default(),
        };
        let keys: Vec<EntryKey> = fresh.iter().map(|(k, _)| k.clone()).collect();
        for (key, slot) in fresh {
            planner.insert_slot(key, slot);
        }
        for key in &keys {
            planner.refresh_overrides(key);
        }
        let names: Vec<String> = planner.nodes.keys().cloned().collect();
        for name in &names {
            planner.relayout_node(name)?;
        }
        let views: BTreeSet<View> = planner.wanted_views();
        for view in views {
            let before = previous.and_then(|p| p.views.get(&view));
            let found = existing.get(&view.id()).unwrap_or(&NONE);
            planner.relayout_view(view, before, found)?;
        }
        diag.sort();
        planner.diagnostics = diag;
        Ok(planner)
    }

    /// Re-plans one Service (`namespace/name`) after it or its EndpointSlices changed (`service` is
    /// `None` when it was deleted).
    pub fn replan_service(
        &mut self,
        service_key: &str,
        service: Option<&Service>,
        slices: &[&EndpointSlice],
    ) -> Result<Changes, Error> {
        self.replan_services(&[(service_key, service, slices.to_vec())])
    }

    /// Re-plans several Services at once: every view and plan they touch is laid out once.
    pub fn replan_services(&mut self, changes: &[ServiceChange<'_>]) -> Result<Changes, Error> {
        let slices_before: BTreeMap<String, String> = self.slice_revisions();
        let mut diag = Diagnostics::default();
        let mut touched_views: BTreeSet<View> = BTreeSet::new();
        let mut touched_nodes: BTreeSet<String> = BTreeSet::new();
        let mut moved_from: BTreeMap<EntryKey, BTreeSet<String>> = BTreeMap::new();
        let mut fresh_keys: Vec<EntryKey> = Vec::new();
        let mut hosting_changed: BTreeSet<(String, String)> = BTreeSet::new();

        for (service_key, service, slices) in changes {
            let services: Vec<&Service> = service.iter().copied().collect();
            let mut fresh = plan_slots(
                &services,
                slices,
                &self.config,
                &self.nodes,
                &self.zones,
                &mut diag,
            )?;
            fresh.retain(|(_, slot)| slot.service_key == *service_key);
            for key in self.by_service.remove(*service_key).unwrap_or_default() {
                let Some(slot) = self.slots.remove(&key) else {
                    continue;
                };
                touched_views.extend(slot.views());
                moved_from.insert(key.clone(), self.locations(&slot));
                hosting_changed.extend(self.hosting.remove(&key, &slot.hosts));
                for (node, overrides) in &mut self.overrides {
                    if overrides.remove(&key).is_some() {
                        touched_nodes.insert(node.clone());
                    }
                }
            }
            for (key, slot) in fresh {
                touched_views.extend(slot.views());
                hosting_changed.extend(self.hosting.add(&key, &slot.hosts));
                fresh_keys.push(key.clone());
                let service = slot.service_key.clone();
                self.slots.insert(key.clone(), slot);
                self.by_service.entry(service).or_default().push(key);
            }
        }
        self.overrides.retain(|_, o| !o.is_empty());
        for key in &fresh_keys {
            touched_nodes.extend(self.refresh_overrides(key));
        }
        // An (ip, node) pair that appeared or disappeared changes the derived onNode of every entry
        // listing that ip on that node.
        for (node, ip) in &hosting_changed {
            touched_nodes.insert(node.clone());
            let keys: Vec<EntryKey> = self.hosting.entries_of(ip).cloned().collect();
            for key in keys {
                if self.refresh_override(&key, node) {
                    touched_nodes.insert(node.clone());
                }
            }
        }

        let mut plans = Vec::new();
        for node in &touched_nodes {
            let before = self.plans.get(node).cloned();
            self.relayout_node(node)?;
            let after = self.plans.get(node);
            if before.as_ref().is_some_and(|b| b.overflow) || after.is_some_and(|a| a.overflow) {
                touched_views.insert(View::Node(node.clone()));
            }
            if before.as_ref().map(|b| &b.revision) != after.map(|a| &a.revision) {
                plans.push(node.clone());
            }
        }
        let wanted = self.wanted_views();
        let services: BTreeSet<&str> = changes.iter().map(|(key, _, _)| *key).collect();
        for view in touched_views {
            if wanted.contains(&view) {
                let members = members_of(&self.slots, &self.overrides, &view);
                let updated = match self.views.get_mut(&view) {
                    Some(layout) => layout.update(&members, self.config.max_object_bytes, &services)?,
                    None => false,
                };
                drop(members);
                if !updated {
                    self.relayout_view(view, None, &BTreeSet::new())?;
                }
            } else {
                self.views.remove(&view);
            }
        }
        let slices_after = self.slice_revisions();
        let mut first: BTreeSet<String> = BTreeSet::new();
        for (key, from) in &moved_from {
            if let Some(slot) = self.slots.get(key) {
                first.extend(gained(from, self.locations(slot)));
            }
        }
        // A brand-new entry has no old location: nothing to lose, nothing to order.
        let slices = changed_slices(&slices_before, &slices_after, &first);
        let retired = slices_before
            .keys()
            .filter(|n| !slices_after.contains_key(*n))
            .cloned()
            .collect();
        diag.sort();
        Ok(Changes {
            plans,
            slices,
            retired,
            diagnostics: diag,
        })
    }

    /// What a later rebuild compares against: this planner's objects and where each entry lives. Kept
    /// instead of the whole planner, so a rebuild (a Node joined) never holds two planners at once.
    pub fn previous(&self) -> Previous {
        Previous {
            slices: self.slice_revisions(),
            views: self
                .views
                .iter()
                .map(|(view, layout)| (view.clone(), layout.kept()))
                .collect(),
            plans: self
                .plans
                .iter()
                .map(|(node, layout)| (node.clone(), layout.revision.clone()))
                .collect(),
            locations: self
                .slots
                .iter()
                .map(|(key, slot)| (key.clone(), self.locations(slot)))
                .collect(),
        }
    }

    /// What changed from `old` to this planner (after a full rebuild).
    pub fn changes_since(&self, old: Option<&Previous>) -> Changes {
        let empty = BTreeMap::new();
        let before = old.map_or(&empty, |o| &o.slices);
        let after = self.slice_revisions();
        let mut first = BTreeSet::new();
        if let Some(old) = old {
            for (key, slot) in &self.slots {
                let Some(from) = old.locations.get(key) else {
                    continue;
                };
                first.extend(gained(from, self.locations(slot)));
            }
        }
        let plans = self
            .plans
            .iter()
            .filter(|(node, layout)| {
                old.and_then(|o| o.plans.get(*node))
                    .is_none_or(|revision| *revision != layout.revision)
            })
            .map(|(node, _)| node.clone())
            .collect();
        Changes {
            plans,
            slices: changed_slices(before, &after, &first),
            retired: before
                .keys()
                .filter(|n| !after.contains_key(*n))
                .cloned()
                .collect(),
            diagnostics: self.diagnostics.clone(),
        }
    }

    fn insert_slot(&mut self, key: EntryKey, slot: Slot) {
        self.hosting.add(&key, &slot.hosts);
        self.by_service
            .entry(slot.service_key.clone())
            .or_default()
            .push(key.clone());
        self.slots.insert(key, slot);
    }

    /// Recomputes the overrides of one entry for every node that might need one. Returns the nodes whose
    /// override changed.
    fn refresh_overrides(&mut self, key: &EntryKey) -> Vec<String> {
        let Some(slot) = self.slots.get(key) else {
            return Vec::new();
        };
        let mut candidates: BTreeSet<String> = slot.special.keys().cloned().collect();
        for (ip, _) in &slot.hosts {
            candidates.extend(self.hosting.nodes_of(ip).map(str::to_string));
        }
        candidates
            .into_iter()
            .filter(|node| self.refresh_override(key, node))
            .collect()
    }

    /// Recomputes whether `node` needs an override for one entry; true when that changed.
    fn refresh_override(&mut self, key: &EntryKey, node: &str) -> bool {
        let wanted = match (self.slots.get(key), self.nodes.get(node)) {
            (Some(slot), Some(info)) => override_for(slot, info, &self.hosting),
            _ => None,
        };
        let overrides = self.overrides.entry(node.to_string()).or_default();
        let changed = match &wanted {
            Some(o) => overrides.get(key).is_none_or(|have| {
                have.planned.fingerprint != o.planned.fingerprint || have.local != o.local
            }),
            None => overrides.contains_key(key),
        };
        match wanted {
            Some(o) => {
                overrides.insert(key.clone(), o);
            }
            None => {
                overrides.remove(key);
            }
        }
        if overrides.is_empty() {
            self.overrides.remove(node);
        }
        changed
    }

    fn relayout_node(&mut self, name: &str) -> Result<(), Error> {
        let Some(info) = self.nodes.get(name) else {
            self.plans.remove(name);
            return Ok(());
        };
        let layout = NodeLayout::compute(
            info,
            &self.config,
            self.hosting.ips_on(name),
            self.overrides.get(name).unwrap_or(&EMPTY),
        )?;
        self.plans.insert(name.to_string(), layout);
        Ok(())
    }

    /// Views some node composes: `all`, every zone with a node, and the own view of every node whose
    /// overrides outgrew its plan.
    fn wanted_views(&self) -> BTreeSet<View> {
        let mut views: BTreeSet<View> = self
            .plans
            .values()
            .flat_map(|p| p.views.iter().cloned())
            .collect();
        views.extend(self.zones.iter().map(|z| View::Zone(z.clone())));
        if !self.nodes.is_empty() {
            views.insert(View::All);
        }
        views
    }

    /// Lays out one view against its current layout, or `previous` (a rebuild's) when it has none.
    fn relayout_view(
        &mut self,
        view: View,
        previous: Option<&ViewLayout>,
        existing: &BTreeSet<String>,
    ) -> Result<(), Error> {
        let members = self.members(&view);
        let previous = self.views.get(&view).or(previous);
        let layout = ViewLayout::build(
            view.clone(),
            &members,
            self.config.max_object_bytes,
            previous,
            existing,
        )?;
        self.views.insert(view, layout);
        Ok(())
    }

    /// (Service hash, Service key, entry) of every entry of a view.
    fn members(&self, view: &View) -> Vec<Member<'_>> {
        members_of(&self.slots, &self.overrides, view)
    }

    /// Names of the slices holding a slot's current entry (in view `all`, or one per zone).
    fn locations(&self, slot: &Slot) -> BTreeSet<String> {
        slot.views()
            .iter()
            .filter_map(|v| self.views.get(v))
            .map(|layout| layout.location(&slot.service_key, slot.hash))
            .collect()
    }

    /// Folds the Service slices shadowing these packed slices back into them: each packed slice is
    /// written with its Services' current entries, and their Service slices are retired (deleted once
    /// the packed slice is written). Names that are not packed slices are ignored.
    pub fn fold(&mut self, packed: &[String]) -> Result<Changes, Error> {
        let before = self.slice_revisions();
        for name in packed {
            let Some(view) = self
                .views
                .iter()
                .find_map(|(view, l)| matches!(l.find(name), Some(SliceId::Packed(_))).then(|| view.clone()))
            else {
                continue;
            };
            if let Some(layout) = self.views.get_mut(&view)
                && let Some(SliceId::Packed(index)) = layout.find(name)
            {
                layout.fold(index)?;
            }
        }
        let after = self.slice_revisions();
        Ok(Changes {
            plans: Vec::new(),
            slices: changed_slices(&before, &after, &BTreeSet::new()),
            retired: before
                .keys()
                .filter(|n| !after.contains_key(*n))
                .cloned()
                .collect(),
            diagnostics: Diagnostics::default(),
        })
    }

    /// Every packed slice shadowed by Service slices, with the Services shadowing it.
    pub fn shadowed(&self) -> Vec<(String, BTreeSet<&str>)> {
        self.views
            .values()
            .flat_map(|layout| {
                layout
                    .shadowed()
                    .into_iter()
                    .map(|(index, services)| (layout.name(index), services))
            })
            .collect()
    }

    /// Number of Service slices over every view.
    pub fn service_slice_count(&self) -> usize {
        self.views.values().map(ViewLayout::service_slices).sum()
    }

    /// (node, revision) of every planned node's plan.
    pub fn plan_revisions(&self) -> impl Iterator<Item = (&str, &str)> {
        self.plans
            .iter()
            .map(|(node, layout)| (node.as_str(), layout.revision.as_str()))
    }

    /// (name, revision) of every slice, by view.
    pub fn slice_revisions_iter(&self) -> impl Iterator<Item = (String, &str)> {
        self.views.values().flat_map(|layout| layout.slices())
    }

    fn slice_revisions(&self) -> BTreeMap<String, String> {
        self.slice_revisions_iter()
            .map(|(name, revision)| (name, revision.to_string()))
            .collect()
    }

    /// Names of the planned nodes, sorted.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The planner's view of a node (name, zone, IPs, pod CIDRs, backend, UID).
    pub fn node_info(&self, node: &str) -> Option<&NodeInfo> {
        self.nodes.get(node)
    }

    /// The revision of a node's plan, when the node is known.
    pub fn plan_revision(&self, node: &str) -> Option<&str> {
        self.plans.get(node).map(|p| p.revision.as_str())
    }

    /// The node's live plan object spec.
    pub fn node_plan(&self, node: &str) -> Option<NodeForwardingPlanSpec> {
        let info = self.nodes.get(node)?;
        let layout = self.plans.get(node)?;
        Some(layout.materialize(
            info,
            &self.config,
            self.hosting.ips_on(node),
            self.overrides.get(node).unwrap_or(&EMPTY),
        ))
    }

    /// Every slice's (name, revision), sorted by name.
    pub fn slice_names(&self) -> BTreeMap<String, String> {
        self.slice_revisions()
    }

    /// The revision of a slice, when it is wanted.
    pub fn slice_revision(&self, name: &str) -> Option<String> {
        let (layout, id) = self.find_slice(name)?;
        layout.revision(id).map(str::to_string)
    }

    fn find_slice(&self, name: &str) -> Option<(&ViewLayout, SliceId<'_>)> {
        let id = view_of_name(name);
        let layout = self.views.values().find(|l| l.view().id() == id)?;
        Some((layout, layout.find(name)?))
    }

    /// One slice's spec, materialised.
    pub fn slice(&self, name: &str) -> Option<ForwardingSliceSpec> {
        let (layout, id) = self.find_slice(name)?;
        layout.spec(id)
    }

    /// Every slice of the given views (all views when `None`), materialised, sorted by name.
    pub fn slices(&self, views: Option<&[View]>) -> Vec<(String, ForwardingSliceSpec)> {
        let mut out = Vec::new();
        for layout in self.views.values() {
            if views.is_some_and(|v| !v.contains(layout.view())) {
                continue;
            }
            out.extend(layout.specs());
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// What the node forwards: its plan composed with its views' slices, exactly as its agent composes
    /// them. `None` for an unknown node.
    pub fn composed(&self, node: &str) -> Option<Result<Composed, String>> {
        let plan = self.node_plan(node)?;
        let views: Vec<View> = self.plans.get(node)?.views.clone();
        let slices = self.slices(Some(&views));
        let refs: Vec<SliceRef<'_>> = slices
            .iter()
            .map(|(name, spec)| SliceRef { name, spec })
            .collect();
        Some(compose(&plan, &refs))
    }

    /// The per-node answer for every entry, sorted by key: what the planner gave each node before
    /// slices existed, kept as the oracle that composing a plan with its slices must reproduce.
    pub fn oracle(&self, node: &str) -> Option<Vec<Arc<ServicePlan>>> {
        let info = self.nodes.get(node)?;
        Some(
            self.slots
                .values()
                .filter_map(|s| s.oracle(info).map(|p| Arc::clone(&p.entry)))
                .collect(),
        )
    }

    /// Warnings and skipped Services of the last full build.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// Number of entries (ServicePort × family) planned.
    pub fn entry_count(&self) -> usize {
        self.slots.len()
    }

    /// Number of overrides over every node.
    pub fn override_count(&self) -> usize {
        self.overrides.values().map(BTreeMap::len).sum()
    }

    /// Nodes whose overrides moved into their own view.
    pub fn overflowing_nodes(&self) -> impl Iterator<Item = &str> {
        self.plans
            .iter()
            .filter(|(_, p)| p.overflow)
            .map(|(n, _)| n.as_str())
    }
}

/// The slices an entry arrives in when it moves into another view (they are written before the slices
/// it leaves). Moving from a packed slice to its Service's own slice in the same view is not a move:
/// the packed copy stays until the Service slice is written, so nothing needs to go first (and one
/// failing write must not hold up every other slice).
fn gained(from: &BTreeSet<String>, to: BTreeSet<String>) -> Vec<String> {
    let views = |names: &BTreeSet<String>| -> BTreeSet<String> {
        names.iter().map(|n| view_of_name(n).to_string()).collect()
    };
    let before = views(from);
    to.into_iter()
        .filter(|name| !before.contains(view_of_name(name)))
        .collect()
}

static EMPTY: BTreeMap<EntryKey, Override> = BTreeMap::new();
static NONE: BTreeSet<String> = BTreeSet::new();

/// (Service hash, Service key, entry) of every entry of a view: a node's own view holds its overrides.
fn members_of<'a>(
    slots: &'a BTreeMap<EntryKey, Slot>,
    overrides: &'a BTreeMap<String, BTreeMap<EntryKey, Override>>,
    view: &View,
) -> Vec<Member<'a>> {
    match view {
        View::Node(node) => overrides
            .get(node)
            .into_iter()
            .flat_map(|o| {
                o.values()
                    .map(|o| (o.hash, o.planned.entry.service_key(), &o.planned))
            })
            .collect(),
        _ => slots
            .values()
            .filter_map(|s| s.in_view(view).map(|p| (s.hash, s.service_key.as_str(), p)))
            .collect(),
    }
}

/// Slices new in `after` or with another revision, those in `first` flagged.
fn changed_slices(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    first: &BTreeSet<String>,
) -> Vec<SliceChange> {
    after
        .iter()
        .filter(|(name, revision)| before.get(*name) != Some(*revision))
        .map(|(name, _)| SliceChange {
            name: name.clone(),
            first: first.contains(name),
        })
        .collect()
}

/// The node's override for a slot: none when its own answer equals its view's with `onNode` derived from
/// the node's hosted endpoint IPs; its Local endpoints alone when that is the only other difference; the
/// whole answer otherwise.
fn override_for(slot: &Slot, node: &NodeInfo, hosting: &Hosting) -> Option<Override> {
    let view = slot.by_zone.get(&node.zone)?;
    let derived;
    let own = match slot.special.get(&node.name) {
        Some(own) => own,
        None => {
            // The node's answer is the view's with `onNode` from the slot's hosts; no override when
            // the node's endpointsOnNode derives the same flags.
            if slot.hosts.iter().all(|(ip, host)| {
                (host.as_deref() == Some(node.name.as_str())) == hosting.is_on(&node.name, ip)
            }) {
                return None;
            }
            derived = Arc::new(slot.derived(view, &node.name)?);
            &derived
        }
    };
    let derived_on_node = own
        .entry
        .endpoints
        .iter()
        .all(|ep| ep.on_node == hosting.is_on(&node.name, &ep.ip));
    let local: Vec<EndpointRef> = own
        .entry
        .endpoints
        .iter()
        .filter(|ep| ep.local)
        .map(|ep| EndpointRef {
            ip: ep.ip.clone(),
            port: ep.port,
        })
        .collect();
    if derived_on_node && same_but_on_node_and_local(&own.entry, &view.entry) {
        // The view entry has no Local endpoints (it is no node's answer), so the own answer is the view's
        // with `local` on exactly these.
        return (!local.is_empty()).then(|| Override {
            hash: slot.hash,
            planned: Arc::clone(own),
            local: Some(local),
        });
    }
    Some(Override {
        hash: slot.hash,
        planned: Arc::clone(own),
        local: None,
    })
}

/// Equal in everything but the endpoints' `onNode` and `local` flags.
fn same_but_on_node_and_local(a: &ServicePlan, b: &ServicePlan) -> bool {
    let same_endpoint = |x: &PlanEndpoint, y: &PlanEndpoint| {
        let PlanEndpoint {
            ip,
            port,
            cluster,
            local: _,
            on_node: _,
            terminating,
            weight,
        } = x;
        *ip == y.ip
            && *port == y.port
            && *cluster == y.cluster
            && *terminating == y.terminating
            && *weight == y.weight
    };
    // Exhaustive on purpose: a new entry field fails to compile here until it is compared.
    let ServicePlan {
        name,
        protocol,
        family,
        cluster_ip,
        port,
        node_port,
        external_ips,
        load_balancer_ips,
        source_ranges,
        affinity_timeout_seconds,
        external_policy,
        internal_policy,
        health_check_node_port,
        scheduler,
        has_endpoints,
        endpoints,
        unready_ips,
        keep_connections,
    } = a;
    *name == b.name
        && *protocol == b.protocol
        && *family == b.family
        && *cluster_ip == b.cluster_ip
        && *port == b.port
        && *node_port == b.node_port
        && *external_ips == b.external_ips
        && *load_balancer_ips == b.load_balancer_ips
        && *source_ranges == b.source_ranges
        && *affinity_timeout_seconds == b.affinity_timeout_seconds
        && *external_policy == b.external_policy
        && *internal_policy == b.internal_policy
        && *health_check_node_port == b.health_check_node_port
        && *scheduler == b.scheduler
        && *has_endpoints == b.has_endpoints
        && *unready_ips == b.unready_ips
        && *keep_connections == b.keep_connections
        && endpoints.len() == b.endpoints.len()
        && endpoints
            .iter()
            .zip(&b.endpoints)
            .all(|(x, y)| same_endpoint(x, y))
}

/// Services and their slices → slots, keyed.
fn plan_slots(
    services: &[&Service],
    slices: &[&EndpointSlice],
    config: &Config,
    nodes: &BTreeMap<String, NodeInfo>,
    zones: &BTreeSet<Zone>,
    diag: &mut Diagnostics,
) -> Result<Vec<(EntryKey, Slot)>, Error> {
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
    let slices::Collected {
        mut endpoints,
        mut unready,
    } = slices::collect(slices, diag);
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
    let mut slots = Vec::with_capacity(templates.len());
    for template in templates {
        let port_key = (
            template.service_key.clone(),
            template.port_name.clone(),
            template.entry.protocol,
            template.entry.family,
        );
        let eps = endpoints.remove(&port_key).unwrap_or_default();
        let mut template = template;
        template.entry.unready_ips = unready
            .remove(&port_key)
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect();
        let key: EntryKey = (
            template.entry.name.clone(),
            template.entry.protocol,
            template.entry.family,
        );
        slots.push((key, plan_slot(template, eps, zones, nodes)?));
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
    let mut by_zone = BTreeMap::new();
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
    let hosts: Vec<(String, Option<String>)> = endpoints
        .iter()
        .map(|ep| {
            let node = ep.node.clone().filter(|n| nodes.contains_key(n));
            (ep.ip.to_string(), node)
        })
        .collect();
    let mut answers = HashMap::new();
    for node in special {
        let info = nodes.get(node);
        let zone = info.and_then(|n| n.zone.as_deref());
        let planned = planned_entry(&template, &endpoints, Some(node), zone)?;
        let view = info.and_then(|n| by_zone.get(&n.zone));
        if let Some(view) = view
            && derivable(&planned, view, &hosts, node)
        {
            // Every test that plans runs this: what the oracle derives is the per-node answer.
            debug_assert_eq!(
                derive(view, &hosts, node).map(|d| d.entry),
                Some(Arc::clone(&planned.entry))
            );
            continue;
        }
        answers.insert(node.to_string(), Arc::new(planned));
    }
    let mut digests = by_zone.values().map(|p| p.fingerprint.digest);
    let first = digests.next();
    let all = digests.all(|d| Some(d) == first);
    Ok(Slot {
        hash: service_hash(&template.service_key),
        service_key: template.service_key,
        by_zone,
        special: answers,
        hosts,
        all,
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
    Ok(PlannedEntry {
        entry: Arc::new(entry),
        fingerprint,
    })
}
