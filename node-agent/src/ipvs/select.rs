//! Backend selection: the plan's `backend` picks IPVS or iptables per sync; IPVS is set up on first use
//! and, when the kernel cannot do it, the agent keeps forwarding with iptables and says why.
//!
//! ```text
//! SyncRequest (spec.backend) ─► ipvs wanted? ─► IPVS set up (family resolved, modprobe ip_vs; after a
//!                                  │              failure tried again on full syncs only) ───────────┐
//!                                  │ no, or set-up failed (reason kept) ─► iptables ◄──────────────────┤
//!                                  ▼                                                                   │
//!      backend changed since the last sync? ─► previous backend's cleanup, then a full sync of the new one
//!      first sync with iptables ─► IPVS leftovers of an earlier run removed (when there are any)
//! fallback_reason ─► "IPVS is unavailable on this node (…); using iptables"  (status: backendReason,
//!                    condition Degraded/BackendFallback)
//! ```

use switchyard_api::{Backend, ServiceFailure};

use crate::error::Error;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};

/// Sets up the IPVS backend; an error means IPVS is unavailable on this node.
pub type IpvsFactory = Box<dyn FnMut() -> Result<Box<dyn Dataplane>, Error> + Send>;

/// Removes what an earlier IPVS-mode run left behind (called once, before the first iptables sync).
pub type Leftovers = Box<dyn FnMut() -> Result<Cleanup, Error> + Send>;

/// Picks the backend the plan asks for, falling back to iptables.
pub struct SelectDataplane {
    iptables: Box<dyn Dataplane>,
    ipvs: Option<Box<dyn Dataplane>>,
    factory: Option<IpvsFactory>,
    leftovers: Option<Leftovers>,
    unavailable: Option<String>,
    wanted: Option<Backend>,
    current: Option<Backend>,
}

impl std::fmt::Debug for SelectDataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectDataplane")
            .field("current", &self.current)
            .field("unavailable", &self.unavailable)
            .finish_non_exhaustive()
    }
}

impl SelectDataplane {
    /// iptables always; IPVS from `factory` when a plan first asks for it.
    pub fn new(iptables: Box<dyn Dataplane>, factory: IpvsFactory) -> Self {
        Self {
            iptables,
            ipvs: None,
            factory: Some(factory),
            leftovers: None,
            unavailable: None,
            wanted: None,
            current: None,
        }
    }

    /// Runs `leftovers` once, before the first sync that uses iptables.
    pub fn with_leftover_cleanup(mut self, leftovers: Leftovers) -> Self {
        self.leftovers = Some(leftovers);
        self
    }

    /// Why IPVS could not be set up, if it could not.
    pub fn ipvs_unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Sets IPVS up on first use. After a failure it is tried again only on full syncs (at start,
    /// after failures, on drift, periodically), so a module that becomes loadable later is picked up
    /// without retrying on every partial sync.
    fn ipvs_ready(&mut self, full: bool) -> bool {
        if self.ipvs.is_some() {
            return true;
        }
        if self.unavailable.is_some() && !full {
            return false;
        }
        let Some(factory) = self.factory.as_mut() else {
            return false;
        };
        match factory() {
            Ok(dataplane) => {
                tracing::info!("IPVS is available; using it");
                self.ipvs = Some(dataplane);
                self.unavailable = None;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "IPVS is unavailable on this node; falling back to iptables");
                self.unavailable = Some(e.to_string());
                false
            }
        }
    }

    fn get(&mut self, backend: Backend) -> &mut Box<dyn Dataplane> {
        match (backend, self.ipvs.as_mut()) {
            (Backend::Ipvs, Some(ipvs)) => ipvs,
            _ => &mut self.iptables,
        }
    }

    fn current(&mut self) -> Option<&mut Box<dyn Dataplane>> {
        let backend = self.current?;
        Some(self.get(backend))
    }
}

impl Dataplane for SelectDataplane {
    fn backend(&self) -> Backend {
        self.current.unwrap_or(Backend::Iptables)
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let wanted = request.spec.backend;
        self.wanted = Some(wanted);
        let target = if wanted == Backend::Ipvs && self.ipvs_ready(request.full) {
            Backend::Ipvs
        } else {
            Backend::Iptables
        };
        if self.current != Some(target) {
            match self.current {
                Some(previous) => {
                    tracing::info!(from = %previous, to = %target, "switching backends; removing what the previous one programmed");
                    self.get(previous).cleanup()?;
                }
                None if target == Backend::Iptables => {
                    if let Some(mut leftovers) = self.leftovers.take() {
                        match leftovers() {
                            Ok(done) if done != Cleanup::default() => {
                                tracing::info!(
                                    jumps = done.jumps,
                                    objects = done.objects,
                                    "removed what an earlier IPVS-mode run left"
                                );
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "cannot check for IPVS-mode leftovers"),
                        }
                    }
                }
                None => {}
            }
            self.get(target).forget();
            self.current = Some(target);
        }
        self.get(target).sync(request)
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        match self.current() {
            Some(dataplane) => dataplane.check_drift(),
            None => Ok(None),
        }
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        if let Some(backend) = self.current.take() {
            return self.get(backend).cleanup();
        }
        // Nothing synced yet: whatever an earlier run left, of either backend.
        let mut done = self.iptables.cleanup()?;
        if let Some(mut leftovers) = self.leftovers.take() {
            let more = leftovers()?;
            done.jumps += more.jumps;
            done.objects += more.objects;
        }
        Ok(done)
    }

    fn forget(&mut self) {
        if let Some(dataplane) = self.current() {
            dataplane.forget();
        }
    }

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        match (self.current, &self.ipvs) {
            (Some(Backend::Ipvs), Some(ipvs)) => ipvs.entry_failures(),
            _ => self.iptables.entry_failures(),
        }
    }

    fn fallback_reason(&self) -> Option<String> {
        match (self.wanted, self.current, &self.unavailable) {
            (Some(Backend::Ipvs), Some(Backend::Iptables), Some(reason)) => Some(format!(
                "the plan asks for ipvs, but IPVS is unavailable on this node ({reason}); using iptables"
            )),
            _ => None,
        }
    }
}
