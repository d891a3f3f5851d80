//! The verification of the backend in use, on the in-memory kernels: each backend's kernel read back
//! agrees with the plan frontend by frontend and a hand edit is named; the syncer verifies after every
//! switch (kernel, probes from the node, then refusals the plan does not explain), and the status
//! carries it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::backend::select::{Candidate, Factory, Selector};
use switchyard_agent::counters::{AppliedPlan, CounterSource, Refusal, Sample, ServicePort, What};
use switchyard_agent::error::Error;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::nftables::dataplane::NftablesDataplane;
use switchyard_agent::nftables::fake::FakeNft;
use switchyard_agent::nftables::model::Key;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::dataplane::Dataplane;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, Syncer};
use switchyard_agent::verify::kernel::check;
use switchyard_agent::verify::probes::Connector;
use switchyard_agent::verify::worker::VerifyEdges;
use switchyard_agent::verify::{Verifier, VerifyConfig};
use switchyard_agent::xtables::Table;
use switchyard_api::testing::finish;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, Protocol};

use crate::fixtures::{everything, local_addrs};
use crate::kernel::{Kernel, tcp};

/// The agent's selector on the in-memory kernels: iptables, IPVS and nftables.
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
            HostFacts {
                random_fully: true,
                ..HostFacts::default()
            },
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
}

fn plan(backend: Backend) -> Arc<NodeForwardingPlanSpec> {
    let mut spec = everything();
    spec.backend = backend;
    finish(&mut spec);
    Arc::new(spec)
}

/// The kernel check of `select`'s backend in use against `spec`.
fn kernel_check(
    select: &mut Selector,
    spec: &NodeForwardingPlanSpec,
) -> switchyard_api::verification::KernelCheck {
    let skip = switchyard_api::validate::validate(spec).bad_entries();
    let view = select.kernel_view().unwrap().unwrap();
    check(spec, &skip, &view)
}

#[test]
fn every_backends_kernel_agrees_with_the_plan_and_a_hand_edit_is_named() {
    for backend in [Backend::Iptables, Backend::Nftables, Backend::Ipvs] {
        let kernel = Kernel::new();
        let nft = FakeNft::new();
        let mut select = selector(&kernel, &nft);
        let spec = plan(backend);
        crate::kernel::sync(&mut select, &spec, true);
        assert_eq!(select.backend(), backend);
        let agreed = kernel_check(&mut select, &spec);
        assert!(agreed.passed(), "{backend}: {agreed:?}");
        assert!(agreed.frontends >= 25, "{backend}: {agreed:?}");

        // Someone edits the kernel behind the agent's back.
        let frontend = match backend {
            Backend::Iptables => {
                let chains = kernel.iptables.chains(IpFamily::IPv4, Table::Nat);
                let svc = chains
                    .iter()
                    .find(|c| c.starts_with("SWYD-SVC-"))
                    .unwrap()
                    .clone();
                kernel.iptables.flush_chain(IpFamily::IPv4, Table::Nat, &svc);
                None
            }
            Backend::Nftables => {
                let key = Key::Frontend("10.96.0.2".parse().unwrap(), Protocol::TCP, 80);
                nft.delete_element(IpFamily::IPv4, "fast-2", &key);
                Some("ns2/nodeport:p80 10.96.0.2:80/tcp")
            }
            Backend::Ipvs => {
                use switchyard_agent::ipvs::kernel::Ipvs as _;
                kernel.ipvs.clone().delete_service(&tcp("10.96.0.1", 80)).unwrap();
                Some("ns1/multi:p80 10.96.0.1:80/tcp")
            }
        };
        let found = kernel_check(&mut select, &spec);
        assert!(!found.passed(), "{backend}: {found:?}");
        assert!(found.mismatches >= 1, "{backend}: {found:?}");
        if let Some(frontend) = frontend {
            assert!(
                found.examples.iter().any(|e| e.starts_with(frontend)),
                "{backend}: {found:?}"
            );
        }
    }
}

