//! A text-level in-memory [`Iptables`] for the IPVS glue: chains and rule text per family and table,
//! restores applied atomically, saves printed the way iptables-save prints them. Unlike
//! [`crate::iptables::fake::FakeIptables`] (the packet tracer's model) it does not interpret matches,
//! so the glue's `-m set` rules are accepted as text.
//!
//! ```text
//! restore(payload) ─► copy of the tables ─► *table / :CHAIN / -A / -I N / -D / -X / COMMIT ─► swap in
//! save_lines(table) ─► *table, :CHAIN lines, -A lines, COMMIT
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use switchyard_api::IpFamily;

use crate::error::Error;
use crate::iptables::Table;
use crate::iptables::kernel::{Iptables, RestoreInput};
use crate::iptables::text::{built_in_chains, tokenize};

type Tables = BTreeMap<(IpFamily, Table), BTreeMap<String, Vec<String>>>;

#[derive(Debug, Default)]
struct State {
    tables: Tables,
    restores: usize,
}

/// The fake; clones share one state.
#[derive(Debug, Clone)]
pub struct TextIptables {
    state: Arc<Mutex<State>>,
}

impl Default for TextIptables {
    fn default() -> Self {
        Self::new()
    }
}

/// The rule's words; a rule with an open quote never got in (the restore refused it), so it is none.
fn words(rule: &str) -> Vec<String> {
    tokenize(rule).unwrap_or_default()
}

fn fail(line: usize, reason: String) -> Error {
    Error::IptablesRestore {
        binary: "fake-iptables-restore".into(),
        line: Some(line),
        stderr: reason,
        context: String::new(),
    }
}

