//! The nftables backend's verdicts, read from its render: the hooks in priority order, the maps looked
//! up as the kernel looks them up, and the entries' own chains followed rule by rule for a client that
//! is not the node itself (a pod, or off-cluster). It understands exactly the rules the render writes;
//! any other rule is an unknown verdict, never a guess.
//!
//! ```text
//! filter prerouting (-110): firewall-ips[frontend] ─► firewall chain: source outside the ranges ─► Drop
//! nat prerouting (-100):    service-ips[frontend] ─► policy chains ─► dnat … ─► Forward
//!                           fast-N[frontend] ─► fast-N-eps slots ─► Forward (uniform)
//!                           NodePort address: service-nodeports / fast-np-N [proto . port]
//! filter input/forward (0): no-endpoint-nodeports / no-endpoint-services ─► Reject (reject-chain) | Drop
//! else ─► Pass
//! ```

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::super::frontends::Frontend;
use super::super::verdict::Verdict;
use crate::counters::Frontend as Kind;
use crate::nftables::model::{ChainBody, Key, SetId, TableState, Value};
use crate::nftables::names;

/// Deepest chain nesting followed (the render nests three: external ─► service ─► endpoint).
const MAX_DEPTH: usize = 8;

/// What a chain did with the packet: decided, or returned to its caller.
type Step = Option<Verdict>;

struct Walk<'a> {
    state: &'a TableState,
    source: IpAddr,
}

impl Walk<'_> {
    fn element(&self, id: SetId, key: &Key) -> Option<&Value> {
        self.state
            .elements
            .get(&id)
            .and_then(|elements| elements.get(key))
            .map(|claim| &claim.value)
    }

    fn value(&self, value: &Value, depth: usize) -> Step {
        match value {
            Value::Goto(chain) => self.chain(chain, depth),
            Value::Drop => Some(Verdict::Drop),
            Value::None | Value::Endpoint(..) => Some(Verdict::Unknown(format!("map value {value}"))),
        }
    }

    fn chain(&self, name: &str, depth: usize) -> Step {
        if depth > MAX_DEPTH {
            return Some(Verdict::Unknown(format!(
                "chains nested deeper than {MAX_DEPTH} at {name}"
            )));
        }
        let Some(chain) = self.state.chains.get(name) else {
            return Some(Verdict::Unknown(format!("no chain {name}")));
        };
        let ChainBody::Rules(rules) = &chain.body else {
            return Some(Verdict::Unknown(format!("chain {name} has no rules to read")));
        };
        for rule in rules {
            if let Some(step) = self.rule(rule, depth) {
                return step;
            }
        }
        None
    }

    /// `None`: the rule did not decide, go on; `Some(step)`: the chain ends here with `step`.
    fn rule(&self, rule: &str, depth: usize) -> Option<Step> {
        let words: Vec<&str> = rule.split_whitespace().collect();
        match words.as_slice() {
            ["jump", chain] if *chain == names::MARK_FOR_MASQUERADE => None,
            ["update", ..] => None,
            // The client is never the node itself here, and an affinity set is empty on a first packet.
            ["fib", "saddr", "type", "local", ..] => None,
            [_, "saddr", set, "goto", _] if set.starts_with('@') => None,
            [_, "saddr", cidr, "goto", chain] => match cidr.parse::<IpNet>() {
                Ok(net) if net.contains(&self.source) => Some(self.chain(chain, depth + 1)),
                Ok(_) => None,
                Err(_) => Some(Some(Verdict::Unknown(rule.to_string()))),
            },
            [_, "saddr", "!=", "{", .., "}", "counter", "drop"] => {
                let list = &words[3..words.len() - 2];
                let mut allowed = Vec::new();
                for item in list.iter().map(|w| w.trim_matches(['{', '}', ','])) {
                    if item.is_empty() {
                        continue;
                    }
                    let net = item
                        .parse::<IpNet>()
                        .or_else(|_| item.parse::<IpAddr>().map(IpNet::from));
                    match net {
                        Ok(net) => allowed.push(net),
                        Err(_) => return Some(Some(Verdict::Unknown(rule.to_string()))),
                    }
                }
                (!allowed.iter().any(|net| net.contains(&self.source))).then_some(Some(Verdict::Drop))
            }
            ["goto", chain] => Some(self.chain(chain, depth + 1)),
            ["drop"] => Some(Some(Verdict::Drop)),
            ["reject"] => Some(Some(Verdict::Reject)),
            ["meta", "l4proto", _, "dnat", _, "to", target] => Some(Some(
                endpoint(target)
                    .map_or_else(|| Verdict::Unknown(rule.to_string()), |e| Verdict::uniform([e])),
            )),
            [
                "meta",
                "l4proto",
                _,
                "dnat",
                _,
                "to",
                "numgen",
                "random",
                "mod",
                _,
                "map",
                ..,
            ] => Some(Some(
                dnat_map(rule).unwrap_or_else(|| Verdict::Unknown(rule.to_string())),
            )),
            ["numgen", "random", "mod", _, "vmap", ..] => Some(Some(self.arms(rule, depth))),
            _ => Some(Some(Verdict::Unknown(rule.to_string()))),
        }
    }

    /// `numgen random mod N vmap { 0 : goto A, 1 : goto B }`: each arm is taken alike.
    fn arms(&self, rule: &str, depth: usize) -> Verdict {
        let Some(body) = braces(rule) else {
            return Verdict::Unknown(rule.to_string());
        };
        let mut weights = Vec::new();
        for arm in body.split(',') {
            let Some(chain) = arm.split_once(": goto ").map(|(_, c)| c.trim()) else {
                return Verdict::Unknown(rule.to_string());
            };
            match self.chain(chain, depth + 1) {
                Some(Verdict::Forward(shares)) => weights.extend(shares),
                Some(other) => return other,
                None => return Verdict::Unknown(format!("{chain} returns")),
            }
        }
        Verdict::weighted(weights)
    }
}

