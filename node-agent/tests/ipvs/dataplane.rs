//! The IPVS dataplane against the in-memory kernel: what a sync leaves in the kernel, that it changes
//! only what differs (also after a restart), graceful removal, per-virtual-server failures, drift
//! repair and cleanup.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::iptables::names;
use switchyard_agent::ipvs::glue::IPVS_FILTER;
use switchyard_agent::ipvs::kernel::{Destination, Service};
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::dataplane::Dataplane;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, SyncResult, Syncer};
use switchyard_agent::xtables::Table;
use switchyard_agent::xtables::kernel::Iptables;
use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, status};
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, finish, plan};
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, Protocol, SyncMode};

use crate::fixtures::{NODE_IP, everything, ip};
use crate::kernel::{GRACE, Kernel, real, sync, tcp, udp};

/// Three services: rr ClusterIP with two endpoints, a NodePort with eTP=Local, a UDP one.
fn small() -> NodeForwardingPlanSpec {
    let mut spec = plan(
        "node-a",
        vec![
            entry("ns/web:http", "10.96.0.1", 80)
                .with(ep("10.244.1.5", 8080).local())
                .with(ep("10.244.2.5", 8080)),
            entry("ns/np:http", "10.96.0.2", 80)
                .node_port(30080)
                .etp_local()
                .with(ep("10.244.1.6", 80).local())
                .with(ep("10.244.2.6", 80)),
            entry("ns/dns:dns", "10.96.0.10", 53)
                .protocol(Protocol::UDP)
                .with(ep("10.244.2.53", 53))
                .with(ep("10.244.3.53", 53)),
        ],
    );
    spec.backend = Backend::Ipvs;
    spec.cluster.node_port_addresses = vec!["primary".into()];
    finish(&mut spec);
    spec
}

fn weights(pairs: &[(&str, u16, u32)]) -> BTreeMap<switchyard_agent::ipvs::kernel::RealKey, u32> {
    pairs.iter().map(|(a, p, w)| (real(a, *p), *w)).collect()
}

#[test]
fn the_first_sync_programs_virtual_servers_addresses_sets_glue_and_sysctls() {
    let kernel = Kernel::new();
    let mut dataplane = kernel.dataplane();
    let outcome = sync(&mut dataplane, &small(), false);
    assert_eq!(outcome.mode, SyncMode::Full);
    let table = kernel.ipvs.table();
    assert_eq!(
        table.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            tcp("10.96.0.1", 80),
            tcp("10.96.0.2", 80),
            tcp(NODE_IP, 30080),
            udp("10.96.0.10", 53)
        ])
    );
    assert_eq!(
        kernel.weights(tcp("10.96.0.1", 80)),
        weights(&[("10.244.1.5", 8080, 1), ("10.244.2.5", 8080, 1)])
    );
    // eTP=Local: the NodePort has only the local endpoint; the ClusterIP has both.
    assert_eq!(
        kernel.weights(tcp(NODE_IP, 30080)),
        weights(&[("10.244.1.6", 80, 1)])
    );
    assert_eq!(kernel.weights(tcp("10.96.0.2", 80)).len(), 2);
    let (service, _) = &table[&tcp("10.96.0.1", 80)];
    assert_eq!(service.scheduler, "rr");
    assert_eq!(outcome.rules, 4 + 2 + 2 + 1 + 2);
    assert_eq!(
        kernel.addresses(),
        BTreeSet::from([ip("10.96.0.1"), ip("10.96.0.2"), ip("10.96.0.10")])
    );
    assert!(
        kernel
            .ipsets
            .members("SWYD-NODE-PORT-LOCAL")
            .contains("192.168.10.11,tcp:30080")
    );
    assert!(
        kernel
            .ipsets
            .members("SWYD-CLUSTER-IP")
            .contains("10.96.0.10,udp:53")
    );
    assert!(
        kernel
            .ipsets
            .members("SWYD-LOOP-BACK")
            .contains("10.244.1.5,tcp:8080,10.244.1.5")
    );
    let input = kernel
        .iptables
        .rules(IpFamily::IPv4, Table::Filter, "INPUT")
        .unwrap();
    assert!(
        input.iter().any(|r| r.ends_with(&format!("-j {IPVS_FILTER}"))),
        "{input:?}"
    );
    assert_eq!(
        kernel
            .iptables
            .rules(IpFamily::IPv4, Table::Nat, names::SERVICES)
            .unwrap()
            .len(),
        6
    );
    let sysctls = kernel.sysctls.values();
    assert_eq!(
        sysctls.get("net/ipv4/vs/conntrack").map(String::as_str),
        Some("1")
    );
    assert!(
        !sysctls.contains_key("net/ipv4/vs/conn_reuse_mode"),
        "6.1 keeps the default"
    );
    assert!(dataplane.check_drift().unwrap().is_none());
}

