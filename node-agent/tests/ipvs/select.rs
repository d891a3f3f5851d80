//! Backend selection: IPVS when the plan asks for it and the kernel has it, iptables otherwise (saying
//! why in the status), and a clean switch when the plan's backend changes.

use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::backend::select::{Candidate, Factory, Leftovers, Selector};
use switchyard_agent::error::Error;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::dataplane::Dataplane;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, Syncer};
use switchyard_agent::xtables::Table;
use switchyard_api::conditions::{DEGRADED, reasons, status};
use switchyard_api::testing::finish;
use switchyard_api::{Backend, IpFamily};

use crate::kernel::{Kernel, tcp};

/// iptables and an IPVS candidate as the agent wires them (leftovers: what an earlier IPVS run left).
fn selector(kernel: &Kernel, factory: Factory, leftovers: Option<Leftovers>) -> Selector {
    let iptables = IptablesDataplane::new(
        kernel.iptables.clone(),
        FixedAddrs(crate::fixtures::local_addrs()),
        HostFacts::default(),
    );
    let ipvs = Candidate {
        backend: Backend::Ipvs,
        title: "IPVS",
        factory,
        leftovers,
        replaces: &[Backend::Iptables],
    };
    Selector::new(Box::new(iptables), vec![ipvs])
}

fn select(kernel: &Kernel, ipvs_available: bool) -> Selector {
    select_with(kernel, ipvs_available, None)
}

fn select_with(kernel: &Kernel, ipvs_available: bool, leftovers: Option<Leftovers>) -> Selector {
    let on = kernel.clone();
    let factory: Factory = Box::new(move || {
        if ipvs_available {
            Ok(Box::new(on.dataplane()) as Box<dyn Dataplane>)
        } else {
            Err(Error::IpvsUnavailable(
                "the kernel has no IPVS generic-netlink family (ip_vs is not loaded); modprobe ip_vs failed"
                    .into(),
            ))
        }
    });
    selector(kernel, factory, leftovers)
}

fn syncer(kernel: &Kernel, dataplane: Selector) -> Syncer {
    Syncer::new(
        Box::new(dataplane),
        kernel.clock.clone(),
        SyncConfig::default(),
        SyncMetrics::default(),
    )
}

fn ipvs_plan() -> switchyard_api::NodeForwardingPlanSpec {
    let mut spec = crate::fixtures::everything();
    spec.services.retain(|s| s.family == IpFamily::IPv4);
    spec.backend = Backend::Ipvs;
    finish(&mut spec);
    spec
}

#[test]
fn without_ipvs_the_agent_forwards_with_iptables_and_says_why() {
    let kernel = Kernel::new();
    let mut syncer = syncer(&kernel, select(&kernel, false));
    syncer.sync_plan(&Arc::new(ipvs_plan()));
    let s = syncer.status();
    assert_eq!(s.backend, Some(Backend::Iptables));
    let reason = s.backend_reason.unwrap();
    assert!(reason.contains("IPVS is unavailable on this node"), "{reason}");
    assert!(reason.contains("ip_vs is not loaded"), "{reason}");
    let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        (status::TRUE, reasons::BACKEND_FALLBACK)
    );
    assert!(kernel.ipvs.table().is_empty());
    assert!(
        kernel
            .iptables
            .chains(IpFamily::IPv4, Table::Nat)
            .iter()
            .any(|c| c.starts_with("SWYD-SVC-")),
        "iptables forwards"
    );
}

#[test]
fn ipvs_that_becomes_available_later_is_picked_up_on_the_next_full_sync() {
    let kernel = Kernel::new();
    let loadable = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (on, now_loadable, counted) = (kernel.clone(), Arc::clone(&loadable), Arc::clone(&attempts));
    let factory: Factory = Box::new(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if now_loadable.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(Box::new(on.dataplane()) as Box<dyn Dataplane>)
        } else {
            Err(Error::IpvsUnavailable("modprobe ip_vs failed".into()))
        }
    });
    let mut syncer = syncer(&kernel, selector(&kernel, factory, None));
    let first = ipvs_plan();
    syncer.sync_plan(&Arc::new(first.clone()));
    assert_eq!(syncer.status().backend, Some(Backend::Iptables));
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The module becomes loadable; a partial sync does not probe again.
    loadable.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut second = first.clone();
    second.services.pop();
    finish(&mut second);
    syncer.sync_plan(&Arc::new(second.clone()));
    assert_eq!(syncer.status().backend, Some(Backend::Iptables));
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The periodic full sync probes again, switches, and removes the iptables rules.
    kernel.clock.advance(std::time::Duration::from_secs(3601));
    assert!(syncer.resync_if_due().is_some());
    let s = syncer.status();
    assert_eq!(s.backend, Some(Backend::Ipvs));
    assert_eq!(s.backend_reason, None);
    assert!(!kernel.ipvs.table().is_empty());
    assert!(
        !kernel
            .iptables
            .chains(IpFamily::IPv4, Table::Nat)
            .iter()
            .any(|c| c.starts_with("SWYD-SVC-")),
        "the iptables service chains are gone"
    );
}

