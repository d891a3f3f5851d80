//! Golden render output (insta snapshots, reviewed by eye against kube-proxy's IPVS proxier): the
//! virtual servers as ipvsadm-restore lines, the service addresses, the ipset members and the glue.

use std::collections::HashSet;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::ipvs::render_text::render_text;
use switchyard_agent::ipvs::{node_port_addresses, render};
use switchyard_api::NodeForwardingPlanSpec;
use switchyard_api::testing::finish;

use crate::fixtures::{everything, ip, local_addrs};

fn facts() -> HostFacts {
    HostFacts {
        local_addrs: local_addrs(),
        random_fully: true,
        tcp_be_liberal: false,
    }
}

fn text(spec: &NodeForwardingPlanSpec, facts: &HostFacts) -> String {
    let desired = render(spec, facts, &HashSet::new());
    let node_ports: Vec<_> = desired
        .glue
        .keys()
        .map(|f| {
            (
                *f,
                node_port_addresses(spec, *f, &facts.local_addrs, &desired.addresses),
            )
        })
        .collect();
    render_text(spec, &desired, &node_ports)
}

/// The iptables fixture plan (every frontend kind, both policies, affinity, UDP/SCTP, IPv6) with a
/// cluster default scheduler, one scheduler annotation and one weighted endpoint.
#[test]
fn render_everything() {
    let mut spec = everything();
    spec.backend = switchyard_api::Backend::Ipvs;
    spec.cluster.ipvs_scheduler = Some("wrr".into());
    for entry in &mut spec.services {
        if entry.name == "ns1/multi:p80" {
            let entry = std::sync::Arc::make_mut(entry);
            entry.scheduler = Some("sh".into());
            entry.endpoints[0].weight = Some(3);
        }
    }
    finish(&mut spec);
    insta::assert_snapshot!(text(&spec, &facts()));
}

/// masqueradeAll, no local-traffic detector, NodePorts on listed addresses, no `--random-fully`, a
/// liberal conntrack.
#[test]
fn render_masquerade_all_without_detector() {
    let mut spec = everything();
    spec.services
        .retain(|s| ["ns2/nodeport:p80", "ns8/none:p80"].contains(&s.name.as_str()));
    spec.cluster.masquerade_all = true;
    spec.cluster.local_traffic_cidrs.clear();
    spec.cluster.node_port_addresses = vec!["primary".into(), "203.0.113.0/24".into()];
    spec.node_ips.truncate(1);
    finish(&mut spec);
    let mut facts = facts();
    facts.local_addrs.push(ip("203.0.113.99"));
    facts.random_fully = false;
    facts.tcp_be_liberal = true;
    insta::assert_snapshot!(text(&spec, &facts));
}
