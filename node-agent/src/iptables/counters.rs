//! The iptables traffic counters: the packet counts of the rules the agent owns, read with
//! `iptables-save -c` and named after the plan's Services.
//!
//! ```text
//! iptables-save -c -t nat    ─► [p:b] -A SWYD-SERVICES  -d VIP --dport P -j SWYD-SVC|EXT|FW-… ─► Frontend
//!                              [p:b] -A SWYD-NODEPORTS --dport N -j SWYD-EXT-…                ─► NodePort
//!                              [p:b] -A SWYD-SVC|SVL|SEP-… -j DNAT --to-destination EP        ─► Endpoint
//! iptables-save -c -t filter ─► [p:b] -A SWYD-SERVICES | SWYD-EXTERNAL-SERVICES -j REJECT      ─► NoEndpoints
//!                                                                                 -j DROP        ─► NoLocalEndpoints
//!                              [p:b] -A SWYD-PROXY-FIREWALL -j DROP                           ─► SourceRange
//!   ─► [Sample] (element: the rule's text, so a rewritten rule is a new counter)
//! ```
//!
//! The nat table sees only a connection's first packet and the filter paths into these chains match
//! `ctstate NEW`, so a rule's packet count is its new connections. Every endpoint's DNAT rule sits in its
//! Service's own chain (or its SEP chain), rewritten only when that Service changes; the frontend rules sit
//! in the top-level chains, which a sync rewrites only when some Service's frontends change (see
//! `ServiceChains::frontends`): what a frontend rule counted after the last read and before such a rewrite
//! is not seen (counted low, never high).
//!
//! Cost: a whole-table save per table and family per read: at 10,000 Services × 5, 0.48 s with
//! iptables-legacy and 2.2 s with iptables-nft (docs/benchmarks.md §10), so the scrape interval should
//! be well above it there (`switchyard_agent_traffic_counter_read_seconds` says what it costs).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

use super::names;
use crate::counters::frontends::{Frontends, applied_entries, service_port};
use crate::counters::{NodeCounter, Refusal, Sample, ServicePort, What, element_id};
use crate::error::Error;
use crate::xtables::exec::ExecIptables;
use crate::xtables::payload::Table;

/// One counted rule of a save: its chain, its packets and its arguments after the chain name.
#[derive(Debug, PartialEq, Eq)]
struct CountedRule<'a> {
    chain: &'a str,
    packets: u64,
    args: Vec<&'a str>,
    /// The rule as written, without its counters: its identity.
    text: &'a str,
}

/// `[packets:bytes] -A CHAIN args…` → the rule; any other line (tables, chain declarations, COMMIT,
/// comments) → `None`. Quoted comments are kept as separate words: only flags and their values are read.
fn counted_rule(line: &str) -> Option<CountedRule<'_>> {
    let rest = line.strip_prefix('[')?;
    let (counts, text) = rest.split_once("] ")?;
    let packets = counts.split_once(':')?.0.parse().ok()?;
    let mut words = text.split_whitespace();
    if words.next()? != "-A" {
        return None;
    }
    let chain = words.next()?;
    Some(CountedRule {
        chain,
        packets,
        args: words.collect(),
        text,
    })
}

impl CountedRule<'_> {
    /// The value after `flag`, unless the flag is negated (`! -d …`).
    fn value(&self, flag: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| *a == flag)?;
        if at > 0 && self.args[at - 1] == "!" {
            return None;
        }
        self.args.get(at + 1).copied()
    }

    fn target(&self) -> Option<&str> {
        self.value("-j")
    }

    fn protocol(&self) -> Option<Protocol> {
        match self.value("-p")? {
            "tcp" => Some(Protocol::TCP),
            "udp" => Some(Protocol::UDP),
            "sctp" => Some(Protocol::SCTP),
            _ => None,
        }
    }

    fn port(&self) -> Option<u16> {
        self.value("--dport")?.parse().ok()
    }

    /// `-d` as an address (iptables-save writes `/32` and `/128`).
    fn destination(&self) -> Option<IpAddr> {
        let text = self.value("-d")?;
        text.split_once('/').map_or(text, |(a, _)| a).parse().ok()
    }

    /// The Service port and frontend kind this rule's match names: an address frontend, or (no `-d`,
    /// or a localhost NodePort's `-d 127.0.0.0/8`) a NodePort.
    fn frontend<'i>(&self, index: &'i Frontends) -> Option<(&'i ServicePort, crate::counters::Frontend)> {
        let (protocol, port) = (self.protocol()?, self.port()?);
        match self.destination() {
            Some(address) if !address.is_loopback() => index.address(address, protocol, port),
            _ => index.node_port(protocol, port),
        }
    }
}

