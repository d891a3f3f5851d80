//! Readable fixture builders for tests in every crate (feature `testing`).
//!
//! Address conventions used by fixtures and tests across the workspace (all private or documentation
//! ranges, never routed anywhere):
//!
//! | what                         | IPv4               | IPv6                 |
//! |------------------------------|--------------------|----------------------|
//! | node IPs (fabric)            | 192.168.10.0/24    | fd00:192:168:10::/64 |
//! | pod CIDR (cluster)           | 10.244.0.0/16      | fd00:10:244::/56     |
//! | pod CIDR of node N           | 10.244.N.0/24      | fd00:10:244:N::/64   |
//! | ClusterIPs                   | 10.96.0.0/16       | fd00:10:96::/112     |
//! | externalIPs, LB IPs          | 203.0.113.0/24     | 2001:db8:113::/64    |
//! | external clients             | 198.51.100.0/24    | 2001:db8:100::/64    |

use std::sync::Arc;

use crate::{
    plan::{
        Backend, ClusterSettings, DetectLocalMode, IpFamily, NodeForwardingPlanSpec, PlanEndpoint,
        PlanSummary, Protocol, ServicePlan, TrafficPolicy,
    },
    revision,
    slice::{ForwardingSliceSpec, slice_name},
};

/// An endpoint in the Cluster set, not on this node.
pub fn ep(ip: &str, port: u16) -> PlanEndpoint {
    PlanEndpoint {
        ip: ip.into(),
        port,
        cluster: true,
        local: false,
        on_node: false,
        terminating: false,
        weight: None,
    }
}

/// Builder methods for endpoints.
pub trait EndpointExt {
    /// On this node (and in the Local set).
    fn local(self) -> Self;
    /// On this node but not in the Local set.
    fn on_node(self) -> Self;
    /// Not in the Cluster set.
    fn not_cluster(self) -> Self;
    /// Terminating.
    fn terminating(self) -> Self;
    /// IPVS weight.
    fn weight(self, weight: u16) -> Self;
}

impl EndpointExt for PlanEndpoint {
    fn local(mut self) -> Self {
        self.local = true;
        self.on_node = true;
        self
    }
    fn on_node(mut self) -> Self {
        self.on_node = true;
        self
    }
    fn not_cluster(mut self) -> Self {
        self.cluster = false;
        self
    }
    fn terminating(mut self) -> Self {
        self.terminating = true;
        self
    }
    fn weight(mut self, weight: u16) -> Self {
        self.weight = Some(weight);
        self
    }
}

/// A TCP entry with no endpoints (`hasEndpoints: false`); the family follows the ClusterIP.
pub fn entry(name: &str, cluster_ip: &str, port: u16) -> ServicePlan {
    let family = if cluster_ip.contains(':') {
        IpFamily::IPv6
    } else {
        IpFamily::IPv4
    };
    ServicePlan {
        name: name.into(),
        protocol: Protocol::TCP,
        family,
        cluster_ip: cluster_ip.into(),
        port,
        node_port: None,
        external_ips: vec![],
        load_balancer_ips: vec![],
        source_ranges: vec![],
        affinity_timeout_seconds: None,
        external_policy: TrafficPolicy::Cluster,
        internal_policy: TrafficPolicy::Cluster,
        health_check_node_port: None,
        scheduler: None,
        unready_ips: vec![],
        keep_connections: false,
        has_endpoints: false,
        endpoints: vec![],
    }
}

/// Builder methods for entries.
pub trait EntryExt: Sized {
    /// Adds an endpoint; `hasEndpoints` becomes true when it is in a set.
    fn with(self, endpoint: PlanEndpoint) -> Self;
    /// Sets the protocol.
    fn protocol(self, protocol: Protocol) -> Self;
    /// Sets a NodePort.
    fn node_port(self, port: u16) -> Self;
    /// Adds an externalIP.
    fn external_ip(self, ip: &str) -> Self;
    /// Adds a LoadBalancer IP.
    fn lb_ip(self, ip: &str) -> Self;
    /// Adds a source range.
    fn source_range(self, cidr: &str) -> Self;
    /// ClientIP affinity.
    fn affinity(self, seconds: u32) -> Self;
    /// externalTrafficPolicy Local.
    fn etp_local(self) -> Self;
    /// internalTrafficPolicy Local.
    fn itp_local(self) -> Self;
    /// Health-check NodePort.
    fn hc_node_port(self, port: u16) -> Self;
    /// Forces `hasEndpoints` (e.g. true with only remote endpoints under a Local policy).
    fn has_endpoints(self, value: bool) -> Self;
}

impl EntryExt for ServicePlan {
    fn with(mut self, endpoint: PlanEndpoint) -> Self {
        self.has_endpoints |= endpoint.cluster || endpoint.local;
        self.endpoints.push(endpoint);
        self.endpoints.sort();
        self
    }
    fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }
    fn node_port(mut self, port: u16) -> Self {
        self.node_port = Some(port);
        self
    }
    fn external_ip(mut self, ip: &str) -> Self {
        self.external_ips.push(ip.into());
        self
    }
    fn lb_ip(mut self, ip: &str) -> Self {
        self.load_balancer_ips.push(ip.into());
        self
    }
    fn source_range(mut self, cidr: &str) -> Self {
        self.source_ranges.push(cidr.into());
        self
    }
    fn affinity(mut self, seconds: u32) -> Self {
        self.affinity_timeout_seconds = Some(seconds);
        self
    }
    fn etp_local(mut self) -> Self {
        self.external_policy = TrafficPolicy::Local;
        self
    }
    fn itp_local(mut self) -> Self {
        self.internal_policy = TrafficPolicy::Local;
        self
    }
    fn hc_node_port(mut self, port: u16) -> Self {
        self.health_check_node_port = Some(port);
        self
    }
    fn has_endpoints(mut self, value: bool) -> Self {
        self.has_endpoints = value;
        self
    }
}

