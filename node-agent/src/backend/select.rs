//! Backend selection: the plan's `spec.backend` picks the dataplane per sync. iptables is always there
//! (the fallback); every other backend is set up on first use and, where this host cannot run it, the
//! agent keeps forwarding with iptables and says why.
//!
//! ```text
//! SyncRequest (spec.backend) ─► iptables? ─────────────────────────────────────────► iptables
//!                                 │ another backend ─► set up (factory; after a failure tried
//!                                 │                     again on full syncs only) ─ ok ─► that backend
//!                                 │                                                  └ failed (reason kept) ─► iptables
//!                                 ▼
//!   backend changed since the last sync ─► the switch gate (with_gate: every frontend's verdict the same
//!     under both renders?) ─ refused ─► the previous one syncs and stays (switch_refused: why)
//!                           └ passed ─► full sync of the new one ─ ok ─► the previous one retired
//!                                                                └ failed: the previous one keeps forwarding
//!     a previous one still carrying connections (IPVS: draining()) stays for them, retired again after
//!     each sync and drift check
//!   first sync ─► full sync of the chosen one ─ ok ─► what every other backend left on the host is removed
//!                 (a migration leaves no rules behind), except what the chosen one's sync replaced
//! fallback_reason ─► "the plan asks for ipvs, but IPVS is unavailable on this node (…); using iptables"
//!                    (status: backendReason, condition Degraded/BackendFallback)
//! ```
//!
//! **Make before break.** The new backend's rules are in before the old ones go, so no Service is ever
//! without rules: iptables and nftables rules coexist for that moment (both DNAT new connections the
//! same way; established ones keep their conntrack entries), and IPVS's virtual servers stay until the
//! new rules, which DNAT before IPVS sees a packet, are in. Backends that share kernel objects hand them
//! over instead: IPVS's glue is iptables chains of the iptables backend's names, so a switch to IPVS
//! rewrites them in its own sync ([`Candidate::replaces`]) and a switch away from it to iptables
//! removes only the glue's own ([`Dataplane::retire`]). An old backend that cannot be removed is tried
//! again after every sync until it is.
//!
//! A new backend is one [`Candidate`] here: its factory, how to remove what an earlier run of it left
//! without setting it up (or `None`: set up, then clean up), and which backends' leftovers its own sync
//! removes anyway.

use std::collections::HashSet;

use switchyard_api::{Backend, NodeForwardingPlanSpec, ServiceFailure};

use crate::error::Error;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};
use crate::verify::kernel::KernelView;

/// Sets a backend up; an error means it cannot run on this node (the message says why).
pub type Factory = Box<dyn FnMut() -> Result<Box<dyn Dataplane>, Error> + Send>;

/// Removes what an earlier run of a backend left, without setting the backend up (run at most once),
/// once the backend given (the one in use) has programmed the plan: what the two share stays
/// ([`Dataplane::retire`]).
pub type Leftovers = Box<dyn FnMut(Backend) -> Result<Cleanup, Error> + Send>;

/// Judges a switch from the backend in use (first) to another (second) before anything changes: `Err`
/// refuses it, saying why, and the backend in use keeps forwarding.
pub type Gate =
    Box<dyn FnMut(&NodeForwardingPlanSpec, &HashSet<usize>, Backend, Backend) -> Result<(), String> + Send>;

