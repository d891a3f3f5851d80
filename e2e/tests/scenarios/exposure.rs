//! The rest of kube-proxy v1.36's contract on real packets (issue 44): the local-traffic detector's
//! interface modes, the drop of unallocated addresses in the Service ranges, the exposure defaults, and
//! two upstream bugs pinned.
//!
//! ```text
//! default/vpc:  10.96.44.1:8080 ─► vpc-pod 10.250.1.5 (node-a; outside every cluster CIDR, veth pvN)
//! default/trap: 10.96.44.9:8099 ─► trap 10.96.99.99 (node-c; a host on "the network" inside the
//!               Service range; node-a routes 10.96.99.99 to node-c, as a static route would)
//! default/local-ext: eTP=Local, externalIP 203.0.113.44:80 ─► apache-b2 10.244.2.10 (node-b only)
//! ```
//!
//! 1. vpc-pod → apache's ClusterIP: masqueraded under ClusterCIDR (its address is in no cluster CIDR),
//!    kept under InterfaceNamePrefix `pv` and under BridgeInterface `cbr0` once its veth is on the
//!    bridge; outside clients, the node and pods off the bridge are masqueraded in every mode; the
//!    bridge mode's rules load before the bridge exists.
//! 2. A pod → 10.96.99.99 (unallocated, inside 10.96.0.0/16): reaches trap without ServiceCIDRs; with
//!    them it is dropped on node-a and node-c's conntrack never sees it.
//! 3. nftables serves NodePorts on the primary address only by default (a second address on node-a is
//!    closed; `nodePortAddresses: []` opens it); localhost NodePorts are served once opted in, on
//!    iptables only (route_localnet=1 set by the agent); an externalIP the policy refuses is not
//!    forwarded and is the Service's problem (its Warning Event live).
//! 4. kubernetes#131765: a pod on node-a reaches the externalIP of an eTP=Local Service whose only
//!    endpoint is on node-b (short-circuited, not dropped); an outside client through node-a is dropped.
//! 5. kubernetes#132516: an agent started over a table left by an older layout keeps nothing stale.

use switchyard_api::{Backend, DetectLocalMode};
use switchyard_controller::config::ExternalIpPolicy;
use switchyard_e2e::checks::{self, Check, Expect, answered, answered_from};
use switchyard_e2e::{ClusterDescription, Deployed, Place};

use super::{Suite, example, must_pass};

const NODE_A: &str = "192.168.10.11";

