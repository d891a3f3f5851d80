//! A rule-level model of the kernel's iptables: it applies restore payloads the way `iptables-restore
//! --noflush` does and traces packets through the result, kube-proxy `tracePacket` style.
//!
//! ```text
//! jump_rules(family) ─► built-in chains ─┐
//! Ruleset::*_payload() ─► restore() ─────┼─► Tracer (tables, chains, parsed rules)
//!                                        │
//! Packet {src, proto, dst, dport} ───────┴─► trace() ─► Trace { branches: [verdict, masquerade, p] }
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
//! fit in 28 characters. The parser understands exactly the matches and targets the render emits and rejects anything else.
//! It also reads `iptables-save`'s spelling of our rules (`--set-xmark`, `/32`, `--reject-with`, more
//! probability digits), so `switchyard-agent explain --kernel` can trace the rules a node really holds.
//! Diagnosis and test tooling (the tests and `explain` use it); it is not on the agent's apply path.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use switchyard_api::{IpFamily, Protocol};

use super::names::MAX_CHAIN_LEN;
use super::payload::{Ruleset, Table};
use super::render::jump_rules;
use super::text::{built_in_chains, is_built_in, quote_args, tokenize};
use crate::error::Error;

/// Deepest chain nesting followed before giving up (the kernel allows loops nowhere; this guards the
/// model against a payload that would make it recurse forever).
const MAX_DEPTH: usize = 32;

/// The first packet of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub source: IpAddr,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Destination address before any DNAT.
    pub dest: IpAddr,
    /// Destination port before any DNAT.
    pub dest_port: u16,
}

impl Packet {
    /// A packet from `source` to `dest:dest_port`.
    pub fn new(source: IpAddr, protocol: Protocol, dest: IpAddr, dest_port: u16) -> Self {
        Self {
            source,
            protocol,
            dest,
            dest_port,
        }
    }
}

/// What finally happens to one branch of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// DNATed to this endpoint and let through.
    Dnat(SocketAddr),
    /// Let through unchanged (no rule of ours matched, or a filter rule accepted it).
    Accept,
    /// Silently dropped.
    Drop,
    /// Rejected (ICMP port unreachable: "connection refused").
    Reject,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dnat(addr) => write!(f, "{addr}"),
            Self::Accept => f.write_str("ACCEPT"),
            Self::Drop => f.write_str("DROP"),
            Self::Reject => f.write_str("REJECT"),
        }
    }
}

/// One possible path of a packet through the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    /// Where it ends.
    pub verdict: Verdict,
    /// Whether `MASQUERADE` rewrote its source.
    pub masquerade: bool,
    /// How likely this path is (product of the statistic rules taken or skipped).
    pub probability: f64,
    /// The rules that matched, in order, as `-A CHAIN ...` lines (for failure messages).
    pub rules: Vec<String>,
}

/// Every possible path of one packet.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The paths, in rule order.
    pub branches: Vec<Branch>,
}

impl Trace {
    /// The distinct verdicts.
    pub fn verdicts(&self) -> BTreeSet<Verdict> {
        self.branches.iter().map(|b| b.verdict).collect()
    }

    /// The verdicts as kube-proxy's tracer prints them: sorted and comma-separated
    /// (`10.244.1.5:80, 10.244.2.5:80`, or `REJECT`).
    pub fn output(&self) -> String {
        self.verdicts()
            .iter()
            .map(Verdict::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// True when any branch is masqueraded.
    pub fn masquerade(&self) -> bool {
        self.branches.iter().any(|b| b.masquerade)
    }

    /// The probability of ending in `verdict` (summed over branches).
    pub fn probability(&self, verdict: &Verdict) -> f64 {
        self.branches
            .iter()
            .filter(|b| &b.verdict == verdict)
            .map(|b| b.probability)
            .sum()
    }

    /// The branches ending in `verdict`.
    pub fn branches_to<'a>(&'a self, verdict: &'a Verdict) -> impl Iterator<Item = &'a Branch> + 'a {
        self.branches.iter().filter(move |b| &b.verdict == verdict)
    }

    /// Every matched rule of every branch, for failure messages.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        for branch in &self.branches {
            out.push_str(&format!(
                "{} (p={:.4}, masquerade={}):\n",
                branch.verdict, branch.probability, branch.masquerade
            ));
            for rule in &branch.rules {
                out.push_str("  ");
                out.push_str(rule);
                out.push('\n');
            }
        }
        out
    }
}

