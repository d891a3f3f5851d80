//! An in-memory [`Nft`] for tests: one table per family that transactions change with nft's rules,
//! atomically, and that tests can tamper with (drift) or make fail.
//!
//! ```text
//! apply(tx) ─► copy of the table ─► each op checked like the kernel ─► all ok: copy becomes the table
//!                                      │                                 any error: table unchanged,
//!                                      │                                 Error::NftTransaction
//!   add element: set exists, a map key is not overwritten, goto targets exist (else EEXIST / ENOENT)
//!   delete element / chain / set: it exists, nothing refers to it any more (else ENOENT / EBUSY)
//!   add rule: the chain and every chain (goto/jump) and set (@name) it names exist
//! read / summary / exists ─► the table as the read-back and the netlink look would see it
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use switchyard_api::IpFamily;

use super::kernel::{ChainSummary, Nft, SetSummary, Summary};
use super::model::{
    ChainBody, ChainDef, Claim, Hook, Key, SetDecl, SetId, SetState, TableState, Value, family_keyword,
};
use super::names::DIGEST_PREFIX;
use super::transaction::{Op, Transaction};
use crate::error::Error;

#[derive(Debug, Clone)]
struct FakeSet {
    decl: SetDecl,
    elements: BTreeMap<Key, Value>,
}

#[derive(Debug, Clone)]
struct FakeChain {
    base: Option<Hook>,
    rules: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct FakeTable {
    sets: BTreeMap<String, FakeSet>,
    chains: BTreeMap<String, FakeChain>,
}

/// The chains (`goto`/`jump` targets) and sets (`@name`) a rule names.
pub fn references(rule: &str) -> (Vec<String>, Vec<String>) {
    let trim = |t: &str| t.trim_end_matches([',', '}', ';']).to_string();
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    let tokens: Vec<&str> = rule.split_whitespace().collect();
    for (i, token) in tokens.iter().enumerate() {
        if (*token == "goto" || *token == "jump")
            && let Some(next) = tokens.get(i + 1)
        {
            chains.push(trim(next));
        }
        if let Some(set) = token.strip_prefix('@') {
            sets.push(trim(set));
        }
    }
    (chains, sets)
}

/// The digest in a rule's `comment "switchyard:…"`, if any.
fn rule_digest(rule: &str) -> Option<String> {
    let start = rule.find(&format!("comment \"{DIGEST_PREFIX}"))? + "comment \"".len() + DIGEST_PREFIX.len();
    let rest = &rule[start..];
    Some(rest[..rest.find('"')?].to_string())
}

impl FakeTable {
    fn chain_referenced(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|rule| references(rule).0.iter().any(|c| c == name))
            || self
                .sets
                .values()
                .flat_map(|s| s.elements.values())
                .any(|v| matches!(v, Value::Goto(c) if &**c == name))
    }

