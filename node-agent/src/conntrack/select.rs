//! Which UDP flows are stale: pure selection over a plan and a conntrack listing (kube-proxy's
//! conntrack reconciler, v1.32+, with the fix of kubernetes#139629).
//!
//! ```text
//! spec, skip, family ─► udp_targets() ─► Targets ─┐
//! [Flow] (conntrack -L) ──────────────────────────┴─► stale_filters() ─► [EndpointFlows], one per
//!                                                     (frontend, port, endpoint address, endpoint port)
//! spec, skip ─► udp_fingerprints() ─► compared with the last sync's: did any UDP entry's endpoints change?
//! ```
//!
//! A UDP flow is stale when its original destination is one of an entry's frontends and its reply does
//! not come from one of that entry's serving endpoints, *address and port*: an endpoint that now serves
//! on another port (a changed targetPort) no longer answers on the old one, and a flow that keeps
//! sending keeps its old DNAT for as long as it sends. Serving endpoints are the plan's `endpoints`,
//! terminating ones included (they drain); `unreadyIPs` serve nothing. An entry with no serving endpoint
//! at all is not skipped (kubernetes#139628: a Service scaled to zero, or whose endpoints all turned
//! unready, kept its flows on the old pods for hours): every flow to its frontends is stale, and the
//! next packet meets its REJECT.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use switchyard_api::{EntryKey, IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

use super::{EndpointFlows, Flow};

/// An endpoint as a flow's reply names it: address and port.
pub type Serving = (IpAddr, u16);

/// The UDP frontends of a plan with the endpoints that may answer them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// (ClusterIP | LoadBalancer IP | externalIP, port) → serving endpoints (empty: none serves).
    pub by_address: HashMap<(IpAddr, u16), HashSet<Serving>>,
    /// NodePort → serving endpoints (any destination address).
    pub by_node_port: HashMap<u16, HashSet<Serving>>,
}

impl Targets {
    /// No UDP frontend.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }

