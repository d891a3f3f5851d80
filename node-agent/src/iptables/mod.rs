//! The iptables backend: plan → rules → `iptables-restore` text (pure), and the
//! [`crate::sync::Dataplane`] that applies it through the iptables toolkit ([`crate::xtables`]: the
//! kernel edge, save reader, restore text, packet tracer), which the IPVS glue uses too.
//!
//! ```text
//! NodeForwardingPlanSpec ─┐                         ┌─► full_payload() / partial_payload()   (render, tests)
//! HostFacts ──────────────┼─► render() ─► Ruleset ──┤
//! family, skipped entries ┘                         └─► Tracer::from_ruleset() ─► trace(packet)
//!
//! dataplane::IptablesDataplane ─► stream::PayloadJob (render_selected, streamed) ─► xtables::kernel::Iptables
//!        ▲ drift (check_drift) / cleanup ◄── xtables::save::SavedTable ◄── iptables-save   ├─ xtables::exec
//!        │                                                                         └─ xtables::fake
//!        └─ xtables::mode: iptables-nft or iptables-legacy, as the host uses it
//! ```
//!
//! # Ownership contract
//!
//! Every chain we write starts with `SWYD-` ([`crate::xtables::chains::PREFIX`]); nothing else on the host is touched
//! except the jump rules from built-in chains listed by [`jump_rules`], which `cleanup` removes again.
//! A restore declares (and so flushes) only our chains, with `--noflush`, so other users' rules in the
//! same tables survive every sync.
//!
//! # Semantics
//!
//! The rules are kube-proxy v1.36's iptables mode (`pkg/proxy/iptables/proxier.go`) rule for rule with
//! `SWYD-` for `KUBE-`; chain names use kube-proxy's hash scheme ([`names`]). Comments of per-service
//! rules are kube-proxy's (`"ns/svc:port cluster IP"`, `"... has no endpoints"`, ...); the fixed rules
//! and jump rules say "switchyard" where kube-proxy's say "kubernetes", so both proxies' rules can be
//! told apart in one dump.
//!
//! Deliberate differences from kube-proxy's iptables mode:
//! - Localhost NodePorts are opt-in (the plan's `localhostNodePorts`; kube-proxy's default is on):
//!   `route_localnet` opens CVE-2020-8558. Off, the NodePort jump excludes `127.0.0.0/8` (`::1` for
//!   IPv6, always), as kube-proxy with `--iptables-localhost-nodeports=false`. On, each NodePort gets a
//!   `-d 127.0.0.0/8` rule of its own ahead of the general one, and filter `SWYD-NODEPORTS` holds
//!   kube-proxy's anti-martian DROP (its KUBE-FIREWALL rule).
//! - No nfacct: kube-proxy's `iptables_ct_state_invalid_dropped_packets_total` and
//!   `iptables_localhost_nodeports_accepted_packets_total` are read from the rules' own counters
//!   ([`counters`]).
//! - One DROP per ServiceCIDR at the end of filter `SWYD-SERVICES` (kube-proxy's iptables mode has
//!   none; its nftables mode drops the same): after DNAT, what is still addressed inside a Service range
//!   is for an unallocated address, or for a port no Service defines on a ClusterIP (nftables rejects
//!   that one; here it is dropped too).
//! - Large-cluster mode (no per-endpoint comments above [`render::LARGE_CLUSTER_ENDPOINTS`]) counts the
//!   endpoints of the plan's entries, as kube-proxy counts its endpoints map.
//! - A canary chain ([`names::CANARY`]) in both tables, written by full syncs only (see [`payload`]).

pub mod counters;
pub mod dataplane;
mod drift;
pub mod names;
pub mod render;
pub mod ruleset;
pub mod stream;
mod trace;

pub use render::{jump_rules, probability, render, render_each, render_groups, render_selected};
pub use ruleset::{Ruleset, RulesetDigest, ServiceChains};
