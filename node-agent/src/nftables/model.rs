//! The structured model of one family's `switchyard` table: named sets and maps with their elements,
//! chains with their rules. The render produces it, the read-back parses the kernel into it, and the
//! diff compares two of them.
//!
//! ```text
//! render (desired) ──────────┐
//!                            ├─► TableState { sets (decl digest), elements by SetId, chains } ─► diff
//! nft -j list table (kernel) ┘        (a read-back knows chains only by rule count + digest)
//! ```
//!
//! Elements are structured ([`Key`], [`Value`]: addresses, protocols, ports, verdicts) rather than text,
//! so 60,000 of them cost a few MB and compare without formatting; `Display` writes the nft syntax.
//! Each element carries a claim count: how many plan entries produced it (first claim wins for maps,
//! like iptables' first matching rule), which the incremental sync needs to remove elements safely.
//!
//! Digests: the first rule of every chain carries `comment "switchyard:<digest of the chain's rules>"`
//! and every named set `comment "switchyard:<digest of its declaration>"`, so reading the kernel back
//! tells an unchanged object without parsing nft's rule expressions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use switchyard_api::{IpFamily, Protocol};

use super::names::{self, DIGEST_PREFIX};

/// The nft family keyword of a table: `ip` or `ip6`.
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::IPv4 => "ip",
        IpFamily::IPv6 => "ip6",
    }
}

/// The nft address type of a family: `ipv4_addr` or `ipv6_addr`.
pub fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::IPv4 => "ipv4_addr",
        IpFamily::IPv6 => "ipv6_addr",
    }
}

/// The named sets and maps with a fixed role. Per-endpoint affinity sets are the only other sets; they
/// are dynamic (the kernel fills them) and named after their endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetId {
    /// Every ClusterIP in the plan: off-cluster masquerade, and REJECT of undefined ports.
    ClusterIps,
    /// Where NodePorts are served, when the plan restricts them (`nodePortAddresses`).
    NodeportIps,
    /// `addr . proto . port : goto <chain>` for complex entries.
    ServiceIps,
    /// `proto . port : goto external-…` for complex entries' NodePorts.
    ServiceNodeports,
    /// `addr . proto . port : drop | goto reject-chain`.
    NoEndpointServices,
    /// `proto . port : drop | goto reject-chain`.
    NoEndpointNodeports,
    /// `lb-ip . proto . port : goto firewall-…`.
    FirewallIps,
    /// Plain external frontends (externalIP, LoadBalancer IP): always masqueraded.
    FastMasq,
    /// `ep . ep . proto . port` of endpoints on this node: a pod reaching itself is masqueraded.
    Hairpin,
    /// Plain frontends (`addr . proto . port`) whose dispatch set has N endpoints.
    Fast(u32),
    /// `addr . proto . port . slot : ep . port` for the frontends of `Fast(N)`, slots 0..N.
    FastEps(u32),
    /// Plain NodePorts (`proto . port`) whose dispatch set has N endpoints.
    FastNp(u32),
    /// `proto . port . slot : ep . port` for the NodePorts of `FastNp(N)`.
    FastNpEps(u32),
}

impl SetId {
    /// Every fixed (not per-class) set, declared in every table.
    pub const FIXED: [SetId; 9] = [
        SetId::ClusterIps,
        SetId::NodeportIps,
        SetId::ServiceIps,
        SetId::ServiceNodeports,
        SetId::NoEndpointServices,
        SetId::NoEndpointNodeports,
        SetId::FirewallIps,
        SetId::FastMasq,
        SetId::Hairpin,
    ];

    /// The set's name in the table.
    pub fn name(self) -> String {
        match self {
            Self::ClusterIps => "cluster-ips".into(),
            Self::NodeportIps => "nodeport-ips".into(),
            Self::ServiceIps => "service-ips".into(),
            Self::ServiceNodeports => "service-nodeports".into(),
            Self::NoEndpointServices => "no-endpoint-services".into(),
            Self::NoEndpointNodeports => "no-endpoint-nodeports".into(),
            Self::FirewallIps => "firewall-ips".into(),
            Self::FastMasq => "fast-masq".into(),
            Self::Hairpin => "hairpin".into(),
            Self::Fast(n) => format!("fast-{n}"),
            Self::FastEps(n) => format!("fast-{n}-eps"),
            Self::FastNp(n) => format!("fast-np-{n}"),
            Self::FastNpEps(n) => format!("fast-np-{n}-eps"),
        }
    }