/// A backend besides iptables, as the selector knows it before it is set up.
pub struct Candidate {
    /// Which backend.
    pub backend: Backend,
    /// How it is called in messages ("IPVS", "nftables").
    pub title: &'static str,
    /// Sets it up.
    pub factory: Factory,
    /// Removes an earlier run's leftovers without setting it up; `None`: set it up (never retried
    /// after a failure for this) and call its cleanup.
    pub leftovers: Option<Leftovers>,
    /// Backends whose leftovers this one's own syncs remove (IPVS rewrites the iptables chains it
    /// shares names with), so its first sync does not clean them first.
    pub replaces: &'static [Backend],
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

struct Slot {
    candidate: Candidate,
    /// The candidate came without a [`Leftovers`]: its leftovers are removed by setting it up.
    cleans_by_setup: bool,
    dataplane: Option<Box<dyn Dataplane>>,
    /// Why the last set-up failed.
    unavailable: Option<String>,
    /// That failure came from looking for leftovers and was logged at debug only: the first plan
    /// that asks for this backend tries it again, so the log says why it cannot run.
    unavailable_quietly: bool,
}

impl Slot {
    /// Sets the backend up on first use; after a failure it is tried again only when `retry` (full
    /// syncs: at start, after failures, on drift, periodically), so a module that becomes loadable
    /// later is picked up without retrying on every partial sync. Set up only to look for leftovers
    /// (`for_leftovers`), success and failure are logged at debug: that backend is not the one in use,
    /// and a host without it is normal.
    fn ready(&mut self, retry: bool, for_leftovers: bool) -> bool {
        if self.dataplane.is_some() {
            return true;
        }
        let say_why_now = self.unavailable_quietly && !for_leftovers;
        if self.unavailable.is_some() && !retry && !say_why_now {
            return false;
        }
        let title = self.candidate.title;
        self.unavailable_quietly = for_leftovers;
        match (self.candidate.factory)() {
            Ok(dataplane) if for_leftovers => {
                tracing::debug!(
                    backend = title,
                    "{title} set up to look for leftovers of an earlier run"
                );
                self.dataplane = Some(dataplane);
                self.unavailable = None;
                true
            }
            Err(e) if for_leftovers => {
                tracing::debug!(backend = title, error = %e, "{title} is not available here, so it left nothing");
                self.unavailable = Some(e.to_string());
                false
            }
            Ok(dataplane) => {
                tracing::info!(backend = title, "{title} is set up on this node");
                self.dataplane = Some(dataplane);
                self.unavailable = None;
                true
            }
            Err(e) => {
                // Whether that means a fallback is for the caller to say (`fallback_reason`).
                tracing::warn!(backend = title, error = %e, "{title} is unavailable on this node");
                self.unavailable = Some(e.to_string());
                false
            }
        }
    }

    /// Removes what an earlier run of this backend left, now that `successor` programmed the plan: its
    /// leftover cleanup (once), else its own retirement when it is, or can be, set up.
    fn remove_leftovers(&mut self, successor: Backend) -> Result<Cleanup, Error> {
        if let Some(mut leftovers) = self.candidate.leftovers.take() {
            return leftovers(successor);
        }
        if self.cleans_by_setup
            && self.ready(false, true)
            && let Some(dataplane) = self.dataplane.as_mut()
        {
            return dataplane.retire(successor);
        }
        Ok(Cleanup::default())
    }
}

/// Picks the backend the plan asks for, falling back to iptables.
pub struct Selector {
    iptables: Box<dyn Dataplane>,
    others: Vec<Slot>,
    /// What the last plan asked for.
    wanted: Option<Backend>,
    /// What the last sync used (`None`: nothing synced yet, or cleaned up since).
    current: Option<Backend>,
    /// Backends switched away from whose rules could not be removed yet (tried again after each sync).
    retiring: Vec<Backend>,
    /// The backend an earlier run had in use ([`Dataplane::resume`]), until the first sync: the first
    /// sync is judged as a switch from it.
    resumed: Option<Backend>,
    /// Judges each switch, when set.
    gate: Option<Gate>,
    /// Why the last sync refused the switch the plan asks for.
    refused: Option<String>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("current", &self.current)
            .field("wanted", &self.wanted)
            .finish_non_exhaustive()
    }
}

impl Selector {
    /// iptables always; each candidate set up when a plan first asks for it.
    pub fn new(iptables: Box<dyn Dataplane>, candidates: Vec<Candidate>) -> Self {
        Self {
            iptables,
            others: candidates
                .into_iter()
                .map(|candidate| Slot {
                    cleans_by_setup: candidate.leftovers.is_none(),
                    candidate,
                    dataplane: None,
                    unavailable: None,
                    unavailable_quietly: false,
                })
                .collect(),
            wanted: None,
            current: None,
            retiring: Vec::new(),
            resumed: None,
            gate: None,
            refused: None,
        }
    }

