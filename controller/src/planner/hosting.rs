//! Which endpoint IPs run on which node, and which entries list each IP: what `endpointsOnNode` is made
//! of, and what tells the planner where a node's derived `onNode` flags could be wrong.
//!
//! ```text
//! slot endpoints (ip, nodeName) ─► by_node: node → ip → refs   (a plan's endpointsOnNode)
//!                                 └► by_ip:   ip → (node → refs, entry keys)
//!                                       (nodes that may derive onNode for an ip; entries to re-check
//!                                        when an ip moves)
//! ```
//!
//! Reference counts, because one IP is listed by every port and Service it serves; a change is reported
//! only when an (ip, node) pair appears or disappears. Per-IP sets are sorted vectors: an IP almost always
//! sits on one node and serves a few entries, and a B-tree node per IP would cost ~350 bytes each (tens of
//! MiB at 50,000 endpoints).

use std::collections::{BTreeMap, HashMap};

use super::EntryKey;

/// The hosting indexes over every planned entry.
#[derive(Debug, Clone, Default)]
pub struct Hosting {
    by_node: HashMap<String, BTreeMap<String, u32>>,
    by_ip: HashMap<String, IpHosting>,
}

/// What is known of one endpoint IP: the nodes entries put it on (with reference counts) and the entries
/// listing it, both sorted.
#[derive(Debug, Clone, Default)]
struct IpHosting {
    nodes: Vec<(String, u32)>,
    entries: Vec<EntryKey>,
}

impl Hosting {
    /// Adds one entry's endpoints (ip, node; only known nodes count). Returns the (node, ip) pairs that
    /// appeared.
    pub fn add(&mut self, key: &EntryKey, hosts: &[(String, Option<String>)]) -> Vec<(String, String)> {
        let mut appeared = Vec::new();
        for (ip, node) in hosts {
            let hosting = match self.by_ip.get_mut(ip) {
                Some(hosting) => hosting,
                None => self.by_ip.entry(ip.clone()).or_default(),
            };
            if let Err(at) = hosting.entries.binary_search(key) {
                hosting.entries.insert(at, key.clone());
            }
            let Some(node) = node else { continue };
            match hosting.nodes.binary_search_by(|(n, _)| n.as_str().cmp(node)) {
                Ok(at) => hosting.nodes[at].1 += 1,
                Err(at) => hosting.nodes.insert(at, (node.clone(), 1)),
            }
            let ips = match self.by_node.get_mut(node) {
                Some(ips) => ips,
                None => self.by_node.entry(node.clone()).or_default(),
            };
            let refs = ips.entry(ip.clone()).or_default();
            *refs += 1;
            if *refs == 1 {
                appeared.push((node.clone(), ip.clone()));
            }
        }
        appeared
    }

    /// Removes one entry's endpoints, as added. Returns the (node, ip) pairs that disappeared.
    pub fn remove(&mut self, key: &EntryKey, hosts: &[(String, Option<String>)]) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        for (ip, node) in hosts {
            if let Some(hosting) = self.by_ip.get_mut(ip) {
                if let Ok(at) = hosting.entries.binary_search(key) {
                    hosting.entries.remove(at);
                }
                if let Some(node) = node
                    && let Ok(at) = hosting.nodes.binary_search_by(|(n, _)| n.as_str().cmp(node))
                {
                    hosting.nodes[at].1 -= 1;
                    if hosting.nodes[at].1 == 0 {
                        hosting.nodes.remove(at);
                    }
                }
                if hosting.entries.is_empty() && hosting.nodes.is_empty() {
                    self.by_ip.remove(ip);
                }
            }
            let Some(node) = node else { continue };
            if let Some(ips) = self.by_node.get_mut(node) {
                if decrement(ips, ip) {
                    gone.push((node.clone(), ip.clone()));
                }
                if ips.is_empty() {
                    self.by_node.remove(node);
                }
            }
        }
        gone
    }

    /// The endpoint IPs on `node`, sorted.
    pub fn ips_on(&self, node: &str) -> impl Iterator<Item = &str> {
        self.by_node
            .get(node)
            .into_iter()
            .flat_map(|ips| ips.keys().map(String::as_str))
    }

    /// True when some entry puts `ip` on `node`.
    pub fn is_on(&self, node: &str, ip: &str) -> bool {
        self.by_node.get(node).is_some_and(|ips| ips.contains_key(ip))
    }

    /// The nodes some entry puts `ip` on.
    pub fn nodes_of(&self, ip: &str) -> impl Iterator<Item = &str> {
        self.by_ip
            .get(ip)
            .into_iter()
            .flat_map(|h| h.nodes.iter().map(|(n, _)| n.as_str()))
    }

    /// The entries listing `ip`.
    pub fn entries_of(&self, ip: &str) -> impl Iterator<Item = &EntryKey> {
        self.by_ip.get(ip).into_iter().flat_map(|h| h.entries.iter())
    }
}

/// Decrements `map[key]`, removing it at zero; true when it was removed.
fn decrement(map: &mut BTreeMap<String, u32>, key: &str) -> bool {
    match map.get_mut(key) {
        Some(refs) if *refs > 1 => {
            *refs -= 1;
            false
        }
        Some(_) => {
            map.remove(key);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::{IpFamily, Protocol};

    fn key(name: &str) -> EntryKey {
        (name.to_string(), Protocol::TCP, IpFamily::IPv4)
    }

    fn hosts(pairs: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        pairs
            .iter()
            .map(|(ip, node)| (ip.to_string(), node.map(str::to_string)))
            .collect()
    }

    #[test]
    fn pairs_appear_and_disappear_once_across_entries() {
        let mut h = Hosting::default();
        let a = hosts(&[("10.0.0.1", Some("n1")), ("10.0.0.2", None)]);
        let b = hosts(&[("10.0.0.1", Some("n1")), ("10.0.0.1", Some("n2"))]);
        assert_eq!(h.add(&key("a"), &a), vec![("n1".into(), "10.0.0.1".into())]);
        assert_eq!(h.add(&key("b"), &b), vec![("n2".into(), "10.0.0.1".into())]);
        assert_eq!(h.nodes_of("10.0.0.1").collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(h.entries_of("10.0.0.1").count(), 2);
        assert!(h.remove(&key("a"), &a).is_empty(), "b still puts 10.0.0.1 on n1");
        assert!(h.is_on("n1", "10.0.0.1"));
        let gone = h.remove(&key("b"), &b);
        assert_eq!(gone.len(), 2);
        assert_eq!(h.ips_on("n1").count(), 0);
        assert_eq!(h.entries_of("10.0.0.1").count(), 0);
        assert_eq!(h.entries_of("10.0.0.2").count(), 0);
    }
}
