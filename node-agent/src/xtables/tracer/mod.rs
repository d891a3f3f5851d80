//! A rule-level model of the kernel's iptables: it applies restore payloads the way `iptables-restore
//! --noflush` does and traces packets through the result, kube-proxy `tracePacket` style.
//!
//! ```text
//! with_jumps(family, jumps) ─► built-in chains ─┐
//! restore payloads ─► restore() ────────────────┼─► Tracer (tables, chains, parsed rules)
//!                                               │
//! Packet {src, proto, dst, dport} ──────────────┴─► trace() ─► Trace { branches: [verdict, masquerade, p] }
//!
//!   src LOCAL?  no ─► nat PREROUTING ─► dst LOCAL? yes ─► filter INPUT
//!                                                  no ─► filter FORWARD ─► nat POSTROUTING
//!               yes ► nat OUTPUT ─────► filter OUTPUT ─► [filter INPUT if dst LOCAL] ─► nat POSTROUTING
//! ```
//!
//! The filter chains see the destination after DNAT, as in the kernel; that is what makes a
//! no-endpoint REJECT or a source-range DROP apply only to packets the nat table left alone. Every
//! `-m statistic` rule forks the trace (taken with probability p, not taken with 1-p), so a trace lists
//! every reachable outcome with its probability. State a first packet cannot have does not match:
//! `-m recent --rcheck` (no affinity entry yet), conntrack states other than NEW. The mark is tracked,
//! so SWYD-MARK-MASQ, SWYD-POSTROUTING and SWYD-FORWARD run for real and "masquerade" means the packet
//! reached `MASQUERADE`.
//!
//! Restores are checked the way the kernel checks them, so tests catch broken payloads: a rule may
//! only be appended (`-A`) or inserted (`-I`) to an existing chain, every jump target must exist when
//! the table commits, a chain can only be deleted when it is empty and unreferenced, and chain names
//! fit in 28 characters. The parser understands exactly the matches and targets the
//! render and the IPVS glue emit (ipset matches are kept but not modelled: no packet is in a set) and
//! rejects anything else.
//! It also reads `iptables-save`'s spelling of our rules (`--set-xmark`, `/32`, `--reject-with`, more
//! probability digits), so `switchyard-agent explain --kernel` can trace the rules a node really holds.
//! Diagnosis and test tooling (the tests and `explain` use it); it is not on the agent's apply path.
//!
//! Split by job: this module holds the tables (restore, rule edits, save and dump, the checks the
//! kernel makes), `rule` parses a rule's arguments into matches and a target, and `walk` follows a
//! packet through the hooks and chains.

use std::collections::BTreeMap;
use std::net::IpAddr;

use switchyard_api::IpFamily;

use super::chains::MAX_CHAIN_LEN;
use super::jumps::JumpRule;
use super::payload::Table;
use super::tokens::{built_in_chains, is_built_in, quote_args, tokenize};
use crate::error::Error;

mod rule;
mod walk;

use rule::{Rule, Target};
pub use walk::{Branch, Interface, Packet, Trace, Verdict};

/// The modelled iptables state of one family, plus the node's local addresses.
#[derive(Debug, Clone)]
pub struct Tracer {
    family: IpFamily,
    local_addrs: Vec<IpAddr>,
    tables: BTreeMap<Table, BTreeMap<String, Vec<Rule>>>,
}

impl Tracer {
    /// Built-in chains holding `jumps` (prepended in list order, as the edge does), and nothing else.
    /// `local_addrs` are the node's addresses (`--src-type`/`--dst-type LOCAL`); loopback addresses are
    /// always local. The iptables backend's `Tracer::new` passes its own jump rules.
    pub fn with_jumps(family: IpFamily, local_addrs: &[IpAddr], jumps: &[JumpRule]) -> Result<Self, Error> {
        let mut tracer = Self::empty(family, local_addrs);
        for jump in jumps {
            let rule = Rule::parse(&jump.args, quote_args(&jump.args))
                .map_err(|reason| Error::ModelRestore { line: 0, reason })?;
            if let Some(chain) = tracer
                .tables
                .get_mut(&jump.table)
                .and_then(|t| t.get_mut(jump.chain))
            {
                chain.insert(0, rule);
            }
        }
        Ok(tracer)
    }

