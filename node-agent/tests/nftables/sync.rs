//! The nftables dataplane under the syncer, against the fake kernel: full at start, partial syncs that
//! change only elements, restarts that change nothing, drift seen and repaired, failed transactions that
//! keep the old table, backend status.

use std::sync::Arc;
use std::time::Duration;

use switchyard_agent::nftables::fake::FakeNft;
use switchyard_agent::nftables::transaction::Op;
use switchyard_agent::nftables::{Key, NftablesDataplane, Value};
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{FakeClock, SyncConfig, SyncMetrics, SyncResult, Syncer};
use switchyard_api::conditions::{APPLIED, reasons, status};
use switchyard_api::testing::finish;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, Protocol, SyncMode};

use crate::fixtures::{everything, ip, local_addrs};

struct Harness {
    nft: FakeNft,
    syncer: Syncer,
    clock: Arc<FakeClock>,
}

impl Harness {
    fn new() -> Self {
        Self::with(FakeNft::new())
    }

    /// An agent starting on a host whose kernel is `nft`.
    fn with(nft: FakeNft) -> Self {
        let clock = Arc::new(FakeClock::at_2026());
        let dataplane = NftablesDataplane::new(nft.clone(), FixedAddrs(local_addrs()));
        let syncer = Syncer::new(
            Box::new(dataplane),
            clock.clone(),
            SyncConfig::default(),
            SyncMetrics::default(),
        );
        Self { nft, syncer, clock }
    }

    fn sync(&mut self, spec: &NodeForwardingPlanSpec) -> SyncResult {
        self.syncer.sync_plan(&Arc::new(spec.clone()))
    }
}

fn spec() -> NodeForwardingPlanSpec {
    let mut spec = everything();
    spec.backend = Backend::Nftables;
    finish(&mut spec);
    spec
}

fn mode(result: &SyncResult) -> SyncMode {
    match result {
        SyncResult::Applied { mode, .. } => *mode,
        other => panic!("not applied: {other:?}"),
    }
}

fn edit(
    spec: &NodeForwardingPlanSpec,
    name: &str,
    change: impl FnOnce(&mut switchyard_api::ServicePlan),
) -> NodeForwardingPlanSpec {
    let mut spec = spec.clone();
    let entry = spec
        .services
        .iter_mut()
        .find(|e| e.name == name && e.family == IpFamily::IPv4)
        .unwrap();
    change(std::sync::Arc::make_mut(entry));
    finish(&mut spec);
    spec
}

#[test]
fn the_first_sync_is_full_and_the_status_names_nftables() {
    let mut h = Harness::new();
    let spec = spec();
    assert_eq!(mode(&h.sync(&spec)), SyncMode::Full);
    assert!(h.nft.has_table(IpFamily::IPv4) && h.nft.has_table(IpFamily::IPv6));
    assert_eq!(h.nft.reads(), 2, "one read-back per family");
    let s = h.syncer.status();
    assert_eq!(s.backend, Some(Backend::Nftables));
    assert_eq!(s.backend_reason, None);
    let applied = s.conditions.iter().find(|c| c.type_ == APPLIED).unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        (status::TRUE, reasons::SYNCED)
    );
    assert!(s.rules.unwrap() > 100, "rules plus elements: {s:?}");

    // The same plan again: nothing to do, no transaction at all.
    let transactions = h.nft.applied().len();
    assert_eq!(mode(&h.sync(&spec)), SyncMode::Partial);
    assert_eq!(h.nft.applied().len(), transactions);
}

#[test]
fn an_endpoint_change_of_a_plain_service_changes_one_element() {
    let mut h = Harness::new();
    let before = spec();
    h.sync(&before);
    let reads = h.nft.reads();
    let after = edit(&before, "ns2/nodeport:p80", |e| {
        e.endpoints[1].ip = "10.244.3.99".into()
    });
    assert_eq!(mode(&h.sync(&after)), SyncMode::Partial);
    assert_eq!(h.nft.reads(), reads, "a partial sync reads nothing back");
    let tx = h.nft.applied().pop().unwrap();
    // ClusterIP, externalIP and NodePort each: the slot of the replaced endpoint, deleted then added.
    assert_eq!(tx.element_changes(), 6, "{}", tx.text());
    assert_eq!(tx.chain_changes(), 0, "{}", tx.text());
    let np = h.nft.elements(IpFamily::IPv4, "fast-np-2-eps").unwrap();
    assert_eq!(
        np.get(&Key::PortSlot(Protocol::TCP, 30080, 1)),
        Some(&Value::Endpoint(ip("10.244.3.99"), 80))
    );
}

