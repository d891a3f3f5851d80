//! How many connections a leaving node still carries: pure counting over a plan and a conntrack listing.
//!
//! ```text
//! spec, skip ─► entrances() ─► Entrances { (external IP | LB IP, port, protocol) → Service,
//!                                          (NodePort, protocol) → Service }
//! [Flow] per protocol and family (conntrack -L, open entries: Conntrack::list_open)
//!   ─► count() ─► DrainCount { total, busiest Services }
//! ```
//!
//! "Through the node" means what a load balancer or an outside client sent to this node: flows to a
//! NodePort (on any address), an external IP or a load-balancer IP of one of its Services. Those are
//! the connections a load balancer stops adding once `/healthz` says the node is leaving, and the ones
//! that break if the node goes before they end. Connections the node's own pods make to ClusterIPs are
//! not counted: they end with the pods, which the drain evicts anyway. Nor are the entries of
//! connections that have ended (TIME_WAIT, CLOSE): they linger for minutes and carry nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

use super::Flow;

/// The most Services a count names (the rest are in the total).
pub const BUSIEST: usize = 5;

/// Where outside traffic enters the node's Services, and whose it is (`namespace/name`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entrances {
    by_address: HashMap<(IpAddr, u16, Protocol), String>,
    by_node_port: HashMap<(u16, Protocol), String>,
    families: BTreeSet<IpFamily>,
}

impl Entrances {
    /// No external entrance at all.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }

    /// The families of the entries they belong to (what to list).
    pub fn families(&self) -> impl Iterator<Item = IpFamily> + '_ {
        self.families.iter().copied()
    }

    /// The protocols they use (what to list).
    pub fn protocols(&self) -> Vec<Protocol> {
        let mut protocols: Vec<Protocol> = self
            .by_address
            .keys()
            .map(|(_, _, p)| *p)
            .chain(self.by_node_port.keys().map(|(_, p)| *p))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        protocols.sort();
        protocols
    }

    fn service_of(&self, protocol: Protocol, flow: &Flow) -> Option<&str> {
        let dst = (flow.original.dst, flow.original.dport, protocol);
        self.by_address
            .get(&dst)
            .or_else(|| self.by_node_port.get(&(flow.original.dport, protocol)))
            .map(String::as_str)
    }
}

/// The Service an entry belongs to: its ServicePortName without the port.
fn service_name(entry_name: &str) -> &str {
    entry_name
        .split_once(':')
        .map_or(entry_name, |(service, _)| service)
}

/// The external entrances of every applied entry of `spec` (entries in `skip` are not programmed).
pub fn entrances(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) -> Entrances {
    let mut entrances = Entrances::default();
    for (_, entry) in spec
        .services
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
    {
        let service = service_name(&entry.name).to_string();
        if entry.node_port.is_some() || !entry.external_ips.is_empty() || !entry.load_balancer_ips.is_empty()
        {
            entrances.families.insert(entry.family);
        }
        for ip in entry.external_ips.iter().chain(&entry.load_balancer_ips) {
            // NB: a plan's addresses passed validation; one that does not parse has no rule either.
            if let Ok(ip) = ip.parse::<IpAddr>() {
                entrances
                    .by_address
                    .insert((ip, entry.port, entry.protocol), service.clone());
            }
        }
        if let Some(node_port) = entry.node_port {
            entrances
                .by_node_port
                .insert((node_port, entry.protocol), service.clone());
        }
    }
    entrances
}

/// Connections counted at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainCount {
    /// Every flow to an entrance.
    pub total: u64,
    /// The busiest Services (`namespace/name`, flows), most first, at most [`BUSIEST`].
    pub busiest: Vec<(String, u64)>,
}