    /// The built-in chains only, without our jump rules: a fresh network namespace's kernel (the state
    /// the fake iptables edge starts from).
    pub fn empty(family: IpFamily, local_addrs: &[IpAddr]) -> Self {
        let tables = [Table::Filter, Table::Nat]
            .into_iter()
            .map(|table| {
                let chains: BTreeMap<String, Vec<Rule>> = built_in_chains(table)
                    .iter()
                    .map(|name| (name.to_string(), Vec::new()))
                    .collect();
                (table, chains)
            })
            .collect();
        Self {
            family,
            local_addrs: local_addrs.to_vec(),
            tables,
        }
    }

    /// The family this model is for.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// `iptables -t <table> -I <chain> <position+1> <args>`: checks the rule like the kernel (known
    /// matches, an existing target chain) and inserts it at `position` (0 = first).
    pub fn insert_rule(
        &mut self,
        table: Table,
        chain: &str,
        position: usize,
        args: &[String],
    ) -> Result<(), Error> {
        let fail = |reason: String| Error::ModelRestore { line: 0, reason };
        let rule = Rule::parse(args, quote_args(args)).map_err(fail)?;
        let chains = self
            .tables
            .get_mut(&table)
            .ok_or_else(|| fail(format!("no table {table}")))?;
        if let Target::Chain(target) = &rule.target
            && !chains.contains_key(target)
        {
            return Err(fail(format!("target chain {target} does not exist")));
        }
        let rules = chains
            .get_mut(chain)
            .ok_or_else(|| fail(format!("chain {chain} does not exist")))?;
        rules.insert(position.min(rules.len()), rule);
        Ok(())
    }

    /// `iptables -t <table> -C <chain> <args>`: true when a rule with exactly these arguments exists.
    pub fn has_rule(&self, table: Table, chain: &str, args: &[String]) -> bool {
        let raw = quote_args(args);
        self.rules_of(table, chain)
            .is_some_and(|rules| rules.iter().any(|r| r.raw == raw))
    }

    /// `iptables -t <table> -D <chain> <args>`: deletes the first such rule; false when there is none.
    pub fn delete_rule(&mut self, table: Table, chain: &str, args: &[String]) -> bool {
        let raw = quote_args(args);
        let Some(rules) = self.tables.get_mut(&table).and_then(|t| t.get_mut(chain)) else {
            return false;
        };
        match rules.iter().position(|r| r.raw == raw) {
            Some(index) => {
                rules.remove(index);
                true
            }
            None => false,
        }
    }

    /// `iptables -t <table> -F <chain>`, as a firewall reload or an administrator might: false when
    /// the chain does not exist.
    pub fn flush_chain(&mut self, table: Table, chain: &str) -> bool {
        match self.tables.get_mut(&table).and_then(|t| t.get_mut(chain)) {
            Some(rules) => {
                rules.clear();
                true
            }
            None => false,
        }
    }

    /// Removes a user chain and every rule jumping to it (`iptables -F` of the referrers' rules plus
    /// `-X`, as a firewall manager wiping foreign chains does); false when it does not exist.
    pub fn remove_chain(&mut self, table: Table, chain: &str) -> bool {
        let Some(chains) = self.tables.get_mut(&table) else {
            return false;
        };
        if is_built_in(table, chain) || chains.remove(chain).is_none() {
            return false;
        }
        for rules in chains.values_mut() {
            rules.retain(|r| !matches!(&r.target, Target::Chain(t) if t == chain));
        }
        true
    }

