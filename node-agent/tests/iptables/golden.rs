//! Golden restore payloads (insta snapshots, reviewed by eye against kube-proxy's proxier.go).

use std::collections::HashSet;

use switchyard_agent::backend::{HostFacts, node_port_ips};
use switchyard_agent::iptables::{jump_rules, render};
use switchyard_api::IpFamily;
use switchyard_api::testing::finish;

use crate::fixtures::{everything, facts, ip, local_addrs, render_all};

#[test]
fn full_payload_ipv4() {
    let ruleset = render_all(&everything(), &facts(), IpFamily::IPv4);
    insta::assert_snapshot!(ruleset.full_payload());
}

#[test]
fn full_payload_ipv6() {
    let ruleset = render_all(&everything(), &facts(), IpFamily::IPv6);
    insta::assert_snapshot!(ruleset.full_payload());
}

/// masqueradeAll, no local-traffic detector (so no pod short-circuit for eTP=Local and no `! -s`),
/// NodePorts on listed addresses, no `--random-fully`, a liberal conntrack (no INVALID drop).
#[test]
fn full_payload_masquerade_all_without_detector() {
    let mut spec = everything();
    spec.services.retain(|s| {
        ["ns1/multi:p80", "ns4/local:p80", "ns5/nolocal:p80", "ns6/itp:p80"].contains(&s.name.as_str())
            && s.family == IpFamily::IPv4
    });
    spec.cluster.masquerade_all = true;
    spec.cluster.local_traffic_cidrs.clear();
    spec.cluster.node_port_addresses = vec!["primary".into(), "203.0.113.0/24".into()];
    finish(&mut spec);
    let mut local = local_addrs();
    local.push(ip("203.0.113.99"));
    let facts = HostFacts {
        random_fully: false,
        tcp_be_liberal: true,
        local_addrs: local,
    };
    assert_eq!(
        node_port_ips(&spec, IpFamily::IPv4, &facts.local_addrs),
        Some(vec![ip("192.168.10.11"), ip("203.0.113.99")])
    );
    let ruleset = render(&spec, &facts, IpFamily::IPv4, &HashSet::new());
    insta::assert_snapshot!(ruleset.full_payload());
}

#[test]
fn jump_rules_into_our_chains() {
    let text: Vec<String> = jump_rules(IpFamily::IPv4)
        .iter()
        .map(|j| {
            let args: Vec<String> = j
                .args
                .iter()
                .map(|a| {
                    if a.contains(' ') {
                        format!("{a:?}")
                    } else {
                        a.clone()
                    }
                })
                .collect();
            format!("-t {} -I {} {}", j.table, j.chain, args.join(" "))
        })
        .collect();
    insta::assert_snapshot!(text.join("\n"));
}

#[test]
fn rendering_is_deterministic_and_counts_rules() {
    let spec = everything();
    let a = render_all(&spec, &facts(), IpFamily::IPv4);
    let b = render_all(&spec, &facts(), IpFamily::IPv4);
    assert_eq!(a.full_payload(), b.full_payload());
    let appended = a.full_payload().lines().filter(|l| l.starts_with("-A ")).count();
    assert_eq!(a.rule_count(), appended);
}
