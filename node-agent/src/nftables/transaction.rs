//! One `nft -f` transaction: the operations of a sync in the order the kernel needs them, and their text.
//!
//! ```text
//! diff / partial sync ─► TxBuilder (set_added, chain_changed, element_removed, …) ─► finish()
//!   ─► Transaction [delete table (recreate)] add table │ add sets │ declare new chains │ rewrite chains
//!                  │ flush unreadable sets │ delete elements │ add elements │ flush+delete stale chains
//!                  │ delete stale sets                                     ─► write() ─► nft -f - (atomic)
//! ```
//!
//! The order makes every reference valid when it is made: a rule or map element names only sets and
//! chains added before it, and nothing is deleted while a rule or element still names it (stale chains
//! are flushed before any is deleted; sets go last). A key whose value changes is deleted, then added
//! (nft refuses to overwrite a map element).
//!
//! A table created whole (a first start, or a recreation) adds every element of the desired table: the
//! transaction borrows them from that [`TableState`] ([`Elements::Whole`]) instead of copying them, so
//! the agent's peak is one copy of its table, not two.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Write};

use switchyard_api::IpFamily;

use super::model::{ChainDef, Claim, Hook, Key, SetDecl, Value, family_keyword};
use super::names::{DIGEST_PREFIX, TABLE};

/// Most elements written on one `add element` line (keeps lines, and nft's parser state, small).
const ELEMENTS_PER_LINE: usize = 1000;

/// The elements of one `add element` operation, written in key order either way.
#[derive(Debug, Clone)]
pub enum Elements<'a> {
    /// Elements of its own (a diff or a partial sync: few, sorted, no key twice).
    Listed(Vec<(Key, Value)>),
    /// Every element of one set of the desired table, borrowed.
    Whole(&'a HashMap<Key, Claim>),
}

impl Elements<'_> {
    /// How many.
    pub fn len(&self) -> usize {
        match self {
            Self::Listed(elements) => elements.len(),
            Self::Whole(elements) => elements.len(),
        }
    }

    /// None.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// In key order (a borrowed set is sorted here, by reference: 16 bytes an element, not a copy).
    pub fn sorted(&self) -> Vec<(&Key, &Value)> {
        match self {
            Self::Listed(elements) => elements.iter().map(|(key, value)| (key, value)).collect(),
            Self::Whole(elements) => {
                let mut sorted: Vec<(&Key, &Value)> =
                    elements.iter().map(|(key, claim)| (key, &claim.value)).collect();
                sorted.sort_unstable_by_key(|(key, _)| **key);
                sorted
            }
        }
    }

    /// A list of its own (the fake keeps what it was given).
    pub fn into_owned(self) -> Elements<'static> {
        match self {
            Self::Listed(elements) => Elements::Listed(elements),
            whole @ Self::Whole(_) => Elements::Listed(
                whole
                    .sorted()
                    .into_iter()
                    .map(|(key, value)| (*key, value.clone()))
                    .collect(),
            ),
        }
    }
}

/// The same elements, however they are held.
impl PartialEq for Elements<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.sorted() == other.sorted()
    }
}

impl Eq for Elements<'_> {}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `add table` (idempotent).
    AddTable,
    /// `delete table`.
    DeleteTable,
    /// `add set` / `add map`, with the digest comment.
    AddSet {
        /// Name.
        name: String,
        /// Declaration.
        decl: SetDecl,
    },
    /// `delete set` / `delete map`.
    DeleteSet(String),
    /// `flush set` (elements only).
    FlushSet(String),
    /// `add chain`, a base chain with its hook.
    AddChain {
        /// Name.
        name: String,
        /// Hook of a base chain.
        base: Option<Hook>,
    },
    /// `flush chain`.
    FlushChain(String),
    /// `delete chain`.
    DeleteChain(String),
    /// `add rule`.
    AddRule {
        /// Chain.
        chain: String,
        /// The rule (with its comment, if any).
        rule: String,
    },
    /// `add element` (set or map).
    AddElements {
        /// Set.
        set: String,
        /// Elements (the value is [`Value::None`] in a set).
        elements: Elements<'a>,
    },
    /// `delete element`.
    DeleteElements {
        /// Set.
        set: String,
        /// Keys.
        keys: Vec<Key>,
    },
}

/// The operations of one sync of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction<'a> {
    /// The family (and so the table).
    pub family: IpFamily,
    /// In order.
    pub ops: Vec<Op<'a>>,
}