#[test]
fn syncs_change_only_what_differs_and_a_restart_rebuilds_nothing() {
    let kernel = Kernel::new();
    let mut dataplane = kernel.dataplane();
    let spec = small();
    sync(&mut dataplane, &spec, false);
    let changes = kernel.ipvs.changes();
    let restores = kernel.iptables.restores();

    // The same plan again: nothing to do, not even the glue.
    let outcome = sync(&mut dataplane, &spec, false);
    assert_eq!(
        (outcome.mode, outcome.written, outcome.removed),
        (SyncMode::Partial, 0, 0)
    );
    assert_eq!(kernel.ipvs.changes(), changes);
    assert_eq!(kernel.iptables.restores(), restores);
    assert!(kernel.ipsets.batches().iter().rev().take(2).all(String::is_empty));

    // One endpoint more on one service: one real server added, nothing else.
    let mut next = spec.clone();
    for entry in &mut next.services {
        if entry.name == "ns/web:http" {
            *entry = switchyard_api::ServicePlan::clone(entry)
                .with(ep("10.244.3.5", 8080))
                .into();
        }
    }
    finish(&mut next);
    let outcome = sync(&mut dataplane, &next, false);
    assert_eq!((outcome.mode, outcome.written), (SyncMode::Partial, 1));
    assert_eq!(kernel.weights(tcp("10.96.0.1", 80)).len(), 3);
    assert_eq!(kernel.ipvs.changes(), changes + 1, "one real server added");

    // A restarted agent (no model) reads the kernel and finds nothing to change.
    let changes = kernel.ipvs.changes();
    let mut restarted = kernel.dataplane();
    let outcome = sync(&mut restarted, &next, false);
    assert_eq!(outcome.mode, SyncMode::Full);
    assert_eq!(outcome.written, 0);
    assert_eq!(
        kernel.ipvs.changes(),
        changes,
        "a restart must not rebuild the IPVS table"
    );
}

#[test]
fn removed_services_and_addresses_go_and_foreign_virtual_servers_stay() {
    let kernel = Kernel::new();
    let foreign = Service::new(tcp("192.0.2.1", 80), "rr", None);
    kernel.ipvs.insert(foreign, &[]);
    let mut dataplane = kernel.dataplane();
    let spec = small();
    sync(&mut dataplane, &spec, false);
    let mut next = spec.clone();
    next.services.retain(|s| s.name != "ns/np:http");
    finish(&mut next);
    let outcome = sync(&mut dataplane, &next, false);
    assert_eq!(
        outcome.removed, 2,
        "the ClusterIP and the NodePort virtual server"
    );
    let keys: BTreeSet<_> = kernel.ipvs.table().keys().copied().collect();
    assert!(!keys.contains(&tcp(NODE_IP, 30080)));
    assert!(keys.contains(&tcp("192.0.2.1", 80)), "not ours");
    assert!(!kernel.addresses().contains(&ip("10.96.0.2")));
    assert!(kernel.ipsets.members("SWYD-NODE-PORT-LOCAL").is_empty());

    // A full sync of a fresh agent also finds a stale NodePort virtual server through the sets.
    let mut restarted = kernel.dataplane();
    sync(&mut restarted, &spec, false);
    let mut fresh = kernel.dataplane();
    sync(&mut fresh, &next, true);
    assert!(!kernel.ipvs.table().contains_key(&tcp(NODE_IP, 30080)));
    assert!(kernel.ipvs.table().contains_key(&tcp("192.0.2.1", 80)));
}

