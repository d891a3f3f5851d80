//! Following the first packet of a connection through the modelled tables: nat PREROUTING or OUTPUT,
//! the filter hooks its destination after DNAT selects, nat POSTROUTING; every `-m statistic` rule forks
//! the walk, so a [`Trace`] holds every reachable outcome with its probability.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use switchyard_api::{IpFamily, Protocol};

use super::Tracer;
use super::rule::{Match, Rule, Target};
use crate::error::Error;
use crate::xtables::payload::Table;

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
    /// The interface it arrives on (`-i`); `None` is an interface no rule names. Packets the host
    /// sends have none, whatever this says.
    pub in_interface: Option<Interface>,
}

/// An interface name a packet arrives on, kept inline so [`Packet`] stays `Copy` (names longer than
/// Linux's 15 bytes are cut).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Interface {
    len: u8,
    bytes: [u8; 15],
}

impl Interface {
    /// The interface called `name`.
    pub fn new(name: &str) -> Self {
        let mut bytes = [0; 15];
        let len = name.len().min(15);
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self {
            len: len as u8,
            bytes,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.name())
    }
}

impl Packet {
    /// A packet from `source` to `dest:dest_port`.
    pub fn new(source: IpAddr, protocol: Protocol, dest: IpAddr, dest_port: u16) -> Self {
        Self {
            source,
            protocol,
            dest,
            dest_port,
            in_interface: None,
        }
    }

    /// The same packet arriving on `interface`.
    pub fn arriving_on(mut self, interface: &str) -> Self {
        self.in_interface = Some(Interface::new(interface));
        self
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

impl Tracer {
    /// Every possible path of `packet` through the modelled rules.
    pub fn trace(&self, packet: &Packet) -> Result<Trace, Error> {
        if IpFamily::of(&packet.source) != self.family || IpFamily::of(&packet.dest) != self.family {
            return Err(Error::ModelTrace(format!(
                "packet is not {:?}: {packet:?}",
                self.family
            )));
        }
        let from_host = self.is_local(packet.source);
        let start = State {
            // Locally generated packets have no input interface (iptables matches `-i` against "").
            iif: match (&packet.in_interface, from_host) {
                (Some(name), false) => name.name().to_string(),
                _ => String::new(),
            },
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
            return Err(Error::ModelTrace(format!(
                "chains nest deeper than {MAX_DEPTH} at {chain}"
            )));
        }
        let rules = self
            .tables
            .get(&table)
            .and_then(|chains| chains.get(chain))
            .ok_or_else(|| Error::ModelTrace(format!("{table} chain {chain} does not exist")))?;
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
            if !rule_matches(rule, &state, self) {
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

#[derive(Debug, Clone)]
struct State {
    iif: String,
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

/// Whether the first packet in `state` matches every match of `rule`.
fn rule_matches(rule: &Rule, state: &State, tracer: &Tracer) -> bool {
    rule.matches.iter().all(|m| match m {
        Match::Source { negated, net } => net.contains(&state.src) != *negated,
        // iptables' `-i NAME+` matches every name starting with NAME.
        Match::InInterface { negated, name } => {
            let matched = match name.strip_suffix('+') {
                Some(prefix) => !state.iif.is_empty() && state.iif.starts_with(prefix),
                None => state.iif == *name,
            };
            matched != *negated
        }
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
        Match::Set { negated, .. } => *negated,
    })
}
