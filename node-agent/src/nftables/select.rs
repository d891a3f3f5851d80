//! Backend selection for nftables: the plan's `backend: nftables` picks the nftables dataplane, any
//! other value the host's other backends (iptables, IPVS), per sync.
//!
//! ```text
//! SyncRequest (spec.backend) ─► nftables? ─► nft set up (`nft` found; after a failure tried again on
//!                                 │           full syncs only) ─► NftablesDataplane
//!                                 │ no, or set-up failed (reason kept) ─► other (iptables / IPVS selection)
//!                                 ▼
//!   backend changed since the last sync ─► previous one's cleanup, then a full sync of the new one
//!   first sync ─► what the unused side left on the host is removed (a migration leaves no rules behind)
//! fallback_reason ─► "the plan asks for nftables, but nft is unavailable on this node (…)"
//! ```

use switchyard_api::{Backend, ServiceFailure};

use crate::error::Error;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};

/// Sets up the nftables dataplane; an error means nftables cannot be used on this node.
pub type NftFactory = Box<dyn FnMut() -> Result<Box<dyn Dataplane>, Error> + Send>;

/// The nftables dataplane when the plan asks for it, `other` otherwise.
pub struct NftablesOr {
    other: Box<dyn Dataplane>,
    nft: Option<Box<dyn Dataplane>>,
    factory: Option<NftFactory>,
    unavailable: Option<String>,
    wanted: Option<Backend>,
    /// `Some(true)`: nftables in use; `Some(false)`: the other side; `None`: nothing synced yet.
    using_nft: Option<bool>,
}

impl std::fmt::Debug for NftablesOr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftablesOr")
            .field("using_nft", &self.using_nft)
            .field("unavailable", &self.unavailable)
            .finish_non_exhaustive()
    }
}

impl NftablesOr {
    /// `other` for every backend but nftables; nftables from `factory` when a plan first asks for it
    /// (or when a leftover table must be removed).
    pub fn new(other: Box<dyn Dataplane>, factory: NftFactory) -> Self {
        Self {
            other,
            nft: None,
            factory: Some(factory),
            unavailable: None,
            wanted: None,
            using_nft: None,
        }
    }

