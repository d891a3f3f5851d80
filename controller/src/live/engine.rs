//! The live controller's decisions, without a client: which nodes need planning, which plan objects to
//! write or delete, and when a plan was changed behind our back.
//!
//! ```text
//! watch events ─► Engine::observe ─► caches + dirty set (Services by key; rebuild on relists/node changes)
//!       tick (coalesced, ≥ minPlanInterval apart) ─► Engine::plan ─► Planner (incremental) ─► pending nodes
//! pending node ─► Engine::work_for ─► NodeWork { apply: shards whose observed revision differs (secondaries
//!                                                first, primary last), delete: shards no longer needed }
//! observed plan edited or deleted by someone else ─► node pending again (restored, logged)
//! ```
//!
//! Plans are deleted only when their Node is known to be gone: the engine lists candidates, the edge
//! confirms each with a GET of the Node answering 404 before deleting.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use kube::runtime::watcher;
use switchyard_api::{
    NodeForwardingPlan,
    names::{
        ANNOTATION_TRIGGER_TIME, LABEL_NODE, k8s::ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
        k8s::LABEL_SERVICE_NAME, plan_object_name,
    },
    revision,
};

use super::cache::{Applied, ObjectCache, cluster_key, namespaced_key};
use crate::{
    Config, Error,
    output::object,
    planner::{Diagnostics, NodeInfo, Planner, Snapshot},
};

/// A watch event for one of the kinds the controller follows.
// Events are moved once through a channel; boxing each would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    /// Services.
    Service(watcher::Event<Service>),
    /// EndpointSlices.
    Slice(watcher::Event<EndpointSlice>),
    /// Nodes.
    Node(watcher::Event<Node>),
    /// Our own plan objects.
    Plan(watcher::Event<NodeForwardingPlan>),
}

/// What one planning run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PlanOutcome {
    /// Nodes whose plan changed and now wait for a write.
    pub changed: Vec<String>,
    /// Whether the whole cluster was re-planned (relist or node change) rather than changed Services.
    pub full: bool,
    /// Services re-planned incrementally.
    pub services: usize,
    /// What the planner could not use.
    pub diagnostics: Diagnostics,
}

/// The writes and deletes one node needs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWork {
    /// The node.
    pub node: String,
    /// Objects to server-side apply, in order: other shards first, the primary last, so an agent never sees
    /// a primary listing shard revisions that do not exist yet.
    pub apply: Vec<NodeForwardingPlan>,
    /// Objects of this node that are no longer needed (shards beyond the current count), deleted after the
    /// applies.
    pub delete: Vec<String>,
    /// Earliest `last-change-trigger-time` of the changes this work carries, for network programming latency.
    pub trigger: Option<Timestamp>,
    /// The node had no plan object yet.
    pub new_node: bool,
}

/// Work waiting for one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Pending {
    trigger: Option<Timestamp>,
}

/// A kind whose relist came back empty while objects were known: unconfirmed, so ignored for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SuspectEmpty {
    /// Services.
    Services,
    /// EndpointSlices.
    Slices,
}

/// What we know about an observed plan object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    node: String,
    revision: String,
    /// The spec's content hashes to its revision (false after a hand edit that kept the revision).
    consistent: bool,
}

/// The decision state of the live controller.
pub struct Engine {
    config: Config,
    services: ObjectCache<Service>,
    slices: ObjectCache<EndpointSlice>,
    nodes: ObjectCache<Node>,
    plans_synced: bool,
    observed: BTreeMap<String, Observed>,
    planner: Option<Planner>,
    dirty_services: BTreeMap<String, Option<Timestamp>>,
    rebuild: bool,
    pending: BTreeMap<String, Pending>,
    /// Nodes whose plans a watch showed changed by someone else (for logs and metrics).
    restored: Vec<String>,
    /// Empty relists waiting for confirmation (the objects known before them stay in the caches).
    suspects: BTreeSet<SuspectEmpty>,
    /// Plan objects listed (or written) since the plan watch's relist began; `None` outside a relist.
    relisted_plans: Option<BTreeSet<String>>,
}

