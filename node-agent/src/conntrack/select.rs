//! Which UDP flows are stale: pure selection over a plan and a conntrack listing.
//!
//! ```text
//! spec, skip, family ─► udp_targets() ─► Targets ─┐
//! [Flow] (conntrack -L) ──────────────────────────┴─► stale_flows() ─► [Flow] to delete
//! spec, skip ─► udp_fingerprints() ─► compared with the last sync's: did any UDP entry's endpoints change?
//! ```

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use switchyard_api::{EntryKey, IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

use super::Flow;

/// The UDP frontends of a plan with the endpoint IPs that may answer them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// (ClusterIP | LoadBalancer IP | externalIP, port) → endpoint IPs.
    pub by_address: HashMap<(IpAddr, u16), HashSet<IpAddr>>,
    /// NodePort → endpoint IPs (any destination address).
    pub by_node_port: HashMap<u16, HashSet<IpAddr>>,
}

impl Targets {
    /// No UDP entry with endpoints.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }
}

fn udp_entries<'a>(
    spec: &'a NodeForwardingPlanSpec,
    skip: &'a HashSet<usize>,
) -> impl Iterator<Item = &'a ServicePlan> + 'a {
    spec.services
        .iter()
        .enumerate()
        .filter(|(index, entry)| entry.protocol == Protocol::UDP && !skip.contains(index))
        .map(|(_, entry)| &**entry)
}

/// The targets of the UDP entries of `family` that list at least one endpoint.
pub fn udp_targets(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, family: IpFamily) -> Targets {
    let mut targets = Targets::default();
    for entry in udp_entries(spec, skip).filter(|e| e.family == family) {
        let endpoints: HashSet<IpAddr> = entry
            .endpoints
            .iter()
            .filter_map(|ep| ep.ip.parse().ok())
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        let frontends = std::iter::once(&entry.cluster_ip)
            .chain(&entry.load_balancer_ips)
            .chain(&entry.external_ips)
            .filter_map(|ip| ip.parse::<IpAddr>().ok());
        for ip in frontends {
            targets
                .by_address
                .entry((ip, entry.port))
                .or_default()
                .extend(&endpoints);
        }
        if let Some(node_port) = entry.node_port {
            targets
                .by_node_port
                .entry(node_port)
                .or_default()
                .extend(&endpoints);
        }
    }
    targets
}

/// Flows to a UDP frontend whose reply does not come from one of its endpoints, sorted, each once.
pub fn stale_flows(targets: &Targets, flows: &[Flow]) -> Vec<Flow> {
    let stale: BTreeSet<Flow> = flows
        .iter()
        .filter(|flow| {
            let reply_source = flow.reply.src;
            let by_address = targets
                .by_address
                .get(&(flow.original.dst, flow.original.dport))
                .is_some_and(|eps| !eps.contains(&reply_source));
            let by_node_port = targets
                .by_node_port
                .get(&flow.original.dport)
                .is_some_and(|eps| !eps.contains(&reply_source));
            by_address || by_node_port
        })
        .copied()
        .collect();
    stale.into_iter().collect()
}

/// One fingerprint per UDP entry (its endpoints and frontends): when these differ from the last
/// sync's, a cleanup is due.
pub fn udp_fingerprints(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) -> BTreeMap<EntryKey, u64> {
    udp_entries(spec, skip)
        .map(|entry| {
            let mut hasher = DefaultHasher::new();
            entry.endpoints.hash(&mut hasher);
            entry.cluster_ip.hash(&mut hasher);
            entry.port.hash(&mut hasher);
            entry.node_port.hash(&mut hasher);
            entry.external_ips.hash(&mut hasher);
            entry.load_balancer_ips.hash(&mut hasher);
            (entry.entry_key(), hasher.finish())
        })
        .collect()
}

