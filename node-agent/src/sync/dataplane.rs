//! The backend-neutral kernel side of a sync: what the [`super::Syncer`] asks of a backend (iptables,
//! nftables, IPVS; [`crate::backend::Selector`] picks one per plan).
//!
//! ```text
//! Syncer ─► Dataplane::sync(SyncRequest { spec, skip, full }) ─► SyncOutcome { mode, rules, drift, ... }
//!        ─► Dataplane::check_drift() ─► Some(Drift { reasons })   (the kernel differs from the model)
//!        ─► Dataplane::cleanup() ─► Cleanup { removed objects }
//! Selector (a backend switch, once the new backend synced) ─► Dataplane::retire(successor) ─► Cleanup
//! verification ─► Dataplane::kernel_view() ─► what the kernel holds, for verify::kernel::check
//! ```
//!
//! A backend owns its model of what it programmed; it decides whether a partial sync is possible (it
//! must fall back to a full one when it has no model, or when its own check says the kernel cannot be
//! trusted) and reports what it did. It never decides policy: the plan says everything.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_api::{Backend, NodeForwardingPlanSpec, ServiceFailure, SyncMode};

use crate::error::Error;
use crate::verify::kernel::KernelView;

/// One sync.
#[derive(Debug, Clone, Copy)]
pub struct SyncRequest<'a> {
    /// The validated plan (its header with its views' slices composed in).
    pub spec: &'a Arc<NodeForwardingPlanSpec>,
    /// Indexes of entries that failed validation; they are not programmed.
    pub skip: &'a HashSet<usize>,
    /// Rewrite everything the backend owns (start, after a failure, drift, periodic).
    pub full: bool,
}

/// What a sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Full or partial (a partial request may have been promoted).
    pub mode: SyncMode,
    /// Rules (or virtual plus real servers) now programmed.
    pub rules: u64,
    /// Entries whose objects were rewritten.
    pub written: usize,
    /// Stale objects deleted.
    pub removed: usize,
    /// Set when the backend found the kernel changed behind its back before a partial sync (e.g. the
    /// canary chain was gone) and did a full sync instead: a drift repair.
    pub drift: Option<String>,
    /// Entries the backend left out on top of the request's `skip` (the kernel refused their rules);
    /// their reasons are in [`Dataplane::entry_failures`].
    pub left_out: Vec<usize>,
}

/// How the kernel differs from the backend's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// What differs (a few examples, not every chain).
    pub reasons: Vec<String>,
}

impl SyncOutcome {
    /// A partial sync that has done nothing yet; backends add up their families' work into it.
    pub fn nothing() -> Self {
        Self {
            mode: SyncMode::Partial,
            rules: 0,
            written: 0,
            removed: 0,
            drift: None,
            left_out: Vec::new(),
        }
    }
}

/// Most drift reasons a check reports (the rest are counted, "N more").
pub const MAX_DRIFT_REASONS: usize = 5;

/// Collects the differences a drift check finds: the first [`MAX_DRIFT_REASONS`] in words, all counted.
#[derive(Debug, Default)]
pub struct DriftReasons {
    reasons: Vec<String>,
    total: usize,
}

impl DriftReasons {
    /// One more difference.
    pub fn note(&mut self, reason: String) {
        self.total += 1;
        if self.reasons.len() < MAX_DRIFT_REASONS {
            self.reasons.push(reason);
        }
    }

    /// The drift found, if any.
    pub fn finish(mut self) -> Option<Drift> {
        if self.total == 0 {
            return None;
        }
        if self.total > self.reasons.len() {
            self.reasons
                .push(format!("{} more", self.total - self.reasons.len()));
        }
        Some(Drift {
            reasons: self.reasons,
        })
    }
}

impl Extend<String> for DriftReasons {
    fn extend<T: IntoIterator<Item = String>>(&mut self, reasons: T) {
        reasons.into_iter().for_each(|reason| self.note(reason));
    }
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reasons.join("; "))
    }
}

/// What a cleanup removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Rules removed from chains we do not own (our jump rules).
    pub jumps: usize,
    /// Our chains (or objects) removed.
    pub objects: usize,
}

/// A kernel backend.
pub trait Dataplane: Send {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// Programs `request.spec`. On error the kernel keeps what it had (or as much of it as the backend
    /// can guarantee) and the next sync must be full.
    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error>;

    /// Compares the kernel with the model of the last successful sync; `None` when they agree or when
    /// there is no model yet.
    fn check_drift(&mut self) -> Result<Option<Drift>, Error>;

    /// Removes everything the backend owns, whatever the model says (it also works on a fresh agent,
    /// after a crash). Idempotent.
    fn cleanup(&mut self) -> Result<Cleanup, Error>;

    /// Removes what this backend owns once `successor` has programmed the plan (a backend switch, make
    /// before break): everything but what the two share, which `successor`'s own sync rewrote. Only IPVS
    /// shares anything (its glue is iptables chains of the iptables backend's names).
    fn retire(&mut self, successor: Backend) -> Result<Cleanup, Error> {
        let _ = successor;
        self.cleanup()
    }

    /// Forgets the model (the next sync is full and re-reads the kernel).
    fn forget(&mut self);

    /// After [`Dataplane::retire`]: what of this backend stays for the connections it still carries
    /// (IPVS's virtual servers after a switch away from it), while anything does; the caller retires it
    /// again later. `None` once it is all gone, and for backends whose connections outlive their rules
    /// in conntrack (iptables, nftables).
    fn draining(&self) -> Option<String> {
        None
    }

    /// Before the first sync: an earlier run of this agent had `in_use` programmed (its cache says so),
    /// so the first sync is a switch from it, judged as one. Only the selector has anything to do.
    fn resume(&mut self, in_use: Backend) {
        let _ = in_use;
    }

    /// Entries the last successful sync could not program although everything else was applied (the
    /// kernel refused one IPVS virtual server, say); the status lists them. Backends that apply all or
    /// nothing have none.
    fn entry_failures(&self) -> Vec<ServiceFailure> {
        Vec::new()
    }

    /// Why this backend is in use instead of the one the plan asks for (e.g. IPVS is unavailable on this
    /// node), when the backend knows; `None` leaves the syncer's generic explanation.
    fn fallback_reason(&self) -> Option<String> {
        None
    }

    /// What the kernel holds for this backend, read through its own edge for a verification
    /// ([`crate::verify::kernel::check`]); `None` where the backend cannot say.
    fn kernel_view(&mut self) -> Result<Option<KernelView>, Error> {
        Ok(None)
    }

    /// Why the last sync refused to switch to the backend the plan asks for (the switch gate found a
    /// frontend the new backend would forward differently), while it does.
    fn switch_refused(&self) -> Option<String> {
        None
    }
}
