//! The partial sync against the full render: after every change of a long random walk over the fixture
//! plan, the kernel a chain of partial syncs built must equal the one a full render builds from nothing.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::nftables::diff::diff;
use switchyard_agent::nftables::fake::FakeNft;
use switchyard_agent::nftables::kernel::Nft;
use switchyard_agent::nftables::{NftablesDataplane, render};
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{FakeClock, SyncConfig, SyncMetrics, SyncResult, Syncer};
use switchyard_api::testing::{EndpointExt, ep, finish};
use switchyard_api::validate::validate;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, ServicePlan, SyncMode, TrafficPolicy};

use crate::fixtures::everything;

/// A small deterministic generator (no dependency, same walk every run).
struct Walk(u64);

impl Walk {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % below.max(1)
    }
}

fn mutate(
    spec: &mut NodeForwardingPlanSpec,
    removed: &mut Vec<std::sync::Arc<ServicePlan>>,
    walk: &mut Walk,
    step: usize,
) {
    let n = spec.services.len();
    let i = walk.next(n);
    let v4 = spec.services[i].family == IpFamily::IPv4;
    let subnet = |k: usize| {
        if v4 {
            format!("10.244.{}.{}", 2 + k % 2, 100 + k % 150)
        } else {
            format!("fd00:10:244:2::{:x}", 0x100 + k)
        }
    };
    let entry = std::sync::Arc::make_mut(&mut spec.services[i]);
    match walk.next(10) {
        0 if !entry.endpoints.is_empty() => {
            let j = walk.next(entry.endpoints.len());
            entry.endpoints[j].ip = subnet(step);
        }
        1 if entry.endpoints.len() > 1 => {
            entry.endpoints.remove(walk.next(entry.endpoints.len()));
        }
        2 => {
            let mut new = ep(&subnet(step), 80);
            if walk.next(3) == 0 {
                new = new.on_node();
            }
            entry.endpoints.push(new);
            entry.endpoints.sort();
            entry.has_endpoints = true;
        }
        3 => {
            entry.affinity_timeout_seconds = match entry.affinity_timeout_seconds {
                Some(_) => None,
                None => Some(60 + walk.next(100) as u32),
            };
        }
        4 if entry.externally_accessible() => {
            entry.external_policy = match entry.external_policy {
                TrafficPolicy::Local => TrafficPolicy::Cluster,
                TrafficPolicy::Cluster => TrafficPolicy::Local,
            };
        }
        5 if n > 4 => removed.push(spec.services.remove(i)),
        6 if !removed.is_empty() => {
            let back = removed.remove(walk.next(removed.len()));
            if !spec.services.iter().any(|e| e.key() == back.key()) {
                spec.services.push(back);
            }
        }
        7 => entry.node_port = Some(30100 + (step % 50) as u16),
        8 if v4 => {
            if entry.external_ips.is_empty() {
                entry.external_ips.push(format!("203.0.113.{}", 150 + step % 50));
            } else {
                entry.external_ips.clear();
            }
        }
        9 => {
            entry.endpoints.clear();
            entry.has_endpoints = false;
        }
        _ => entry.port = 1 + (step % 1000) as u16,
    }
    finish(spec);
}

/// The kernel a full render builds from nothing, as the fake reads it back.
fn reference(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    family: IpFamily,
) -> Option<switchyard_agent::nftables::TableState> {
    let mut nft = FakeNft::new();
    let desired = render(spec, &HostFacts::default(), family, skip);
    nft.apply(&diff(None, &desired)).unwrap();
    nft.read(family).unwrap()
}

#[test]
fn partial_syncs_build_the_same_kernel_as_a_full_render() {
    let nft = FakeNft::new();
    let mut syncer = Syncer::new(
        Box::new(NftablesDataplane::new(nft.clone(), FixedAddrs::default())),
        Arc::new(FakeClock::at_2026()),
        SyncConfig::default(),
        SyncMetrics::default(),
    );
    let mut spec = everything();
    let mut removed = Vec::new();
    let mut walk = Walk(7);
    let mut partial = 0;
    for step in 0..300 {
        if step > 0 {
            mutate(&mut spec, &mut removed, &mut walk, step);
        }
        match syncer.sync_plan(&Arc::new(spec.clone())) {
            SyncResult::Applied { mode, .. } => partial += usize::from(mode == SyncMode::Partial),
            other => panic!("step {step}: {other:?}"),
        }
        let skip = validate(&spec).bad_entries();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let mut kernel = nft.clone();
            let have = kernel.read(family).unwrap();
            let want = reference(&spec, &skip, family);
            assert_eq!(
                have, want,
                "step {step}, {family:?}: the partial syncs diverged from a full render"
            );
        }
    }
    assert!(partial > 250, "most steps must be partial syncs, got {partial}");
}