    /// Names of the chains of `table`, built-in ones included.
    pub fn chain_names(&self, table: Table) -> Vec<String> {
        self.tables
            .get(&table)
            .map(|chains| chains.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// One table in `iptables-save` format (built-in chains with policy `ACCEPT`).
    pub fn save(&self, table: Table) -> String {
        let mut out = format!("*{table}\n");
        let Some(chains) = self.tables.get(&table) else {
            return out + "COMMIT\n";
        };
        for name in chains.keys() {
            let policy = if is_built_in(table, name) { "ACCEPT" } else { "-" };
            out.push_str(&format!(":{name} {policy} [0:0]\n"));
        }
        for (name, rules) in chains {
            for rule in rules {
                out.push_str(&format!("-A {name} {}\n", rule.raw));
            }
        }
        out + "COMMIT\n"
    }

    /// The rules of one chain as (text, meaning): the text as restored, and a normal form of what the
    /// rule does, equal for `iptables-save`'s spelling of a rule and the render's (`--set-xmark 0x4000/0x4000`
    /// and `--or-mark 0x4000`, `-d 10.0.0.1/32` and `-d 10.0.0.1`, option order, comments).
    pub fn chain_rules(&self, table: Table, chain: &str) -> Vec<(String, String)> {
        self.rules_of(table, chain)
            .map(|rules| rules.iter().map(|r| (r.raw.clone(), r.meaning())).collect())
            .unwrap_or_default()
    }

    fn rules_of(&self, table: Table, chain: &str) -> Option<&Vec<Rule>> {
        self.tables.get(&table).and_then(|t| t.get(chain))
    }

    /// Applies an `iptables-restore --noflush` payload. Each table is applied atomically at its COMMIT;
    /// on an error the table being applied is left as it was, as the kernel does.
    pub fn restore(&mut self, payload: &str) -> Result<(), Error> {
        let mut open: Option<(Table, BTreeMap<String, Vec<Rule>>)> = None;
        let mut last_line = 0;
        for (index, line) in payload.lines().enumerate() {
            let number = index + 1;
            last_line = number;
            let fail = |reason: String| Error::ModelRestore { line: number, reason };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                if open.is_some() {
                    return Err(fail(
                        "a table starts before the previous one was committed".into(),
                    ));
                }
                let table = match name {
                    "filter" => Table::Filter,
                    "nat" => Table::Nat,
                    other => return Err(fail(format!("unsupported table {other:?}"))),
                };
                let chains = self.tables.get(&table).cloned().unwrap_or_default();
                open = Some((table, chains));
                continue;
            }
            let Some((table, chains)) = open.as_mut() else {
                return Err(fail(format!("{line:?} outside a table")));
            };
            if line == "COMMIT" {
                check_jumps(chains).map_err(fail)?;
                let table = *table;
                if let Some((_, chains)) = open.take() {
                    self.tables.insert(table, chains);
                }
            } else if let Some(declaration) = line.strip_prefix(':') {
                let name = declaration.split_whitespace().next().unwrap_or_default();
                if name.is_empty() || name.len() > MAX_CHAIN_LEN {
                    return Err(fail(format!("invalid chain name {name:?}")));
                }
                // Declaring a chain creates it or, with --noflush, flushes it.
                chains.insert(name.to_string(), Vec::new());
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (chain, raw) = rest.split_once(' ').unwrap_or((rest, ""));
                let tokens = tokenize(raw).map_err(fail)?;
                let rule = Rule::parse(&tokens, raw.to_string()).map_err(fail)?;
                let Some(rules) = chains.get_mut(chain) else {
                    return Err(fail(format!("chain {chain} does not exist")));
                };
                rules.push(rule);
            } else if let Some(rest) = line.strip_prefix("-I ") {
                // `-I CHAIN [position] rule`: inserted like `iptables -I` (position 1 = first).
                let (chain, raw) = rest.split_once(' ').unwrap_or((rest, ""));
                let (position, raw) = match raw.split_once(' ') {
                    Some((n, tail)) if n.parse::<usize>().is_ok() => (n.parse::<usize>().unwrap_or(1), tail),
                    _ => (1, raw),
                };
                let tokens = tokenize(raw).map_err(fail)?;
                let rule = Rule::parse(&tokens, raw.to_string()).map_err(fail)?;
                let Some(rules) = chains.get_mut(chain) else {
                    return Err(fail(format!("chain {chain} does not exist")));
                };
                if position == 0 || position > rules.len() + 1 {
                    return Err(fail(format!("index of insertion {position} is too big")));
                }
                rules.insert(position - 1, rule);
            } else if let Some(chain) = line.strip_prefix("-X ") {
                let chain = chain.trim();
                if is_built_in(*table, chain) {
                    return Err(fail(format!("cannot delete built-in chain {chain}")));
                }
                match chains.get(chain) {
                    None => return Err(fail(format!("chain {chain} does not exist"))),
                    Some(rules) if !rules.is_empty() => {
                        return Err(fail(format!("chain {chain} is not empty")));
                    }
                    Some(_) => {}
                }
                if let Some(user) = referrer(chains, chain) {
                    return Err(fail(format!("chain {chain} is still referenced from {user}")));
                }
                chains.remove(chain);
            } else {
                return Err(fail(format!("unsupported line {line:?}")));
            }
        }
        if open.is_some() {
            return Err(Error::ModelRestore {
                line: last_line,
                reason: "missing COMMIT".into(),
            });
        }
        Ok(())
    }

    /// True when `table` has a chain `name`.
    pub fn has_chain(&self, table: Table, name: &str) -> bool {
        self.tables
            .get(&table)
            .is_some_and(|chains| chains.contains_key(name))
    }

    /// The whole modelled state as sorted `iptables-save`-like text, to compare two states.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (table, chains) in &self.tables {
            out.push_str(&format!("*{table}\n"));
            for name in chains.keys() {
                out.push_str(&format!(":{name}\n"));
            }
            for (name, rules) in chains {
                for rule in rules {
                    out.push_str(&format!("-A {name} {}\n", rule.raw));
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// The first chain with a rule jumping to `chain`.
fn referrer<'a>(chains: &'a BTreeMap<String, Vec<Rule>>, chain: &str) -> Option<&'a str> {
    chains.iter().find_map(|(name, rules)| {
        rules
            .iter()
            .any(|r| matches!(&r.target, Target::Chain(t) if t == chain))
            .then_some(name.as_str())
    })
}

/// Every jump must land on an existing chain when a table commits.
fn check_jumps(chains: &BTreeMap<String, Vec<Rule>>) -> Result<(), String> {
    for (name, rules) in chains {
        for rule in rules {
            if let Target::Chain(target) = &rule.target
                && !chains.contains_key(target)
            {
                return Err(format!("a rule in {name} jumps to missing chain {target}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::Protocol;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    const PAYLOAD: &str = "*filter
:SWYD-SERVICES - [0:0]
:SWYD-EXTERNAL-SERVICES - [0:0]
:SWYD-FORWARD - [0:0]
:SWYD-NODEPORTS - [0:0]
:SWYD-PROXY-FIREWALL - [0:0]
-A SWYD-SERVICES -m comment --comment \"ns/none has no endpoints\" -m tcp -p tcp -d 10.96.0.9 --dport 80 -j REJECT
COMMIT
*nat
:SWYD-SERVICES - [0:0]
:SWYD-NODEPORTS - [0:0]
:SWYD-POSTROUTING - [0:0]
:SWYD-MARK-MASQ - [0:0]
:SWYD-SVC-A - [0:0]
:SWYD-SEP-1 - [0:0]
:SWYD-SEP-2 - [0:0]
-A SWYD-SERVICES -m comment --comment \"ns/a cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j SWYD-SVC-A
-A SWYD-SVC-A -m comment --comment \"ns/a cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 ! -s 10.244.0.0/16 -j SWYD-MARK-MASQ
-A SWYD-SVC-A -m recent --name SWYD-SEP-1 --rcheck --seconds 10 --reap -j SWYD-SEP-1
-A SWYD-SVC-A -m statistic --mode random --probability 0.2500000000 -j SWYD-SEP-1
-A SWYD-SVC-A -j SWYD-SEP-2
-A SWYD-SEP-1 -m tcp -p tcp -j DNAT --to-destination 10.244.1.1:8080
-A SWYD-SEP-2 -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
-A SWYD-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A SWYD-POSTROUTING -j MARK --xor-mark 0x4000
-A SWYD-POSTROUTING -j MASQUERADE
-A SWYD-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
";

    fn tracer() -> Tracer {
        let mut tracer = Tracer::new(IpFamily::IPv4, &[ip("192.168.10.11")]).unwrap();
        tracer.restore(PAYLOAD).unwrap();
        tracer
    }

    #[test]
    fn statistic_rules_fork_with_their_probabilities() {
        let trace = tracer()
            .trace(&Packet::new(ip("10.244.2.2"), Protocol::TCP, ip("10.96.0.1"), 80))
            .unwrap();
        assert_eq!(trace.output(), "10.244.1.1:8080, 10.244.1.2:8080");
        let one: Verdict = Verdict::Dnat("10.244.1.1:8080".parse().unwrap());
        assert!(
            (trace.probability(&one) - 0.25).abs() < 1e-9,
            "{}",
            trace.explain()
        );
        assert!(!trace.masquerade());
    }

    #[test]
    fn the_mark_drives_postrouting() {
        let trace = tracer()
            .trace(&Packet::new(
                ip("198.51.100.7"),
                Protocol::TCP,
                ip("10.96.0.1"),
                80,
            ))
            .unwrap();
        assert!(trace.branches.iter().all(|b| b.masquerade), "{}", trace.explain());
    }

    #[test]
    fn filter_sees_the_original_destination_when_nothing_dnats() {
        let t = tracer();
        let trace = t
            .trace(&Packet::new(ip("10.244.2.2"), Protocol::TCP, ip("10.96.0.9"), 80))
            .unwrap();
        assert_eq!(trace.output(), "REJECT");
        let trace = t
            .trace(&Packet::new(ip("10.244.2.2"), Protocol::UDP, ip("10.96.0.1"), 80))
            .unwrap();
        assert_eq!(trace.output(), "ACCEPT");
    }

    #[test]
    fn ipset_matches_are_kept_but_no_packet_is_in_a_set() {
        let mut t = Tracer::empty(IpFamily::IPv4, &[ip("192.168.10.11")]);
        let payload = "*filter\n:SWYD-IPVS-FILTER - [0:0]\n\
            -A SWYD-IPVS-FILTER -m set --match-set SWYD-CLUSTER-IP dst,dst -j RETURN\n\
            -A SWYD-IPVS-FILTER -m set ! --match-set SWYD-IPVS-IPS dst -j ACCEPT\n\
            -A SWYD-IPVS-FILTER -j REJECT\n\
            -A INPUT -j SWYD-IPVS-FILTER\nCOMMIT\n";
        t.restore(payload).unwrap();
        assert_eq!(t.chain_rules(Table::Filter, "SWYD-IPVS-FILTER").len(), 3);
        assert!(
            t.save(Table::Filter)
                .contains("--match-set SWYD-CLUSTER-IP dst,dst -j RETURN")
        );
        // Not in SWYD-CLUSTER-IP, so past the RETURN; not in SWYD-IPVS-IPS, so the negated match takes it.
        let trace = t
            .trace(&Packet::new(
                ip("10.244.2.2"),
                Protocol::TCP,
                ip("192.168.10.11"),
                22,
            ))
            .unwrap();
        assert_eq!(
            trace.verdicts(),
            std::collections::BTreeSet::from([Verdict::Accept])
        );
        // `--match-set` needs `-m set` and both of its values.
        for bad in [
            "-A SWYD-IPVS-FILTER --match-set X dst -j RETURN",
            "-A SWYD-IPVS-FILTER -m set --match-set X",
        ] {
            let err = t.restore(&format!("*filter\n{bad}\nCOMMIT\n")).unwrap_err();
            assert!(err.to_string().contains("match-set"), "{bad}: {err}");
        }
    }

    #[test]
    fn restore_checks_like_the_kernel() {
        let cases = [
            ("*nat\n-A NOPE -j RETURN\nCOMMIT\n", "does not exist"),
            (
                "*nat\n:SWYD-X - [0:0]\n-A SWYD-X -j SWYD-MISSING\nCOMMIT\n",
                "missing chain",
            ),
            (
                "*nat\n:SWYD-X - [0:0]\n-A SWYD-X -m foo -j RETURN\nCOMMIT\n",
                "unsupported match",
            ),
            (
                "*nat\n:SWYD-X - [0:0]\n-A SWYD-X --dport 80 -j RETURN\nCOMMIT\n",
                "without -m",
            ),
            ("*nat\n-X SWYD-MARK-MASQ\nCOMMIT\n", "is not empty"),
            (
                "*nat\n:SWYD-MARK-MASQ - [0:0]\n-X SWYD-MARK-MASQ\nCOMMIT\n",
                "still referenced",
            ),
            ("*nat\n:SWYD-X - [0:0]\n", "missing COMMIT"),
            (
                "*nat\n:SWYD-THIS-NAME-IS-FAR-TOO-LONG-X - [0:0]\nCOMMIT\n",
                "invalid chain name",
            ),
            ("*mangle\nCOMMIT\n", "unsupported table"),
        ];
        for (payload, want) in cases {
            let mut t = tracer();
            let before = t.dump();
            let err = t.restore(payload).unwrap_err().to_string();
            assert!(err.contains(want), "{payload:?}: {err}");
            assert_eq!(t.dump(), before, "a failed table must leave the state alone");
        }
    }

    #[test]
    fn inserted_rules_go_where_iptables_puts_them() {
        let mut t = tracer();
        t.restore("*nat\n-I SWYD-SVC-A 1 -j RETURN\n-I SWYD-SVC-A -m comment --comment \"a b\" -j SWYD-SEP-2\n-I SWYD-SVC-A 3 -j SWYD-SEP-1\nCOMMIT\n")
            .unwrap();
        let dump = t.dump();
        let svc: Vec<&str> = dump.lines().filter(|l| l.starts_with("-A SWYD-SVC-A ")).collect();
        assert_eq!(svc[0], "-A SWYD-SVC-A -m comment --comment \"a b\" -j SWYD-SEP-2");
        assert_eq!(svc[1], "-A SWYD-SVC-A -j RETURN");
        assert_eq!(svc[2], "-A SWYD-SVC-A -j SWYD-SEP-1");
        for bad in [
            "*nat\n-I NOPE 1 -j RETURN\nCOMMIT\n",
            "*nat\n-I SWYD-SEP-1 9 -j RETURN\nCOMMIT\n",
        ] {
            assert!(t.restore(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn jump_rules_are_prepended_in_order() {
        let t = Tracer::new(IpFamily::IPv4, &[]).unwrap();
        let dump = t.dump();
        let forward: Vec<&str> = dump.lines().filter(|l| l.starts_with("-A FORWARD")).collect();
        let targets: Vec<&str> = forward.iter().filter_map(|l| l.rsplit(' ').next()).collect();
        assert_eq!(
            targets,
            [
                "SWYD-PROXY-FIREWALL",
                "SWYD-FORWARD",
                "SWYD-SERVICES",
                "SWYD-EXTERNAL-SERVICES"
            ]
        );
    }
}