/// `10.0.0.1:80` or `[fd00::1]:80`.
fn endpoint(text: &str) -> Option<SocketAddr> {
    text.parse().ok()
}

/// The text between the first `{` and the last `}`.
fn braces(rule: &str) -> Option<&str> {
    let start = rule.find('{')?;
    let end = rule.rfind('}')?;
    rule.get(start + 1..end)
}

/// `… dnat ip to numgen random mod N map { 0 : 10.0.0.1 . 80, 1 : 10.0.0.2 . 80 }`.
fn dnat_map(rule: &str) -> Option<Verdict> {
    let mut endpoints = Vec::new();
    for arm in braces(rule)?.split(',') {
        let (_, target) = arm.split_once(':')?;
        let (ip, port) = target.split_once(" . ")?;
        endpoints.push(SocketAddr::new(
            ip.trim().parse().ok()?,
            port.trim().parse().ok()?,
        ));
    }
    Some(Verdict::uniform(endpoints))
}

/// The endpoints of a plain frontend's class: slots 0..N of its endpoint map.
fn class_endpoints(state: &TableState, eps: SetId, n: u32, slot_key: impl Fn(u32) -> Key) -> Verdict {
    let mut endpoints = Vec::new();
    for slot in 0..n {
        match state
            .elements
            .get(&eps)
            .and_then(|e| e.get(&slot_key(slot)))
            .map(|c| &c.value)
        {
            Some(Value::Endpoint(ip, port)) => endpoints.push(SocketAddr::new(*ip, *port)),
            _ => return Verdict::Unknown(format!("{} lacks slot {slot}", eps.name())),
        }
    }
    Verdict::uniform(endpoints)
}

/// The class set of `key` (`fast-N`, `fast-np-N`) among `state`'s, with its N.
fn class_of(state: &TableState, key: &Key, node_port: bool) -> Option<(SetId, u32)> {
    state.elements.iter().find_map(|(id, elements)| {
        let n = match (id, node_port) {
            (SetId::Fast(n), false) | (SetId::FastNp(n), true) => *n,
            _ => return None,
        };
        elements.contains_key(key).then_some((*id, n))
    })
}

/// The verdict of `frontend` under `state`, the nftables render of its family; `node_port_ips` are the
/// addresses that serve NodePorts.
pub fn verdict(state: &TableState, node_port_ips: &[IpAddr], frontend: &Frontend) -> Verdict {
    let walk = Walk {
        state,
        source: frontend.source,
    };
    let (ip, port, protocol) = (frontend.addr.ip(), frontend.addr.port(), frontend.protocol);
    let key = Key::Frontend(ip, protocol, port);
    let port_key = Key::Port(protocol, port);
    let node_port = node_port_ips.contains(&ip) && !ip.is_loopback();
    // filter prerouting, before DNAT.
    if let Some(value) = walk.element(SetId::FirewallIps, &key)
        && let Some(step) = walk.value(value, 0)
    {
        return step;
    }
    // nat prerouting: `services`, then (last) `nodeports`.
    if let Some(value) = walk.element(SetId::ServiceIps, &key) {
        if let Some(step) = walk.value(value, 0) {
            return step;
        }
    } else if let Some((id, n)) = class_of(state, &key, false) {
        return match id.endpoints_map() {
            Some(eps) => class_endpoints(state, eps, n, |slot| Key::FrontendSlot(ip, protocol, port, slot)),
            None => Verdict::Unknown(id.name()),
        };
    } else if node_port {
        if let Some(value) = walk.element(SetId::ServiceNodeports, &port_key) {
            if let Some(step) = walk.value(value, 0) {
                return step;
            }
        } else if let Some((id, n)) = class_of(state, &port_key, true) {
            return match id.endpoints_map() {
                Some(eps) => class_endpoints(state, eps, n, |slot| Key::PortSlot(protocol, port, slot)),
                None => Verdict::Unknown(id.name()),
            };
        }
    }
    // filter input / forward: not DNATed.
    let refused = if node_port && frontend.kind == Kind::NodePort {
        walk.element(SetId::NoEndpointNodeports, &port_key)
            .or_else(|| walk.element(SetId::NoEndpointServices, &key))
    } else {
        walk.element(SetId::NoEndpointServices, &key)
    };
    match refused {
        Some(value) => walk.value(value, 0).unwrap_or(Verdict::Pass),
        None => Verdict::Pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_and_chain_rules_read_as_the_render_writes_them() {
        let a: SocketAddr = "10.244.1.5:8080".parse().unwrap();
        let b: SocketAddr = "[fd00::5]:80".parse().unwrap();
        assert_eq!(endpoint("10.244.1.5:8080"), Some(a));
        assert_eq!(endpoint("[fd00::5]:80"), Some(b));
        assert_eq!(
            dnat_map(
                "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.1.6 . 8080 }"
            ),
            Some(Verdict::uniform([a, "10.244.1.6:8080".parse().unwrap()]))
        );
        assert_eq!(dnat_map("dnat to numgen random mod 1 map { 0 : x }"), None);
    }
}
