//! Properties over random valid plans: the payload is self-consistent (every jump lands on a chain
//! that exists, names fit iptables), the kernel model accepts it, and the ClusterIP of every entry
//! leads exactly to the endpoints its policy selects.

use std::collections::{BTreeSet, HashSet};

use proptest::prelude::*;
use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::{names, render};
use switchyard_agent::xtables::{Packet, Tracer, Verdict};
use switchyard_api::testing::{finish, plan};
use switchyard_api::validate::validate;
use switchyard_api::{IpFamily, PlanEndpoint, Protocol, ServicePlan, TrafficPolicy};

use crate::fixtures::{ip, local_addrs};

const TARGETS: [&str; 7] = ["ACCEPT", "DROP", "REJECT", "RETURN", "DNAT", "MASQUERADE", "MARK"];

fn addr(family: IpFamily, v4: String, v6: String) -> String {
    if family == IpFamily::IPv4 { v4 } else { v6 }
}

prop_compose! {
    fn arb_endpoint()(host in 1u8..6, node in 1u8..4, port in prop::sample::select(vec![80u16, 8080]),
                      cluster in any::<bool>(), local in any::<bool>(), terminating in any::<bool>())
                      -> (u8, u8, u16, bool, bool, bool) {
        (host, node, port, cluster, local, terminating)
    }
}

prop_compose! {
    fn arb_entry()(protocol in prop::sample::select(vec![Protocol::TCP, Protocol::UDP, Protocol::SCTP]),
                   v6 in any::<bool>(),
                   port in prop::sample::select(vec![53u16, 80, 443]),
                   node_port in any::<bool>(),
                   external_ips in 0usize..3,
                   lb_ips in 0usize..3,
                   ranges in prop::sample::subsequence(vec![0usize, 1, 2], 0..=3),
                   affinity in prop::option::of(1u32..86400),
                   etp_local in any::<bool>(),
                   itp_local in any::<bool>(),
                   hc in any::<bool>(),
                   has_endpoints in any::<bool>(),
                   endpoints in prop::collection::vec(arb_endpoint(), 0..5))
                   -> ServicePlan {
        let family = if v6 { IpFamily::IPv6 } else { IpFamily::IPv4 };
        let mut entry = switchyard_api::testing::entry("ns/placeholder", "10.96.0.1", port);
        entry.protocol = protocol;
        entry.family = family;
        entry.external_ips = (0..external_ips)
            .map(|i| addr(family, format!("203.0.113.{}", 100 + i), format!("2001:db8:113::{:x}", 0x100 + i)))
            .collect();
        entry.load_balancer_ips = (0..lb_ips)
            .map(|i| addr(family, format!("203.0.113.{}", 200 + i), format!("2001:db8:113::{:x}", 0x200 + i)))
            .collect();
        entry.source_ranges = ranges
            .iter()
            .map(|r| match r {
                // The third range holds the node IP.
                0 => addr(family, "198.51.100.0/25".into(), "2001:db8:100::/64".into()),
                1 => addr(family, "10.244.0.0/16".into(), "fd00:10:244::/56".into()),
                _ => addr(family, "192.168.10.0/24".into(), "fd00:192:168:10::/64".into()),
            })
            .collect();
        entry.affinity_timeout_seconds = affinity;
        entry.internal_policy = if itp_local { TrafficPolicy::Local } else { TrafficPolicy::Cluster };
        if node_port {
            entry.node_port = Some(30000);
        }
        if etp_local && entry.externally_accessible() {
            entry.external_policy = TrafficPolicy::Local;
            entry.health_check_node_port = hc.then_some(32000);
        }
        let mut seen = HashSet::new();
        for (host, node, port, cluster, local, terminating) in endpoints {
            if !seen.insert((host, node)) {
                continue;
            }
            let ip = addr(family, format!("10.244.{node}.{host}"), format!("fd00:10:244:{node}::{host}"));
            // Node 1 is this node; only its endpoints may be in the Local set.
            let on_node = node == 1;
            entry.endpoints.push(PlanEndpoint {
                ip, port, cluster: cluster && has_endpoints, local: local && on_node && has_endpoints, on_node,
                terminating, weight: None,
            });
        }
        entry.endpoints.sort();
        entry.has_endpoints = has_endpoints || entry.endpoints.iter().any(|e| e.cluster || e.local);
        let uses_cluster = !itp_local || entry.externally_accessible();
        if entry.has_endpoints && uses_cluster && !entry.endpoints.iter().any(|e| e.cluster) {
            if entry.endpoints.is_empty() {
                entry.endpoints.push(PlanEndpoint {
                    ip: addr(family, "10.244.2.99".into(), "fd00:10:244:2::99".into()),
                    port: 80, cluster: true, local: false, on_node: false, terminating: false, weight: None,
                });
            }
            entry.endpoints[0].cluster = true;
        }
        entry
    }
}

