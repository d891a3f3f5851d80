//! The partial sync: only the entries that changed are rendered, and the table model is updated in place.
//!
//! ```text
//! previous entries ─┐ by key (name, protocol, family)
//! current entries ──┴─► changed / added / removed ─► release(render_entry(old)), claim(render_entry(new))
//!                                                      │ Touched: elements, chains, sets as they were
//!                                                      ▼
//!             render_global (classes in use, top-level chains) ─► compare with before ─► Transaction
//! ```
//!
//! At 10,000 services a one-service change renders two entries instead of 10,000 and writes a handful
//! of element changes. The environment (node IPs, cluster settings, NodePort addresses) must be the one
//! the model was rendered with; the caller checks that. A [`Conflict`] (a contested map key) leaves the
//! model half-updated: the caller drops it and runs a full sync.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use switchyard_api::{IpFamily, Protocol, ServicePlan};

use super::claims::{self, Conflict, Touched};
use super::global::{is_global_chain, render_global};
use super::model::{ChainDef, SetId, TableState};
use super::render::render_entry;
use super::transaction::{Transaction, TxBuilder};
use crate::backend::FamilyEnv;

/// What a partial sync did.
#[derive(Debug)]
pub struct Delta {
    /// The transaction (empty when nothing changed).
    pub transaction: Transaction<'static>,
    /// Entries rendered anew (changed, added or removed).
    pub entries: usize,
}

type Key<'a> = (&'a str, Protocol, IpFamily);

/// Updates `state` from the `previous` entries to the `current` ones and returns the transaction that
/// makes the same change in the kernel.
pub fn delta(
    state: &mut TableState,
    env: &FamilyEnv,
    previous: &[&Arc<ServicePlan>],
    current: &[&Arc<ServicePlan>],
) -> Result<Delta, Conflict> {
    // Entries compare as `Arc`s: one shared with the previous plan (composed from an unchanged slice)
    // is equal by pointer, without comparing its fields.
    let old: HashMap<Key<'_>, &Arc<ServicePlan>> = previous.iter().map(|e| (e.key(), *e)).collect();
    let new: HashMap<Key<'_>, &Arc<ServicePlan>> = current.iter().map(|e| (e.key(), *e)).collect();
    let mut touched = Touched::default();
    let mut entries = 0;
    // All releases before any claim, so an element moving between entries is released first.
    for entry in previous {
        if new.get(&entry.key()) != Some(entry) {
            claims::release(state, &render_entry(entry, env), &mut touched)?;
            entries += 1;
        }
    }
    for entry in current {
        match old.get(&entry.key()) {
            Some(before) if before == entry => {}
            Some(_) => claims::claim(state, render_entry(entry, env), &mut touched)?,
            None => {
                claims::claim(state, render_entry(entry, env), &mut touched)?;
                entries += 1;
            }
        }
    }

    let global_before: BTreeMap<String, ChainDef> = state
        .chains
        .iter()
        .filter(|(name, _)| is_global_chain(name))
        .map(|(name, chain)| (name.clone(), chain.clone()))
        .collect();
    let classes_before: Vec<String> = state
        .sets
        .keys()
        .filter(|name| SetId::parse(name).is_some())
        .cloned()
        .collect();
    render_global(env, state);

    let mut tx = TxBuilder::new(env.family);
    for name in &classes_before {
        if !state.sets.contains_key(name) {
            tx.set_removed(name);
        }
    }
    for (name, set) in &state.sets {
        if SetId::parse(name).is_some()
            && !classes_before.contains(name)
            && let Some(decl) = &set.decl
        {
            tx.set_added(name, decl);
        }
    }
    for (name, before) in &touched.sets {
        match (before, state.sets.get(name).and_then(|s| s.decl.as_ref())) {
            (None, Some(decl)) => tx.set_added(name, decl),
            (Some(_), None) => tx.set_removed(name),
            _ => {}
        }
    }
    for (name, chain) in state.chains.iter().filter(|(name, _)| is_global_chain(name)) {
        match global_before.get(name) {
            None => tx.chain_added(name, chain),
            Some(before) if before.summary() != chain.summary() => tx.chain_changed(name, chain),
            Some(_) => {}
        }
    }
    for name in global_before.keys() {
        if !state.chains.contains_key(name) {
            // The chain of a class no longer in use.
            tx.chain_removed(name);
        }
    }
    for (name, before) in &touched.chains {
        match (before, state.chains.get(name)) {
            (None, Some(chain)) => tx.chain_added(name, chain),
            (Some(_), None) => tx.chain_removed(name),
            (Some(before), Some(chain)) if before.summary() != chain.summary() => {
                tx.chain_changed(name, chain)
            }
            _ => {}
        }
    }
    for ((id, key), before) in &touched.elements {
        let after = state.value(*id, key);
        if before.as_ref() == after {
            continue;
        }
        let name = id.name();
        if before.is_some() {
            tx.element_removed(&name, *key);
        }
        if let Some(value) = after {
            tx.element_added(&name, *key, value.clone());
        }
    }
    Ok(Delta {
        transaction: tx.finish(),
        entries,
    })
}
