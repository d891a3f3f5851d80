//! The in-memory kernel every IPVS dataplane test runs against, and helpers to build dataplanes on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::ipvs::dummy::FakeDummy;
use switchyard_agent::ipvs::fake::FakeIpvs;
use switchyard_agent::ipvs::ipset::FakeIpsets;
use switchyard_agent::ipvs::kernel::{RealKey, VirtualKey};
use switchyard_agent::ipvs::{IpvsConfig, IpvsDataplane, IpvsEdges};
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::FakeClock;
use switchyard_agent::sync::dataplane::{Dataplane, SyncOutcome, SyncRequest};
use switchyard_agent::sysctl::FakeSysctls;
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::{NodeForwardingPlanSpec, Protocol};

use crate::fixtures::local_addrs;

/// How long a drained TCP real server may keep its connections in these tests.
pub const GRACE: Duration = Duration::from_secs(30);
/// How long IPVS's busy virtual servers stay after a switch away from it.
pub const SWITCH_DRAIN: Duration = Duration::from_secs(600);

/// One node's kernel: every fake shares its state with the dataplanes built on it.
#[derive(Clone)]
pub struct Kernel {
    pub ipvs: FakeIpvs,
    pub ipsets: FakeIpsets,
    pub dummy: FakeDummy,
    pub iptables: FakeIptables,
    pub sysctls: FakeSysctls,
    pub clock: Arc<FakeClock>,
}

impl Kernel {
    pub fn new() -> Self {
        Self {
            ipvs: FakeIpvs::new(),
            ipsets: FakeIpsets::new(),
            dummy: FakeDummy::new(),
            iptables: FakeIptables::new(&local_addrs()),
            sysctls: FakeSysctls::new(),
            clock: Arc::new(FakeClock::at_2026()),
        }
    }

    /// A fresh agent's IPVS dataplane on this kernel (no model: its first sync is full).
    pub fn dataplane(&self) -> IpvsDataplane<FakeIptables> {
        let edges = IpvsEdges {
            ipvs: Box::new(self.ipvs.clone()),
            ipsets: Box::new(self.ipsets.clone()),
            dummy: Box::new(self.dummy.clone()),
            iptables: self.iptables.clone(),
            addrs: Box::new(FixedAddrs(local_addrs())),
            sysctls: Box::new(self.sysctls.clone()),
        };
        let config = IpvsConfig {
            grace: GRACE,
            facts: HostFacts {
                random_fully: true,
                ..HostFacts::default()
            },
            kernel_release: "6.1.0-57-amd64".into(),
            switch_drain: SWITCH_DRAIN,
        };
        IpvsDataplane::new(edges, self.clock.clone(), config)
    }

    /// Real servers and weights of one virtual server.
    pub fn weights(&self, vs: VirtualKey) -> BTreeMap<RealKey, u32> {
        self.ipvs.weights(&vs)
    }

    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.dummy.state().unwrap_or_default()
    }
}

pub fn sync(dataplane: &mut dyn Dataplane, spec: &NodeForwardingPlanSpec, full: bool) -> SyncOutcome {
    let spec = Arc::new(spec.clone());
    dataplane
        .sync(SyncRequest {
            spec: &spec,
            skip: &std::collections::HashSet::new(),
            full,
        })
        .unwrap()
}

pub fn tcp(addr: &str, port: u16) -> VirtualKey {
    VirtualKey {
        addr: addr.parse().unwrap(),
        protocol: Protocol::TCP,
        port,
    }
}

pub fn udp(addr: &str, port: u16) -> VirtualKey {
    VirtualKey {
        protocol: Protocol::UDP,
        ..tcp(addr, port)
    }
}

pub fn real(addr: &str, port: u16) -> RealKey {
    RealKey {
        addr: addr.parse().unwrap(),
        port,
    }
}