/// A plan for `node` (IP 192.168.10.11, pod CIDR 10.244.1.0/24, cluster CIDR 10.244.0.0/16, iptables,
/// mark bit 14) with the given entries, sorted, with summary and revision filled in.
pub fn plan(node: &str, services: Vec<ServicePlan>) -> NodeForwardingPlanSpec {
    let mut spec = NodeForwardingPlanSpec {
        node_name: node.into(),
        zone: None,
        node_ips: vec!["192.168.10.11".into()],
        pod_cidrs: vec!["10.244.1.0/24".into()],
        backend: Backend::Iptables,
        cluster: ClusterSettings {
            detect_local: DetectLocalMode::ClusterCIDR,
            local_traffic_cidrs: vec!["10.244.0.0/16".into()],
            local_traffic_interface: None,
            service_cidrs: vec![],
            localhost_node_ports: false,
            masquerade_all: false,
            masquerade_bit: 14,
            node_port_addresses: vec![],
            ipvs_scheduler: None,
        },
        leaving: None,
        revision: String::new(),
        views: vec![],
        endpoints_on_node: vec![],
        local_endpoints: vec![],
        summary: PlanSummary::default(),
        overrides: vec![],
        services: services.into_iter().map(Arc::new).collect(),
    };
    finish(&mut spec);
    spec
}

/// A live plan (the controller's form) for `node` composing `views`, with these overrides.
pub fn live_plan(node: &str, views: &[&str], overrides: Vec<ServicePlan>) -> NodeForwardingPlanSpec {
    let mut spec = plan(node, vec![]);
    spec.views = views.iter().map(|v| v.to_string()).collect();
    spec.overrides = overrides.into_iter().map(Arc::new).collect();
    finish(&mut spec);
    spec
}

/// Slice `index` of `count` of the view `view` (an id such as `all` or `zone-a`; a `zone-` id gets its
/// zone), named as the controller names it, with revision and summary filled in.
pub fn slice(
    view: &str,
    index: u32,
    count: u32,
    mut entries: Vec<ServicePlan>,
) -> (String, ForwardingSliceSpec) {
    entries.sort_by(|a, b| a.key().cmp(&b.key()));
    let entries: Vec<Arc<ServicePlan>> = entries.into_iter().map(Arc::new).collect();
    let mut spec = ForwardingSliceSpec {
        view: view.into(),
        zone: view.strip_prefix("zone-").map(str::to_string),
        node: view.strip_prefix("node-").map(str::to_string),
        service: None,
        index,
        count,
        revision: String::new(),
        summary: PlanSummary::of(&entries),
        entries,
    };
    spec.revision = revision::compute_slice(&spec).unwrap_or_default();
    (slice_name(view, index), spec)
}

/// A Service slice of `view` for `service` (`namespace/name`), shadowing packed slice `index` of
/// `count`, named as the controller names it.
pub fn service_slice(
    view: &str,
    index: u32,
    count: u32,
    service: &str,
    entries: Vec<ServicePlan>,
) -> (String, ForwardingSliceSpec) {
    let (_, mut spec) = slice(view, index, count, entries);
    spec.service = Some(service.to_string());
    spec.revision = revision::compute_slice(&spec).unwrap_or_default();
    (crate::slice::service_slice_name(view, service), spec)
}

/// Re-sorts entries and recomputes summary and revision after a test edited a spec.
pub fn finish(spec: &mut NodeForwardingPlanSpec) {
    spec.services.sort_by(|a, b| a.key().cmp(&b.key()));
    spec.overrides.sort_by(|a, b| a.key().cmp(&b.key()));
    spec.summary = PlanSummary::of(spec.services.iter().chain(&spec.overrides));
    spec.revision = revision::compute(spec).unwrap_or_default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::validate;

    #[test]
    fn fixtures_build_valid_plans() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/svc1:p80", "10.96.0.1", 80).with(ep("10.244.2.5", 8080)),
                entry("ns1/svc2", "10.96.0.2", 53)
                    .protocol(Protocol::UDP)
                    .node_port(30053)
                    .etp_local()
                    .with(ep("10.244.1.5", 53).local()),
                entry("ns1/svc3", "10.96.0.3", 80)
                    .itp_local()
                    .with(ep("10.244.3.5", 80).not_cluster())
                    .has_endpoints(true),
            ],
        );
        assert!(validate(&spec).is_clean(), "{:?}", validate(&spec));
        assert_eq!(spec.summary.entries, 3);
        assert_eq!(spec.revision.len(), revision::REVISION_LEN);
        assert!(spec.services[1].has_endpoints);
        assert!(!spec.services[0].endpoints.is_empty());
    }
}
