//! The backend-neutral sync logic: which plan to apply, full or partial, what to do on failure, and
//! the status that results.
//!
//! ```text
//! plan + slices ─► composition ─► Incomplete ───────────────────► IncompleteView (rules stay)
//!                      │          (invalid or unreadable slice: last good copy used, reported in failures)
//!                      ▼ validate ─► plan problems ──────────► InvalidPlan (rules stay)
//!                      │            entry problems ─► skip set, status.failures
//!                      ▼
//!     full? = start | after a failure | drift | full-sync period due      (else partial)
//!                      ▼
//!               Dataplane::sync ─► Ok ─► Applied; queued to the conntrack worker: stale UDP entries if UDP
//!                                       endpoints changed, flows of endpoints that left their Service;
//!                                       after a full sync: conntrack's sysctls (ConntrackSysctls)
//!                               └► Err ─► ApplyFailed (rules stay), retry full after 1 s, 2 s, … 30 s
//! check_drift ─► Dataplane::check_drift ─► drift ─► full sync of the applied plan, driftRepairs += 1
//! resync_if_due ─► full-sync period over ─► full sync of the applied plan
//! ```
//!
//! Time comes from a [`Clock`]; nothing here sleeps, and the only thread is the conntrack worker's. The
//! caller (the run loop, or `apply`) decides when to call [`Syncer::sync`] (a new plan, or [`Syncer::retry_due`]), [`Syncer::resync_if_due`]
//! (often; it checks the full-sync period itself) and [`Syncer::check_drift`] (every resync period).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use switchyard_api::conditions::{APPLIED, DEGRADED, DRAINED, reasons, status as cond};
use switchyard_api::validate::{MAX_REVISION, validate};
use switchyard_api::{
    Backend, EntryKey, NodeForwardingPlanSpec, NodeForwardingPlanStatus, ObservedSlices, PlanCondition,
    ServiceFailure, SyncMode,
};

use super::backoff::Backoff;
use super::clock::{Clock, rfc3339};
use super::composition::{Composition, LastGood, SliceObject, compose_plan};
use super::conntrack_sysctls::ConntrackSysctls;
use super::conntrack_worker::{ConntrackWorker, Job};
use super::dataplane::{Cleanup, Dataplane, SyncRequest};
use super::drain::{COUNT_EVERY, Drain};
use super::metrics::{
    KindLabel, ModeFamilyLabel, ModeLabel, PolicyFamilyLabel, SyncMetrics, no_local_endpoints,
};
use super::status_fields::{MAX_REASON, cap_failures, entry_failures, set_condition, short};
use crate::conntrack::{Conntrack, ConntrackSettings, removed_endpoints, udp_fingerprints, udp_targets};
use crate::error::Error;
use crate::verify::Verifier;
use crate::verify::worker::Subject;

/// Timing of the sync loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncConfig {
    /// A full sync at least this often (kube-proxy: 1 h).
    pub full_sync_period: Duration,
    /// First retry delay after a failed sync.
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// A failure older than this makes the proxy unhealthy (kube-proxy: 2 × syncPeriod).
    pub health_timeout: Duration,
    /// Why syncs cannot work here, said before every failure's message: the capabilities this
    /// process lacks ([`crate::capabilities::explain`]).
    pub missing_capabilities: Option<String>,
    /// Whether a failed sync will be tried again (the run loop); `false` for a one-shot `apply`, whose
    /// status and log then promise no retry.
    pub retries: bool,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            full_sync_period: Duration::from_secs(3600),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            health_timeout: Duration::from_secs(60),
            missing_capabilities: None,
            retries: true,
        }
    }
}