impl Transaction<'_> {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Elements added or deleted.
    pub fn element_changes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::AddElements { elements, .. } => elements.len(),
                Op::DeleteElements { keys, .. } => keys.len(),
                _ => 0,
            })
            .sum()
    }

    /// Chains rewritten, added or deleted.
    pub fn chain_changes(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::FlushChain(_) | Op::AddChain { .. }))
            .count()
    }

    /// Writes the `nft -f` text.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let table = format!("{} {TABLE}", family_keyword(self.family));
        for op in &self.ops {
            match op {
                Op::AddTable => writeln!(out, "add table {table}")?,
                Op::DeleteTable => writeln!(out, "delete table {table}")?,
                Op::AddSet { name, decl } => {
                    let kind = if decl.map { "map" } else { "set" };
                    writeln!(
                        out,
                        "add {kind} {table} {name} {{ {} comment \"{DIGEST_PREFIX}{}\"; }}",
                        decl.body,
                        decl.digest()
                    )?
                }
                // `delete set` removes maps too.
                Op::DeleteSet(name) => writeln!(out, "delete set {table} {name}")?,
                Op::FlushSet(name) => writeln!(out, "flush set {table} {name}")?,
                Op::AddChain { name, base: None } => writeln!(out, "add chain {table} {name}")?,
                Op::AddChain {
                    name,
                    base: Some(hook),
                } => writeln!(out, "add chain {table} {name} {{ {hook} }}")?,
                Op::FlushChain(name) => writeln!(out, "flush chain {table} {name}")?,
                Op::DeleteChain(name) => writeln!(out, "delete chain {table} {name}")?,
                Op::AddRule { chain, rule } => writeln!(out, "add rule {table} {chain} {rule}")?,
                Op::AddElements { set, elements } => {
                    for chunk in elements.sorted().chunks(ELEMENTS_PER_LINE) {
                        write!(out, "add element {table} {set} {{ ")?;
                        for (i, (key, value)) in chunk.iter().enumerate() {
                            let sep = if i == 0 { "" } else { ", " };
                            match value {
                                Value::None => write!(out, "{sep}{key}")?,
                                value => write!(out, "{sep}{key} : {value}")?,
                            }
                        }
                        writeln!(out, " }}")?;
                    }
                }
                Op::DeleteElements { set, keys } => {
                    for chunk in keys.chunks(ELEMENTS_PER_LINE) {
                        write!(out, "delete element {table} {set} {{ ")?;
                        for (i, key) in chunk.iter().enumerate() {
                            let sep = if i == 0 { "" } else { ", " };
                            write!(out, "{sep}{key}")?;
                        }
                        writeln!(out, " }}")?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The text (tests, `render`).
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The same transaction holding its own elements.
    pub fn into_owned(self) -> Transaction<'static> {
        Transaction {
            family: self.family,
            ops: self.ops.into_iter().map(Op::into_owned).collect(),
        }
    }
}

impl Op<'_> {
    /// The same operation holding its own elements.
    pub fn into_owned(self) -> Op<'static> {
        match self {
            Self::AddTable => Op::AddTable,
            Self::DeleteTable => Op::DeleteTable,
            Self::AddSet { name, decl } => Op::AddSet { name, decl },
            Self::DeleteSet(name) => Op::DeleteSet(name),
            Self::FlushSet(name) => Op::FlushSet(name),
            Self::AddChain { name, base } => Op::AddChain { name, base },
            Self::FlushChain(name) => Op::FlushChain(name),
            Self::DeleteChain(name) => Op::DeleteChain(name),
            Self::AddRule { chain, rule } => Op::AddRule { chain, rule },
            Self::AddElements { set, elements } => Op::AddElements {
                set,
                elements: elements.into_owned(),
            },
            Self::DeleteElements { set, keys } => Op::DeleteElements { set, keys },
        }
    }
}

/// Collects the changes of a sync in any order and emits them in the order the kernel needs.
#[derive(Debug)]
pub struct TxBuilder<'a> {
    family: IpFamily,
    recreate: bool,
    add_table: bool,
    add_sets: BTreeMap<String, SetDecl>,
    new_chains: BTreeMap<String, ChainDef>,
    changed_chains: BTreeMap<String, ChainDef>,
    flush_sets: BTreeSet<String>,
    del_elements: BTreeMap<String, Vec<Key>>,
    add_elements: BTreeMap<String, Vec<(Key, Value)>>,
    whole_sets: BTreeMap<String, &'a HashMap<Key, Claim>>,
    del_chains: BTreeSet<String>,
    del_sets: BTreeSet<String>,
}