prop_compose! {
    fn arb_plan()(entries in prop::collection::vec(arb_entry(), 1..7),
                  masquerade_all in any::<bool>(), detector in any::<bool>())
                  -> switchyard_api::NodeForwardingPlanSpec {
        let services = entries
            .into_iter()
            .enumerate()
            .map(|(i, mut e)| {
                // Distinct names, ClusterIPs and NodePorts so traces of different entries never meet.
                e.name = format!("ns{i}/svc{i}:p{}", e.port);
                e.cluster_ip = addr(e.family, format!("10.96.0.{}", i + 1), format!("fd00:10:96::{:x}", i + 1));
                e.node_port = e.node_port.map(|p| p + i as u16);
                e.health_check_node_port = e.health_check_node_port.map(|p| p + i as u16);
                e
            })
            .collect();
        let mut spec = plan("node-a", services);
        spec.node_ips.push("fd00:192:168:10::11".into());
        spec.cluster.masquerade_all = masquerade_all;
        if detector {
            spec.cluster.local_traffic_cidrs.push("fd00:10:244::/56".into());
        } else {
            spec.cluster.local_traffic_cidrs.clear();
        }
        finish(&mut spec);
        spec
    }
}

/// Jumps to missing chains and over-long names, found by reading the payload text directly.
fn payload_problems(payload: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for table in payload.split('*').filter(|t| !t.is_empty()) {
        let declared: HashSet<&str> = table
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for name in &declared {
            if name.len() > names::MAX_CHAIN_LEN {
                problems.push(format!("chain name too long: {name}"));
            }
        }
        for line in table.lines().filter(|l| l.starts_with("-A ")) {
            let chain = line.split(' ').nth(1).unwrap_or_default();
            if !declared.contains(chain) {
                problems.push(format!("rule for undeclared chain: {line}"));
            }
            if let Some(target) = line.split(" -j ").nth(1).and_then(|t| t.split(' ').next())
                && !TARGETS.contains(&target)
                && !declared.contains(target)
            {
                problems.push(format!("jump to missing chain: {line}"));
            }
        }
    }
    problems
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_plans_render_consistent_payloads(spec in arb_plan(), random_fully in any::<bool>(),
                                               liberal in any::<bool>(), listed_node_ports in any::<bool>()) {
        let report = validate(&spec);
        prop_assert!(report.is_clean(), "generator made an invalid plan: {:?}", report);
        let mut spec = spec;
        if listed_node_ports {
            // Every local address listed, one NodePort rule each, rather than `--dst-type LOCAL`.
            spec.cluster.node_port_addresses =
                ["0.0.0.0/1", "128.0.0.0/1", "::/1", "8000::/1"].map(String::from).to_vec();
        }
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let facts = HostFacts { random_fully, tcp_be_liberal: liberal, local_addrs: local_addrs() };
            let ruleset = render(&spec, &facts, family, &HashSet::new());
            let payload = ruleset.full_payload();
            let problems = payload_problems(&payload);
            prop_assert!(problems.is_empty(), "{problems:#?}\n{payload}");
            for chains in ruleset.chains().values() {
                prop_assert!(chains.iter().all(|c| c.len() <= names::MAX_CHAIN_LEN));
            }

            // The kernel model accepts it, and a pod reaching each ClusterIP gets what the policy says.
            let tracer = Tracer::from_ruleset(&ruleset, &local_addrs());
            prop_assert!(tracer.is_ok(), "{:?}\n{payload}", tracer.err());
            let tracer = tracer.unwrap();
            let pod = ip(if family == IpFamily::IPv4 { "10.244.1.200" } else { "fd00:10:244:1::200" });
            for entry in spec.services.iter().filter(|e| e.family == family) {
                let internal_local = entry.internal_policy == TrafficPolicy::Local;
                let chosen: BTreeSet<Verdict> = entry
                    .endpoints
                    .iter()
                    .filter(|e| if internal_local { e.local } else { e.cluster })
                    .map(|e| Verdict::Dnat(names::join_host_port(&e.ip, e.port).parse().unwrap()))
                    .collect();
                let want = if !entry.has_endpoints {
                    BTreeSet::from([Verdict::Reject])
                } else if chosen.is_empty() {
                    BTreeSet::from([Verdict::Drop])
                } else {
                    chosen
                };
                let packet = Packet::new(pod, entry.protocol, ip(&entry.cluster_ip), entry.port);
                let trace = tracer.trace(&packet).unwrap();
                prop_assert_eq!(trace.verdicts(), want, "{}\n{}", entry.name, trace.explain());
                let total: f64 = trace.branches.iter().map(|b| b.probability).sum();
                prop_assert!((total - 1.0).abs() < 1e-9, "probabilities sum to {}", total);
            }
        }
    }
}