    /// The inverse of [`SetId::name`].
    pub fn parse(name: &str) -> Option<Self> {
        if let Some(fixed) = Self::FIXED.iter().find(|id| id.name() == name) {
            return Some(*fixed);
        }
        let class = |text: &str| text.parse::<u32>().ok().filter(|n| *n > 0);
        if let Some(rest) = name.strip_prefix("fast-np-") {
            return match rest.strip_suffix("-eps") {
                Some(n) => class(n).map(Self::FastNpEps),
                None => class(rest).map(Self::FastNp),
            };
        }
        let rest = name.strip_prefix("fast-")?;
        match rest.strip_suffix("-eps") {
            Some(n) => class(n).map(Self::FastEps),
            None => class(rest).map(Self::Fast),
        }
    }

    /// The chain holding the class's DNAT rule, for `Fast(N)` and `FastNp(N)`: `fast-N-dnat`.
    pub fn dnat_chain(self) -> Option<String> {
        match self {
            Self::Fast(_) | Self::FastNp(_) => Some(format!("{}-dnat", self.name())),
            _ => None,
        }
    }

    /// The class whose DNAT chain is `name`.
    pub fn of_dnat_chain(name: &str) -> Option<Self> {
        let set = Self::parse(name.strip_suffix("-dnat")?)?;
        matches!(set, Self::Fast(_) | Self::FastNp(_)).then_some(set)
    }

    /// The map of endpoints of a class set.
    pub fn endpoints_map(self) -> Option<Self> {
        match self {
            Self::Fast(n) => Some(Self::FastEps(n)),
            Self::FastNp(n) => Some(Self::FastNpEps(n)),
            _ => None,
        }
    }

    /// Its declaration in `family`.
    pub fn decl(self, family: IpFamily) -> SetDecl {
        let addr = addr_type(family);
        let ip = family_keyword(family);
        let frontend = format!("{addr} . inet_proto . inet_service");
        let (body, map) = match self {
            Self::ClusterIps | Self::NodeportIps => (format!("type {addr};"), false),
            Self::ServiceIps | Self::NoEndpointServices | Self::FirewallIps => {
                (format!("type {frontend} : verdict;"), true)
            }
            Self::ServiceNodeports | Self::NoEndpointNodeports => {
                ("type inet_proto . inet_service : verdict;".to_string(), true)
            }
            Self::FastMasq | Self::Fast(_) => (format!("type {frontend};"), false),
            Self::Hairpin => (
                format!("type {addr} . {addr} . inet_proto . inet_service;"),
                false,
            ),
            // The value must be `th dport`: `tcp dport` would make nft add a `meta l4proto tcp` match to
            // every rule using the map. nft 1.0.6 cannot re-read `th dport` from an existing map's
            // declaration, so only the class chain created with the map names it (see `render_global`).
            Self::FastEps(n) => (
                format!(
                    "typeof {ip} daddr . meta l4proto . th dport . numgen random mod {n} : {ip} daddr . th dport;"
                ),
                true,
            ),
            Self::FastNp(_) => ("type inet_proto . inet_service;".to_string(), false),
            Self::FastNpEps(n) => (
                format!("typeof meta l4proto . th dport . numgen random mod {n} : {ip} daddr . th dport;"),
                true,
            ),
        };
        // Counted sets: the kernel keeps one counter per element, bumped by each lookup that matches.
        // They sit on NAT and `ct state new` paths, so an element's count is new connections.
        let body = if self.counted() {
            format!("{body} counter;")
        } else {
            body
        };
        SetDecl {
            body,
            map,
            dynamic: false,
        }
    }

    /// Whether its elements carry a counter ([`crate::counters`] reads them): the frontend sets and
    /// maps (connections per frontend), the endpoint maps of plain entries (per endpoint) and the
    /// no-endpoint maps (dropped and rejected).
    pub fn counted(self) -> bool {
        matches!(
            self,
            Self::ServiceIps
                | Self::ServiceNodeports
                | Self::NoEndpointServices
                | Self::NoEndpointNodeports
                | Self::Fast(_)
                | Self::FastEps(_)
                | Self::FastNp(_)
                | Self::FastNpEps(_)
        )
    }
}

/// How a named set or map is declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetDecl {
    /// The declaration inside the braces, without the comment (`type …; flags …;`).
    pub body: String,
    /// A map (`add map`), not a set.
    pub map: bool,
    /// The kernel adds the elements (affinity sets): the agent never diffs them.
    pub dynamic: bool,
}

impl SetDecl {
    /// A per-endpoint ClientIP affinity set: source addresses, each forgotten `seconds` after its last
    /// connection.
    pub fn affinity(family: IpFamily, seconds: u32) -> Self {
        Self {
            body: format!(
                "type {}; flags dynamic,timeout; timeout {seconds}s;",
                addr_type(family)
            ),
            map: false,
            dynamic: true,
        }
    }

    /// The digest written into the set's comment.
    pub fn digest(&self) -> String {
        names::digest(&self.body)
    }
}