impl<'a> TxBuilder<'a> {
    /// Changes to an existing table of `family`.
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            recreate: false,
            add_table: false,
            add_sets: BTreeMap::new(),
            new_chains: BTreeMap::new(),
            changed_chains: BTreeMap::new(),
            flush_sets: BTreeSet::new(),
            del_elements: BTreeMap::new(),
            add_elements: BTreeMap::new(),
            whole_sets: BTreeMap::new(),
            del_chains: BTreeSet::new(),
            del_sets: BTreeSet::new(),
        }
    }

    /// The table does not exist yet.
    pub fn create_table(&mut self) {
        self.add_table = true;
    }

    /// The table exists but cannot be changed in place (a declaration or hook differs): it is deleted
    /// and created again in the same transaction.
    pub fn recreate_table(&mut self) {
        self.recreate = true;
        self.add_table = true;
    }

    /// A new set or map.
    pub fn set_added(&mut self, name: &str, decl: &SetDecl) {
        self.add_sets.insert(name.to_string(), decl.clone());
    }

    /// A set or map to delete.
    pub fn set_removed(&mut self, name: &str) {
        self.del_sets.insert(name.to_string());
    }

    /// A set whose elements must be replaced whole.
    pub fn set_flushed(&mut self, name: &str) {
        self.flush_sets.insert(name.to_string());
    }

    /// A new chain.
    pub fn chain_added(&mut self, name: &str, chain: &ChainDef) {
        self.new_chains.insert(name.to_string(), chain.clone());
    }

    /// An existing chain whose rules change.
    pub fn chain_changed(&mut self, name: &str, chain: &ChainDef) {
        self.changed_chains.insert(name.to_string(), chain.clone());
    }

    /// A chain to delete.
    pub fn chain_removed(&mut self, name: &str) {
        self.del_chains.insert(name.to_string());
    }

    /// An element to delete.
    pub fn element_removed(&mut self, set: &str, key: Key) {
        self.del_elements.entry(set.to_string()).or_default().push(key);
    }

    /// Every element of `set`, borrowed from the desired table (a set created with the table).
    pub fn set_filled(&mut self, set: &str, elements: &'a HashMap<Key, Claim>) {
        self.whole_sets.insert(set.to_string(), elements);
    }

    /// An element to add.
    pub fn element_added(&mut self, set: &str, key: Key, value: Value) {
        self.add_elements
            .entry(set.to_string())
            .or_default()
            .push((key, value));
    }

    /// The transaction.
    pub fn finish(self) -> Transaction<'a> {
        let mut ops = Vec::new();
        if self.recreate {
            ops.push(Op::DeleteTable);
        }
        if self.add_table {
            ops.push(Op::AddTable);
        }
        for (name, decl) in self.add_sets {
            ops.push(Op::AddSet { name, decl });
        }
        for (name, chain) in &self.new_chains {
            ops.push(Op::AddChain {
                name: name.clone(),
                base: chain.base,
            });
        }
        for (name, chain) in &self.changed_chains {
            ops.push(Op::FlushChain(name.clone()));
            ops.extend(chain.rules_to_write().into_iter().map(|rule| Op::AddRule {
                chain: name.clone(),
                rule,
            }));
        }
        for (name, chain) in &self.new_chains {
            ops.extend(chain.rules_to_write().into_iter().map(|rule| Op::AddRule {
                chain: name.clone(),
                rule,
            }));
        }
        for name in &self.flush_sets {
            ops.push(Op::FlushSet(name.clone()));
        }
        // Elements of a set about to be deleted go with it.
        for (set, mut keys) in self.del_elements {
            if self.del_sets.contains(&set) || self.flush_sets.contains(&set) {
                continue;
            }
            keys.sort();
            keys.dedup();
            ops.push(Op::DeleteElements { set, keys });
        }
        let mut add_elements: BTreeMap<String, Elements<'a>> = BTreeMap::new();
        for (set, whole) in self.whole_sets {
            if !whole.is_empty() {
                add_elements.insert(set, Elements::Whole(whole));
            }
        }
        for (set, mut elements) in self.add_elements {
            // A set filled whole gets no single elements besides (nothing asks for both).
            if self.del_sets.contains(&set) || add_elements.contains_key(&set) {
                continue;
            }
            elements.sort_by_key(|a| a.0);
            elements.dedup_by(|a, b| a.0 == b.0);
            add_elements.insert(set, Elements::Listed(elements));
        }
        for (set, elements) in add_elements {
            if !self.del_sets.contains(&set) {
                ops.push(Op::AddElements { set, elements });
            }
        }
        for name in &self.del_chains {
            ops.push(Op::FlushChain(name.clone()));
        }
        for name in self.del_chains {
            ops.push(Op::DeleteChain(name));
        }
        for name in self.del_sets {
            ops.push(Op::DeleteSet(name));
        }
        Transaction {
            family: self.family,
            ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use switchyard_api::Protocol;

    #[test]
    fn operations_come_out_in_kernel_order_whatever_the_order_of_calls() {
        let ip: IpAddr = "10.96.0.1".parse().unwrap();
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.chain_removed("service-OLD-ns/a/tcp");
        tx.element_removed("service-ips", Key::Frontend(ip, Protocol::TCP, 80));
        tx.element_added(
            "service-ips",
            Key::Frontend(ip, Protocol::TCP, 80),
            Value::Goto("service-NEW-ns/a/tcp".into()),
        );
        tx.chain_added(
            "service-NEW-ns/a/tcp",
            &ChainDef::regular(vec!["meta l4proto tcp dnat ip to 10.0.0.1:80".into()]),
        );
        tx.set_added(
            "fast-2",
            &super::super::model::SetId::Fast(2).decl(IpFamily::IPv4),
        );
        let text = tx.finish().text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("add set ip switchyard fast-2 { type ipv4_addr . inet_proto . inet_service; counter; comment \"switchyard:"), "{text}");
        assert_eq!(lines[1], "add chain ip switchyard service-NEW-ns/a/tcp");
        assert!(lines[2].starts_with("add rule ip switchyard service-NEW-ns/a/tcp meta l4proto tcp dnat ip to 10.0.0.1:80 comment \"switchyard:"));
        assert_eq!(
            lines[3],
            "delete element ip switchyard service-ips { 10.96.0.1 . tcp . 80 }"
        );
        assert_eq!(
            lines[4],
            "add element ip switchyard service-ips { 10.96.0.1 . tcp . 80 : goto service-NEW-ns/a/tcp }"
        );
        assert_eq!(lines[5], "flush chain ip switchyard service-OLD-ns/a/tcp");
        assert_eq!(lines[6], "delete chain ip switchyard service-OLD-ns/a/tcp");
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn long_element_lists_are_split_and_recreation_deletes_first() {
        let mut tx = TxBuilder::new(IpFamily::IPv6);
        tx.recreate_table();
        for i in 0..2500u16 {
            tx.element_added("fast-np-1", Key::Port(Protocol::UDP, i + 1), Value::None);
        }
        let transaction = tx.finish();
        assert_eq!(transaction.element_changes(), 2500);
        let text = transaction.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "delete table ip6 switchyard");
        assert_eq!(lines[1], "add table ip6 switchyard");
        assert_eq!(lines.len(), 5);
        assert!(lines[2].starts_with("add element ip6 switchyard fast-np-1 { udp . 1, udp . 2,"));
    }

    #[test]
    fn a_set_filled_whole_writes_what_the_same_elements_listed_write() {
        let whole: HashMap<Key, Claim> = (0..2500u16)
            .rev()
            .map(|i| {
                let claim = Claim {
                    value: Value::None,
                    count: 1,
                };
                (Key::Port(Protocol::TCP, i + 1), claim)
            })
            .collect();
        let mut filled = TxBuilder::new(IpFamily::IPv4);
        filled.create_table();
        filled.set_filled("fast-np-1", &whole);
        let mut listed = TxBuilder::new(IpFamily::IPv4);
        listed.create_table();
        for key in whole.keys() {
            listed.element_added("fast-np-1", *key, Value::None);
        }
        let (filled, listed) = (filled.finish(), listed.finish());
        assert!(matches!(
            filled.ops[1],
            Op::AddElements {
                elements: Elements::Whole(_),
                ..
            }
        ));
        assert_eq!(filled.element_changes(), 2500);
        assert_eq!(filled.text(), listed.text());
        assert!(filled.text().contains("{ tcp . 1, tcp . 2, tcp . 3,"));
        assert_eq!(filled, listed);
        assert_eq!(filled.clone().into_owned(), listed);
    }
}
