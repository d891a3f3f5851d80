//! The live controller's decisions, without a client: what needs planning, which objects (slices and
//! plans) to write or delete and in which order, and when an object was changed behind our back.
//!
//! ```text
//! watch events ─► Engine::observe ─► caches + dirty set (Services by key; rebuild on relists/node changes)
//!            (a version that does not decode changes nothing: its last good one stays; Engine::undecodable)
//!       tick (coalesced, ≥ minPlanInterval apart) ─► Engine::plan ─► Planner (incremental) ─► Changes
//!            ─► pending: slices that gain a moving entry, other slices, new nodes' plans, other plans
//!            ─► retired slices: deleted once nothing waits to be written
//!       tick, at most every FOLD_EVERY ─► the most shadowed packed slice whose Service slices were all
//!            quiet for sliceFoldAfter ─► Planner::fold ─► that packed slice queued, its Service slices retired
//!            (the queue itself, its order and back-offs: live::queue)
//! pending object ─► Engine::work_for ─► Work::Apply (observed revision differs) | Work::Delete | nothing
//!            (handed to the writer as a ticket: live::ticket)
//! observed object edited or deleted by someone else ─► pending again (restored, logged)
//!   (our own late watch echoes are told apart by live::tracker and never count)
//! ```
//!
//! Slices go before plans so a plan never names a view whose slices are not written yet, and an entry
//! moving between views is written where it arrives before it leaves where it was. Plans are deleted
//! only when their Node is known to be gone: the engine lists candidates, the edge confirms each with a
//! GET of the Node answering 404 before deleting.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use k8s_openapi::{
    api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice, networking::v1::ServiceCIDR},
    jiff::Timestamp,
};
use kube::runtime::watcher;
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    names::{ANNOTATION_TRIGGER_TIME, k8s::ANNOTATION_LAST_CHANGE_TRIGGER_TIME},
    slice::{service_slice_name, view_of_name},
    tolerant::Undecodable,
    watch::map_event,
};
use tokio::time::Instant;

use super::intake::SuspectEmpty;
use super::object::ObjectRef;
use super::{
    cache::{Applied, namespaced_key},
    intake::{Intake, Ours, Relist, Seen, Watched},
    planning::Planning,
    queue::{Judge, WriteQueue, min_time},
    tracker::{Echo, Tracker},
    trim::Delivered,
};
use crate::{
    Config, Error,
    output::{plan_object, slice_object},
    planner::{
        Changes, Diagnostics, NodeInfo, Planner, ServiceChange, ServiceProblem, SliceChange,
        problems::{problems_by_service, service_problems},
        service_cidrs::{self, CidrProblem},
        service_of,
    },
};

/// A watch event for one of the kinds the controller follows, each object decoded or not
/// ([`Delivered`]).
// Events are moved once through a channel; boxing each would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    /// Services.
    Service(watcher::Event<Delivered<Service>>),
    /// EndpointSlices.
    Slice(watcher::Event<Delivered<EndpointSlice>>),
    /// Nodes.
    Node(watcher::Event<Delivered<Node>>),
    /// ServiceCIDRs.
    ServiceCidr(watcher::Event<Delivered<ServiceCIDR>>),
    /// The ServiceCIDR watch failed before it listed (an API server without them).
    ServiceCidrsUnavailable,
    /// Our own plan objects.
    Plan(watcher::Event<Delivered<NodeForwardingPlan>>),
    /// Our own ForwardingSlices.
    ForwardingSlice(watcher::Event<Delivered<ForwardingSlice>>),
}

/// What one planning run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PlanOutcome {
    /// Nodes whose plan changed and now waits for a write.
    pub changed: Vec<String>,
    /// Slices that changed and now wait for a write.
    pub slices: Vec<String>,
    /// Whether the whole cluster was re-planned (relist or node change) rather than changed Services.
    pub full: bool,
    /// Services re-planned incrementally.
    pub services: usize,
    /// What the planner could not use.
    pub diagnostics: Diagnostics,
    /// The packed slice its quiet Service slices were folded back into, if any.
    pub folded: Option<String>,
}

/// What one pending object needs.
// Built once per write and moved straight into the request; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Server-side apply this plan.
    ApplyPlan(NodeForwardingPlan),
    /// Server-side apply this slice.
    ApplySlice(ForwardingSlice),
    /// Delete this slice (no longer wanted).
    DeleteSlice(String),
}

/// The decision state of the live controller: what the watches delivered, the planning done on it,
/// and what waits to be written.
pub struct Engine {
    config: Config,
    /// Caches, our objects as watched, what needs planning.
    intake: Intake,
    /// The planner and what it found.
    planning: Planning,
    /// What waits for a write or a delete.
    queue: WriteQueue,
}

/// At most one packed slice is folded per this interval: each fold sends a whole packed slice to every
/// node of its view, so folds are spread out instead of bunched after a cluster-wide rollout.
pub const FOLD_EVERY: Duration = Duration::from_secs(10);

