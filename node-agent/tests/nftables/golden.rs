//! Golden `nft -f` texts (insta snapshots, reviewed by eye against kube-proxy's nftables proxier and the
//! iptables goldens of the same plan).

use std::collections::HashSet;

use switchyard_agent::backend::{HostFacts, node_port_ips};
use switchyard_agent::nftables::{TableState, render, render_text};
use switchyard_api::IpFamily;
use switchyard_api::testing::finish;

use crate::fixtures::{everything, ip, local_addrs};

#[test]
fn full_table_ipv4() {
    insta::assert_snapshot!(render_text(
        &everything(),
        &HostFacts::default(),
        IpFamily::IPv4,
        &HashSet::new()
    ));
}

#[test]
fn full_table_ipv6() {
    insta::assert_snapshot!(render_text(
        &everything(),
        &HostFacts::default(),
        IpFamily::IPv6,
        &HashSet::new()
    ));
}

/// masqueradeAll, no local-traffic detector (so no pod short-circuit for eTP=Local and no `saddr !=`),
/// NodePorts on listed addresses only.
#[test]
fn full_table_masquerade_all_without_detector() {
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
    let node_ports = node_port_ips(&spec, IpFamily::IPv4, &local);
    assert_eq!(node_ports, Some(vec![ip("192.168.10.11"), ip("203.0.113.99")]));
    insta::assert_snapshot!(render_text(
        &spec,
        &HostFacts::default().with_local_addrs(local),
        IpFamily::IPv4,
        &HashSet::new()
    ));
}

#[test]
fn rendering_is_deterministic_and_plain_services_need_no_chain() {
    let spec = everything();
    let a = render_text(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
    let b = render_text(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
    assert_eq!(a, b);
    let state: TableState = render(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
    // Plain entries (ns1, ns2, ns9, ns10, ns11) have no chain of their own; complex ones do.
    for plain in ["/ns1/multi/", "/ns2/nodeport/", "/ns9/dns/", "/ns11/terminating/"] {
        assert!(
            !state.chains.keys().any(|c| c.contains(plain)),
            "{plain}: {:?}",
            state.chains.keys().collect::<Vec<_>>()
        );
    }
    for complex in ["external-", "local-", "endpoint-", "firewall-"] {
        assert!(state.chains.keys().any(|c| c.starts_with(complex)), "{complex}");
    }
    // Skipped entries are not rendered at all.
    let skip: HashSet<usize> = (0..spec.services.len()).collect();
    let empty = render(&spec, &HostFacts::default(), IpFamily::IPv4, &skip);
    assert_eq!(empty.element_count(), 0);
}

/// The interface detectors and the ServiceCIDR drop: kube-proxy's `iifname` matches in the ClusterIP
/// masquerade and the eTP=Local pod short-circuit, and one `drop` element per ServiceCIDR in
/// `cluster-ips-check`.
#[test]
fn full_table_bridge_detector_and_service_cidrs() {
    use switchyard_api::DetectLocalMode;
    let mut spec = everything();
    spec.services.retain(|s| {
        ["ns1/multi:p80", "ns4/local:p80", "ns5/nolocal:p80"].contains(&s.name.as_str())
            && s.family == IpFamily::IPv4
    });
    spec.cluster.detect_local = DetectLocalMode::BridgeInterface;
    spec.cluster.local_traffic_cidrs.clear();
    spec.cluster.local_traffic_interface = Some("cbr0".into());
    spec.cluster.service_cidrs = vec![
        "10.96.0.0/16".into(),
        "10.97.0.0/16".into(),
        "fd00:10:96::/112".into(),
    ];
    finish(&mut spec);
    let text = render_text(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
    for line in [
        "add rule ip switchyard services ip daddr @cluster-ips iifname != \"cbr0\" jump mark-for-masquerade",
        "iifname \"cbr0\" goto service-",
        "add rule ip switchyard cluster-ips-check ip daddr { 10.96.0.0/16, 10.97.0.0/16 } drop",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    insta::assert_snapshot!(text);

    // The prefix detector spells a wildcard; no ServiceCIDR, no drop rule.
    spec.cluster.detect_local = DetectLocalMode::InterfaceNamePrefix;
    spec.cluster.local_traffic_interface = Some("veth".into());
    spec.cluster.service_cidrs.clear();
    let text = render_text(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
    assert!(
        text.contains("iifname != \"veth*\" jump mark-for-masquerade"),
        "{text}"
    );
    assert!(text.contains("iifname \"veth*\" goto service-"), "{text}");
    assert!(!text.contains("} drop"), "{text}");
}
