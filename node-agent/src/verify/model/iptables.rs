//! The iptables backend's verdicts: `explain`'s own path, the plan's rules traced packet by packet.
//!
//! ```text
//! spec ─► explain::plan_tracer (iptables render ─► Tracer) ─► trace(client ─► frontend)
//!      ─► explain's outcome ─► Verdict
//! ```

use std::net::IpAddr;

use switchyard_api::{Backend, NodeForwardingPlanSpec};

use super::super::frontends::Frontend;
use super::super::verdict::Verdict;
use crate::explain::plan_tracer;
use crate::explain::verdict::outcome;
use crate::xtables::Packet;

/// The verdict of each of `frontends` under the iptables render of `spec`, on a host whose addresses
/// are `local`.
pub fn verdicts(spec: &NodeForwardingPlanSpec, local: &[IpAddr], frontends: &[Frontend]) -> Vec<Verdict> {
    let mut tracers = Vec::new();
    frontends
        .iter()
        .map(|frontend| {
            let family = switchyard_api::IpFamily::of(&frontend.addr.ip());
            let tracer = match tracers.iter().position(|(f, _)| *f == family) {
                Some(i) => &tracers[i].1,
                None => {
                    tracers.push((family, plan_tracer(spec, family, Some(local))));
                    &tracers[tracers.len() - 1].1
                }
            };
            let tracer = match tracer {
                Ok(tracer) => tracer,
                Err(e) => return Verdict::Unknown(e.to_string()),
            };
            let packet = Packet::new(
                frontend.source,
                frontend.protocol,
                frontend.addr.ip(),
                frontend.addr.port(),
            );
            match tracer.trace(&packet) {
                Ok(trace) => {
                    let entry = spec.services.iter().find(|e| e.name == frontend.service);
                    Verdict::of_outcome(&outcome(&trace, Backend::Iptables, entry.map(AsRef::as_ref)))
                }
                Err(e) => Verdict::Unknown(e.to_string()),
            }
        })
        .collect()
}