#[test]
fn with_ipvs_the_plan_picks_the_backend_and_a_switch_cleans_up_the_other() {
    let kernel = Kernel::new();
    let mut syncer = syncer(&kernel, select(&kernel, true));
    let spec = ipvs_plan();
    syncer.sync_plan(&Arc::new(spec.clone()));
    let s = syncer.status();
    assert_eq!((s.backend, s.backend_reason), (Some(Backend::Ipvs), None));
    assert!(kernel.ipvs.table().contains_key(&tcp("10.96.0.1", 80)));

    let mut iptables_plan = spec.clone();
    iptables_plan.backend = Backend::Iptables;
    finish(&mut iptables_plan);
    syncer.sync_plan(&Arc::new(iptables_plan));
    assert_eq!(syncer.status().backend, Some(Backend::Iptables));
    assert!(kernel.ipvs.table().is_empty(), "IPVS state removed");
    assert_eq!(kernel.dummy.state(), None);
    assert!(kernel.ipsets.sets().is_empty());

    syncer.sync_plan(&Arc::new(spec));
    assert_eq!(syncer.status().backend, Some(Backend::Ipvs));
    assert!(
        !kernel
            .iptables
            .chains(IpFamily::IPv4, Table::Nat)
            .iter()
            .any(|c| c.starts_with("SWYD-SVC-")),
        "iptables-mode chains removed"
    );
    assert!(syncer.check_drift().is_none());
}

#[test]
fn leftovers_of_an_earlier_ipvs_run_are_removed_after_the_first_iptables_sync() {
    let kernel = Kernel::new();
    let mut ipvs = kernel.dataplane();
    crate::kernel::sync(&mut ipvs, &ipvs_plan(), false);
    assert!(!kernel.ipvs.table().is_empty());

    let mut leftover = kernel.dataplane();
    let dataplane = select_with(
        &kernel,
        false,
        Some(Box::new(move |successor| leftover.retire(successor))),
    );
    let mut syncer = syncer(&kernel, dataplane);
    let mut spec = ipvs_plan();
    spec.backend = Backend::Iptables;
    finish(&mut spec);
    syncer.sync_plan(&Arc::new(spec));
    assert!(kernel.ipvs.table().is_empty());
    assert_eq!(kernel.dummy.state(), None);
    assert!(
        syncer.status().backend_reason.is_none(),
        "the plan asked for iptables"
    );
}

#[test]
fn leaving_ipvs_keeps_its_busy_virtual_servers_until_their_connections_close() {
    let kernel = Kernel::new();
    let mut select = select(&kernel, true);
    let spec = ipvs_plan();
    crate::kernel::sync(&mut select, &spec, true);
    let busy = tcp("10.96.0.1", 80);
    let real = *kernel.ipvs.table()[&busy].1.keys().next().expect("a real server");
    assert!(kernel.ipvs.set_connections(&busy, &real, 2, 5));
    let services = kernel.ipvs.table().len();
    assert!(services > 1, "the plan has more than one virtual server");

    let mut iptables_plan = spec.clone();
    iptables_plan.backend = Backend::Iptables;
    finish(&mut iptables_plan);
    crate::kernel::sync(&mut select, &iptables_plan, false);
    assert_eq!(select.backend(), Backend::Iptables);
    let kept: Vec<_> = kernel.ipvs.table().keys().copied().collect();
    assert_eq!(
        kept,
        [busy],
        "only the virtual server with open connections stays"
    );
    assert!(kernel.dummy.state().is_some(), "its address stays with it");
    let view = select.kernel_view().unwrap().expect("iptables has a kernel view");
    assert!(
        view.leftovers.is_empty(),
        "a drain is no leftover: {:?}",
        view.leftovers
    );

    // Drift checks retry it: still busy, still there; idle (TIME_WAIT entries only), gone with the rest.
    select.check_drift().unwrap();
    assert_eq!(kernel.ipvs.table().len(), 1);
    assert!(kernel.ipvs.set_connections(&busy, &real, 0, 5));
    select.check_drift().unwrap();
    assert!(kernel.ipvs.table().is_empty(), "IPVS state removed");
    assert_eq!(kernel.dummy.state(), None);
    assert!(kernel.ipsets.sets().is_empty());
}

#[test]
fn leaving_ipvs_ends_its_drain_after_the_period_and_a_switch_back_keeps_what_is_there() {
    let kernel = Kernel::new();
    let mut select = select(&kernel, true);
    let spec = ipvs_plan();
    crate::kernel::sync(&mut select, &spec, true);
    let busy = tcp("10.96.0.1", 80);
    let real = *kernel.ipvs.table()[&busy].1.keys().next().expect("a real server");
    assert!(kernel.ipvs.set_connections(&busy, &real, 1, 0));
    let mut iptables_plan = spec.clone();
    iptables_plan.backend = Backend::Iptables;
    finish(&mut iptables_plan);

    // Back to IPVS while it drains: it is in use again, whole, and nothing of it goes afterwards.
    crate::kernel::sync(&mut select, &iptables_plan, false);
    assert_eq!(kernel.ipvs.table().len(), 1);
    crate::kernel::sync(&mut select, &spec, false);
    assert_eq!(select.backend(), Backend::Ipvs);
    let services = kernel.ipvs.table().len();
    assert!(services > 1);
    kernel.clock.advance(crate::kernel::SWITCH_DRAIN);
    select.check_drift().unwrap();
    assert_eq!(kernel.ipvs.table().len(), services);

    // Away again: the busy one stays until the drain period is over, then goes although still busy.
    assert!(kernel.ipvs.set_connections(&busy, &real, 1, 0));
    crate::kernel::sync(&mut select, &iptables_plan, false);
    assert_eq!(kernel.ipvs.table().len(), 1);
    kernel.clock.advance(crate::kernel::SWITCH_DRAIN / 2);
    select.check_drift().unwrap();
    assert_eq!(kernel.ipvs.table().len(), 1, "within the period");
    kernel.clock.advance(crate::kernel::SWITCH_DRAIN / 2);
    select.check_drift().unwrap();
    assert!(kernel.ipvs.table().is_empty(), "the period is over");
    assert_eq!(kernel.dummy.state(), None);
}