/// The Service port behind every chain an endpoint's DNAT rule can sit in (SVC, SVL, SEP) for the
/// family's applied entries.
fn dnat_chains(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    family: IpFamily,
) -> HashMap<String, ServicePort> {
    let mut chains = HashMap::new();
    for entry in applied_entries(spec, skip, Some(family)) {
        let (name, protocol) = (entry.name.as_str(), entry.protocol.lower());
        let service = service_port(entry);
        chains.insert(names::cluster_policy_chain(name, protocol), service.clone());
        chains.insert(names::local_policy_chain(name, protocol), service.clone());
        for ep in &entry.endpoints {
            let endpoint = names::join_host_port(&ep.ip, ep.port);
            chains.insert(names::endpoint_chain(name, protocol, &endpoint), service.clone());
        }
    }
    chains
}

/// The counters of one family's saved nat and filter tables, named after the plan's Service ports;
/// rules the plan does not explain (a read racing a sync, another tool's rules) are left out.
pub fn samples(
    nat: &str,
    filter: &str,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    family: IpFamily,
) -> Vec<Sample> {
    let index = Frontends::of(spec, skip, Some(family));
    let chains = dnat_chains(spec, skip, family);
    let mut out = Vec::new();
    let mut push = |table: Table, rule: &CountedRule<'_>, service: &ServicePort, what: What| {
        out.push(Sample {
            service: service.clone(),
            what,
            element: element_id((family, table.as_str(), rule.text)),
            packets: rule.packets,
        });
    };
    for rule in nat.lines().filter_map(counted_rule) {
        let Some(target) = rule.target() else {
            continue;
        };
        if target == "DNAT" {
            let endpoint = rule
                .value("--to-destination")
                .and_then(|text| text.parse::<SocketAddr>().ok());
            if let (Some(service), Some(endpoint)) = (chains.get(rule.chain), endpoint) {
                push(Table::Nat, &rule, service, What::Endpoint(endpoint.to_string()));
            }
            continue;
        }
        if rule.chain == names::NODEPORTS
            && rule.destination().is_some_and(|ip| ip.is_loopback())
            && let Some((service, _)) = rule.frontend(&index)
        {
            push(
                Table::Nat,
                &rule,
                service,
                What::Node(NodeCounter::LocalhostNodePorts),
            );
        }
        let frontend_rule = (rule.chain == names::SERVICES || rule.chain == names::NODEPORTS)
            && names::is_service_chain(target);
        if frontend_rule && let Some((service, kind)) = rule.frontend(&index) {
            push(Table::Nat, &rule, service, What::Frontend(kind));
        }
    }
    let node = ServicePort {
        name: "".into(),
        protocol: Protocol::TCP,
    };
    for rule in filter.lines().filter_map(counted_rule) {
        if rule.chain == names::FORWARD
            && rule.target() == Some("DROP")
            && rule.value("--ctstate") == Some("INVALID")
        {
            push(
                Table::Filter,
                &rule,
                &node,
                What::Node(NodeCounter::InvalidDropped),
            );
            continue;
        }
        let refusal = match (rule.chain, rule.target()) {
            (names::SERVICES | names::EXTERNAL_SERVICES, Some("REJECT")) => Refusal::NoEndpoints,
            (names::SERVICES | names::EXTERNAL_SERVICES, Some("DROP")) => Refusal::NoLocalEndpoints,
            (names::PROXY_FIREWALL, Some("DROP")) => Refusal::SourceRange,
            _ => continue,
        };
        if let Some((service, _)) = rule.frontend(&index) {
            push(Table::Filter, &rule, service, What::Refused(refusal));
        }
    }
    out
}