impl Engine {
    /// An empty engine.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            intake: Intake::new(),
            planning: Planning::default(),
            queue: WriteQueue::default(),
        }
    }

    /// Services, EndpointSlices, Nodes, plans and slices have all been listed once.
    pub fn synced(&self) -> bool {
        self.intake.services.synced()
            && self.intake.slices.synced()
            && self.intake.nodes.synced()
            && (self.intake.service_cidrs.synced() || self.intake.service_cidrs_unavailable)
            && self.intake.plans.synced
            && self.intake.fws.synced
    }

    /// A planning run is due (changed input, or a fold of quiet Service slices).
    pub fn dirty(&self) -> bool {
        self.intake.rebuild || !self.intake.dirty_services.is_empty() || self.fold_due(Instant::now())
    }

    fn fold_due(&self, now: Instant) -> bool {
        self.planning
            .planner
            .as_ref()
            .is_some_and(|p| p.service_slice_count() > 0)
            && self.planning.next_fold.is_none_or(|at| now >= at)
    }

    /// Folds the most shadowed packed slice whose Service slices were all quiet for
    /// `sliceFoldAfter` (at most one per [`FOLD_EVERY`]).
    fn fold_quiet(&mut self, now: Instant) -> Result<Option<(String, Changes)>, Error> {
        if !self.fold_due(now) {
            return Ok(None);
        }
        self.planning.next_fold = Some(now + FOLD_EVERY);
        let Some(planner) = self.planning.planner.as_mut() else {
            return Ok(None);
        };
        let after = self.config.slice_fold_after;
        let changed_at = &self.planning.changed_at;
        let quiet = |service: &str| {
            changed_at
                .get(service)
                .is_none_or(|at| now.saturating_duration_since(*at) >= after)
        };
        let shadowed = planner.shadowed();
        let live: HashSet<String> = shadowed
            .iter()
            .flat_map(|(_, services)| services.iter().map(|s| s.to_string()))
            .collect();
        // A Service slice whose latest write has not landed must not be folded away: the cluster
        // still holds its older entries, which agents would keep using once it is deleted.
        let fws = &self.intake.fws.tracker;
        let landed = |packed: &str, service: &str| {
            let name = service_slice_name(view_of_name(packed), service);
            planner
                .slice_revision(&name)
                .is_some_and(|revision| fws.is_current(&name, &revision))
        };
        let due = shadowed
            .into_iter()
            .filter(|(packed, services)| services.iter().all(|s| quiet(s) && landed(packed, s)))
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(&a.0)))
            .map(|(name, _)| name);
        self.planning
            .changed_at
            .retain(|service, _| live.contains(service));
        let Some(name) = due else {
            return Ok(None);
        };
        let changes = planner.fold(std::slice::from_ref(&name))?;
        Ok(Some((name, changes)))
    }

    /// Objects waiting for a write or a delete.
    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    /// The planner, once planning ran.
    pub fn planner(&self) -> Option<&Planner> {
        self.planning.planner.as_ref()
    }

    /// Applies one watch event.
    pub fn observe(&mut self, input: Input) {
        match input {
            Input::Service(event) => match self
                .intake
                .services
                .apply(map_event(event, Delivered::into_result))
            {
                Applied::One { before, after } => {
                    for svc in before.iter().chain(after.iter()) {
                        if let Some(key) = namespaced_key(svc) {
                            self.intake.dirty_services.entry(key).or_insert(None);
                        }
                    }
                }
                Applied::Relisted { before } if self.intake.services.is_empty() && !before.is_empty() => {
                    // Never empty every plan on one suspicious relist: keep what we had until confirmed.
                    self.intake.services.restore(before);
                    self.intake.suspects.insert(SuspectEmpty::Services);
                }
                Applied::Relisted { .. } => self.intake.rebuild = true,
                Applied::Kept { undecodable, fresh } => self.kept(undecodable, fresh),
                Applied::Nothing => {}
            },
            Input::Slice(event) => match self.intake.slices.apply(map_event(event, Delivered::into_result)) {
                Applied::One { before, after } => {
                    let trigger = after.as_ref().and_then(trigger_time);
                    for slice in before.iter().chain(after.iter()) {
                        if let Some(key) = service_of(slice) {
                            let earliest = self.intake.dirty_services.entry(key).or_insert(None);
                            *earliest = min_time(*earliest, trigger);
                        }
                    }
                }
                Applied::Relisted { before } if self.intake.slices.is_empty() && !before.is_empty() => {
                    self.intake.slices.restore(before);
                    self.intake.suspects.insert(SuspectEmpty::Slices);
                }
                Applied::Relisted { .. } => self.intake.rebuild = true,
                Applied::Kept { undecodable, fresh } => self.kept(undecodable, fresh),
                Applied::Nothing => {}
            },
            Input::Node(event) => match self.intake.nodes.apply(map_event(event, Delivered::into_result)) {
                // Node status churns constantly; only what the planner reads triggers a re-plan.
                Applied::One { before, after } => {
                    if planner_view(&self.config, before.as_ref())
                        != planner_view(&self.config, after.as_ref())
                    {
                        self.intake.rebuild = true;
                    }
                }
                Applied::Relisted { before } => {
                    let before: Vec<Option<NodeInfo>> = before
                        .iter()
                        .map(|n| planner_view(&self.config, Some(n)))
                        .collect();
                    let after: Vec<Option<NodeInfo>> = self
                        .intake
                        .nodes
                        .values()
                        .map(|n| planner_view(&self.config, Some(n)))
                        .collect();
                    if before != after {
                        self.intake.rebuild = true;
                    }
                }
                Applied::Kept { undecodable, fresh } => self.kept(undecodable, fresh),
                Applied::Nothing => {}
            },
            Input::ServiceCidr(event) => match self
                .intake
                .service_cidrs
                .apply(map_event(event, Delivered::into_result))
            {
                // Every plan's header carries the ranges: re-planned whole (rare: ServiceCIDRs change
                // when a cluster's Service range is extended).
                Applied::One { .. } | Applied::Relisted { .. } => self.intake.rebuild = true,
                Applied::Kept { undecodable, fresh } => self.kept(undecodable, fresh),
                Applied::Nothing => {}
            },
            Input::ServiceCidrsUnavailable => {
                if !self.intake.service_cidrs.synced() {
                    self.intake.service_cidrs_unavailable = true;
                }
            }
            Input::Plan(event) => self.observe_ours(Ours::Plans, map_event(event, Seen::plan)),
            Input::ForwardingSlice(event) => self.observe_ours(Ours::Slices, map_event(event, Seen::slice)),
        }
    }

    /// The Service ranges the plans carry, from the ServiceCIDRs and the pod CIDRs as now known (at
    /// every rebuild: a Node's new pod CIDR can make a range overlap).
    fn resolve_service_cidrs(&mut self) {
        let pod_cidrs = service_cidrs::pod_cidrs(self.intake.nodes.values(), &self.config);
        let (ranges, problems) = service_cidrs::accept(self.intake.service_cidrs.values(), &pod_cidrs);
        for problem in problems
            .iter()
            .filter(|p| !self.planning.cidr_problems.contains(p))
        {
            tracing::warn!(
                servicecidr = %problem.name,
                reason = problem.reason,
                "{}",
                problem.message
            );
        }
        self.config.service_cidrs = ranges;
        self.planning.cidr_problems = problems;
    }

    /// ServiceCIDRs ignored at the last rebuild, and why.
    pub fn service_cidr_problems(&self) -> &[CidrProblem] {
        &self.planning.cidr_problems
    }

    /// A watched object's latest version did not decode; its last good version stays, so nothing needs
    /// planning. Reported once per breakage.
    fn kept(&mut self, undecodable: Box<Undecodable>, fresh: bool) {
        if fresh {
            self.intake.broken.push(*undecodable);
        }
    }

    /// The Services, EndpointSlices and Nodes whose latest version does not decode (their last good
    /// version, if any, is what is planned).
    pub fn undecodable(&self) -> Vec<&Undecodable> {
        let services = self.intake.services.undecodable();
        let slices = self.intake.slices.undecodable();
        services
            .chain(slices)
            .chain(self.intake.nodes.undecodable())
            .chain(self.intake.service_cidrs.undecodable())
            .collect()
    }

    /// Objects whose latest version did not decode, first seen so since the last call (for logs and
    /// metrics).
    pub fn take_broken(&mut self) -> Vec<Undecodable> {
        std::mem::take(&mut self.intake.broken)
    }

    /// One event of the watch of our plans or slices.
    fn observe_ours(&mut self, ours: Ours, event: watcher::Event<Option<Seen>>) {
        match event {
            watcher::Event::Apply(Some(seen)) => self.seen(ours, seen, false),
            watcher::Event::InitApply(Some(seen)) => self.seen(ours, seen, true),
            watcher::Event::Apply(None) | watcher::Event::InitApply(None) => {}
            watcher::Event::Delete(seen) => {
                let Some(Seen { name, .. }) = seen else { return };
                if self.watched_mut(ours).tracker.remove(&name).is_some() {
                    if matches!(ours, Ours::Slices) {
                        self.queue.unretire(&name);
                    }
                    self.restore_if_wanted(ours.object(name));
                }
            }
            watcher::Event::Init => self.watched_mut(ours).relist = Relist(Some(BTreeSet::new())),
            watcher::Event::InitDone => {
                let watched = self.watched_mut(ours);
                // Objects deleted while the watch was down are missing from the relist: forget them, or
                // `work_for` would take them for up to date and never rewrite them.
                let gone: Vec<String> = match watched.relist.0.take() {
                    Some(listed) => watched
                        .tracker
                        .names()
                        .filter(|n| !listed.contains(*n))
                        .cloned()
                        .collect(),
                    None => Vec::new(),
                };
                for name in &gone {
                    watched.tracker.remove(name);
                }
                watched.synced = true;
                let names: Vec<String> = watched.tracker.names().cloned().collect();
                for name in gone {
                    self.restore_if_wanted(ours.object(name));
                }
                for name in names {
                    self.queue.want(ours.object(name), None, false);
                }
            }
        }
    }

    fn seen(&mut self, ours: Ours, mut seen: Seen, relisted: bool) {
        if let Some(undecodable) = seen.undecodable.take() {
            self.intake.broken.push(*undecodable);
        }
        let watched = self.watched_mut(ours);
        watched.relist.note(&seen.name);
        let echo = watched.tracker.observe(
            &seen.name,
            seen.observed,
            seen.resource_version.as_deref(),
            relisted,
        );
        self.after_seen(ours.object(seen.name), echo);
    }

    fn watched_mut(&mut self, ours: Ours) -> &mut Watched {
        match ours {
            Ours::Plans => &mut self.intake.plans,
            Ours::Slices => &mut self.intake.fws,
        }
    }

    /// A watched object of ours arrived: queue it when it differs from what we want, and remember a
    /// change someone else made.
    fn after_seen(&mut self, object: ObjectRef, echo: Echo) {
        let synced = match object {
            ObjectRef::Plan(_) => self.intake.plans.synced,
            ObjectRef::Slice(_) => self.intake.fws.synced,
        };
        if echo == Echo::Stale || !synced || self.planning.planner.is_none() {
            return;
        }
        match self.desired_revision(&object) {
            Some(want) => {
                let current = self.tracker(&object).is_current(object.name(), &want);
                if !current {
                    if echo == Echo::Foreign {
                        self.intake.restored.push(object.clone());
                    }
                    self.queue.want(object, None, false);
                }
            }
            // A slice nobody wants (left from an earlier layout, or made by hand): delete it.
            None if matches!(object, ObjectRef::Slice(_)) => {
                self.queue.retire(object.name().to_string());
            }
            None => {}
        }
    }

    fn tracker(&self, object: &ObjectRef) -> &Tracker {
        match object {
            ObjectRef::Plan(_) => &self.intake.plans.tracker,
            ObjectRef::Slice(_) => &self.intake.fws.tracker,
        }
    }

    fn tracker_mut(&mut self, object: &ObjectRef) -> &mut Tracker {
        match object {
            ObjectRef::Plan(_) => &mut self.intake.plans.tracker,
            ObjectRef::Slice(_) => &mut self.intake.fws.tracker,
        }
    }

    /// An object of ours disappeared: queue it when it is still wanted.
    fn restore_if_wanted(&mut self, object: ObjectRef) {
        if self.desired_revision(&object).is_some() {
            self.intake.restored.push(object.clone());
            self.queue.want(object, None, false);
        }
    }

    /// Kinds whose last relist came back empty and awaits confirmation.
    pub fn suspects(&self) -> Vec<SuspectEmpty> {
        self.intake.suspects.iter().copied().collect()
    }

    /// An independent list confirmed the kind is really empty: forget its objects and re-plan.
    pub fn confirm_empty(&mut self, kind: SuspectEmpty) {
        if self.intake.suspects.remove(&kind) {
            match kind {
                SuspectEmpty::Services => self.intake.services.restore(Vec::new()),
                SuspectEmpty::Slices => self.intake.slices.restore(Vec::new()),
            }
            self.intake.rebuild = true;
        }
    }

    /// An independent list found objects: the empty relist was wrong; keep what we had.
    pub fn dismiss_suspect(&mut self, kind: SuspectEmpty) {
        self.intake.suspects.remove(&kind);
    }

    /// Objects someone else changed or deleted since the last call, for logs and metrics.
    pub fn take_restored(&mut self) -> Vec<ObjectRef> {
        std::mem::take(&mut self.intake.restored)
    }

    /// The revision the controller wants for an object, if it wants the object at all.
    fn desired_revision(&self, object: &ObjectRef) -> Option<String> {
        let planner = self.planning.planner.as_ref()?;
        match object {
            ObjectRef::Plan(node) => planner.plan_revision(node).map(str::to_string),
            ObjectRef::Slice(name) => planner.slice_revision(name),
        }
    }

    /// Every current Service problem, sorted by Service.
    pub fn problems(&self) -> impl Iterator<Item = &ServiceProblem> {
        self.planning.problems.values().flatten()
    }

    /// What an Event about `service` (`namespace/name`) refers to, if the Service is still cached.
    pub fn service_reference(&self, service: &str) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
        let cached = self.intake.services.get(service)?;
        Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: cached.metadata.namespace.clone(),
            name: cached.metadata.name.clone(),
            uid: cached.metadata.uid.clone(),
            ..Default::default()
        })
    }

    /// Runs the planner over what changed since the last run and queues the objects that changed.
    pub fn plan(&mut self) -> Result<PlanOutcome, Error> {
        if !self.synced() {
            return Ok(PlanOutcome::default());
        }
        let dirty = std::mem::take(&mut self.intake.dirty_services);
        let earliest = dirty.values().copied().fold(None, min_time);
        let now = Instant::now();
        for key in dirty.keys() {
            self.planning.changed_at.insert(key.clone(), now);
        }
        let (changes, full, services) = match self.planning.planner.as_mut() {
            Some(planner) if !self.intake.rebuild => {
                let mut by_service: BTreeMap<&str, Vec<&EndpointSlice>> =
                    dirty.keys().map(|k| (k.as_str(), Vec::new())).collect();
                for slice in self.intake.slices.values() {
                    if let Some(key) = service_of(slice)
                        && let Some(list) = by_service.get_mut(key.as_str())
                    {
                        list.push(slice);
                    }
                }
                let changes: Vec<ServiceChange<'_>> = by_service
                    .into_iter()
                    .map(|(key, slices)| (key, self.intake.services.get(key), slices))
                    .collect();
                for (key, service, slices) in &changes {
                    let problems = service
                        .map(|service| service_problems(service, slices, &self.config))
                        .unwrap_or_default();
                    if problems.is_empty() {
                        self.planning.problems.remove(*key);
                    } else {
                        self.planning.problems.insert(key.to_string(), problems);
                    }
                }
                (planner.replan_services(&changes)?, false, dirty.len())
            }
            _ => {
                // The old planner goes before the new one is built (a rebuild at 1,000 Nodes would
                // otherwise hold two); what the diff needs of it stays in `previous`.
                let previous = self
                    .planning
                    .previous
                    .take()
                    .or_else(|| self.planning.planner.take().map(|p| p.previous()));
                self.resolve_service_cidrs();
                let services: Vec<&Service> = self.intake.services.values().collect();
                let slices: Vec<&EndpointSlice> = self.intake.slices.values().collect();
                self.planning.problems =
                    problems_by_service(services.iter().copied(), slices.iter().copied(), &self.config);
                // Built after the previous layout: what its packed slices hold stays as written, so a
                // Node joining does not rewrite every packed slice a Service slice shadows. The
                // Service slices in the cluster are kept (adopted after a restart) until folded.
                let mut existing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                for name in self.intake.fws.tracker.names() {
                    if let Some((view, service)) = service_slice_of(name) {
                        existing.entry(view).or_default().insert(service);
                    }
                }
                let built = Planner::build_after(
                    &services,
                    &slices,
                    self.intake.nodes.values(),
                    &self.config,
                    previous.as_ref(),
                    &existing,
                );
                let planner = match built {
                    Ok(planner) => planner,
                    Err(error) => {
                        self.planning.previous = previous;
                        return Err(error);
                    }
                };
                let mut changes = planner.changes_since(previous.as_ref());
                // Level-triggered after a rebuild: an object the watches show differing from what is
                // wanted is written too, even when its wanted revision did not change (an edit or a
                // delete that arrived while a failed rebuild left no planner to judge it).
                let queued: BTreeSet<String> = changes.plans.iter().cloned().collect();
                changes.plans.extend(
                    planner
                        .plan_revisions()
                        .filter(|(node, want)| {
                            !queued.contains(*node) && !self.intake.plans.tracker.is_current(node, want)
                        })
                        .map(|(node, _)| node.to_string()),
                );
                let queued: BTreeSet<String> = changes.slices.iter().map(|c| c.name.clone()).collect();
                changes.slices.extend(
                    planner
                        .slice_revisions_iter()
                        .filter(|(name, want)| {
                            !queued.contains(name) && !self.intake.fws.tracker.is_current(name, want)
                        })
                        .map(|(name, _)| SliceChange { name, first: false }),
                );
                // Objects that exist but are no longer wanted (a restart after a layout change).
                let unwanted: Vec<String> = self
                    .intake
                    .fws
                    .tracker
                    .names()
                    .filter(|n| planner.slice_revision(n).is_none())
                    .cloned()
                    .collect();
                for name in unwanted {
                    self.queue.forget(&ObjectRef::Slice(name.clone()));
                    self.queue.retire_now(name);
                }
                self.planning.planner = Some(planner);
                self.intake.rebuild = false;
                (changes, true, 0)
            }
        };
        let mut outcome = self.queue(changes, earliest, full, services);
        if let Some((name, changes)) = self.fold_quiet(now)? {
            let folded = self.queue(changes, None, false, 0);
            outcome.slices.extend(folded.slices);
            outcome.folded = Some(name);
        }
        Ok(outcome)
    }

    fn queue(
        &mut self,
        changes: Changes,
        earliest: Option<Timestamp>,
        full: bool,
        services: usize,
    ) -> PlanOutcome {
        for change in &changes.slices {
            self.queue.unretire(&change.name);
            self.queue
                .want(ObjectRef::Slice(change.name.clone()), earliest, change.first);
        }
        for node in &changes.plans {
            self.queue.want(ObjectRef::Plan(node.clone()), earliest, false);
        }
        for name in &changes.retired {
            self.queue.forget(&ObjectRef::Slice(name.clone()));
            if self.intake.fws.tracker.get(name).is_some() {
                self.queue.retire(name.clone());
            }
        }
        PlanOutcome {
            changed: changes.plans,
            slices: changes.slices.into_iter().map(|c| c.name).collect(),
            full,
            services,
            diagnostics: changes.diagnostics,
            folded: None,
        }
    }

    /// The next object to handle and its trigger time, at `now`:
    /// 1. slices gaining an entry that moves between views (the slices losing it wait for them, even
    ///    while one of them backs off after a failed write: the entry must never be in neither);
    /// 2. other slices;
    /// 3. plans: those of nodes without one first (a new node must not wait behind a rollout), then the
    ///    longest-waiting; a plan queued longer than [`super::queue::PLAN_PATIENCE`] goes before
    ///    further slices, so sustained slice churn cannot starve plans;
    /// 4. slices no longer wanted, deleted once nothing else is queued (failed writes waiting for their
    ///    retry included), so a view never loses a slice before its replacements are written.
    ///
    /// Objects backing off after a failed write stay queued and are skipped until their time.
    pub fn next_pending(&mut self, now: Instant) -> Option<(ObjectRef, Option<Timestamp>)> {
        // Without a planner (a rebuild failed) nothing can be judged: the queue waits for the next one.
        let planner = self.planning.planner.as_ref()?;
        let (plans, fws) = (&self.intake.plans.tracker, &self.intake.fws.tracker);
        let judge = Judge {
            unwanted_slice: &|name| planner.slice_revision(name).is_none(),
            slice_exists: &|name| fws.get(name).is_some(),
            has_plan: &|node| plans.get(node).is_some(),
        };
        self.queue.take_next(now, &judge)
    }

    /// When the earliest object backing off after a failed write or delete may be tried again.
    pub fn next_retry(&self) -> Option<Instant> {
        self.queue.next_retry()
    }

    /// Puts an object back, keeping its trigger time: not before `not_before` (after a failed write), or
    /// at once (the write was cut short by losing the lease).
    pub fn requeue(&mut self, object: &ObjectRef, trigger: Option<Timestamp>, not_before: Option<Instant>) {
        let unwanted = matches!(object, ObjectRef::Slice(name)
            if self.planning.planner.as_ref().is_some_and(|p| p.slice_revision(name).is_none()));
        self.queue.requeue(object, trigger, not_before, unwanted);
    }

    /// What an object needs, comparing the desired revision with the observed object. `None` when it is
    /// up to date, or not planned (gone, or planning not done yet).
    pub fn work_for(&self, object: &ObjectRef, trigger: Option<Timestamp>) -> Option<Work> {
        let planner = self.planning.planner.as_ref()?;
        let mut work = match object {
            ObjectRef::Plan(node) => {
                let revision = planner.plan_revision(node)?;
                if self.intake.plans.tracker.is_current(node, revision) {
                    return None;
                }
                let uid = planner.node_info(node).and_then(|n| n.uid.clone());
                Work::ApplyPlan(plan_object(node, uid.as_deref(), planner.node_plan(node)?))
            }
            ObjectRef::Slice(name) => match planner.slice_revision(name) {
                Some(revision) if self.intake.fws.tracker.is_current(name, &revision) => return None,
                Some(_) => Work::ApplySlice(slice_object(name, planner.slice(name)?)),
                None if self.intake.fws.tracker.get(name).is_some() => {
                    return Some(Work::DeleteSlice(name.clone()));
                }
                None => return None,
            },
        };
        if let Some(trigger) = trigger {
            let meta = match &mut work {
                Work::ApplyPlan(o) => &mut o.metadata,
                Work::ApplySlice(o) => &mut o.metadata,
                Work::DeleteSlice(_) => return Some(work),
            };
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANNOTATION_TRIGGER_TIME.to_string(), trigger.to_string());
        }
        Some(work)
    }

    /// Plans whose Node is not in the cache: candidates for deletion once the Node is confirmed gone.
    pub fn orphans(&self) -> BTreeMap<String, Vec<String>> {
        if !self.intake.nodes.synced() {
            return BTreeMap::new();
        }
        let mut orphans: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, observed) in self.intake.plans.tracker.iter() {
            let node = observed.node.clone().unwrap_or_else(|| name.clone());
            if self.intake.nodes.get(&node).is_none() {
                orphans.entry(node).or_default().push(name.clone());
            }
        }
        orphans
    }

    /// Records a revision about to be written (its watch echo may come back before the response).
    pub fn intend(&mut self, object: &ObjectRef, revision: &str) {
        self.tracker_mut(object).intend(object.name(), revision);
    }

    /// Records that an object was written with the given revision and resourceVersion.
    pub fn written(&mut self, object: &ObjectRef, revision: &str, resource_version: Option<&str>) {
        // Written during a relist: the list may predate the write, which must not count as a deletion.
        let node = match object {
            ObjectRef::Plan(node) => {
                self.intake.plans.relist.note(node);
                Some(node.as_str())
            }
            ObjectRef::Slice(name) => {
                self.intake.fws.relist.note(name);
                None
            }
        };
        let name = object.name().to_string();
        self.tracker_mut(object)
            .written(&name, revision, resource_version, node);
    }

    /// Records that an object was deleted.
    pub fn deleted(&mut self, object: &ObjectRef) {
        let name = object.name().to_string();
        self.tracker_mut(object).remove(&name);
        if let ObjectRef::Slice(name) = object {
            self.queue.unretire(name);
        }
    }

    /// Services currently known (for the empty-relist guard and metrics).
    pub fn service_count(&self) -> usize {
        self.intake.services.len()
    }
}

