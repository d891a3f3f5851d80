//! The fixed chains every iptables-based backend owns (the iptables backend and the IPVS glue), and
//! the ownership contract: every chain we write starts with [`PREFIX`], and nothing else is touched.
//!
//! ```text
//! PREFIX "SWYD-" ─► save.rs keeps only these chains ─► cleanup removes exactly these (and our jumps)
//! ```

/// The prefix of every chain the agent owns; nothing outside it is ever touched.
pub const PREFIX: &str = "SWYD-";

/// nat and filter: ClusterIP/externalIP/LB dispatch (nat) and no-endpoint verdicts (filter).
pub const SERVICES: &str = "SWYD-SERVICES";
/// filter: verdicts for external destinations without (local) endpoints.
pub const EXTERNAL_SERVICES: &str = "SWYD-EXTERNAL-SERVICES";
/// filter: accepts marked and established forwarded traffic.
pub const FORWARD: &str = "SWYD-FORWARD";
/// nat: NodePort dispatch; filter: health-check node port ACCEPTs.
pub const NODEPORTS: &str = "SWYD-NODEPORTS";
/// filter: drops LoadBalancer traffic that no `loadBalancerSourceRanges` entry allowed.
pub const PROXY_FIREWALL: &str = "SWYD-PROXY-FIREWALL";
/// nat: masquerades marked traffic.
pub const POSTROUTING: &str = "SWYD-POSTROUTING";
/// nat: sets the masquerade mark.
pub const MARK_MASQ: &str = "SWYD-MARK-MASQ";
/// nat and filter: an empty chain written only by full syncs; when it is missing, someone removed our
/// chains (a firewall reload, `iptables -X`) and the edge must run a full sync.
pub const CANARY: &str = "SWYD-CANARY";

/// The longest chain name iptables accepts.
pub const MAX_CHAIN_LEN: usize = 28;