    /// Whether `flow` goes to one of these frontends and is answered by none of its endpoints.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        let answered_by = (flow.reply.src, flow.reply.sport);
        let stale = |serving: &HashSet<Serving>| !serving.contains(&answered_by);
        self.by_address
            .get(&(flow.original.dst, flow.original.dport))
            .is_some_and(stale)
            || self.by_node_port.get(&flow.original.dport).is_some_and(stale)
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

/// The targets of the UDP entries of `family`, with or without endpoints.
pub fn udp_targets(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, family: IpFamily) -> Targets {
    let mut targets = Targets::default();
    for entry in udp_entries(spec, skip).filter(|e| e.family == family) {
        let serving: HashSet<Serving> = entry
            .endpoints
            .iter()
            .filter_map(|ep| Some((ep.ip.parse().ok()?, ep.port)))
            .collect();
        let frontends = std::iter::once(&entry.cluster_ip)
            .chain(&entry.load_balancer_ips)
            .chain(&entry.external_ips)
            .filter_map(|ip| ip.parse::<IpAddr>().ok());
        for ip in frontends {
            targets
                .by_address
                .entry((ip, entry.port))
                .or_default()
                .extend(&serving);
        }
        if let Some(node_port) = entry.node_port {
            targets
                .by_node_port
                .entry(node_port)
                .or_default()
                .extend(&serving);
        }
    }
    targets
}

/// The stale flows of `flows` (UDP, listed for `family`) as `conntrack -D` filters, sorted, each once:
/// one per (original destination and port, reply source and port), so one process deletes every client's
/// flow through that frontend to that endpoint. Staleness depends on nothing else, so a filter deletes
/// only stale flows, including one that arrived after the listing.
pub fn stale_filters(targets: &Targets, family: IpFamily, flows: &[Flow]) -> Vec<EndpointFlows> {
    let filters: BTreeSet<EndpointFlows> = flows
        .iter()
        .filter(|f| f.family() == family && targets.is_stale(f))
        .map(|f| EndpointFlows {
            protocol: Protocol::UDP,
            family,
            frontend: Some(f.original.dst),
            port: f.original.dport,
            endpoint: f.reply.src,
            endpoint_port: Some(f.reply.sport),
        })
        .collect();
    filters.into_iter().collect()
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

/// The families of the UDP entries (where a cleanup may find something).
pub fn udp_families(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) -> BTreeSet<IpFamily> {
    udp_entries(spec, skip).map(|e| e.family).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::Tuple;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn flow(dst: &str, dport: u16, reply_src: &str, reply_sport: u16) -> Flow {
        from("10.244.1.9", 40000, dst, dport, reply_src, reply_sport)
    }

    fn from(client: &str, sport: u16, dst: &str, dport: u16, reply_src: &str, reply_sport: u16) -> Flow {
        Flow {
            original: Tuple {
                src: ip(client),
                dst: ip(dst),
                sport,
                dport,
            },
            reply: Tuple {
                src: ip(reply_src),
                dst: ip(client),
                sport: reply_sport,
                dport: sport,
            },
        }
    }

    fn spec() -> NodeForwardingPlanSpec {
        let mut dns = entry("ns/dns:dns", "10.96.0.10", 53)
            .protocol(Protocol::UDP)
            .node_port(30053)
            .external_ip("203.0.113.10")
            .lb_ip("203.0.113.11")
            .with(ep("10.244.2.53", 53))
            .with(ep("10.244.3.53", 53));
        // Terminating while serving: it drains.
        dns.endpoints[1].terminating = true;
        dns.unready_ips = vec!["10.244.4.53".into()];
        // Every endpoint unready (kubernetes#139628), still listed.
        let mut unready = entry("ns/unready:u", "10.96.0.20", 5000)
            .protocol(Protocol::UDP)
            .node_port(30500);
        unready.unready_ips = vec!["10.244.5.5".into()];
        plan(
            "node-a",
            vec![
                dns,
                unready,
                // The same address now serves on 5354 (a changed targetPort).
                entry("ns/moved:u", "10.96.0.40", 53)
                    .protocol(Protocol::UDP)
                    .node_port(30054)
                    .with(ep("10.254.10.53", 5354)),
                // TCP: never cleaned.
                entry("ns/web:p", "10.96.0.30", 80).with(ep("10.244.2.80", 80)),
            ],
        )
    }

    #[test]
    fn a_flow_is_stale_unless_a_serving_endpoint_answers_it_on_its_address_and_port() {
        let targets = udp_targets(&spec(), &HashSet::new(), IpFamily::IPv4);
        let cases = [
            (
                "ClusterIP, serving endpoint",
                flow("10.96.0.10", 53, "10.244.2.53", 53),
                false,
            ),
            (
                "ClusterIP, terminating endpoint drains",
                flow("10.96.0.10", 53, "10.244.3.53", 53),
                false,
            ),
            (
                "ClusterIP, gone endpoint",
                flow("10.96.0.10", 53, "10.244.9.9", 53),
                true,
            ),
            (
                "ClusterIP, unready endpoint",
                flow("10.96.0.10", 53, "10.244.4.53", 53),
                true,
            ),
            (
                "ClusterIP, not DNATed",
                flow("10.96.0.10", 53, "10.96.0.10", 53),
                true,
            ),
            (
                "ClusterIP, other port",
                flow("10.96.0.10", 54, "10.244.9.9", 53),
                false,
            ),
            (
                "same address, old port",
                flow("10.96.0.40", 53, "10.254.10.53", 5353),
                true,
            ),
            (
                "same address, new port",
                flow("10.96.0.40", 53, "10.254.10.53", 5354),
                false,
            ),
            (
                "externalIP, gone endpoint",
                flow("203.0.113.10", 53, "10.244.9.9", 53),
                true,
            ),
            (
                "LB IP, gone endpoint",
                flow("203.0.113.11", 53, "10.244.9.9", 53),
                true,
            ),
            (
                "LB IP, serving endpoint",
                flow("203.0.113.11", 53, "10.244.3.53", 53),
                false,
            ),
            (
                "NodePort on any address, gone endpoint",
                flow("192.168.10.11", 30053, "10.244.9.9", 53),
                true,
            ),
            (
                "NodePort, serving endpoint",
                flow("192.168.7.7", 30053, "10.244.3.53", 53),
                false,
            ),
            (
                "NodePort, old port",
                flow("192.168.10.11", 30054, "10.254.10.53", 5353),
                true,
            ),
            (
                "NodePort, new port",
                flow("192.168.10.11", 30054, "10.254.10.53", 5354),
                false,
            ),
            (
                "every endpoint unready: ClusterIP",
                flow("10.96.0.20", 5000, "10.244.5.5", 5000),
                true,
            ),
            (
                "every endpoint unready: NodePort",
                flow("192.168.10.11", 30500, "10.244.5.5", 5000),
                true,
            ),
            (
                "TCP service address",
                flow("10.96.0.30", 80, "10.244.9.9", 80),
                false,
            ),
            ("unrelated", flow("8.8.8.8", 53, "8.8.8.8", 53), false),
        ];
        for (name, f, want) in cases {
            assert_eq!(targets.is_stale(&f), want, "{name}");
        }
    }

    #[test]
    fn stale_flows_become_one_filter_per_frontend_and_endpoint() {
        let targets = udp_targets(&spec(), &HashSet::new(), IpFamily::IPv4);
        let flows = [
            // Two clients of the same old endpoint port: one filter.
            from("10.244.1.9", 40000, "10.96.0.40", 53, "10.254.10.53", 5353),
            from("10.244.1.8", 41000, "10.96.0.40", 53, "10.254.10.53", 5353),
            // The NodePort on two node addresses: one filter each.
            from(
                "192.168.10.200",
                42000,
                "192.168.10.11",
                30054,
                "10.254.10.53",
                5353,
            ),
            from(
                "192.168.10.200",
                42001,
                "192.168.10.12",
                30054,
                "10.254.10.53",
                5353,
            ),
            // Served: no filter.
            from("10.244.1.7", 43000, "10.96.0.40", 53, "10.254.10.53", 5354),
            // Another family than the one listed: ignored.
            from("fd00::9", 44000, "fd00::40", 53, "fd00::53", 5353),
        ];
        let filter = |frontend: &str, port| EndpointFlows {
            protocol: Protocol::UDP,
            family: IpFamily::IPv4,
            frontend: Some(ip(frontend)),
            port,
            endpoint: ip("10.254.10.53"),
            endpoint_port: Some(5353),
        };
        let mut want = vec![
            filter("10.96.0.40", 53),
            filter("192.168.10.11", 30054),
            filter("192.168.10.12", 30054),
        ];
        want.sort_unstable();
        assert_eq!(stale_filters(&targets, IpFamily::IPv4, &flows), want);
        // Each filter deletes stale flows only.
        for f in &flows {
            let deleted = want.iter().any(|w| w.matches(Protocol::UDP, f));
            assert_eq!(
                deleted,
                f.family() == IpFamily::IPv4 && targets.is_stale(f),
                "{f:?}"
            );
        }
    }

    #[test]
    fn skipped_entries_and_other_families_have_no_targets() {
        let spec = spec();
        let skip_udp = HashSet::from([0, 1, 2]);
        assert!(udp_targets(&spec, &skip_udp, IpFamily::IPv4).is_empty());
        assert!(udp_targets(&spec, &HashSet::new(), IpFamily::IPv6).is_empty());
        assert_eq!(
            udp_families(&spec, &HashSet::new()),
            BTreeSet::from([IpFamily::IPv4])
        );
        assert_eq!(udp_families(&spec, &skip_udp), BTreeSet::new());
    }

    #[test]
    fn fingerprints_change_only_with_udp_entries() {
        let before = spec();
        let mut tcp_changed = before.clone();
        std::sync::Arc::make_mut(&mut tcp_changed.services[3]).endpoints[0].ip = "10.244.2.81".into();
        let none = HashSet::new();
        assert_eq!(
            udp_fingerprints(&before, &none),
            udp_fingerprints(&tcp_changed, &none)
        );
        type Edit = fn(&mut ServicePlan);
        let edits: [(&str, Edit); 3] = [
            ("an endpoint removed", |e| {
                e.endpoints.pop();
            }),
            ("an endpoint's port", |e| e.endpoints[0].port = 5353),
            ("every endpoint unready", |e| {
                let gone = e.endpoints.drain(..).map(|ep| ep.ip);
                e.unready_ips.extend(gone);
            }),
        ];
        for (name, edit) in edits {
            let mut changed = before.clone();
            edit(std::sync::Arc::make_mut(&mut changed.services[0]));
            assert_ne!(
                udp_fingerprints(&before, &none),
                udp_fingerprints(&changed, &none),
                "{name}"
            );
        }
    }
}
