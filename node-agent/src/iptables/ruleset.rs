//! The rendered ruleset and the `iptables-restore --noflush` text made from it.
//!
//! ```text
//! render() ─► Ruleset { top-level filter chains, top-level nat chains, per-service nat chain groups }
//!                 │
//!                 ├─ full_payload()            every owned chain declared (= flushed), canary too
//!                 ├─ partial_payload(changed)  top-level + changed services' chains, `-X` stale ones
//!                 └─ digest() ─► RulesetDigest (kept after an apply) ─► changed_since / stale_chains
//! ```
//!
//! With `--noflush`, a `:CHAIN - [0:0]` line creates the chain if needed and flushes it, and chains the
//! payload does not mention are left alone. That is what makes kube-proxy's partial syncs (KEP-3453) work:
//! the top-level chains (and the whole filter table) are rewritten every time, because they hold one rule
//! per frontend of every service, while a service's own SVC/SVL/EXT/FW/SEP chains are written only when
//! that service changed. Chains that are no longer rendered are declared (flushed) and then deleted with
//! `-X` at the end of the nat table, after every chain that referred to them has been rewritten.
//!
//! The edge does not need to keep the last applied [`Ruleset`] (tens of megabytes at 10,000 services)
//! to know what changed: a [`RulesetDigest`] holds one fingerprint per entry's chain group and the nat
//! chain names, which is all [`Ruleset::changed_since`] and [`Ruleset::stale_chains`] need.
//!
//! The canary chain is declared only by full syncs: if it is missing before a partial sync, something
//! removed our chains since the last full sync, and the edge must not trust a partial one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};

use switchyard_api::{EntryKey, IpFamily};

use super::names;
use crate::xtables::payload::{Chain, Table};

/// The nat chains that belong to one entry (EXT, FW, SVC, SVL, SEPs, those that are in use), which a
/// partial sync rewrites only when the entry changed. An entry may own no chain at all (no endpoints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// Which entry.
    pub key: EntryKey,
    /// Its chains, in the order they are written.
    pub chains: Vec<Chain>,
    /// A fingerprint of the rules the entry adds to the top-level chains (its frontends and verdicts):
    /// equal fingerprints of an entry's old and new versions mean the top-level chains did not change
    /// because of it.
    pub frontends: u64,
}

/// The complete desired state of the agent's chains for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub(crate) family: IpFamily,
    pub(crate) filter: Vec<Chain>,
    pub(crate) nat: Vec<Chain>,
    pub(crate) services: Vec<ServiceChains>,
}

/// The part of an applied [`Ruleset`] that partial syncs compare against: a fingerprint of every
/// entry's chain group and the names of the nat chains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RulesetDigest {
    groups: BTreeMap<EntryKey, u64>,
    nat_chains: BTreeSet<String>,
}

impl RulesetDigest {
    /// The nat chains the ruleset owned (input for [`Ruleset::stale_chains`]).
    pub fn nat_chains(&self) -> &BTreeSet<String> {
        &self.nat_chains
    }
}

/// A 64-bit fingerprint of a chain group. `DefaultHasher::new()` uses fixed keys, so fingerprints are
/// stable within a process, which is as long as a digest lives. A collision would only delay one
/// service's update until the next full sync.
fn fingerprint(chains: &[Chain]) -> u64 {
    let mut hasher = DefaultHasher::new();
    chains.hash(&mut hasher);
    hasher.finish()
}

/// Which nat service groups a payload carries.
enum Selection<'a> {
    All,
    Changed(&'a BTreeSet<EntryKey>),
}

impl Ruleset {
    /// The family this ruleset is for (`iptables` for IPv4, `ip6tables` for IPv6).
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Top-level filter chains (including the canary), rewritten by every sync.
    pub fn filter_chains(&self) -> &[Chain] {
        &self.filter
    }

    /// Top-level nat chains (including the canary), rewritten by every sync.
    pub fn nat_chains(&self) -> &[Chain] {
        &self.nat
    }

    /// Per-entry nat chain groups, in plan order.
    pub fn services(&self) -> &[ServiceChains] {
        &self.services
    }

    /// The chain group of one entry, if the entry was rendered.
    pub fn service(&self, key: &EntryKey) -> Option<&ServiceChains> {
        self.services.iter().find(|s| &s.key == key)
    }

    /// Every chain the ruleset owns, per table, sorted (for stale-chain detection and canary checks).
    pub fn chains(&self) -> BTreeMap<Table, BTreeSet<String>> {
        let filter = self.filter.iter().map(|c| c.name.clone()).collect();
        let nat = self
            .nat
            .iter()
            .chain(self.services.iter().flat_map(|s| s.chains.iter()))
            .map(|c| c.name.clone())
            .collect();
        BTreeMap::from([(Table::Filter, filter), (Table::Nat, nat)])
    }

    /// How many rules a full sync writes (both tables), as reported in the plan status.
    pub fn rule_count(&self) -> usize {
        self.filter
            .iter()
            .chain(self.nat.iter())
            .chain(self.services.iter().flat_map(|s| s.chains.iter()))
            .map(|c| c.rules.len())
            .sum()
    }

