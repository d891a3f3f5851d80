//! Drift checks of the iptables backend: does the kernel still hold what the last sync programmed?
//!
//! ```text
//! DriftSchedule::whole_due ─► whole: one iptables-save per table (every owned chain's rule count)
//!                          └► top-level only: our top-level chains and the built-in chains holding our
//!                             jumps, each listed on its own (per-Service chains wait for the next whole
//!                             check or the periodic full sync)
//! read_back ─► SavedTable ─► check_family: counts and jump rules against stream::Programmed ─► DriftReasons
//! DriftSchedule::record(cost) ─► whole checks spaced to ≤ 1/WHOLE_CHECK_SHARE of the time
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use switchyard_api::IpFamily;

use super::render::jump_rules;
use super::stream::Programmed;
use crate::error::Error;
use crate::sync::dataplane::DriftReasons;
use crate::xtables::kernel::Iptables;
use crate::xtables::payload::Table;
use crate::xtables::save::SavedTable;

/// A whole-table drift check cheaper than this runs on every check.
const WHOLE_CHECK_ALWAYS_BELOW: Duration = Duration::from_millis(200);
/// A costlier one runs at most once per this many times its own duration; the checks in between list
/// only the top-level chains and the built-in chains holding our jumps.
const WHOLE_CHECK_SHARE: u32 = 50;

/// When a drift check reads whole tables, from what the earlier checks cost.
#[derive(Debug, Default)]
pub(super) struct DriftSchedule {
    /// When the next check reads whole tables again (`None`: the next one does).
    next_whole_check: Option<Instant>,
    /// What the last whole-table and top-level-only checks cost.
    last_whole_check: Duration,
    last_top_check: Option<Duration>,
}

impl DriftSchedule {
    /// Whether a check starting `now` reads whole tables.
    pub(super) fn whole_due(&self, now: Instant) -> bool {
        // iptables-legacy reads the whole table even to list one chain, so there the top-level
        // listing costs more than a whole save: whichever was cheaper last time wins.
        let top_costlier = self
            .last_top_check
            .is_some_and(|top| top >= self.last_whole_check);
        top_costlier || self.next_whole_check.is_none_or(|at| now >= at)
    }

    /// Records what a check cost.
    pub(super) fn record(&mut self, whole: bool, cost: Duration) {
        if whole {
            // Whole-table saves are spaced so that they take at most 1/WHOLE_CHECK_SHARE of the time
            // (iptables-nft-save needs ~30 s at 10,000 Services); small rule sets are read every time.
            self.last_whole_check = cost;
            self.next_whole_check =
                (cost > WHOLE_CHECK_ALWAYS_BELOW).then(|| Instant::now() + cost * WHOLE_CHECK_SHARE);
        } else {
            self.last_top_check = Some(cost);
        }
    }

    /// As after an expensive whole-table check: the next whole one is due at `until` (`None`: now).
    #[cfg(test)]
    pub(super) fn defer_whole(&mut self, until: Option<Instant>) {
        self.next_whole_check = until;
        self.last_top_check = None;
    }
}

/// One `iptables-save` of `table`, only what we own kept.
pub(super) fn saved(
    iptables: &mut impl Iptables,
    family: IpFamily,
    table: Table,
) -> Result<SavedTable, Error> {
    let mut saved = SavedTable::default();
    iptables.save_lines(family, table, &mut |line| saved.feed(line))?;
    Ok(saved)
}

/// What the kernel holds of `table` for a drift check: with `whole`, one iptables-save of the table;
/// otherwise only `chains` and the built-in chains holding our jumps, each listed on its own
/// (milliseconds with iptables-nft even at 10,000 Services, where the save takes tens of seconds).
fn read_back(
    iptables: &mut impl Iptables,
    family: IpFamily,
    table: Table,
    whole: bool,
    chains: &[&str],
) -> Result<SavedTable, Error> {
    if whole {
        return saved(iptables, family, table);
    }
    let mut listed = SavedTable::default();
    for &chain in chains {
        if iptables.list_chain(family, table, chain, &mut |line| listed.feed(line))? {
            listed.owned.entry(chain.to_string()).or_insert(0);
        }
    }
    let mut built_ins: Vec<&str> = jump_rules(family)
        .into_iter()
        .filter(|j| j.table == table)
        .map(|j| j.chain)
        .collect();
    built_ins.sort_unstable();
    built_ins.dedup();
    for chain in built_ins {
        iptables.list_chain(family, table, chain, &mut |line| listed.feed(line))?;
    }
    Ok(listed)
}

/// Compares the kernel with what was `programmed` in `family`: every owned chain's rule count (only
/// the top-level ones unless `whole`) and our jump rules.
pub(super) fn check_family(
    iptables: &mut impl Iptables,
    family: IpFamily,
    programmed: &Programmed,
    whole: bool,
    reasons: &mut DriftReasons,
) -> Result<(), Error> {
    for table in [Table::Filter, Table::Nat] {
        let expected: HashMap<&str, usize> = if whole {
            programmed.chain_counts(table)
        } else {
            programmed.top_chain_counts(table).into_iter().collect()
        };
        let chains: Vec<&str> = expected.keys().copied().collect();
        let saved = read_back(iptables, family, table, whole, &chains)?;
        for (name, want) in &expected {
            match saved.owned.get(*name) {
                None => reasons.note(format!("{family:?} {table} chain {name} is missing")),
                Some(have) if have != want => reasons.note(format!(
                    "{family:?} {table} chain {name} has {have} rules, want {want}"
                )),
                Some(_) => {}
            }
        }
        for name in saved.owned.keys() {
            if !expected.contains_key(name.as_str()) {
                reasons.note(format!("{family:?} {table} chain {name} is not ours any more"));
            }
        }
        for jump in jump_rules(family).iter().filter(|j| j.table == table) {
            if !saved.has_jump(jump) {
                reasons.note(format!(
                    "{family:?} {table} jump {} -> {} is missing",
                    jump.chain,
                    jump.target()
                ));
            }
        }
    }
    Ok(())
}