/// The planner's view of a node, to ignore status-only updates.
/// The (view id, Service key) a Service slice's name stands for (`all.ns.web` → `all`, `ns/web`).
fn service_slice_of(name: &str) -> Option<(String, String)> {
    let (view, rest) = name.split_once('.')?;
    let (namespace, service) = rest.split_once('.')?;
    Some((view.to_string(), format!("{namespace}/{service}")))
}

fn planner_view(config: &Config, node: Option<&Node>) -> Option<NodeInfo> {
    let mut diag = Diagnostics::default();
    crate::planner::node_info(node?, config, &mut diag)
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

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::planner::fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, three_nodes};

    /// ns1/web: one port, one endpoint on node-a.
    fn web() -> (
        k8s_openapi::api::core::v1::Service,
        k8s_openapi::api::discovery::v1::EndpointSlice,
    ) {
        let svc = service("ns1", "web", "10.96.0.10", |s| {
            s.port("", 80, "TCP");
        });
        let eps = slice(
            "ns1",
            "web",
            &[("", 80, "TCP")],
            vec![endpoint("10.244.1.5", "node-a")],
        );
        (svc, eps)
    }

    fn synced_engine() -> Engine {
        let mut engine = Engine::new(Config::default());
        let (svc, eps) = web();
        engine.observe(Input::Service(Event::Init));
        engine.observe(Input::Service(Event::InitApply(svc.into())));
        engine.observe(Input::Service(Event::InitDone));
        engine.observe(Input::Slice(Event::Init));
        engine.observe(Input::Slice(Event::InitApply(eps.into())));
        engine.observe(Input::Slice(Event::InitDone));
        engine.observe(Input::Node(Event::Init));
        for node in three_nodes() {
            engine.observe(Input::Node(Event::InitApply(node.into())));
        }
        engine.observe(Input::Node(Event::InitDone));
        engine.observe(Input::ServiceCidr(Event::Init));
        engine.observe(Input::ServiceCidr(Event::InitDone));
        engine.observe(Input::Plan(Event::Init));
        engine.observe(Input::Plan(Event::InitDone));
        engine.observe(Input::ForwardingSlice(Event::Init));
        engine.observe(Input::ForwardingSlice(Event::InitDone));
        engine
    }

    fn service_cidr(name: &str, cidrs: &[&str]) -> Delivered<ServiceCIDR> {
        ServiceCIDR {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::networking::v1::ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
        .into()
    }

    fn header_cidrs(engine: &Engine, node: &str) -> Vec<String> {
        let planner = engine.planner().expect("planned");
        planner.node_plan(node).expect("plan").cluster.service_cidrs
    }

    /// ServiceCIDRs reach every plan's header; one overlapping a pod CIDR is ignored with a problem
    /// (its Event) and changes nothing else; an API server without ServiceCIDRs does not hold planning.
    #[test]
    fn service_cidrs_reach_every_plan_and_a_bad_one_is_ignored() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        assert!(header_cidrs(&engine, "node-a").is_empty());
        engine.observe(Input::ServiceCidr(Event::Apply(service_cidr(
            "kubernetes",
            &["10.96.0.0/16"],
        ))));
        engine.observe(Input::ServiceCidr(Event::Apply(service_cidr(
            "pods",
            &["10.244.0.0/16"],
        ))));
        assert!(engine.dirty());
        let outcome = engine.plan().unwrap();
        assert!(outcome.full);
        assert_eq!(
            outcome.changed.len(),
            3,
            "every plan's header changed: {outcome:?}"
        );
        for node in ["node-a", "node-b", "node-c"] {
            assert_eq!(header_cidrs(&engine, node), ["10.96.0.0/16"], "{node}");
        }
        let problems = engine.service_cidr_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].name, "pods");
        assert_eq!(problems[0].reason, "ServiceCIDROverlapsPodCIDR");

        let mut bare = Engine::new(Config::default());
        for input in [
            Input::Service(Event::Init),
            Input::Service(Event::InitDone),
            Input::Slice(Event::Init),
            Input::Slice(Event::InitDone),
            Input::Node(Event::Init),
            Input::Node(Event::InitDone),
            Input::Plan(Event::Init),
            Input::Plan(Event::InitDone),
            Input::ForwardingSlice(Event::Init),
            Input::ForwardingSlice(Event::InitDone),
        ] {
            bare.observe(input);
        }
        assert!(!bare.synced(), "waits for the ServiceCIDR list");
        bare.observe(Input::ServiceCidrsUnavailable);
        assert!(
            bare.synced(),
            "an API server without ServiceCIDRs does not hold planning"
        );
    }

    fn plan_ref(node: &str) -> ObjectRef {
        ObjectRef::Plan(node.into())
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
    fn the_first_planning_queues_every_object_and_bursts_coalesce() {
        let mut engine = synced_engine();
        let outcome = engine.plan().unwrap();
        assert!(outcome.full);
        assert_eq!(outcome.changed, vec!["node-a", "node-b", "node-c"]);
        assert_eq!(outcome.slices, vec!["all-0000", "zone-a-0000", "zone-b-0000"]);
        assert!(!engine.dirty());
        write_all(&mut engine);
        // Ten updates of one slice before the next tick: one incremental run for one Service, which
        // writes the Service's own slice (its packed copy in all-0000 stays) and the plans of the
        // nodes its endpoint moved between.
        for i in 0..10 {
            let eps = slice(
                "ns1",
                "web",
                &[("", 80, "TCP")],
                vec![endpoint(&format!("10.244.2.{}", 10 + i), "node-b")],
            );
            engine.observe(Input::Slice(Event::Apply(eps.into())));
        }
        let outcome = engine.plan().unwrap();
        assert!(!outcome.full);
        assert_eq!(outcome.services, 1);
        assert_eq!(outcome.slices, vec!["all.ns1.web"]);
        assert_eq!(
            outcome.changed,
            vec!["node-a", "node-b"],
            "endpointsOnNode of both changed"
        );
        assert_eq!(engine.queue_depth(), 3);
    }

    #[test]
    fn a_quiet_service_slice_is_folded_back_packed_slice_first_then_deleted() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        let moved = slice(
            "ns1",
            "web",
            &[("", 80, "TCP")],
            vec![endpoint("10.244.2.10", "node-b")],
        );
        engine.observe(Input::Slice(Event::Apply(moved.into())));
        assert_eq!(engine.plan().unwrap().slices, vec!["all.ns1.web"]);
        write_all(&mut engine);
        let now = Instant::now();
        assert!(engine.fold_quiet(now).unwrap().is_none(), "changed just now");
        let later = now + Duration::from_secs(601);
        let (name, changes) = engine
            .fold_quiet(later)
            .unwrap()
            .expect("quiet for sliceFoldAfter");
        assert_eq!(name, "all-0000");
        let written: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(written, ["all-0000"]);
        assert_eq!(changes.retired, ["all.ns1.web"]);
        assert!(
            engine.fold_quiet(later).unwrap().is_none(),
            "one fold per {FOLD_EVERY:?}, and nothing left to fold"
        );
        engine.queue(changes, None, false, 0);
        let order: Vec<ObjectRef> =
            std::iter::from_fn(|| engine.next_pending(later).map(|(o, _)| o)).collect();
        assert_eq!(
            order,
            [
                ObjectRef::Slice("all-0000".into()),
                ObjectRef::Slice("all.ns1.web".into())
            ],
            "the packed slice is written before its Service slice goes"
        );
    }

    #[test]
    fn slices_are_written_before_plans_and_new_nodes_before_other_plans() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        engine.written(&plan_ref("node-a"), "x", None);
        engine.written(&plan_ref("node-c"), "y", None);
        let mut order = Vec::new();
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            order.push(object);
        }
        assert!(matches!(&order[0], ObjectRef::Slice(_)));
        assert!(matches!(&order[2], ObjectRef::Slice(_)));
        assert_eq!(order[3], plan_ref("node-b"), "the node without a plan first");
    }

    #[test]
    fn node_status_churn_does_not_replan() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let mut node = three_nodes().remove(0);
        node.status.get_or_insert_with(Default::default).phase = Some("Running".into());
        engine.observe(Input::Node(Event::Apply(node.clone().into())));
        assert!(!engine.dirty());
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_NODE_ZONE.into(), "zone-z".into());
        engine.observe(Input::Node(Event::Apply(node.into())));
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

    /// Writes every pending object and feeds it back as the watches would.
    fn write_all(engine: &mut Engine) -> (Vec<NodeForwardingPlan>, Vec<ForwardingSlice>) {
        let (mut plans, mut slices) = (Vec::new(), Vec::new());
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            match engine.work_for(&object, None) {
                Some(Work::ApplyPlan(plan)) => {
                    engine.intend(&object, &plan.spec.revision);
                    engine.observe(Input::Plan(Event::Apply(plan.clone().into())));
                    plans.push(plan);
                }
                Some(Work::ApplySlice(slice)) => {
                    engine.intend(&object, &slice.spec.revision);
                    engine.observe(Input::ForwardingSlice(Event::Apply(slice.clone().into())));
                    slices.push(slice);
                }
                Some(Work::DeleteSlice(_)) => engine.deleted(&object),
                None => {}
            }
        }
        (plans, slices)
    }

    /// The writer's path: one `next` and one `finish` per write. Applied tickets leave nothing queued,
    /// a failed one is skipped until its retry time (and meanwhile keeps the queue from being empty),
    /// one cut short by a lost lease comes back at once, and a watch echo that arrives before its
    /// write's response queues nothing again. (Telling late echoes of older revisions from someone
    /// else's edit, which `next` recording the intent is for, is the tracker's tests' job.)
    #[test]
    fn tickets_take_two_calls_per_write_and_failures_come_back_at_their_time() {
        use super::super::ticket::{Done, Next};
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let depth = engine.queue_depth();
        assert!(depth >= 4, "slices and three plans: {depth}");
        let now = Instant::now();
        let Next::Write(first) = engine.next(now) else {
            panic!("work is queued")
        };
        assert!(
            matches!(first.object, ObjectRef::Slice(_)),
            "slices before plans: {first:?}"
        );
        assert!(first.revision().is_some(), "a slice to apply: {first:?}");
        let retry_at = now + Duration::from_secs(2);
        assert_eq!(engine.finish(&first, Done::Failed { retry_at }), depth);
        let mut written = Vec::new();
        // Each write's watch echo comes back before its response, as it may.
        let echo = |engine: &mut Engine, ticket: &super::super::ticket::Ticket| match &ticket.work {
            Some(Work::ApplyPlan(plan)) => engine.observe(Input::Plan(Event::Apply(plan.clone().into()))),
            Some(Work::ApplySlice(slice)) => {
                engine.observe(Input::ForwardingSlice(Event::Apply(slice.clone().into())))
            }
            other => panic!("only applies here: {other:?}"),
        };
        while let Next::Write(ticket) = engine.next(now) {
            assert_ne!(ticket.object, first.object, "backing off until {retry_at:?}");
            echo(&mut engine, &ticket);
            let left = engine.finish(
                &ticket,
                Done::Applied {
                    resource_version: Some("2".into()),
                },
            );
            assert_eq!(left, depth - 1 - written.len());
            written.push(ticket);
        }
        assert_eq!(written.len(), depth - 1);
        assert_eq!(
            engine.next(now),
            Next::Idle {
                retry_at: Some(retry_at)
            }
        );
        let Next::Write(again) = engine.next(retry_at) else {
            panic!("due again at its retry time")
        };
        assert_eq!(again.object, first.object);
        // Cut short by a lost lease: back at once.
        assert_eq!(engine.finish(&again, Done::NotLeader), 1);
        let Next::Write(again) = engine.next(retry_at) else {
            panic!("back at once")
        };
        assert_eq!(again.object, first.object);
        echo(&mut engine, &again);
        let applied = Done::Applied {
            resource_version: Some("1".into()),
        };
        assert_eq!(engine.finish(&again, applied), 0);
        assert!(
            engine.take_restored().is_empty(),
            "no echo was taken for someone else's edit"
        );
        assert_eq!(engine.next(retry_at), Next::Idle { retry_at: None });
    }

    #[test]
    fn a_relist_forgets_objects_deleted_while_the_watch_was_down() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let (plans, slices) = write_all(&mut engine);
        assert_eq!((plans.len(), slices.len()), (3, 3));
        assert!(
            engine.take_restored().is_empty(),
            "our own writes are not restores"
        );

        engine.observe(Input::Plan(Event::Init));
        for plan in plans
            .iter()
            .filter(|p| p.metadata.name.as_deref() != Some("node-b"))
        {
            engine.observe(Input::Plan(Event::InitApply(plan.clone().into())));
        }
        engine.observe(Input::Plan(Event::InitDone));
        engine.observe(Input::ForwardingSlice(Event::Init));
        for slice in slices
            .iter()
            .filter(|s| s.metadata.name.as_deref() != Some("all-0000"))
        {
            engine.observe(Input::ForwardingSlice(Event::InitApply(slice.clone().into())));
        }
        engine.observe(Input::ForwardingSlice(Event::InitDone));
        assert_eq!(
            engine.take_restored(),
            vec![plan_ref("node-b"), ObjectRef::Slice("all-0000".into())]
        );
        let mut applied = Vec::new();
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            if engine.work_for(&object, None).is_some() {
                applied.push(object);
            }
        }
        assert_eq!(
            applied,
            vec![ObjectRef::Slice("all-0000".into()), plan_ref("node-b")]
        );
    }

    #[test]
    fn late_echoes_of_our_own_writes_are_not_restores() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        // The first writes go out; their watch echoes are late.
        let mut echoes = Vec::new();
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            if let Some(Work::ApplyPlan(plan)) = engine.work_for(&object, None) {
                engine.intend(&object, &plan.spec.revision);
                engine.written(&object, &plan.spec.revision, Some("10"));
                echoes.push(plan);
            }
        }
        // A new endpoint on node-a: node-a's plan gets a new revision, written before the old echoes.
        let eps = slice(
            "ns1",
            "web",
            &[("", 80, "TCP")],
            vec![endpoint("10.244.1.5", "node-a"), endpoint("10.244.1.6", "node-a")],
        );
        engine.observe(Input::Slice(Event::Apply(eps.into())));
        engine.plan().unwrap();
        let mut newer = None;
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            if let Some(Work::ApplyPlan(plan)) = engine.work_for(&object, None) {
                engine.intend(&object, &plan.spec.revision);
                engine.written(&object, &plan.spec.revision, Some("20"));
                newer = Some(plan);
            }
        }
        // Now the watch delivers the older write (and an agent's status write on top of it), then the
        // newer one: no restores, nothing to rewrite.
        let old = echoes.remove(0);
        let mut status_echo = old.clone();
        status_echo.metadata.resource_version = Some("15".into());
        let mut old = old;
        old.metadata.resource_version = Some("10".into());
        engine.observe(Input::Plan(Event::Apply(old.into())));
        engine.observe(Input::Plan(Event::Apply(status_echo.into())));
        engine.observe(Input::Plan(Event::Apply(newer.unwrap().into())));
        assert!(engine.take_restored().is_empty());
        assert_eq!(engine.queue_depth(), 0, "nothing to rewrite");
    }

    #[test]
    fn an_outside_edit_is_restored_and_counted() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let (plans, _) = write_all(&mut engine);
        let mut edited = plans[0].clone();
        edited.spec.endpoints_on_node.push("10.9.9.9".into());
        engine.observe(Input::Plan(Event::Apply(edited.into())));
        assert_eq!(engine.take_restored(), vec![plan_ref("node-a")]);
        assert!(matches!(
            engine
                .next_pending(Instant::now())
                .and_then(|(o, _)| engine.work_for(&o, None)),
            Some(Work::ApplyPlan(_))
        ));
    }

    #[test]
    fn without_a_planner_nothing_is_handed_out_and_the_next_rebuild_repairs_what_changed_meanwhile() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        let (plans, slices) = write_all(&mut engine);
        // A failed rebuild leaves no planner (only the previous revisions): the queue waits.
        engine.planning.previous = engine.planning.planner.take().map(|p| p.previous());
        engine.intake.rebuild = true;
        let mut edited = plans[0].clone();
        edited.spec.endpoints_on_node.push("10.9.9.9".into());
        engine.observe(Input::Plan(Event::Apply(edited.into())));
        engine.observe(Input::ForwardingSlice(Event::Delete(slices[0].clone().into())));
        engine.queue.pending.insert(
            plan_ref("node-b"),
            super::super::queue::Pending::new(Instant::now()),
        );
        assert!(
            engine.next_pending(Instant::now()).is_none(),
            "nothing can be judged without a planner"
        );
        assert!(
            engine.queue.pending.contains_key(&plan_ref("node-b")),
            "and nothing queued is dropped"
        );
        // The next rebuild wants the same revisions as before, yet writes what differs from them.
        engine.queue.pending.clear();
        engine.plan().unwrap();
        let (rewritten, recreated) = write_all(&mut engine);
        let names = |objects: Vec<Option<String>>| objects.into_iter().flatten().collect::<Vec<_>>();
        assert_eq!(
            names(rewritten.into_iter().map(|p| p.metadata.name).collect()),
            ["node-a"]
        );
        assert_eq!(
            names(recreated.into_iter().map(|s| s.metadata.name).collect()),
            [slices[0].metadata.name.clone().unwrap()]
        );
    }

    #[test]
    fn a_slice_nobody_wants_is_deleted_after_the_writes() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        let (name, spec) = switchyard_api::testing::slice("all", 1, 2, vec![]);
        engine.observe(Input::ForwardingSlice(Event::Apply(
            slice_object(&name, spec).into(),
        )));
        let now = Instant::now();
        let (object, _) = engine.next_pending(now).unwrap();
        assert_eq!(object, ObjectRef::Slice("all-0001".into()));
        assert_eq!(
            engine.work_for(&object, None),
            Some(Work::DeleteSlice("all-0001".into()))
        );
        // The delete fails: it backs off like a write, never a tight loop.
        engine.requeue(&object, None, Some(now + Duration::from_secs(2)));
        assert_eq!(engine.next_pending(now), None);
        assert_eq!(engine.next_retry(), Some(now + Duration::from_secs(2)));
        assert_eq!(
            engine.next_pending(now + Duration::from_secs(2)).map(|(o, _)| o),
            Some(object)
        );
    }

    #[test]
    fn a_slice_left_from_an_earlier_layout_is_deleted_after_every_write() {
        let mut engine = Engine::new(Config::default());
        let (svc, eps) = web();
        let (name, spec) = switchyard_api::testing::slice("all", 3, 4, vec![]);
        for input in [
            Input::Service(Event::Init),
            Input::Service(Event::InitApply(svc.into())),
            Input::Service(Event::InitDone),
            Input::Slice(Event::Init),
            Input::Slice(Event::InitApply(eps.into())),
            Input::Slice(Event::InitDone),
            Input::Node(Event::Init),
            Input::Node(Event::InitDone),
            Input::ServiceCidr(Event::Init),
            Input::ServiceCidr(Event::InitDone),
            Input::Plan(Event::Init),
            Input::Plan(Event::InitDone),
            Input::ForwardingSlice(Event::Init),
            Input::ForwardingSlice(Event::InitApply(slice_object(&name, spec).into())),
            Input::ForwardingSlice(Event::InitDone),
        ] {
            engine.observe(input);
        }
        for node in three_nodes() {
            engine.observe(Input::Node(Event::Apply(node.into())));
        }
        engine.plan().unwrap();
        let mut order = Vec::new();
        while let Some((object, _)) = engine.next_pending(Instant::now()) {
            order.push(object);
        }
        assert_eq!(order.len(), 7, "{order:?}");
        assert_eq!(
            order.last(),
            Some(&ObjectRef::Slice("all-0003".into())),
            "{order:?}"
        );
    }

    #[test]
    fn a_failed_write_stays_queued_so_what_follows_it_waits() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        // The Service becomes zone-hinted: its entry moves from view all into the zone views, which
        // must be written before all's (empty) Service slice takes it out of all-0000.
        let hinted = slice(
            "ns1",
            "web",
            &[("", 80, "TCP")],
            vec![
                endpoint("10.244.1.5", "node-a").zone_hints(&["zone-a"]),
                endpoint("10.244.3.5", "node-c").zone_hints(&["zone-b"]),
            ],
        );
        engine.observe(Input::Slice(Event::Apply(hinted.into())));
        engine.plan().unwrap();
        let now = Instant::now();
        let (first, trigger) = engine.next_pending(now).unwrap();
        assert!(first.name().starts_with("zone-"), "{first}");
        // Its write fails: it backs off for 10 s, still queued.
        engine.requeue(&first, trigger, Some(now + Duration::from_secs(10)));
        let mut meanwhile = Vec::new();
        while let Some((object, _)) = engine.next_pending(now) {
            meanwhile.push(object);
        }
        assert!(
            !meanwhile.contains(&ObjectRef::Slice("all.ns1.web".into())),
            "view all lost the entry before the zone view gained it: {meanwhile:?}"
        );
        assert_eq!(engine.next_retry(), Some(now + Duration::from_secs(10)));
        let later = now + Duration::from_secs(10);
        let mut after = Vec::new();
        while let Some((object, _)) = engine.next_pending(later) {
            after.push(object);
        }
        assert_eq!(after.first(), Some(&first));
        assert!(
            after.contains(&ObjectRef::Slice("all.ns1.web".into())),
            "{after:?}"
        );
    }

    #[test]
    fn plans_of_unknown_nodes_are_only_candidates() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        engine.written(&plan_ref("node-x"), "abc", None);
        let orphans = engine.orphans();
        assert_eq!(orphans.keys().collect::<Vec<_>>(), vec!["node-x"]);
    }

    /// What node-a forwards, by entry name.
    fn forwarded(engine: &Engine) -> Vec<String> {
        let composed = engine.planner().unwrap().composed("node-a").unwrap().unwrap();
        composed.spec.services.iter().map(|s| s.name.clone()).collect()
    }

    /// An object as a watch delivers it when it does not decode.
    fn undecodable<K>(value: serde_json::Value) -> Delivered<K>
    where
        K: kube::Resource + serde::de::DeserializeOwned,
        K::DynamicType: Default,
        super::super::trim::Unread: switchyard_api::tolerant::Prune<K>,
    {
        let delivered: Delivered<K> = serde_json::from_value(value).unwrap();
        assert!(delivered.undecodable().is_some());
        delivered
    }

    fn broken_web() -> Delivered<Service> {
        undecodable(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns1"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": "eighty"}]},
        }))
    }

    /// A Service whose next version does not decode keeps its last good one: on an update (nothing to
    /// re-plan), through a relist (not taken for deleted), until a delete removes it by key.
    #[test]
    fn an_undecodable_service_keeps_its_last_good_version_until_deleted() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        let before = forwarded(&engine);
        assert_eq!(before.len(), 1, "{before:?}");

        engine.observe(Input::Service(Event::Apply(broken_web())));
        assert!(!engine.dirty(), "the last good version stays: nothing to re-plan");
        let broken = engine.take_broken();
        assert_eq!(broken.len(), 1);
        assert_eq!(
            (broken[0].object(), broken[0].path.as_str()),
            ("ns1/web".to_string(), "spec.ports[0].port")
        );
        engine.observe(Input::Service(Event::Apply(broken_web())));
        assert!(
            engine.take_broken().is_empty(),
            "the same breakage is reported once"
        );
        assert_eq!(
            engine.undecodable().len(),
            1,
            "it lasts: Events are published while it does"
        );

        // A relist that still cannot read it: carried over, not deleted (no suspect empty relist either).
        engine.observe(Input::Service(Event::Init));
        engine.observe(Input::Service(Event::InitApply(broken_web())));
        engine.observe(Input::Service(Event::InitDone));
        assert!(engine.suspects().is_empty());
        assert_eq!(engine.service_count(), 1);
        let outcome = engine.plan().unwrap();
        assert!(
            outcome.full && outcome.changed.is_empty() && outcome.slices.is_empty(),
            "{outcome:?}"
        );
        assert_eq!(forwarded(&engine), before);
        assert!(engine.take_broken().is_empty(), "still the same breakage");

        // Deleted while undecodable: removed by key, and its entries go.
        engine.observe(Input::Service(Event::Delete(broken_web())));
        assert_eq!(engine.service_count(), 0);
        assert!(engine.undecodable().is_empty());
        engine.plan().unwrap();
        assert!(forwarded(&engine).is_empty());
    }

    /// An EndpointSlice and a Node that stop decoding change nothing that is planned.
    #[test]
    fn an_undecodable_slice_or_node_changes_nothing() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        let before = forwarded(&engine);
        engine.observe(Input::Slice(Event::Apply(undecodable(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns1",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": "10.244.1.9"}],
        })))));
        engine.observe(Input::Node(Event::Apply(undecodable(serde_json::json!({
            "metadata": {"name": "node-a"},
            "spec": {"podCIDRs": "10.244.1.0/24"},
        })))));
        assert!(!engine.dirty());
        let kinds: Vec<String> = engine.take_broken().iter().map(|u| u.kind.clone()).collect();
        assert_eq!(kinds, ["EndpointSlice", "Node"]);
        assert_eq!(forwarded(&engine), before);
    }

    /// One of our plans that does not decode (someone wrote it so) is rewritten.
    #[test]
    fn an_undecodable_plan_of_ours_is_restored() {
        let mut engine = synced_engine();
        engine.plan().unwrap();
        write_all(&mut engine);
        engine.take_restored();
        engine.observe(Input::Plan(Event::Apply(undecodable(serde_json::json!({
            "metadata": {"name": "node-a", "labels": {"switchyard.io/node": "node-a"}},
            "spec": {"nodeName": "node-a", "backend": "iptables", "cluster": {}, "revision": 7},
        })))));
        assert_eq!(engine.take_restored(), [plan_ref("node-a")]);
        assert_eq!(engine.take_broken().len(), 1);
        let (object, _) = engine.next_pending(Instant::now()).unwrap();
        assert_eq!(object, plan_ref("node-a"));
        assert!(matches!(engine.work_for(&object, None), Some(Work::ApplyPlan(_))));
    }
}
