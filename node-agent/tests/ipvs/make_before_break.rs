//! Make before break, as a fault test: every kernel operation of a backend switch is watched, and after
//! each one every frontend of the plan must still be forwarded by some backend's rules (iptables' DNAT
//! traced through the modelled tables, an nftables frontend element, an IPVS virtual server with real
//! servers on a local address). A moment with no rules for a Service fails the test and names the
//! operation after which it happened.
//!
//! ```text
//! Selector(iptables, IPVS, nftables) on Watched<fake> edges ─► each mutating call ─► forwarded(frontend)?
//!   by iptables (Tracer: DNAT) | nftables (fast-N / service-ips / NodePort maps) | IPVS (VS + reals)
//! ```

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use switchyard_agent::backend::HostFacts;
use switchyard_agent::backend::select::{Candidate, Factory, Selector};
use switchyard_agent::command::RestoreInput;
use switchyard_agent::error::Error;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::ipvs::dummy::ServiceAddrs;
use switchyard_agent::ipvs::kernel::{Destination, Ipvs, RealKey, Service, VirtualKey};
use switchyard_agent::ipvs::{IpvsConfig, IpvsDataplane, IpvsEdges};
use switchyard_agent::nftables::dataplane::NftablesDataplane;
use switchyard_agent::nftables::fake::FakeNft;
use switchyard_agent::nftables::kernel::{Nft, Summary};
use switchyard_agent::nftables::model::{Key, TableState};
use switchyard_agent::nftables::transaction::Transaction;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::dataplane::{Dataplane, SyncRequest};
use switchyard_agent::xtables::kernel::Iptables;
use switchyard_agent::xtables::{Packet, Table, Verdict};
use switchyard_api::testing::finish;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, Protocol};

use crate::fixtures::{NODE_IP, everything, ip, local_addrs};
use crate::kernel::{GRACE, Kernel, SWITCH_DRAIN};

/// A frontend a client uses: the ClusterIP of a plain and of a policy entry, an externalIP, a NodePort.
const FRONTENDS: [(&str, u16); 4] = [
    ("10.96.0.1", 80),
    ("10.96.0.4", 80),
    ("203.0.113.10", 80),
    (NODE_IP, 30080),
];

/// Where every operation is checked, and what was found.
#[derive(Clone)]
struct Watch {
    kernel: Kernel,
    nft: FakeNft,
    gaps: Arc<Mutex<Vec<String>>>,
    operations: Arc<Mutex<usize>>,
}

impl Watch {
    fn new(kernel: &Kernel) -> Self {
        Self {
            kernel: kernel.clone(),
            nft: FakeNft::new(),
            gaps: Arc::default(),
            operations: Arc::default(),
        }
    }

    fn by_iptables(&self, addr: IpAddr, port: u16) -> bool {
        let Some(tracer) = self.kernel.iptables.kernel(IpFamily::IPv4) else {
            return false;
        };
        let packet = Packet::new(ip("10.244.1.99"), Protocol::TCP, addr, port);
        tracer
            .trace(&packet)
            .is_ok_and(|trace| trace.verdicts().iter().any(|v| matches!(v, Verdict::Dnat(_))))
    }

    fn by_nftables(&self, addr: IpAddr, port: u16) -> bool {
        let local = addr == ip(NODE_IP);
        let sets = ["fast-1", "fast-2", "fast-3", "service-ips"];
        let np_sets = ["fast-np-1", "fast-np-2", "fast-np-3", "service-nodeports"];
        let has = |set: &str, key: &Key| {
            self.nft
                .elements(IpFamily::IPv4, set)
                .is_some_and(|elements| elements.contains_key(key))
        };
        if local {
            np_sets
                .iter()
                .any(|set| has(set, &Key::Port(Protocol::TCP, port)))
        } else {
            sets.iter()
                .any(|set| has(set, &Key::Frontend(addr, Protocol::TCP, port)))
        }
    }

    fn by_ipvs(&self, addr: IpAddr, port: u16) -> bool {
        let key = VirtualKey {
            addr,
            protocol: Protocol::TCP,
            port,
        };
        let local = addr == ip(NODE_IP) || self.kernel.addresses().contains(&addr);
        local && !self.kernel.weights(key).is_empty()
    }

    /// After `operation`: every frontend forwarded by some backend, or the gap noted.
    fn check(&self, operation: &str) {
        *self.operations.lock().unwrap() += 1;
        for (addr, port) in FRONTENDS {
            let addr = ip(addr);
            if !(self.by_iptables(addr, port) || self.by_nftables(addr, port) || self.by_ipvs(addr, port)) {
                self.gaps
                    .lock()
                    .unwrap()
                    .push(format!("{addr}:{port} has no rules after {operation}"));
            }
        }
    }