/// The Service still lists the endpoint (terminating) but no longer uses it.
fn terminating(entry: &mut switchyard_api::ServicePlan, ip: &str) {
    for ep in entry.endpoints.iter_mut().filter(|e| e.ip == ip) {
        ep.terminating = true;
        ep.cluster = false;
        ep.local = false;
    }
}

#[test]
fn tcp_real_servers_drain_before_they_go_and_udp_ones_go_at_once() {
    let kernel = Kernel::new();
    let mut dataplane = kernel.dataplane();
    let spec = small();
    sync(&mut dataplane, &spec, false);
    let web = tcp("10.96.0.1", 80);
    let leaving = real("10.244.2.5", 8080);
    assert!(kernel.ipvs.set_connections(&web, &leaving, 2, 0));

    let mut next = spec.clone();
    for entry in &mut next.services {
        let entry = std::sync::Arc::make_mut(entry);
        terminating(entry, "10.244.2.5");
        entry.endpoints.retain(|e| e.ip != "10.244.3.53");
    }
    finish(&mut next);
    sync(&mut dataplane, &next, false);
    assert_eq!(
        kernel.weights(web),
        weights(&[("10.244.1.5", 8080, 1), ("10.244.2.5", 8080, 0)]),
        "busy: weight 0, kept"
    );
    assert_eq!(
        kernel.weights(udp("10.96.0.10", 53)).len(),
        1,
        "UDP: deleted at once"
    );
    // A drain in progress is not drift, and checks before the grace period keep it.
    kernel.clock.advance(Duration::from_secs(10));
    assert!(dataplane.check_drift().unwrap().is_none());
    assert_eq!(kernel.weights(web).len(), 2);
    // Idle: the next check deletes it.
    kernel.ipvs.set_connections(&web, &leaving, 0, 3);
    assert!(dataplane.check_drift().unwrap().is_none());
    assert_eq!(kernel.weights(web), weights(&[("10.244.1.5", 8080, 1)]));

    // Busy forever: deleted when the grace period is over.
    sync(&mut dataplane, &spec, false);
    assert!(kernel.ipvs.set_connections(&web, &leaving, 5, 0));
    sync(&mut dataplane, &next, false);
    kernel.clock.advance(GRACE - Duration::from_secs(1));
    dataplane.check_drift().unwrap();
    assert_eq!(kernel.weights(web).len(), 2);
    kernel.clock.advance(Duration::from_secs(1));
    dataplane.check_drift().unwrap();
    assert_eq!(kernel.weights(web).len(), 1);

    // Coming back while draining: weight 1 again.
    assert!(kernel.ipvs.set_connections(&web, &real("10.244.1.5", 8080), 1, 0));
    let mut only_remote = next.clone();
    for entry in &mut only_remote.services {
        if entry.name == "ns/web:http" {
            let entry = std::sync::Arc::make_mut(entry);
            entry.endpoints = vec![ep("10.244.1.5", 8080), ep("10.244.2.5", 8080)];
            terminating(entry, "10.244.1.5");
        }
    }
    finish(&mut only_remote);
    sync(&mut dataplane, &only_remote, false);
    assert_eq!(
        kernel.weights(web),
        weights(&[("10.244.1.5", 8080, 0), ("10.244.2.5", 8080, 1)])
    );
    sync(&mut dataplane, &next, false);
    assert_eq!(kernel.weights(web), weights(&[("10.244.1.5", 8080, 1)]));

    // Removed from the Service (not terminating): busy or not, deleted at once (issue 23) ...
    sync(&mut dataplane, &spec, false);
    assert!(kernel.ipvs.set_connections(&web, &leaving, 3, 0));
    let mut removed = spec.clone();
    for entry in &mut removed.services {
        std::sync::Arc::make_mut(entry)
            .endpoints
            .retain(|e| e.ip != "10.244.2.5");
    }
    finish(&mut removed);
    sync(&mut dataplane, &removed, false);
    assert_eq!(kernel.weights(web), weights(&[("10.244.1.5", 8080, 1)]));
    // ... unless the Service keeps connections.
    sync(&mut dataplane, &spec, false);
    assert!(kernel.ipvs.set_connections(&web, &leaving, 3, 0));
    for entry in &mut removed.services {
        std::sync::Arc::make_mut(entry).keep_connections = true;
    }
    finish(&mut removed);
    sync(&mut dataplane, &removed, false);
    assert_eq!(
        kernel.weights(web),
        weights(&[("10.244.1.5", 8080, 1), ("10.244.2.5", 8080, 0)])
    );
}

