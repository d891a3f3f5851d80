//! Sharding: above the byte budget a node's plan splits into shards assigned by Service hash; every
//! shard carries its own revision and the primary lists them; a change to one Service rewrites one shard
//! plus the primary.

use switchyard_api::{NodeForwardingPlanSpec, revision};

use crate::{
    config::Config,
    planner::{
        Planner, Snapshot,
        fixtures::{ServiceExt, endpoint, service, slice, three_nodes},
    },
};

fn big_cluster(services: usize, changed: Option<usize>) -> Snapshot {
    let mut svcs = Vec::new();
    let mut slices = Vec::new();
    for i in 0..services {
        let name = format!("svc-{i:04}");
        svcs.push(service(
            "ns1",
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
            |s| {
                s.port("http", 80, "TCP");
            },
        ));
        let last = if changed == Some(i) { 250 } else { 9 };
        let eps = (1..=5)
            .map(|j| {
                endpoint(
                    &format!("10.244.{}.{}", j % 3 + 1, if j == 5 { last } else { j }),
                    "node-z",
                )
            })
            .collect();
        slices.push(slice("ns1", &name, &[("http", 8080, "TCP")], eps));
    }
    Snapshot {
        services: svcs,
        slices,
        nodes: three_nodes(),
    }
}

fn objects(snapshot: &Snapshot, budget: usize) -> Vec<NodeForwardingPlanSpec> {
    let config = Config {
        max_plan_bytes: budget,
        ..Config::default()
    };
    Planner::build(snapshot, &config)
        .unwrap()
        .node_plan("node-a")
        .unwrap()
        .objects
}

#[test]
fn small_plans_are_one_object_without_shard_info() {
    let objs = objects(&big_cluster(10, None), 1 << 20);
    assert_eq!(objs.len(), 1);
    assert!(objs[0].shard.is_none());
}

#[test]
fn plans_above_the_budget_are_sharded_consistently() {
    let snapshot = big_cluster(600, None);
    let whole = objects(&snapshot, 1 << 20);
    let shards = objects(&snapshot, 64 * 1024);
    assert!(shards.len() >= 4, "expected several shards, got {}", shards.len());
    assert!(shards.len().is_power_of_two());
    // Every shard fits, carries its index, and its revision is its own content hash.
    for (i, spec) in shards.iter().enumerate() {
        let bytes = serde_json::to_vec(spec).unwrap().len();
        assert!(bytes <= 64 * 1024, "shard {i} is {bytes} bytes");
        let info = spec.shard.as_ref().unwrap();
        assert_eq!((info.index as usize, info.count as usize), (i, shards.len()));
        assert_eq!(spec.revision, revision::compute(spec).unwrap());
    }
    // The primary lists the others' revisions and node totals.
    let members: Vec<String> = shards[1..].iter().map(|s| s.revision.clone()).collect();
    assert_eq!(shards[0].shard.as_ref().unwrap().members, members);
    assert_eq!(shards[0].summary, whole[0].summary);
    // Together the shards hold exactly the unsharded plan's entries.
    let mut union: Vec<_> = shards.iter().flat_map(|s| s.services.clone()).collect();
    union.sort_by(|a, b| a.key().cmp(&b.key()));
    assert_eq!(union, whole[0].services);
    // All ports of a Service live in one shard.
    for spec in &shards[1..] {
        assert!(!spec.services.is_empty());
    }
}

#[test]
fn one_service_change_rewrites_one_shard_and_the_primary() {
    let before = objects(&big_cluster(600, None), 64 * 1024);
    let after = objects(&big_cluster(600, Some(123)), 64 * 1024);
    assert_eq!(before.len(), after.len());
    let changed: Vec<usize> = (0..before.len()).filter(|&i| before[i] != after[i]).collect();
    let holder = after
        .iter()
        .position(|s| s.services.iter().any(|e| e.name == "ns1/svc-0123:http"))
        .unwrap();
    let mut want = vec![0, holder];
    want.dedup();
    assert_eq!(changed, want);
}

#[test]
fn a_2000_service_node_fits_one_object() {
    let mut snapshot = big_cluster(2000, None);
    for s in &mut snapshot.slices {
        s.endpoints.as_mut().unwrap().truncate(3);
    }
    let objs = objects(&snapshot, 1 << 20);
    assert_eq!(objs.len(), 1);
    let bytes = serde_json::to_vec(&objs[0]).unwrap().len();
    assert!(
        bytes < 700 * 1024,
        "2,000 services × 3 endpoints took {bytes} bytes"
    );
}

#[test]
fn replanning_a_sharded_plan_matches_a_full_rebuild() {
    let config = Config {
        max_plan_bytes: 64 * 1024,
        ..Config::default()
    };
    let before = big_cluster(600, None);
    let after = big_cluster(600, Some(123));
    let mut planner = Planner::build(&before, &config).unwrap();
    let index = 123;
    let (changed, _) = planner
        .replan_service(
            "ns1/svc-0123",
            Some(&after.services[index]),
            &[&after.slices[index]],
        )
        .unwrap();
    assert_eq!(changed, vec!["node-a", "node-b", "node-c"]);
    let fresh = Planner::build(&after, &config).unwrap();
    assert_eq!(planner.all_plans(), fresh.all_plans());
}

fn with_huge_service(mut snapshot: Snapshot) -> Snapshot {
    // One Service with 2,000 endpoints: ~100 KB on its own, over the 64 KiB budget whatever the count.
    snapshot.services.push(service("ns1", "huge", "10.96.200.1", |s| {
        s.port("http", 80, "TCP");
    }));
    let eps = (0..2000)
        .map(|i| endpoint(&format!("10.245.{}.{}", i / 250, i % 250 + 1), "node-z"))
        .collect();
    snapshot
        .slices
        .push(slice("ns1", "huge", &[("http", 8080, "TCP")], eps));
    snapshot
}

#[test]
fn replanning_next_to_an_oversized_service_matches_a_full_rebuild() {
    let config = Config {
        max_plan_bytes: 64 * 1024,
        ..Config::default()
    };
    let before = with_huge_service(big_cluster(300, None));
    let after = with_huge_service(big_cluster(300, Some(42)));
    let mut planner = Planner::build(&before, &config).unwrap();
    planner
        .replan_service("ns1/svc-0042", Some(&after.services[42]), &[&after.slices[42]])
        .unwrap();
    let fresh = Planner::build(&after, &config).unwrap();
    assert_eq!(planner.all_plans(), fresh.all_plans());
}

#[test]
fn a_service_bigger_than_any_object_does_not_multiply_the_shards() {
    let snapshot = with_huge_service(big_cluster(300, None));
    let shards = objects(&snapshot, 64 * 1024);
    assert!(
        shards.len() <= 16,
        "the oversized Service must not push the count to the maximum: {} shards",
        shards.len()
    );
    let mut oversized = 0;
    for spec in &shards {
        let bytes = serde_json::to_vec(spec).unwrap().len();
        if spec.services.iter().any(|e| e.name == "ns1/huge:http") {
            oversized += 1;
        } else {
            assert!(
                bytes <= 64 * 1024,
                "shard without the huge Service is {bytes} bytes"
            );
        }
    }
    assert_eq!(oversized, 1, "the huge Service sits in one shard");
}