/// One read of the nat and filter tables of each family `spec` has, with `iptables-save -c`, named
/// after `spec` (its entries `skip` left out).
pub fn read(
    iptables: &ExecIptables,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Result<Vec<Sample>, Error> {
    let mut out = Vec::new();
    for family in spec_families(spec) {
        let nat = iptables.save_counted(family, Table::Nat)?;
        let filter = iptables.save_counted(family, Table::Filter)?;
        out.extend(samples(&nat, &filter, spec, skip, family));
    }
    Ok(out)
}

/// The families the plan has entries of (a save of the other family's tables would find nothing ours).
fn spec_families(spec: &NodeForwardingPlanSpec) -> Vec<IpFamily> {
    [IpFamily::IPv4, IpFamily::IPv6]
        .into_iter()
        .filter(|family| spec.services.iter().any(|e| e.family == *family))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::{Accumulator, Frontend};
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn web() -> NodeForwardingPlanSpec {
        let mut web = entry("ns1/web:http", "10.96.0.1", 80)
            .node_port(30080)
            .with(ep("10.244.1.5", 8080))
            .with(ep("10.244.2.5", 8080));
        web.load_balancer_ips = vec!["198.51.100.1".into()];
        plan("node-a", vec![web, entry("ns1/empty", "10.96.0.2", 80)])
    }

    #[test]
    fn a_counted_save_line_is_split_into_chain_packets_and_args() {
        let rule = counted_rule("[12:720] -A SWYD-SERVICES -d 10.96.0.1/32 ! -s 10.0.0.0/8 -j X").unwrap();
        assert_eq!((rule.chain, rule.packets), ("SWYD-SERVICES", 12));
        assert_eq!(rule.destination(), Some("10.96.0.1".parse().unwrap()));
        assert_eq!(rule.value("-s"), None, "a negated match is not the rule's value");
        for other in [
            ":SWYD-SERVICES - [0:0]",
            "*nat",
            "COMMIT",
            "-A X -j Y",
            "[1:2] -N X",
            "[x:1] -A X",
        ] {
            assert_eq!(counted_rule(other), None, "{other}");
        }
    }

    #[test]
    fn rules_count_for_their_frontend_endpoint_or_refusal() {
        let spec = web();
        let svc = names::cluster_policy_chain("ns1/web:http", "tcp");
        let sep = names::endpoint_chain("ns1/web:http", "tcp", "10.244.2.5:8080");
        // As iptables-save writes them: its own order of matches, /32 on addresses, quoted comments.
        let nat = format!(
            "*nat\n:SWYD-SERVICES - [0:0]\n\
             [7:420] -A SWYD-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"ns1/web:http cluster IP\" -m tcp --dport 80 -j {svc}\n\
             [2:120] -A SWYD-SERVICES -d 198.51.100.1/32 -p tcp -m tcp --dport 80 -j SWYD-FW-X\n\
             [3:180] -A SWYD-NODEPORTS -p tcp -m tcp --dport 30080 -j SWYD-EXT-X\n\
             [11:660] -A SWYD-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"ns1/web:http localhost nodeport\" -m tcp --dport 30080 -j SWYD-EXT-X\n\
             [9:540] -A SWYD-SERVICES -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j SWYD-NODEPORTS\n\
             [4:240] -A {svc} -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.244.1.5:8080\n\
             [5:300] -A {svc} -p tcp -j {sep}\n\
             [5:300] -A {sep} -p tcp -j DNAT --to-destination 10.244.2.5:8080\n\
             [8:480] -A SWYD-SVC-OTHERTOOL -p tcp -j DNAT --to-destination 10.9.9.9:80\n\
             COMMIT\n"
        );
        let filter = "*filter\n\
             [6:360] -A SWYD-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable\n\
             [1:60] -A SWYD-EXTERNAL-SERVICES -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j DROP\n\
             [2:120] -A SWYD-PROXY-FIREWALL -d 198.51.100.1/32 -p tcp -m tcp --dport 80 -j DROP\n\
             [13:780] -A SWYD-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
             COMMIT\n";
        let series =
            Accumulator::default().update(samples(&nat, filter, &spec, &HashSet::new(), IpFamily::IPv4));
        let value = |name: &str, what: What| {
            series
                .iter()
                .find(|s| &*s.service.name == name && s.what == what)
                .map(|s| s.value)
        };
        let web = "ns1/web:http";
        assert_eq!(value(web, What::Frontend(Frontend::ClusterIp)), Some(7));
        assert_eq!(value(web, What::Frontend(Frontend::LoadBalancer)), Some(2));
        // The localhost NodePort rule counts for the NodePort and for kube-proxy's localhost counter.
        assert_eq!(value(web, What::Frontend(Frontend::NodePort)), Some(3 + 11));
        assert_eq!(value(web, What::Node(NodeCounter::LocalhostNodePorts)), Some(11));
        assert_eq!(value("", What::Node(NodeCounter::InvalidDropped)), Some(13));
        assert_eq!(value(web, What::Endpoint("10.244.1.5:8080".into())), Some(4));
        assert_eq!(value(web, What::Endpoint("10.244.2.5:8080".into())), Some(5));
        assert_eq!(value("ns1/empty", What::Refused(Refusal::NoEndpoints)), Some(6));
        assert_eq!(value(web, What::Refused(Refusal::NoLocalEndpoints)), Some(1));
        assert_eq!(value(web, What::Refused(Refusal::SourceRange)), Some(2));
        assert_eq!(
            series.len(),
            10,
            "the NodePorts jump and another tool's chain count for no one: {series:?}"
        );
    }

    #[test]
    fn a_rewritten_rule_keeps_what_its_series_counted() {
        let spec = web();
        let rule = |n: u64| {
            format!("[{n}:0] -A SWYD-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SWYD-SVC-X\n")
        };
        let mut acc = Accumulator::default();
        let read = |acc: &mut Accumulator, n| {
            acc.update(samples(&rule(n), "", &spec, &HashSet::new(), IpFamily::IPv4))[0].value
        };
        assert_eq!(read(&mut acc, 10), 10);
        // A sync rewrote the top-level chain: the kernel counts again from 0.
        assert_eq!(read(&mut acc, 2), 12);
    }
}