    fn gaps(&self) -> Vec<String> {
        std::mem::take(&mut *self.gaps.lock().unwrap())
    }
}

/// A kernel edge whose every change is followed by [`Watch::check`].
#[derive(Clone)]
struct Watched<K> {
    inner: K,
    watch: Option<Watch>,
}

impl<K> Watched<K> {
    fn after<T>(&self, operation: &str, result: Result<T, Error>) -> Result<T, Error> {
        if let Some(watch) = &self.watch {
            watch.check(operation);
        }
        result
    }
}

impl<K: Iptables + Clone> Iptables for Watched<K> {
    fn restore(&mut self, family: IpFamily, input: &mut dyn RestoreInput) -> Result<(), Error> {
        let result = self.inner.restore(family, input);
        self.after("iptables-restore", result)
    }
    fn save_lines(
        &mut self,
        family: IpFamily,
        table: Table,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), Error> {
        self.inner.save_lines(family, table, each)
    }
    fn ensure_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let result = self.inner.ensure_rule(family, table, chain, args);
        self.after("iptables -I", result)
    }
    fn delete_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let result = self.inner.delete_rule(family, table, chain, args);
        self.after(&format!("iptables -D {chain}"), result)
    }
    fn chain_exists(&mut self, family: IpFamily, table: Table, chain: &str) -> Result<bool, Error> {
        self.inner.chain_exists(family, table, chain)
    }
    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<bool, Error> {
        self.inner.list_chain(family, table, chain, each)
    }
}

impl<K: Nft> Nft for Watched<K> {
    fn apply(&mut self, transaction: &Transaction<'_>) -> Result<(), Error> {
        let result = self.inner.apply(transaction);
        self.after("nft -f", result)
    }
    fn read(&mut self, family: IpFamily) -> Result<Option<TableState>, Error> {
        self.inner.read(family)
    }
    fn exists(&mut self, family: IpFamily) -> Result<bool, Error> {
        self.inner.exists(family)
    }
    fn summary(&mut self, family: IpFamily) -> Result<Option<Summary>, Error> {
        self.inner.summary(family)
    }
}

impl<K: Ipvs> Ipvs for Watched<K> {
    fn services(&mut self) -> Result<Vec<Service>, Error> {
        self.inner.services()
    }
    fn add_service(&mut self, service: &Service) -> Result<(), Error> {
        let result = self.inner.add_service(service);
        self.after("ipvs add service", result)
    }
    fn update_service(&mut self, service: &Service) -> Result<(), Error> {
        let result = self.inner.update_service(service);
        self.after("ipvs update service", result)
    }
    fn delete_service(&mut self, key: &VirtualKey) -> Result<(), Error> {
        let result = self.inner.delete_service(key);
        self.after(&format!("ipvs delete service {key}"), result)
    }
    fn destinations(&mut self, key: &VirtualKey) -> Result<Vec<Destination>, Error> {
        self.inner.destinations(key)
    }
    fn add_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        let result = self.inner.add_destination(key, dest);
        self.after("ipvs add destination", result)
    }
    fn update_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        let result = self.inner.update_destination(key, dest);
        self.after("ipvs update destination", result)
    }
    fn delete_destination(&mut self, key: &VirtualKey, real: &RealKey) -> Result<(), Error> {
        let result = self.inner.delete_destination(key, real);
        self.after("ipvs delete destination", result)
    }
}

impl<K: ServiceAddrs> ServiceAddrs for Watched<K> {
    fn exists(&mut self) -> Result<bool, Error> {
        self.inner.exists()
    }
    fn ensure(&mut self) -> Result<(), Error> {
        let result = self.inner.ensure();
        self.after("dummy ensure", result)
    }
    fn addresses(&mut self) -> Result<std::collections::BTreeSet<IpAddr>, Error> {
        self.inner.addresses()
    }
    fn change(&mut self, add: &[IpAddr], remove: &[IpAddr]) -> Result<(), Error> {
        let result = self.inner.change(add, remove);
        self.after("dummy addresses", result)
    }
    fn delete(&mut self) -> Result<bool, Error> {
        let result = self.inner.delete();
        self.after("dummy delete", result)
    }
}

fn watched<K>(inner: K, watch: &Watch) -> Watched<K> {
    Watched {
        inner,
        watch: Some(watch.clone()),
    }
}

