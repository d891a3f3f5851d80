//! The full diff: what the kernel has (read back, or nothing) → what the render wants, as one transaction.
//!
//! ```text
//! before: Option<TableState> (None: no table) ─┐
//! after:  TableState (render) ─────────────────┴─► diff() ─► Transaction (empty when they agree)
//!   set declared differently, base chain hooked differently, or a class's DNAT chain damaged ─► the table
//!   is deleted and created again, in the same transaction (no other way to change a declaration; rare:
//!   an upgrade or tampering)
//!   otherwise ─► only differing sets, chains (by rule count + digest) and elements change
//! ```
//!
//! Nothing is flushed when the kernel already matches: a restarted agent diffs against the table it
//! finds and leaves working rules (and the kernel's affinity state) alone.

use super::model::{SetId, TableState};
use super::transaction::{Transaction, TxBuilder};

/// The transaction that turns `before` into `after`.
pub fn diff<'a>(before: Option<&TableState>, after: &'a TableState) -> Transaction<'a> {
    let mut tx = TxBuilder::new(after.family);
    let Some(before) = before.filter(|b| !needs_recreate(b, after)) else {
        if before.is_some() {
            tx.recreate_table();
        } else {
            tx.create_table();
        }
        create_all(&mut tx, after);
        return tx.finish();
    };

    for (name, set) in &after.sets {
        match (before.sets.get(name), &set.decl) {
            (None, Some(decl)) => tx.set_added(name, decl),
            _ => {
                if before.unreadable.contains(name) {
                    tx.set_flushed(name);
                }
            }
        }
    }
    for name in before.sets.keys() {
        if !after.sets.contains_key(name) {
            tx.set_removed(name);
        }
    }

    for (name, chain) in &after.chains {
        match before.chains.get(name) {
            None => tx.chain_added(name, chain),
            Some(old) if old.summary() != chain.summary() => tx.chain_changed(name, chain),
            Some(_) => {}
        }
    }
    for name in before.chains.keys() {
        if !after.chains.contains_key(name) {
            tx.chain_removed(name);
        }
    }

    let empty = Default::default();
    for (id, elements) in &after.elements {
        let name = id.name();
        let flushed = before.unreadable.contains(&name);
        let old = before.elements.get(id).filter(|_| !flushed).unwrap_or(&empty);
        for (key, claim) in old {
            match elements.get(key) {
                Some(new) if new.value == claim.value => {}
                _ => tx.element_removed(&name, *key),
            }
        }
        for (key, claim) in elements {
            match old.get(key) {
                Some(have) if have.value == claim.value => {}
                _ => tx.element_added(&name, *key, claim.value.clone()),
            }
        }
    }
    for (id, elements) in &before.elements {
        if !after.elements.contains_key(id) && after.sets.contains_key(&id.name()) {
            for key in elements.keys() {
                tx.element_removed(&id.name(), *key);
            }
        }
    }
    tx.finish()
}

/// Everything in `after`, for an empty (new or recreated) table.
fn create_all<'a>(tx: &mut TxBuilder<'a>, after: &'a TableState) {
    for (name, set) in &after.sets {
        if let Some(decl) = &set.decl {
            tx.set_added(name, decl);
        }
    }
    for (name, chain) in &after.chains {
        tx.chain_added(name, chain);
    }
    for (id, elements) in &after.elements {
        tx.set_filled(&id.name(), elements);
    }
}

/// A set of `after` exists with another declaration, or a chain with another hook: neither can be
/// changed in place.
fn needs_recreate(before: &TableState, after: &TableState) -> bool {
    let set_differs = after
        .sets
        .iter()
        .any(|(name, set)| before.sets.get(name).is_some_and(|old| old.digest != set.digest));
    let hook_differs = after
        .chains
        .iter()
        .any(|(name, chain)| before.chains.get(name).is_some_and(|old| old.base != chain.base));
    // A class's DNAT chain can only be written together with its map (nft 1.0.6 cannot add a rule naming
    // an existing map declared with `th dport`), so a damaged one means recreating the table.
    let class_chain_differs = after.chains.iter().any(|(name, chain)| {
        SetId::of_dnat_chain(name)
            .and_then(SetId::endpoints_map)
            .is_some_and(|map| {
                before.sets.contains_key(&map.name())
                    && before.chains.get(name).map(|c| c.summary()) != Some(chain.summary())
            })
    });
    set_differs || hook_differs || class_chain_differs
}
