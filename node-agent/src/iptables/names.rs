//! Names of the iptables chains the agent owns.
//!
//! ```text
//! ServicePlan.name + protocol [+ "ip:port"] ─► sha256 ─► base32 ─► first 16 chars ─► SWYD-{SVC,SVL,EXT,FW,SEP}-<hash>
//! ```
//!
//! The scheme is kube-proxy's (`portProtoHash` / `servicePortEndpointChainName` in
//! `pkg/proxy/iptables/proxier.go`) with our prefix instead of `KUBE-`, so a chain name found in a dump can
//! be matched against kube-proxy's documentation and tests. No IP family goes into the hash: IPv4 rules
//! live in `iptables` and IPv6 rules in `ip6tables`, which are separate tables, so the names never meet.
//! Every name is at most 25 characters, under iptables' limit of 28.

use sha2::{Digest, Sha256};

// The fixed chains are the toolkit's (the IPVS glue owns them too); re-exported so the render and its
// readers find every chain name here.
pub use crate::xtables::chains::{
    CANARY, EXTERNAL_SERVICES, FORWARD, MARK_MASQ, MAX_CHAIN_LEN, NODEPORTS, POSTROUTING, PREFIX,
    PROXY_FIREWALL, SERVICES,
};

/// Comment of the filter rule that drops what is still addressed inside a ServiceCIDR after DNAT.
pub const UNALLOCATED_COMMENT: &str = "switchyard drop traffic to unallocated ClusterIPs";
/// Comment of the filter rule that drops martian packets to 127.0.0.0/8 (localhost NodePorts only).
pub const LOCALNET_COMMENT: &str = "switchyard block incoming localnet connections";
/// Suffix of the comment of an entry's localhost NodePort rule (`ns/svc:port localhost nodeport`);
/// the counters read these rules.
pub const LOCALHOST_NODEPORT_COMMENT: &str = "localhost nodeport";

/// Prefix of the Cluster-policy endpoint dispatch chain.
pub const SVC_PREFIX: &str = "SWYD-SVC-";
/// Prefix of the Local-policy endpoint dispatch chain.
pub const SVL_PREFIX: &str = "SWYD-SVL-";
/// Prefix of the external-traffic chain (NodePort, externalIP, LoadBalancer).
pub const EXT_PREFIX: &str = "SWYD-EXT-";
/// Prefix of the `loadBalancerSourceRanges` chain.
pub const FW_PREFIX: &str = "SWYD-FW-";
/// Prefix of the per-endpoint DNAT chain.
pub const SEP_PREFIX: &str = "SWYD-SEP-";

const HASH_LEN: usize = 16;

fn hash16(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    let mut encoded = data_encoding::BASE32.encode(&digest);
    // base32 of 32 bytes is 56 characters, so the first 16 always exist.
    encoded.truncate(HASH_LEN);
    encoded
}

/// kube-proxy's `portProtoHash`: 16 base32 characters of sha256(service port name + lowercase protocol).
pub fn port_proto_hash(service_port_name: &str, protocol: &str) -> String {
    hash16(&format!("{service_port_name}{protocol}"))
}

/// `SWYD-SVC-<hash>`: dispatches to the endpoints of the Cluster policy.
pub fn cluster_policy_chain(service_port_name: &str, protocol: &str) -> String {
    format!("{SVC_PREFIX}{}", port_proto_hash(service_port_name, protocol))
}

/// `SWYD-SVL-<hash>`: dispatches to the endpoints of the Local policy.
pub fn local_policy_chain(service_port_name: &str, protocol: &str) -> String {
    format!("{SVL_PREFIX}{}", port_proto_hash(service_port_name, protocol))
}

/// `SWYD-EXT-<hash>`: entry point of external traffic (masquerade and short-circuits, then the policy).
pub fn external_chain(service_port_name: &str, protocol: &str) -> String {
    format!("{EXT_PREFIX}{}", port_proto_hash(service_port_name, protocol))
}

/// `SWYD-FW-<hash>`: lets LoadBalancer traffic from the source ranges through to the EXT chain.
pub fn firewall_chain(service_port_name: &str, protocol: &str) -> String {
    format!("{FW_PREFIX}{}", port_proto_hash(service_port_name, protocol))
}

