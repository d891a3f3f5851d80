//! Which connections lost their endpoint: pure selection over the last applied plan and the new one.
//!
//! ```text
//! previous spec, skip ─┐
//! current spec, skip ──┴─► removed_endpoints() ─► [EndpointFlows] ─► Conntrack::delete_matching (one
//!                                                  per frontend × endpoint that left its Service)
//! ```
//!
//! An established connection keeps its conntrack entry, and with it the DNAT to its endpoint, after
//! that endpoint leaves the Service; its packets go to an address that no longer answers and the client
//! hangs until its own timeout (kubernetes#100698, #101607). kube-proxy clears UDP only, because
//! clearing TCP would also kill connections to *terminating* endpoints, which must drain (the closed
//! PRs #100755, #102631). The plan tells the two apart: an endpoint that terminates stays in
//! `endpoints` (serving, flagged `terminating`) or moves to `unreadyIPs` (past serving, or failing
//! readiness) until its EndpointSlice drops it. Only an address absent from both lists of an entry
//! that is still planned has left: its flows through that entry's frontends (every protocol) are
//! cleared, so the next packet meets the rules again (re-balanced, or rejected). A topology or traffic
//! policy change never clears anything: an endpoint this node no longer uses is still listed. A
//! Service that is deleted, skipped as invalid, or annotated `switchyard.io/keep-connections: "true"`
//! is left alone.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use switchyard_api::{EntryKey, IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

/// The conntrack entries of connections through one frontend DNATed to one removed endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointFlows {
    /// The entry's protocol.
    pub protocol: Protocol,
    /// The family of every address here.
    pub family: IpFamily,
    /// The original destination: a ClusterIP, externalIP or LoadBalancer IP; `None` for a NodePort,
    /// which any address of the node takes.
    pub frontend: Option<IpAddr>,
    /// The original destination port (the Service port, or the NodePort).
    pub port: u16,
    /// The endpoint: the reply's source.
    pub endpoint: IpAddr,
    /// The endpoint's port (the reply's source port); `None` for an unready address, listed without.
    pub endpoint_port: Option<u16>,
}

impl EndpointFlows {
    /// Whether the entry `flow` of `protocol` is one of these (what `conntrack -D` with these filters
    /// deletes).
    pub fn matches(&self, protocol: Protocol, flow: &super::Flow) -> bool {
        protocol == self.protocol
            && flow.family() == self.family
            && self.frontend.is_none_or(|ip| flow.original.dst == ip)
            && flow.original.dport == self.port
            && flow.reply.src == self.endpoint
            && self.endpoint_port.is_none_or(|port| flow.reply.sport == port)
    }
}

/// Up to this many filters are run as they are; past it the table is listed first (see
/// [`super::clear_removed`]).
pub const LIST_FIRST_ABOVE: usize = 16;

/// The filters of `protocol` and `family` that at least one of `flows` (listed for them) matches, in
/// their order.
pub fn matched(
    filters: &[EndpointFlows],
    protocol: Protocol,
    family: IpFamily,
    flows: &[super::Flow],
) -> Vec<EndpointFlows> {
    let mut by_endpoint: HashMap<IpAddr, Vec<&super::Flow>> = HashMap::new();
    for flow in flows {
        by_endpoint.entry(flow.reply.src).or_default().push(flow);
    }
    filters
        .iter()
        .filter(|f| f.protocol == protocol && f.family == family)
        .filter(|f| {
            by_endpoint
                .get(&f.endpoint)
                .is_some_and(|flows| flows.iter().any(|flow| f.matches(protocol, flow)))
        })
        .copied()
        .collect()
}