    /// What a later partial sync needs to know about this ruleset once it is applied.
    pub fn digest(&self) -> RulesetDigest {
        let groups = self
            .services
            .iter()
            .map(|s| (s.key.clone(), fingerprint(&s.chains)))
            .collect();
        let nat_chains = self.nat_names().into_iter().map(str::to_string).collect();
        RulesetDigest { groups, nat_chains }
    }

    /// Entries whose chain group differs from the one `previous` was taken from, or is new: what a
    /// partial sync must write. Entries that disappeared are not listed; their chains show up in
    /// [`Ruleset::stale_chains`].
    pub fn changed_since(&self, previous: &RulesetDigest) -> BTreeSet<EntryKey> {
        self.services
            .iter()
            .filter(|s| previous.groups.get(&s.key) != Some(&fingerprint(&s.chains)))
            .map(|s| s.key.clone())
            .collect()
    }

    /// Per-service nat chains among `existing` (from `iptables-save -t nat`, or
    /// [`RulesetDigest::nat_chains`] of the last applied ruleset) that this ruleset no longer has, sorted. Chains that are not ours, and
    /// top-level chains, are never returned.
    pub fn stale_chains<I, S>(&self, existing: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let owned = self.nat_names();
        let stale: BTreeSet<String> = existing
            .into_iter()
            .filter(|name| names::is_service_chain(name.as_ref()) && !owned.contains(name.as_ref()))
            .map(|name| name.as_ref().to_string())
            .collect();
        stale.into_iter().collect()
    }

    /// The complete `iptables-restore --noflush` input: every owned chain of both tables declared (which
    /// flushes it) and rewritten, canary included.
    pub fn full_payload(&self) -> String {
        self.payload(Selection::All, &[], true)
    }

    /// [`Ruleset::full_payload`] that also deletes `stale_chains` (see [`Ruleset::stale_chains`]).
    pub fn full_payload_removing(&self, stale_chains: &[String]) -> String {
        self.payload(Selection::All, stale_chains, true)
    }

    /// A partial sync: the filter table and the top-level nat chains in full, the chain groups of the
    /// `changed` entries, and `stale_chains` flushed and deleted. Keys not in the ruleset are ignored;
    /// so are stale names that are still owned or are not per-service chains, so a wrong list cannot
    /// delete a chain that is in use. The canary is not declared (see the module docs).
    pub fn partial_payload(&self, changed: &BTreeSet<EntryKey>, stale_chains: &[String]) -> String {
        self.payload(Selection::Changed(changed), stale_chains, false)
    }

    fn nat_names(&self) -> BTreeSet<&str> {
        self.nat
            .iter()
            .chain(self.services.iter().flat_map(|s| s.chains.iter()))
            .map(|c| c.name.as_str())
            .collect()
    }

    fn payload(&self, selection: Selection<'_>, stale_chains: &[String], canary: bool) -> String {
        let keep = |c: &&Chain| canary || c.name != names::CANARY;
        let mut out = String::with_capacity(self.estimated_len());

        let filter: Vec<&Chain> = self.filter.iter().filter(keep).collect();
        write_table(&mut out, Table::Filter, &filter, &[]);

        let owned = self.nat_names();
        let mut stale: Vec<&str> = stale_chains
            .iter()
            .map(String::as_str)
            .filter(|name| names::is_service_chain(name) && !owned.contains(name))
            .collect();
        stale.sort_unstable();
        stale.dedup();
        let mut nat: Vec<&Chain> = self.nat.iter().filter(keep).collect();
        for group in &self.services {
            let wanted = match selection {
                Selection::All => true,
                Selection::Changed(changed) => changed.contains(&group.key),
            };
            if wanted {
                nat.extend(group.chains.iter());
            }
        }
        write_table(&mut out, Table::Nat, &nat, &stale);
        out
    }

    fn estimated_len(&self) -> usize {
        // Rules average well under 160 bytes; a close guess avoids repeated reallocation of a payload
        // that can reach tens of megabytes.
        self.rule_count() * 160 + 1024
    }
}

/// Writes one table: sorted declarations (live chains and stale ones), rules chain by chain in the
/// given order, then the deletions, then COMMIT.
fn write_table(out: &mut String, table: Table, chains: &[&Chain], stale: &[&str]) {
    let _ = writeln!(out, "*{table}");
    let mut declared: Vec<&str> = chains
        .iter()
        .map(|c| c.name.as_str())
        .chain(stale.iter().copied())
        .collect();
    declared.sort_unstable();
    declared.dedup();
    for name in declared {
        let _ = writeln!(out, ":{name} - [0:0]");
    }
    for chain in chains {
        for rule in &chain.rules {
            let _ = writeln!(out, "-A {} {rule}", chain.name);
        }
    }
    for name in stale {
        let _ = writeln!(out, "-X {name}");
    }
    out.push_str("COMMIT\n");
}
