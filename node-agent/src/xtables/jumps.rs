//! Jump rules: the rules in built-in chains (INPUT, FORWARD, OUTPUT, PREROUTING, POSTROUTING) that
//! send traffic into our chains, as data both iptables-based backends list their own from.
//!
//! ```text
//! JumpRow (table, built-in chain, our chain, matches, comment) ─► JumpRule::from_rows ─► [JumpRule]
//!     ─► Iptables::ensure_jump / a full sync's restore (-I <chain> 1)   ─► cleanup's delete_rule
//! ```
//!
//! The lists themselves are the backends': `iptables::jump_rules` and the IPVS glue's `jump_rules`.

use switchyard_api::IpFamily;

use super::payload::Table;

/// A rule that must exist in a built-in chain, jumping into one of ours. The edge checks each with
/// `iptables -t <table> -C <chain> <args>` and prepends missing ones with `-I <chain> 1 <args>`, in list
/// order, on full syncs only (as kube-proxy's `EnsureRule(Prepend)`), so the last rule listed for a chain
/// ends up first in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpRule {
    /// Which binary: `iptables` (IPv4) or `ip6tables` (IPv6).
    pub family: IpFamily,
    /// The table.
    pub table: Table,
    /// The built-in chain (`INPUT`, `FORWARD`, `OUTPUT`, `PREROUTING`, `POSTROUTING`).
    pub chain: &'static str,
    /// The rule as an argument vector (comments unquoted, ready for `Command::args`), ending in
    /// `-j <our chain>`.
    pub args: Vec<String>,
}

impl JumpRule {
    /// `-A <chain> [extra] -m comment --comment <comment> -j <target>` in `table` of `family`.
    pub fn new(
        family: IpFamily,
        table: Table,
        chain: &'static str,
        extra: &[&str],
        comment: &str,
        target: &str,
    ) -> Self {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["-m", "comment", "--comment", comment, "-j", target].map(String::from));
        Self {
            family,
            table,
            chain,
            args,
        }
    }

    /// One rule per row of `(table, built-in chain, our chain, extra matches, comment)`, in order.
    pub fn from_rows(family: IpFamily, rows: &[JumpRow]) -> Vec<Self> {
        rows.iter()
            .map(|(table, chain, target, extra, comment)| {
                Self::new(family, *table, chain, extra, comment, target)
            })
            .collect()
    }

    /// The chain this rule jumps to.
    pub fn target(&self) -> &str {
        self.args.last().map_or("", String::as_str)
    }
}

/// A jump rule as a table row: table, built-in chain, our chain, extra matches, comment.
pub type JumpRow = (
    Table,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

/// `-m conntrack --ctstate NEW`: jump rules that only new connections take.
pub const NEW_CONNECTIONS: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];

/// The comments of our jump rules (kube-proxy's, with "switchyard" for "kubernetes"); the IPVS glue
/// shares those of the chains it shares.
pub mod jump_comments {
    /// Into SWYD-EXTERNAL-SERVICES.
    pub const EXTERNAL: &str = "switchyard externally-visible service portals";
    /// Into SWYD-NODEPORTS (filter).
    pub const HEALTH: &str = "switchyard health check service ports";
    /// Into SWYD-SERVICES.
    pub const PORTALS: &str = "switchyard service portals";
    /// Into SWYD-FORWARD.
    pub const FORWARDING: &str = "switchyard forwarding rules";
    /// Into SWYD-PROXY-FIREWALL.
    pub const FIREWALL: &str = "switchyard load balancer firewall";
    /// Into SWYD-POSTROUTING.
    pub const POSTROUTING: &str = "switchyard postrouting rules";
}