    /// Sets nftables up on first use; after a failure it is tried again only when `retry` (full syncs).
    fn nft_ready(&mut self, retry: bool) -> bool {
        if self.nft.is_some() {
            return true;
        }
        if self.unavailable.is_some() && !retry {
            return false;
        }
        let Some(factory) = self.factory.as_mut() else {
            return false;
        };
        match factory() {
            Ok(dataplane) => {
                self.nft = Some(dataplane);
                self.unavailable = None;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "nftables is unavailable on this node");
                self.unavailable = Some(e.to_string());
                false
            }
        }
    }

    /// Removes what the side not chosen by the first sync left on the host; failures are only logged
    /// (they must not stop forwarding with the chosen side).
    fn remove_leftovers(&mut self, use_nft: bool) {
        let leftover = if use_nft {
            Some(&mut self.other)
        } else if self.nft_ready(false) {
            self.nft.as_mut()
        } else {
            None
        };
        if let Some(dataplane) = leftover {
            let side = dataplane.backend();
            match dataplane.cleanup() {
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

    fn current(&mut self) -> &mut Box<dyn Dataplane> {
        match (self.using_nft, self.nft.as_mut()) {
            (Some(true), Some(nft)) => nft,
            _ => &mut self.other,
        }
    }
}

impl Dataplane for NftablesOr {
    fn backend(&self) -> Backend {
        match (self.using_nft, &self.nft) {
            (Some(true), Some(nft)) => nft.backend(),
            _ => self.other.backend(),
        }
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let wanted = request.spec.backend;
        self.wanted = Some(wanted);
        let use_nft = wanted == Backend::Nftables && self.nft_ready(request.full);
        match self.using_nft {
            None => self.remove_leftovers(use_nft),
            Some(previous) if previous != use_nft => {
                tracing::info!(
                    to_nftables = use_nft,
                    "switching backends; removing what the previous one programmed"
                );
                self.current().cleanup()?;
            }
            Some(_) => {}
        }
        if self.using_nft != Some(use_nft) {
            if use_nft {
                tracing::info!("the plan asks for nftables: using the ip/ip6 switchyard tables");
            }
            self.using_nft = Some(use_nft);
            self.current().forget();
        }
        self.current().sync(request)
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        match self.using_nft {
            Some(_) => self.current().check_drift(),
            None => Ok(None),
        }
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        let using_nft = self.using_nft.take();
        if using_nft == Some(true)
            && let Some(nft) = self.nft.as_mut()
        {
            return nft.cleanup();
        }
        self.other.cleanup()
    }

    fn forget(&mut self) {
        if self.using_nft.is_some() {
            self.current().forget();
        }
    }

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        match (self.using_nft, &self.nft) {
            (Some(true), Some(nft)) => nft.entry_failures(),
            _ => self.other.entry_failures(),
        }
    }

    fn fallback_reason(&self) -> Option<String> {
        match (self.wanted, self.using_nft, &self.unavailable) {
            (Some(Backend::Nftables), Some(false), Some(reason)) => Some(format!(
                "the plan asks for nftables, but nftables is unavailable on this node ({reason}); using {}",
                self.other.backend()
            )),
            (Some(Backend::Nftables), _, _) => None,
            _ => self.other.fallback_reason(),
        }
    }
}

/// The nftables dataplane of this host: the `nft` CLI, netlink, the node's addresses over rtnetlink.
pub fn host_factory() -> NftFactory {
    Box::new(|| {
        let nft = super::exec::ExecNft::detect()?;
        tracing::debug!(version = %nft.version().unwrap_or_default(), "nft found");
        Ok(Box::new(super::dataplane::NftablesDataplane::new(
            nft,
            crate::host::NetlinkAddrs,
        )) as Box<dyn Dataplane>)
    })
}

/// `switchyard-agent cleanup` for nftables: deletes our tables of both families; the number of chains
/// and sets removed. A host without `nft` has nothing of ours.
pub fn cleanup_host() -> Result<usize, Error> {
    let nft = match super::exec::ExecNft::detect() {
        Ok(nft) => nft,
        Err(e) => {
            tracing::info!(error = %e, "no nft: no nftables table to clean");
            return Ok(0);
        }
    };
    let mut dataplane = super::dataplane::NftablesDataplane::new(nft, crate::host::FixedAddrs::default());
    Ok(dataplane.cleanup()?.objects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FixedAddrs;
    use crate::nftables::dataplane::NftablesDataplane;
    use crate::nftables::fake::FakeNft;
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use switchyard_api::SyncMode;
    use switchyard_api::testing::{EntryExt, entry, ep, finish, plan};

    /// A stand-in for the other backends that records what it was asked.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<&'static str>>>);

    impl Dataplane for Recorder {
        fn backend(&self) -> Backend {
            Backend::Iptables
        }
        fn sync(&mut self, _: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
            self.0.lock().unwrap().push("sync");
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
            self.0.lock().unwrap().push("cleanup");
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

    fn sync(select: &mut NftablesOr, backend: Backend) -> SyncOutcome {
        let spec = spec(backend);
        select
            .sync(SyncRequest {
                spec: &spec,
                skip: &HashSet::new(),
                full: false,
            })
            .unwrap()
    }

    #[test]
    fn the_plan_picks_nftables_and_a_switch_cleans_up_the_previous_backend() {
        let other = Recorder::default();
        let log = other.0.clone();
        let mut select = NftablesOr::new(
            Box::new(other),
            Box::new(|| {
                Ok(
                    Box::new(NftablesDataplane::new(FakeNft::new(), FixedAddrs::default()))
                        as Box<dyn Dataplane>,
                )
            }),
        );
        sync(&mut select, Backend::Nftables);
        assert_eq!(select.backend(), Backend::Nftables);
        // The first sync removed what iptables may have left; iptables itself did not sync.
        assert_eq!(*log.lock().unwrap(), ["cleanup"]);
        sync(&mut select, Backend::Iptables);
        assert_eq!(select.backend(), Backend::Iptables);
        assert_eq!(*log.lock().unwrap(), ["cleanup", "sync"]);
        assert_eq!(select.fallback_reason(), None);
    }

    #[test]
    fn without_nft_the_other_backend_forwards_and_says_why() {
        let mut select = NftablesOr::new(
            Box::new(Recorder::default()),
            Box::new(|| Err(Error::FindNft("nft is not in $PATH".into()))),
        );
        sync(&mut select, Backend::Nftables);
        assert_eq!(select.backend(), Backend::Iptables);
        let reason = select.fallback_reason().unwrap();
        assert!(
            reason.contains("nftables is unavailable") && reason.contains("$PATH"),
            "{reason}"
        );
    }
}
