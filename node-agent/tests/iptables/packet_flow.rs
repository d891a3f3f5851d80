//! Packet-flow tables through the tracer, after kube-proxy's `runPacketFlowTests`: what happens to the
//! first packet of a connection, not which rules say so.

use switchyard_agent::iptables::render;
use switchyard_agent::xtables::{Packet, Tracer, Verdict};
use switchyard_api::testing::{EntryExt, entry, ep, plan};
use switchyard_api::{IpFamily, Protocol};

use crate::fixtures::{NODE_IP, NODE_IP6, everything, facts, ip, local_addrs, render_all};

/// One packet and what must happen to it. `output` is the sorted, comma-separated set of endpoints
/// reached, or `REJECT`, `DROP`, `ACCEPT` (nothing of ours matched).
struct Flow {
    name: &'static str,
    source: &'static str,
    protocol: Protocol,
    dest: &'static str,
    port: u16,
    output: &'static str,
    masq: bool,
}

const fn tcp(
    name: &'static str,
    source: &'static str,
    dest: &'static str,
    port: u16,
    output: &'static str,
    masq: bool,
) -> Flow {
    Flow {
        name,
        source,
        protocol: Protocol::TCP,
        dest,
        port,
        output,
        masq,
    }
}

fn run(family: IpFamily, flows: &[Flow]) {
    let ruleset = render_all(&everything(), &facts(), family);
    let tracer = Tracer::from_ruleset(&ruleset, &local_addrs()).unwrap();
    let mut failures = Vec::new();
    for flow in flows {
        let packet = Packet::new(ip(flow.source), flow.protocol, ip(flow.dest), flow.port);
        let trace = tracer.trace(&packet).unwrap();
        if trace.output() != flow.output || trace.masquerade() != flow.masq {
            failures.push(format!(
                "{}: {:?} {} -> {}:{}\n  want {:?} masq={}\n  got  {:?} masq={}\n{}",
                flow.name,
                flow.protocol,
                flow.source,
                flow.dest,
                flow.port,
                flow.output,
                flow.masq,
                trace.output(),
                trace.masquerade(),
                trace.explain()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} flows failed:\n{}",
        failures.len(),
        flows.len(),
        failures.join("\n")
    );
}

const POD: &str = "10.244.1.50"; // a pod on this node
const NODE: &str = NODE_IP;
const OTHER_NODE: &str = "192.168.10.12";
const EXT: &str = "198.51.100.7"; // inside ns3/lb's 198.51.100.0/25
const EXT_DENIED: &str = "198.51.100.200"; // outside every source range

#[test]
fn ipv4_packet_flows() {
    let multi = "10.244.1.5:8080, 10.244.2.5:8080, 10.244.3.5:8080";
    let np = "10.244.2.6:80, 10.244.3.6:80";
    let lb = "10.244.2.7:80, 10.244.3.7:80";
    let local_all = "10.244.1.8:80, 10.244.2.8:80";
    let flows = [
        // ClusterIP and the local-traffic detector.
        tcp("pod to cluster IP", POD, "10.96.0.1", 80, multi, false),
        tcp(
            "pod on another node to cluster IP",
            "10.244.2.50",
            "10.96.0.1",
            80,
            multi,
            false,
        ),
        tcp(
            "node to cluster IP (outside the pod CIDR)",
            NODE,
            "10.96.0.1",
            80,
            multi,
            true,
        ),
        tcp("external to cluster IP", EXT, "10.96.0.1", 80, multi, true),
        tcp(
            "pod to cluster IP, wrong port",
            POD,
            "10.96.0.1",
            81,
            "ACCEPT",
            false,
        ),
        tcp("pod to unknown IP", POD, "10.96.0.99", 80, "ACCEPT", false),
        // NodePort and externalIP with eTP=Cluster: always masqueraded.
        tcp("external to NodePort", EXT, NODE, 30080, np, true),
        tcp("pod to NodePort", POD, NODE, 30080, np, true),
        tcp("node to its own NodePort", NODE, NODE, 30080, np, true),
        tcp(
            "external to another node's IP at the NodePort",
            EXT,
            OTHER_NODE,
            30080,
            "ACCEPT",
            false,
        ),
        tcp(
            "node to NodePort on localhost is not served",
            NODE,
            "127.0.0.1",
            30080,
            "ACCEPT",
            false,
        ),
        tcp("external to externalIP", EXT, "203.0.113.10", 80, np, true),
        tcp("pod to externalIP", POD, "203.0.113.10", 80, np, true),
        // LoadBalancer source ranges apply to the LB IP only.
        tcp(
            "external to LB IP from an allowed range",
            EXT,
            "203.0.113.20",
            80,
            lb,
            true,
        ),
        tcp(
            "external to LB IP from a denied source",
            EXT_DENIED,
            "203.0.113.20",
            80,
            "DROP",
            false,
        ),
        tcp(
            "pod to LB IP, pods not in any range",
            POD,
            "203.0.113.20",
            80,
            "DROP",
            false,
        ),
        tcp(
            "node to LB IP, node IP in a range",
            NODE,
            "203.0.113.20",
            80,
            lb,
            true,
        ),
        tcp(
            "other node to LB IP, in a range",
            OTHER_NODE,
            "203.0.113.20",
            80,
            lb,
            true,
        ),
        tcp(
            "LB IP looping back as its own source",
            "203.0.113.20",
            "203.0.113.20",
            80,
            lb,
            true,
        ),
        tcp(
            "denied source to the NodePort is not filtered",
            EXT_DENIED,
            NODE,
            30081,
            lb,
            true,
        ),
        tcp(
            "denied source to the cluster IP is not filtered",
            EXT_DENIED,
            "10.96.0.3",
            80,
            lb,
            true,
        ),
        // eTP=Local with a local endpoint.
        tcp(
            "external to eTP=Local NodePort: local only, client IP kept",
            EXT,
            NODE,
            30082,
            "10.244.1.8:80",
            false,
        ),
        tcp(
            "external to eTP=Local LB IP",
            EXT,
            "203.0.113.30",
            80,
            "10.244.1.8:80",
            false,
        ),
        tcp(
            "pod to eTP=Local LB IP: short-circuited to all",
            POD,
            "203.0.113.30",
            80,
            local_all,
            false,
        ),
        tcp(
            "pod to eTP=Local NodePort: short-circuited",
            POD,
            NODE,
            30082,
            local_all,
            false,
        ),
        tcp(
            "node to eTP=Local NodePort: masqueraded, all",
            NODE,
            NODE,
            30082,
            local_all,
            true,
        ),
        tcp(
            "pod to eTP=Local cluster IP uses the Cluster policy",
            POD,
            "10.96.0.4",
            80,
            local_all,
            false,
        ),
        tcp(
            "external to the health check node port",
            EXT,
            NODE,
            32000,
            "ACCEPT",
            false,
        ),
        // eTP=Local without local endpoints.
        tcp(
            "external to eTP=Local NodePort, none local",
            EXT,
            NODE,
            30083,
            "DROP",
            false,
        ),
        tcp(
            "external to eTP=Local externalIP, none local",
            EXT,
            "203.0.113.40",
            80,
            "DROP",
            false,
        ),
        tcp(
            "external to eTP=Local LB IP, none local",
            EXT,
            "203.0.113.41",
            80,
            "DROP",
            false,
        ),
        tcp(
            "pod to eTP=Local externalIP, none local: short-circuited",
            POD,
            "203.0.113.40",
            80,
            "10.244.2.9:80",
            false,
        ),
        tcp(
            "pod to eTP=Local LB IP, none local: short-circuited",
            POD,
            "203.0.113.41",
            80,
            "10.244.2.9:80",
            false,
        ),
        tcp(
            "node to eTP=Local NodePort, none local: masqueraded",
            NODE,
            NODE,
            30083,
            "10.244.2.9:80",
            true,
        ),
        tcp(
            "pod to cluster IP of eTP=Local service, none local",
            POD,
            "10.96.0.5",
            80,
            "10.244.2.9:80",
            false,
        ),
        // iTP=Local.
        tcp(
            "pod to iTP=Local cluster IP: local only",
            POD,
            "10.96.0.6",
            80,
            "10.244.1.10:80",
            false,
        ),
        tcp(
            "external to iTP=Local cluster IP: masqueraded",
            EXT,
            "10.96.0.6",
            80,
            "10.244.1.10:80",
            true,
        ),
        tcp(
            "pod to iTP=Local cluster IP, none local",
            POD,
            "10.96.0.7",
            80,
            "DROP",
            false,
        ),
        tcp(
            "node to iTP=Local cluster IP, none local",
            NODE,
            "10.96.0.7",
            80,
            "DROP",
            false,
        ),
        // No endpoints anywhere: REJECT on every frontend.
        tcp(
            "pod to cluster IP without endpoints",
            POD,
            "10.96.0.8",
            80,
            "REJECT",
            false,
        ),
        tcp(
            "node to cluster IP without endpoints",
            NODE,
            "10.96.0.8",
            80,
            "REJECT",
            false,
        ),
        tcp(
            "external to externalIP without endpoints",
            EXT,
            "203.0.113.80",
            80,
            "REJECT",
            false,
        ),
        tcp(
            "external to LB IP without endpoints",
            EXT,
            "203.0.113.81",
            80,
            "REJECT",
            false,
        ),
        tcp(
            "external to NodePort without endpoints",
            EXT,
            NODE,
            30088,
            "REJECT",
            false,
        ),
        // Protocols.
        Flow {
            protocol: Protocol::UDP,
            ..tcp(
                "pod to UDP DNS",
                POD,
                "10.96.0.10",
                53,
                "10.244.2.53:53, 10.244.3.53:53",
                false,
            )
        },
        tcp(
            "pod to TCP DNS, a different entry",
            POD,
            "10.96.0.10",
            53,
            "10.244.2.53:53",
            false,
        ),
        Flow {
            protocol: Protocol::SCTP,
            ..tcp("pod to SCTP", POD, "10.96.0.11", 9999, "10.244.2.99:9999", false)
        },
        tcp(
            "pod to the SCTP service over TCP",
            POD,
            "10.96.0.11",
            9999,
            "ACCEPT",
            false,
        ),
        Flow {
            protocol: Protocol::UDP,
            ..tcp("UDP to a TCP-only service", POD, "10.96.0.1", 80, "ACCEPT", false)
        },
        // Terminating endpoints are used when nothing is ready.
        tcp(
            "pod to service with terminating endpoints",
            POD,
            "10.96.0.12",
            80,
            "10.244.2.20:80, 10.244.3.20:80",
            false,
        ),
    ];
    run(IpFamily::IPv4, &flows);
}

#[test]
fn ipv6_packet_flows() {
    let multi = "[fd00:10:244:1::5]:8080, [fd00:10:244:2::5]:8080";
    let lb = "[fd00:10:244:2::7]:80";
    let flows = [
        tcp(
            "pod to cluster IP",
            "fd00:10:244:1::50",
            "fd00:10:96::1",
            80,
            multi,
            false,
        ),
        tcp(
            "external to cluster IP",
            "2001:db8:100::7",
            "fd00:10:96::1",
            80,
            multi,
            true,
        ),
        tcp("node to cluster IP", NODE_IP6, "fd00:10:96::1", 80, multi, true),
        tcp(
            "external to LB IP, allowed",
            "2001:db8:100::7",
            "2001:db8:113::20",
            80,
            lb,
            true,
        ),
        tcp(
            "external to LB IP, denied",
            "2001:db8:200::1",
            "2001:db8:113::20",
            80,
            "DROP",
            false,
        ),
        tcp(
            "node to LB IP, node IP in a range",
            NODE_IP6,
            "2001:db8:113::20",
            80,
            lb,
            true,
        ),
        tcp(
            "external to NodePort",
            "2001:db8:200::1",
            NODE_IP6,
            30090,
            lb,
            true,
        ),
        tcp(
            "localhost NodePort is never served",
            NODE_IP6,
            "::1",
            30090,
            "ACCEPT",
            false,
        ),
    ];
    run(IpFamily::IPv6, &flows);
}

#[test]
fn hairpin_masquerades_only_the_path_back_to_the_source_pod() {
    let ruleset = render_all(&everything(), &facts(), IpFamily::IPv4);
    let tracer = Tracer::from_ruleset(&ruleset, &local_addrs()).unwrap();
    let trace = tracer
        .trace(&Packet::new(ip("10.244.1.5"), Protocol::TCP, ip("10.96.0.1"), 80))
        .unwrap();
    assert_eq!(trace.verdicts().len(), 3, "{}", trace.explain());
    for branch in &trace.branches {
        let to_self = branch.verdict == Verdict::Dnat("10.244.1.5:8080".parse().unwrap());
        assert_eq!(branch.masquerade, to_self, "{}", trace.explain());
    }
}

/// The exact `--probability` strings kube-proxy writes, and the uniform spread they produce.
#[test]
fn endpoints_are_picked_uniformly() {
    let cases: [(usize, &[&str]); 4] = [
        (1, &[]),
        (2, &["0.5000000000"]),
        (3, &["0.3333333333", "0.5000000000"]),
        (4, &["0.2500000000", "0.3333333333", "0.5000000000"]),
    ];
    for (n, want) in cases {
        let mut service = entry("ns/spread:p80", "10.96.0.50", 80);
        for i in 0..n {
            service = service.with(ep(&format!("10.244.2.{}", i + 1), 80));
        }
        let spec = plan("node-a", vec![service]);
        let ruleset = render(&spec, &facts(), IpFamily::IPv4, &Default::default());
        let svc = ruleset.services()[0]
            .chains
            .iter()
            .find(|c| c.name.starts_with("SWYD-SVC-"))
            .unwrap();
        let probabilities: Vec<&str> = svc
            .rules
            .iter()
            .filter_map(|r| r.split("--probability ").nth(1))
            .filter_map(|rest| rest.split(' ').next())
            .collect();
        assert_eq!(probabilities, want, "{n} endpoints: {:?}", svc.rules);
        assert!(
            !svc.rules.last().unwrap().contains("statistic"),
            "the last rule must be unconditional"
        );

        let tracer = Tracer::from_ruleset(&ruleset, &local_addrs()).unwrap();
        let trace = tracer
            .trace(&Packet::new(ip(POD), Protocol::TCP, ip("10.96.0.50"), 80))
            .unwrap();
        assert_eq!(trace.verdicts().len(), n);
        for verdict in trace.verdicts() {
            let p = trace.probability(&verdict);
            assert!(
                (p - 1.0 / n as f64).abs() < 1e-6,
                "{n} endpoints: {verdict} has p={p}"
            );
        }
    }
}

#[test]
fn affinity_checks_come_before_the_random_pick() {
    let ruleset = render_all(&everything(), &facts(), IpFamily::IPv4);
    let lb = ruleset
        .services()
        .iter()
        .find(|s| s.key.name == "ns3/lb:p80")
        .unwrap();
    let svc = lb
        .chains
        .iter()
        .find(|c| c.name.starts_with("SWYD-SVC-"))
        .unwrap();
    let kinds: Vec<&str> = svc
        .rules
        .iter()
        .map(|r| {
            if r.contains("--rcheck --seconds 10800 --reap") {
                "rcheck"
            } else if r.contains("statistic") {
                "random"
            } else if r.contains("SWYD-MARK-MASQ") {
                "masq"
            } else {
                "last"
            }
        })
        .collect();
    assert_eq!(kinds, ["masq", "rcheck", "rcheck", "random", "last"]);
    for sep in lb.chains.iter().filter(|c| c.name.starts_with("SWYD-SEP-")) {
        assert!(
            sep.rules
                .last()
                .is_some_and(|dnat| dnat.contains(&format!("-m recent --name {} --set", sep.name))),
            "{:?}",
            sep.rules
        );
    }
    // A first packet has no affinity entry, so the spread stays uniform.
    let tracer = Tracer::from_ruleset(&ruleset, &local_addrs()).unwrap();
    let trace = tracer
        .trace(&Packet::new(ip(EXT), Protocol::TCP, ip("203.0.113.20"), 80))
        .unwrap();
    for verdict in trace.verdicts() {
        assert!((trace.probability(&verdict) - 0.5).abs() < 1e-9);
    }
}

/// A plan setting of `everything()` and the flows it decides; `interface` is where a packet arrives
/// (`None`: an interface no rule names, or the host's own packet).
type Setting = (
    &'static str,
    fn(&mut switchyard_api::NodeForwardingPlanSpec),
    Vec<(Option<&'static str>, Flow)>,
);

/// The local-traffic detector's interface modes (kube-proxy's `BridgeInterface` and
/// `InterfaceNamePrefix`), the ServiceCIDR drop and localhost NodePorts, as kube-proxy decides them.
/// 10.250.1.5 is a pod outside every cluster CIDR (a VPC CNI's address).
#[test]
fn detector_modes_service_cidrs_and_localhost_node_ports() {
    use switchyard_api::DetectLocalMode;
    const VPC_POD: &str = "10.250.1.5";
    let multi = "10.244.1.5:8080, 10.244.2.5:8080, 10.244.3.5:8080";
    let np = "10.244.2.6:80, 10.244.3.6:80";
    let settings: Vec<Setting> = vec![
        (
            "ClusterCIDR (the default): the VPC pod is taken for an outside client",
            |_| {},
            vec![(
                Some("cbr0"),
                tcp("vpc pod to cluster IP", VPC_POD, "10.96.0.1", 80, multi, true),
            )],
        ),
        (
            "BridgeInterface cbr0",
            |s| {
                s.cluster.detect_local = DetectLocalMode::BridgeInterface;
                s.cluster.local_traffic_cidrs.clear();
                s.cluster.local_traffic_interface = Some("cbr0".into());
            },
            vec![
                (
                    Some("cbr0"),
                    tcp(
                        "vpc pod on the bridge to cluster IP",
                        VPC_POD,
                        "10.96.0.1",
                        80,
                        multi,
                        false,
                    ),
                ),
                (
                    Some("pv0"),
                    tcp(
                        "pod off the bridge to cluster IP",
                        POD,
                        "10.96.0.1",
                        80,
                        multi,
                        true,
                    ),
                ),
                (
                    Some("eth0"),
                    tcp("external to cluster IP", EXT, "10.96.0.1", 80, multi, true),
                ),
                (
                    None,
                    tcp("node to cluster IP", NODE, "10.96.0.1", 80, multi, true),
                ),
                // kubernetes#131765: the pod's own externalIP of an eTP=Local Service with no local
                // endpoint is short-circuited to every endpoint, not dropped.
                (
                    Some("cbr0"),
                    tcp(
                        "vpc pod to eTP=Local externalIP, none local",
                        VPC_POD,
                        "203.0.113.40",
                        80,
                        "10.244.2.9:80",
                        false,
                    ),
                ),
                (
                    Some("eth0"),
                    tcp(
                        "external to eTP=Local externalIP, none local",
                        EXT,
                        "203.0.113.40",
                        80,
                        "DROP",
                        false,
                    ),
                ),
                (
                    Some("cbr01"),
                    tcp(
                        "a longer name is another interface",
                        VPC_POD,
                        "10.96.0.1",
                        80,
                        multi,
                        true,
                    ),
                ),
            ],
        ),
        (
            "InterfaceNamePrefix veth",
            |s| {
                s.cluster.detect_local = DetectLocalMode::InterfaceNamePrefix;
                s.cluster.local_traffic_cidrs.clear();
                s.cluster.local_traffic_interface = Some("veth".into());
            },
            vec![
                (
                    Some("veth9a1b"),
                    tcp(
                        "vpc pod on a veth to cluster IP",
                        VPC_POD,
                        "10.96.0.1",
                        80,
                        multi,
                        false,
                    ),
                ),
                (
                    Some("eth0"),
                    tcp("external to cluster IP", EXT, "10.96.0.1", 80, multi, true),
                ),
                (
                    None,
                    tcp("node to cluster IP", NODE, "10.96.0.1", 80, multi, true),
                ),
                (
                    Some("veth0"),
                    tcp(
                        "vpc pod to eTP=Local externalIP, none local",
                        VPC_POD,
                        "203.0.113.40",
                        80,
                        "10.244.2.9:80",
                        false,
                    ),
                ),
            ],
        ),
        (
            "ServiceCIDR 10.96.0.0/16",
            |s| s.cluster.service_cidrs = vec!["10.96.0.0/16".into()],
            vec![
                (
                    None,
                    tcp(
                        "pod to an unallocated service address",
                        POD,
                        "10.96.0.99",
                        80,
                        "DROP",
                        false,
                    ),
                ),
                (
                    None,
                    tcp(
                        "node to an unallocated service address",
                        NODE,
                        "10.96.0.99",
                        80,
                        "DROP",
                        false,
                    ),
                ),
                (
                    None,
                    tcp(
                        "pod to a port no Service defines",
                        POD,
                        "10.96.0.1",
                        81,
                        "DROP",
                        false,
                    ),
                ),
                (
                    None,
                    tcp(
                        "pod to cluster IP still served",
                        POD,
                        "10.96.0.1",
                        80,
                        multi,
                        false,
                    ),
                ),
                (
                    None,
                    tcp(
                        "pod to an address outside the range",
                        POD,
                        "10.97.0.99",
                        80,
                        "ACCEPT",
                        false,
                    ),
                ),
            ],
        ),
        (
            "localhost NodePorts",
            |s| s.cluster.localhost_node_ports = true,
            vec![
                (
                    None,
                    tcp(
                        "node to NodePort on localhost",
                        NODE,
                        "127.0.0.1",
                        30080,
                        np,
                        true,
                    ),
                ),
                (
                    None,
                    tcp("node to NodePort on its address", NODE, NODE, 30080, np, true),
                ),
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (setting, mutate, flows) in settings {
        let mut spec = everything();
        mutate(&mut spec);
        let ruleset = render_all(&spec, &facts(), IpFamily::IPv4);
        let tracer = Tracer::from_ruleset(&ruleset, &local_addrs()).unwrap();
        for (interface, flow) in flows {
            let mut packet = Packet::new(ip(flow.source), flow.protocol, ip(flow.dest), flow.port);
            if let Some(name) = interface {
                packet = packet.arriving_on(name);
            }
            let trace = tracer.trace(&packet).unwrap();
            if trace.output() != flow.output || trace.masquerade() != flow.masq {
                failures.push(format!(
                    "{setting}: {} (on {interface:?})\n  want {:?} masq={}\n  got  {:?} masq={}\n{}",
                    flow.name,
                    flow.output,
                    flow.masq,
                    trace.output(),
                    trace.masquerade(),
                    trace.explain()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