/// Connects to nothing: refuses the addresses listed, answers the rest; keeps every attempt.
#[derive(Clone, Default)]
struct Probes {
    /// How many of the next tries are refused.
    refuse_next: Arc<Mutex<usize>>,
    tried: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Connector for Probes {
    fn connect(&mut self, to: SocketAddr, _: Duration) -> Result<(), String> {
        self.tried.lock().unwrap().push(to);
        let mut refuse = self.refuse_next.lock().unwrap();
        if *refuse > 0 {
            *refuse -= 1;
            Err("Connection refused (os error 111)".into())
        } else {
            Ok(())
        }
    }
}

/// Refusal counters the test sets.
#[derive(Clone, Default)]
struct Counters(Arc<Mutex<Vec<Sample>>>);

impl Counters {
    fn set(&self, service: &str, refusal: Refusal, packets: u64) {
        *self.0.lock().unwrap() = vec![Sample {
            service: ServicePort {
                name: service.into(),
                protocol: Protocol::TCP,
            },
            what: What::Refused(refusal),
            element: 1,
            packets,
        }];
    }
}

impl CounterSource for Counters {
    fn read(&mut self) -> Result<Vec<Sample>, Error> {
        Ok(self.0.lock().unwrap().clone())
    }
}

#[test]
fn the_syncer_verifies_the_backend_after_every_switch_and_counts_refusals_for_a_while() {
    let kernel = Kernel::new();
    let nft = FakeNft::new();
    let (probes, counters) = (Probes::default(), Counters::default());
    let config = VerifyConfig {
        probes: 3,
        probe_timeout: Duration::from_millis(100),
        refusals_for: Duration::from_secs(30),
        refusals_every: Duration::from_secs(5),
    };
    let edges = VerifyEdges {
        connector: Box::new(probes.clone()),
        counters: Box::new(counters.clone()),
        plan: AppliedPlan::default(),
    };
    let mut syncer = Syncer::new(
        Box::new(selector(&kernel, &nft)),
        kernel.clock.clone(),
        SyncConfig::default(),
        SyncMetrics::default(),
    )
    .with_verifier(Verifier::new(edges, config));
    let settle = |syncer: &mut Syncer| {
        syncer.settle_verification();
        syncer.tick_verification()
    };

    syncer.sync_plan(&plan(Backend::Ipvs));
    assert!(settle(&mut syncer), "verified at start");
    let first = syncer.status().verification.unwrap();
    assert_eq!(first.backend, Backend::Ipvs);
    assert_eq!(first.revision, plan(Backend::Ipvs).revision);
    assert!(first.kernel.passed(), "{first:?}");
    assert_eq!(
        first.probes, None,
        "a start checks the kernel only: probes are real connections to the Services"
    );
    assert!(probes.tried.lock().unwrap().is_empty());
    assert_eq!(first.refused, None, "not counted yet");

    // The same backend again: no new verification.
    syncer.sync_plan(&plan(Backend::Ipvs));
    assert!(!settle(&mut syncer));
    assert!(probes.tried.lock().unwrap().is_empty());

    // A switch, probed, and a probe that fails.
    *probes.refuse_next.lock().unwrap() = 1;
    counters.set("ns1/multi:p80", Refusal::NoEndpoints, 7);
    kernel.clock.advance(Duration::from_secs(1));
    syncer.sync_plan(&plan(Backend::Nftables));
    assert!(settle(&mut syncer));
    let second = syncer.status().verification.unwrap();
    assert_eq!(second.backend, Backend::Nftables);
    assert!(second.kernel.passed(), "{second:?}");
    let failed = second.probes.clone().unwrap();
    assert_eq!((failed.sampled, failed.failed), (3, 1));
    assert_eq!(probes.tried.lock().unwrap().len(), 3);
    assert!(
        failed.examples[0].ends_with("Connection refused (os error 111)"),
        "{failed:?}"
    );
    assert!(!second.passed());
    assert!(second.at > first.at);

    // Refusals: counted every 5 s from the verification's baseline (7), judged by the plan.
    counters.set("ns1/multi:p80", Refusal::NoEndpoints, 10);
    kernel.clock.advance(Duration::from_secs(5));
    assert!(!syncer.tick_verification(), "queued");
    assert!(settle(&mut syncer));
    let refused = syncer.status().verification.unwrap().refused.unwrap();
    assert_eq!(
        refused.unexpected, 3,
        "ns1/multi has endpoints: REJECT is unexpected"
    );
    assert_eq!(refused.examples, ["ns1/multi:p80 no-endpoints +3"]);
    counters.set("ns8/none:p80", Refusal::NoEndpoints, 50);
    kernel.clock.advance(Duration::from_secs(5));
    syncer.tick_verification();
    settle(&mut syncer);
    let refused = syncer.status().verification.unwrap().refused.unwrap();
    assert_eq!(
        refused.unexpected, 3,
        "ns8/none has no endpoint: its REJECTs are the plan's"
    );
    // After the counting time, nothing more is counted.
    kernel.clock.advance(Duration::from_secs(60));
    syncer.tick_verification();
    settle(&mut syncer);
    counters.set("ns1/multi:p80", Refusal::NoEndpoints, 1000);
    kernel.clock.advance(Duration::from_secs(5));
    syncer.tick_verification();
    settle(&mut syncer);
    assert_eq!(
        syncer.status().verification.unwrap().refused.unwrap().unexpected,
        3
    );

    // The failed verification is checked again at the next applied sync: the kernel only.
    kernel.clock.advance(Duration::from_secs(1));
    syncer.sync_plan(&plan(Backend::Nftables));
    assert!(settle(&mut syncer), "checked again");
    let third = syncer.status().verification.unwrap();
    assert!(third.passed(), "{third:?}");
    assert_eq!(third.probes, None);
    assert!(third.at > second.at);
    // It passed: the next sync verifies nothing.
    syncer.sync_plan(&plan(Backend::Nftables));
    assert!(!settle(&mut syncer));

    // A failed verification of a kernel a later sync already changed (the repair of the very entries it
    // found missing, before its result came back) is checked again at once, not at the next sync.
    syncer.cleanup().unwrap();
    kernel.clock.advance(Duration::from_secs(1));
    kernel.ipvs.set_scheduler_available("rr", false);
    syncer.sync_plan(&plan(Backend::Ipvs));
    assert!(
        !syncer.status().failures.is_empty(),
        "the kernel refused virtual servers"
    );
    kernel.ipvs.set_scheduler_available("rr", true);
    assert!(
        syncer.check_drift().is_some(),
        "the refused virtual servers are retried"
    );
    assert!(
        syncer.status().failures.is_empty(),
        "{:?}",
        syncer.status().failures
    );
    syncer.settle_verification();
    syncer.tick_verification();
    let stale = syncer.status().verification.unwrap();
    assert!(
        !stale.passed(),
        "it judged the kernel before the repair: {stale:?}"
    );
    syncer.settle_verification();
    assert!(syncer.tick_verification(), "checked again without another sync");
    let now = syncer.status().verification.unwrap();
    assert!(now.passed(), "{now:?}");
    assert_eq!(now.probes, None, "the kernel only");
}
