//! Removing everything an iptables-based backend left: our jump rules from the built-in chains, then
//! our chains, in both families and both tables.
//!
//! ```text
//! iptables-save -t nat|filter ─► SavedTable (our jumps, our chains)
//!     ─► iptables -D <built-in> <jump>   (each jump rule)
//!     ─► one restore: declare (flush) every chain of ours, then -X each
//! ```
//!
//! What counts as ours is [`super::chains::PREFIX`], as [`SavedTable`] reads it, so this also removes
//! what an earlier version or the other iptables-based backend left.

use switchyard_api::IpFamily;

use super::kernel::Iptables;
use super::payload::Table;
use super::save::SavedTable;
use crate::error::Error;
use crate::sync::dataplane::Cleanup;

/// Removes every jump rule into our chains and every chain of ours, IPv6 skipped (with a warning)
/// where the host has no IPv6 netfilter.
pub fn remove_owned<I: Iptables + ?Sized>(iptables: &mut I) -> Result<Cleanup, Error> {
    remove_owned_matching(iptables, &|_| true)
}

/// [`remove_owned`] for the chains of ours `which` names only (and the jump rules into them): what one
/// iptables-based backend owns alone, when the other one took over the chains they share.
pub fn remove_owned_matching<I: Iptables + ?Sized>(
    iptables: &mut I,
    which: &dyn Fn(&str) -> bool,
) -> Result<Cleanup, Error> {
    let mut cleanup = Cleanup::default();
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let mut tables = Vec::new();
        for table in [Table::Nat, Table::Filter] {
            let mut saved = SavedTable::default();
            match iptables.save_lines(family, table, &mut |line| saved.feed(line)) {
                Ok(()) => tables.push((table, saved)),
                Err(e) if family == IpFamily::IPv6 => {
                    // A host without IPv6 netfilter has nothing of ours there.
                    tracing::warn!(error = %e, "skipping IPv6 cleanup");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        for (table, saved) in &tables {
            for jump in saved.jumps.iter().filter(|jump| which(jump.target())) {
                if iptables.delete_rule(family, *table, jump.chain, &jump.args)? {
                    cleanup.jumps += 1;
                }
            }
        }
        for (table, saved) in &tables {
            let names: Vec<&String> = saved.owned.keys().filter(|name| which(name)).collect();
            if names.is_empty() {
                continue;
            }
            let mut payload = format!("*{table}\n");
            for name in &names {
                payload.push_str(&format!(":{name} - [0:0]\n"));
            }
            for name in &names {
                payload.push_str(&format!("-X {name}\n"));
            }
            payload.push_str("COMMIT\n");
            iptables.restore(family, &mut payload)?;
            cleanup.objects += names.len();
        }
    }
    Ok(cleanup)
}
