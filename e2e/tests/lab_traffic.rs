//! Traffic through a bare lab (no agents): routed pods, host-network pods, the client, TCP and UDP.
//! No NAT happens in the lab itself, so every backend sees the real source address.

#[cfg(test)] // NB: marks the helpers as test code for clippy's allow-*-in-tests.
mod common;

use std::time::Duration;

use common::{TIMEOUT, example_lab, ip, sa};
use switchyard_e2e::{Place, ProbeResult, Proto};

#[test]
fn pods_nodes_and_the_client_reach_each_other_without_nat() {
    let Some(lab) = example_lab("pods_nodes_and_the_client_reach_each_other_without_nat") else {
        return;
    };
    let cases = [
        // (from, to, answering pod, source it sees)
        (Place::pod("web-a1"), "10.244.1.11:8080", "web-a2", "10.244.1.10"), // pod → pod, same node
        (Place::pod("web-a1"), "10.244.2.10:8080", "web-b1", "10.244.1.10"), // pod → pod, other node
        (Place::pod("web-b1"), "10.244.3.20:8443", "edge-c1", "10.244.2.10"),
        (
            Place::node("node-c"),
            "10.244.1.10:8080",
            "web-a1",
            "192.168.10.13",
        ), // node → pod elsewhere
        (
            Place::node("node-a"),
            "10.244.1.10:8080",
            "web-a1",
            "192.168.10.11",
        ), // node → own pod
        (
            Place::pod("web-a1"),
            "192.168.10.12:9000",
            "hostnet-b",
            "10.244.1.10",
        ), // pod → host-network pod
        (Place::Client, "192.168.10.12:9000", "hostnet-b", "192.168.10.200"), // client → node IP
    ];
    for (from, to, pod, source) in cases {
        let result = lab.probe(&from, Proto::Tcp, sa(to), TIMEOUT).unwrap();
        assert_eq!(result.pod(), Some(pod), "{from} → {to}: {result}");
        assert_eq!(result.seen_ip(), Some(ip(source)), "{from} → {to}: {result}");
    }
}

#[test]
fn closed_ports_refuse_and_unknown_destinations_stay_inside() {
    let Some(lab) = example_lab("closed_ports_refuse_and_unknown_destinations_stay_inside") else {
        return;
    };
    let refused = lab
        .probe(&Place::Client, Proto::Tcp, sa("192.168.10.11:9000"), TIMEOUT)
        .unwrap();
    assert_eq!(refused, ProbeResult::Refused);
    let refused = lab
        .probe(&Place::pod("web-a1"), Proto::Tcp, sa("10.244.2.10:8081"), TIMEOUT)
        .unwrap();
    assert_eq!(refused, ProbeResult::Refused);
    // No agent yet: the node's default route sends a service IP onto the fabric, where nothing answers
    // (the fabric has no router: nothing leaves the lab).
    for from in [Place::pod("web-a1"), Place::Client] {
        let result = lab
            .probe(&from, Proto::Tcp, sa("10.96.0.10:80"), Duration::from_millis(500))
            .unwrap();
        assert!(
            matches!(result, ProbeResult::TimedOut | ProbeResult::Error { .. }),
            "{from}: {result}"
        );
    }
    // The client has no route to pods until a test gives it one.
    let before = lab
        .probe(&Place::Client, Proto::Tcp, sa("10.244.2.10:8080"), TIMEOUT)
        .unwrap();
    assert!(!before.is_answered(), "{before}");
    lab.client_route_via("10.244.2.0/24".parse().unwrap(), "node-b")
        .unwrap();
    let after = lab
        .probe(&Place::Client, Proto::Tcp, sa("10.244.2.10:8080"), TIMEOUT)
        .unwrap();
    assert_eq!(after.pod(), Some("web-b1"), "{after}");
    assert_eq!(after.seen_ip(), Some(ip("192.168.10.200")));
}

