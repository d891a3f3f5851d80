//! The verifier of `run` on this host's edges: probes are TCP connects from the agent's (the node's)
//! network namespace, refusals are read from the backend in use's traffic counters.
//!
//! ```text
//! host_verifier ─► Verifier(worker: TcpConnector, HostCounters(its own AppliedPlan, --iptables-mode))
//! ```

use crate::counters::AppliedPlan;
use crate::verify::probes::TcpConnector;
use crate::verify::worker::VerifyEdges;
use crate::verify::{Verifier, VerifyConfig};
use crate::wiring::counters::HostCounters;
use crate::xtables::mode::IptablesMode;

/// The verifier `run` gives its syncer.
pub fn host_verifier(config: VerifyConfig, iptables_mode: IptablesMode) -> Verifier {
    let plan = AppliedPlan::default();
    Verifier::new(
        VerifyEdges {
            connector: Box::new(TcpConnector),
            counters: Box::new(HostCounters::new(plan.clone(), iptables_mode)),
            plan,
        },
        config,
    )
}