impl Engine {
    /// An empty engine.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            services: ObjectCache::new(namespaced_key),
            slices: ObjectCache::new(namespaced_key),
            nodes: ObjectCache::new(cluster_key),
            plans_synced: false,
            observed: BTreeMap::new(),
            planner: None,
            dirty_services: BTreeMap::new(),
            rebuild: true,
            pending: BTreeMap::new(),
            restored: Vec::new(),
            suspects: BTreeSet::new(),
            relisted_plans: None,
        }
    }

    /// Services, EndpointSlices, Nodes and plans have all been listed once.
    pub fn synced(&self) -> bool {
        self.services.synced() && self.slices.synced() && self.nodes.synced() && self.plans_synced
    }

    /// A planning run is due.
    pub fn dirty(&self) -> bool {
        self.rebuild || !self.dirty_services.is_empty()
    }

    /// Nodes waiting for a write.
    pub fn queue_depth(&self) -> usize {
        self.pending.len()
    }

    /// Applies one watch event.
    pub fn observe(&mut self, input: Input) {
        match input {
            Input::Service(event) => match self.services.apply(event) {
                Applied::One { before, after } => {
                    for svc in before.iter().chain(after.iter()) {
                        if let Some(key) = namespaced_key(svc) {
                            self.dirty_services.entry(key).or_insert(None);
                        }
                    }
                }
                Applied::Relisted { before, after } if after.is_empty() && !before.is_empty() => {
                    // Never empty every plan on one suspicious relist: keep what we had until confirmed.
                    self.services.restore(before);
                    self.suspects.insert(SuspectEmpty::Services);
                }
                Applied::Relisted { .. } => self.rebuild = true,
                Applied::Nothing => {}
            },
            Input::Slice(event) => match self.slices.apply(event) {
                Applied::One { before, after } => {
                    let trigger = after.as_ref().and_then(trigger_time);
                    for slice in before.iter().chain(after.iter()) {
                        if let Some(key) = service_of(slice) {
                            let earliest = self.dirty_services.entry(key).or_insert(None);
                            *earliest = min_time(*earliest, trigger);
                        }
                    }
                }
                Applied::Relisted { before, after } if after.is_empty() && !before.is_empty() => {
                    self.slices.restore(before);
                    self.suspects.insert(SuspectEmpty::Slices);
                }
                Applied::Relisted { .. } => self.rebuild = true,
                Applied::Nothing => {}
            },
            Input::Node(event) => match self.nodes.apply(event) {
                // Node status churns constantly; only what the planner reads triggers a re-plan.
                Applied::One { before, after } => {
                    if planner_view(&self.config, before.as_ref())
                        != planner_view(&self.config, after.as_ref())
                    {
                        self.rebuild = true;
                    }
                }
                Applied::Relisted { before, after } => {
                    let view = |nodes: &[Node]| -> Vec<Option<NodeInfo>> {
                        nodes
                            .iter()
                            .map(|n| planner_view(&self.config, Some(n)))
                            .collect()
                    };
                    if view(&before) != view(&after) {
                        self.rebuild = true;
                    }
                }
                Applied::Nothing => {}
            },
            Input::Plan(event) => self.observe_plan(event),
        }
    }

    fn observe_plan(&mut self, event: watcher::Event<NodeForwardingPlan>) {
        match event {
            watcher::Event::Apply(plan) | watcher::Event::InitApply(plan) => {
                let Some(name) = plan.metadata.name.clone() else {
                    return;
                };
                let node = plan
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_NODE))
                    .cloned()
                    .unwrap_or_else(|| plan.spec.node_name.clone());
                let consistent = revision::compute(&plan.spec).is_ok_and(|r| r == plan.spec.revision);
                let observed = Observed {
                    node: node.clone(),
                    revision: plan.spec.revision.clone(),
                    consistent,
                };
                self.observed.insert(name.clone(), observed);
                if let Some(seen) = self.relisted_plans.as_mut() {
                    seen.insert(name.clone());
                }
                if self.plans_synced && self.differs_from_desired(&name) {
                    self.restored.push(name);
                    self.pending.entry(node).or_default();
                }
            }
            watcher::Event::Delete(plan) => {
                let Some(name) = plan.metadata.name.clone() else {
                    return;
                };
                if let Some(observed) = self.observed.remove(&name) {
                    self.restore_if_wanted(name, observed.node);
                }
            }
            watcher::Event::Init => self.relisted_plans = Some(BTreeSet::new()),
            watcher::Event::InitDone => {
                // Plans deleted while the watch was down are missing from the relist: forget them, or
                // `work_for` would take them for up to date and never rewrite them.
                if let Some(seen) = self.relisted_plans.take() {
                    let gone: Vec<String> = self
                        .observed
                        .keys()
                        .filter(|name| !seen.contains(*name))
                        .cloned()
                        .collect();
                    for name in gone {
                        if let Some(observed) = self.observed.remove(&name) {
                            self.restore_if_wanted(name, observed.node);
                        }
                    }
                }
                self.plans_synced = true;
                let nodes: BTreeSet<String> = self.observed.values().map(|o| o.node.clone()).collect();
                for node in nodes {
                    self.pending.entry(node).or_default();
                }
            }
        }
    }

    /// A plan object of `node` disappeared: queue the node when the object is still wanted.
    fn restore_if_wanted(&mut self, name: String, node: String) {
        if self.desired_revision_of(&node, &name).is_some() {
            self.restored.push(name);
            self.pending.entry(node).or_default();
        }
    }

    /// Kinds whose last relist came back empty and awaits confirmation.
    pub fn suspects(&self) -> Vec<SuspectEmpty> {
        self.suspects.iter().copied().collect()
    }

    /// An independent list confirmed the kind is really empty: forget its objects and re-plan.
    pub fn confirm_empty(&mut self, kind: SuspectEmpty) {
        if self.suspects.remove(&kind) {
            match kind {
                SuspectEmpty::Services => self.services.restore(Vec::new()),
                SuspectEmpty::Slices => self.slices.restore(Vec::new()),
            }
            self.rebuild = true;
        }
    }

    /// An independent list found objects: the empty relist was wrong; keep what we had.
    pub fn dismiss_suspect(&mut self, kind: SuspectEmpty) {
        self.suspects.remove(&kind);
    }

    /// Plan objects someone else changed or deleted since the last call (names), for logs and metrics.
    pub fn take_restored(&mut self) -> Vec<String> {
        std::mem::take(&mut self.restored)
    }

    /// The revision the controller wants for a plan object, if it wants the object at all.
    fn desired_revision(&self, name: &str) -> Option<&str> {
        let observed_node = self.observed.get(name).map(|o| o.node.as_str());
        let planner = self.planner.as_ref()?;
        let node = observed_node.or_else(|| planner.node_names().find(|n| *n == name))?;
        self.desired_revision_of(node, name)
    }

    /// The revision the controller wants for `node`'s plan object `name` (a secondary shard's name does
    /// not say its node, so callers that no longer observe it pass the node they knew).
    fn desired_revision_of(&self, node: &str, name: &str) -> Option<&str> {
        let revisions = self.planner.as_ref()?.shard_revisions(node)?;
        (0..revisions.len())
            .find(|&i| plan_object_name(node, i as u32) == name)
            .and_then(|i| revisions.get(i).map(String::as_str))
    }

    fn differs_from_desired(&self, name: &str) -> bool {
        match (self.observed.get(name), self.desired_revision(name)) {
            (Some(observed), Some(want)) => !observed.consistent || observed.revision != want,
            _ => false,
        }
    }

    /// Runs the planner over what changed since the last run and queues the nodes whose plan changed.
    pub fn plan(&mut self) -> Result<PlanOutcome, Error> {
        if !self.synced() {
            return Ok(PlanOutcome::default());
        }
        let dirty = std::mem::take(&mut self.dirty_services);
        let earliest = dirty.values().copied().fold(None, min_time);
        let mut outcome = match self.planner.as_mut() {
            Some(planner) if !self.rebuild => {
                let mut outcome = PlanOutcome {
                    services: dirty.len(),
                    ..PlanOutcome::default()
                };
                for key in dirty.keys() {
                    let slices: Vec<&EndpointSlice> = self
                        .slices
                        .values()
                        .filter(|s| service_of(s).as_deref() == Some(key.as_str()))
                        .collect();
                    let (changed, diag) = planner.replan_service(key, self.services.get(key), &slices)?;
                    outcome.changed.extend(changed);
                    outcome.diagnostics.warnings.extend(diag.warnings);
                    outcome.diagnostics.skipped.extend(diag.skipped);
                }
                outcome
            }
            _ => self.rebuild_all()?,
        };
        outcome.changed.sort();
        outcome.changed.dedup();
        for node in &outcome.changed {
            let pending = self.pending.entry(node.clone()).or_default();
            pending.trigger = min_time(pending.trigger, earliest);
        }
        Ok(outcome)
    }

    fn rebuild_all(&mut self) -> Result<PlanOutcome, Error> {
        let snapshot = Snapshot {
            services: self.services.values().cloned().collect(),
            slices: self.slices.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
        };
        let planner = Planner::build(&snapshot, &self.config)?;
        let changed = planner
            .node_names()
            .filter(|n| self.planner.as_ref().and_then(|p| p.revision(n)) != planner.revision(n))
            .map(str::to_string)
            .collect();
        let diagnostics = planner.diagnostics().clone();
        self.planner = Some(planner);
        self.rebuild = false;
        Ok(PlanOutcome {
            changed,
            full: true,
            services: 0,
            diagnostics,
        })
    }

    /// The next node to write and its trigger time: nodes without any plan object first (a new node must
    /// not wait behind a rollout), then the longest-waiting.
    pub fn next_pending(&mut self) -> Option<(String, Option<Timestamp>)> {
        let new = self
            .pending
            .keys()
            .find(|n| !self.observed.contains_key(n.as_str()))
            .cloned();
        let node = new.or_else(|| {
            self.pending
                .iter()
                .min_by_key(|(name, p)| (p.trigger.is_none(), p.trigger, (*name).clone()))
                .map(|(n, _)| n.clone())
        })?;
        let pending = self.pending.remove(&node)?;
        Some((node, pending.trigger))
    }

    /// Puts a node back (after a failed write), keeping its trigger time.
    pub fn requeue(&mut self, node: &str, trigger: Option<Timestamp>) {
        let pending = self.pending.entry(node.to_string()).or_default();
        pending.trigger = min_time(pending.trigger, trigger);
    }

    /// What `node` needs written, comparing desired revisions with the observed objects. `None` when the
    /// node is not planned (gone, or planning not done yet).
    pub fn work_for(&self, node: &str, trigger: Option<Timestamp>) -> Option<NodeWork> {
        let planner = self.planner.as_ref()?;
        let revisions = planner.shard_revisions(node)?;
        let count = revisions.len() as u32;
        let stale: BTreeSet<u32> = (0..count)
            .filter(|&i| {
                let name = plan_object_name(node, i);
                !matches!(self.observed.get(&name), Some(o) if o.consistent && o.revision == revisions[i as usize])
            })
            .collect();
        let new_node = !self.observed.contains_key(node);
        let info = planner.node_info(node)?;
        let mut shards = planner.node_shards(node, &stale)?;
        // Other shards first, the primary (index 0) last.
        shards.sort_by_key(|(index, _)| if *index == 0 { u32::MAX } else { *index });
        let apply = shards
            .into_iter()
            .map(|(index, spec)| {
                let mut object = object(node, info.uid.as_deref(), index, count, spec);
                if let Some(trigger) = trigger {
                    object
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(ANNOTATION_TRIGGER_TIME.to_string(), trigger.to_string());
                }
                object
            })
            .collect();
        let delete: Vec<String> = self
            .observed
            .iter()
            .filter(|(name, o)| o.node == node && !(0..count).any(|i| plan_object_name(node, i) == **name))
            .map(|(name, _)| name.clone())
            .collect();
        Some(NodeWork {
            node: node.to_string(),
            apply,
            delete,
            trigger,
            new_node,
        })
    }

    /// Plan objects whose Node is not in the cache: candidates for deletion once the Node is confirmed gone.
    pub fn orphans(&self) -> BTreeMap<String, Vec<String>> {
        if !self.nodes.synced() {
            return BTreeMap::new();
        }
        let mut orphans: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, observed) in &self.observed {
            if self.nodes.get(&observed.node).is_none() {
                orphans
                    .entry(observed.node.clone())
                    .or_default()
                    .push(name.clone());
            }
        }
        orphans
    }

    /// Records that an object was written with the given revision (so the watch echo is not mistaken for
    /// an edit and an immediate retry does not rewrite it).
    pub fn written(&mut self, node: &str, name: &str, revision: &str) {
        // Written during a relist: the list may predate the write, which must not count as a deletion.
        if let Some(seen) = self.relisted_plans.as_mut() {
            seen.insert(name.to_string());
        }
        self.observed.insert(
            name.to_string(),
            Observed {
                node: node.to_string(),
                revision: revision.to_string(),
                consistent: true,
            },
        );
    }

    /// Records that an object was deleted.
    pub fn deleted(&mut self, name: &str) {
        self.observed.remove(name);
    }

    /// How many objects the node's plan has (0 when the node is not planned).
    pub fn shard_count(&self, node: &str) -> Option<usize> {
        self.planner.as_ref()?.shard_revisions(node).map(<[String]>::len)
    }

    /// Services currently known (for the empty-relist guard and metrics).
    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

