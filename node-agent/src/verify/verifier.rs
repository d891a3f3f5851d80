//! The verification the syncer keeps: it decides when (the schedule), reads nothing itself but what
//! the syncer hands it, and keeps the latest result for the status.
//!
//! ```text
//! Syncer, after an applied sync ─► after_sync(subject, kernel view reader)
//!   ─► Schedule::applied: a backend not verified yet? ─► probe targets (sample) + the view ─► Job::Verify
//! Syncer::tick_verification ─► worker's results ─► current (Verified replaces it, Counted fills .refused)
//!                           ─► a failed one that a later sync outdated ─► verified again now (take_recheck)
//!                           ─► Schedule::count_due ─► Job::Count
//! current ─► status.verification
//! ```

use std::time::{Instant, SystemTime};

use switchyard_api::verification::Verification;

use super::kernel::KernelView;
use super::probes::sample;
use super::schedule::{Due, Schedule, VerifyConfig};
use super::worker::{Done, Job, Request, Subject, VerifyEdges, VerifyWorker};
use crate::error::Error;
use crate::sync::rfc3339;

/// Verifies the backend in use after a switch, and counts its refusals for a while.
#[derive(Debug)]
pub struct Verifier {
    worker: VerifyWorker,
    config: VerifyConfig,
    schedule: Schedule,
    current: Option<Verification>,
    /// A refusal count is queued and not back yet: no other is queued meanwhile (an iptables-nft save
    /// of a large table can take longer than the interval).
    counting: bool,
    /// An applied sync came after the last verification was queued: its kernel view may be out of date.
    synced_since_queued: bool,
    /// A failed verification came back after such a sync: check again now, not at the next sync.
    recheck: bool,
}

impl Verifier {
    /// A verifier on its own worker thread over `edges`.
    pub fn new(edges: VerifyEdges, config: VerifyConfig) -> Self {
        Self {
            worker: VerifyWorker::start(edges),
            config,
            schedule: Schedule::default(),
            current: None,
            counting: false,
            synced_since_queued: false,
            recheck: false,
        }
    }

    /// After an applied sync of `subject` at `now` (`wall`): queues its verification when its backend
    /// is not the one verified last, reading the kernel through `view` only then.
    pub fn after_sync(
        &mut self,
        subject: Subject,
        now: Instant,
        wall: SystemTime,
        view: impl FnOnce() -> Result<Option<KernelView>, Error>,
    ) {
        let due = self.schedule.applied(subject.backend, now, &self.config);
        if due == Due::Nothing {
            self.synced_since_queued = true;
            return;
        }
        self.synced_since_queued = false;
        tracing::info!(backend = %subject.backend, revision = %subject.spec.revision, "verifying the backend in use");
        let probes = if due == Due::CheckAndProbe {
            sample(&subject.spec, &subject.skip, self.config.probes)
        } else {
            Vec::new()
        };
        let view = view().map_err(|e| e.to_string());
        self.worker.submit(Job::Verify(Box::new(Request {
            subject,
            at: rfc3339(wall),
            view,
            probes,
            probe_timeout: self.config.probe_timeout,
        })));
    }

    /// Takes what the worker finished and queues a refusal count of `subject` (the plan applied now,
    /// asked for only then) when one is due. True when the verification changed.
    pub fn tick(
        &mut self,
        now: Instant,
        wall: SystemTime,
        subject: impl FnOnce() -> Option<Subject>,
    ) -> bool {
        let mut changed = false;
        for done in self.worker.take() {
            match done {
                Done::Verified(verification) => {
                    // A verification that failed is not the last word: a partial apply retried
                    // later (a kernel error on one entry) would otherwise leave its mismatch in the
                    // status for as long as the backend stays. The next applied sync checks again.
                    // When a sync already came after the view it judged (the repair of that very
                    // entry, typically), no further sync may come for an hour: check again now.
                    if !verification.passed() {
                        self.schedule.retry();
                        self.recheck = self.synced_since_queued;
                    }
                    self.current = Some(verification);
                    changed = true;
                }
                Done::Counted(refused) => {
                    self.counting = false;
                    if let Some(current) = &mut self.current
                        && current.refused.as_ref() != Some(&refused)
                    {
                        current.refused = Some(refused);
                        changed = true;
                    }
                }
            }
        }
        if !self.counting
            && self.schedule.count_due(now, &self.config)
            && let Some(subject) = subject()
        {
            self.counting = true;
            self.worker.submit(Job::Count(subject, rfc3339(wall)));
        }
        changed
    }

    /// True once (then false) when a failed verification judged a kernel that a later applied sync
    /// changed: the caller verifies what is applied now ([`Self::after_sync`]).
    pub fn take_recheck(&mut self) -> bool {
        std::mem::take(&mut self.recheck)
    }

    /// The latest verification.
    pub fn current(&self) -> Option<&Verification> {
        self.current.as_ref()
    }

    /// The rules are gone: whatever is applied next is verified afresh.
    pub fn forget(&mut self) {
        self.schedule.forget();
    }

    /// Waits until the worker has run every job queued so far (tests, `apply`).
    pub fn settle(&self) {
        self.worker.settle();
    }
}
