//! The kernel edge of the nftables backend: the [`Nft`] trait, implemented by [`super::exec::ExecNft`]
//! (the `nft` CLI and netlink dumps) and `fake::FakeNft` (an in-memory table with nft's rules
//! about references).
//!
//! ```text
//! NftablesDataplane ─► apply(Transaction)  ─► nft -f -            (one atomic transaction)
//!                  ├─► read(family)        ◄─ nft -j list table   (full read-back: sets, elements, chains)
//!                  ├─► exists(family)      ◄─ netlink table dump  (the canary before a partial sync)
//!                  └─► summary(family)     ◄─ netlink dumps       (cheap: counts and digests only)
//! ```

use std::collections::BTreeMap;

use switchyard_api::IpFamily;

use super::model::{SetId, TableState};
use super::transaction::Transaction;
use crate::error::Error;

/// A chain as the cheap look sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSummary {
    /// Hooked (a base chain).
    pub base: bool,
    /// Rules in it.
    pub rules: usize,
    /// The digest in its first rule's comment (with the `switchyard:` prefix).
    pub digest: Option<String>,
}

/// A named set as the cheap look sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSummary {
    /// Its comment (with the `switchyard:` prefix).
    pub digest: Option<String>,
    /// Elements in it.
    pub elements: usize,
}

/// Our table of one family at a glance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Every chain.
    pub chains: BTreeMap<String, ChainSummary>,
    /// Every named set and map.
    pub sets: BTreeMap<String, SetSummary>,
}

/// The nftables operations the agent needs, for one host (both families).
pub trait Nft: Send {
    /// One `nft -f -` transaction. Atomic: on failure the kernel keeps its previous ruleset.
    fn apply(&mut self, transaction: &Transaction<'_>) -> Result<(), Error>;

    /// Reads our table of `family` back whole; `None` when it does not exist.
    fn read(&mut self, family: IpFamily) -> Result<Option<TableState>, Error>;

    /// Whether our table of `family` exists (costs well under a millisecond).
    fn exists(&mut self, family: IpFamily) -> Result<bool, Error>;

    /// The cheap look at our table of `family`; `None` when it does not exist.
    fn summary(&mut self, family: IpFamily) -> Result<Option<Summary>, Error>;
}

/// How `found` differs from what `expected` says the table holds (empty when it agrees): missing or
/// extra chains and sets, rule counts and digests, hooks, and element counts of the sets the agent fills.
pub fn summary_differences(expected: &TableState, found: &Summary) -> Vec<String> {
    let family = expected.family;
    let mut differences = Vec::new();
    for (name, chain) in &expected.chains {
        let (rules, digest) = chain.summary();
        let digest = digest.map(|d| format!("{}{d}", super::names::DIGEST_PREFIX));
        match found.chains.get(name) {
            None => differences.push(format!("{family:?} chain {name} is missing")),
            Some(have) if have.base != chain.base.is_some() => {
                differences.push(format!("{family:?} chain {name} is hooked differently"))
            }
            Some(have) if have.rules != rules || have.digest != digest => differences.push(format!(
                "{family:?} chain {name} has {} rules, want {rules}{}",
                have.rules,
                if have.rules == rules { " (changed)" } else { "" }
            )),
            Some(_) => {}
        }
    }
    for name in found.chains.keys() {
        if !expected.chains.contains_key(name) {
            differences.push(format!("{family:?} chain {name} is not ours"));
        }
    }
    for (name, set) in &expected.sets {
        let digest = format!("{}{}", super::names::DIGEST_PREFIX, set.digest);
        let Some(have) = found.sets.get(name) else {
            differences.push(format!("{family:?} set {name} is missing"));
            continue;
        };
        if have.digest.as_deref() != Some(digest.as_str()) {
            differences.push(format!("{family:?} set {name} is declared differently"));
        } else if !set.dynamic() {
            let want = SetId::parse(name)
                .and_then(|id| expected.elements.get(&id))
                .map_or(0, |e| e.len());
            if have.elements != want {
                differences.push(format!(
                    "{family:?} set {name} has {} elements, want {want}",
                    have.elements
                ));
            }
        }
    }
    for name in found.sets.keys() {
        if !expected.sets.contains_key(name) {
            differences.push(format!("{family:?} set {name} is not ours"));
        }
    }
    differences
}