/// `SWYD-SEP-<hash>`: DNATs to one endpoint. `endpoint` is `ip:port`, or `[ip]:port` for IPv6, exactly as
/// kube-proxy's `BaseEndpointInfo.String()` writes it.
pub fn endpoint_chain(service_port_name: &str, protocol: &str, endpoint: &str) -> String {
    format!(
        "{SEP_PREFIX}{}",
        hash16(&format!("{service_port_name}{protocol}{endpoint}"))
    )
}

/// True for the per-service chains (SVC, SVL, EXT, FW, SEP): the only chains a sync may find stale and
/// delete. Top-level chains are never deleted by a sync, since built-in chains jump to them.
pub fn is_service_chain(name: &str) -> bool {
    [SVC_PREFIX, SVL_PREFIX, EXT_PREFIX, FW_PREFIX, SEP_PREFIX]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// Every chain the agent owns in the filter table apart from per-service ones (there are none there).
pub const FILTER_TOP_LEVEL: [&str; 5] = [SERVICES, EXTERNAL_SERVICES, FORWARD, NODEPORTS, PROXY_FIREWALL];
/// The top-level chains the agent owns in the nat table.
pub const NAT_TOP_LEVEL: [&str; 4] = [SERVICES, NODEPORTS, POSTROUTING, MARK_MASQ];

/// `ip:port`, or `[ip]:port` when the address is IPv6 (Go's `net.JoinHostPort`, which kube-proxy uses for
/// both the SEP hash input and the DNAT target).
pub fn join_host_port(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_reproduces_kube_proxy_names() {
        // Names taken from kube-proxy's TestOverallIPTablesRules / TestTracePacket goldens, where the
        // KUBE-SVC-<hash> of each service is known; only the prefix differs here.
        let cases = [
            ("ns1/svc1:p80", "XPGD46QRK7WJZT7O"),
            ("ns2/svc2:p80", "GNZBNJ2PO5MGZ6GT"),
            ("ns3/svc3:p80", "X27LE4BHSL4DOUIK"),
            ("ns4/svc4:p80", "4SW47YFZTEDKD3PK"),
            ("ns5/svc5:p80", "NUKIZ6OKUXPJNT4C"),
        ];
        for (name, hash) in cases {
            assert_eq!(port_proto_hash(name, "tcp"), hash, "{name}");
            assert_eq!(cluster_policy_chain(name, "tcp"), format!("SWYD-SVC-{hash}"));
        }
        assert_eq!(firewall_chain("ns5/svc5:p80", "tcp"), "SWYD-FW-NUKIZ6OKUXPJNT4C");
    }

    #[test]
    fn endpoint_hash_covers_the_endpoint() {
        // kube-proxy: ns3/svc3:p80 -> 10.180.0.3:80 is KUBE-SEP-OYPFS5VJICHGATKP.
        assert_eq!(
            endpoint_chain("ns3/svc3:p80", "tcp", "10.180.0.3:80"),
            "SWYD-SEP-OYPFS5VJICHGATKP"
        );
        assert_ne!(
            endpoint_chain("ns3/svc3:p80", "tcp", "10.180.0.3:80"),
            endpoint_chain("ns3/svc3:p80", "tcp", "10.180.0.4:80")
        );
        assert_ne!(
            port_proto_hash("ns1/svc1:p80", "tcp"),
            port_proto_hash("ns1/svc1:p80", "udp")
        );
    }

    #[test]
    fn names_fit_iptables() {
        let longest = endpoint_chain("ns/svc:p", "sctp", "[fd00::1]:65535");
        assert_eq!(longest.len(), 25);
        assert!(longest.len() <= MAX_CHAIN_LEN);
        assert!(PROXY_FIREWALL.len() <= MAX_CHAIN_LEN && EXTERNAL_SERVICES.len() <= MAX_CHAIN_LEN);
    }

    #[test]
    fn service_chains_are_recognised() {
        assert!(is_service_chain("SWYD-SEP-OYPFS5VJICHGATKP"));
        assert!(is_service_chain("SWYD-FW-NUKIZ6OKUXPJNT4C"));
        assert!(!is_service_chain(SERVICES));
        assert!(!is_service_chain(CANARY));
        assert!(!is_service_chain("KUBE-SVC-NUKIZ6OKUXPJNT4C"));
    }

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
    }
}
