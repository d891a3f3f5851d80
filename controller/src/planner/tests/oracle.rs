//! The oracle: for random clusters and every node, composing the node's plan with its views' slices
//! gives exactly the per-node planner's entries; and re-planning changed Services one by one gives
//! exactly what a full rebuild gives, whatever the sequence of changes.
//!
//! Random clusters mix every input that makes a node differ from its view: Local policies (internal
//! and external), topology hints by zone and by node, terminating and not-ready endpoints, endpoints on
//! unknown nodes or none, nodes without a zone, and endpoint IPs reused across Services on other nodes
//! (a pod IP recycled while an old slice still lists it), which makes the derived `onNode` wrong unless
//! an override corrects it.

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proptest::prelude::*;

use super::config;
use crate::planner::{
    Planner, Snapshot,
    fixtures::{EndpointExt, ServiceExt, endpoint, node, service, slice},
};

/// A small deterministic generator (xorshift), so one proptest seed builds one whole cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const NODES: [(&str, Option<&str>); 5] = [
    ("node-a", Some("zone-a")),
    ("node-b", Some("zone-a")),
    ("node-c", Some("zone-b")),
    ("node-d", Some("zone-b")),
    ("node-e", None),
];

fn random_service(rng: &mut Rng, i: usize) -> (Service, EndpointSlice) {
    let name = format!("svc{i}");
    let local_internal = rng.chance(25);
    let local_external = rng.chance(25);
    let affinity = rng.chance(15);
    let svc = service("ns1", &name, &format!("10.96.0.{}", i + 1), |s| {
        s.port("http", 80, "TCP");
        if local_external {
            s.type_("NodePort").node_port("np", 8080, 30000 + i as i32);
            s.spec_mut().external_traffic_policy = Some("Local".into());
        }
        if local_internal {
            s.spec_mut().internal_traffic_policy = Some("Local".into());
        }
        if affinity {
            s.affinity(Some(60));
        }
    });
    let zone_hinted = rng.chance(30);
    let node_hinted = rng.chance(15);
    let count = rng.below(5);
    let mut endpoints = Vec::new();
    for j in 0..count {
        // Mostly per-Service IPs; sometimes an IP another Service uses too (on whatever node).
        let ip = if rng.chance(20) {
            format!("10.244.9.{}", rng.below(4) + 1)
        } else {
            format!("10.244.{}.{}", i + 10, j + 1)
        };
        let host = match rng.below(12) {
            0 => "",
            1 => "node-gone",
            n => NODES[(n % 5) as usize].0,
        };
        let mut ep = endpoint(&ip, host);
        match rng.below(6) {
            0 => ep = ep.conditions(false, true, true),
            1 => ep = ep.conditions(false, false, false),
            _ => {}
        }
        if zone_hinted {
            let zone = if rng.chance(50) { "zone-a" } else { "zone-b" };
            ep = ep.zone_hints(&[zone]);
        }
        if node_hinted {
            ep = ep.node_hints(&[NODES[rng.below(5) as usize].0]);
        }
        endpoints.push(ep);
    }
    let ports: &[(&str, i32, &str)] = &[("http", 8080, "TCP"), ("np", 8081, "TCP")];
    (svc, slice("ns1", &name, ports, endpoints))
}

fn random_cluster(seed: u64) -> (Snapshot, Rng) {
    let mut rng = Rng(seed | 1);
    let nodes = NODES
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < 2 || rng.chance(80))
        .map(|(i, (name, zone))| {
            node(
                name,
                &format!("192.168.10.{}", 11 + i),
                &format!("10.244.{}.0/24", i + 1),
                *zone,
            )
        })
        .collect();
    let mut snapshot = Snapshot {
        nodes,
        ..Snapshot::default()
    };
    for i in 0..(3 + rng.below(10) as usize) {
        let (svc, eps) = random_service(&mut rng, i);
        snapshot.services.push(svc);
        snapshot.slices.push(eps);
    }
    (snapshot, rng)
}

