//! The traffic counters of this host: the backend that applied the plan decides which kernel counts.
//!
//! ```text
//! HostCounters::read ─► AppliedPlan (none yet: no samples)
//!   ─► the backend that applied it ─► nftables: nftables::counters::read (element counters, netlink)
//!                                  ─► ipvs: ipvs::counters::read (real servers' connections, netlink)
//!                                  ─► iptables: iptables::counters::read (rule counters, iptables-save -c)
//! ```
//!
//! Each backend's kernel handle opens at its first read and is kept: a node that falls back from IPVS
//! or nftables to iptables reads iptables from then on.

use std::sync::Arc;

use switchyard_api::{Backend, NodeForwardingPlanSpec};

use crate::counters::{Accumulator, Applied, AppliedPlan, CounterSource, Sample, Series};
use crate::error::Error;
use crate::ipvs::netlink::NetlinkIpvs;
use crate::nftables::netlink::NftNetlink;
use crate::xtables::exec::ExecIptables;
use crate::xtables::mode::IptablesMode;
use crate::{iptables, ipvs, nftables};

/// Reads whichever backend applied the plan.
#[derive(Debug)]
pub struct HostCounters {
    plan: AppliedPlan,
    iptables_mode: IptablesMode,
    nftables: Option<NftNetlink>,
    ipvs: Option<NetlinkIpvs>,
    iptables: Option<ExecIptables>,
}

impl HostCounters {
    /// Counters for the plan `plan` holds; `iptables_mode` picks the iptables the iptables backend uses.
    pub fn new(plan: AppliedPlan, iptables_mode: IptablesMode) -> Self {
        Self {
            plan,
            iptables_mode,
            nftables: None,
            ipvs: None,
            iptables: None,
        }
    }

    /// One read of `spec`'s counters as series, on `backend` (the one in use: the CLI's `top` and
    /// `explain --kernel`, a plan from a file or the API, its bad entries skipped as the agent skips
    /// them).
    pub fn read_once(
        spec: Arc<NodeForwardingPlanSpec>,
        backend: Backend,
        iptables_mode: IptablesMode,
    ) -> Result<Vec<Series>, Error> {
        let skip = switchyard_api::validate::validate(&spec).bad_entries();
        let plan = AppliedPlan::default();
        plan.set(Some(Applied {
            backend,
            spec,
            skip: Arc::new(skip),
        }));
        let samples = Self::new(plan, iptables_mode).read()?;
        Ok(Accumulator::default().update(samples))
    }
}

/// The handle in `slot`, opened by `open` the first time.
fn opened<H>(slot: &mut Option<H>, open: impl FnOnce() -> Result<H, Error>) -> Result<&mut H, Error> {
    match slot {
        Some(handle) => Ok(handle),
        None => Ok(slot.insert(open()?)),
    }
}

impl CounterSource for HostCounters {
    fn read(&mut self) -> Result<Vec<Sample>, Error> {
        let Some(Applied { spec, skip, backend }) = self.plan.get() else {
            return Ok(Vec::new());
        };
        let samples = match backend {
            Backend::Nftables => {
                nftables::counters::read(opened(&mut self.nftables, NftNetlink::open)?, &spec, &skip)?
            }
            Backend::Ipvs => {
                ipvs::counters::read(opened(&mut self.ipvs, NetlinkIpvs::connect)?, &spec, &skip)?
            }
            Backend::Iptables => {
                let mode = self.iptables_mode;
                iptables::counters::read(
                    opened(&mut self.iptables, || ExecIptables::detect(mode))?,
                    &spec,
                    &skip,
                )?
            }
        };
        Ok(samples)
    }
}
