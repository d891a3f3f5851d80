//! The nftables backend: plan → table model (pure), the diff that turns one model into another as one
//! `nft -f` transaction, the kernel edge, and the [`crate::sync::Dataplane`] that ties them together.
//!
//! ```text
//! NodeForwardingPlanSpec ─┐                          ┌─► diff(None, ·).text()          (render, golden tests)
//! HostFacts ──────────────┼─► render() ─► TableState ┤
//! family, skipped entries ┘                          └─► diff(read back, ·) ─► Transaction ─► nft -f -
//!
//! dataplane::NftablesDataplane ─► incremental::delta (partial) | render + diff (full) ─► kernel::Nft
//!        ▲ check_drift ◄── netlink summary                     ├─ exec::ExecNft: element-only → batch (netlink)
//!        └ full syncs  ◄── listing (nft -j list table)         │                  anything else → nft -f -
//!                                                              └─ fake::FakeNft
//! Chosen per plan by crate::backend::Selector (iptables where `nft` is missing); the real edges are
//! wired in crate::wiring::dataplane.
//! ```
//!
//! # Ownership contract
//!
//! The agent owns two tables entirely, `ip switchyard` and `ip6 switchyard`, and nothing else: it never
//! lists, changes or flushes another table, so other components (a CNI, a firewall, kube-proxy during a
//! migration) keep their own tables and order themselves against ours by hook priority. Within our
//! tables anything the agent did not write is removed by the next full sync. `cleanup` deletes the two
//! tables.
//!
//! # Priorities (a contract, as in kube-proxy's nftables README)
//!
//! | base chain                   | type   | hook        | priority          | does                                   |
//! |------------------------------|--------|-------------|-------------------|----------------------------------------|
//! | `filter-prerouting-pre-dnat` | filter | prerouting  | -110 (dstnat − 10)| source ranges of LoadBalancer IPs      |
//! | `filter-output-pre-dnat`     | filter | output      | -110 (dstnat − 10)| the same, for locally generated traffic|
//! | `nat-prerouting`             | nat    | prerouting  | -100 (dstnat)     | service DNAT                           |
//! | `nat-output`                 | nat    | output      | -100 (dstnat)     | service DNAT, locally generated        |
//! | `filter-input`               | filter | input       | 0 (filter)        | NodePorts / services without endpoints |
//! | `filter-forward`             | filter | forward     | 0 (filter)        | no endpoints; undefined ClusterIP ports|
//! | `filter-output`              | filter | output      | 0 (filter)        | the same, locally generated            |
//! | `nat-postrouting`            | nat    | postrouting | 100 (srcnat)      | masquerade (mark bit from the plan)    |
//!
//! Rules that must see packets before service DNAT belong below -110; after DNAT (destination is the
//! endpoint) above -100. Our filter chains only ever drop or reject; they never accept, because an
//! accept in one table does not stop another table from dropping.
//!
//! # Layout
//!
//! Plain entries (Cluster policies, no affinity) need no chain: their frontends go into class sets by
//! endpoint count (`fast-N`, `fast-np-N`) and their endpoints into `fast-N-eps` maps; per class in use,
//! one rule in `services` (or `nodeports`) sends members to the class chain `fast-N-dnat`, which DNATs
//! with `numgen random mod N` (see [`render()`]). Complex entries (iTP/eTP Local,
//! ClientIP affinity) get kube-proxy's per-service chains through the `service-ips` and
//! `service-nodeports` verdict maps. A one-service change is therefore a few element changes, sent to
//! the kernel as one netlink batch ([`batch`]) without starting `nft`; a packet costs at most one hash
//! lookup per class in use, whatever the number of services.
//!
//! # nft 1.0.6 constraints the layout works around
//!
//! - `nft` reads every element of every set before a `delete element` (14 ms at 10,000 services): element
//!   changes go over netlink.
//! - A map whose value is declared `ip daddr . th dport` cannot be named by a rule added in a later
//!   transaction ("conflicting protocols specified: ip vs. th"), and `tcp dport` would restrict the rule
//!   to TCP: so each class's DNAT rule lives in its own chain, created with the map and never rewritten
//!   apart from it (a damaged one makes the repair recreate the table).
//!
//! # Differences from kube-proxy's nftables mode
//!
//! - The class-map fast path above instead of a chain per service.
//! - Like kube-proxy's: `cluster-ips-check` drops `ip daddr { <the plan's serviceCIDRs> }` after DNAT,
//!   one element per range (nft merges adjacent ones).
//! - Like kube-proxy's nftables mode and unlike our iptables backend: no accept rules (forwarding of
//!   marked traffic, health-check node ports), no INVALID-drop rule, no localhost NodePorts.
//! - `status.rules` counts rules plus set and map elements, since most of the dispatch lives in elements.

pub mod batch;
pub mod claims;
pub mod counters;
pub mod dataplane;
pub mod diff;
pub mod exec;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod global;
pub mod incremental;
pub mod kernel;
pub mod listing;
pub mod model;
pub mod names;
pub mod netlink;
pub mod render;
pub mod transaction;

pub use dataplane::NftablesDataplane;
pub use model::{Key, SetId, TableState, Value};
pub use render::render;
pub use transaction::Transaction;

/// The `nft -f` text that creates the table for `spec`'s entries of `family` from nothing.
pub fn render_text(
    spec: &switchyard_api::NodeForwardingPlanSpec,
    facts: &crate::backend::HostFacts,
    family: switchyard_api::IpFamily,
    skip: &std::collections::HashSet<usize>,
) -> String {
    diff::diff(None, &render(spec, facts, family, skip)).text()
}