#[test]
fn scaling_moves_a_frontend_between_classes_and_drops_empty_classes() {
    let mut h = Harness::new();
    let before = spec();
    h.sync(&before);
    assert!(h.nft.set_names(IpFamily::IPv4).contains(&"fast-3".to_string()));
    // ns1/multi is the only 3-endpoint service: down to 2, its class goes.
    let after = edit(&before, "ns1/multi:p80", |e| {
        e.endpoints.pop();
    });
    assert_eq!(mode(&h.sync(&after)), SyncMode::Partial);
    let sets = h.nft.set_names(IpFamily::IPv4);
    assert!(
        !sets.contains(&"fast-3".to_string()) && !sets.contains(&"fast-3-eps".to_string()),
        "{sets:?}"
    );
    let two = h.nft.elements(IpFamily::IPv4, "fast-2").unwrap();
    assert!(two.contains_key(&Key::Frontend(ip("10.96.0.1"), Protocol::TCP, 80)));
    let services = h.nft.rules(IpFamily::IPv4, "services").unwrap();
    assert!(!services.iter().any(|r| r.contains("@fast-3")), "{services:?}");
}

#[test]
fn a_complex_service_change_rewrites_only_its_chains() {
    let mut h = Harness::new();
    let before = spec();
    h.sync(&before);
    let after = edit(&before, "ns4/local:p80", |e| {
        e.endpoints[1].ip = "10.244.2.99".into()
    });
    assert_eq!(mode(&h.sync(&after)), SyncMode::Partial);
    let tx = h.nft.applied().pop().unwrap();
    let flushed: Vec<&String> = tx
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::FlushChain(name) => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(flushed.len(), 1, "{}", tx.text());
    assert!(
        flushed[0].starts_with("service-") && flushed[0].ends_with("-ns4/local/tcp/p80"),
        "{flushed:?}"
    );
}

#[test]
fn a_restarted_agent_reads_the_table_back_and_changes_nothing() {
    let mut first = Harness::new();
    let spec = spec();
    first.sync(&spec);
    let transactions = first.nft.applied().len();
    let mut restarted = Harness::with(first.nft.clone());
    assert_eq!(mode(&restarted.sync(&spec)), SyncMode::Full);
    assert_eq!(
        restarted.nft.applied().len(),
        transactions,
        "no transaction: the kernel matched"
    );
    // A plan that changed while the agent was down: only the difference is written.
    let changed = edit(&spec, "ns2/nodeport:p80", |e| {
        e.endpoints[0].ip = "10.244.2.77".into()
    });
    let mut again = Harness::with(first.nft.clone());
    assert_eq!(mode(&again.sync(&changed)), SyncMode::Full);
    let tx = again.nft.applied().pop().unwrap();
    assert!(
        !tx.ops
            .iter()
            .any(|op| matches!(op, Op::DeleteTable | Op::FlushChain(_))),
        "{}",
        tx.text()
    );
    assert_eq!(tx.element_changes(), 6, "{}", tx.text());
}