/// The planner's view of a node, to ignore status-only updates.
fn planner_view(config: &Config, node: Option<&Node>) -> Option<NodeInfo> {
    let mut diag = Diagnostics::default();
    crate::planner::node_info(node?, config, &mut diag)
}

/// `namespace/service` of a slice.
pub fn service_of(slice: &EndpointSlice) -> Option<String> {
    let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    Some(format!(
        "{}/{service}",
        slice.metadata.namespace.as_deref().unwrap_or("default")
    ))
}

fn trigger_time(slice: &EndpointSlice) -> Option<Timestamp> {
    slice
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)?
        .parse()
        .ok()
}

fn min_time(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::planner::fixtures::{ServiceExt, endpoint, service, slice, three_nodes};

    fn synced_engine() -> Engine {
        let mut engine = Engine::new(Config::default());
        let svc = service("ns1", "web", "10.96.0.10", |s| {
            s.port("", 80, "TCP");
        });
        let eps = slice(
            "ns1",
            "web",
            &[("", 80, "TCP")],
            vec![endpoint("10.244.1.5", "node-a")],
        );
        engine.observe(Input::Service(Event::Init));
        engine.observe(Input::Service(Event::InitApply(svc)));
        engine.observe(Input::Service(Event::InitDone));
        engine.observe(Input::Slice(Event::Init));
        engine.observe(Input::Slice(Event::InitApply(eps)));
        engine.observe(Input::Slice(Event::InitDone));
        engine.observe(Input::Node(Event::Init));
        for node in three_nodes() {
            engine.observe(Input::Node(Event::InitApply(node)));
        }
        engine.observe(Input::Node(Event::InitDone));
        engine.observe(Input::Plan(Event::Init));
        engine.observe(Input::Plan(Event::InitDone));
        engine
    }

    #[test]
    fn nothing_is_planned_before_every_kind_is_listed() {
        let mut engine = Engine::new(Config::default());
        engine.observe(Input::Service(Event::Init));
        engine.observe(Input::Service(Event::InitDone));
        assert_eq!(engine.plan().unwrap(), PlanOutcome::default());
        assert!(synced_engine().synced());
    }

    #[test]
    fn the_first_planning_queues_every_node_and_bursts_coalesce() {
        let mut engine = synced_engine();
        let outcome = engine.plan().unwrap();
        assert!(outcome.full);
        assert_eq!(outcome.changed, vec!["node-a", "node-b", "node-c"]);
        assert!(!engine.dirty());
        // Ten updates of one slice before the next tick: one incremental run for one Service.
        for i in 0..10 {
            let eps = slice(
                "ns1",
                "web",
                &[("", 80, "TCP")],
                vec![endpoint(&format!("10.244.1.{}", 10 + i), "node-a")],
            );
            engine.observe(Input::Slice(Event::Apply(eps)));
        }
        let outcome = engine.plan().unwrap();
        assert!(!outcome.full);
        assert_eq!(outcome.services, 1);
        assert_eq!(engine.queue_depth(), 3);
    }

    #[test]
    fn new_nodes_are_written_first() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        engine.written("node-a", "node-a", "x");
        engine.written("node-c", "node-c", "y");
        assert_eq!(engine.next_pending().map(|(n, _)| n).as_deref(), Some("node-b"));
    }

    #[test]
    fn node_status_churn_does_not_replan() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let mut node = three_nodes().remove(0);
        node.status.get_or_insert_with(Default::default).phase = Some("Running".into());
        engine.observe(Input::Node(Event::Apply(node.clone())));
        assert!(!engine.dirty());
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_NODE_ZONE.into(), "zone-z".into());
        engine.observe(Input::Node(Event::Apply(node)));
        assert!(engine.dirty());
    }

    const LABEL_NODE_ZONE: &str = "topology.kubernetes.io/zone";

    #[test]
    fn an_empty_relist_is_held_until_confirmed() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        engine.observe(Input::Service(Event::Init));
        engine.observe(Input::Service(Event::InitDone));
        assert_eq!(engine.suspects(), vec![SuspectEmpty::Services]);
        assert!(!engine.dirty(), "an unconfirmed empty relist must not re-plan");
        assert_eq!(engine.service_count(), 1);
        engine.confirm_empty(SuspectEmpty::Services);
        assert!(engine.dirty());
        assert_eq!(engine.service_count(), 0);
    }

    /// Writes every pending node and feeds the objects back as the plan watch would.
    fn write_all(engine: &mut Engine) -> Vec<NodeForwardingPlan> {
        let mut written = Vec::new();
        while let Some((node, _)) = engine.next_pending() {
            for object in engine.work_for(&node, None).unwrap().apply {
                engine.observe(Input::Plan(Event::Apply(object.clone())));
                written.push(object);
            }
        }
        written
    }

    #[test]
    fn a_relist_forgets_plans_deleted_while_the_watch_was_down() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let plans = write_all(&mut engine);
        assert_eq!(plans.len(), 3);
        assert!(engine.take_restored().is_empty());

        engine.observe(Input::Plan(Event::Init));
        for plan in plans
            .iter()
            .filter(|p| p.metadata.name.as_deref() != Some("node-b"))
        {
            engine.observe(Input::Plan(Event::InitApply(plan.clone())));
        }
        engine.observe(Input::Plan(Event::InitDone));
        assert_eq!(engine.take_restored(), vec!["node-b"]);
        let mut apply = BTreeMap::new();
        while let Some((node, _)) = engine.next_pending() {
            apply.insert(node.clone(), engine.work_for(&node, None).unwrap().apply.len());
        }
        let want: BTreeMap<String, usize> =
            [("node-a".into(), 0), ("node-b".into(), 1), ("node-c".into(), 0)].into();
        assert_eq!(apply, want);
    }

    #[test]
    fn plans_of_unknown_nodes_are_only_candidates() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        engine.written("node-x", "node-x", "abc");
        let orphans = engine.orphans();
        assert_eq!(orphans.keys().collect::<Vec<_>>(), vec!["node-x"]);
    }
}
