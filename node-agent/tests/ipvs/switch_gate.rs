//! The switch gate on the agent's own selector and syncer: the fixture plan keeps every verdict across
//! the three backends, and a switch whose verdicts differ (IPVS weights) changes nothing in the kernel,
//! says why in the status and is counted, until the plan no longer differs.

use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::backend::select::{Candidate, Factory, Selector};
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::nftables::dataplane::NftablesDataplane;
use switchyard_agent::nftables::fake::FakeNft;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::dataplane::Dataplane;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, SyncResult, Syncer};
use switchyard_agent::verify::SwitchGate;
use switchyard_agent::wiring::dataplane::switch_gate;
use switchyard_api::conditions::{DEGRADED, reasons, status};
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, finish, plan};
use switchyard_api::{Backend, NodeForwardingPlanSpec};

use crate::fixtures::{everything, local_addrs};
use crate::kernel::{Kernel, real, tcp};

#[test]
fn the_fixture_plan_gets_the_same_verdicts_from_every_backend() {
    let spec = everything();
    let skip = switchyard_api::validate::validate(&spec).bad_entries();
    let mut gate = SwitchGate::default();
    let backends = [Backend::Iptables, Backend::Nftables, Backend::Ipvs];
    for from in backends {
        for to in backends.into_iter().filter(|to| *to != from) {
            if let Err(refused) = gate.check(&spec, &skip, from, to) {
                panic!("{from} → {to}: {refused}");
            }
        }
    }
}

/// The agent's selector with its gate: iptables, IPVS (replacing iptables' chains) and nftables.
fn selector(kernel: &Kernel, nft: &FakeNft) -> Selector {
    let on = kernel.clone();
    let ipvs: Factory = Box::new(move || Ok(Box::new(on.dataplane()) as Box<dyn Dataplane>));
    let nft = nft.clone();
    let nftables: Factory = Box::new(move || {
        Ok(Box::new(NftablesDataplane::new(nft.clone(), FixedAddrs(local_addrs()))) as Box<dyn Dataplane>)
    });
    Selector::new(
        Box::new(IptablesDataplane::new(
            kernel.iptables.clone(),
            FixedAddrs(local_addrs()),
            HostFacts::default(),
        )),
        vec![
            Candidate {
                backend: Backend::Ipvs,
                title: "IPVS",
                factory: ipvs,
                leftovers: None,
                replaces: &[Backend::Iptables],
            },
            Candidate {
                backend: Backend::Nftables,
                title: "nftables",
                factory: nftables,
                leftovers: None,
                replaces: &[],
            },
        ],
    )
    .with_gate(switch_gate())
}

/// A weighted Service (3:1) beside a plain one, asking for `backend`.
fn weighted(backend: Backend, weights: bool) -> Arc<NodeForwardingPlanSpec> {
    let heavy = if weights {
        ep("10.244.2.1", 8080).weight(3)
    } else {
        ep("10.244.2.1", 8080)
    };
    let mut spec = plan(
        "node-a",
        vec![
            entry("ns/plain:http", "10.96.0.1", 80).with(ep("10.244.2.1", 8080)),
            entry("ns/weighted:http", "10.96.0.2", 80)
                .with(heavy)
                .with(ep("10.244.3.1", 8080))
                .node_port(30080),
        ],
    );
    spec.backend = backend;
    finish(&mut spec);
    Arc::new(spec)
}

#[test]
fn a_switch_that_would_change_a_verdict_is_refused_before_anything_changes() {
    let kernel = Kernel::new();
    let nft = FakeNft::new();
    let metrics = SyncMetrics::default();
    let mut syncer = Syncer::new(
        Box::new(selector(&kernel, &nft)),
        kernel.clock.clone(),
        SyncConfig::default(),
        metrics.clone(),
    );
    assert!(matches!(
        syncer.sync_plan(&weighted(Backend::Ipvs, true)),
        SyncResult::Applied { .. }
    ));
    let table = kernel.ipvs.table();
    assert_eq!(kernel.weights(tcp("10.96.0.2", 80))[&real("10.244.2.1", 8080)], 3);

    let asked = weighted(Backend::Nftables, true);
    for _ in 0..2 {
        assert!(matches!(syncer.sync_plan(&asked), SyncResult::Applied { .. }));
    }
    assert!(
        !nft.has_table(switchyard_api::IpFamily::IPv4),
        "nftables untouched"
    );
    assert_eq!(kernel.ipvs.table(), table, "IPVS unchanged");
    let s = syncer.status();
    assert_eq!(s.backend, Some(Backend::Ipvs));
    assert_eq!(s.observed_revision.as_deref(), Some(asked.revision.as_str()));
    let why = s.backend_reason.clone().unwrap();
    assert!(why.starts_with("switching to nftables would forward"), "{why}");
    assert!(why.contains("(ns/weighted)"), "{why}");
    assert!(
        why.contains("ns/weighted:http 10.96.0.2:80/tcp: ipvs forwards to 10.244.2.1:8080 75.0%"),
        "{why}"
    );
    assert!(!why.contains("ns/plain"), "{why}");
    let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(
        (
            degraded.status.as_str(),
            degraded.reason.as_str(),
            degraded.message.as_str()
        ),
        (status::TRUE, reasons::BACKEND_SWITCH_REFUSED, why.as_str())
    );
    assert_eq!(
        metrics.backend_switches_refused.get(),
        1,
        "one refusal, however many syncs"
    );

    // Without the weights the verdicts agree: the switch happens, make before break.
    assert!(matches!(
        syncer.sync_plan(&weighted(Backend::Nftables, false)),
        SyncResult::Applied { .. }
    ));
    let s = syncer.status();
    assert_eq!(s.backend, Some(Backend::Nftables));
    assert_eq!(s.backend_reason, None);
    let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(degraded.reason, reasons::HEALTHY);
    assert!(nft.has_table(switchyard_api::IpFamily::IPv4));
    assert!(kernel.ipvs.table().is_empty(), "no IPVS virtual server left");
}