/// The modelled iptables state of one family, plus the node's local addresses.
#[derive(Debug, Clone)]
pub struct Tracer {
    family: IpFamily,
    local_addrs: Vec<IpAddr>,
    tables: BTreeMap<Table, BTreeMap<String, Vec<Rule>>>,
}

impl Tracer {
    /// Built-in chains holding our jump rules (prepended in [`jump_rules`] order, as the edge does), and
    /// nothing else. `local_addrs` are the node's addresses (`--src-type`/`--dst-type LOCAL`); loopback
    /// addresses are always local.
    pub fn new(family: IpFamily, local_addrs: &[IpAddr]) -> Result<Self, Error> {
        let mut tracer = Self::empty(family, local_addrs);
        for jump in jump_rules(family) {
            let rule = Rule::parse(&jump.args, quote_args(&jump.args))
                .map_err(|reason| Error::SimulatedRestore { line: 0, reason })?;
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
        let fail = |reason: String| Error::SimulatedRestore { line: 0, reason };
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

    /// [`Tracer::new`] with `ruleset`'s full payload restored.
    pub fn from_ruleset(ruleset: &Ruleset, local_addrs: &[IpAddr]) -> Result<Self, Error> {
        let mut tracer = Self::new(ruleset.family(), local_addrs)?;
        tracer.restore(&ruleset.full_payload())?;
        Ok(tracer)
    }

    /// Applies an `iptables-restore --noflush` payload. Each table is applied atomically at its COMMIT;
    /// on an error the table being applied is left as it was, as the kernel does.
    pub fn restore(&mut self, payload: &str) -> Result<(), Error> {
        let mut open: Option<(Table, BTreeMap<String, Vec<Rule>>)> = None;
        let mut last_line = 0;
        for (index, line) in payload.lines().enumerate() {
            let number = index + 1;
            last_line = number;
            let fail = |reason: String| Error::SimulatedRestore { line: number, reason };
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
            return Err(Error::SimulatedRestore {
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

    /// Every possible path of `packet` through the modelled rules.
    pub fn trace(&self, packet: &Packet) -> Result<Trace, Error> {
        if IpFamily::of(&packet.source) != self.family || IpFamily::of(&packet.dest) != self.family {
            return Err(Error::TracePacket(format!(
                "packet is not {:?}: {packet:?}",
                self.family
            )));
        }
        let from_host = self.is_local(packet.source);
        let start = State {
            src: packet.source,
            dst: packet.dest,
            dport: packet.dest_port,
            protocol: packet.protocol.lower(),
            mark: 0,
            weight: 1.0,
            dnat: None,
            masquerade: false,
            rules: Vec::new(),
        };
        let nat_hook = if from_host { "OUTPUT" } else { "PREROUTING" };
        let mut branches = Vec::new();
        for (state, flow) in self.walk(Table::Nat, nat_hook, start, 0)? {
            if let Some(verdict) = flow.drop_verdict() {
                branches.push(state.finish(verdict));
                continue;
            }
            // Which filter hooks and whether POSTROUTING runs depend on the destination after DNAT.
            let to_host = self.is_local(state.dst);
            let hooks: &[&str] = match (from_host, to_host) {
                (true, true) => &["OUTPUT", "INPUT"],
                (true, false) => &["OUTPUT"],
                (false, true) => &["INPUT"],
                (false, false) => &["FORWARD"],
            };
            let mut pending = vec![state];
            for hook in hooks {
                let mut next = Vec::new();
                for state in pending {
                    for (state, flow) in self.walk(Table::Filter, hook, state, 0)? {
                        match flow.drop_verdict() {
                            Some(verdict) => branches.push(state.finish(verdict)),
                            None => next.push(state),
                        }
                    }
                }
                pending = next;
            }
            // Packets delivered to the host itself never pass POSTROUTING.
            let postrouting = from_host || !to_host;
            for state in pending {
                if !postrouting {
                    branches.push(state.finish(Verdict::Accept));
                    continue;
                }
                for (state, flow) in self.walk(Table::Nat, "POSTROUTING", state, 0)? {
                    let verdict = flow.drop_verdict().unwrap_or(Verdict::Accept);
                    branches.push(state.finish(verdict));
                }
            }
        }
        Ok(Trace { branches })
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_addrs.contains(&ip)
    }

    fn walk(
        &self,
        table: Table,
        chain: &str,
        state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, Error> {
        if depth > MAX_DEPTH {
            return Err(Error::TracePacket(format!(
                "chains nest deeper than {MAX_DEPTH} at {chain}"
            )));
        }
        let rules = self
            .tables
            .get(&table)
            .and_then(|chains| chains.get(chain))
            .ok_or_else(|| Error::TracePacket(format!("{table} chain {chain} does not exist")))?;
        self.walk_from(table, chain, rules, 0, state, depth)
    }

    /// Runs `rules[start..]`; returns every (state, how the chain was left) pair reachable.
    fn walk_from(
        &self,
        table: Table,
        chain: &str,
        rules: &[Rule],
        start: usize,
        mut state: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, Error> {
        let mut out = Vec::new();
        for (index, rule) in rules.iter().enumerate().skip(start) {
            if !rule.matches(&state, self) {
                continue;
            }
            if let Some(p) = rule.probability() {
                // The rule may also not match: follow that branch from the next rule.
                let mut skipped = state.clone();
                skipped.weight *= 1.0 - p;
                if skipped.weight > 0.0 {
                    out.extend(self.walk_from(table, chain, rules, index + 1, skipped, depth)?);
                }
                state.weight *= p;
                if state.weight <= 0.0 {
                    return Ok(out);
                }
            }
            state.rules.push(format!("-A {chain} {}", rule.raw));
            let flow = match &rule.target {
                Target::None => continue,
                Target::MarkOr(bits) => {
                    state.mark |= bits;
                    continue;
                }
                Target::MarkXor(bits) => {
                    state.mark ^= bits;
                    continue;
                }
                Target::Return => Flow::Continue,
                Target::Accept => Flow::Accept,
                Target::Drop => Flow::Drop,
                Target::Reject => Flow::Reject,
                Target::Dnat(to) => {
                    state.dst = to.ip();
                    state.dport = to.port();
                    state.dnat = Some(*to);
                    Flow::Accept
                }
                Target::Masquerade => {
                    state.masquerade = true;
                    Flow::Accept
                }
                Target::Chain(target) => {
                    for (state, flow) in self.walk(table, target, state, depth + 1)? {
                        match flow {
                            Flow::Continue => {
                                out.extend(self.walk_from(table, chain, rules, index + 1, state, depth)?)
                            }
                            terminal => out.push((state, terminal)),
                        }
                    }
                    return Ok(out);
                }
            };
            out.push((state, flow));
            return Ok(out);
        }
        out.push((state, Flow::Continue));
        Ok(out)
    }
}

// === Walking state ===

#[derive(Debug, Clone)]
struct State {
    src: IpAddr,
    dst: IpAddr,
    dport: u16,
    protocol: &'static str,
    mark: u32,
    weight: f64,
    dnat: Option<SocketAddr>,
    masquerade: bool,
    rules: Vec<String>,
}

impl State {
    fn finish(self, verdict: Verdict) -> Branch {
        let verdict = match (verdict, self.dnat) {
            (Verdict::Accept, Some(to)) => Verdict::Dnat(to),
            (verdict, _) => verdict,
        };
        let dropped = matches!(verdict, Verdict::Drop | Verdict::Reject);
        Branch {
            verdict,
            masquerade: self.masquerade && !dropped,
            probability: self.weight,
            rules: self.rules,
        }
    }
}

/// How a chain was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Fell off the end or RETURNed: the caller continues.
    Continue,
    /// This table is done with the packet, which goes on (ACCEPT, DNAT, MASQUERADE).
    Accept,
    Drop,
    Reject,
}

impl Flow {
    fn drop_verdict(self) -> Option<Verdict> {
        match self {
            Self::Drop => Some(Verdict::Drop),
            Self::Reject => Some(Verdict::Reject),
            Self::Continue | Self::Accept => None,
        }
    }
}

// === Rules ===

#[derive(Debug, Clone)]
struct Rule {
    /// The text after `-A CHAIN `.
    raw: String,
    matches: Vec<Match>,
    target: Target,
}

#[derive(Debug, Clone)]
enum Match {
    Source {
        negated: bool,
        net: IpNet,
    },
    Dest {
        negated: bool,
        net: IpNet,
    },
    Protocol {
        negated: bool,
        name: String,
    },
    DestPort {
        negated: bool,
        port: u16,
    },
    SrcLocal {
        negated: bool,
    },
    DstLocal {
        negated: bool,
    },
    Probability(f64),
    /// `-m recent --rcheck`: a first packet has no entry yet.
    RecentCheck,
    Mark {
        negated: bool,
        value: u32,
        mask: u32,
    },
    CtState {
        negated: bool,
        states: Vec<String>,
    },
}

#[derive(Debug, Clone)]
enum Target {
    /// No `-j`: the rule only counts.
    None,
    Chain(String),
    Accept,
    Drop,
    Reject,
    Return,
    Dnat(SocketAddr),
    Masquerade,
    MarkOr(u32),
    MarkXor(u32),
}

impl Rule {
    /// The normal form [`Tracer::chain_rules`] compares: the matches (probabilities to six places, as
    /// iptables-save prints them with more digits than the render), sorted, then the target.
    fn meaning(&self) -> String {
        let mut parts: Vec<String> = self
            .matches
            .iter()
            .map(|m| match m {
                Match::Probability(p) => format!("Probability({p:.6})"),
                other => format!("{other:?}"),
            })
            .collect();
        parts.sort();
        parts.push(format!("{:?}", self.target));
        parts.join(" ")
    }

    fn matches(&self, state: &State, tracer: &Tracer) -> bool {
        self.matches.iter().all(|m| match m {
            Match::Source { negated, net } => net.contains(&state.src) != *negated,
            Match::Dest { negated, net } => net.contains(&state.dst) != *negated,
            Match::Protocol { negated, name } => (name == state.protocol) != *negated,
            Match::DestPort { negated, port } => (*port == state.dport) != *negated,
            Match::SrcLocal { negated } => tracer.is_local(state.src) != *negated,
            Match::DstLocal { negated } => tracer.is_local(state.dst) != *negated,
            Match::Probability(_) => true,
            Match::RecentCheck => false,
            Match::Mark { negated, value, mask } => (state.mark & mask == *value) != *negated,
            // A first packet is NEW.
            Match::CtState { negated, states } => states.iter().any(|s| s == "NEW") != *negated,
        })
    }

    fn probability(&self) -> Option<f64> {
        self.matches.iter().find_map(|m| match m {
            Match::Probability(p) => Some(*p),
            _ => None,
        })
    }

    /// Parses the arguments of one rule; `raw` is kept for dumps and traces.
    fn parse(tokens: &[String], raw: String) -> Result<Self, String> {
        let mut matches = Vec::new();
        let mut target = Target::None;
        let mut modules: Vec<&str> = Vec::new();
        let mut negated = false;
        let mut iter = tokens.iter().map(String::as_str);
        while let Some(token) = iter.next() {
            let mut value = |what: &str| iter.next().ok_or_else(|| format!("{what} needs a value"));
            let need = |module: &[&str], option: &str| {
                if module.iter().any(|m| modules.contains(m)) {
                    Ok(())
                } else {
                    Err(format!("{option} without -m {}", module.join("|")))
                }
            };
            let negatable = matches!(
                token,
                "-s" | "-d" | "-p" | "--dport" | "--src-type" | "--dst-type"
            ) || matches!(token, "--mark" | "--ctstate");
            if negated && !negatable {
                return Err(format!("{token} cannot be negated"));
            }
            match token {
                "!" => {
                    negated = true;
                    continue;
                }
                "-m" => {
                    let module = value("-m")?;
                    let known = [
                        "comment",
                        "tcp",
                        "udp",
                        "sctp",
                        "addrtype",
                        "statistic",
                        "recent",
                        "mark",
                        "conntrack",
                    ];
                    if !known.contains(&module) {
                        return Err(format!("unsupported match module {module}"));
                    }
                    modules.push(module);
                }
                "--comment" => {
                    need(&["comment"], token)?;
                    value(token)?;
                }
                "-p" => matches.push(Match::Protocol {
                    negated,
                    name: value(token)?.to_string(),
                }),
                "-s" => matches.push(Match::Source {
                    negated,
                    net: parse_net(value(token)?)?,
                }),
                "-d" => matches.push(Match::Dest {
                    negated,
                    net: parse_net(value(token)?)?,
                }),
                "--dport" => {
                    need(&["tcp", "udp", "sctp"], token)?;
                    let port = value(token)?.parse().map_err(|_| "bad --dport".to_string())?;
                    matches.push(Match::DestPort { negated, port });
                }
                "--src-type" | "--dst-type" => {
                    need(&["addrtype"], token)?;
                    if value(token)? != "LOCAL" {
                        return Err(format!("{token} supports only LOCAL"));
                    }
                    matches.push(if token == "--src-type" {
                        Match::SrcLocal { negated }
                    } else {
                        Match::DstLocal { negated }
                    });
                }
                "--mode" => {
                    need(&["statistic"], token)?;
                    if value(token)? != "random" {
                        return Err("--mode supports only random".into());
                    }
                }
                "--probability" => {
                    need(&["statistic"], token)?;
                    let p: f64 = value(token)?
                        .parse()
                        .map_err(|_| "bad --probability".to_string())?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(format!("--probability {p} is not in 0..1"));
                    }
                    matches.push(Match::Probability(p));
                }
                "--name" | "--seconds" | "--mask" => {
                    need(&["recent"], token)?;
                    value(token)?;
                }
                // `--rsource` is the default iptables-save spells out.
                "--reap" | "--set" | "--rsource" => need(&["recent"], token)?,
                "--rcheck" => {
                    need(&["recent"], token)?;
                    matches.push(Match::RecentCheck);
                }
                "--mark" => {
                    need(&["mark"], token)?;
                    let (value, mask) = parse_mark(value(token)?)?;
                    matches.push(Match::Mark { negated, value, mask });
                }
                "--ctstate" => {
                    need(&["conntrack"], token)?;
                    let states = value(token)?.split(',').map(str::to_string).collect();
                    matches.push(Match::CtState { negated, states });
                }
                "-j" => {
                    target = match value(token)? {
                        "ACCEPT" => Target::Accept,
                        "DROP" => Target::Drop,
                        "REJECT" => Target::Reject,
                        "RETURN" => Target::Return,
                        "MASQUERADE" => Target::Masquerade,
                        // Completed by their options below.
                        "DNAT" => Target::Dnat(SocketAddr::from(([0, 0, 0, 0], 0))),
                        "MARK" => Target::MarkOr(0),
                        chain => Target::Chain(chain.to_string()),
                    };
                }
                "--to-destination" => {
                    let Target::Dnat(_) = target else {
                        return Err("--to-destination without DNAT".into());
                    };
                    let to = value(token)?;
                    target = Target::Dnat(to.parse().map_err(|_| format!("bad --to-destination {to}"))?);
                }
                "--or-mark" | "--xor-mark" => {
                    let Target::MarkOr(0) = target else {
                        return Err(format!("{token} without MARK"));
                    };
                    let bits = parse_hex(value(token)?)?;
                    target = if token == "--or-mark" {
                        Target::MarkOr(bits)
                    } else {
                        Target::MarkXor(bits)
                    };
                }
                // iptables-save's spelling of MARK: mark = (mark & !mask) ^ value. The render's
                // --or-mark V is V/V and --xor-mark V is V/0; nothing else is ours.
                "--set-xmark" => {
                    let Target::MarkOr(0) = target else {
                        return Err("--set-xmark without MARK".into());
                    };
                    target = match parse_mark(value(token)?)? {
                        (bits, mask) if bits == mask => Target::MarkOr(bits),
                        (bits, 0) => Target::MarkXor(bits),
                        (bits, mask) => return Err(format!("--set-xmark {bits:#x}/{mask:#x} is not ours")),
                    };
                }
                "--reject-with" => {
                    let Target::Reject = target else {
                        return Err("--reject-with without REJECT".into());
                    };
                    // The render's REJECT is the default, port unreachable, which iptables-save names.
                    let with = value(token)?;
                    if !with.ends_with("port-unreachable") {
                        return Err(format!("--reject-with {with} is not ours"));
                    }
                }
                "--random-fully" => {
                    let Target::Masquerade = target else {
                        return Err("--random-fully without MASQUERADE".into());
                    };
                }
                other => return Err(format!("unsupported option {other:?}")),
            }
            negated = false;
        }
        if negated {
            return Err("dangling !".into());
        }
        if let Target::Dnat(to) = &target
            && to.port() == 0
        {
            return Err("DNAT without --to-destination".into());
        }
        Ok(Self { raw, matches, target })
    }
}

fn parse_net(text: &str) -> Result<IpNet, String> {
    if text.contains('/') {
        text.parse::<IpNet>().map_err(|_| format!("bad CIDR {text}"))
    } else {
        text.parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("bad address {text}"))
    }
}

fn parse_hex(text: &str) -> Result<u32, String> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .map_err(|_| format!("bad mark {text}"))
}

fn parse_mark(text: &str) -> Result<(u32, u32), String> {
    match text.split_once('/') {
        Some((value, mask)) => Ok((parse_hex(value)?, parse_hex(mask)?)),
        None => Ok((parse_hex(text)?, u32::MAX)),
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