    /// Judges every switch with `gate` first (see [`Gate`]).
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The backend this sync programs: `target`, unless the gate refuses the switch to it.
    fn judged(&mut self, target: Backend, request: &SyncRequest<'_>) -> Backend {
        let in_use = self.current.or_else(|| self.resumed_in_use(request.full));
        let (Some(current), Some(gate)) = (in_use, self.gate.as_mut()) else {
            self.refused = None;
            return target;
        };
        if current == target {
            self.refused = None;
            return target;
        }
        match gate(request.spec, request.skip, current, target) {
            Ok(()) => {
                self.refused = None;
                target
            }
            Err(why) => {
                // Switching to iptables although the plan asks for another backend: say why too.
                let why = match self.wanted.filter(|w| *w != target).and_then(|w| self.slot(w)) {
                    Some(slot) => format!(
                        "{why} (the plan asks for {}, which cannot run here: {})",
                        slot.candidate.backend,
                        slot.unavailable.as_deref().unwrap_or("not set up")
                    ),
                    None => why,
                };
                if self.refused.as_ref() != Some(&why) {
                    tracing::warn!(from = %current, to = %target, %why, "backend switch refused before anything changed: the backend in use keeps forwarding");
                }
                self.refused = Some(why);
                current
            }
        }
    }

    /// The backend an earlier run had in use, where it can still be set up here (one that cannot is
    /// not forwarding anything: the first sync then takes the plan's backend, as after any start).
    fn resumed_in_use(&mut self, full: bool) -> Option<Backend> {
        let resumed = self.resumed?;
        match self.slot_mut(resumed) {
            None => Some(resumed),
            // Set up quietly: it is not what the plan asks for, so its absence is no fallback to report.
            Some(slot) => slot.ready(full, true).then_some(resumed),
        }
    }

    fn slot(&self, backend: Backend) -> Option<&Slot> {
        self.others.iter().find(|slot| slot.candidate.backend == backend)
    }

    fn slot_mut(&mut self, backend: Backend) -> Option<&mut Slot> {
        self.others
            .iter_mut()
            .find(|slot| slot.candidate.backend == backend)
    }

    /// The dataplane of `backend` when it is set up; iptables otherwise.
    fn get(&mut self, backend: Backend) -> &mut Box<dyn Dataplane> {
        match self
            .others
            .iter_mut()
            .find(|slot| slot.candidate.backend == backend)
            .and_then(|slot| slot.dataplane.as_mut())
        {
            Some(dataplane) => dataplane,
            None => &mut self.iptables,
        }
    }

    fn current(&self) -> Option<&dyn Dataplane> {
        let backend = self.current?;
        let other = self.slot(backend).and_then(|slot| slot.dataplane.as_deref());
        Some(other.unwrap_or(&*self.iptables))
    }

    /// Whether `successor`'s own sync removed what `previous` programmed.
    fn replaced(&self, successor: Backend, previous: Backend) -> bool {
        self.slot(successor)
            .is_some_and(|slot| slot.candidate.replaces.contains(&previous))
    }

    /// Removes what the backends in `retiring` programmed now that `current` forwards; those that fail
    /// stay listed (logged: the old rules coexist with the new ones until then).
    fn retire_previous(&mut self) {
        let Some(current) = self.current else { return };
        for previous in std::mem::take(&mut self.retiring) {
            if previous == current || self.replaced(current, previous) {
                continue;
            }
            match self.get(previous).retire(current) {
                // Kept for the connections it carries: retired again after the next sync or drift
                // check (the backend logs how many stay).
                Ok(_) if self.get(previous).draining().is_some() => self.retiring.push(previous),
                Ok(done) => tracing::info!(
                    backend = %previous,
                    jumps = done.jumps,
                    objects = done.objects,
                    "removed what the previous backend programmed"
                ),
                Err(e) => {
                    tracing::warn!(backend = %previous, error = %e, "cannot remove what the previous backend programmed yet; it keeps coexisting with the new rules and is tried again after the next sync");
                    self.retiring.push(previous);
                }
            }
        }
    }