/// The families of UDP entries that have endpoints (where a cleanup may find something).
pub fn udp_families(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) -> BTreeSet<IpFamily> {
    udp_entries(spec, skip)
        .filter(|e| !e.endpoints.is_empty())
        .map(|e| e.family)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::Tuple;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn flow(dst: &str, dport: u16, reply_src: &str) -> Flow {
        Flow {
            original: Tuple {
                src: ip("10.244.1.9"),
                dst: ip(dst),
                sport: 40000,
                dport,
            },
            reply: Tuple {
                src: ip(reply_src),
                dst: ip("10.244.1.9"),
                sport: dport,
                dport: 40000,
            },
        }
    }

    fn spec() -> NodeForwardingPlanSpec {
        plan(
            "node-a",
            vec![
                entry("ns/dns:dns", "10.96.0.10", 53)
                    .protocol(Protocol::UDP)
                    .node_port(30053)
                    .external_ip("203.0.113.10")
                    .lb_ip("203.0.113.11")
                    .with(ep("10.244.2.53", 53))
                    .with(ep("10.244.3.53", 53)),
                // No endpoints: skipped (its traffic is rejected).
                entry("ns/empty:u", "10.96.0.20", 5000).protocol(Protocol::UDP),
                // TCP: never cleaned.
                entry("ns/web:p", "10.96.0.30", 80).with(ep("10.244.2.80", 80)),
            ],
        )
    }

    #[test]
    fn flows_not_answered_by_a_current_endpoint_are_stale() {
        let spec = spec();
        let targets = udp_targets(&spec, &HashSet::new(), IpFamily::IPv4);
        let cases = [
            (
                "ClusterIP, current endpoint",
                flow("10.96.0.10", 53, "10.244.2.53"),
                false,
            ),
            (
                "ClusterIP, gone endpoint",
                flow("10.96.0.10", 53, "10.244.9.9"),
                true,
            ),
            (
                "ClusterIP, other port",
                flow("10.96.0.10", 54, "10.244.9.9"),
                false,
            ),
            (
                "externalIP, gone endpoint",
                flow("203.0.113.10", 53, "10.244.9.9"),
                true,
            ),
            (
                "LB IP, gone endpoint",
                flow("203.0.113.11", 53, "10.244.9.9"),
                true,
            ),
            (
                "LB IP, current endpoint",
                flow("203.0.113.11", 53, "10.244.3.53"),
                false,
            ),
            (
                "NodePort on any address, gone endpoint",
                flow("192.168.10.11", 30053, "10.244.9.9"),
                true,
            ),
            (
                "NodePort, current endpoint",
                flow("192.168.7.7", 30053, "10.244.3.53"),
                false,
            ),
            (
                "service without endpoints",
                flow("10.96.0.20", 5000, "10.96.0.20"),
                false,
            ),
            ("TCP service address", flow("10.96.0.30", 80, "10.244.9.9"), false),
            ("unrelated", flow("8.8.8.8", 53, "8.8.8.8"), false),
        ];
        let flows: Vec<Flow> = cases.iter().map(|(_, f, _)| *f).collect();
        let stale = stale_flows(&targets, &flows);
        for (name, f, want) in cases {
            assert_eq!(stale.contains(&f), want, "{name}");
        }
        let doubled = [flows.clone(), flows].concat();
        assert_eq!(
            stale_flows(&targets, &doubled).len(),
            stale.len(),
            "each flow once"
        );
    }

    #[test]
    fn skipped_entries_and_other_families_have_no_targets() {
        let spec = spec();
        assert!(udp_targets(&spec, &HashSet::from([0]), IpFamily::IPv4).is_empty());
        assert!(udp_targets(&spec, &HashSet::new(), IpFamily::IPv6).is_empty());
        assert_eq!(
            udp_families(&spec, &HashSet::new()),
            BTreeSet::from([IpFamily::IPv4])
        );
    }

    #[test]
    fn fingerprints_change_only_with_udp_endpoints() {
        let before = spec();
        let mut tcp_changed = before.clone();
        std::sync::Arc::make_mut(&mut tcp_changed.services[2]).endpoints[0].ip = "10.244.2.81".into();
        let none = HashSet::new();
        assert_eq!(
            udp_fingerprints(&before, &none),
            udp_fingerprints(&tcp_changed, &none)
        );
        let mut udp_changed = before.clone();
        std::sync::Arc::make_mut(&mut udp_changed.services[0])
            .endpoints
            .pop();
        assert_ne!(
            udp_fingerprints(&before, &none),
            udp_fingerprints(&udp_changed, &none)
        );
    }
}