/// The agent's selector (iptables, IPVS replacing iptables' chains, nftables) on watched edges.
fn selector(watch: &Watch) -> Selector {
    let kernel = &watch.kernel;
    let iptables = watched(kernel.iptables.clone(), watch);
    let ipvs_kernel = kernel.clone();
    let (ipvs_watch, ipvs_iptables) = (watch.clone(), iptables.clone());
    let ipvs: Factory = Box::new(move || {
        let edges = IpvsEdges {
            ipvs: Box::new(watched(ipvs_kernel.ipvs.clone(), &ipvs_watch)),
            ipsets: Box::new(ipvs_kernel.ipsets.clone()),
            dummy: Box::new(watched(ipvs_kernel.dummy.clone(), &ipvs_watch)),
            iptables: ipvs_iptables.clone(),
            addrs: Box::new(FixedAddrs(local_addrs())),
            sysctls: Box::new(ipvs_kernel.sysctls.clone()),
        };
        let config = IpvsConfig {
            grace: GRACE,
            facts: HostFacts::default(),
            kernel_release: "6.1.0-57-amd64".into(),
            switch_drain: SWITCH_DRAIN,
        };
        Ok(Box::new(IpvsDataplane::new(edges, ipvs_kernel.clock.clone(), config)) as Box<dyn Dataplane>)
    });
    let nft = watched(watch.nft.clone(), watch);
    let nftables: Factory = Box::new(move || {
        Ok(Box::new(NftablesDataplane::new(nft.clone(), FixedAddrs(local_addrs()))) as Box<dyn Dataplane>)
    });
    Selector::new(
        Box::new(IptablesDataplane::new(
            iptables,
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
}

fn plan(backend: Backend) -> Arc<NodeForwardingPlanSpec> {
    let mut spec = everything();
    spec.services.retain(|s| s.family == IpFamily::IPv4);
    spec.backend = backend;
    finish(&mut spec);
    Arc::new(spec)
}

fn sync(select: &mut dyn Dataplane, backend: Backend) {
    let spec = plan(backend);
    select
        .sync(SyncRequest {
            spec: &spec,
            skip: &HashSet::new(),
            full: false,
        })
        .unwrap();
}

#[test]
fn no_frontend_is_ever_without_rules_while_the_backend_switches_and_back() {
    type Case = (Backend, Backend);
    let cases: [Case; 3] = [
        (Backend::Iptables, Backend::Nftables),
        (Backend::Ipvs, Backend::Nftables),
        (Backend::Iptables, Backend::Ipvs),
    ];
    for (from, to) in cases {
        let kernel = Kernel::new();
        let watch = Watch::new(&kernel);
        let mut select = selector(&watch);
        sync(&mut select, from);
        // The first sync starts from nothing: only what follows it counts.
        watch.gaps();
        *watch.operations.lock().unwrap() = 0;
        for (step, backend) in [(1, to), (2, from), (3, to)] {
            sync(&mut select, backend);
            assert_eq!(select.backend(), backend, "{from} → {to}, step {step}");
            let gaps = watch.gaps();
            assert!(gaps.is_empty(), "{from} → {to}, step {step}: {gaps:#?}");
        }
        let operations = *watch.operations.lock().unwrap();
        assert!(
            operations >= 6,
            "{from} → {to}: only {operations} operations checked"
        );
        // Nothing of the other backend is left behind.
        match to {
            Backend::Nftables if from == Backend::Ipvs => {
                assert!(kernel.ipvs.table().is_empty(), "no IPVS virtual server left");
                assert_eq!(kernel.dummy.state(), None);
            }
            Backend::Nftables => assert!(
                !kernel
                    .iptables
                    .chains(IpFamily::IPv4, Table::Nat)
                    .iter()
                    .any(|c| c.starts_with("SWYD-")),
                "no iptables chain left"
            ),
            _ => assert!(!watch.nft.has_table(IpFamily::IPv4), "no nftables table left"),
        }
    }
}

#[test]
fn the_watch_sees_the_gap_of_removing_the_old_rules_first() {
    // The order this replaced: the old backend's cleanup, then the new backend's sync.
    let kernel = Kernel::new();
    let watch = Watch::new(&kernel);
    let mut iptables = IptablesDataplane::new(
        watched(kernel.iptables.clone(), &watch),
        FixedAddrs(local_addrs()),
        HostFacts::default(),
    );
    sync(&mut iptables, Backend::Iptables);
    watch.gaps();
    iptables.cleanup().unwrap();
    let mut nftables = NftablesDataplane::new(watched(watch.nft.clone(), &watch), FixedAddrs(local_addrs()));
    sync(&mut nftables, Backend::Nftables);
    let gaps = watch.gaps();
    assert!(
        gaps.iter().any(|gap| gap.contains("10.96.0.1:80 has no rules")),
        "{gaps:#?}"
    );
}