    /// Removes what the backends other than `chosen` (and those `chosen` replaces) left on the host,
    /// once `chosen` programmed the plan; failures are only logged: they must not stop forwarding with
    /// the chosen backend.
    fn remove_leftovers(&mut self, chosen: Backend) {
        let replaced: &[Backend] = self.slot(chosen).map_or(&[], |slot| slot.candidate.replaces);
        let mut sides: Vec<Backend> = std::iter::once(Backend::Iptables)
            .chain(self.others.iter().map(|slot| slot.candidate.backend))
            .collect();
        sides.retain(|side| *side != chosen && !replaced.contains(side));
        for side in sides {
            let result = match self.slot_mut(side) {
                Some(slot) => slot.remove_leftovers(chosen),
                None => self.iptables.cleanup(),
            };
            match result {
                Ok(done) if done != Cleanup::default() => tracing::info!(
                    backend = %side,
                    jumps = done.jumps,
                    objects = done.objects,
                    "removed what an earlier run with another backend left"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(backend = %side, error = %e, "cannot check for another backend's leftovers")
                }
            }
        }
    }
}

impl Dataplane for Selector {
    fn backend(&self) -> Backend {
        self.current.unwrap_or(Backend::Iptables)
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let wanted = request.spec.backend;
        self.wanted = Some(wanted);
        let ready = self
            .slot_mut(wanted)
            .is_some_and(|slot| slot.ready(request.full, false));
        let target = if ready { wanted } else { Backend::Iptables };
        let target = self.judged(target, &request);
        if self.current == Some(target) {
            let outcome = self.get(target).sync(request)?;
            self.retire_previous();
            return Ok(outcome);
        }
        let previous = self.current;
        match previous {
            Some(previous) => {
                tracing::info!(from = %previous, to = %target, "switching backends: the new one's rules first, then the previous one's removed")
            }
            None => tracing::debug!(backend = %target, "first sync"),
        }
        // The new backend's full sync comes first; on failure the previous backend's rules stay in
        // place and keep forwarding (the syncer retries with a full sync).
        self.get(target).forget();
        let outcome = self.get(target).sync(SyncRequest {
            full: true,
            ..request
        })?;
        self.current = Some(target);
        self.resumed = None;
        match previous {
            Some(previous) => {
                self.retiring.push(previous);
                self.retire_previous();
            }
            None => self.remove_leftovers(target),
        }
        Ok(outcome)
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        // Also the retry of a previous backend kept for its connections, or not removable yet: drift
        // checks run every resync period, syncs only when something changes.
        self.retire_previous();
        match self.current {
            Some(backend) => self.get(backend).check_drift(),
            None => Ok(None),
        }
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        if let Some(backend) = self.current.take() {
            let mut done = self.get(backend).cleanup()?;
            for previous in std::mem::take(&mut self.retiring) {
                let more = self.get(previous).cleanup()?;
                done.jumps += more.jumps;
                done.objects += more.objects;
            }
            return Ok(done);
        }
        // Nothing synced yet: whatever an earlier run left, of every backend that can tell without
        // being set up. iptables' cleanup runs first, so nothing another backend shares with it is
        // left for it to keep.
        let mut done = self.iptables.cleanup()?;
        for slot in &mut self.others {
            if let Some(mut leftovers) = slot.candidate.leftovers.take() {
                let more = leftovers(Backend::Iptables)?;
                done.jumps += more.jumps;
                done.objects += more.objects;
            }
        }
        Ok(done)
    }

    fn forget(&mut self) {
        if let Some(backend) = self.current {
            self.get(backend).forget();
        }
    }