#[test]
fn drift_is_seen_by_the_cheap_check_and_repaired() {
    let mut h = Harness::new();
    let spec = spec();
    h.sync(&spec);
    assert_eq!(h.syncer.check_drift(), None);

    h.nft.delete_element(
        IpFamily::IPv4,
        "fast-2",
        &Key::Frontend(ip("10.96.0.2"), Protocol::TCP, 80),
    );
    let repaired = h.syncer.check_drift().expect("drift");
    assert_eq!(mode(&repaired), SyncMode::Full);
    assert_eq!(h.syncer.status().drift_repairs, 1);
    assert!(
        h.nft
            .elements(IpFamily::IPv4, "fast-2")
            .unwrap()
            .contains_key(&Key::Frontend(ip("10.96.0.2"), Protocol::TCP, 80))
    );

    h.nft.flush_chain(IpFamily::IPv4, "services");
    assert!(h.syncer.check_drift().is_some());
    assert_eq!(h.syncer.status().drift_repairs, 2);
    assert_eq!(h.syncer.check_drift(), None);

    // The whole table gone (nft flush ruleset): the next partial sync notices and syncs in full.
    h.nft.delete_table(IpFamily::IPv4);
    let next = edit(&spec, "ns2/nodeport:p80", |e| {
        e.endpoints[0].ip = "10.244.2.77".into()
    });
    match h.sync(&next) {
        SyncResult::Applied { mode, drift, .. } => {
            assert_eq!(mode, SyncMode::Full);
            assert!(drift.unwrap().contains("gone"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.syncer.status().drift_repairs, 3);
    assert!(h.nft.has_table(IpFamily::IPv4));
}

#[test]
fn a_failed_transaction_keeps_the_table_and_is_retried_in_full() {
    let mut h = Harness::new();
    let spec = spec();
    h.sync(&spec);
    let before = h.nft.elements(IpFamily::IPv4, "fast-np-2-eps").unwrap();
    let next = edit(&spec, "ns2/nodeport:p80", |e| {
        e.endpoints[0].ip = "10.244.2.77".into()
    });
    h.nft.fail_next_apply("injected");
    match h.sync(&next) {
        SyncResult::Failed { message } => assert!(message.contains("injected"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.nft.elements(IpFamily::IPv4, "fast-np-2-eps").unwrap(), before);
    let applied = h.syncer.status();
    let condition = applied.conditions.iter().find(|c| c.type_ == APPLIED).unwrap();
    assert_eq!(condition.reason, reasons::APPLY_FAILED);
    h.clock.advance(Duration::from_secs(2));
    assert!(h.syncer.retry_due());
    let reads = h.nft.reads();
    assert_eq!(mode(&h.sync(&next)), SyncMode::Full);
    assert!(h.nft.reads() > reads, "the retry reads the kernel back");
    assert_ne!(h.nft.elements(IpFamily::IPv4, "fast-np-2-eps").unwrap(), before);
}

#[test]
fn cleanup_deletes_both_tables() {
    let mut h = Harness::new();
    h.sync(&spec());
    let cleanup = h.syncer.cleanup().unwrap();
    assert!(cleanup.objects > 20, "{cleanup:?}");
    assert!(!h.nft.has_table(IpFamily::IPv4) && !h.nft.has_table(IpFamily::IPv6));
    // Idempotent.
    assert_eq!(h.syncer.cleanup().unwrap().objects, 0);
}

#[test]
fn a_contested_frontend_falls_back_to_a_full_sync_with_the_first_entry_winning() {
    let mut h = Harness::new();
    let mut spec = spec();
    // Two services claim the same externalIP and port (a user error iptables resolves by rule order).
    let mut twin = spec
        .services
        .iter()
        .find(|e| e.name == "ns2/nodeport:p80")
        .map(|e| switchyard_api::ServicePlan::clone(e))
        .unwrap();
    twin.name = "ns2/twin:p80".into();
    twin.cluster_ip = "10.96.0.222".into();
    twin.node_port = None;
    twin.endpoints[0].ip = "10.244.2.222".into();
    spec.services.push(twin.into());
    finish(&mut spec);
    h.sync(&spec);
    let winner = |h: &Harness| {
        h.nft
            .elements(IpFamily::IPv4, "fast-2-eps")
            .unwrap()
            .get(&Key::FrontendSlot(ip("203.0.113.10"), Protocol::TCP, 80, 0))
            .cloned()
    };
    assert_eq!(
        winner(&h),
        Some(Value::Endpoint(ip("10.244.2.6"), 80)),
        "ns2/nodeport sorts first"
    );
    // The winner goes: the twin takes the frontend over, which only a full render knows.
    spec.services.retain(|e| e.name != "ns2/nodeport:p80");
    finish(&mut spec);
    assert_eq!(mode(&h.sync(&spec)), SyncMode::Full);
    assert_eq!(winner(&h), Some(Value::Endpoint(ip("10.244.2.222"), 80)));
}
