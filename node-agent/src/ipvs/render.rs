//! The pure IPVS render: plan → the desired IPVS state (virtual servers with their real servers), the
//! addresses the dummy interface must hold, the ipset members and the fixed iptables glue.
//!
//! ```text
//! NodeForwardingPlanSpec ─┐                       ┌─ virtuals: VirtualKey ─► VirtualServer { entry, scheduler,
//! HostFacts (local addrs, ┼─► render() ─► Desired ┤                           persistence, reals }
//!  iptables features) ────┘                       ├─ addresses (ClusterIPs, external IPs, LB IPs)
//!                                                 ├─ sets (sets::SetId per family ─► members)
//!                                                 └─ glue per family (glue::glue)
//! ```
//!
//! Per entry, kube-proxy's IPVS `syncService` calls: a virtual server for the ClusterIP, each external
//! IP, each LoadBalancer IP and the NodePort on each node address, all masquerading (NAT) with weight 1
//! per endpoint. The ClusterIP uses the endpoints internal traffic uses (the Local set when
//! internalTrafficPolicy is Local); the other frontends the set external traffic uses (only local
//! endpoints when externalTrafficPolicy is Local). The scheduler is the entry's annotation, else the
//! cluster default, else `rr`; ClientIP affinity becomes persistence with its timeout. A frontend with
//! no usable endpoint still gets its virtual server (so the address answers), and its verdict comes
//! from the glue: REJECT when the service has no endpoint anywhere, DROP when only this node's policy
//! set is empty, as the iptables backend does.
//!
//! The planner already decided every policy question; nothing here looks at anything but the plan and
//! the facts the edge passes in.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, PlanEndpoint, ServicePlan, TrafficPolicy};

use super::glue::{Glue, GlueSettings, glue};
use super::kernel::{RealKey, VirtualKey};
use super::sets::{DesiredSet, DesiredSets, SetId, ip_port, ip_port_ip, ip_port_net};
use crate::backend::{FamilyEnv, HostFacts, families_of, node_port_ips};

/// The scheduler when neither the entry nor the cluster names one (kube-proxy's default).
pub const DEFAULT_SCHEDULER: &str = "rr";
/// The weight of a real server whose endpoint has none in the plan (kube-proxy uses 1 for all).
pub const DEFAULT_WEIGHT: u32 = 1;

/// One virtual server the plan wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// The plan entry (index into `spec.services`) it belongs to.
    pub entry: usize,
    /// Scheduler name.
    pub scheduler: String,
    /// Persistence timeout (ClientIP affinity).
    pub persistence: Option<u32>,
    /// Real servers and their weights (the plan's, 1 where it gives none).
    pub reals: BTreeMap<RealKey, u32>,
    /// Every address the entry still lists (endpoints, terminating ones included, and unready ones);
    /// `None` when the Service keeps connections (`switchyard.io/keep-connections`). A TCP real server
    /// that leaves `reals` drains when its address is listed (terminating, or only not used here); one
    /// the Service no longer lists has gone and is deleted at once: its connections cannot drain, and
    /// with `expire_nodest_conn` their next packet ends them instead of hanging on a dead address.
    pub listed: Option<Arc<BTreeSet<IpAddr>>>,
}

/// Everything IPVS mode programs for a plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    /// Virtual servers by key.
    pub virtuals: BTreeMap<VirtualKey, VirtualServer>,
    /// Addresses the dummy interface holds.
    pub addresses: BTreeSet<IpAddr>,
    /// ipsets by name.
    pub sets: DesiredSets,
    /// The iptables glue per family.
    pub glue: BTreeMap<IpFamily, Glue>,
    /// Entries some of whose frontends were already claimed by an earlier entry: (entry, why).
    pub conflicts: Vec<(usize, String)>,
}

impl Desired {
    /// Virtual plus real servers (what the status reports as "rules" for IPVS).
    pub fn server_count(&self) -> u64 {
        self.virtuals.values().map(|v| 1 + v.reals.len() as u64).sum()
    }
}

fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse().ok()
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Where NodePorts of `family` are served: the node addresses `nodePortAddresses` selects (see
/// [`node_port_ips`]), or, when it selects every local address, each local address of the family
/// except loopback and link-local ones; never a service address.
pub fn node_port_addresses(
    spec: &NodeForwardingPlanSpec,
    family: IpFamily,
    local_addrs: &[IpAddr],
    service_ips: &BTreeSet<IpAddr>,
) -> Vec<IpAddr> {
    let candidates = node_port_ips(spec, family, local_addrs).unwrap_or_else(|| {
        local_addrs
            .iter()
            .filter(|ip| IpFamily::of(ip) == family && !ip.is_loopback() && !is_link_local(ip))
            .copied()
            .collect()
    });
    let mut ips: Vec<IpAddr> = candidates
        .into_iter()
        .filter(|ip| !service_ips.contains(ip))
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

fn glue_settings(spec: &NodeForwardingPlanSpec, facts: &HostFacts, family: IpFamily) -> GlueSettings {
    let env = FamilyEnv::new(spec, family, &facts.local_addrs);
    GlueSettings {
        mark: env.mark,
        not_local: env.local.iptables_not_local(),
        masquerade_all: env.masquerade_all,
        random_fully: facts.random_fully,
        tcp_be_liberal: facts.tcp_be_liberal,
        service_cidrs: env.service_cidrs.iter().map(ToString::to_string).collect(),
    }
}

/// The service addresses of the entries rendered: what goes on the dummy interface.
fn service_ips(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>) -> BTreeSet<IpAddr> {
    spec.services
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
        .flat_map(|(_, e)| {
            std::iter::once(&e.cluster_ip)
                .chain(&e.external_ips)
                .chain(&e.load_balancer_ips)
        })
        .filter_map(|ip| parse_ip(ip))
        .collect()
}

/// Renders the plan (without the entries in `skip`, those validation rejected).
pub fn render(spec: &NodeForwardingPlanSpec, facts: &HostFacts, skip: &HashSet<usize>) -> Desired {
    let addresses = service_ips(spec, skip);
    let mut desired = Desired {
        addresses: addresses.clone(),
        ..Desired::default()
    };
    for family in families_of(spec) {
        for id in SetId::ALL {
            desired.sets.insert(
                id.name(family),
                DesiredSet {
                    kind: id.kind(),
                    family,
                    members: BTreeSet::new(),
                },
            );
        }
        desired
            .glue
            .insert(family, glue(family, &glue_settings(spec, facts, family)));
    }
    let node_ports: BTreeMap<IpFamily, Vec<IpAddr>> = desired
        .glue
        .keys()
        .map(|f| (*f, node_port_addresses(spec, *f, &facts.local_addrs, &addresses)))
        .collect();
    for (index, entry) in spec.services.iter().enumerate() {
        if skip.contains(&index) {
            continue;
        }
        let nodes = node_ports
            .get(&entry.family)
            .map(Vec::as_slice)
            .unwrap_or_default();
        render_entry(spec, index, entry, nodes, &mut desired);
    }
    desired
}

/// The endpoints each kind of traffic of an entry uses.
struct Sets<'a> {
    internal: Vec<&'a PlanEndpoint>,
    external: Vec<&'a PlanEndpoint>,
}

impl<'a> Sets<'a> {
    fn of(entry: &'a ServicePlan) -> Self {
        let internal_local = entry.internal_policy == TrafficPolicy::Local;
        let external_local = entry.external_policy == TrafficPolicy::Local && entry.externally_accessible();
        let pick = |local: bool| -> Vec<&'a PlanEndpoint> {
            if local {
                entry.local_endpoints().collect()
            } else {
                entry.cluster_endpoints().collect()
            }
        };
        Self {
            internal: pick(internal_local),
            external: pick(external_local),
        }
    }
}

fn reals(endpoints: &[&PlanEndpoint]) -> BTreeMap<RealKey, u32> {
    endpoints
        .iter()
        .filter_map(|ep| {
            let real = RealKey {
                addr: parse_ip(&ep.ip)?,
                port: ep.port,
            };
            Some((real, ep.weight.map_or(DEFAULT_WEIGHT, u32::from)))
        })
        .collect()
}