fn syncer(kernel: &Kernel) -> Syncer {
    Syncer::new(
        Box::new(kernel.dataplane()),
        kernel.clock.clone(),
        SyncConfig::default(),
        SyncMetrics::default(),
    )
}

fn condition(status: &switchyard_api::NodeForwardingPlanStatus, type_: &str) -> (String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone())
}

#[test]
fn a_virtual_server_the_kernel_refuses_is_reported_for_its_entry_and_retried() {
    let kernel = Kernel::new();
    let mut syncer = syncer(&kernel);
    let mut spec = small();
    for entry in &mut spec.services {
        if entry.name == "ns/dns:dns" {
            std::sync::Arc::make_mut(entry).scheduler = Some("mh".into());
        }
    }
    finish(&mut spec);
    kernel.ipvs.set_scheduler_available("mh", false);
    let result = syncer.sync_plan(&Arc::new(spec.clone()));
    assert!(matches!(result, SyncResult::Applied { .. }), "{result:?}");
    let s = syncer.status();
    assert_eq!(s.backend, Some(Backend::Ipvs));
    assert_eq!(s.failures.len(), 1);
    assert_eq!(s.failures[0].service, "ns/dns:dns UDP IPv4");
    assert!(
        s.failures[0].reason.contains("udp 10.96.0.10:53"),
        "{}",
        s.failures[0].reason
    );
    assert_eq!(
        condition(&s, APPLIED),
        (status::TRUE.into(), reasons::PARTIALLY_APPLIED.into())
    );
    assert_eq!(
        kernel.ipvs.table().len(),
        3,
        "the other virtual servers are programmed"
    );

    // The module appears: the drift check retries, the failure clears.
    kernel.ipvs.set_scheduler_available("mh", true);
    let repair = syncer.check_drift().unwrap();
    assert!(matches!(repair, SyncResult::Applied { .. }), "{repair:?}");
    let s = syncer.status();
    assert!(s.failures.is_empty(), "{:?}", s.failures);
    assert_eq!(kernel.ipvs.table()[&udp("10.96.0.10", 53)].0.scheduler, "mh");
    assert_eq!(
        condition(&s, DEGRADED),
        (status::FALSE.into(), reasons::HEALTHY.into())
    );
}

