//! How entries' contributions add up to a table: claimed elements, owned chains and sets.
//!
//! ```text
//! full render:   claim_all(contribution) per entry in plan order ─► first claim of a map key wins,
//!                                                                    set keys are counted
//! partial sync:  release(old contribution) per changed entry ─┐  (a contested map key, or a new key
//!                claim(new contribution) per changed entry ───┴─► someone else holds: Conflict; the
//!                         │                                        caller falls back to a full sync)
//!                         └► Touched: the value of every element, chain and set before the first change
//! ```
//!
//! A set key several entries produce (a ClusterIP shared by a service's ports, a pod port behind two
//! services) is counted and stays while any entry holds it. A map key is first-claim-wins like iptables'
//! first matching rule; which later claim takes over when the winner goes is only known to a full
//! render, so touching a contested map key is a [`Conflict`].

use std::collections::HashMap;

use super::model::{ChainDef, Claim, Key, SetDecl, SetId, SetState, TableState, Value};

/// What one entry adds to the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    /// Elements of the sets with a fixed role, each key at most once.
    pub elements: Vec<(SetId, Key, Value)>,
    /// The entry's own chains.
    pub chains: Vec<(String, ChainDef)>,
    /// The entry's own (affinity) sets.
    pub sets: Vec<(String, SetDecl)>,
}

impl Contribution {
    /// Adds an element; a key the entry already added keeps its first value.
    pub(super) fn push(&mut self, id: SetId, key: Key, value: Value) {
        // Keys repeat within an entry only when the plan repeats an address (an externalIP listed
        // twice, or also a LoadBalancer IP): the first use wins, as the first iptables rule would.
        if !self.elements.iter().any(|(i, k, _)| *i == id && *k == key) {
            self.elements.push((id, key, value));
        }
    }
}

/// Adds a contribution during a full render: new keys are claimed, existing ones counted (a map keeps
/// its first value).
pub fn claim_all(state: &mut TableState, contribution: Contribution) {
    for (id, key, value) in contribution.elements {
        state
            .elements
            .entry(id)
            .or_default()
            .entry(key)
            .and_modify(|claim| claim.count += 1)
            .or_insert(Claim { value, count: 1 });
    }
    for (name, chain) in contribution.chains {
        state.chains.entry(name).or_insert(chain);
    }
    for (name, decl) in contribution.sets {
        state.sets.entry(name).or_insert_with(|| SetState::declared(decl));
    }
}

/// Why a partial sync cannot be done incrementally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict(pub String);

/// What a partial sync changed, each thing recorded as it was before its first change.
#[derive(Debug, Default)]
pub struct Touched {
    /// Elements: the value before (`None`: absent).
    pub elements: HashMap<(SetId, Key), Option<Value>>,
    /// Chains: the definition before.
    pub chains: HashMap<String, Option<ChainDef>>,
    /// Entries' sets: the declaration before.
    pub sets: HashMap<String, Option<SetDecl>>,
}

fn is_map(id: SetId) -> bool {
    matches!(
        id,
        SetId::ServiceIps
            | SetId::ServiceNodeports
            | SetId::NoEndpointServices
            | SetId::NoEndpointNodeports
            | SetId::FirewallIps
            | SetId::FastEps(_)
            | SetId::FastNpEps(_)
    )
}

/// Removes an entry's previous contribution.
pub fn release(
    state: &mut TableState,
    contribution: &Contribution,
    touched: &mut Touched,
) -> Result<(), Conflict> {
    for (id, key, _) in &contribution.elements {
        let Some(elements) = state.elements.get_mut(id) else {
            continue;
        };
        let Some(claim) = elements.get_mut(key) else {
            continue;
        };
        if claim.count > 1 {
            if is_map(*id) {
                return Err(Conflict(format!(
                    "{} {key} is claimed by several entries",
                    id.name()
                )));
            }
            claim.count -= 1;
            continue;
        }
        touched
            .elements
            .entry((*id, *key))
            .or_insert_with(|| Some(claim.value.clone()));
        elements.remove(key);
    }
    for (name, _) in &contribution.chains {
        if let Some(before) = state.chains.remove(name) {
            touched.chains.entry(name.clone()).or_insert(Some(before));
        }
    }
    for (name, _) in &contribution.sets {
        if let Some(before) = state.sets.remove(name) {
            touched.sets.entry(name.clone()).or_insert(before.decl);
        }
    }
    Ok(())
}

/// Adds an entry's new contribution.
pub fn claim(
    state: &mut TableState,
    contribution: Contribution,
    touched: &mut Touched,
) -> Result<(), Conflict> {
    for (id, key, value) in contribution.elements {
        let elements = state.elements.entry(id).or_default();
        if let Some(claim) = elements.get_mut(&key) {
            if is_map(id) {
                return Err(Conflict(format!("{} {key} is already claimed", id.name())));
            }
            claim.count += 1;
            continue;
        }
        touched.elements.entry((id, key)).or_insert(None);
        elements.insert(key, Claim { value, count: 1 });
    }
    for (name, chain) in contribution.chains {
        if state.chains.contains_key(&name) {
            return Err(Conflict(format!("chain {name} is already in the table")));
        }
        touched.chains.entry(name.clone()).or_insert(None);
        state.chains.insert(name, chain);
    }
    for (name, decl) in contribution.sets {
        if state.sets.contains_key(&name) {
            return Err(Conflict(format!("set {name} is already in the table")));
        }
        touched.sets.entry(name.clone()).or_insert(None);
        state.sets.insert(name, SetState::declared(decl));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use switchyard_api::{IpFamily, Protocol};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn contribution(elements: Vec<(SetId, Key, Value)>) -> Contribution {
        Contribution {
            elements,
            chains: vec![],
            sets: vec![],
        }
    }

    #[test]
    fn shared_set_keys_are_counted_and_map_keys_conflict() {
        let cip = Key::Addr(ip("10.96.0.1"));
        let frontend = Key::Frontend(ip("10.96.0.1"), Protocol::TCP, 80);
        let a = contribution(vec![
            (SetId::ClusterIps, cip, Value::None),
            (SetId::ServiceIps, frontend, Value::Drop),
        ]);
        let b = contribution(vec![(SetId::ClusterIps, cip, Value::None)]);
        let mut state = TableState::new(IpFamily::IPv4);
        claim_all(&mut state, a.clone());
        claim_all(&mut state, b.clone());
        assert_eq!(state.elements[&SetId::ClusterIps][&cip].count, 2);

        let mut touched = Touched::default();
        release(&mut state, &b, &mut touched).unwrap();
        assert_eq!(state.elements[&SetId::ClusterIps][&cip].count, 1);
        assert!(touched.elements.is_empty(), "a still-held key is not a change");
        release(&mut state, &a, &mut touched).unwrap();
        assert!(state.elements[&SetId::ClusterIps].is_empty());
        assert_eq!(
            touched.elements[&(SetId::ServiceIps, frontend)],
            Some(Value::Drop)
        );

        claim(&mut state, a.clone(), &mut touched).unwrap();
        let again = claim(&mut state, a, &mut touched);
        assert!(again.is_err(), "a map key held by another entry");
    }

    #[test]
    fn a_contested_map_key_cannot_be_released_incrementally() {
        let frontend = Key::Frontend(ip("203.0.113.1"), Protocol::TCP, 80);
        let a = contribution(vec![(SetId::ServiceIps, frontend, Value::Drop)]);
        let mut state = TableState::new(IpFamily::IPv4);
        claim_all(&mut state, a.clone());
        claim_all(&mut state, a.clone());
        assert!(release(&mut state, &a, &mut Touched::default()).is_err());
    }
}