/// What the table knows about a named set: the digest from its comment, and, for a desired set, its
/// declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetState {
    /// The digest of the declaration (from the comment when read back; empty when it had none).
    pub digest: String,
    /// The declaration (desired sets; `None` when read back).
    pub decl: Option<SetDecl>,
}

impl SetState {
    /// A desired set.
    pub fn declared(decl: SetDecl) -> Self {
        Self {
            digest: decl.digest(),
            decl: Some(decl),
        }
    }

    /// Whether the kernel fills it (its elements are not compared).
    pub fn dynamic(&self) -> bool {
        self.decl.as_ref().is_some_and(|d| d.dynamic)
    }
}

/// A set or map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// `addr`.
    Addr(IpAddr),
    /// `addr . proto . port`.
    Frontend(IpAddr, Protocol, u16),
    /// `addr . proto . port . slot`.
    FrontendSlot(IpAddr, Protocol, u16, u32),
    /// `proto . port`.
    Port(Protocol, u16),
    /// `proto . port . slot`.
    PortSlot(Protocol, u16, u32),
    /// `ep . ep . proto . port`.
    Hairpin(IpAddr, Protocol, u16),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(ip) => write!(f, "{ip}"),
            Self::Frontend(ip, proto, port) => write!(f, "{ip} . {} . {port}", proto.lower()),
            Self::FrontendSlot(ip, proto, port, slot) => {
                write!(f, "{ip} . {} . {port} . {slot}", proto.lower())
            }
            Self::Port(proto, port) => write!(f, "{} . {port}", proto.lower()),
            Self::PortSlot(proto, port, slot) => write!(f, "{} . {port} . {slot}", proto.lower()),
            Self::Hairpin(ip, proto, port) => write!(f, "{ip} . {ip} . {} . {port}", proto.lower()),
        }
    }
}

/// A map value (or nothing, in a set).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    /// A set element.
    None,
    /// `ep . port`: a DNAT target.
    Endpoint(IpAddr, u16),
    /// `goto <chain>`.
    Goto(Arc<str>),
    /// `drop`.
    Drop,
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Endpoint(ip, port) => write!(f, "{ip} . {port}"),
            Self::Goto(chain) => write!(f, "goto {chain}"),
            Self::Drop => f.write_str("drop"),
        }
    }
}

/// One element as the plan entries claimed it: the value of the first claim, and how many claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The value (the first claim's, for maps).
    pub value: Value,
    /// How many entries produced this key (a read-back counts 1).
    pub count: u32,
}

/// Hook types of base chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    /// `type filter`.
    Filter,
    /// `type nat`.
    Nat,
}

/// Where a base chain hooks in, with which priority (numeric: nft's JSON reports numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hook {
    /// `filter` or `nat`.
    pub kind: ChainType,
    /// `prerouting`, `input`, `forward`, `output` or `postrouting`.
    pub hook: &'static str,
    /// The priority.
    pub priority: i32,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        };
        write!(
            f,
            "type {kind} hook {} priority {}; policy accept;",
            self.hook, self.priority
        )
    }
}

/// A chain's rules, or (read back from the kernel) only how many there are and the first one's digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainBody {
    /// Rule texts, without the digest comment.
    Rules(Vec<String>),
    /// What a read-back knows.
    Summary {
        /// How many rules.
        rules: usize,
        /// The digest in the first rule's comment, if it had one.
        digest: Option<String>,
    },
}

/// A chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainDef {
    /// Set for base chains.
    pub base: Option<Hook>,
    /// Its rules.
    pub body: ChainBody,
}

impl ChainDef {
    /// A regular chain with these rules.
    pub fn regular(rules: Vec<String>) -> Self {
        Self {
            base: None,
            body: ChainBody::Rules(rules),
        }
    }

    /// How many rules, and the digest the first one carries (none for an empty chain).
    pub fn summary(&self) -> (usize, Option<String>) {
        match &self.body {
            ChainBody::Rules(rules) if rules.is_empty() => (0, None),
            ChainBody::Rules(rules) => (rules.len(), Some(names::digest(&rules.join("\n")))),
            ChainBody::Summary { rules, digest } => (*rules, digest.clone()),
        }
    }

    /// The rules as written to nft: the first carries the digest comment.
    pub fn rules_to_write(&self) -> Vec<String> {
        let ChainBody::Rules(rules) = &self.body else {
            return Vec::new();
        };
        let (_, digest) = self.summary();
        rules
            .iter()
            .enumerate()
            .map(|(i, rule)| match (&digest, i) {
                (Some(d), 0) => format!("{rule} comment \"{DIGEST_PREFIX}{d}\""),
                _ => rule.clone(),
            })
            .collect()
    }
}

