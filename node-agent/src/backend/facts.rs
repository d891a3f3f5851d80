//! The render context: what the edge found out about the host ([`HostFacts`], the one input besides the
//! plan that every backend's render takes) and the per-family settings resolved from both
//! ([`FamilyEnv`]), so the three renders read the plan's cluster settings the same way.
//!
//! ```text
//! iptables --version, nf_conntrack_tcp_be_liberal (once, at start) ─┐
//! LocalAddrs (per sync, when a render needs them) ──────────────────┴─► HostFacts
//! spec.cluster (masqueradeBit, detectLocal, localTraffic…, masqueradeAll) + nodeIPs ─┐
//! HostFacts.local_addrs ─► scope::node_port_ips ───────────────────────────────┴─► FamilyEnv (per family)
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::{DetectLocalMode, IpFamily, NodeForwardingPlanSpec};

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
    /// How this family's pod traffic is told apart (kube-proxy's `LocalTrafficDetector`).
    pub local: LocalDetector,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
    /// The cluster's Service ranges of this family (ServiceCIDR objects): what is still addressed
    /// inside them after service DNAT is for an unallocated address and is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// Serve NodePorts on the family's loopback range too (iptables, IPv4 only).
    pub localhost_node_ports: bool,
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
        let interface = spec.cluster.local_traffic_interface.clone();
        let local = match (spec.cluster.detect_local, interface) {
            (DetectLocalMode::BridgeInterface, Some(name)) => LocalDetector::Bridge(name),
            (DetectLocalMode::InterfaceNamePrefix, Some(prefix)) => LocalDetector::Prefix(prefix),
            _ => spec
                .cluster
                .local_traffic_cidrs
                .iter()
                .filter_map(|cidr| cidr.parse::<IpNet>().ok())
                .find(|net| IpFamily::of(&net.addr()) == family)
                .map_or(LocalDetector::None, |net| LocalDetector::Cidr(net.trunc())),
        };
        Self {
            family,
            mark,
            local,
            masquerade_all: spec.cluster.masquerade_all,
            service_cidrs: spec
                .cluster
                .service_cidrs
                .iter()
                .filter_map(|cidr| cidr.parse::<IpNet>().ok())
                .filter(|net| IpFamily::of(&net.addr()) == family)
                .map(|net| net.trunc())
                .collect(),
            // kube-proxy never serves ::1: IPv6 has no route_localnet.
            localhost_node_ports: spec.cluster.localhost_node_ports && family == IpFamily::IPv4,
            node_ips: parse_ips_of(&spec.node_ips, family).collect(),
            node_port_ips: node_port_ips(spec, family, local_addrs),
        }
    }
}

/// kube-proxy's local-traffic detector (`pkg/proxy/util/localdetector.go`): the match that says a
/// packet comes from a pod on this node, and its negation, in iptables and nft spelling. The interface
/// detectors match by name (`-i`, `iifname`), never by index, so their rules load and stay valid while
/// the interface does not exist (a bridge the CNI creates with its first pod): they then match nothing.
/// In locally generated packets (nat OUTPUT) the input interface is empty, so host traffic is never
/// taken for pod traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDetector {
    /// No detector: no off-cluster ClusterIP masquerade, no pod short-circuit for eTP=Local.
    None,
    /// Sources inside this CIDR are pods (ClusterCIDR, NodeCIDR).
    Cidr(IpNet),
    /// Packets arriving on this bridge are pods' (BridgeInterface).
    Bridge(String),
    /// Packets arriving on an interface whose name starts with this are pods' (InterfaceNamePrefix).
    Prefix(String),
}

impl LocalDetector {
    /// iptables match for pod traffic (`-s 10.244.0.0/16`, `-i cbr0`, `-i veth+`).
    pub fn iptables_local(&self) -> Option<String> {
        match self {
            Self::None => None,
            Self::Cidr(net) => Some(format!("-s {net}")),
            Self::Bridge(name) => Some(format!("-i {name}")),
            Self::Prefix(prefix) => Some(format!("-i {prefix}+")),
        }
    }

