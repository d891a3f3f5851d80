//! Reading `iptables-save -t <table>` output: which of our chains exist with how many rules, and which
//! rules of the built-in chains jump into ours.
//!
//! ```text
//! iptables-save -t nat ─► line by line ─► SavedTable::feed() ─► SavedTable { owned: chain → rules,
//!                                                                            jumps: [(built-in chain, args)] }
//!                                                                  │
//!                           drift check (rule counts, jump rules) ◄┴► cleanup (jumps to delete, chains to drop)
//! ```
//!
//! Lines are fed one at a time so a 10,000-service table (30 MB of text) is never held in memory.
//! Only what the agent owns is kept: chains starting with [`names::PREFIX`], and rules of the built-in
//! chains whose target is one of them. Rules of anybody else's chains are counted nowhere and kept
//! nowhere.

use std::collections::BTreeMap;

use super::names;
use super::render::JumpRule;

/// Built-in chains of the filter and nat tables (the only places our jump rules live).
pub const BUILT_IN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// One built-in chain's rule that jumps into a chain of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedJump {
    /// The built-in chain (`INPUT`, ...).
    pub chain: &'static str,
    /// The rule's arguments after `-A <chain>`, unquoted (ready for `iptables -D <chain> <args>`).
    pub args: Vec<String>,
}

impl SavedJump {
    /// The chain it jumps to.
    pub fn target(&self) -> &str {
        target_of(&self.args).unwrap_or_default()
    }

    /// The text of its `--comment`, if any.
    pub fn comment(&self) -> Option<&str> {
        comment_of(&self.args)
    }

    /// True when this saved rule is `rule` (same chain, target and comment; the kernel may print the
    /// matches in another canonical form, so they are not compared).
    pub fn is(&self, rule: &JumpRule) -> bool {
        self.chain == rule.chain && self.target() == rule.target() && self.comment() == comment_of(&rule.args)
    }
}

/// What the agent owns in one table, as `iptables-save` showed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// Our chains (`SWYD-*`) with the number of rules in each.
    pub owned: BTreeMap<String, usize>,
    /// Rules of built-in chains that jump into one of our chains.
    pub jumps: Vec<SavedJump>,
}

impl SavedTable {
    /// Parses a whole dump (tests and small tables).
    pub fn parse(text: &str) -> Self {
        let mut table = Self::default();
        text.lines().for_each(|line| table.feed(line));
        table
    }

    /// Takes one line of `iptables-save` output.
    pub fn feed(&mut self, line: &str) {
        if let Some(declaration) = line.strip_prefix(':') {
            let name = declaration.split_whitespace().next().unwrap_or_default();
            if name.starts_with(names::PREFIX) {
                self.owned.entry(name.to_string()).or_insert(0);
            }
            return;
        }
        let Some(rest) = line.strip_prefix("-A ") else {
            return;
        };
        let (chain, raw) = rest.split_once(' ').unwrap_or((rest, ""));
        if chain.starts_with(names::PREFIX) {
            *self.owned.entry(chain.to_string()).or_insert(0) += 1;
            return;
        }
        let Some(built_in) = BUILT_IN_CHAINS.iter().find(|c| **c == chain) else {
            return;
        };
        // Cheap pre-check before tokenising: only jumps into our chains are kept.
        if !raw.contains(names::PREFIX) {
            return;
        }
        let args = tokenize(raw);
        if target_of(&args).is_some_and(|t| t.starts_with(names::PREFIX)) {
            self.jumps.push(SavedJump {
                chain: built_in,
                args,
            });
        }
    }

    /// True when the table holds `rule`.
    pub fn has_jump(&self, rule: &JumpRule) -> bool {
        self.jumps.iter().any(|saved| saved.is(rule))
    }
}

fn target_of(args: &[String]) -> Option<&str> {
    args.iter()
        .position(|a| a == "-j" || a == "--jump")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn comment_of(args: &[String]) -> Option<&str> {
    args.iter()
        .position(|a| a == "--comment")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Splits a saved rule into arguments: double-quoted strings are one argument, `\"` and `\\` inside
/// quotes are unescaped (iptables-save escapes them that way).
pub fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut started = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_quotes => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                started = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if started {
                    tokens.push(std::mem::take(&mut current));
                    started = false;
                }
            }
            c => {
                current.push(c);
                started = true;
            }
        }
    }
    if started {
        tokens.push(current);
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::{Table, jump_rules};
    use switchyard_api::IpFamily;

    const NAT: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Mon Jan  1 00:00:00 2024
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
:SWYD-CANARY - [0:0]
:SWYD-SERVICES - [0:0]
:SWYD-SVC-ABC - [0:0]
-A PREROUTING -m comment --comment "switchyard service portals" -j SWYD-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT -m comment --comment "switchyard service portals" -j SWYD-SERVICES
-A DOCKER -j SWYD-SERVICES
-A SWYD-SERVICES -m comment --comment "ns/a:p cluster IP" -m tcp -p tcp -d 10.96.0.1/32 --dport 80 -j SWYD-SVC-ABC
-A SWYD-SVC-ABC -j RETURN
-A SWYD-SVC-ABC -m comment --comment "say \"hi\"" -j RETURN
COMMIT
"#;

    #[test]
    fn owned_chains_are_counted_and_others_ignored() {
        let saved = SavedTable::parse(NAT);
        let want: BTreeMap<String, usize> = [("SWYD-CANARY", 0), ("SWYD-SERVICES", 1), ("SWYD-SVC-ABC", 2)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(saved.owned, want);
        // DOCKER → SWYD-SERVICES is in a chain we do not own: not ours to delete.
        assert_eq!(saved.jumps.len(), 2);
        assert!(saved.jumps.iter().all(|j| j.target() == "SWYD-SERVICES"));
    }

    #[test]
    fn jump_rules_are_recognised_in_saved_form() {
        let saved = SavedTable::parse(NAT);
        let rules = jump_rules(IpFamily::IPv4);
        let nat: Vec<_> = rules.iter().filter(|r| r.table == Table::Nat).collect();
        let present: Vec<&str> = nat
            .iter()
            .filter(|r| saved.has_jump(r))
            .map(|r| r.chain)
            .collect();
        assert_eq!(present, ["OUTPUT", "PREROUTING"]);
    }

    #[test]
    fn tokenizer_unquotes_like_iptables_save() {
        assert_eq!(
            tokenize(r#"-m comment --comment "a \"b\" c" -j X"#),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "X"]
        );
        assert_eq!(tokenize("  -j   X  "), ["-j", "X"]);
        assert_eq!(tokenize(r#"--comment """#), ["--comment", ""]);
    }
}
