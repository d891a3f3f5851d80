//! `switchyard-agent explain` from the plan, for every flow of the demo's traffic checks: the words are a
//! golden snapshot, and the outcome must be what the real packets of the same check show (forwarded,
//! refused, dropped), so the explanation and the data plane cannot drift apart unnoticed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use switchyard_agent::explain::{Destination, Outcome, Source, explain};
use switchyard_api::{NodeForwardingPlanSpec, Protocol};
use switchyard_controller::{Config, planner::Planner, planner::Snapshot};
use switchyard_e2e::checks::Expect;
use switchyard_e2e::demo::example_checks;
use switchyard_e2e::{ClusterDescription, LabOptions, Layout, Place, Proto};

const CLIENT: &str = "192.168.10.200";

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Each node's plan composed with its views' slices: what its agent forwards.
fn composed_plans(description: &ClusterDescription) -> Vec<(String, NodeForwardingPlanSpec)> {
    let config = Config::load(&repo("examples/controller-config.yaml")).unwrap();
    let snapshot = Snapshot {
        services: description.services.clone(),
        slices: description.endpoint_slices.clone(),
        nodes: description.nodes.clone(),
    };
    let planner = Planner::build(&snapshot, &config).unwrap();
    planner
        .node_names()
        .map(|node| {
            let composed = planner.composed(node).unwrap().unwrap();
            (node.to_string(), composed.spec)
        })
        .collect()
}

#[test]
fn every_demo_flow_is_explained_as_its_packets_go() {
    let description = ClusterDescription::from_file(&repo("examples/cluster.yaml")).unwrap();
    let layout = Layout::plan("explain", &description, &LabOptions::with_binary("/bin/false")).unwrap();
    let plans = composed_plans(&description);
    let mut golden = String::new();
    for check in example_checks() {
        // Where the connection meets Switchyard: a pod's or a node's own node; the client reaches node
        // IPs directly and every other address through node-a (its route, as in the lab).
        let (node, source) = match &check.from {
            Place::Pod(name) => {
                let pod = layout.pod(name).unwrap();
                (pod.node.clone(), Source::Address(pod.ip.into()))
            }
            Place::Node(name) => (name.clone(), Source::Node),
            Place::Client => {
                let owner = layout
                    .nodes
                    .iter()
                    .find(|n| std::net::IpAddr::V4(n.ip) == check.to.ip());
                let node = owner.map_or("node-a".to_string(), |n| n.name.clone());
                (node, Source::Address(CLIENT.parse().unwrap()))
            }
            Place::Fabric | Place::Balancer => continue,
        };
        let protocol = match check.proto {
            Proto::Tcp => Protocol::TCP,
            Proto::Udp => Protocol::UDP,
        };
        let spec = &plans.iter().find(|(n, _)| *n == node).unwrap().1;
        let (explanation, _, _) =
            explain(spec, &Destination::Address(check.to, protocol), source, None).unwrap();
        let agrees = matches!(
            (&check.expect, &explanation.outcome),
            (Expect::Refused, Outcome::Rejected)
                | (Expect::Dropped, Outcome::Dropped)
                | (
                    Expect::Answered { .. } | Expect::Sticky { .. },
                    Outcome::Forwarded { .. }
                )
        );
        assert!(
            agrees,
            "{}: packets {:?}, explain:\n{}",
            check.name,
            check.expect,
            explanation.text()
        );
        golden.push_str(&format!(
            "## {}\n$ explain --to {} --from {:?} (on {node})\n{}\n",
            check.name,
            check.to,
            source,
            explanation.text()
        ));
    }
    // Flows the demo's checks do not probe: a client and a pod the source ranges deny, a pod reaching an
    // eTP=Local NodePort on a node without endpoints (the policy is for outside clients only), a
    // Service by name, and an address no Service has.
    type Flow = (&'static str, &'static str, &'static str, fn(&Outcome) -> bool);
    let extra: [Flow; 5] = [
        ("node-a", "203.0.113.10:80", "198.51.100.7", |o| {
            *o == Outcome::Dropped
        }),
        ("node-c", "203.0.113.10:80", "10.244.3.30", |o| {
            *o == Outcome::Dropped
        }),
        ("node-c", "192.168.10.13:30080", "10.244.3.30", |o| {
            matches!(o, Outcome::Forwarded { .. })
        }),
        ("node-b", "default/web-lb:http", "node", |o| {
            matches!(o, Outcome::Forwarded { .. })
        }),
        ("node-a", "10.96.9.9:80", "10.244.1.10", |o| {
            *o == Outcome::NotAService
        }),
    ];
    for (node, to, from, want) in extra {
        let spec = &plans.iter().find(|(n, _)| n == node).unwrap().1;
        let (explanation, _, _) = explain(spec, &to.parse().unwrap(), from.parse().unwrap(), None).unwrap();
        assert!(
            want(&explanation.outcome),
            "{to} from {from}:\n{}",
            explanation.text()
        );
        golden.push_str(&format!(
            "## {to} from {from} (on {node})\n{}\n",
            explanation.text()
        ));
    }
    insta::assert_snapshot!(golden);
}