impl TextIptables {
    /// Built-in chains only, both families.
    pub fn new() -> Self {
        let mut tables = Tables::new();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            for table in [Table::Filter, Table::Nat] {
                let chains = built_in_chains(table)
                    .iter()
                    .map(|c| (c.to_string(), Vec::new()))
                    .collect();
                tables.insert((family, table), chains);
            }
        }
        Self {
            state: Arc::new(Mutex::new(State { tables, restores: 0 })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rules of one chain (`None` when it does not exist).
    pub fn rules(&self, family: IpFamily, table: Table, chain: &str) -> Option<Vec<String>> {
        self.lock()
            .tables
            .get(&(family, table))
            .and_then(|t| t.get(chain).cloned())
    }

    /// Every chain name of a table.
    pub fn chains(&self, family: IpFamily, table: Table) -> Vec<String> {
        self.lock()
            .tables
            .get(&(family, table))
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Restores applied so far.
    pub fn restores(&self) -> usize {
        self.lock().restores
    }

    /// Applies a payload (also how tests set up foreign rules).
    pub fn restore_text(&self, family: IpFamily, payload: &str) -> Result<(), Error> {
        let mut state = self.lock();
        let mut tables = state.tables.clone();
        let mut table: Option<Table> = None;
        for (number, line) in payload.lines().enumerate() {
            let number = number + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                table = Some(match name {
                    "filter" => Table::Filter,
                    "nat" => Table::Nat,
                    other => return Err(fail(number, format!("unsupported table {other}"))),
                });
                continue;
            }
            let current = table.ok_or_else(|| fail(number, "no table".into()))?;
            let chains = tables.entry((family, current)).or_default();
            if let Some(declaration) = line.strip_prefix(':') {
                let name = declaration.split_whitespace().next().unwrap_or_default();
                chains.insert(name.to_string(), Vec::new());
                continue;
            }
            let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
            let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            let target_exists = |chains: &BTreeMap<String, Vec<String>>, rule: &str| {
                let args = words(rule);
                let target = args.iter().position(|a| a == "-j").and_then(|i| args.get(i + 1));
                match target {
                    Some(t) if t.starts_with("SWYD-") => chains.contains_key(t.as_str()),
                    _ => true,
                }
            };
            match op {
                "-A" | "-I" => {
                    let (position, rule) = if op == "-I" {
                        let (n, rule) = rule.split_once(' ').unwrap_or((rule, ""));
                        let n: usize = n.parse().map_err(|_| fail(number, "bad position".into()))?;
                        (Some(n.saturating_sub(1)), rule)
                    } else {
                        (None, rule)
                    };
                    if !target_exists(chains, rule) {
                        return Err(fail(number, format!("no target chain in {rule:?}")));
                    }
                    let rules = chains
                        .get_mut(chain)
                        .ok_or_else(|| fail(number, format!("no chain {chain}")))?;
                    match position {
                        Some(i) if i <= rules.len() => rules.insert(i, rule.to_string()),
                        Some(_) => return Err(fail(number, "position past the end".into())),
                        None => rules.push(rule.to_string()),
                    }
                }
                "-D" => {
                    let args = words(rule);
                    let rules = chains
                        .get_mut(chain)
                        .ok_or_else(|| fail(number, format!("no chain {chain}")))?;
                    let at = rules
                        .iter()
                        .position(|r| words(r) == args)
                        .ok_or_else(|| fail(number, "no such rule".into()))?;
                    rules.remove(at);
                }
                "-X" => {
                    let referenced = chains
                        .values()
                        .flatten()
                        .any(|r| words(r).windows(2).any(|w| w[0] == "-j" && w[1] == chain));
                    if referenced {
                        return Err(fail(number, format!("chain {chain} is still referenced")));
                    }
                    match chains.get(chain) {
                        Some(rules) if rules.is_empty() => {
                            chains.remove(chain);
                        }
                        Some(_) => return Err(fail(number, format!("chain {chain} is not empty"))),
                        None => return Err(fail(number, format!("no chain {chain}"))),
                    }
                }
                other => return Err(fail(number, format!("unsupported command {other}"))),
            }
        }
        state.tables = tables;
        state.restores += 1;
        Ok(())
    }
}

impl Iptables for TextIptables {
    fn restore(&mut self, family: IpFamily, input: &mut dyn RestoreInput) -> Result<(), Error> {
        let mut bytes = Vec::new();
        input.write_to(&mut bytes).map_err(|source| Error::RunCommand {
            command: "fake-iptables-restore".into(),
            source,
        })?;
        self.restore_text(family, &String::from_utf8_lossy(&bytes))
    }

    fn save_lines(
        &mut self,
        family: IpFamily,
        table: Table,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), Error> {
        let state = self.lock();
        each(&format!("*{table}"));
        if let Some(chains) = state.tables.get(&(family, table)) {
            for name in chains.keys() {
                let policy = if built_in_chains(table).contains(&name.as_str()) {
                    "ACCEPT"
                } else {
                    "-"
                };
                each(&format!(":{name} {policy} [0:0]"));
            }
            for (name, rules) in chains {
                for rule in rules {
                    each(&format!("-A {name} {rule}"));
                }
            }
        }
        each("COMMIT");
        Ok(())
    }

    fn ensure_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let exists = self
            .rules(family, table, chain)
            .is_some_and(|rules| rules.iter().any(|r| words(r) == args));
        if exists {
            return Ok(false);
        }
        let quoted: Vec<String> = args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("\"{a}\"")
                } else {
                    a.clone()
                }
            })
            .collect();
        self.restore_text(
            family,
            &format!("*{table}\n-I {chain} 1 {}\nCOMMIT\n", quoted.join(" ")),
        )?;
        Ok(true)
    }

    fn delete_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let mut state = self.lock();
        let Some(rules) = state
            .tables
            .get_mut(&(family, table))
            .and_then(|t| t.get_mut(chain))
        else {
            return Ok(false);
        };
        match rules.iter().position(|r| words(r) == args) {
            Some(at) => {
                rules.remove(at);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn chain_exists(&mut self, family: IpFamily, table: Table, chain: &str) -> Result<bool, Error> {
        Ok(self.rules(family, table, chain).is_some())
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<bool, Error> {
        let Some(rules) = self.rules(family, table, chain) else {
            return Ok(false);
        };
        for rule in rules {
            each(&format!("-A {chain} {rule}"));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::save::SavedTable;

    #[test]
    fn restores_are_atomic_and_saves_read_back() {
        let mut ipt = TextIptables::new();
        let v4 = IpFamily::IPv4;
        ipt.restore_text(
            v4,
            "*filter\n:SWYD-X - [0:0]\n-A SWYD-X -m set --match-set S dst -j RETURN\n-I INPUT 1 -m comment --comment \"a b\" -j SWYD-X\nCOMMIT\n",
        )
        .unwrap();
        let saved = ipt.save(v4, Table::Filter).unwrap();
        let table = SavedTable::parse(&saved);
        assert_eq!(table.owned.get("SWYD-X"), Some(&1));
        assert_eq!(table.jumps.len(), 1);
        assert_eq!(table.jumps[0].comment(), Some("a b"));
        // A failing line leaves everything as it was.
        let err = ipt
            .restore_text(v4, "*filter\n:SWYD-Y - [0:0]\n-X SWYD-X\nCOMMIT\n")
            .unwrap_err();
        assert!(err.to_string().contains("referenced"), "{err}");
        assert!(ipt.rules(v4, Table::Filter, "SWYD-Y").is_none());
        assert!(
            ipt.restore_text(v4, "*filter\n-A SWYD-Z -j SWYD-NOPE\nCOMMIT\n")
                .is_err()
        );
        let args = table.jumps[0].args.clone();
        assert!(ipt.delete_rule(v4, Table::Filter, "INPUT", &args).unwrap());
        assert!(!ipt.delete_rule(v4, Table::Filter, "INPUT", &args).unwrap());
        ipt.restore_text(v4, "*filter\n:SWYD-X - [0:0]\n-X SWYD-X\nCOMMIT\n")
            .unwrap();
        assert!(!ipt.chain_exists(v4, Table::Filter, "SWYD-X").unwrap());
        assert!(
            ipt.ensure_rule(v4, Table::Nat, "OUTPUT", &["-j".into(), "ACCEPT".into()])
                .unwrap()
        );
        assert!(
            !ipt.ensure_rule(v4, Table::Nat, "OUTPUT", &["-j".into(), "ACCEPT".into()])
                .unwrap()
        );
        assert!(
            ipt.chains(IpFamily::IPv6, Table::Nat)
                .contains(&"PREROUTING".to_string())
        );
        assert_eq!(ipt.restores(), 3);
    }
}