fn planned<'a>(
    spec: &'a NodeForwardingPlanSpec,
    skip: &'a HashSet<usize>,
) -> impl Iterator<Item = (usize, &'a Arc<ServicePlan>)> + 'a {
    spec.services
        .iter()
        .enumerate()
        .filter(|(index, _)| !skip.contains(index))
}

/// The flows to clear after `current` replaced `previous`, sorted, each once.
pub fn removed_endpoints(
    previous: &NodeForwardingPlanSpec,
    previous_skip: &HashSet<usize>,
    current: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Vec<EndpointFlows> {
    // Most syncs change a few entries and keep the rest in place as the same `Arc`: only the entries
    // that differ by pointer at their index are paired up by key.
    let mut before: HashMap<EntryKey, &ServicePlan> = HashMap::new();
    let mut after: Vec<&ServicePlan> = Vec::new();
    for (index, entry) in planned(previous, previous_skip) {
        let same = current
            .services
            .get(index)
            .is_some_and(|now| Arc::ptr_eq(now, entry) && !skip.contains(&index));
        if !same {
            before.insert(entry.entry_key(), entry);
        }
    }
    for (index, entry) in planned(current, skip) {
        let same = previous
            .services
            .get(index)
            .is_some_and(|was| Arc::ptr_eq(was, entry) && !previous_skip.contains(&index));
        if !same {
            after.push(entry);
        }
    }
    let mut out: Vec<EndpointFlows> = Vec::new();
    for entry in after {
        if entry.keep_connections {
            continue;
        }
        if let Some(was) = before.get(&entry.entry_key()) {
            left(was, entry, &mut out);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Adds the flows of the endpoints of `was` that `now` lists nowhere.
fn left(was: &ServicePlan, now: &ServicePlan, out: &mut Vec<EndpointFlows>) {
    let still: HashSet<&str> = now
        .endpoints
        .iter()
        .map(|ep| ep.ip.as_str())
        .chain(now.unready_ips.iter().map(String::as_str))
        .collect();
    let gone = was
        .endpoints
        .iter()
        .filter(|ep| !still.contains(ep.ip.as_str()))
        .map(|ep| (ep.ip.as_str(), Some(ep.port)))
        .chain(
            was.unready_ips
                .iter()
                .filter(|ip| !still.contains(ip.as_str()))
                .map(|ip| (ip.as_str(), None)),
        );
    let frontends: Vec<IpAddr> = std::iter::once(&was.cluster_ip)
        .chain(&was.external_ips)
        .chain(&was.load_balancer_ips)
        .filter_map(|ip| ip.parse().ok())
        .collect();
    for (ip, endpoint_port) in gone {
        let Ok(endpoint) = ip.parse::<IpAddr>() else {
            continue;
        };
        let flows = |frontend, port| EndpointFlows {
            protocol: was.protocol,
            family: was.family,
            frontend,
            port,
            endpoint,
            endpoint_port,
        };
        out.extend(frontends.iter().map(|ip| flows(Some(*ip), was.port)));
        if let Some(node_port) = was.node_port {
            out.push(flows(None, node_port));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn web() -> ServicePlan {
        entry("ns/web:p", "10.96.0.30", 80)
            .node_port(30080)
            .external_ip("203.0.113.30")
            .with(ep("10.244.2.80", 8080))
            .with(ep("10.244.3.80", 8080))
    }

    fn spec(entries: Vec<ServicePlan>) -> NodeForwardingPlanSpec {
        plan("node-a", entries)
    }

    fn cleared(before: ServicePlan, after: ServicePlan) -> Vec<EndpointFlows> {
        let none = HashSet::new();
        removed_endpoints(&spec(vec![before]), &none, &spec(vec![after]), &none)
    }

    fn without(mut entry: ServicePlan, gone: &str) -> ServicePlan {
        entry.endpoints.retain(|e| e.ip != gone);
        entry
    }

    #[test]
    fn only_filters_that_some_listed_flow_matches_are_kept() {
        use crate::conntrack::{Flow, Tuple};
        let filter = |endpoint: &str, frontend: Option<&str>, port: u16| EndpointFlows {
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            frontend: frontend.map(ip),
            port,
            endpoint: ip(endpoint),
            endpoint_port: Some(8080),
        };
        let flow = |dst: &str, dport: u16, endpoint: &str| Flow {
            original: Tuple {
                src: ip("10.244.9.9"),
                dst: ip(dst),
                sport: 40000,
                dport,
            },
            reply: Tuple {
                src: ip(endpoint),
                dst: ip("10.244.9.9"),
                sport: 8080,
                dport: 40000,
            },
        };
        let filters = [
            filter("10.244.2.5", Some("10.96.0.1"), 80),
            filter("10.244.2.5", None, 30080),
            filter("10.244.2.6", Some("10.96.0.1"), 80),
            filter("10.244.2.7", Some("10.96.0.1"), 80),
        ];
        let flows = [
            flow("10.96.0.1", 80, "10.244.2.5"),
            // To 10.244.2.6 directly, not through the frontend: its filter finds nothing.
            flow("10.244.2.6", 8080, "10.244.2.6"),
        ];
        let table: [(Protocol, IpFamily, Vec<EndpointFlows>); 3] = [
            (Protocol::TCP, IpFamily::IPv4, vec![filters[0]]),
            (Protocol::UDP, IpFamily::IPv4, vec![]),
            (Protocol::TCP, IpFamily::IPv6, vec![]),
        ];
        for (protocol, family, want) in table {
            assert_eq!(
                matched(&filters, protocol, family, &flows),
                want,
                "{protocol:?} {family:?}"
            );
        }
        let node_port = [flow("192.168.10.11", 30080, "10.244.2.5")];
        assert_eq!(
            matched(&filters, Protocol::TCP, IpFamily::IPv4, &node_port),
            vec![filters[1]]
        );
    }

    #[test]
    fn an_endpoint_that_left_is_cleared_on_every_frontend_and_one_that_drains_is_not() {
        let terminating = {
            let mut e = web();
            e.endpoints[0].terminating = true;
            e
        };
        let unready = {
            let mut e = without(web(), "10.244.2.80");
            e.unready_ips = vec!["10.244.2.80".into()];
            e
        };
        let moved_port = {
            let mut e = web();
            e.endpoints[0].port = 9090;
            e
        };
        let kept = {
            let mut e = without(web(), "10.244.2.80");
            e.keep_connections = true;
            e
        };
        let not_used_here = {
            let mut e = web();
            e.endpoints[0].cluster = false;
            e
        };
        let flows_of = |endpoint: &str, endpoint_port: Option<u16>| -> Vec<EndpointFlows> {
            let flows = |frontend: Option<&str>, port| EndpointFlows {
                protocol: Protocol::TCP,
                family: IpFamily::IPv4,
                frontend: frontend.map(ip),
                port,
                endpoint: ip(endpoint),
                endpoint_port,
            };
            let mut all = vec![
                flows(Some("10.96.0.30"), 80),
                flows(Some("203.0.113.30"), 80),
                flows(None, 30080),
            ];
            all.sort_unstable();
            all
        };
        let cases: Vec<(&str, ServicePlan, ServicePlan, Vec<EndpointFlows>)> = vec![
            (
                "removed",
                web(),
                without(web(), "10.244.2.80"),
                flows_of("10.244.2.80", Some(8080)),
            ),
            ("unchanged", web(), web(), vec![]),
            ("turned terminating (serving)", web(), terminating.clone(), vec![]),
            (
                "terminating past serving (unready)",
                terminating,
                unready.clone(),
                vec![],
            ),
            (
                "unready, then gone from the slice",
                unready,
                without(web(), "10.244.2.80"),
                flows_of("10.244.2.80", None),
            ),
            // Still the Service's address: its connections may well work on (nothing proves them dead).
            ("same address, new port", web(), moved_port, vec![]),
            ("opted out", web(), kept, vec![]),
            ("no longer used by this node", web(), not_used_here, vec![]),
            (
                "the last endpoint",
                without(web(), "10.244.3.80"),
                without(without(web(), "10.244.3.80"), "10.244.2.80"),
                flows_of("10.244.2.80", Some(8080)),
            ),
        ];
        for (name, before, after, want) in cases {
            assert_eq!(cleared(before, after), want, "{name}");
        }
    }

    #[test]
    fn every_protocol_is_cleared_and_deleted_or_skipped_services_are_not() {
        let udp = web().protocol(Protocol::UDP);
        let flows = cleared(udp.clone(), without(udp, "10.244.3.80"));
        assert_eq!(flows.len(), 3);
        assert!(flows.iter().all(|f| f.protocol == Protocol::UDP));
        let sctp = web().protocol(Protocol::SCTP);
        assert_eq!(cleared(sctp.clone(), without(sctp, "10.244.3.80")).len(), 3);

        let none = HashSet::new();
        let other = entry("ns/other:p", "10.96.0.31", 80).with(ep("10.244.2.81", 80));
        let deleted = removed_endpoints(
            &spec(vec![web(), other.clone()]),
            &none,
            &spec(vec![other]),
            &none,
        );
        assert_eq!(deleted, vec![], "a deleted Service");
        let after = spec(vec![without(web(), "10.244.2.80")]);
        let skipped = removed_endpoints(&spec(vec![web()]), &none, &after, &HashSet::from([0]));
        assert_eq!(skipped, vec![], "an entry skipped as invalid now");
    }

    #[test]
    fn entries_kept_as_the_same_arc_are_not_compared_and_moved_ones_still_are() {
        let none = HashSet::new();
        let before = spec(vec![web(), entry("ns/a:p", "10.96.0.1", 80)]);
        let mut same = before.clone();
        same.revision = "next".into();
        assert_eq!(removed_endpoints(&before, &none, &same, &none), vec![]);
        // An entry inserted in front shifts every index: pairing falls back to keys.
        let mut shifted = before.clone();
        shifted
            .services
            .insert(0, Arc::new(entry("ns/0:p", "10.96.0.2", 80)));
        let web = shifted
            .services
            .iter_mut()
            .find(|e| e.name == "ns/web:p")
            .unwrap();
        Arc::make_mut(web).endpoints.retain(|e| e.ip != "10.244.2.80");
        assert_eq!(removed_endpoints(&before, &none, &shifted, &none).len(), 3);
    }
}
