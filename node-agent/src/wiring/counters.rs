//! The traffic counters of this host: the plan's backend decides which kernel counts.
//!
//! ```text
//! HostCounters::read ─► applied plan's backend ─► nftables: nftables::counters (element counters)
//!                                               ─► ipvs: ipvs::counters (real servers' connections)
//!                                               ─► iptables: none yet (None: no traffic series)
//! ```

use switchyard_api::Backend;

use crate::counters::{AppliedPlan, CounterSource, Sample};
use crate::error::Error;
use crate::ipvs::counters::IpvsCounters;
use crate::nftables::counters::NftCounters;

/// Reads whichever backend the applied plan uses.
#[derive(Debug)]
pub struct HostCounters {
    plan: AppliedPlan,
    nftables: NftCounters,
    ipvs: IpvsCounters,
}

impl HostCounters {
    /// Counters for the plan `plan` holds.
    pub fn new(plan: AppliedPlan) -> Self {
        Self {
            nftables: NftCounters::new(plan.clone()),
            ipvs: IpvsCounters::new(plan.clone()),
            plan,
        }
    }
}

impl CounterSource for HostCounters {
    fn read(&mut self) -> Result<Option<Vec<Sample>>, Error> {
        match self.plan.get().map(|applied| applied.spec.backend) {
            None => Ok(Some(Vec::new())),
            Some(Backend::Nftables) => self.nftables.read(),
            Some(Backend::Ipvs) => self.ipvs.read(),
            Some(Backend::Iptables) => Ok(None),
        }
    }
}