    fn set_referenced(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|rule| references(rule).1.iter().any(|s| s == name))
    }

    fn apply(&mut self, op: &Op<'_>) -> Result<(), String> {
        const ENOENT: &str = "No such file or directory";
        const EEXIST: &str = "File exists";
        const EBUSY: &str = "Device or resource busy";
        match op {
            Op::AddTable | Op::DeleteTable => Ok(()),
            Op::AddSet { name, decl } => match self.sets.get(name) {
                Some(set) if set.decl != *decl => Err(format!("set {name}: {EEXIST}")),
                Some(_) => Ok(()),
                None => {
                    self.sets.insert(
                        name.clone(),
                        FakeSet {
                            decl: decl.clone(),
                            elements: BTreeMap::new(),
                        },
                    );
                    Ok(())
                }
            },
            Op::DeleteSet(name) => {
                if !self.sets.contains_key(name) {
                    return Err(format!("set {name}: {ENOENT}"));
                }
                if self.set_referenced(name) {
                    return Err(format!("set {name}: {EBUSY}"));
                }
                self.sets.remove(name);
                Ok(())
            }
            Op::FlushSet(name) => {
                let set = self.sets.get_mut(name).ok_or(format!("set {name}: {ENOENT}"))?;
                set.elements.clear();
                Ok(())
            }
            Op::AddChain { name, base } => match self.chains.get(name) {
                Some(chain) if chain.base != *base => Err(format!("chain {name}: {EEXIST}")),
                Some(_) => Ok(()),
                None => {
                    self.chains.insert(
                        name.clone(),
                        FakeChain {
                            base: *base,
                            rules: Vec::new(),
                        },
                    );
                    Ok(())
                }
            },
            Op::FlushChain(name) => {
                let chain = self
                    .chains
                    .get_mut(name)
                    .ok_or(format!("chain {name}: {ENOENT}"))?;
                chain.rules.clear();
                Ok(())
            }
            Op::DeleteChain(name) => {
                if !self.chains.contains_key(name) {
                    return Err(format!("chain {name}: {ENOENT}"));
                }
                if self.chain_referenced(name) {
                    return Err(format!("chain {name}: {EBUSY}"));
                }
                self.chains.remove(name);
                Ok(())
            }
            Op::AddRule { chain, rule } => {
                let (chains, sets) = references(rule);
                if let Some(missing) = chains.iter().find(|c| !self.chains.contains_key(*c)) {
                    return Err(format!("rule in {chain} names chain {missing}: {ENOENT}"));
                }
                if let Some(missing) = sets.iter().find(|s| !self.sets.contains_key(*s)) {
                    return Err(format!("rule in {chain} names set {missing}: {ENOENT}"));
                }
                let target = self
                    .chains
                    .get_mut(chain)
                    .ok_or(format!("chain {chain}: {ENOENT}"))?;
                target.rules.push(rule.clone());
                Ok(())
            }
            Op::AddElements { set, elements } => {
                let elements = elements.sorted();
                for &(_, value) in &elements {
                    if let Value::Goto(target) = value
                        && !self.chains.contains_key(&**target)
                    {
                        return Err(format!("element of {set} names chain {target}: {ENOENT}"));
                    }
                }
                let target = self.sets.get_mut(set).ok_or(format!("set {set}: {ENOENT}"))?;
                for &(key, value) in &elements {
                    match target.elements.get(key) {
                        Some(have) if have != value => return Err(format!("{set} {key}: {EEXIST}")),
                        _ => {
                            target.elements.insert(*key, value.clone());
                        }
                    }
                }
                Ok(())
            }
            Op::DeleteElements { set, keys } => {
                let target = self.sets.get_mut(set).ok_or(format!("set {set}: {ENOENT}"))?;
                for key in keys {
                    if target.elements.remove(key).is_none() {
                        return Err(format!("{set} {key}: {ENOENT}"));
                    }
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    tables: BTreeMap<IpFamily, FakeTable>,
    applied: Vec<Transaction<'static>>,
    fail_next: Option<String>,
    reads: usize,
    summaries: usize,
}

/// The fake kernel. Clones share one state, so a test keeps a handle on the kernel a dataplane (or a
/// syncer) owns.
#[derive(Debug, Clone, Default)]
pub struct FakeNft {
    state: Arc<Mutex<State>>,
}

impl FakeNft {
    /// An empty host: no tables.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; its state is still readable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next `apply` fails with `reason` and changes nothing.
    pub fn fail_next_apply(&self, reason: &str) {
        self.state().fail_next = Some(reason.to_string());
    }

    /// Transactions applied successfully, oldest first.
    pub fn applied(&self) -> Vec<Transaction<'static>> {
        self.state().applied.clone()
    }

    /// How many full read-backs were made.
    pub fn reads(&self) -> usize {
        self.state().reads
    }

    /// How many cheap looks were taken.
    pub fn summaries(&self) -> usize {
        self.state().summaries
    }

    /// Whether our table of `family` exists.
    pub fn has_table(&self, family: IpFamily) -> bool {
        self.state().tables.contains_key(&family)
    }

    /// The rules of a chain (with their comments).
    pub fn rules(&self, family: IpFamily, chain: &str) -> Option<Vec<String>> {
        Some(self.state().tables.get(&family)?.chains.get(chain)?.rules.clone())
    }

    /// The elements of a named set.
    pub fn elements(&self, family: IpFamily, set: &str) -> Option<BTreeMap<Key, Value>> {
        Some(self.state().tables.get(&family)?.sets.get(set)?.elements.clone())
    }

    /// Chain names of the table.
    pub fn chain_names(&self, family: IpFamily) -> Vec<String> {
        self.state()
            .tables
            .get(&family)
            .map(|t| t.chains.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Set names of the table.
    pub fn set_names(&self, family: IpFamily) -> Vec<String> {
        self.state()
            .tables
            .get(&family)
            .map(|t| t.sets.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Drift: someone ran `nft flush chain`.
    pub fn flush_chain(&self, family: IpFamily, chain: &str) {
        if let Some(c) = self
            .state()
            .tables
            .get_mut(&family)
            .and_then(|t| t.chains.get_mut(chain))
        {
            c.rules.clear();
        }
    }

    /// Drift: someone deleted an element.
    pub fn delete_element(&self, family: IpFamily, set: &str, key: &Key) {
        if let Some(s) = self
            .state()
            .tables
            .get_mut(&family)
            .and_then(|t| t.sets.get_mut(set))
        {
            s.elements.remove(key);
        }
    }

    /// Drift: someone ran `nft delete table` (or `flush ruleset`).
    pub fn delete_table(&self, family: IpFamily) {
        self.state().tables.remove(&family);
    }
}

impl Nft for FakeNft {
    fn apply(&mut self, transaction: &Transaction<'_>) -> Result<(), Error> {
        let family = transaction.family;
        let fail = |reason: String| Error::NftTransaction {
            family: family_keyword(family).to_string(),
            line: None,
            stderr: format!("Error: Could not process rule: {reason}"),
            context: String::new(),
        };
        let mut state = self.state();
        if let Some(reason) = state.fail_next.take() {
            return Err(fail(reason));
        }
        let mut table: Option<FakeTable> = state.tables.get(&family).cloned();
        for op in &transaction.ops {
            match op {
                Op::AddTable => {
                    table.get_or_insert_with(FakeTable::default);
                }
                Op::DeleteTable => {
                    if table.take().is_none() {
                        return Err(fail("table switchyard: No such file or directory".into()));
                    }
                }
                op => match table.as_mut() {
                    None => return Err(fail("table switchyard: No such file or directory".into())),
                    Some(t) => t.apply(op).map_err(fail)?,
                },
            }
        }
        match table {
            Some(t) => state.tables.insert(family, t),
            None => state.tables.remove(&family),
        };
        state.applied.push(transaction.clone().into_owned());
        Ok(())
    }

    fn read(&mut self, family: IpFamily) -> Result<Option<TableState>, Error> {
        let mut state = self.state();
        state.reads += 1;
        let Some(table) = state.tables.get(&family) else {
            return Ok(None);
        };
        let mut read = TableState::new(family);
        for (name, set) in &table.sets {
            read.sets.insert(
                name.clone(),
                SetState {
                    digest: set.decl.digest(),
                    decl: None,
                },
            );
            if let Some(id) = SetId::parse(name)
                && !set.elements.is_empty()
            {
                let elements = set
                    .elements
                    .iter()
                    .map(|(k, v)| {
                        (
                            *k,
                            Claim {
                                value: v.clone(),
                                count: 1,
                            },
                        )
                    })
                    .collect();
                read.elements.insert(id, elements);
            }
        }
        for (name, chain) in &table.chains {
            read.chains.insert(
                name.clone(),
                ChainDef {
                    base: chain.base,
                    body: ChainBody::Summary {
                        rules: chain.rules.len(),
                        digest: chain.rules.first().and_then(|r| rule_digest(r)),
                    },
                },
            );
        }
        Ok(Some(read))
    }

    fn exists(&mut self, family: IpFamily) -> Result<bool, Error> {
        Ok(self.state().tables.contains_key(&family))
    }

    fn summary(&mut self, family: IpFamily) -> Result<Option<Summary>, Error> {
        let mut state = self.state();
        state.summaries += 1;
        let Some(table) = state.tables.get(&family) else {
            return Ok(None);
        };
        let mut summary = Summary::default();
        for (name, chain) in &table.chains {
            summary.chains.insert(
                name.clone(),
                ChainSummary {
                    base: chain.base.is_some(),
                    rules: chain.rules.len(),
                    digest: chain
                        .rules
                        .first()
                        .and_then(|r| rule_digest(r))
                        .map(|d| format!("{DIGEST_PREFIX}{d}")),
                },
            );
        }
        for (name, set) in &table.sets {
            summary.sets.insert(
                name.clone(),
                SetSummary {
                    digest: Some(format!("{DIGEST_PREFIX}{}", set.decl.digest())),
                    elements: set.elements.len(),
                },
            );
        }
        Ok(Some(summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nftables::transaction::TxBuilder;
    use std::net::IpAddr;
    use switchyard_api::Protocol;

    #[test]
    fn references_are_found_in_rules() {
        let (chains, sets) = references(
            "ip saddr @affinity-X goto endpoint-A comment \"x\"; numgen random mod 2 vmap { 0 : goto endpoint-B, 1 : goto endpoint-C }",
        );
        assert_eq!(chains, ["endpoint-A", "endpoint-B", "endpoint-C"]);
        assert_eq!(sets, ["affinity-X"]);
        assert_eq!(
            rule_digest("jump services comment \"switchyard:abc\""),
            Some("abc".into())
        );
        assert_eq!(rule_digest("jump services"), None);
    }

    #[test]
    fn transactions_are_atomic_and_follow_nfts_reference_rules() {
        let mut nft = FakeNft::new();
        let ip: IpAddr = "10.96.0.1".parse().unwrap();
        let key = Key::Frontend(ip, Protocol::TCP, 80);
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.create_table();
        tx.set_added("service-ips", &SetId::ServiceIps.decl(IpFamily::IPv4));
        tx.chain_added("service-A", &ChainDef::regular(vec!["accept".into()]));
        tx.element_added("service-ips", key, Value::Goto("service-A".into()));
        nft.apply(&tx.finish()).unwrap();

        // Deleting a chain a map element still names: EBUSY, and nothing changes.
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.chain_added("service-B", &ChainDef::regular(vec![]));
        tx.chain_removed("service-A");
        let err = nft.apply(&tx.finish()).unwrap_err().to_string();
        assert!(err.contains("busy"), "{err}");
        assert_eq!(nft.chain_names(IpFamily::IPv4), ["service-A"]);

        // Overwriting a map element: EEXIST.
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.chain_added("service-B", &ChainDef::regular(vec![]));
        tx.element_added("service-ips", key, Value::Goto("service-B".into()));
        assert!(
            nft.apply(&tx.finish())
                .unwrap_err()
                .to_string()
                .contains("exists")
        );

        // Delete, then add: fine.
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.chain_added("service-B", &ChainDef::regular(vec![]));
        tx.element_removed("service-ips", key);
        tx.element_added("service-ips", key, Value::Goto("service-B".into()));
        tx.chain_removed("service-A");
        nft.apply(&tx.finish()).unwrap();
        assert_eq!(nft.chain_names(IpFamily::IPv4), ["service-B"]);

        nft.fail_next_apply("injected");
        assert!(nft.apply(&TxBuilder::new(IpFamily::IPv4).finish()).is_err());
        let summary = nft.summary(IpFamily::IPv4).unwrap().unwrap();
        assert_eq!(summary.sets["service-ips"].elements, 1);
        assert!(nft.read(IpFamily::IPv6).unwrap().is_none());
    }
}