#[test]
fn udp_answers_and_closed_udp_ports_refuse() {
    let Some(lab) = example_lab("udp_answers_and_closed_udp_ports_refuse") else {
        return;
    };
    let from = Place::pod("web-a1");
    let answered = lab
        .probe(&from, Proto::Udp, sa("10.244.3.53:53"), TIMEOUT)
        .unwrap();
    assert_eq!(answered.pod(), Some("dns-c1"), "{answered}");
    assert_eq!(answered.seen_ip(), Some(ip("10.244.1.10")));
    let tcp = lab
        .probe(&from, Proto::Tcp, sa("10.244.3.53:53"), TIMEOUT)
        .unwrap();
    assert_eq!(tcp.pod(), Some("dns-c1"), "{tcp}");
    let closed = lab
        .probe(&from, Proto::Udp, sa("10.244.3.53:54"), TIMEOUT)
        .unwrap();
    assert_eq!(closed, ProbeResult::Refused);
    let from_node = lab
        .probe(&Place::node("node-b"), Proto::Udp, sa("10.244.3.53:53"), TIMEOUT)
        .unwrap();
    assert_eq!(from_node.seen_ip(), Some(ip("192.168.10.12")), "{from_node}");
}

#[test]
fn probe_many_counts_answers_per_pod_and_source() {
    let Some(lab) = example_lab("probe_many_counts_answers_per_pod_and_source") else {
        return;
    };
    let tally = lab
        .probe_many(&Place::Client, Proto::Tcp, sa("192.168.10.12:9000"), 200, TIMEOUT)
        .unwrap();
    assert_eq!(tally.answered.get("hostnet-b"), Some(&200), "{tally:?}");
    assert_eq!(tally.seen_sources.get(&ip("192.168.10.200")), Some(&200));
    let udp = lab
        .probe_many(
            &Place::pod("web-b1"),
            Proto::Udp,
            sa("10.244.3.53:53"),
            50,
            TIMEOUT,
        )
        .unwrap();
    assert_eq!(udp.answered.get("dns-c1"), Some(&50), "{udp:?}");
    let refused = lab
        .probe_many(&Place::Client, Proto::Tcp, sa("192.168.10.11:1"), 5, TIMEOUT)
        .unwrap();
    assert_eq!((refused.refused, refused.total()), (5, 5));
}

/// Node netfilter sees every pod packet (pods are routed, not bridged): a DNAT on node-a to a pod on
/// the same node is un-NATed on the way back, both for the client and for a pod on that node.
#[test]
fn node_netfilter_sees_pod_traffic() {
    let Some(lab) = example_lab("node_netfilter_sees_pod_traffic") else {
        return;
    };
    let rule = [
        "iptables",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        "10.96.0.10",
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "DNAT",
        "--to-destination",
        "10.244.1.10:8080",
    ];
    let out = lab
        .exec_in(&Place::node("node-a"), &rule.map(String::from))
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let client = lab
        .probe(&Place::Client, Proto::Tcp, sa("10.96.0.10:80"), TIMEOUT)
        .unwrap();
    assert_eq!(client.pod(), Some("web-a1"), "{client}");
    assert_eq!(client.seen_ip(), Some(ip("192.168.10.200")));
    let hairpin_free = lab
        .probe(&Place::pod("web-a2"), Proto::Tcp, sa("10.96.0.10:80"), TIMEOUT)
        .unwrap();
    assert_eq!(hairpin_free.pod(), Some("web-a1"), "{hairpin_free}");
    assert_eq!(hairpin_free.seen_ip(), Some(ip("10.244.1.11")));
    let save = lab
        .exec_in(&Place::node("node-a"), &["iptables-save".to_owned()])
        .unwrap();
    assert!(String::from_utf8_lossy(&save.stdout).contains("10.244.1.10:8080"));
    let host = std::process::Command::new("iptables-save").output().unwrap();
    assert!(
        !String::from_utf8_lossy(&host.stdout).contains("10.244.1.10:8080"),
        "rule leaked to the host"
    );
}