/// Counts the flows of `listings` (each the listing of one protocol, any family) that entered through
/// `entrances`.
pub fn count<'a>(
    entrances: &Entrances,
    listings: impl IntoIterator<Item = (Protocol, &'a [Flow])>,
) -> DrainCount {
    let mut by_service: BTreeMap<&str, u64> = BTreeMap::new();
    let mut total = 0;
    for (protocol, flows) in listings {
        for flow in flows {
            if let Some(service) = entrances.service_of(protocol, flow) {
                *by_service.entry(service).or_default() += 1;
                total += 1;
            }
        }
    }
    let mut busiest: Vec<(String, u64)> = by_service
        .into_iter()
        .map(|(service, flows)| (service.to_string(), flows))
        .collect();
    // Most flows first; names break ties, so the status does not flap between equals.
    busiest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    busiest.truncate(BUSIEST);
    DrainCount { total, busiest }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::Tuple;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn flow(src: &str, dst: &str, dport: u16, answered_by: &str) -> Flow {
        let ip = |s: &str| s.parse().unwrap();
        Flow {
            original: Tuple {
                src: ip(src),
                dst: ip(dst),
                sport: 40000,
                dport,
            },
            reply: Tuple {
                src: ip(answered_by),
                dst: ip(src),
                sport: 8080,
                dport: 40000,
            },
        }
    }

    #[test]
    fn only_flows_that_entered_from_outside_are_counted() {
        let lb = entry("shop/web:http", "10.96.0.10", 80)
            .node_port(30080)
            .lb_ip("203.0.113.10")
            .with(ep("10.244.2.5", 8080));
        let ext = entry("shop/api:http", "10.96.0.11", 80)
            .external_ip("198.51.100.7")
            .with(ep("10.244.2.6", 8080));
        let dns = entry("kube-system/dns:dns", "10.96.0.53", 53)
            .protocol(Protocol::UDP)
            .node_port(30053)
            .with(ep("10.244.2.7", 53));
        let internal = entry("shop/db:pg", "10.96.0.12", 5432).with(ep("10.244.2.8", 5432));
        let spec = plan("node-a", vec![lb, ext, dns, internal]);
        let entrances = entrances(&spec, &HashSet::new());
        assert_eq!(entrances.protocols(), vec![Protocol::TCP, Protocol::UDP]);
        assert_eq!(entrances.families().collect::<Vec<_>>(), vec![IpFamily::IPv4]);

        let tcp = vec![
            flow("198.51.100.1", "192.168.10.11", 30080, "10.244.2.5"), // NodePort on the node IP
            flow("198.51.100.2", "10.0.0.9", 30080, "10.244.2.5"),      // NodePort on another address
            flow("198.51.100.3", "203.0.113.10", 80, "10.244.2.5"),     // LB IP
            flow("198.51.100.4", "198.51.100.7", 80, "10.244.2.6"),     // external IP
            flow("198.51.100.5", "198.51.100.7", 80, "10.244.2.6"),
            flow("198.51.100.6", "198.51.100.7", 80, "10.244.2.6"),
            flow("10.244.1.5", "10.96.0.10", 80, "10.244.2.5"), // a pod to a ClusterIP: not counted
            flow("10.244.1.5", "10.96.0.12", 5432, "10.244.2.8"),
            flow("10.244.1.5", "203.0.113.10", 443, "203.0.113.10"), // LB IP, a port no Service has
        ];
        let udp = [
            flow("198.51.100.9", "192.168.10.11", 30053, "10.244.2.7"),
            flow("198.51.100.9", "192.168.10.11", 30080, "10.244.2.7"), // TCP's NodePort, over UDP
        ];
        let counted = count(&entrances, [(Protocol::TCP, &tcp[..]), (Protocol::UDP, &udp[..])]);
        assert_eq!(counted.total, 7);
        assert_eq!(
            counted.busiest,
            vec![
                ("shop/api".to_string(), 3),
                ("shop/web".to_string(), 3),
                ("kube-system/dns".to_string(), 1)
            ]
        );

        let skipped: HashSet<usize> = spec
            .services
            .iter()
            .enumerate()
            .filter(|(_, e)| e.name != "shop/db:pg")
            .map(|(i, _)| i)
            .collect();
        assert!(
            super::entrances(&spec, &skipped).is_empty(),
            "a skipped entry is not programmed"
        );
        assert_eq!(
            count(&entrances, [(Protocol::TCP, &[][..])]),
            DrainCount::default()
        );
    }

    #[test]
    fn at_most_the_busiest_services_are_named() {
        let entries = (0..8u16)
            .map(|i| entry(&format!("ns/s{i}:p"), &format!("10.96.0.{}", i + 1), 80).node_port(30000 + i))
            .collect();
        let spec = plan("node-a", entries);
        let flows: Vec<Flow> = (0..8u16)
            .flat_map(|i| {
                (0..=i).map(move |_| flow("198.51.100.1", "192.168.10.11", 30000 + i, "10.244.2.5"))
            })
            .collect();
        let counted = count(&entrances(&spec, &HashSet::new()), [(Protocol::TCP, &flows[..])]);
        assert_eq!(counted.total, 36);
        let names: Vec<&str> = counted.busiest.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["ns/s7", "ns/s6", "ns/s5", "ns/s4", "ns/s3"]);
    }
}