    fn resume(&mut self, in_use: Backend) {
        if self.current.is_none() {
            self.resumed = Some(in_use);
        }
    }

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        match self.current() {
            Some(dataplane) => dataplane.entry_failures(),
            None => self.iptables.entry_failures(),
        }
    }

    fn switch_refused(&self) -> Option<String> {
        self.refused.clone()
    }

    fn kernel_view(&mut self) -> Result<Option<KernelView>, Error> {
        let Some(backend) = self.current else {
            return Ok(None);
        };
        let mut view = self.get(backend).kernel_view()?;
        // A previous backend kept for the connections it carries is doing its job, not left over.
        let leftovers: Vec<Backend> = self
            .retiring
            .clone()
            .into_iter()
            .filter(|previous| {
                self.slot(*previous)
                    .and_then(|slot| slot.dataplane.as_deref())
                    .is_none_or(|d| d.draining().is_none())
            })
            .collect();
        if let Some(view) = &mut view {
            view.leftovers = leftovers;
        }
        Ok(view)
    }

    fn fallback_reason(&self) -> Option<String> {
        let wanted = self.wanted?;
        if self.refused.is_some() || self.current != Some(Backend::Iptables) {
            return None;
        }
        let slot = self.slot(wanted)?;
        let reason = slot.unavailable.as_deref()?;
        Some(format!(
            "the plan asks for {wanted}, but {} is unavailable on this node ({reason}); using iptables",
            slot.candidate.title
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nftables::dataplane::NftablesDataplane;
    use crate::nftables::fake::FakeNft;
    use crate::probe::FixedAddrs;
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use switchyard_api::SyncMode;
    use switchyard_api::testing::{EntryExt, entry, ep, finish, plan};

    /// What the stand-in backends were asked, and which of their operations fail.
    #[derive(Default)]
    struct Journal {
        ops: Vec<String>,
        failing: Vec<String>,
    }

    type Log = Arc<Mutex<Journal>>;

    /// Makes `op` ("nftables sync") fail from now on, or succeed again.
    fn set_failing(log: &Log, op: &str, failing: bool) {
        let mut journal = log.lock().unwrap();
        journal.failing.retain(|o| o != op);
        if failing {
            journal.failing.push(op.to_owned());
        }
    }

    /// A stand-in backend that records what it was asked.
    struct Recorder {
        backend: Backend,
        log: Log,
    }

    impl Recorder {
        fn boxed(backend: Backend, log: &Log) -> Box<dyn Dataplane> {
            Box::new(Self {
                backend,
                log: Arc::clone(log),
            })
        }

        /// Records `what`; fails when the test made it fail.
        fn note(&self, what: &str) -> Result<(), Error> {
            let op = format!("{} {what}", self.backend);
            let mut journal = self.log.lock().unwrap();
            if journal.failing.contains(&op) {
                journal.ops.push(format!("{op} (failed)"));
                return Err(Error::IpvsUnavailable(format!("{op} fails")));
            }
            journal.ops.push(op);
            Ok(())
        }
    }

    impl Dataplane for Recorder {
        fn backend(&self) -> Backend {
            self.backend
        }
        fn sync(&mut self, _: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
            self.note("sync")?;
            Ok(SyncOutcome {
                mode: SyncMode::Full,
                rules: 1,
                written: 1,
                removed: 0,
                drift: None,
                left_out: Vec::new(),
            })
        }
        fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
            Ok(None)
        }
        fn cleanup(&mut self) -> Result<Cleanup, Error> {
            self.note("cleanup")?;
            Ok(Cleanup::default())
        }
        fn forget(&mut self) {}
    }

    fn spec(backend: Backend) -> Arc<switchyard_api::NodeForwardingPlanSpec> {
        let mut spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        spec.backend = backend;
        finish(&mut spec);
        Arc::new(spec)
    }

    fn sync(select: &mut Selector, backend: Backend) -> SyncOutcome {
        let spec = spec(backend);
        select
            .sync(SyncRequest {
                spec: &spec,
                skip: &HashSet::new(),
                full: false,
            })
            .unwrap()
    }

    /// iptables, IPVS (with a leftover cleanup, replacing iptables) and nftables (cleaned by set-up),
    /// each recording into `log`; `available` says which of the two candidates can be set up.
    fn selector(log: &Log, available: &[Backend]) -> Selector {
        let candidate = |backend: Backend, title, leftovers: Option<Leftovers>, replaces| {
            let (log, up) = (Arc::clone(log), available.contains(&backend));
            let factory: Factory = Box::new(move || {
                if up {
                    Ok(Recorder::boxed(backend, &log))
                } else {
                    Err(Error::IpvsUnavailable(format!("no {backend} here")))
                }
            });
            Candidate {
                backend,
                title,
                factory,
                leftovers,
                replaces,
            }
        };
        let leftover_log = Arc::clone(log);
        let leftovers: Leftovers = Box::new(move |successor| {
            leftover_log
                .lock()
                .unwrap()
                .ops
                .push(format!("ipvs leftovers (for {successor})"));
            Ok(Cleanup::default())
        });
        Selector::new(
            Recorder::boxed(Backend::Iptables, log),
            vec![
                candidate(Backend::Ipvs, "IPVS", Some(leftovers), &[Backend::Iptables]),
                candidate(Backend::Nftables, "nftables", None, &[]),
            ],
        )
    }

    /// A recorded iptables fallback and one nftables candidate made by `factory`.
    fn iptables_or_nftables(log: &Log, factory: Factory) -> Selector {
        Selector::new(
            Recorder::boxed(Backend::Iptables, log),
            vec![Candidate {
                backend: Backend::Nftables,
                title: "nftables",
                factory,
                leftovers: None,
                replaces: &[],
            }],
        )
    }

    #[test]
    fn a_backend_found_missing_while_looking_for_leftovers_is_tried_once_more_when_wanted() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let log = Log::default();
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&tries);
        let factory: Factory = Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Err(Error::FindNft("nft is not in $PATH".into()))
        });
        let mut select = iptables_or_nftables(&log, factory);
        sync(&mut select, Backend::Iptables);
        assert_eq!(
            tries.load(Ordering::SeqCst),
            1,
            "set up (quietly) to look for leftovers"
        );
        sync(&mut select, Backend::Nftables);
        assert_eq!(
            tries.load(Ordering::SeqCst),
            2,
            "tried again, so the log says why"
        );
        assert!(select.fallback_reason().unwrap().contains("nft is not in $PATH"));
        sync(&mut select, Backend::Nftables);
        assert_eq!(tries.load(Ordering::SeqCst), 2, "then only on full syncs");
    }

    fn taken(log: &Log) -> Vec<String> {
        std::mem::take(&mut log.lock().unwrap().ops)
    }

    #[test]
    fn a_new_backend_that_fails_its_first_sync_leaves_the_previous_one_forwarding() {
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
        sync(&mut select, Backend::Iptables);
        taken(&log);
        set_failing(&log, "nftables sync", true);
        let spec = spec(Backend::Nftables);
        let request = SyncRequest {
            spec: &spec,
            skip: &HashSet::new(),
            full: false,
        };
        assert!(select.sync(request).is_err());
        assert_eq!(taken(&log), ["nftables sync (failed)"], "iptables untouched");
        assert_eq!(select.backend(), Backend::Iptables, "still in use");
        set_failing(&log, "nftables sync", false);
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "iptables cleanup"]);
        assert_eq!(select.backend(), Backend::Nftables);
    }

    #[test]
    fn a_previous_backend_that_cannot_be_removed_is_tried_again_after_each_sync() {
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
        sync(&mut select, Backend::Iptables);
        taken(&log);
        set_failing(&log, "iptables cleanup", true);
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "iptables cleanup (failed)"]);
        assert_eq!(select.backend(), Backend::Nftables, "the switch stands");
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "iptables cleanup (failed)"]);
        set_failing(&log, "iptables cleanup", false);
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "iptables cleanup"]);
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync"], "done with it");
    }

    #[test]
    fn the_first_sync_syncs_then_removes_every_other_backends_leftovers_but_those_the_chosen_one_replaces() {
        type Case = (Backend, &'static [&'static str]);
        let cases: [Case; 3] = [
            (
                Backend::Iptables,
                &[
                    "iptables sync",
                    "ipvs leftovers (for iptables)",
                    "nftables cleanup",
                ],
            ),
            (Backend::Ipvs, &["ipvs sync", "nftables cleanup"]),
            (
                Backend::Nftables,
                &[
                    "nftables sync",
                    "iptables cleanup",
                    "ipvs leftovers (for nftables)",
                ],
            ),
        ];
        for (backend, want) in cases {
            let log = Log::default();
            let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
            sync(&mut select, backend);
            assert_eq!(select.backend(), backend);
            assert_eq!(taken(&log), want, "{backend}");
            // Later syncs of the same backend only sync.
            sync(&mut select, backend);
            assert_eq!(taken(&log), [format!("{backend} sync")], "{backend}");
        }
    }

    #[test]
    fn a_switch_syncs_the_new_backend_before_it_removes_the_previous_one() {
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
        sync(&mut select, Backend::Nftables);
        taken(&log);
        for (to, want) in [
            (Backend::Ipvs, ["ipvs sync", "nftables cleanup"]),
            (Backend::Iptables, ["iptables sync", "ipvs cleanup"]),
            (Backend::Nftables, ["nftables sync", "iptables cleanup"]),
        ] {
            sync(&mut select, to);
            assert_eq!(select.backend(), to);
            assert_eq!(taken(&log), want, "to {to}");
            assert_eq!(select.fallback_reason(), None);
        }
        // Cleanup removes what the current backend programmed; the next sync starts afresh.
        select.cleanup().unwrap();
        assert_eq!(taken(&log), ["nftables cleanup"]);
    }

    #[test]
    fn a_switch_the_gate_refuses_keeps_the_backend_in_use_until_it_passes() {
        let log = Log::default();
        let verdicts = Arc::new(Mutex::new(Err::<(), String>(
            "ns/w would be forwarded differently".into(),
        )));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (judge, seen) = (Arc::clone(&verdicts), Arc::clone(&asked));
        let gate: Gate = Box::new(move |_, _, from, to| {
            seen.lock().unwrap().push(format!("{from}->{to}"));
            judge.lock().unwrap().clone()
        });
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]).with_gate(gate);
        sync(&mut select, Backend::Ipvs);
        assert!(
            asked.lock().unwrap().is_empty(),
            "nothing in use yet: no switch to judge"
        );
        taken(&log);
        sync(&mut select, Backend::Nftables);
        assert_eq!(
            taken(&log),
            ["ipvs sync"],
            "nftables untouched, IPVS kept in sync"
        );
        assert_eq!(select.backend(), Backend::Ipvs);
        assert_eq!(
            select.switch_refused().as_deref(),
            Some("ns/w would be forwarded differently")
        );
        assert_eq!(select.fallback_reason(), None, "a refusal is no fallback");
        // Asked again on every sync while the plan asks for the switch; once it passes, it happens.
        *verdicts.lock().unwrap() = Ok(());
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "ipvs cleanup"]);
        assert_eq!(select.switch_refused(), None);
        assert_eq!(*asked.lock().unwrap(), ["ipvs->nftables", "ipvs->nftables"]);
        // The same backend again is no switch.
        sync(&mut select, Backend::Nftables);
        assert_eq!(asked.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_restarted_agent_judges_the_switch_from_the_backend_its_cache_says_was_in_use() {
        let log = Log::default();
        let verdicts = Arc::new(Mutex::new(Err::<(), String>("ns/w differs".into())));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (judge, seen) = (Arc::clone(&verdicts), Arc::clone(&asked));
        let gate: Gate = Box::new(move |_, _, from, to| {
            seen.lock().unwrap().push(format!("{from}->{to}"));
            judge.lock().unwrap().clone()
        });
        // The earlier run had IPVS programmed and refused nftables; the restarted one is told so.
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]).with_gate(gate);
        select.resume(Backend::Ipvs);
        sync(&mut select, Backend::Nftables);
        assert_eq!(*asked.lock().unwrap(), ["ipvs->nftables"]);
        assert_eq!(
            select.backend(),
            Backend::Ipvs,
            "the refused switch stays refused"
        );
        assert!(select.switch_refused().is_some());
        let ops = taken(&log);
        assert!(ops.contains(&"ipvs sync".to_owned()), "{ops:?}");
        assert!(!ops.contains(&"nftables sync".to_owned()), "{ops:?}");
        assert!(!ops.contains(&"ipvs cleanup".to_owned()), "{ops:?}");
        // Once it passes, the switch happens as any other: the new rules first, the old ones after.
        *verdicts.lock().unwrap() = Ok(());
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync", "ipvs cleanup"]);
        assert_eq!(select.backend(), Backend::Nftables);

        // Told after its first sync, it changes nothing: the backend in use is known by then.
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables])
            .with_gate(Box::new(|_, _, _, _| Err("differs".into())));
        sync(&mut select, Backend::Nftables);
        select.resume(Backend::Ipvs);
        taken(&log);
        sync(&mut select, Backend::Nftables);
        assert_eq!(taken(&log), ["nftables sync"]);
    }

    #[test]
    fn a_resumed_backend_this_host_cannot_set_up_is_not_in_use() {
        let log = Log::default();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let gate: Gate = Box::new(move |_, _, from, to| {
            seen.lock().unwrap().push(format!("{from}->{to}"));
            Ok(())
        });
        // Only nftables is a candidate here: a cache saying IPVS names nothing this host runs.
        let mut select = selector(&log, &[Backend::Nftables]).with_gate(gate);
        select.resume(Backend::Ipvs);
        sync(&mut select, Backend::Nftables);
        assert!(asked.lock().unwrap().is_empty(), "{:?}", asked.lock().unwrap());
        assert_eq!(select.backend(), Backend::Nftables);
    }

    #[test]
    fn a_refused_switch_to_the_fallback_says_why_the_plans_backend_is_not_the_target() {
        let log = Log::default();
        let gate: Gate = Box::new(|_, _, from, to| Err(format!("{from} to {to} differs")));
        let mut select = selector(&log, &[Backend::Ipvs]).with_gate(gate);
        sync(&mut select, Backend::Ipvs);
        sync(&mut select, Backend::Nftables);
        assert_eq!(select.backend(), Backend::Ipvs);
        let why = select.switch_refused().unwrap();
        assert!(
            why.starts_with("ipvs to iptables differs (the plan asks for nftables, which cannot run here: "),
            "{why}"
        );
        assert!(why.contains("no nftables here"), "{why}");
    }

    #[test]
    fn a_backend_this_host_lacks_falls_back_to_iptables_and_says_why() {
        for (wanted, title) in [(Backend::Ipvs, "IPVS"), (Backend::Nftables, "nftables")] {
            let log = Log::default();
            let mut select = selector(&log, &[]);
            sync(&mut select, wanted);
            assert_eq!(select.backend(), Backend::Iptables);
            let reason = select.fallback_reason().unwrap();
            let why = Error::IpvsUnavailable(format!("no {wanted} here")).to_string();
            assert_eq!(
                reason,
                format!(
                    "the plan asks for {wanted}, but {title} is unavailable on this node ({why}); using iptables"
                )
            );
            // Asking for iptables is no fallback.
            sync(&mut select, Backend::Iptables);
            assert_eq!(select.fallback_reason(), None);
        }
    }

    #[test]
    fn nothing_synced_yet_cleanup_removes_what_any_run_left_without_setting_anything_up() {
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
        select.cleanup().unwrap();
        assert_eq!(taken(&log), ["iptables cleanup", "ipvs leftovers (for iptables)"]);
        // A leftover cleanup runs once.
        select.cleanup().unwrap();
        assert_eq!(taken(&log), ["iptables cleanup"]);
    }

    #[test]
    fn the_plan_picks_the_real_nftables_dataplane() {
        let log = Log::default();
        let factory: Factory = Box::new(|| {
            Ok(Box::new(NftablesDataplane::new(FakeNft::new(), FixedAddrs::default())) as Box<dyn Dataplane>)
        });
        let mut select = iptables_or_nftables(&log, factory);
        let outcome = sync(&mut select, Backend::Nftables);
        assert_eq!(select.backend(), Backend::Nftables);
        assert!(outcome.rules > 0, "{outcome:?}");
        assert_eq!(taken(&log), ["iptables cleanup"]);
    }
}
