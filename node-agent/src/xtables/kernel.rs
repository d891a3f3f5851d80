//! The iptables kernel edge (for the iptables backend and the IPVS glue): the [`Iptables`] trait, implemented by
//! [`super::exec::ExecIptables`] (the real binaries) and `fake::FakeIptables` (the tracer's
//! model of the kernel).
//!
//! ```text
//! IptablesDataplane ─► restore(family, input) ─► iptables-restore --noflush --wait  (stdin ◄─ input.write_to)
//!                  ├─► save_lines(family, table) ◄─ iptables-save -t <table>        (streamed line by line)
//!                  ├─► ensure_rule / delete_rule ─► iptables -C / -I <chain> 1 / -D
//!                  └─► chain_exists ─► iptables -S <chain>
//! ```
//!
//! The payload is a [`RestoreInput`] rather than a string so the edge can stream a 25 MB payload into
//! the child's stdin while it is rendered, and write it again (only the lines around the failing one)
//! to explain a failure.
//!
//! The dataplane inserts missing jump rules inside its full-sync restore (it learns which are missing
//! from the `iptables-save` it reads anyway), so they appear atomically with the chains and cost no
//! extra process; [`Iptables::ensure_jump`] is the one-rule form for tools and tests, and cleanup uses
//! [`Iptables::delete_rule`].

use switchyard_api::IpFamily;

use super::jumps::JumpRule;
use super::payload::Table;
use crate::command::RestoreInput;
use crate::error::Error;

/// The iptables operations the agent needs, for one host (both families).
///
/// Every method acts on the tables of `family`: `iptables*` for IPv4, `ip6tables*` for IPv6.
pub trait Iptables: Send {
    /// One `iptables-restore --noflush --wait` with `input` on stdin. Atomic: on failure the kernel
    /// keeps its previous rules, and the error carries the failing line and the lines around it.
    fn restore(&mut self, family: IpFamily, input: &mut dyn RestoreInput) -> Result<(), Error>;

    /// `iptables-save -t <table>`, handing each line to `each` as it is read.
    fn save_lines(&mut self, family: IpFamily, table: Table, each: &mut dyn FnMut(&str))
    -> Result<(), Error>;

    /// `iptables -C` then, when missing, `iptables -I <chain> 1`: true when the rule was inserted.
    fn ensure_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error>;

    /// `iptables -D <chain> <args>`: true when a rule was deleted, false when there was none.
    fn delete_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error>;

    /// True when `chain` exists in `table`.
    fn chain_exists(&mut self, family: IpFamily, table: Table, chain: &str) -> Result<bool, Error>;

    /// `iptables -S <chain>`: hands the chain's rules (`-A` lines, as iptables-save writes them) to
    /// `each`; false when the chain does not exist. With iptables-nft at scale this costs milliseconds
    /// where a whole-table save costs tens of seconds.
    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<bool, Error>;

    /// `iptables-save -t <table>` as one string.
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, Error> {
        let mut text = String::new();
        self.save_lines(family, table, &mut |line| {
            text.push_str(line);
            text.push('\n');
        })?;
        Ok(text)
    }

    /// Ensures one of our jump rules (a backend lists its own: `iptables::jump_rules`, the IPVS glue's): true when it had to be inserted.
    fn ensure_jump(&mut self, rule: &JumpRule) -> Result<bool, Error> {
        self.ensure_rule(rule.family, rule.table, rule.chain, &rule.args)
    }

    /// Deletes one of our jump rules: true when it was there.
    fn delete_jump(&mut self, rule: &JumpRule) -> Result<bool, Error> {
        self.delete_rule(rule.family, rule.table, rule.chain, &rule.args)
    }
}

/// The failing line named in `iptables-restore`'s stderr: legacy prints `line N failed` (or `Error
/// occurred at line: N`), nft prints `line N: <reason>`; the number follows the first `line` that has one.
pub fn failing_line(stderr: &str) -> Option<usize> {
    stderr.match_indices("line").find_map(|(at, word)| {
        let digits: String = stderr[at + word.len()..]
            .trim_start_matches([':', ' '])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_lines_are_found_in_both_backends_messages() {
        assert_eq!(failing_line("iptables-restore: line 12 failed"), Some(12));
        assert_eq!(
            failing_line(
                "iptables-restore v1.8.9 (nf_tables): line 7: RULE_APPEND failed (No such file or directory)"
            ),
            Some(7)
        );
        assert_eq!(
            failing_line(
                "ip6tables-restore v1.8.9 (legacy): Couldn't load target `X':No such file\n\nError occurred at line: 3"
            ),
            Some(3)
        );
        assert_eq!(
            failing_line("Another app is currently holding the xtables lock"),
            None
        );
        assert_eq!(failing_line("deadline exceeded"), None);
    }
}