/// What one call did.
#[derive(Debug, Clone, PartialEq)]
pub enum SyncResult {
    /// The plan is programmed (possibly without some invalid entries).
    Applied {
        /// Full or partial.
        mode: SyncMode,
        /// Wall time the sync took.
        duration: Duration,
        /// Rules programmed.
        rules: u64,
        /// Entries skipped as invalid.
        skipped: usize,
        /// Set when this sync repaired drift.
        drift: Option<String>,
    },
    /// The plan was not applied (invalid, unreadable, incomplete views); the last good rules stay.
    Rejected {
        /// `InvalidPlan` or `IncompleteView`.
        reason: &'static str,
        /// Why.
        message: String,
    },
    /// The kernel refused the rules; the last good rules stay and a full sync will be retried.
    Failed {
        /// The error, shortened.
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Last {
    Never,
    Applied,
    Rejected { reason: &'static str, message: String },
    Failed { message: String, since: Instant },
}

/// A failed drift repair or periodic full sync waiting for its retry.
#[derive(Debug, Clone)]
struct PendingReapply {
    /// The drift it was repairing (counted when the retry succeeds).
    drift: Option<String>,
    /// The outcome before the first attempt, so a rejection of a newer plan stays visible.
    before: Last,
}

/// What a composed plan brings besides its spec: the slices it came from and what was wrong with them.
#[derive(Debug, Clone, Default, PartialEq)]
struct Composed {
    slices: Option<ObservedSlices>,
    failures: Vec<ServiceFailure>,
}

/// What the kernel holds: the last plan applied successfully.
#[derive(Debug, Clone)]
struct Applied {
    spec: Arc<NodeForwardingPlanSpec>,
    composed: Composed,
    skip: HashSet<usize>,
    entry_failures: Vec<ServiceFailure>,
    services: u32,
    endpoints: u32,
    rules: u64,
    udp: BTreeMap<EntryKey, u64>,
    at: SystemTime,
    duration: Duration,
    mode: SyncMode,
}

/// The sync loop's state and decisions over one [`Dataplane`].
pub struct Syncer {
    dataplane: Box<dyn Dataplane>,
    conntrack: Option<ConntrackWorker>,
    conntrack_sysctls: Option<ConntrackSysctls>,
    clock: Arc<dyn Clock>,
    config: SyncConfig,
    metrics: SyncMetrics,
    applied: Option<Applied>,
    need_full: bool,
    last_full: Option<Instant>,
    backoff: Backoff,
    retry_at: Option<Instant>,
    last: Last,
    conditions: Vec<PlanCondition>,
    drift_repairs: u64,
    extra_failures: Vec<ServiceFailure>,
    /// Why the last write of the plan cache failed, while it does.
    cache_problem: Option<String>,
    /// Which conntrack sysctls the last full sync could not set, while it could not.
    sysctl_problem: Option<String>,
    /// Which kube-proxy ports another program holds, while it does.
    port_problem: Option<String>,
    /// While the applied plan says the node is leaving: its drain.
    drain: Option<Drain>,
    /// When the leaving node's connections are counted next.
    drain_count_at: Option<Instant>,
    /// A full sync of the applied plan (drift repair or periodic) failed: it is retried with the
    /// backoff, carrying the drift it was repairing.
    failed_reapply: Option<PendingReapply>,
    /// The last copy of each slice that passed validation.
    last_good: LastGood,
    /// The backend whose switch the dataplane refuses, while it does (each refusal counted once).
    refused_switch: Option<Backend>,
    /// Verifies the backend in use after each switch (status.verification).
    verifier: Option<Verifier>,
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Syncer")
            .field("backend", &self.dataplane.backend())
            .field("last", &self.last)
            .field("need_full", &self.need_full)
            .field("drift_repairs", &self.drift_repairs)
            .finish_non_exhaustive()
    }
}

impl Syncer {
    /// A syncer that has applied nothing yet: its first sync is full.
    pub fn new(
        dataplane: Box<dyn Dataplane>,
        clock: Arc<dyn Clock>,
        config: SyncConfig,
        metrics: SyncMetrics,
    ) -> Self {
        let backoff = Backoff::new(config.retry_min, config.retry_max);
        Self {
            dataplane,
            conntrack: None,
            conntrack_sysctls: None,
            clock,
            config,
            metrics,
            applied: None,
            need_full: true,
            last_full: None,
            backoff,
            retry_at: None,
            last: Last::Never,
            conditions: Vec::new(),
            drift_repairs: 0,
            extra_failures: Vec::new(),
            cache_problem: None,
            sysctl_problem: None,
            port_problem: None,
            drain: None,
            drain_count_at: None,
            failed_reapply: None,
            last_good: LastGood::default(),
            refused_switch: None,
            verifier: None,
        }
    }

    /// Verifies the backend in use whenever it is not the one verified last (the first sync, a
    /// switch): the kernel against the plan, probes, then refusals for a while ([`Verifier`]).
    pub fn with_verifier(mut self, verifier: Verifier) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Takes the verifier's results and queues a refusal count when one is due. True when the
    /// status' verification changed.
    pub fn tick_verification(&mut self) -> bool {
        let (Some(verifier), now, wall) = (&mut self.verifier, self.clock.now(), self.clock.wall()) else {
            return false;
        };
        let (applied, backend) = (&self.applied, self.dataplane.backend());
        let subject = || {
            applied.as_ref().map(|a| Subject {
                spec: Arc::clone(&a.spec),
                skip: Arc::new(a.skip.clone()),
                backend,
            })
        };
        let changed = verifier.tick(now, wall, subject);
        if verifier.take_recheck()
            && let Some(subject) = subject()
        {
            let dataplane = &mut self.dataplane;
            verifier.after_sync(subject, now, wall, || dataplane.kernel_view());
        }
        changed
    }

    /// Waits until the verifier's worker has run everything queued so far.
    pub fn settle_verification(&self) {
        if let Some(verifier) = &self.verifier {
            verifier.settle();
        }
    }

    /// Cleans conntrack through `conntrack` after syncs (stale UDP entries, flows of removed
    /// endpoints), on a worker thread of its own ([`ConntrackWorker`]).
    pub fn with_conntrack(mut self, conntrack: Box<dyn Conntrack>) -> Self {
        self.conntrack = Some(ConntrackWorker::start(conntrack, self.metrics.clone()));
        self
    }

    /// Keeps conntrack's sysctls as `settings` ask through `sysctls`, after every full sync
    /// ([`ConntrackSysctls`]); a failure shows as Degraded (ConntrackSysctlFailed) while nothing worse is.
    pub fn with_conntrack_sysctls(
        mut self,
        sysctls: Box<dyn crate::sysctl::Sysctls>,
        settings: ConntrackSettings,
    ) -> Self {
        self.conntrack_sysctls = Some(ConntrackSysctls::new(sysctls, settings));
        self
    }

    /// Conntrack entries the worker has cleared since the start (both reasons).
    pub fn conntrack_cleared(&self) -> u64 {
        self.conntrack.as_ref().map_or(0, ConntrackWorker::cleared)
    }

    /// Waits until the conntrack cleanups of every sync so far have run.
    pub fn settle_conntrack(&self) {
        if let Some(worker) = &self.conntrack {
            worker.settle();
        }
    }

    /// Applies a node's plan composed with its views' slices.
    pub fn sync(&mut self, plan: &Arc<NodeForwardingPlanSpec>, slices: &[SliceObject]) -> SyncResult {
        self.sync_with(plan, slices, &[])
    }

    /// [`Self::sync`], where some slices of the views could not be read (their last good copies, if
    /// any, are among `slices`): each is a slice problem in the status, as an invalid slice is.
    pub fn sync_with(
        &mut self,
        plan: &Arc<NodeForwardingPlanSpec>,
        slices: &[SliceObject],
        unreadable: &[ServiceFailure],
    ) -> SyncResult {
        match compose_plan(plan, slices, &mut self.last_good) {
            Composition::Incomplete(why) if unreadable.is_empty() => self.reject(
                reasons::INCOMPLETE_VIEW,
                format!("plan {} not applied: {why}", short(&plan.revision, MAX_REVISION)),
            ),
            Composition::Incomplete(why) => {
                let bad: Vec<String> = unreadable
                    .iter()
                    .map(|f| format!("{}: {}", f.service, f.reason))
                    .collect();
                self.reject(
                    reasons::INCOMPLETE_VIEW,
                    format!(
                        "plan {} not applied: {why} ({})",
                        short(&plan.revision, MAX_REVISION),
                        bad.join("; ")
                    ),
                )
            }
            Composition::Ready {
                spec,
                slices,
                failures,
            } => {
                let failures = unreadable.iter().cloned().chain(failures).collect();
                self.apply(spec, None, Composed { slices, failures })
            }
        }
    }

    /// Applies a self-contained plan (no views).
    pub fn sync_plan(&mut self, plan: &Arc<NodeForwardingPlanSpec>) -> SyncResult {
        self.sync(plan, &[])
    }

    /// Records that the plan input could not be used at all (unreadable or unparseable file).
    pub fn reject_input(&mut self, message: String) -> SyncResult {
        self.reject(reasons::INVALID_PLAN, message)
    }

    /// Compares the kernel with what was applied; on a difference runs a full sync of the applied plan
    /// and counts a drift repair. `None` when there was nothing to check or nothing differed.
    pub fn check_drift(&mut self) -> Option<SyncResult> {
        if self.need_full || matches!(self.last, Last::Failed { .. }) {
            // A full sync is pending anyway.
            return None;
        }
        let applied = self.applied.as_ref()?;
        let (spec, composed) = (Arc::clone(&applied.spec), applied.composed.clone());
        self.metrics.drift_checks.inc();
        match self.dataplane.check_drift() {
            Ok(None) => None,
            Ok(Some(drift)) => {
                tracing::warn!(%drift, "kernel state drifted from the applied plan; repairing with a full sync");
                Some(self.reapply(spec, composed, Some(drift.to_string())))
            }
            Err(e) => {
                tracing::warn!(error = %e, "drift check failed");
                None
            }
        }
    }

    /// Runs the periodic full sync when it is due: the applied plan again, rewritten whole (a newer plan
    /// that was rejected stays rejected). `None` when not due, or when a retry is pending instead.
    pub fn resync_if_due(&mut self) -> Option<SyncResult> {
        if self.need_full || matches!(self.last, Last::Failed { .. }) || !self.full_sync_due() {
            return None;
        }
        let applied = self.applied.as_ref()?;
        let (spec, composed) = (Arc::clone(&applied.spec), applied.composed.clone());
        tracing::info!("periodic full sync");
        Some(self.reapply(spec, composed, None))
    }

    /// Retries a failed drift repair or periodic full sync once its backoff is due. `None` when no such
    /// retry is pending or due (a failed new plan is retried by calling [`Self::sync`] again).
    pub fn retry_reapply_if_due(&mut self) -> Option<SyncResult> {
        if self.failed_reapply.is_none() || !self.retry_due() {
            return None;
        }
        let applied = self.applied.as_ref()?;
        let (spec, composed) = (Arc::clone(&applied.spec), applied.composed.clone());
        let pending = self.failed_reapply.take()?;
        tracing::info!(
            drift = pending.drift.is_some(),
            "retrying the full sync of the applied plan"
        );
        Some(self.reapply_from(spec, composed, pending.drift, pending.before))
    }

    /// Applies the already applied plan again (drift repair, periodic full sync), keeping a rejection
    /// of a newer plan visible.
    fn reapply(
        &mut self,
        spec: Arc<NodeForwardingPlanSpec>,
        composed: Composed,
        drift: Option<String>,
    ) -> SyncResult {
        let before = self.last.clone();
        self.reapply_from(spec, composed, drift, before)
    }

    fn reapply_from(
        &mut self,
        spec: Arc<NodeForwardingPlanSpec>,
        composed: Composed,
        drift: Option<String>,
        before: Last,
    ) -> SyncResult {
        self.need_full = true;
        let result = self.apply(spec, drift.clone(), composed);
        if matches!(result, SyncResult::Failed { .. }) {
            self.failed_reapply = Some(PendingReapply { drift, before });
            return result;
        }
        if matches!(result, SyncResult::Applied { .. }) && matches!(before, Last::Rejected { .. }) {
            self.last = before;
            self.update_conditions();
        }
        result
    }

    /// A failed sync's retry is due.
    pub fn retry_due(&self) -> bool {
        self.retry_at.is_some_and(|at| self.clock.now() >= at)
    }

    /// When the failed sync will be retried.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The periodic full sync is due.
    pub fn full_sync_due(&self) -> bool {
        self.applied.is_some()
            && self
                .last_full
                .is_none_or(|at| self.clock.now() >= at + self.config.full_sync_period)
    }

    /// The proxy is healthy: something was applied and no failure has lasted longer than the health
    /// timeout (kube-proxy's `/healthz` semantics).
    pub fn healthy(&self) -> bool {
        match &self.last {
            Last::Failed { since, .. } => {
                self.applied.is_some() && self.clock.now() < *since + self.config.health_timeout
            }
            _ => self.applied.is_some(),
        }
    }

    /// What the kernel holds, as [`crate::source::PlanSet::fingerprint`] spells it: the plan revision,
    /// and the digest of the slices composed when there were any.
    pub fn applied_fingerprint(&self) -> Option<String> {
        let applied = self.applied.as_ref()?;
        Some(match &applied.composed.slices {
            Some(slices) => format!("{}/{}", applied.spec.revision, slices.digest),
            None => applied.spec.revision.clone(),
        })
    }

    /// The plan the kernel holds and the entries skipped from it.
    pub fn applied(&self) -> Option<(&Arc<NodeForwardingPlanSpec>, &HashSet<usize>)> {
        self.applied.as_ref().map(|a| (&a.spec, &a.skip))
    }

    /// The backend in use: the plan's, or the one this agent fell back to.
    pub fn backend(&self) -> Backend {
        self.dataplane.backend()
    }

    /// Before the first sync: the backend an earlier run had programmed ([`Dataplane::resume`]).
    pub fn resume_backend(&mut self, in_use: Backend) {
        self.dataplane.resume(in_use);
    }

    /// Failures found outside the sync (health-check ports that could not be bound); listed in the
    /// status after the entry failures.
    pub fn set_extra_failures(&mut self, failures: Vec<ServiceFailure>) {
        if failures != self.extra_failures {
            self.extra_failures = failures;
            self.update_conditions();
        }
    }

    /// Reports that writing the plan cache fails (`Some(why)`) or works again (`None`): shown as
    /// Degraded (reason CacheWriteFailed) while nothing worse is.
    pub fn set_cache_problem(&mut self, problem: Option<String>) {
        if problem != self.cache_problem {
            self.cache_problem = problem;
            self.update_conditions();
        }
    }

    /// Reports that a kube-proxy port is held by another program (`Some(why)`) or served again
    /// (`None`): shown as Degraded (reason PortUnavailable) while nothing worse is. Returns true when
    /// that changed.
    pub fn set_port_problem(&mut self, problem: Option<String>) -> bool {
        if problem == self.port_problem {
            return false;
        }
        self.port_problem = problem;
        self.update_conditions();
        true
    }

    /// The drain, while the applied plan says the node is leaving.
    pub fn drain(&self) -> Option<&Drain> {
        self.drain.as_ref()
    }

    /// While the node is leaving: asks the conntrack worker for a count every [`COUNT_EVERY`], and
    /// takes the newest that arrived. Returns true when the status changed (a count, or the grace
    /// period ended).
    pub fn tick_drain(&mut self) -> bool {
        let (Some(drain), Some(applied)) = (&mut self.drain, &self.applied) else {
            return false;
        };
        let now = self.clock.now();
        let wall = self.clock.wall();
        let mut changed = false;
        if let Some(worker) = &self.conntrack {
            if let Some(count) = worker.take_drain_count() {
                changed |= drain.counted(count, wall);
            }
            if self.drain_count_at.is_none_or(|at| now >= at) {
                self.drain_count_at = Some(now + COUNT_EVERY);
                let entrances = crate::conntrack::drain::entrances(&applied.spec, &applied.skip);
                worker.submit(Job::CountDrain(entrances));
            }
        }
        let before = self
            .conditions
            .iter()
            .find(|c| c.type_ == DRAINED)
            .map(|c| c.status.clone());
        let (status, _, _) = drain.condition(wall);
        if changed || before.as_deref() != Some(status) {
            self.update_conditions();
            return true;
        }
        false
    }

    /// Starts, follows or ends the drain as the newly applied plan says.
    fn follow_leaving(&mut self, spec: &NodeForwardingPlanSpec) {
        match (&spec.leaving, &mut self.drain) {
            (Some(leaving), Some(drain)) => drain.update(leaving),
            (Some(leaving), None) => {
                tracing::warn!(reason = %leaving.reason, grace_s = leaving.drain_grace_seconds,
                    "this node is leaving: kube-proxy's /healthz answers 503; counting the connections still going through it");
                self.drain = Some(Drain::start(leaving, self.clock.wall()));
                self.drain_count_at = None;
            }
            (None, Some(_)) => {
                tracing::info!("this node is no longer leaving");
                self.drain = None;
                self.conditions.retain(|c| c.type_ != DRAINED);
            }
            (None, None) => {}
        }
    }

    /// The metrics this syncer updates.
    pub fn metrics(&self) -> &SyncMetrics {
        &self.metrics
    }

    /// Removes everything the backend owns, and forgets what was applied.
    pub fn cleanup(&mut self) -> Result<Cleanup, Error> {
        self.applied = None;
        if let Some(verifier) = &mut self.verifier {
            verifier.forget();
        }
        self.need_full = true;
        self.failed_reapply = None;
        self.dataplane.cleanup()
    }

    /// The status to write into the plan.
    pub fn status(&self) -> NodeForwardingPlanStatus {
        let failures: Vec<ServiceFailure> = self
            .applied
            .iter()
            .flat_map(|a| a.composed.failures.iter().chain(&a.entry_failures).cloned())
            .chain(self.extra_failures.iter().cloned())
            .collect();
        let (failures, failures_total) = cap_failures(failures);
        let applied = self.applied.as_ref();
        NodeForwardingPlanStatus {
            observed_revision: applied.map(|a| a.spec.revision.clone()),
            observed_slices: applied.and_then(|a| a.composed.slices.clone()),
            backend: applied.map(|_| self.dataplane.backend()),
            backend_reason: self.backend_problem().map(|(_, why)| why),
            conditions: self.conditions.clone(),
            services: applied.map(|a| a.services),
            endpoints: applied.map(|a| a.endpoints),
            rules: applied.map(|a| a.rules),
            last_sync_time: applied.map(|a| rfc3339(a.at)),
            last_sync_duration_ms: applied.map(|a| a.duration.as_millis() as u64),
            last_sync_mode: applied.map(|a| a.mode),
            drift_repairs: self.drift_repairs,
            conntrack_flows_cleared: self.conntrack_cleared(),
            failures,
            failures_total,
            draining: self.drain.as_ref().map(Drain::status),
            verification: self.verifier.as_ref().and_then(|v| v.current().cloned()),
        }
    }

    // === decisions ===

    fn reject(&mut self, reason: &'static str, message: String) -> SyncResult {
        tracing::warn!(reason, %message, "plan not applied; the current rules stay");
        self.metrics.rejected_plans.inc();
        self.last = Last::Rejected {
            reason,
            message: message.clone(),
        };
        if let Some(pending) = &mut self.failed_reapply {
            // The pending repair retry must not hide this rejection once it succeeds.
            pending.before = self.last.clone();
        }
        self.update_conditions();
        SyncResult::Rejected { reason, message }
    }

    fn apply(
        &mut self,
        spec: Arc<NodeForwardingPlanSpec>,
        drift: Option<String>,
        composed: Composed,
    ) -> SyncResult {
        let report = validate(&spec);
        if !report.plan.is_empty() {
            let problems: Vec<String> = report.plan.iter().take(5).map(ToString::to_string).collect();
            let more = report.plan.len().saturating_sub(problems.len());
            // The revision is not validated yet when it is the problem: cut it (a 10 MB one was seen).
            let revision = short(&spec.revision, MAX_REVISION);
            let mut message = format!("plan {revision} rejected: {}", problems.join("; "));
            if more > 0 {
                message.push_str(&format!(" (and {more} more)"));
            }
            return self.reject(reasons::INVALID_PLAN, message);
        }
        let skip = report.bad_entries();
        let mut entry_failures = entry_failures(&spec, &report);
        for failure in &entry_failures {
            tracing::warn!(entry = %failure.service, reason = %failure.reason, "skipping invalid entry");
        }
        let now = self.clock.now();
        let full = self.need_full || self.applied.is_none() || self.full_sync_due() || drift.is_some();
        // Whatever reaches the kernel now supersedes a pending retry of an earlier repair (reapply()
        // sets it again if this one fails).
        self.failed_reapply = None;
        let started = Instant::now();
        let outcome = self.dataplane.sync(SyncRequest {
            spec: &spec,
            skip: &skip,
            full,
        });
        let duration = started.elapsed();
        match outcome {
            Ok(outcome) => {
                entry_failures.extend(self.dataplane.entry_failures());
                let refused = self
                    .dataplane
                    .switch_refused()
                    .map(|_| spec.backend)
                    .filter(|wanted| *wanted != self.dataplane.backend());
                if refused.is_some() && refused != self.refused_switch {
                    self.metrics.backend_switches_refused.inc();
                }
                self.refused_switch = refused;
                // Entries the kernel refused are as absent as invalid ones: counts, UDP conntrack
                // cleanup and health-check ports must not claim them.
                let mut skip = skip;
                skip.extend(outcome.left_out.iter().copied());
                let drift = drift.or(outcome.drift);
                if let Some(reason) = &drift {
                    self.drift_repairs += 1;
                    self.metrics.drift_repairs.inc();
                    tracing::warn!(%reason, "repaired drift");
                }
                let udp = udp_fingerprints(&spec, &skip);
                let udp_changed = self.applied.as_ref().map_or(!udp.is_empty(), |a| a.udp != udp);
                if udp_changed {
                    self.clean_conntrack(&spec, &skip);
                }
                self.clear_left_endpoints(&spec, &skip);
                let applied_entries = || {
                    spec.services
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !skip.contains(i))
                };
                let services = applied_entries().count() as u32;
                let endpoints = applied_entries().map(|(_, e)| e.endpoints.len() as u32).sum();
                let mode = outcome.mode;
                let label = ModeLabel::of(mode);
                let families = crate::backend::families_of(&spec);
                for family in &families {
                    self.metrics
                        .sync_duration
                        .get_or_create(&ModeFamilyLabel::of(mode, *family))
                        .observe(duration.as_secs_f64());
                }
                for (family, (internal, external)) in no_local_endpoints(&spec, &skip, families) {
                    for (policy, count) in [("internal", internal), ("external", external)] {
                        self.metrics
                            .no_local_endpoints
                            .get_or_create(&PolicyFamilyLabel {
                                traffic_policy: policy.into(),
                                ip_family: format!("{family:?}"),
                            })
                            .set(count);
                    }
                }
                self.metrics.syncs.get_or_create(&label).inc();
                self.metrics.rules.set(outcome.rules as i64);
                self.metrics.services.set(i64::from(services));
                self.metrics.endpoints.set(i64::from(endpoints));
                self.metrics.skipped_entries.set(skip.len() as i64);
                let wall = self.clock.wall();
                self.metrics.last_sync_timestamp_seconds.set(
                    wall.duration_since(SystemTime::UNIX_EPOCH)
                        .map(|d| d.as_secs_f64())
                        .unwrap_or_default(),
                );
                tracing::info!(
                    revision = %spec.revision,
                    mode = ?mode,
                    rules = outcome.rules,
                    written = outcome.written,
                    removed = outcome.removed,
                    skipped = skip.len(),
                    duration_ms = duration.as_millis() as u64,
                    "synced"
                );
                for failure in &composed.failures {
                    tracing::warn!(what = %failure.service, reason = %failure.reason, "slice problem");
                }
                self.applied = Some(Applied {
                    spec: Arc::clone(&spec),
                    composed,
                    skip: skip.clone(),
                    entry_failures,
                    services,
                    endpoints,
                    rules: outcome.rules,
                    udp,
                    at: wall,
                    duration,
                    mode,
                });
                if let Some(verifier) = &mut self.verifier {
                    let subject = Subject {
                        spec: Arc::clone(&spec),
                        skip: Arc::new(skip.clone()),
                        backend: self.dataplane.backend(),
                    };
                    let dataplane = &mut self.dataplane;
                    verifier.after_sync(subject, now, wall, || dataplane.kernel_view());
                }
                self.need_full = false;
                self.retry_at = None;
                self.backoff.reset();
                if mode == SyncMode::Full {
                    self.last_full = Some(now);
                    if let Some(sysctls) = &mut self.conntrack_sysctls {
                        let localhost = spec.cluster.localhost_node_ports;
                        self.sysctl_problem = sysctls.reconcile(&self.metrics, localhost);
                    }
                }
                self.last = Last::Applied;
                self.follow_leaving(&spec);
                self.update_conditions();
                SyncResult::Applied {
                    mode,
                    duration,
                    rules: outcome.rules,
                    skipped: skip.len(),
                    drift,
                }
            }
            Err(e) => {
                if let Error::IptablesRestore { context, .. } = e.root()
                    && !context.is_empty()
                {
                    tracing::error!(error = %e, "sync failed; the kernel keeps its previous rules. Payload around the failure:\n{context}");
                } else {
                    tracing::error!(error = %e, "sync failed; the kernel keeps its previous rules");
                }
                self.need_full = true;
                let delay = self.backoff.next_delay();
                self.retry_at = Some(now + delay);
                self.metrics.sync_failures.inc();
                self.metrics
                    .restore_failures
                    .get_or_create(&KindLabel {
                        kind: e.metric_label().into(),
                    })
                    .inc();
                let since = match &self.last {
                    Last::Failed { since, .. } => *since,
                    _ => now,
                };
                let mut message = match &self.config.missing_capabilities {
                    Some(why) => format!("{why}; {e}"),
                    None => e.to_string(),
                };
                if let Some(line) = e.failing_line() {
                    // The status is where an operator looks first: name the refused rule there too.
                    message.push_str(&format!("; the refused line: {line}"));
                }
                let message = short(&message, MAX_REASON);
                self.last = Last::Failed {
                    message: message.clone(),
                    since,
                };
                self.update_conditions();
                if self.config.retries {
                    tracing::info!(
                        retry_in_ms = delay.as_millis() as u64,
                        "will retry with a full sync"
                    );
                }
                SyncResult::Failed { message }
            }
        }
    }

    fn clean_conntrack(&mut self, spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) {
        let Some(worker) = &self.conntrack else {
            return;
        };
        let targets = crate::conntrack::select::udp_families(spec, skip)
            .into_iter()
            .map(|family| (family, udp_targets(spec, skip, family)))
            .collect();
        worker.submit(Job::Stale(targets));
    }

    /// Clears the connections of endpoints that left their Service since the last applied plan; queued
    /// right after the sync that removed them from the rules.
    fn clear_left_endpoints(&mut self, spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) {
        let (Some(worker), Some(previous)) = (&self.conntrack, self.applied.as_ref()) else {
            return;
        };
        let left = removed_endpoints(&previous.spec, &previous.skip, spec, skip);
        if !left.is_empty() {
            worker.submit(Job::Removed(left));
        }
    }

    /// Why the backend in use is not the one the applied plan asks for, and the Degraded reason that
    /// says so: the switch was refused (its gate), or the backend cannot run here (a fallback).
    fn backend_problem(&self) -> Option<(&'static str, String)> {
        let wanted = self.applied.as_ref()?.spec.backend;
        let used = self.dataplane.backend();
        if wanted == used {
            return None;
        }
        if let Some(why) = self.dataplane.switch_refused() {
            return Some((reasons::BACKEND_SWITCH_REFUSED, short(&why, MAX_REASON)));
        }
        let why = self.dataplane.fallback_reason().unwrap_or_else(|| {
            format!("the plan asks for {wanted}; this agent implements only {used} so far")
        });
        Some((reasons::BACKEND_FALLBACK, why))
    }

    fn update_conditions(&mut self) {
        let now = rfc3339(self.clock.wall());
        let skipped = self.applied.as_ref().map_or(0, |a| a.entry_failures.len());
        let slice_problems = self.applied.as_ref().map_or(0, |a| a.composed.failures.len());
        let failures = skipped + slice_problems + self.extra_failures.len();
        let kept = match &self.applied {
            Some(a) => format!("the rules of revision {} stay in place", a.spec.revision),
            None => "no rules have been applied yet".to_string(),
        };
        let (applied, degraded) = match &self.last {
            Last::Never => return,
            Last::Applied => {
                let revision = self
                    .applied
                    .as_ref()
                    .map(|a| a.spec.revision.as_str())
                    .unwrap_or_default();
                let programmed = format!("revision {revision} is programmed");
                let backend = self.backend_problem();
                // With failures the reason is PartiallyApplied; the backend's problem still shows in the
                // message.
                let also_fallback = backend
                    .as_ref()
                    .map(|(_, why)| format!("; backend: {why}"))
                    .unwrap_or_default();
                if let (0, Some((reason, why))) = (failures, backend) {
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (cond::TRUE, reason, why),
                    )
                } else if let (0, Some(problem)) = (failures, &self.cache_problem) {
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (
                            cond::TRUE,
                            reasons::CACHE_WRITE_FAILED,
                            format!(
                                "cannot write the plan cache ({problem}); forwarding is unaffected, but a \
                                 restart without the API server would start without rules"
                            ),
                        ),
                    )
                } else if let (0, Some(problem)) = (failures, &self.sysctl_problem) {
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (
                            cond::TRUE,
                            reasons::CONNTRACK_SYSCTL_FAILED,
                            format!("{problem}; forwarding is unaffected (retried at the next full sync)"),
                        ),
                    )
                } else if let (0, Some(problem)) = (failures, &self.port_problem) {
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (
                            cond::TRUE,
                            reasons::PORT_UNAVAILABLE,
                            format!("{problem}; forwarding is unaffected"),
                        ),
                    )
                } else if failures == 0 {
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (cond::FALSE, reasons::HEALTHY, String::new()),
                    )
                } else if skipped == 0 && slice_problems > 0 {
                    // Every composed entry is programmed, but a slice was rejected (its last good copy
                    // stands in) or holds an entry twice.
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (
                            cond::TRUE,
                            reasons::INVALID_SLICE,
                            format!(
                                "{slice_problems} slice problems, {failures} failures in all (see failures){also_fallback}"
                            ),
                        ),
                    )
                } else if skipped == 0 {
                    // Every entry is programmed; something outside the rules failed (a health-check port).
                    (
                        (cond::TRUE, reasons::SYNCED, programmed),
                        (
                            cond::TRUE,
                            reasons::PARTIALLY_APPLIED,
                            format!("{failures} health check ports failed (see failures){also_fallback}"),
                        ),
                    )
                } else {
                    let message = format!(
                        "{programmed} without {skipped} entries (invalid, or refused by the kernel); {failures} failures (see failures){also_fallback}"
                    );
                    (
                        (cond::TRUE, reasons::PARTIALLY_APPLIED, message.clone()),
                        (cond::TRUE, reasons::PARTIALLY_APPLIED, message),
                    )
                }
            }
            Last::Rejected { reason, message } => (
                (cond::FALSE, *reason, message.clone()),
                (cond::TRUE, *reason, format!("{message}; {kept}")),
            ),
            Last::Failed { message, .. } => (
                (cond::FALSE, reasons::APPLY_FAILED, message.clone()),
                (
                    cond::TRUE,
                    reasons::APPLY_FAILED,
                    if self.config.retries {
                        format!("retrying with a full sync; {kept}")
                    } else {
                        kept.to_string()
                    },
                ),
            ),
        };
        set_condition(
            &mut self.conditions,
            APPLIED,
            applied.0,
            applied.1,
            &applied.2,
            &now,
        );
        set_condition(
            &mut self.conditions,
            DEGRADED,
            degraded.0,
            degraded.1,
            &degraded.2,
            &now,
        );
        if let Some(drain) = &self.drain {
            let (status, reason, message) = drain.condition(self.clock.wall());
            set_condition(&mut self.conditions, DRAINED, status, reason, &message, &now);
        }
    }
}
