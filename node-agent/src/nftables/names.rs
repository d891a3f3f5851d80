//! Names of everything in the agent's nftables tables.
//!
//! ```text
//! ServicePlan.name + protocol [+ "ip:port"] [+ timeout] ─► sha256 ─► base32 ─► 8 chars ─┐
//! ServicePlan.name, protocol [, ip, port] ─► readable suffix (ns/svc/proto/port) ───────┴─► service-<hash>-<suffix>
//! ```
//!
//! The shape is kube-proxy's nftables mode (`{service,local,external,firewall,endpoint}-<8-char hash>-
//! ns/svc/proto/port[__ip/port]`), so a chain found in `nft list table ip switchyard` reads like kube-proxy's
//! documentation. The hash keeps names unique; the suffix is for people, made safe for the nft grammar
//! (only `[A-Za-z0-9_./-]`) and cut so a name stays far below nft's 256-byte limit. One table per family,
//! so no family goes into the names.

use sha2::{Digest, Sha256};

/// The table the agent owns in each family (`ip switchyard`, `ip6 switchyard`); nothing outside it is
/// ever touched.
pub const TABLE: &str = "switchyard";

/// Prefix of the comments that carry a digest (first rule of each chain, every named set).
pub const DIGEST_PREFIX: &str = "switchyard:";

/// Base chain: LoadBalancer source-range checks before DNAT (prerouting).
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// Base chain: LoadBalancer source-range checks before DNAT (locally generated traffic).
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// Base chain: no-endpoint verdicts for traffic to this host.
pub const FILTER_INPUT: &str = "filter-input";
/// Base chain: no-endpoint verdicts and undefined ClusterIP ports for forwarded traffic.
pub const FILTER_FORWARD: &str = "filter-forward";
/// Base chain: no-endpoint verdicts and undefined ClusterIP ports for locally generated traffic.
pub const FILTER_OUTPUT: &str = "filter-output";
/// Base chain: service DNAT for traffic arriving from outside.
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// Base chain: service DNAT for locally generated traffic.
pub const NAT_OUTPUT: &str = "nat-output";
/// Base chain: masquerade of marked traffic.
pub const NAT_POSTROUTING: &str = "nat-postrouting";

/// Dispatch of ClusterIPs, externalIPs and LoadBalancer IPs.
pub const SERVICES: &str = "services";
/// Dispatch of NodePorts (reached from `services` for local destinations).
pub const NODEPORTS: &str = "nodeports";
/// Sets the masquerade bit of the packet mark.
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
/// Masquerades marked (and hairpin) traffic, clearing the bit.
pub const MASQUERADING: &str = "masquerading";
/// LoadBalancer IPs with source ranges → their `firewall-…` chain.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// Frontends without (local) endpoints → drop or reject.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// NodePorts without (local) endpoints → drop or reject.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// Traffic still addressed to a ClusterIP after DNAT (an undefined port) → reject.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// `reject` (ICMP port unreachable: the client fails fast, like kube-proxy's REJECT).
pub const REJECT_CHAIN: &str = "reject-chain";

/// Prefix of the Cluster-policy dispatch chain of a complex entry.
pub const SERVICE_PREFIX: &str = "service-";
/// Prefix of the Local-policy dispatch chain.
pub const LOCAL_PREFIX: &str = "local-";
/// Prefix of the external-traffic chain (NodePort, externalIP, LoadBalancer of a complex entry).
pub const EXTERNAL_PREFIX: &str = "external-";
/// Prefix of the `loadBalancerSourceRanges` chain.
pub const FIREWALL_PREFIX: &str = "firewall-";
/// Prefix of the per-endpoint chain (ClientIP affinity only).
pub const ENDPOINT_PREFIX: &str = "endpoint-";
/// Prefix of the per-endpoint affinity set (ClientIP affinity only).
pub const AFFINITY_PREFIX: &str = "affinity-";

const HASH_LEN: usize = 8;
/// Longest readable suffix kept; the whole name stays under 120 bytes.
const MAX_SUFFIX: usize = 96;

fn hash8(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    let mut encoded = data_encoding::BASE32.encode(&digest);
    // base32 of 32 bytes is 56 characters, so the first 8 always exist.
    encoded.truncate(HASH_LEN);
    encoded
}