fn render_entry(
    spec: &NodeForwardingPlanSpec,
    index: usize,
    entry: &ServicePlan,
    node_ports: &[IpAddr],
    desired: &mut Desired,
) {
    let family = entry.family;
    let protocol = entry.protocol;
    let Some(cluster_ip) = parse_ip(&entry.cluster_ip) else {
        return;
    };
    let external_local = entry.external_policy == TrafficPolicy::Local && entry.externally_accessible();
    let endpoint_sets = Sets::of(entry);
    let scheduler = entry
        .scheduler
        .clone()
        .or_else(|| spec.cluster.ipvs_scheduler.clone())
        .unwrap_or_else(|| DEFAULT_SCHEDULER.to_string());
    let internal_reals = reals(&endpoint_sets.internal);
    let external_reals = reals(&endpoint_sets.external);
    let listed = (!entry.keep_connections).then(|| {
        let endpoints = entry.endpoints.iter().map(|ep| ep.ip.as_str());
        let unready = entry.unready_ips.iter().map(String::as_str);
        Arc::new(endpoints.chain(unready).filter_map(parse_ip).collect())
    });
    let add = |desired: &mut Desired, key: VirtualKey, reals: &BTreeMap<RealKey, u32>| {
        if let Some(owner) = desired.virtuals.get(&key) {
            let why = format!(
                "virtual server {key} already belongs to spec.services[{}]",
                owner.entry
            );
            desired.conflicts.push((index, why));
            return;
        }
        desired.virtuals.insert(
            key,
            VirtualServer {
                entry: index,
                scheduler: scheduler.clone(),
                persistence: entry.affinity_timeout_seconds,
                reals: reals.clone(),
                listed: listed.clone(),
            },
        );
    };
    let member = |desired: &mut Desired, id: SetId, value: String| {
        if let Some(set) = desired.sets.get_mut(&id.name(family)) {
            set.members.insert(value);
        }
    };
    let key = |addr: IpAddr, port: u16| VirtualKey { addr, protocol, port };
    // REJECT when the service has nothing anywhere; DROP when this node's policy set is empty.
    let verdict = |reals: &BTreeMap<RealKey, u32>| match (entry.has_endpoints, reals.is_empty()) {
        (false, _) => Some(SetId::NoEndpoints),
        (true, true) => Some(SetId::NoLocalEndpoints),
        (true, false) => None,
    };

    // ClusterIP.
    add(desired, key(cluster_ip, entry.port), &internal_reals);
    member(
        desired,
        SetId::ClusterIp,
        ip_port(cluster_ip, protocol, entry.port),
    );
    member(desired, SetId::ServiceIps, cluster_ip.to_string());
    if let Some(id) = verdict(&internal_reals) {
        member(desired, id, ip_port(cluster_ip, protocol, entry.port));
    }

    // External IPs.
    let external_verdict = verdict(&external_reals);
    for ip in entry.external_ips.iter().filter_map(|ip| parse_ip(ip)) {
        add(desired, key(ip, entry.port), &external_reals);
        let id = if external_local {
            SetId::ExternalIpLocal
        } else {
            SetId::ExternalIp
        };
        member(desired, id, ip_port(ip, protocol, entry.port));
        member(desired, SetId::ServiceIps, ip.to_string());
        if let Some(id) = external_verdict {
            member(desired, id, ip_port(ip, protocol, entry.port));
        }
    }

    // LoadBalancer IPs, with their source ranges.
    let ranges: Vec<IpNet> = entry
        .source_ranges
        .iter()
        .filter_map(|r| r.parse::<IpNet>().ok())
        .collect();
    let node_ips: Vec<IpAddr> = spec.node_ips.iter().filter_map(|ip| parse_ip(ip)).collect();
    let allow_from_node = ranges
        .iter()
        .any(|net| node_ips.iter().any(|ip| net.contains(ip)));
    for ip in entry.load_balancer_ips.iter().filter_map(|ip| parse_ip(ip)) {
        add(desired, key(ip, entry.port), &external_reals);
        let frontend = ip_port(ip, protocol, entry.port);
        member(desired, SetId::LoadBalancer, frontend.clone());
        member(desired, SetId::ServiceIps, ip.to_string());
        if external_local {
            member(desired, SetId::LoadBalancerLocal, frontend.clone());
        }
        if !ranges.is_empty() {
            member(desired, SetId::LoadBalancerFirewall, frontend.clone());
            for net in &ranges {
                member(
                    desired,
                    SetId::LoadBalancerSourceCidr,
                    ip_port_net(ip, protocol, entry.port, *net),
                );
            }
            if allow_from_node {
                // A VIP-style LB IP is often local to the node: node → VIP traffic then has the VIP as
                // its source.
                member(
                    desired,
                    SetId::LoadBalancerSourceIp,
                    ip_port_ip(ip, protocol, entry.port, ip),
                );
            }
        }
        if let Some(id) = external_verdict {
            member(desired, id, frontend);
        }
    }

    // NodePort on each node address.
    if let Some(node_port) = entry.node_port {
        for ip in node_ports {
            add(desired, key(*ip, node_port), &external_reals);
            let frontend = ip_port(*ip, protocol, node_port);
            let id = if external_local {
                SetId::NodePortLocal
            } else {
                SetId::NodePort
            };
            member(desired, id, frontend.clone());
            if let Some(id) = external_verdict {
                member(desired, id, frontend);
            }
        }
    }

    if let Some(port) = entry.health_check_node_port {
        member(desired, SetId::HealthCheckNodePort, port.to_string());
    }

    // Hairpin: an endpoint on this node reaching itself through the service must be masqueraded.
    let on_node: BTreeSet<&PlanEndpoint> = endpoint_sets
        .internal
        .iter()
        .chain(&endpoint_sets.external)
        .filter(|ep| ep.on_node)
        .copied()
        .collect();
    for ep in on_node {
        if let Some(ip) = parse_ip(&ep.ip) {
            member(desired, SetId::LoopBack, ip_port_ip(ip, protocol, ep.port, ip));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::Protocol;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn vs(addr: &str, port: u16) -> VirtualKey {
        VirtualKey {
            addr: ip(addr),
            protocol: Protocol::TCP,
            port,
        }
    }

    fn facts() -> HostFacts {
        HostFacts {
            local_addrs: vec![ip("127.0.0.1"), ip("192.168.10.11"), ip("10.96.0.1")],
            ..HostFacts::default()
        }
    }

    #[test]
    fn node_ports_are_served_on_local_addresses_but_never_on_service_ips() {
        let mut spec = plan("node-a", vec![]);
        spec.node_ips = vec!["192.168.10.11".into()];
        let local = [
            ip("127.0.0.1"),
            ip("192.168.10.11"),
            ip("10.0.0.5"),
            ip("10.96.0.1"),
            ip("fe80::1"),
            ip("fd00::11"),
        ];
        let services = BTreeSet::from([ip("10.96.0.1")]);
        assert_eq!(
            node_port_addresses(&spec, IpFamily::IPv4, &local, &services),
            [ip("10.0.0.5"), ip("192.168.10.11")]
        );
        assert_eq!(
            node_port_addresses(&spec, IpFamily::IPv6, &local, &services),
            [ip("fd00::11")]
        );
        spec.cluster.node_port_addresses = vec!["primary".into()];
        assert_eq!(
            node_port_addresses(&spec, IpFamily::IPv4, &local, &services),
            [ip("192.168.10.11")]
        );
    }

    #[test]
    fn schedulers_come_from_the_entry_then_the_cluster_then_rr() {
        let mut spec = plan(
            "node-a",
            vec![
                entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.1.1", 80)),
                entry("ns/b:p", "10.96.0.2", 80).with(ep("10.244.1.2", 80)),
            ],
        );
        std::sync::Arc::make_mut(&mut spec.services[0]).scheduler = Some("sh".into());
        let desired = render(&spec, &facts(), &HashSet::new());
        assert_eq!(desired.virtuals[&vs("10.96.0.1", 80)].scheduler, "sh");
        assert_eq!(desired.virtuals[&vs("10.96.0.2", 80)].scheduler, "rr");
        spec.cluster.ipvs_scheduler = Some("wrr".into());
        let desired = render(&spec, &facts(), &HashSet::from([0]));
        assert_eq!(desired.virtuals[&vs("10.96.0.2", 80)].scheduler, "wrr");
        assert!(!desired.virtuals.contains_key(&vs("10.96.0.1", 80)), "skipped");
        assert!(!desired.addresses.contains(&ip("10.96.0.1")));
    }

    #[test]
    fn local_policies_pick_local_endpoints_per_frontend() {
        let mut e = entry("ns/a:p", "10.96.0.1", 80)
            .with(ep("10.244.1.1", 8080).local())
            .with(ep("10.244.2.1", 8080));
        e.node_port = Some(30080);
        e.external_policy = TrafficPolicy::Local;
        let mut spec = plan("node-a", vec![e]);
        spec.node_ips = vec!["192.168.10.11".into()];
        let desired = render(&spec, &facts(), &HashSet::new());
        let cluster = &desired.virtuals[&vs("10.96.0.1", 80)];
        assert_eq!(cluster.reals.len(), 2);
        let node_port = &desired.virtuals[&vs("192.168.10.11", 30080)];
        assert_eq!(
            node_port.reals.keys().map(|r| r.to_string()).collect::<Vec<_>>(),
            ["10.244.1.1:8080"]
        );
        assert!(
            desired.sets["SWYD-NODE-PORT-LOCAL"]
                .members
                .contains("192.168.10.11,tcp:30080")
        );
        assert!(desired.sets["SWYD-NODE-PORT"].members.is_empty());
        assert!(
            desired.sets["SWYD-LOOP-BACK"]
                .members
                .contains("10.244.1.1,tcp:8080,10.244.1.1")
        );
    }

    #[test]
    fn empty_sets_become_reject_or_drop_frontends() {
        let mut none = entry("ns/none:p", "10.96.0.3", 80);
        none.has_endpoints = false;
        none.node_port = Some(30003);
        let mut remote_only = entry("ns/remote:p", "10.96.0.4", 80).with(ep("10.244.2.1", 80));
        remote_only.node_port = Some(30004);
        remote_only.external_policy = TrafficPolicy::Local;
        let mut spec = plan("node-a", vec![none, remote_only]);
        spec.cluster.node_port_addresses = vec!["primary".into()];
        spec.node_ips = vec!["192.168.10.11".into()];
        let desired = render(&spec, &facts(), &HashSet::new());
        assert_eq!(
            desired.sets["SWYD-NO-ENDPOINTS"].members,
            BTreeSet::from(["10.96.0.3,tcp:80".to_string(), "192.168.10.11,tcp:30003".into()])
        );
        assert_eq!(
            desired.sets["SWYD-NO-LOCAL-EP"].members,
            BTreeSet::from(["192.168.10.11,tcp:30004".to_string()])
        );
        assert!(desired.virtuals[&vs("10.96.0.3", 80)].reals.is_empty());
        assert_eq!(desired.server_count(), 4 + 1);
    }

    #[test]
    fn a_frontend_claimed_twice_is_a_conflict_of_the_later_entry() {
        let mut a = entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.1.1", 80));
        a.external_ips = vec!["203.0.113.1".into()];
        let mut b = entry("ns/b:p", "10.96.0.2", 80).with(ep("10.244.1.2", 80));
        b.external_ips = vec!["203.0.113.1".into()];
        let desired = render(&plan("node-a", vec![a, b]), &facts(), &HashSet::new());
        assert_eq!(desired.conflicts.len(), 1);
        assert_eq!(desired.conflicts[0].0, 1);
        assert_eq!(desired.virtuals[&vs("203.0.113.1", 80)].entry, 0);
    }
}
