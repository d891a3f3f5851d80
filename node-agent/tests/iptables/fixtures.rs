//! The plan every iptables test starts from.
//!
//! Address conventions are `switchyard_api::testing`'s: this node is 192.168.10.11
//! (fd00:192:168:10::11) with pod CIDR 10.244.1.0/24 (fd00:10:244:1::/64) in the cluster CIDR
//! 10.244.0.0/16 (fd00:10:244::/56); other nodes' pods are 10.244.2.x and 10.244.3.x; ClusterIPs are in
//! 10.96.0.0/16; externalIPs and LB IPs in 203.0.113.0/24; external clients in 198.51.100.0/24.

use std::collections::HashSet;
use std::net::IpAddr;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::{Ruleset, render};
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, finish, plan};
use switchyard_api::validate::validate;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

pub const NODE_IP: &str = "192.168.10.11";
pub const NODE_IP6: &str = "fd00:192:168:10::11";

pub fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The node's local addresses as the edge would discover them.
pub fn local_addrs() -> Vec<IpAddr> {
    vec![ip(NODE_IP), ip(NODE_IP6), ip("127.0.0.1"), ip("::1")]
}

/// Facts of a typical modern host.
pub fn facts() -> HostFacts {
    HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        local_addrs: Vec::new(),
    }
}

/// One plan using every feature of the render (see each entry's comment).
pub fn everything() -> NodeForwardingPlanSpec {
    let services = vec![
        // ClusterIP with three endpoints, one of them on this node (hairpin, 1/3 probabilities).
        entry("ns1/multi:p80", "10.96.0.1", 80)
            .with(ep("10.244.1.5", 8080).on_node())
            .with(ep("10.244.2.5", 8080))
            .with(ep("10.244.3.5", 8080)),
        // NodePort and externalIP, eTP=Cluster.
        entry("ns2/nodeport:p80", "10.96.0.2", 80)
            .node_port(30080)
            .external_ip("203.0.113.10")
            .with(ep("10.244.2.6", 80))
            .with(ep("10.244.3.6", 80)),
        // LoadBalancer with source ranges (the second one holds the node IP), NodePort, ClientIP affinity.
        entry("ns3/lb:p80", "10.96.0.3", 80)
            .lb_ip("203.0.113.20")
            .source_range("198.51.100.0/25")
            .source_range("192.168.10.0/24")
            .node_port(30081)
            .affinity(10800)
            .with(ep("10.244.2.7", 80))
            .with(ep("10.244.3.7", 80)),
        // eTP=Local with a local endpoint, health-check node port.
        entry("ns4/local:p80", "10.96.0.4", 80)
            .lb_ip("203.0.113.30")
            .node_port(30082)
            .etp_local()
            .hc_node_port(32000)
            .with(ep("10.244.1.8", 80).local())
            .with(ep("10.244.2.8", 80)),
        // eTP=Local without local endpoints: external traffic DROPped, pod/host traffic short-circuited.
        entry("ns5/nolocal:p80", "10.96.0.5", 80)
            .node_port(30083)
            .external_ip("203.0.113.40")
            .lb_ip("203.0.113.41")
            .etp_local()
            .hc_node_port(32001)
            .with(ep("10.244.2.9", 80)),
        // iTP=Local with a local endpoint (the remote one is in neither set).
        entry("ns6/itp:p80", "10.96.0.6", 80)
            .itp_local()
            .with(ep("10.244.1.10", 80).local().not_cluster())
            .with(ep("10.244.2.10", 80).not_cluster()),
        // iTP=Local without local endpoints: DROP.
        entry("ns7/itpnone:p80", "10.96.0.7", 80)
            .itp_local()
            .with(ep("10.244.2.11", 80).not_cluster())
            .has_endpoints(true),
        // No endpoints at all: REJECT on every frontend.
        entry("ns8/none:p80", "10.96.0.8", 80)
            .node_port(30088)
            .external_ip("203.0.113.80")
            .lb_ip("203.0.113.81"),
        // UDP and TCP on the same port are independent.
        entry("ns9/dns:dns", "10.96.0.10", 53)
            .protocol(Protocol::UDP)
            .with(ep("10.244.2.53", 53))
            .with(ep("10.244.3.53", 53)),
        entry("ns9/dns:dns-tcp", "10.96.0.10", 53).with(ep("10.244.2.53", 53)),
        entry("ns10/sctp:p9999", "10.96.0.11", 9999)
            .protocol(Protocol::SCTP)
            .with(ep("10.244.2.99", 9999)),
        // Only terminating (serving) endpoints: still used, as kube-proxy's fallback does.
        entry("ns11/terminating:p80", "10.96.0.12", 80)
            .with(ep("10.244.2.20", 80).terminating())
            .with(ep("10.244.3.20", 80).terminating()),
        // IPv6.
        entry("ns1/multi:p80", "fd00:10:96::1", 80)
            .with(ep("fd00:10:244:1::5", 8080).on_node())
            .with(ep("fd00:10:244:2::5", 8080)),
        entry("ns12/v6lb:p80", "fd00:10:96::c", 80)
            .lb_ip("2001:db8:113::20")
            .source_range("2001:db8:100::/64")
            .source_range("fd00:192:168:10::/64")
            .node_port(30090)
            .with(ep("fd00:10:244:2::7", 80)),
    ];
    let mut spec = plan("node-a", services);
    spec.node_ips.push(NODE_IP6.into());
    spec.pod_cidrs.push("fd00:10:244:1::/64".into());
    spec.cluster.local_traffic_cidrs.push("fd00:10:244::/56".into());
    finish(&mut spec);
    let report = validate(&spec);
    assert!(report.is_clean(), "fixture plan is invalid: {report:?}");
    spec
}

/// Renders every entry of `family`.
pub fn render_all(spec: &NodeForwardingPlanSpec, facts: &HostFacts, family: IpFamily) -> Ruleset {
    render(spec, facts, family, &HashSet::new())
}