/// A short hex digest of `text`, for the comments that let a read-back tell our objects unchanged.
pub fn digest(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Replaces anything the nft grammar would not take in an identifier, and cuts the result.
fn sanitize(text: &str) -> String {
    let mut clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_./-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Every char is ASCII now, so any byte index is a char boundary.
    clean.truncate(MAX_SUFFIX);
    clean
}

/// `ns/svc/proto/port` (kube-proxy's readable part; `ns/svc/proto` for an unnamed port).
fn service_suffix(service_port_name: &str, protocol: &str) -> String {
    let (service, port) = service_port_name
        .split_once(':')
        .unwrap_or((service_port_name, ""));
    if port.is_empty() {
        sanitize(&format!("{service}/{protocol}"))
    } else {
        sanitize(&format!("{service}/{protocol}/{port}"))
    }
}

fn service_name(prefix: &str, service_port_name: &str, protocol: &str) -> String {
    format!(
        "{prefix}{}-{}",
        hash8(&format!("{service_port_name}{protocol}")),
        service_suffix(service_port_name, protocol)
    )
}

/// `service-<hash>-…`: dispatches to the endpoints of the Cluster policy.
pub fn service_chain(service_port_name: &str, protocol: &str) -> String {
    service_name(SERVICE_PREFIX, service_port_name, protocol)
}

/// `local-<hash>-…`: dispatches to the endpoints of the Local policy.
pub fn local_chain(service_port_name: &str, protocol: &str) -> String {
    service_name(LOCAL_PREFIX, service_port_name, protocol)
}

/// `external-<hash>-…`: entry of external traffic (masquerade and short-circuits, then the policy).
pub fn external_chain(service_port_name: &str, protocol: &str) -> String {
    service_name(EXTERNAL_PREFIX, service_port_name, protocol)
}

/// `firewall-<hash>-…`: drops LoadBalancer traffic from outside the source ranges.
pub fn firewall_chain(service_port_name: &str, protocol: &str) -> String {
    service_name(FIREWALL_PREFIX, service_port_name, protocol)
}

fn endpoint_suffix(service_port_name: &str, protocol: &str, ip: &str, port: u16) -> String {
    sanitize(&format!(
        "{}__{ip}/{port}",
        service_suffix(service_port_name, protocol)
    ))
}

/// `endpoint-<hash>-…__ip/port`: records the client in the affinity set, then DNATs to one endpoint.
pub fn endpoint_chain(service_port_name: &str, protocol: &str, ip: &str, port: u16) -> String {
    format!(
        "{ENDPOINT_PREFIX}{}-{}",
        hash8(&format!("{service_port_name}{protocol}{ip}:{port}")),
        endpoint_suffix(service_port_name, protocol, ip, port)
    )
}

/// `affinity-<hash>-…__ip/port`: the clients recently sent to one endpoint. The timeout is part of the
/// hash: a set's timeout cannot be changed in place, so a new timeout makes a new set (and the old one
/// is deleted as stale once no rule refers to it).
pub fn affinity_set(service_port_name: &str, protocol: &str, ip: &str, port: u16, timeout: u32) -> String {
    format!(
        "{AFFINITY_PREFIX}{}-{}",
        hash8(&format!("{service_port_name}{protocol}{ip}:{port}/{timeout}")),
        endpoint_suffix(service_port_name, protocol, ip, port)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_like_kube_proxys() {
        let name = service_chain("ns1/svc1:p80", "tcp");
        assert!(name.starts_with("service-"), "{name}");
        assert!(name.ends_with("-ns1/svc1/tcp/p80"), "{name}");
        assert_eq!(name.len(), "service-".len() + 8 + "-ns1/svc1/tcp/p80".len());
        assert!(service_chain("ns1/svc1", "udp").ends_with("-ns1/svc1/udp"));
        assert_ne!(
            service_chain("ns1/svc1:p80", "tcp"),
            service_chain("ns1/svc1:p80", "udp")
        );
        assert!(local_chain("ns1/svc1:p80", "tcp").starts_with("local-"));
    }

    #[test]
    fn endpoint_names_cover_the_endpoint_and_are_safe_for_nft() {
        let a = endpoint_chain("ns/svc:http", "tcp", "fd00::1", 80);
        let b = endpoint_chain("ns/svc:http", "tcp", "fd00::2", 80);
        assert_ne!(a, b);
        assert!(a.ends_with("-ns/svc/tcp/http__fd00__1/80"), "{a}");
        assert_ne!(
            affinity_set("ns/svc:http", "tcp", "10.0.0.1", 80, 10),
            affinity_set("ns/svc:http", "tcp", "10.0.0.1", 80, 20)
        );
        let odd = service_chain("ns/svc:a b\"c;{}", "tcp");
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c)),
            "{odd}"
        );
        let long = endpoint_chain(&format!("ns/{}:p", "x".repeat(300)), "sctp", "fd00::1", 65535);
        assert!(long.len() < 120, "{}", long.len());
    }

    #[test]
    fn digests_are_short_hex() {
        let d = digest("rule");
        assert_eq!(d.len(), 12);
        assert!(d.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(digest("a"), digest("b"));
    }
}
