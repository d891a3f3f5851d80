//! The traffic counters of this host: the plan's backend decides which kernel counts.
//!
//! ```text
//! HostCounters::read ─► applied plan's backend ─► nftables: nftables::counters (element counters)
//!                                               ─► ipvs: ipvs::counters (real servers' connections)
//!                                               ─► iptables: iptables::counters (rule counters, iptables-save -c)
//! ```

use std::sync::Arc;

use switchyard_api::{Backend, NodeForwardingPlanSpec};

use crate::counters::{Accumulator, Applied, AppliedPlan, CounterSource, Sample, Series};
use crate::error::Error;
use crate::iptables::counters::IptablesCounters;
use crate::ipvs::counters::IpvsCounters;
use crate::nftables::counters::NftCounters;
use crate::xtables::mode::IptablesMode;

/// Reads whichever backend the applied plan uses.
#[derive(Debug)]
pub struct HostCounters {
    plan: AppliedPlan,
    nftables: NftCounters,
    ipvs: IpvsCounters,
    iptables: IptablesCounters,
}

impl HostCounters {
    /// Counters for the plan `plan` holds; `iptables_mode` picks the iptables the iptables backend uses.
    pub fn new(plan: AppliedPlan, iptables_mode: IptablesMode) -> Self {
        Self {
            iptables: IptablesCounters::new(plan.clone(), iptables_mode),
            nftables: NftCounters::new(plan.clone()),
            ipvs: IpvsCounters::new(plan.clone()),
            plan,
        }
    }

    /// One read of `spec`'s counters as series (the CLI's `top` and `explain --kernel`: a plan from a
    /// file or the API, its bad entries skipped as the agent skips them); `None` where the backend does
    /// not count.
    pub fn read_once(
        spec: Arc<NodeForwardingPlanSpec>,
        iptables_mode: IptablesMode,
    ) -> Result<Option<Vec<Series>>, Error> {
        let skip = switchyard_api::validate::validate(&spec).bad_entries();
        let plan = AppliedPlan::default();
        plan.set(Some(Applied {
            spec,
            skip: Arc::new(skip),
        }));
        Ok(Self::new(plan, iptables_mode)
            .read()?
            .map(|samples| Accumulator::default().update(samples)))
    }
}

impl CounterSource for HostCounters {
    fn read(&mut self) -> Result<Option<Vec<Sample>>, Error> {
        match self.plan.get().map(|applied| applied.spec.backend) {
            None => Ok(Some(Vec::new())),
            Some(Backend::Nftables) => self.nftables.read(),
            Some(Backend::Ipvs) => self.ipvs.read(),
            Some(Backend::Iptables) => self.iptables.read(),
        }
    }
}