const EXTRA: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: vpc, namespace: default}
spec:
  clusterIP: 10.96.44.1
  clusterIPs: [10.96.44.1]
  ports: [{port: 8080, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: vpc-a1b2c
  namespace: default
  labels: {kubernetes.io/service-name: vpc}
addressType: IPv4
ports: [{name: "", port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.250.1.5]
  conditions: {ready: true}
  nodeName: node-a
  targetRef: {kind: Pod, name: vpc-pod}
---
apiVersion: v1
kind: Service
metadata: {name: trap, namespace: default}
spec:
  clusterIP: 10.96.44.9
  clusterIPs: [10.96.44.9]
  ports: [{port: 8099, protocol: TCP, targetPort: 8099}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: trap-d4e5f
  namespace: default
  labels: {kubernetes.io/service-name: trap}
addressType: IPv4
ports: [{name: "", port: 8099, protocol: TCP}]
endpoints:
- addresses: [10.96.99.99]
  conditions: {ready: true}
  nodeName: node-c
  targetRef: {kind: Pod, name: trap}
---
apiVersion: v1
kind: Service
metadata: {name: local-ext, namespace: default}
spec:
  clusterIP: 10.96.44.2
  clusterIPs: [10.96.44.2]
  externalIPs: [203.0.113.44]
  externalTrafficPolicy: Local
  ports: [{port: 80, protocol: TCP, targetPort: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-ext-g6h7i
  namespace: default
  labels: {kubernetes.io/service-name: local-ext}
addressType: IPv4
ports: [{name: "", port: 80, protocol: TCP}]
endpoints:
- addresses: [10.244.2.10]
  conditions: {ready: true}
  nodeName: node-b
  targetRef: {kind: Pod, name: apache-6d4cf56db6-b2}
"#;

fn description() -> ClusterDescription {
    let mut description = example();
    let extra = ClusterDescription::from_yaml(EXTRA).unwrap();
    description.services.extend(extra.services);
    description.endpoint_slices.extend(extra.endpoint_slices);
    description
}

fn deployed(suite: Suite, test: &str) -> Option<Deployed> {
    let deployed = suite.deployed_with(test, description())?;
    // Replies to the VPC pod, whose address no node's pod CIDR holds, come back through node-a.
    for node in ["node-b", "node-c"] {
        sh(
            &deployed,
            node,
            &["ip", "route", "add", "10.250.1.0/24", "via", NODE_A],
        );
    }
    Some(deployed)
}

fn sh(deployed: &Deployed, node: &str, argv: &[&str]) -> String {
    let out = deployed.exec_in_node(node, argv).unwrap();
    assert!(
        out.status.success(),
        "{node}: {argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 44 item 1: the masquerade decision for a pod outside every cluster CIDR, as kube-proxy
/// makes it in each `--detect-local-mode`.
pub fn pods_outside_the_cluster_cidr_are_told_apart_by_bridge_and_interface_prefix(suite: Suite) {
    let Some(mut deployed) = deployed(
        suite,
        "pods_outside_the_cluster_cidr_are_told_apart_by_bridge_and_interface_prefix",
    ) else {
        return;
    };
    let apache = "10.96.0.80:80";
    let vpc = || Place::pod("vpc-pod");
    // ClusterCIDR (10.244.0.0/16): the VPC pod looks like an outside client, so it is masqueraded.
    must_pass(
        &deployed,
        Check::tcp(
            "ClusterCIDR: vpc pod",
            vpc(),
            apache,
            4,
            answered_from(&["apache"], NODE_A),
        ),
    );

    let mut config = deployed.config().clone();
    config.detect_local_mode = DetectLocalMode::InterfaceNamePrefix;
    config.detect_local_interface = Some("pv".into());
    deployed.reconfigure(config.clone()).unwrap();
    for (name, from, source) in [
        ("prefix pv: vpc pod keeps its address", vpc(), "10.250.1.5"),
        ("prefix pv: outside client masqueraded", Place::Client, NODE_A),
        ("prefix pv: the node masqueraded", Place::node("node-a"), NODE_A),
    ] {
        must_pass(
            &deployed,
            Check::tcp(name, from, apache, 4, answered_from(&["apache"], source)),
        );
    }

    // The bridge does not exist yet: the rules load anyway (matched by name) and match nothing.
    config.detect_local_mode = DetectLocalMode::BridgeInterface;
    config.detect_local_interface = Some("cbr0".into());
    deployed.reconfigure(config).unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "bridge missing: vpc pod masqueraded",
            vpc(),
            apache,
            4,
            answered_from(&["apache"], NODE_A),
        ),
    );
    // The CNI creates the bridge and puts the VPC pod's veth on it.
    let veth = deployed.lab.pod("vpc-pod").unwrap().node_veth.clone().unwrap();
    for argv in [
        vec!["ip", "link", "add", "cbr0", "type", "bridge"],
        vec!["ip", "link", "set", "cbr0", "up"],
        vec!["ip", "link", "set", &veth, "master", "cbr0"],
        vec!["ip", "route", "replace", "10.250.1.5/32", "dev", "cbr0"],
    ] {
        sh(&deployed, "node-a", &argv);
    }
    for (name, from, source) in [
        (
            "bridge cbr0: vpc pod on the bridge keeps its address",
            vpc(),
            "10.250.1.5",
        ),
        (
            "bridge cbr0: a pod off the bridge is masqueraded",
            Place::pod("web-1"),
            NODE_A,
        ),
        ("bridge cbr0: outside client masqueraded", Place::Client, NODE_A),
    ] {
        must_pass(
            &deployed,
            Check::tcp(name, from, apache, 4, answered_from(&["apache"], source)),
        );
    }
}

/// Issue 44 item 2: a connection to an unallocated address inside a ServiceCIDR is dropped on the node
/// it starts from and never reaches the network.
pub fn unallocated_service_addresses_are_dropped_on_the_node(suite: Suite) {
    let Some(mut deployed) = deployed(suite, "unallocated_service_addresses_are_dropped_on_the_node") else {
        return;
    };
    // The network routes the address to a real host (a static route for the Service range, or a
    // default route): without the drop, a mistyped ClusterIP leaves the node.
    sh(
        &deployed,
        "node-a",
        &["ip", "route", "replace", "10.96.99.99/32", "via", "192.168.10.13"],
    );
    let unallocated = "10.96.99.99:8099";
    let from = || Place::pod("web-1");
    must_pass(
        &deployed,
        Check::tcp(
            "without ServiceCIDRs it leaks",
            from(),
            unallocated,
            2,
            answered(&["trap"]),
        ),
    );

    let mut config = deployed.config().clone();
    config.service_cidrs = vec!["10.96.0.0/16".parse().unwrap(), "10.97.0.0/16".parse().unwrap()];
    deployed.reconfigure(config).unwrap();
    sh(&deployed, "node-c", &["conntrack", "-F"]);
    for (name, from) in [("from a pod", from()), ("from the node", Place::node("node-a"))] {
        must_pass(&deployed, Check::tcp(name, from, unallocated, 3, Expect::Dropped));
    }
    let seen = deployed
        .exec_in_node("node-c", &["conntrack", "-L", "-d", "10.96.99.99"])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&seen.stdout).trim().is_empty(),
        "node-c saw the dropped connections:\n{}",
        String::from_utf8_lossy(&seen.stdout)
    );
    // One rule (or set element) per range, not per address.
    let rules = match suite.backend {
        Backend::Nftables => sh(
            &deployed,
            "node-a",
            &["nft", "list", "chain", "ip", "switchyard", "cluster-ips-check"],
        ),
        _ => sh(&deployed, "node-a", &["iptables-save", "-t", "filter"]),
    };
    // nft merges adjacent ranges of an anonymous interval set into one element.
    let wanted: &[&str] = match suite.backend {
        Backend::Nftables => &["ip daddr { 10.96.0.0/15 } drop"],
        _ => &["-d 10.96.0.0/16", "-d 10.97.0.0/16"],
    };
    for want in wanted {
        assert!(rules.contains(want), "{want} not in:\n{rules}");
    }
    // Allocated ClusterIPs still work (the example's all lie in the first range; the second, empty
    // one is dropped whole).
    must_pass(
        &deployed,
        Check::tcp("a ClusterIP", from(), "10.96.0.80:80", 2, answered(&["apache"])),
    );
    must_pass(
        &deployed,
        Check::tcp(
            "another ClusterIP",
            from(),
            "10.96.97.97:80",
            2,
            answered(&["nginx-pod"]),
        ),
    );
}

/// Issue 44 item 3: NodePorts on a non-primary address (closed by default on nftables, open on
/// iptables, open on nftables one setting away), and an externalIP the policy refuses.
pub fn exposure_defaults_close_what_kube_proxy_closes(suite: Suite) {
    let Some(mut deployed) = deployed(suite, "exposure_defaults_close_what_kube_proxy_closes") else {
        return;
    };
    sh(
        &deployed,
        "node-a",
        &["ip", "addr", "add", "192.168.10.111/24", "dev", "eth0"],
    );
    let primary = format!("{NODE_A}:32701");
    let secondary = "192.168.10.111:32701";
    let gateway = || answered(&["nginx-gateway"]);
    must_pass(
        &deployed,
        Check::tcp(
            "NodePort on the primary address",
            Place::Client,
            &primary,
            2,
            gateway(),
        ),
    );
    let on_secondary = match suite.backend {
        // kube-proxy's nftables default, `primary`: nothing listens there, so the node resets.
        Backend::Nftables => Expect::Refused,
        _ => gateway(),
    };
    must_pass(
        &deployed,
        Check::tcp(
            "NodePort on a second address",
            Place::Client,
            secondary,
            2,
            on_secondary,
        ),
    );
    let mut config = deployed.config().clone();
    config.node_port_addresses = Some(Vec::new());
    deployed.reconfigure(config).unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "nodePortAddresses: [] serves every address",
            Place::Client,
            secondary,
            2,
            gateway(),
        ),
    );

    // Localhost NodePorts: off by default; opted in, served by iptables nodes only (kube-proxy's
    // nftables mode never has them).
    let localhost = "127.0.0.1:32701";
    let node_a = || Place::node("node-a");
    must_pass(
        &deployed,
        Check::tcp("localhost NodePort off", node_a(), localhost, 2, Expect::Refused),
    );
    let mut config = deployed.config().clone();
    config.localhost_node_ports = true;
    deployed.reconfigure(config).unwrap();
    let on_localhost = match suite.backend {
        Backend::Iptables => gateway(),
        _ => Expect::Refused,
    };
    must_pass(
        &deployed,
        Check::tcp(
            "localhost NodePort opted in",
            node_a(),
            localhost,
            2,
            on_localhost,
        ),
    );
    if suite.backend == Backend::Iptables {
        let route_localnet = sh(
            &deployed,
            "node-a",
            &["cat", "/proc/sys/net/ipv4/conf/all/route_localnet"],
        );
        assert_eq!(route_localnet.trim(), "1");
    }

    let legacy = "203.0.113.20:8080";
    must_pass(
        &deployed,
        Check::tcp(
            "externalIP allowed",
            Place::Client,
            legacy,
            2,
            answered(&["legacy-api"]),
        ),
    );
    let mut config = deployed.config().clone();
    config.external_ips = ExternalIpPolicy::AllowCidrs(vec!["198.51.100.0/24".parse().unwrap()]);
    deployed.reconfigure(config.clone()).unwrap();
    let outcome = checks::run(
        &deployed.lab,
        &Check::tcp("externalIP refused", Place::Client, legacy, 3, Expect::Dropped),
    )
    .unwrap();
    assert!(outcome.tally.answered.is_empty(), "{outcome}");
    must_pass(
        &deployed,
        Check::tcp(
            "its ClusterIP still served",
            Place::pod("web-1"),
            "10.96.0.90:8080",
            2,
            answered(&["legacy-api"]),
        ),
    );
    // The Service's problem: what the live controller publishes as its Warning Event.
    let snapshot = switchyard_controller::planner::Snapshot {
        services: deployed.description().services.clone(),
        slices: deployed.description().endpoint_slices.clone(),
        nodes: deployed.description().nodes.clone(),
    };
    let problems = switchyard_controller::planner::snapshot_problems(&snapshot, &config);
    assert!(
        problems
            .iter()
            .any(|p| p.service == "default/legacy-api" && p.reason == "ExternalIPNotAllowed"),
        "{problems:?}"
    );
}

/// kubernetes#131765: kube-proxy's nftables mode drops a pod's connection to the externalIP of an
/// eTP=Local Service on a node with no local endpoint; pods are short-circuited to every endpoint.
pub fn a_pod_reaches_an_etp_local_external_ip_without_a_local_endpoint(suite: Suite) {
    let Some(deployed) = deployed(
        suite,
        "a_pod_reaches_an_etp_local_external_ip_without_a_local_endpoint",
    ) else {
        return;
    };
    let to = "203.0.113.44:80";
    must_pass(
        &deployed,
        Check::tcp(
            "pod on node-a, no local endpoint: short-circuited, client kept",
            Place::pod("web-1"),
            to,
            4,
            answered_from(&["apache-6d4cf56db6-b2"], "10.244.1.40"),
        ),
    );
    must_pass(
        &deployed,
        Check::tcp(
            "outside client through node-a: dropped",
            Place::Client,
            to,
            2,
            Expect::Dropped,
        ),
    );
}

/// kubernetes#132516: stale rules of an older layout survive an upgrade and break a Service later.
/// Here the agent of node-a is stopped, an older Switchyard layout is written into its tables (a
/// per-endpoint chain sending apache's ClusterIP to a dead address, a set and a chain no current
/// layout has), and a new agent starts over it: none of it survives its first sync.
pub fn an_agent_started_over_an_older_layout_keeps_nothing_stale(suite: Suite) {
    let Some(mut deployed) = deployed(suite, "an_agent_started_over_an_older_layout_keeps_nothing_stale")
    else {
        return;
    };
    deployed.stop_agent("node-a");
    let stale_marker = match suite.backend {
        Backend::Nftables => {
            let script = "\
add chain ip switchyard service-OLDLAYOUT-default/apache/tcp/http
add rule ip switchyard service-OLDLAYOUT-default/apache/tcp/http meta l4proto tcp dnat to 10.244.9.9:80
add set ip switchyard old-endpoints { type ipv4_addr; }
add element ip switchyard old-endpoints { 10.244.9.9 }
insert rule ip switchyard services ip daddr 10.96.0.80 tcp dport 80 goto service-OLDLAYOUT-default/apache/tcp/http
";
            let path = std::env::temp_dir().join(format!("old-layout-{}.nft", std::process::id()));
            std::fs::write(&path, script).unwrap();
            sh(&deployed, "node-a", &["nft", "-f", path.to_str().unwrap()]);
            "OLDLAYOUT"
        }
        _ => {
            for argv in [
                vec!["iptables", "-t", "nat", "-N", "SWYD-SEP-OLDLAYOUT000000"],
                vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "SWYD-SEP-OLDLAYOUT000000",
                    "-p",
                    "tcp",
                    "-j",
                    "DNAT",
                    "--to-destination",
                    "10.244.9.9:80",
                ],
                vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-I",
                    "SWYD-SERVICES",
                    "1",
                    "-d",
                    "10.96.0.80/32",
                    "-p",
                    "tcp",
                    "--dport",
                    "80",
                    "-j",
                    "SWYD-SEP-OLDLAYOUT000000",
                ],
                vec!["iptables", "-t", "filter", "-N", "SWYD-OLD-FIREWALL"],
            ] {
                sh(&deployed, "node-a", &argv);
            }
            "OLD"
        }
    };
    // The old layout is live: apache's ClusterIP goes nowhere from node-a.
    let outcome = checks::run(
        &deployed.lab,
        &Check::tcp(
            "old layout",
            Place::pod("web-1"),
            "10.96.0.80:80",
            2,
            Expect::Dropped,
        ),
    )
    .unwrap();
    assert!(outcome.tally.answered.is_empty(), "{outcome}");
    // The old agent's status says Applied: only the new agent's own report counts.
    std::fs::remove_file(deployed.status_path("node-a")).unwrap();
    deployed.start_agent("node-a").unwrap();
    deployed
        .wait_applied(switchyard_e2e::deployed::APPLY_TIMEOUT)
        .unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "after the restart",
            Place::pod("web-1"),
            "10.96.0.80:80",
            6,
            answered(&["apache"]),
        ),
    );
    let dump = match suite.backend {
        Backend::Nftables => sh(&deployed, "node-a", &["nft", "list", "table", "ip", "switchyard"]),
        _ => sh(&deployed, "node-a", &["iptables-save"]),
    };
    assert!(!dump.contains(stale_marker), "stale rules survived:\n{dump}");
    assert!(!dump.contains("10.244.9.9"), "stale rules survived:\n{dump}");
}
