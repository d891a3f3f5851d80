//! The IPVS backend: plan → virtual servers, service addresses, ipsets and a fixed iptables glue
//! (pure), and the kernel edges that apply them by difference.
//!
//! ```text
//! NodeForwardingPlanSpec ─► render() ─► Desired { virtuals, addresses, sets, glue }      (render, sets, glue)
//!                                          │
//!   dataplane::IpvsDataplane ─► diff::reconcile per virtual server ─► kernel::Ipvs ─┬─ netlink::NetlinkIpvs
//!        │                                                                          │   (codec: IPVS genetlink)
//!        │                                                                          └─ fake::FakeIpvs
//!        ├─► ipset::Ipsets (ipset restore batches)        ExecIpsets │ FakeIpsets
//!        ├─► dummy::ServiceAddrs (swyd-ipvs0, rtnetlink)   NetlinkDummy │ FakeDummy
//!        ├─► xtables::kernel::Iptables (the glue)          ExecIptables │ xtables::fake::FakeIptables
//!        └─► crate::sysctl::Sysctls (sysctl::wanted)       ProcSysctls │ FakeSysctls
//! Chosen per plan by crate::backend::Selector (iptables where the kernel has no IPVS); the real edges
//! are wired in crate::wiring::dataplane.
//! ```
//!
//! # Ownership contract
//!
//! IPVS mode owns: virtual servers whose address is on `swyd-ipvs0` or that are NodePorts listed in its
//! `SWYD-*NODE-PORT*` ipsets; the interface `swyd-ipvs0`; every ipset named `SWYD-*`; every iptables chain
//! named `SWYD-*` and the jump rules into them. `cleanup` removes exactly those. Other virtual servers in
//! the IPVS table (another tool's, fwmark services) are never touched.
//!
//! # Semantics
//!
//! kube-proxy v1.36's IPVS mode (`pkg/proxy/ipvs/proxier.go`): one virtual server per frontend, NAT
//! forwarding, weight 1, ClientIP affinity as persistence, the ipset-driven glue, kube-proxy's sysctls,
//! graceful removal of real servers. Deliberate differences:
//! - No-endpoint verdicts like the iptables backend (REJECT with no endpoints anywhere, DROP when only the
//!   local set is empty), through two more ipsets; kube-proxy's IPVS mode leaves them to IPVS, which answers
//!   ICMP port-unreachable either way.
//! - NodePort sets hold node address and port (`hash:ip,port`), not just the port (`bitmap:port`), so a
//!   NodePort never matches traffic to other local addresses, and they double as the record of which
//!   NodePort virtual servers are ours.
//! - No `physdev` match for external IPs (it needs br_netfilter).
//! - The dummy interface is up (IPv6 needs it for local routes); it has NOARP, so this announces nothing.

pub mod codec;
pub mod counters;
pub mod dataplane;
pub mod diff;
pub mod dummy;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod glue;
pub mod ipset;
pub mod kernel;
pub mod netlink;
pub mod render;
pub mod render_text;
pub mod sets;
pub mod sysctl;

pub use dataplane::{IpvsConfig, IpvsDataplane, IpvsEdges};
pub use render::{Desired, VirtualServer, node_port_addresses, render};
