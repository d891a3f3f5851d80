//! The pieces of `iptables-restore --noflush` text every iptables-based backend writes: the tables, a
//! chain with its rules, and the lines that declare and fill a chain.
//!
//! ```text
//! Chain { name, rules } ─► write_declaration ─► ":SWYD-X - [0:0]"   (creates or flushes the chain)
//!                       └► write_rules ───────► "-A SWYD-X <rule>"   (one line per rule)
//! ```

/// An iptables table the agent writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `filter`: REJECT/DROP verdicts, forward acceptance, health-check ACCEPTs.
    Filter,
    /// `nat`: DNAT to endpoints and the masquerade mark.
    Nat,
}

impl Table {
    /// The name `iptables -t` and `*table` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
        }
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One chain and its rules. Each rule is the text that follows `-A <chain> ` in the restore input, with
/// comments already quoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// The chain name (`SWYD-...`).
    pub name: String,
    /// The rules in order.
    pub rules: Vec<String>,
}

impl Chain {
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            rules: Vec::new(),
        }
    }
}

/// Writes `-A <chain> <rule>` for every rule of `chain` (the restore format).
pub fn write_rules(out: &mut dyn std::io::Write, chain: &Chain) -> std::io::Result<()> {
    for rule in &chain.rules {
        writeln!(out, "-A {} {rule}", chain.name)?;
    }
    Ok(())
}

/// Writes the declaration `:<name> - [0:0]`, which with `--noflush` creates or flushes the chain.
pub fn write_declaration(out: &mut dyn std::io::Write, name: &str) -> std::io::Result<()> {
    writeln!(out, ":{name} - [0:0]")
}
