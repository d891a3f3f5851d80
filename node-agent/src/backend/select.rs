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
//!   backend changed since the last sync ─► previous one's cleanup, then a full sync of the new one
//!   first sync ─► what every other backend left on the host is removed (a migration leaves no rules
//!                 behind), except what the chosen one's own sync replaces (IPVS rewrites iptables')
//! fallback_reason ─► "the plan asks for ipvs, but IPVS is unavailable on this node (…); using iptables"
//!                    (status: backendReason, condition Degraded/BackendFallback)
//! ```
//!
//! A new backend is one [`Candidate`] here: its factory, how to remove what an earlier run of it left
//! without setting it up (or `None`: set up, then clean up), and which backends' leftovers its own sync
//! removes anyway.

use switchyard_api::{Backend, ServiceFailure};

use crate::error::Error;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};

/// Sets a backend up; an error means it cannot run on this node (the message says why).
pub type Factory = Box<dyn FnMut() -> Result<Box<dyn Dataplane>, Error> + Send>;

/// Removes what an earlier run of a backend left, without setting the backend up (run at most once).
pub type Leftovers = Box<dyn FnMut() -> Result<Cleanup, Error> + Send>;

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

    /// Removes what an earlier run of this backend left: its leftover cleanup (once), else its own
    /// cleanup when it is, or can be, set up.
    fn remove_leftovers(&mut self) -> Result<Cleanup, Error> {
        if let Some(mut leftovers) = self.candidate.leftovers.take() {
            return leftovers();
        }
        if self.cleans_by_setup
            && self.ready(false, true)
            && let Some(dataplane) = self.dataplane.as_mut()
        {
            return dataplane.cleanup();
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

    /// Removes what the backends other than `chosen` (and those `chosen` replaces) left on the host;
    /// failures are only logged: they must not stop forwarding with the chosen backend.
    fn remove_leftovers(&mut self, chosen: Backend) {
        let replaced: &[Backend] = self.slot(chosen).map_or(&[], |slot| slot.candidate.replaces);
        let mut sides: Vec<Backend> = std::iter::once(Backend::Iptables)
            .chain(self.others.iter().map(|slot| slot.candidate.backend))
            .collect();
        sides.retain(|side| *side != chosen && !replaced.contains(side));
        for side in sides {
            let result = match self.slot_mut(side) {
                Some(slot) => slot.remove_leftovers(),
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
        if self.current != Some(target) {
            match self.current {
                Some(previous) => {
                    tracing::info!(from = %previous, to = %target, "switching backends; removing what the previous one programmed");
                    self.get(previous).cleanup()?;
                }
                None => self.remove_leftovers(target),
            }
            self.get(target).forget();
            self.current = Some(target);
        }
        self.get(target).sync(request)
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        match self.current {
            Some(backend) => self.get(backend).check_drift(),
            None => Ok(None),
        }
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        if let Some(backend) = self.current.take() {
            return self.get(backend).cleanup();
        }
        // Nothing synced yet: whatever an earlier run left, of every backend that can tell without
        // being set up.
        let mut done = self.iptables.cleanup()?;
        for slot in &mut self.others {
            if let Some(mut leftovers) = slot.candidate.leftovers.take() {
                let more = leftovers()?;
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

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        match self.current() {
            Some(dataplane) => dataplane.entry_failures(),
            None => self.iptables.entry_failures(),
        }
    }

    fn fallback_reason(&self) -> Option<String> {
        let wanted = self.wanted?;
        if self.current != Some(Backend::Iptables) {
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

    type Log = Arc<Mutex<Vec<String>>>;

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

        fn note(&self, what: &str) {
            self.log.lock().unwrap().push(format!("{} {what}", self.backend));
        }
    }

    impl Dataplane for Recorder {
        fn backend(&self) -> Backend {
            self.backend
        }
        fn sync(&mut self, _: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
            self.note("sync");
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
            self.note("cleanup");
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
        let leftovers: Leftovers = Box::new(move || {
            leftover_log.lock().unwrap().push("ipvs leftovers".into());
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
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn the_first_sync_removes_every_other_backends_leftovers_but_those_the_chosen_one_replaces() {
        type Case = (Backend, &'static [&'static str]);
        let cases: [Case; 3] = [
            (
                Backend::Iptables,
                &["ipvs leftovers", "nftables cleanup", "iptables sync"],
            ),
            (Backend::Ipvs, &["nftables cleanup", "ipvs sync"]),
            (
                Backend::Nftables,
                &["iptables cleanup", "ipvs leftovers", "nftables sync"],
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
    fn a_switch_cleans_up_the_previous_backend_first() {
        let log = Log::default();
        let mut select = selector(&log, &[Backend::Ipvs, Backend::Nftables]);
        sync(&mut select, Backend::Nftables);
        taken(&log);
        for (to, want) in [
            (Backend::Ipvs, ["nftables cleanup", "ipvs sync"]),
            (Backend::Iptables, ["ipvs cleanup", "iptables sync"]),
            (Backend::Nftables, ["iptables cleanup", "nftables sync"]),
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
        assert_eq!(taken(&log), ["iptables cleanup", "ipvs leftovers"]);
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
