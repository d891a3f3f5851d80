//! Plans and a syncer wired to fakes, for the syncer tests.
//!
//! Address conventions are `switchyard_api::testing`'s: node 192.168.10.11, pods 10.244.0.0/16 (this
//! node's 10.244.1.0/24), ClusterIPs 10.96.0.0/16, external and LB IPs 203.0.113.0/24.

use std::net::IpAddr;
use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::conntrack::settings::{TCP_TIMEOUT_CLOSE_WAIT, TCP_TIMEOUT_ESTABLISHED};
use switchyard_agent::conntrack::{ConntrackSettings, FakeConntrack};
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{FakeClock, SyncConfig, SyncMetrics, Syncer};
use switchyard_agent::sysctl::FakeSysctls;
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::testing::{EntryExt, entry, ep, plan};
use switchyard_api::{NodeForwardingPlanSpec, Protocol};

pub fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

pub fn local_addrs() -> Vec<IpAddr> {
    vec![ip("192.168.10.11"), ip("127.0.0.1")]
}

/// A syncer over a fake kernel, a fake conntrack table, fake sysctls (a stock kernel's conntrack
/// timeouts) and a fake clock.
pub struct Harness {
    pub syncer: Syncer,
    pub iptables: FakeIptables,
    pub conntrack: FakeConntrack,
    pub sysctls: FakeSysctls,
    pub clock: Arc<FakeClock>,
}

impl Harness {
    /// A fresh kernel.
    pub fn new() -> Self {
        Self::on(FakeIptables::new(&local_addrs()))
    }

    /// A new agent process on an existing (fake) kernel: what a restart looks like.
    pub fn on(iptables: FakeIptables) -> Self {
        let clock = Arc::new(FakeClock::at_2026());
        let conntrack = FakeConntrack::default();
        let sysctls = FakeSysctls::new();
        sysctls.put(TCP_TIMEOUT_ESTABLISHED, "432000");
        sysctls.put(TCP_TIMEOUT_CLOSE_WAIT, "60");
        let dataplane = IptablesDataplane::new(
            iptables.clone(),
            FixedAddrs(local_addrs()),
            HostFacts {
                random_fully: true,
                ..HostFacts::default()
            },
        );
        let syncer = Syncer::new(
            Box::new(dataplane),
            clock.clone(),
            SyncConfig::default(),
            SyncMetrics::default(),
        )
        .with_conntrack(Box::new(conntrack.clone()))
        .with_conntrack_sysctls(Box::new(sysctls.clone()), ConntrackSettings::default());
        Self {
            syncer,
            iptables,
            conntrack,
            sysctls,
            clock,
        }
    }

    pub fn sync(&mut self, spec: &NodeForwardingPlanSpec) -> switchyard_agent::sync::SyncResult {
        let result = self.syncer.sync_plan(&Arc::new(spec.clone()));
        // The conntrack cleanup runs on the syncer's worker: the tests look at its result.
        self.syncer.settle_conntrack();
        result
    }
}

/// The IPv4 kernel state a fresh agent programs for `spec` (the oracle for partial syncs and repairs).
pub fn fresh_state(spec: &NodeForwardingPlanSpec) -> String {
    let mut fresh = Harness::new();
    fresh.sync(spec);
    fresh.iptables.dump(switchyard_api::IpFamily::IPv4)
}

/// Three services: web (TCP, NodePort), dns (UDP), api (TCP).
pub fn base() -> NodeForwardingPlanSpec {
    plan(
        "node-a",
        vec![
            entry("ns1/web:http", "10.96.0.1", 80)
                .node_port(30080)
                .with(ep("10.244.2.5", 8080))
                .with(ep("10.244.3.5", 8080)),
            entry("kube-system/dns:dns", "10.96.0.10", 53)
                .protocol(Protocol::UDP)
                .with(ep("10.244.2.53", 53))
                .with(ep("10.244.3.53", 53)),
            entry("ns1/api:https", "10.96.0.2", 443).with(ep("10.244.2.6", 8443)),
        ],
    )
}

/// `spec` with `f` applied to the entry named `name`, revision recomputed.
pub fn edit(
    spec: &NodeForwardingPlanSpec,
    name: &str,
    f: impl Fn(&mut switchyard_api::ServicePlan),
) -> NodeForwardingPlanSpec {
    let mut spec = spec.clone();
    for entry in spec.services.iter_mut().filter(|e| e.name == name) {
        f(std::sync::Arc::make_mut(entry));
    }
    switchyard_api::testing::finish(&mut spec);
    spec
}

/// Chains declared in a restore payload.
pub fn declared(payload: &str) -> Vec<String> {
    payload
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}
