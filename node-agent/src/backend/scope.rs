//! Which families a sync covers and where NodePorts are served: the plan-reading every backend does
//! the same way before it renders.
//!
//! ```text
//! spec.services[].family ∪ spec.nodeIPs ─► families_of ─┐
//! families programmed before ─────────────────────────────┴─► sync_scope ─► (families, local addresses
//! LocalAddrs (only when nodePortAddresses is set) ───────────────────────────  when they matter)
//! spec.cluster.nodePortAddresses + local addresses + family ─► node_port_ips ─► None (every local
//!                                                                   address) | Some(the addresses)
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec};

use crate::error::Error;
use crate::probe::LocalAddrs;

/// The families a plan needs: those of its entries and node IPs, IPv4 when there are none.
pub fn families_of(spec: &NodeForwardingPlanSpec) -> BTreeSet<IpFamily> {
    let mut families: BTreeSet<IpFamily> = spec.services.iter().map(|s| s.family).collect();
    families.extend(
        spec.node_ips
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .map(|ip| IpFamily::of(&ip)),
    );
    if families.is_empty() {
        families.insert(IpFamily::IPv4);
    }
    families
}

/// What a sync of `spec` covers: the plan's families plus every family already `programmed` (so its
/// rules are emptied rather than left behind), and the local addresses when NodePorts are restricted to
/// some of them (empty otherwise).
pub fn sync_scope(
    spec: &NodeForwardingPlanSpec,
    programmed: impl IntoIterator<Item = IpFamily>,
    addrs: &mut impl LocalAddrs,
) -> Result<(BTreeSet<IpFamily>, Vec<IpAddr>), Error> {
    let mut families = families_of(spec);
    families.extend(programmed);
    let local = if spec.cluster.node_port_addresses.is_empty() {
        Vec::new()
    } else {
        addrs.local_addrs()?
    };
    Ok((families, local))
}

/// Resolves `spec.cluster.nodePortAddresses` for one family against the host's local addresses, as
/// kube-proxy's `NodePortAddresses` does: empty → `None` (every local address); otherwise the family's
/// CIDRs, with `primary` standing for the node's planned IPs of the family as /32 or /128. A family
/// left with no CIDR, or with a /0, is served on every local address (`None`). Otherwise the result is
/// the local addresses inside the CIDRs, sorted, loopback excluded: we do not serve NodePorts on
/// localhost (that needs `route_localnet`, CVE-2020-8558), like kube-proxy's nftables mode. The
/// iptables render serves localhost only when the plan opts in (`localhostNodePorts`) and NodePorts
/// are on every local address (`None`).
pub fn node_port_ips(
    spec: &NodeForwardingPlanSpec,
    family: IpFamily,
    local_addrs: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    if spec.cluster.node_port_addresses.is_empty() {
        return None;
    }
    let mut nets: Vec<IpNet> = Vec::new();
    for value in &spec.cluster.node_port_addresses {
        if value == "primary" {
            nets.extend(parse_ips_of(&spec.node_ips, family).map(IpNet::from));
        } else if let Ok(net) = value.parse::<IpNet>()
            && IpFamily::of(&net.addr()) == family
        {
            nets.push(net.trunc());
        }
    }
    if nets.is_empty() || nets.iter().any(|net| net.prefix_len() == 0) {
        return None;
    }
    let mut ips: Vec<IpAddr> = local_addrs
        .iter()
        .filter(|ip| IpFamily::of(ip) == family && !ip.is_loopback())
        .filter(|ip| nets.iter().any(|net| net.contains(*ip)))
        .copied()
        .collect();
    ips.sort_unstable();
    ips.dedup();
    Some(ips)
}

/// The addresses of `ips` (text, as the plan holds them) of `family`; unparsable ones are skipped
/// (validation reported them).
pub fn parse_ips_of(ips: &[String], family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
    ips.iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .filter(move |ip| IpFamily::of(ip) == family)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn families_follow_entries_and_node_ips() {
        let mut spec = plan("node-a", vec![entry("ns/a:p", "10.96.0.1", 80)]);
        assert_eq!(families_of(&spec), BTreeSet::from([IpFamily::IPv4]));
        spec.node_ips.push("fd00::11".into());
        assert_eq!(
            families_of(&spec),
            BTreeSet::from([IpFamily::IPv4, IpFamily::IPv6])
        );
        spec.node_ips.clear();
        spec.services = vec![
            entry("ns/a:p", "fd00:10:96::1", 80)
                .with(ep("fd00:10:244::1", 80))
                .into(),
        ];
        assert_eq!(families_of(&spec), BTreeSet::from([IpFamily::IPv6]));
        spec.services.clear();
        assert_eq!(families_of(&spec), BTreeSet::from([IpFamily::IPv4]));
    }

    #[test]
    fn node_port_addresses_resolve_like_kube_proxy() {
        use switchyard_api::IpFamily::{IPv4, IPv6};
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let local = [
            ip("127.0.0.1"),
            ip("192.168.10.11"),
            ip("10.0.0.5"),
            ip("203.0.113.9"),
            ip("fd00::11"),
            ip("::1"),
        ];
        let mut spec = plan("node-a", vec![]);
        spec.node_ips = vec!["192.168.10.11".into(), "fd00::11".into()];
        type Case = (Vec<&'static str>, IpFamily, Option<Vec<IpAddr>>);
        let cases: Vec<Case> = vec![
            (vec![], IPv4, None),
            (vec!["primary"], IPv4, Some(vec![ip("192.168.10.11")])),
            (vec!["primary"], IPv6, Some(vec![ip("fd00::11")])),
            (
                vec!["10.0.0.0/8", "203.0.113.0/24"],
                IPv4,
                Some(vec![ip("10.0.0.5"), ip("203.0.113.9")]),
            ),
            // No CIDR of the family: every address, as kube-proxy's per-family default of ::/0.
            (vec!["10.0.0.0/8"], IPv6, None),
            (vec!["0.0.0.0/0"], IPv4, None),
            // Loopback is never served.
            (vec!["127.0.0.0/8"], IPv4, Some(vec![])),
            (
                vec!["primary", "10.0.0.0/8"],
                IPv4,
                Some(vec![ip("10.0.0.5"), ip("192.168.10.11")]),
            ),
            // A CIDR matching no local address serves NodePorts nowhere.
            (vec!["172.16.0.0/12"], IPv4, Some(vec![])),
        ];
        for (addresses, family, want) in cases {
            spec.cluster.node_port_addresses = addresses.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                node_port_ips(&spec, family, &local),
                want,
                "{addresses:?} {family:?}"
            );
        }
    }
}