    /// iptables match for traffic that is not a pod's (`! -s …`, `! -i …`).
    pub fn iptables_not_local(&self) -> Option<String> {
        self.iptables_local().map(|m| format!("! {m}"))
    }

    /// nft match for pod traffic (`ip saddr 10.244.0.0/16`, `iifname "cbr0"`, `iifname "veth*"`);
    /// `ip` is the family's keyword.
    pub fn nft_local(&self, ip: &str) -> Option<String> {
        self.nft(ip, "")
    }

    /// nft match for traffic that is not a pod's.
    pub fn nft_not_local(&self, ip: &str) -> Option<String> {
        self.nft(ip, "!= ")
    }

    fn nft(&self, ip: &str, op: &str) -> Option<String> {
        match self {
            Self::None => None,
            Self::Cidr(net) => Some(format!("{ip} saddr {op}{net}")),
            // Names are validated (no quotes, no wildcards), so quoting them is enough.
            Self::Bridge(name) => Some(format!("iifname {op}\"{name}\"")),
            Self::Prefix(prefix) => Some(format!("iifname {op}\"{prefix}*\"")),
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
        assert_eq!(v6.local, LocalDetector::Cidr("fd00:10:244::/48".parse().unwrap()));
        assert_eq!(v6.node_ips, vec!["fd00::11".parse::<IpAddr>().unwrap()]);
        assert_eq!(v6.node_port_ips, Some(vec!["fd00::11".parse().unwrap()]));
        // A masquerade bit validation would reject still renders, with kube-proxy's default.
        spec.cluster.masquerade_bit = 40;
        assert_eq!(FamilyEnv::new(&spec, IpFamily::IPv4, &local).mark, 0x4000);
        spec.cluster.masquerade_bit = 3;
        assert_eq!(FamilyEnv::new(&spec, IpFamily::IPv4, &local).mark, 0x8);
    }

    /// Every detector mode, as kube-proxy's detector spells it in each backend's rules.
    #[test]
    fn each_detector_mode_matches_as_kube_proxy_does() {
        type Case = (
            DetectLocalMode,
            &'static [&'static str],
            Option<&'static str>,
            [Option<&'static str>; 4],
        );
        let cases: [Case; 5] = [
            (
                DetectLocalMode::ClusterCIDR,
                &["10.244.0.0/16"],
                None,
                [
                    Some("-s 10.244.0.0/16"),
                    Some("! -s 10.244.0.0/16"),
                    Some("ip saddr 10.244.0.0/16"),
                    Some("ip saddr != 10.244.0.0/16"),
                ],
            ),
            (DetectLocalMode::ClusterCIDR, &[], None, [None, None, None, None]),
            (
                DetectLocalMode::BridgeInterface,
                &[],
                Some("cbr0"),
                [
                    Some("-i cbr0"),
                    Some("! -i cbr0"),
                    Some("iifname \"cbr0\""),
                    Some("iifname != \"cbr0\""),
                ],
            ),
            (
                DetectLocalMode::InterfaceNamePrefix,
                &[],
                Some("veth"),
                [
                    Some("-i veth+"),
                    Some("! -i veth+"),
                    Some("iifname \"veth*\""),
                    Some("iifname != \"veth*\""),
                ],
            ),
            (DetectLocalMode::None, &[], None, [None, None, None, None]),
        ];
        for (mode, cidrs, interface, want) in cases {
            let mut spec = plan("node-a", vec![]);
            spec.cluster.detect_local = mode;
            spec.cluster.local_traffic_cidrs = cidrs.iter().map(|c| c.to_string()).collect();
            spec.cluster.local_traffic_interface = interface.map(String::from);
            let local = FamilyEnv::new(&spec, IpFamily::IPv4, &[]).local;
            let got = [
                local.iptables_local(),
                local.iptables_not_local(),
                local.nft_local("ip"),
                local.nft_not_local("ip"),
            ];
            assert_eq!(got, want.map(|w| w.map(String::from)), "{mode:?}");
        }
    }
}
