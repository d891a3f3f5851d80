//! `explain --kernel` on this host: the kernel of the backend in use read through its real edge, and
//! handed to that backend's comparison.
//!
//! ```text
//! backend in use ─► nftables: ExecNft::read(family) ───────────────► explain::kernel::nftables
//!                ├► ipvs: NetlinkIpvs (the frontend's virtual server) ► explain::kernel::ipvs
//!                └► iptables: ExecIptables iptables-save nat, filter ─► explain::kernel::iptables
//! ```

use std::net::IpAddr;

use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use crate::backend::HostFacts;
use crate::error::Error;
use crate::explain::Explanation;
use crate::ipvs::kernel::{Ipvs as _, VirtualKey};
use crate::nftables::kernel::Nft as _;
use crate::probe::{LocalAddrs, NetlinkAddrs};
use crate::xtables::exec::ExecIptables;
use crate::xtables::kernel::Iptables as _;
use crate::xtables::mode::IptablesMode;
use crate::xtables::{Packet, Table, Trace};

/// This host's addresses (what `--src-type LOCAL` and NodePorts mean here).
pub fn local_addrs() -> Result<Vec<IpAddr>, Error> {
    NetlinkAddrs.local_addrs()
}

/// Reads what the kernel holds for `packet` with `backend` (the one in use, which differs from the
/// plan's after a fallback) and records in `explanation` where it differs from the plan (and the
/// kernel's outcome, where the backend can say it).
pub fn compare_with_kernel(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    packet: &Packet,
    plan_trace: &Trace,
    local: &[IpAddr],
    backend: Backend,
    iptables_mode: IptablesMode,
) -> Result<(), Error> {
    let family = IpFamily::of(&packet.dest);
    match backend {
        Backend::Nftables => {
            let facts = HostFacts::default().with_local_addrs(local.to_vec());
            let found = crate::nftables::exec::ExecNft::detect().and_then(|mut nft| nft.read(family))?;
            crate::explain::kernel::nftables::compare_kernel(
                spec,
                explanation,
                packet,
                &facts,
                found.as_ref(),
            );
            add_counts(spec, explanation, backend, iptables_mode)?;
            Ok(())
        }
        Backend::Ipvs => {
            let facts = HostFacts::default().with_local_addrs(local.to_vec());
            let desired = crate::ipvs::render(
                spec,
                &facts,
                &switchyard_api::validate::validate(spec).bad_entries(),
            );
            let key = VirtualKey {
                addr: packet.dest,
                protocol: packet.protocol,
                port: packet.dest_port,
            };
            let mut ipvs = crate::ipvs::netlink::NetlinkIpvs::connect()?;
            let service = ipvs.services()?.into_iter().find(|s| s.key() == Some(key));
            let kernel = match service {
                Some(service) => {
                    let reals = ipvs.destinations(&key)?;
                    Some((service, reals))
                }
                None => None,
            };
            crate::explain::kernel::ipvs::compare_kernel(
                explanation,
                desired.virtuals.get(&key),
                kernel
                    .as_ref()
                    .map(|(service, reals)| (service, reals.as_slice())),
            );
            add_counts(spec, explanation, backend, iptables_mode)?;
            Ok(())
        }
        Backend::Iptables => {
            let mut iptables = ExecIptables::detect(iptables_mode)?;
            let saves = [Table::Nat, Table::Filter]
                .into_iter()
                .map(|table| iptables.save(family, table))
                .collect::<Result<Vec<_>, _>>()?;
            crate::explain::kernel::iptables::compare_kernel(
                spec,
                explanation,
                packet,
                plan_trace,
                local,
                &saves,
            )?;
            add_counts(spec, explanation, backend, iptables_mode)
        }
    }
}

/// Puts the kernel's count of new connections beside each endpoint of the answer (nftables: the
/// counted endpoint maps, complex entries have none and their endpoints stay without a count; IPVS:
/// the real servers' connection counts, over every virtual server of the Service; iptables: each
/// endpoint's DNAT rules).
fn add_counts(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    backend: Backend,
    iptables_mode: IptablesMode,
) -> Result<(), Error> {
    use crate::counters::What;
    let (Some(service), crate::explain::Outcome::Forwarded { endpoints }) =
        (&explanation.service, &mut explanation.outcome)
    else {
        return Ok(());
    };
    let series =
        super::counters::HostCounters::read_once(std::sync::Arc::new(spec.clone()), backend, iptables_mode)?;
    for candidate in endpoints.iter_mut() {
        candidate.connections = series
            .iter()
            .find(|s| {
                &*s.service.name == service.as_str() && s.what == What::Endpoint(candidate.endpoint.clone())
            })
            .map(|s| s.value);
    }
    Ok(())
}