#[test]
fn drift_in_any_kernel_object_is_found_and_repaired() {
    let kernel = Kernel::new();
    let mut syncer = syncer(&kernel);
    let spec = small();
    syncer.sync_plan(&Arc::new(spec));
    assert!(syncer.check_drift().is_none());
    let web = tcp("10.96.0.1", 80);

    kernel.ipvs.remove(&web);
    assert!(syncer.check_drift().is_some());
    assert_eq!(kernel.weights(web).len(), 2);

    kernel.dummy.tamper_remove(ip("10.96.0.2"));
    kernel.ipsets.tamper("SWYD-CLUSTER-IP", Some("10.96.0.1,tcp:80"));
    assert!(syncer.check_drift().is_some());
    assert!(kernel.addresses().contains(&ip("10.96.0.2")));
    assert!(
        kernel
            .ipsets
            .members("SWYD-CLUSTER-IP")
            .contains("10.96.0.1,tcp:80")
    );

    let mut iptables = kernel.iptables.clone();
    let jump = switchyard_agent::ipvs::glue::jump_rules(IpFamily::IPv4).remove(0);
    assert!(iptables.delete_jump(&jump).unwrap());
    assert!(syncer.check_drift().is_some());
    assert!(iptables.delete_jump(&jump).unwrap(), "restored");
    syncer.sync_plan(&Arc::new(small()));
    assert_eq!(syncer.status().drift_repairs, 3);
}

#[test]
fn the_first_ipvs_sync_removes_what_iptables_mode_left() {
    let kernel = Kernel::new();
    let mut iptables_mode = IptablesDataplane::new(
        kernel.iptables.clone(),
        FixedAddrs::default(),
        HostFacts::default(),
    );
    let mut spec = everything();
    spec.services.retain(|s| s.family == IpFamily::IPv4);
    finish(&mut spec);
    sync(&mut iptables_mode, &spec, false);
    let nat = kernel.iptables.chains(IpFamily::IPv4, Table::Nat);
    assert!(nat.iter().any(|c| c.starts_with("SWYD-SVC-")));

    let mut dataplane = kernel.dataplane();
    sync(&mut dataplane, &spec, false);
    for table in [Table::Nat, Table::Filter] {
        let chains: Vec<String> = kernel
            .iptables
            .chains(IpFamily::IPv4, table)
            .into_iter()
            .filter(|c| c.starts_with("SWYD-"))
            .collect();
        let owned: Vec<String> = switchyard_agent::ipvs::glue::owned_chains(table)
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(chains, owned, "{table}");
    }
    let filter_input = kernel
        .iptables
        .rules(IpFamily::IPv4, Table::Filter, "INPUT")
        .unwrap();
    assert!(
        !filter_input.iter().any(|r| r.contains(names::EXTERNAL_SERVICES)),
        "{filter_input:?}"
    );
    assert!(dataplane.check_drift().unwrap().is_none());
}

#[test]
fn cleanup_removes_exactly_what_ipvs_mode_owns() {
    let kernel = Kernel::new();
    kernel.ipvs.insert(
        Service::new(tcp("192.0.2.1", 80), "rr", None),
        &[Destination::new(real("192.0.2.10", 80), 1)],
    );
    kernel
        .iptables
        .restore_text(
            IpFamily::IPv4,
            "*filter\n:OTHER - [0:0]\n-A INPUT -j OTHER\nCOMMIT\n",
        )
        .unwrap();
    let mut dataplane = kernel.dataplane();
    sync(&mut dataplane, &small(), false);
    let done = dataplane.cleanup().unwrap();
    assert!(done.objects > 10 && done.jumps == 8, "{done:?}");
    assert_eq!(
        kernel.ipvs.table().keys().copied().collect::<Vec<_>>(),
        [tcp("192.0.2.1", 80)]
    );
    assert_eq!(kernel.dummy.state(), None);
    assert!(kernel.ipsets.sets().is_empty());
    for table in [Table::Filter, Table::Nat] {
        assert!(
            kernel
                .iptables
                .chains(IpFamily::IPv4, table)
                .iter()
                .all(|c| !c.starts_with("SWYD-"))
        );
    }
    assert_eq!(
        kernel
            .iptables
            .rules(IpFamily::IPv4, Table::Filter, "INPUT")
            .unwrap(),
        ["-j OTHER"]
    );
    // Idempotent, and works on a fresh agent.
    let again = kernel.dataplane().cleanup().unwrap();
    assert_eq!((again.jumps, again.objects), (0, 0));
}
