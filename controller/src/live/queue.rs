//! The write queue: which of our objects wait for a write or a delete, in which order, and which back
//! off after a failure. It holds names and times only; what an object needs is the engine's to say.
//!
//! ```text
//! plan() changes, watch (edited, deleted, relisted) ─► want(object, trigger, first) ─► pending
//! slices no longer wanted ─► retire(name) ─► retired (deleted once nothing is pending)
//! take_next(now, judge) ─► 1. slices gaining a moving entry  2. other slices  3. plans (new nodes'
//!                          first; one waiting ≥ PLAN_PATIENCE before further slices)  4. retired slices
//! requeue(object, trigger, not_before) ─► back in its old place (its order and `first` kept)
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::object::ObjectRef;

/// How long a plan waits behind slices at most: under sustained churn at the write budget, slices
/// alone could otherwise starve plans (a new node's, a Local endpoint's override).
pub const PLAN_PATIENCE: Duration = Duration::from_secs(5);

/// Work waiting for one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    trigger: Option<Timestamp>,
    /// Written before other slices (it gains an entry another slice is about to lose).
    first: bool,
    /// When it was queued: a plan waiting longer than [`PLAN_PATIENCE`] goes before further slices.
    queued: Instant,
    /// After a failed write: not before this (it stays queued, so the order behind it holds).
    not_before: Option<Instant>,
}

impl Pending {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            trigger: None,
            first: false,
            queued: now,
            not_before: None,
        }
    }
}

/// What the queue asks of the engine while it picks the next object.
pub(super) struct Judge<'a> {
    /// No slice of this name is planned any more.
    pub unwanted_slice: &'a dyn Fn(&str) -> bool,
    /// A slice of this name exists in the API server.
    pub slice_exists: &'a dyn Fn(&str) -> bool,
    /// This node has a plan in the API server.
    pub has_plan: &'a dyn Fn(&str) -> bool,
}

/// Objects waiting for a write (pending) or a delete (retired).
#[derive(Debug, Default)]
pub(super) struct WriteQueue {
    pub(super) pending: BTreeMap<ObjectRef, Pending>,
    /// Slices to delete once nothing waits to be written; the time is a failed delete's retry.
    retired: BTreeMap<String, Option<Instant>>,
    /// The object last handed out by `take_next`, as it was queued: a requeue restores it whole
    /// (its place in the order, whether it goes first).
    in_flight: Option<(ObjectRef, Pending)>,
}

impl WriteQueue {
    /// Objects waiting for a write or a delete.
    pub(super) fn depth(&self) -> usize {
        self.pending.len() + self.retired.len()
    }

    /// Queues a write of `object` (kept where it is when already queued), with the earliest trigger.
    pub(super) fn want(&mut self, object: ObjectRef, trigger: Option<Timestamp>, first: bool) {
        let pending = self
            .pending
            .entry(object)
            .or_insert_with(|| Pending::new(Instant::now()));
        pending.trigger = min_time(pending.trigger, trigger);
        pending.first |= first;
    }

    /// No write of `object` is wanted any more.
    pub(super) fn forget(&mut self, object: &ObjectRef) {
        self.pending.remove(object);
    }

    /// The slice `name` is to be deleted once nothing waits to be written.
    pub(super) fn retire(&mut self, name: String) {
        self.retired.entry(name).or_insert(None);
    }

    /// The slice `name` is to be deleted, at once (a failed delete's back-off forgotten).
    pub(super) fn retire_now(&mut self, name: String) {
        self.retired.insert(name, None);
    }

    /// The slice `name` is no longer to be deleted (wanted again, or gone).
    pub(super) fn unretire(&mut self, name: &str) {
        self.retired.remove(name);
    }

    /// The next object to handle and its trigger time, at `now` (the order: see the module doc).
    /// Objects backing off after a failed write stay queued and are skipped until their time.
    pub(super) fn take_next(
        &mut self,
        now: Instant,
        judge: &Judge<'_>,
    ) -> Option<(ObjectRef, Option<Timestamp>)> {
        // Queued slices nobody wants any more (listed at start, left from an earlier layout) are deletes.
        let unwanted: Vec<ObjectRef> = self
            .pending
            .keys()
            .filter(|o| matches!(o, ObjectRef::Slice(name) if (judge.unwanted_slice)(name)))
            .cloned()
            .collect();
        for object in unwanted {
            self.pending.remove(&object);
            if (judge.slice_exists)(object.name()) {
                self.retired.entry(object.name().to_string()).or_insert(None);
            }
        }
        let first_waiting = self
            .pending
            .iter()
            .any(|(o, p)| matches!(o, ObjectRef::Slice(_)) && p.first);
        let rank = |object: &ObjectRef, p: &Pending| -> u8 {
            match object {
                ObjectRef::Slice(_) if p.first => 0,
                ObjectRef::Plan(_) if now.saturating_duration_since(p.queued) >= PLAN_PATIENCE => 0,
                ObjectRef::Slice(_) => 1,
                ObjectRef::Plan(name) if !(judge.has_plan)(name) => 2,
                ObjectRef::Plan(_) => 3,
            }
        };
        let next = self
            .pending
            .iter()
            .filter(|(_, p)| p.not_before.is_none_or(|at| at <= now))
            .filter(|(o, p)| !first_waiting || p.first || matches!(o, ObjectRef::Plan(_)))
            .min_by_key(|(object, p)| (rank(object, p), p.trigger.is_none(), p.trigger, (*object).clone()))
            .map(|(object, _)| object.clone());
        if let Some(object) = next {
            let pending = self.pending.remove(&object)?;
            self.in_flight = Some((object.clone(), pending));
            return Some((object, pending.trigger));
        }
        if !self.pending.is_empty() {
            return None;
        }
        let name = self
            .retired
            .iter()
            .find(|(_, at)| at.is_none_or(|at| at <= now))
            .map(|(name, _)| name.clone())?;
        self.retired.remove(&name);
        Some((ObjectRef::Slice(name), None))
    }

    /// When the earliest object backing off after a failed write or delete may be tried again.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.pending
            .values()
            .filter_map(|p| p.not_before)
            .chain(self.retired.values().flatten().copied())
            .min()
    }

    /// Puts an object back, keeping its trigger time: not before `not_before` (after a failed write), or
    /// at once (the write was cut short by losing the lease). A slice no longer wanted (`unwanted`)
    /// goes back as a delete.
    pub(super) fn requeue(
        &mut self,
        object: &ObjectRef,
        trigger: Option<Timestamp>,
        not_before: Option<Instant>,
        unwanted: bool,
    ) {
        if let (ObjectRef::Slice(name), true) = (object, unwanted) {
            // A failed delete backs off like a failed write.
            self.retired.insert(name.clone(), not_before);
            return;
        }
        let was = self
            .in_flight
            .take_if(|(o, _)| o == object)
            .map(|(_, p)| p)
            .unwrap_or_else(|| Pending::new(Instant::now()));
        let pending = self.pending.entry(object.clone()).or_insert(was);
        pending.first |= was.first;
        pending.trigger = min_time(pending.trigger, min_time(was.trigger, trigger));
        pending.not_before = not_before;
    }
}

/// The earlier of two optional times.
pub(super) fn min_time(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
