//! The render context: what the edge found out about the host ([`HostFacts`], the one input besides the
//! plan that every backend's render takes) and the per-family settings resolved from both
//! ([`FamilyEnv`]), so the three renders read the plan's cluster settings the same way.
//!
//! ```text
//! iptables --version, nf_conntrack_tcp_be_liberal (once, at start) ─┐
//! LocalAddrs (per sync, when a render needs them) ──────────────────┴─► HostFacts
//! spec.cluster (masqueradeBit, localTrafficCIDRs, masqueradeAll) + spec.nodeIPs ─┐
//! HostFacts.local_addrs ─► scope::node_port_ips ───────────────────────────────┴─► FamilyEnv (per family)
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec};

use super::scope::{node_port_ips, parse_ips_of};

/// What the edge discovered about the host; plain data so the renders stay pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// `iptables` supports `MASQUERADE --random-fully` (iptables ≥ 1.6.2).
    pub random_fully: bool,
    /// sysctl `net.netfilter.nf_conntrack_tcp_be_liberal` is non-zero: no INVALID-drop rule is needed
    /// (kube-proxy makes the same choice, kubernetes#117924).
    pub tcp_be_liberal: bool,
    /// The node's own local addresses (for IPVS, without the service addresses on its dummy
    /// interface). Read per sync and only where a render needs them: IPVS always, iptables and
    /// nftables when the plan restricts NodePort addresses; empty otherwise.
    pub local_addrs: Vec<IpAddr>,
}

impl HostFacts {
    /// These facts with `local_addrs` as the node's addresses.
    pub fn with_local_addrs(&self, local_addrs: Vec<IpAddr>) -> Self {
        Self {
            local_addrs,
            ..self.clone()
        }
    }
}

/// Per-family settings every entry's rules need, resolved once per render. Two renders with equal
/// environments render unchanged entries identically (the incremental syncs rely on that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyEnv {
    /// The family.
    pub family: IpFamily,
    /// The masquerade mark (`0x4000` for bit 14).
    pub mark: u32,
    /// The local-traffic detector's CIDR for this family; `None` means no detector.
    pub local_cidr: Option<IpNet>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
    /// The node's planned IPs of this family.
    pub node_ips: Vec<IpAddr>,
    /// Where NodePorts are served: `None` = every local address but loopback (see [`node_port_ips`]).
    pub node_port_ips: Option<Vec<IpAddr>>,
}

impl FamilyEnv {
    /// The environment of `family` in `spec`, NodePorts resolved against `local_addrs`.
    pub fn new(spec: &NodeForwardingPlanSpec, family: IpFamily, local_addrs: &[IpAddr]) -> Self {
        // Validation rejects a bit above 31; fall back to kube-proxy's default rather than panic.
        let mark = 1u32
            .checked_shl(u32::from(spec.cluster.masquerade_bit))
            .unwrap_or(1 << 14);
        let local_cidr = spec
            .cluster
            .local_traffic_cidrs
            .iter()
            .filter_map(|cidr| cidr.parse::<IpNet>().ok())
            .find(|net| IpFamily::of(&net.addr()) == family)
            .map(|net| net.trunc());
        Self {
            family,
            mark,
            local_cidr,
            masquerade_all: spec.cluster.masquerade_all,
            node_ips: parse_ips_of(&spec.node_ips, family).collect(),
            node_port_ips: node_port_ips(spec, family, local_addrs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::plan;

    #[test]
    fn the_environment_reads_the_cluster_settings_of_its_family() {
        let mut spec = plan("node-a", vec![]);
        spec.node_ips = vec!["192.168.10.11".into(), "fd00::11".into()];
        spec.cluster.local_traffic_cidrs = vec!["10.244.0.0/16".into(), "fd00:10:244::1/48".into()];
        spec.cluster.node_port_addresses = vec!["primary".into()];
        let local: Vec<IpAddr> = ["192.168.10.11", "fd00::11", "10.0.0.5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let v6 = FamilyEnv::new(&spec, IpFamily::IPv6, &local);
        assert_eq!(v6.mark, 0x4000);
        assert_eq!(v6.local_cidr, Some("fd00:10:244::/48".parse().unwrap()));
        assert_eq!(v6.node_ips, vec!["fd00::11".parse::<IpAddr>().unwrap()]);
        assert_eq!(v6.node_port_ips, Some(vec!["fd00::11".parse().unwrap()]));
        // A masquerade bit validation would reject still renders, with kube-proxy's default.
        spec.cluster.masquerade_bit = 40;
        assert_eq!(FamilyEnv::new(&spec, IpFamily::IPv4, &local).mark, 0x4000);
        spec.cluster.masquerade_bit = 3;
        assert_eq!(FamilyEnv::new(&spec, IpFamily::IPv4, &local).mark, 0x8);
    }
}