/// What happens to one entry between two syncs.
#[derive(Debug, Clone, Copy)]
enum Change {
    Keep,
    /// Its first endpoint replaced by another address (a rolling update's step).
    ReplaceEndpoint,
    /// Its first endpoint moves onto or off this node (its SEP chain appears or goes).
    MoveEndpoint,
    /// Every endpoint gone (its frontends change to REJECT).
    Drain,
    /// Deleted.
    Remove,
}

fn arb_change() -> impl Strategy<Value = Change> {
    prop::sample::select(vec![
        Change::Keep,
        Change::Keep,
        Change::ReplaceEndpoint,
        Change::MoveEndpoint,
        Change::Drain,
        Change::Remove,
    ])
}

/// `old` with `changes` applied entry by entry, and `added` appended under a fresh name.
fn changed(
    old: &switchyard_api::NodeForwardingPlanSpec,
    changes: &[Change],
    added: Option<ServicePlan>,
) -> switchyard_api::NodeForwardingPlanSpec {
    let mut new = old.clone();
    new.services.clear();
    for (entry, change) in old
        .services
        .iter()
        .zip(changes.iter().chain(std::iter::repeat(&Change::Keep)))
    {
        let mut entry = entry.clone();
        let e = std::sync::Arc::make_mut(&mut entry);
        match change {
            Change::Keep => {}
            Change::ReplaceEndpoint => {
                if let Some(ep) = e.endpoints.first_mut() {
                    ep.ip = addr(e.family, "10.244.2.77".into(), "fd00:10:244:2::77".into());
                    e.endpoints.sort();
                }
            }
            Change::MoveEndpoint => {
                if let Some(ep) = e.endpoints.first_mut() {
                    ep.on_node = !ep.on_node;
                    ep.local &= ep.on_node;
                }
            }
            Change::Drain => {
                e.endpoints.clear();
                e.has_endpoints = false;
            }
            Change::Remove => continue,
        }
        new.services.push(entry);
    }
    if let Some(mut extra) = added {
        extra.name = "ns-new/svc-new:p1".into();
        extra.cluster_ip = addr(extra.family, "10.96.0.99".into(), "fd00:10:96::99".into());
        extra.node_port = extra.node_port.map(|_| 30099);
        extra.health_check_node_port = extra.health_check_node_port.map(|_| 32099);
        new.services.push(std::sync::Arc::new(extra));
    }
    finish(&mut new);
    new
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A partial sync on top of any plan leaves the kernel (the tracer's model) and the agent's model
    /// exactly as a full sync of the new plan would, whichever way its top-level chains are found
    /// unchanged or rewritten.
    #[test]
    fn a_partial_sync_equals_a_full_sync_of_the_new_plan(
        old in arb_plan(),
        changes in prop::collection::vec(arb_change(), 7),
        added in prop::option::of(arb_entry()),
    ) {
        use switchyard_agent::iptables::stream::{PayloadJob, StreamMode};
        let new = changed(&old, &changes, added);
        prop_assert!(validate(&new).is_clean(), "{:?}", validate(&new));
        let facts = HostFacts::default();
        let none = HashSet::new();
        let empty = BTreeSet::new();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let full = |spec| PayloadJob {
                spec,
                facts: &facts,
                family,
                skip: &none,
                mode: StreamMode::Full {
                    existing: &empty,
                    existing_filter: &empty,
                },
                jumps: &[],
            };
            let (old_text, old_streamed) = full(&old).to_text().unwrap();
            let unchanged = |_: usize, entry: &std::sync::Arc<ServicePlan>| old.services.contains(entry);
            let partial = PayloadJob {
                mode: StreamMode::Partial { previous: &old_streamed.programmed, unchanged: &unchanged },
                ..full(&new)
            };
            let (partial_text, partial_streamed) = partial.to_text().unwrap();
            let (fresh_text, fresh_streamed) = full(&new).to_text().unwrap();

            let mut kernel = Tracer::new(family, &local_addrs()).unwrap();
            kernel.restore(&old_text).unwrap();
            let applied = kernel.restore(&partial_text);
            prop_assert!(applied.is_ok(), "{:?}\n{partial_text}", applied.err());
            let mut want = Tracer::new(family, &local_addrs()).unwrap();
            want.restore(&fresh_text).unwrap();
            prop_assert_eq!(kernel.dump(), want.dump(), "partial payload:\n{}", partial_text);
            prop_assert_eq!(&partial_streamed.programmed, &fresh_streamed.programmed);
        }
    }
}
