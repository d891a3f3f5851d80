//! The IPVS backend's verdicts, read from its render: the glue's filter (source ranges, no-endpoint
//! REJECT and DROP) before the virtual server, whose real servers share new connections by weight.
//!
//! ```text
//! frontend ─► LB-FW member? ─► source in LB-SRC-CIDR / LB-SRC-IP? ─ no ─► Drop
//!          ─► NO-ENDPOINTS member ─► Reject;  NO-LOCAL-EP member ─► Drop
//!          ─► virtual server: real servers of weight > 0 ─► Forward by weight (none: Reject); none ─► Pass
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::IpFamily;

use super::super::frontends::Frontend;
use super::super::verdict::Verdict;
use crate::ipvs::kernel::VirtualKey;
use crate::ipvs::render::Desired;
use crate::ipvs::sets::{SetId, ip_port};

fn member(desired: &Desired, id: SetId, family: IpFamily, value: &str) -> bool {
    desired
        .sets
        .get(&id.name(family))
        .is_some_and(|set| set.members.contains(value))
}

/// The source is one a LoadBalancer frontend's ranges allow (`ip,proto:port,net` or `…,ip` members).
fn allowed(desired: &Desired, family: IpFamily, frontend: &str, source: IpAddr) -> bool {
    let prefix = format!("{frontend},");
    let suffixes = |id: SetId| {
        desired
            .sets
            .get(&id.name(family))
            .into_iter()
            .flat_map(|set| set.members.iter())
            .filter_map(|m| m.strip_prefix(prefix.as_str()))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let by_range = suffixes(SetId::LoadBalancerSourceCidr).iter().any(|range| {
        range.parse::<IpNet>().map_or_else(
            |_| range.parse::<IpAddr>().ok() == Some(source),
            |net| net.contains(&source),
        )
    });
    by_range
        || suffixes(SetId::LoadBalancerSourceIp)
            .iter()
            .any(|ip| ip.parse::<IpAddr>().ok() == Some(source))
}

/// The verdict of `frontend` under `desired`, the IPVS render.
pub fn verdict(desired: &Desired, frontend: &Frontend) -> Verdict {
    let (ip, port) = (frontend.addr.ip(), frontend.addr.port());
    let family = IpFamily::of(&ip);
    let key = ip_port(ip, frontend.protocol, port);
    if member(desired, SetId::LoadBalancerFirewall, family, &key)
        && !allowed(desired, family, &key, frontend.source)
    {
        return Verdict::Drop;
    }
    if member(desired, SetId::NoEndpoints, family, &key) {
        return Verdict::Reject;
    }
    if member(desired, SetId::NoLocalEndpoints, family, &key) {
        return Verdict::Drop;
    }
    let virtual_key = VirtualKey {
        addr: ip,
        protocol: frontend.protocol,
        port,
    };
    match desired.virtuals.get(&virtual_key) {
        None => Verdict::Pass,
        Some(server) => {
            let reals: Vec<_> = server
                .reals
                .iter()
                .filter(|(_, weight)| **weight > 0)
                .map(|(real, weight)| (std::net::SocketAddr::new(real.addr, real.port), *weight))
                .collect();
            if reals.is_empty() {
                // Nothing to schedule to: the node's own stack answers with a reset.
                Verdict::Reject
            } else {
                Verdict::weighted(reals)
            }
        }
    }
}