/// A byte budget below what any override fits in (the config file's minimum is 16 KiB; planner tests
/// may go lower to exercise node views with small clusters).
fn tiny() -> crate::Config {
    crate::Config {
        max_object_bytes: 4_200,
        ..config()
    }
}

fn assert_composition_is_exact(planner: &Planner) -> Result<(), TestCaseError> {
    for node in planner.node_names() {
        let composed = planner.composed(node).unwrap().map_err(TestCaseError::fail)?;
        prop_assert!(composed.conflicts.is_empty(), "{:?}", composed.conflicts);
        prop_assert_eq!(
            &composed.spec.services,
            &planner.oracle(node).unwrap(),
            "node {}",
            node
        );
        let plan = planner.node_plan(node).unwrap();
        prop_assert!(switchyard_api::validate::validate(&plan).plan.is_empty());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slices_plus_overrides_equal_the_per_node_planner(seed in any::<u64>()) {
        let (snapshot, _) = random_cluster(seed);
        let planner = Planner::build(&snapshot, &config()).unwrap();
        assert_composition_is_exact(&planner)?;
    }

    #[test]
    fn overrides_moved_into_node_views_compose_exactly_too(seed in any::<u64>()) {
        // A budget so small that every node with an override moves its overrides into its own view.
        let (snapshot, _) = random_cluster(seed);
        let planner = Planner::build(&snapshot, &tiny()).unwrap();
        assert_composition_is_exact(&planner)?;
        for node in planner.overflowing_nodes() {
            let plan = planner.node_plan(node).unwrap();
            prop_assert!(plan.overrides.is_empty());
            prop_assert_eq!(plan.views.len(), 3);
        }
    }

    #[test]
    fn incremental_replanning_equals_a_full_rebuild(seed in any::<u64>(), small in any::<bool>()) {
        let config = if small { tiny() } else { config() };
        let (mut snapshot, mut rng) = random_cluster(seed);
        let mut planner = Planner::build(&snapshot, &config).unwrap();
        for _ in 0..8 {
            let i = rng.below(snapshot.services.len() as u64 + 2) as usize;
            let key = format!("ns1/svc{i}");
            if i < snapshot.services.len() && rng.chance(20) {
                snapshot.services.remove(i);
                snapshot.slices.remove(i);
                // Keep indexes and names aligned: rename nothing, just re-plan the deleted key.
                planner.replan_service(&key, None, &[]).unwrap();
                // Put a fresh one back so later steps still find svc<i> at index i.
                let (svc, eps) = random_service(&mut rng, i);
                snapshot.services.insert(i, svc.clone());
                snapshot.slices.insert(i, eps.clone());
                planner.replan_service(&key, Some(&svc), &[&eps]).unwrap();
            } else if i < snapshot.services.len() {
                let (svc, eps) = random_service(&mut rng, i);
                snapshot.services[i] = svc.clone();
                snapshot.slices[i] = eps.clone();
                planner.replan_service(&key, Some(&svc), &[&eps]).unwrap();
            } else {
                let i = snapshot.services.len();
                let (svc, eps) = random_service(&mut rng, i);
                snapshot.services.push(svc.clone());
                snapshot.slices.push(eps.clone());
                planner.replan_service(&format!("ns1/svc{i}"), Some(&svc), &[&eps]).unwrap();
            }
            assert_composition_is_exact(&planner)?;
            super::assert_same_as_rebuild(&planner, &snapshot, &config);
            if rng.chance(30) {
                // Fold one shadowed packed slice, as the live controller does once it is quiet.
                let shadowed = planner.shadowed();
                if let Some((name, _)) = shadowed.first() {
                    let name = name.clone();
                    planner.fold(&[name]).unwrap();
                    assert_composition_is_exact(&planner)?;
                }
            }
        }
    }
}

#[test]
fn a_recycled_pod_ip_gets_an_override_where_the_derived_on_node_would_be_wrong() {
    // 10.244.9.1 runs on node-a for svc-new, while svc-old's stale slice still puts it on node-b.
    let old = service("ns1", "old", "10.96.0.1", |s| {
        s.port("http", 80, "TCP");
    });
    let new = service("ns1", "new", "10.96.0.2", |s| {
        s.port("http", 80, "TCP");
    });
    let snapshot = Snapshot {
        services: vec![old, new],
        slices: vec![
            slice(
                "ns1",
                "old",
                &[("http", 8080, "TCP")],
                vec![endpoint("10.244.9.1", "node-b")],
            ),
            slice(
                "ns1",
                "new",
                &[("http", 8080, "TCP")],
                vec![endpoint("10.244.9.1", "node-a")],
            ),
        ],
        nodes: super::super::fixtures::three_nodes(),
    };
    let planner = Planner::build(&snapshot, &config()).unwrap();
    for node in ["node-a", "node-b", "node-c"] {
        let composed = planner.composed(node).unwrap().unwrap();
        assert_eq!(composed.spec.services, planner.oracle(node).unwrap(), "{node}");
    }
    let a = planner.node_plan("node-a").unwrap();
    assert_eq!(a.endpoints_on_node, ["10.244.9.1"]);
    assert_eq!(a.overrides.len(), 1, "old's entry: the IP is not on node-a there");
    assert_eq!(a.overrides[0].name, "ns1/old:http");

    // The same with the override moved into node-a's own view: its onNode flags must survive.
    let planner = Planner::build(&snapshot, &tiny()).unwrap();
    assert!(planner.overflowing_nodes().any(|n| n == "node-a"));
    let composed = planner.composed("node-a").unwrap().unwrap();
    assert_eq!(composed.spec.services, planner.oracle("node-a").unwrap());
}

#[test]
fn only_answers_the_view_cannot_derive_are_kept_per_node() {
    // A plain Service's hosting nodes differ from their zone's answer only in onNode (derived from the
    // slot's hosts); an eTP=Local Service's hosting nodes also have Local endpoints: kept.
    let plain = service("ns1", "plain", "10.96.0.1", |s| {
        s.port("http", 80, "TCP");
    });
    let local = service("ns1", "local", "10.96.0.2", |s| {
        s.type_("NodePort").node_port("http", 80, 30080);
        s.spec_mut().external_traffic_policy = Some("Local".into());
    });
    let endpoints = || vec![endpoint("10.244.1.5", "node-a"), endpoint("10.244.2.5", "node-b")];
    let snapshot = Snapshot {
        services: vec![plain, local],
        slices: vec![
            slice("ns1", "plain", &[("http", 8080, "TCP")], endpoints()),
            slice("ns1", "local", &[("http", 8080, "TCP")], endpoints()),
        ],
        nodes: super::super::fixtures::three_nodes(),
    };
    let planner = Planner::build(&snapshot, &config()).unwrap();
    let kept = |service: &str| {
        let mut nodes: Vec<&str> = planner
            .slots
            .values()
            .filter(|slot| slot.service_key == service)
            .flat_map(|slot| slot.special.keys().map(String::as_str))
            .collect();
        nodes.sort_unstable();
        nodes
    };
    assert_eq!(kept("ns1/plain"), Vec::<&str>::new());
    assert_eq!(kept("ns1/local"), ["node-a", "node-b"]);
    for node in ["node-a", "node-b", "node-c"] {
        let composed = planner.composed(node).unwrap().unwrap();
        assert_eq!(composed.spec.services, planner.oracle(node).unwrap(), "{node}");
        let on_node: Vec<&str> = composed
            .spec
            .services
            .iter()
            .filter(|e| e.name.starts_with("ns1/plain"))
            .flat_map(|e| {
                e.endpoints
                    .iter()
                    .filter(|ep| ep.on_node)
                    .map(|ep| ep.ip.as_str())
            })
            .collect();
        let want: &[&str] = match node {
            "node-a" => &["10.244.1.5"],
            "node-b" => &["10.244.2.5"],
            _ => &[],
        };
        assert_eq!(on_node, want, "{node}: the derived onNode flags");
    }
}