/// One family's table: what the agent wants there, or what a read-back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableState {
    /// `ip` or `ip6`.
    pub family: IpFamily,
    /// Every named set and map (fixed, per-class and affinity), by name.
    pub sets: BTreeMap<String, SetState>,
    /// The elements of the sets with a fixed role; affinity sets have none here.
    pub elements: BTreeMap<SetId, HashMap<Key, Claim>>,
    /// Every chain, by name.
    pub chains: BTreeMap<String, ChainDef>,
    /// Sets whose elements a read-back could not understand: they are flushed and refilled.
    pub unreadable: BTreeSet<String>,
}

impl TableState {
    /// An empty table of `family`.
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            sets: BTreeMap::new(),
            elements: BTreeMap::new(),
            chains: BTreeMap::new(),
            unreadable: BTreeSet::new(),
        }
    }

    /// Rules in all chains.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.summary().0).sum()
    }

    /// Elements in all sets and maps with a fixed role.
    pub fn element_count(&self) -> usize {
        self.elements.values().map(HashMap::len).sum()
    }

    /// The value of `key` in set `id`, if present.
    pub fn value(&self, id: SetId, key: &Key) -> Option<&Value> {
        self.elements.get(&id)?.get(key).map(|c| &c.value)
    }

    /// The elements of `id`, sorted (for text output and tests).
    pub fn sorted_elements(&self, id: SetId) -> Vec<(Key, Value)> {
        let mut list: Vec<(Key, Value)> = self
            .elements
            .get(&id)
            .map(|m| m.iter().map(|(k, c)| (*k, c.value.clone())).collect())
            .unwrap_or_default();
        list.sort_by_key(|a| a.0);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_round_trip() {
        let ids = SetId::FIXED.into_iter().chain([
            SetId::Fast(5),
            SetId::FastEps(5),
            SetId::FastNp(1),
            SetId::FastNpEps(12),
        ]);
        for id in ids {
            assert_eq!(SetId::parse(&id.name()), Some(id), "{}", id.name());
        }
        for bad in ["fast-0", "fast-x", "fast--eps", "affinity-X", "fast-np-", "other"] {
            assert_eq!(SetId::parse(bad), None, "{bad}");
        }
        assert_eq!(SetId::Fast(5).dnat_chain().as_deref(), Some("fast-5-dnat"));
        assert_eq!(SetId::of_dnat_chain("fast-np-2-dnat"), Some(SetId::FastNp(2)));
        assert_eq!(SetId::of_dnat_chain("fast-2-eps-dnat"), None);
        assert_eq!(SetId::of_dnat_chain("services"), None);
    }

    #[test]
    fn elements_print_in_nft_syntax() {
        let ip: IpAddr = "10.96.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            Key::Frontend(ip, Protocol::TCP, 80).to_string(),
            "10.96.0.1 . tcp . 80"
        );
        assert_eq!(
            Key::FrontendSlot(v6, Protocol::UDP, 53, 2).to_string(),
            "fd00::1 . udp . 53 . 2"
        );
        assert_eq!(
            Key::PortSlot(Protocol::SCTP, 30000, 0).to_string(),
            "sctp . 30000 . 0"
        );
        assert_eq!(
            Key::Hairpin(ip, Protocol::TCP, 8080).to_string(),
            "10.96.0.1 . 10.96.0.1 . tcp . 8080"
        );
        assert_eq!(Value::Endpoint(v6, 8080).to_string(), "fd00::1 . 8080");
        assert_eq!(
            Value::Goto("reject-chain".into()).to_string(),
            "goto reject-chain"
        );
    }

    #[test]
    fn the_first_rule_carries_the_chain_digest() {
        let chain = ChainDef::regular(vec!["jump services".into(), "accept".into()]);
        let written = chain.rules_to_write();
        let (count, digest) = chain.summary();
        assert_eq!(count, 2);
        let digest = digest.unwrap();
        assert_eq!(
            written[0],
            format!("jump services comment \"switchyard:{digest}\"")
        );
        assert_eq!(written[1], "accept");
        assert_eq!(ChainDef::regular(vec![]).summary(), (0, None));
        let read_back = ChainDef {
            base: None,
            body: ChainBody::Summary {
                rules: 2,
                digest: Some(digest),
            },
        };
        assert_eq!(read_back.summary(), chain.summary());
    }

    #[test]
    fn hooks_print_numeric_priorities() {
        let hook = Hook {
            kind: ChainType::Nat,
            hook: "output",
            priority: -100,
        };
        assert_eq!(
            hook.to_string(),
            "type nat hook output priority -100; policy accept;"
        );
        assert_ne!(
            SetDecl::affinity(IpFamily::IPv4, 10).digest(),
            SetDecl::affinity(IpFamily::IPv4, 20).digest()
        );
        assert!(
            SetId::FastEps(3)
                .decl(IpFamily::IPv6)
                .body
                .contains(": ip6 daddr . th dport;")
        );
    }
}
