//! Test fixtures: real k8s-openapi objects built readably, kube-proxy `makeTestService` style.
//!
//! Address conventions: see `switchyard_api::testing` (nodes 192.168.10.0/24, pods 10.244.N.0/24 on
//! node N, ClusterIPs 10.96.0.0/16, external/LB IPs 203.0.113.0/24, clients 198.51.100.0/24).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec, NodeStatus,
            ObjectReference, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig,
        },
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::Snapshot;

/// A ClusterIP Service with no ports.
pub fn service(namespace: &str, name: &str, cluster_ip: &str, mutate: impl FnOnce(&mut Service)) -> Service {
    let mut svc = Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(cluster_ip.into()),
            cluster_ips: Some(vec![cluster_ip.into()]),
            ..Default::default()
        }),
        status: None,
    };
    mutate(&mut svc);
    svc
}

/// Mutators for Services.
pub trait ServiceExt {
    /// The spec (present in every fixture).
    fn spec_mut(&mut self) -> &mut ServiceSpec;
    /// Adds a port.
    fn port(&mut self, name: &str, port: i32, protocol: &str) -> &mut Self;
    /// Adds a port with a NodePort.
    fn node_port(&mut self, name: &str, port: i32, node_port: i32) -> &mut Self;
    /// Sets the type.
    fn type_(&mut self, t: &str) -> &mut Self;
    /// Adds a LoadBalancer ingress IP (ipMode VIP unless given).
    fn lb_ingress(&mut self, ip: &str, mode: Option<&str>) -> &mut Self;
    /// ClientIP affinity with an optional timeout.
    fn affinity(&mut self, timeout: Option<i32>) -> &mut Self;
    /// Sets a label.
    fn label(&mut self, key: &str, value: &str) -> &mut Self;
    /// Sets an annotation.
    fn annotate(&mut self, key: &str, value: &str) -> &mut Self;
}

impl ServiceExt for Service {
    fn spec_mut(&mut self) -> &mut ServiceSpec {
        self.spec.get_or_insert_with(Default::default)
    }
    fn port(&mut self, name: &str, port: i32, protocol: &str) -> &mut Self {
        self.spec_mut()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                port,
                protocol: Some(protocol.into()),
                ..Default::default()
            });
        self
    }
    fn node_port(&mut self, name: &str, port: i32, node_port: i32) -> &mut Self {
        self.spec_mut()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                port,
                node_port: Some(node_port),
                protocol: Some("TCP".into()),
                ..Default::default()
            });
        self
    }
    fn type_(&mut self, t: &str) -> &mut Self {
        self.spec_mut().type_ = Some(t.into());
        self
    }
    fn lb_ingress(&mut self, ip: &str, mode: Option<&str>) -> &mut Self {
        let status = self.status.get_or_insert_with(ServiceStatus::default);
        let lb = status
            .load_balancer
            .get_or_insert_with(LoadBalancerStatus::default);
        lb.ingress.get_or_insert_with(Vec::new).push(LoadBalancerIngress {
            ip: Some(ip.into()),
            ip_mode: mode.map(Into::into),
            ..Default::default()
        });
        self
    }
    fn affinity(&mut self, timeout: Option<i32>) -> &mut Self {
        let spec = self.spec_mut();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config = timeout.map(|t| SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(t),
            }),
        });
        self
    }
    fn label(&mut self, key: &str, value: &str) -> &mut Self {
        self.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
    fn annotate(&mut self, key: &str, value: &str) -> &mut Self {
        self.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
}

/// An endpoint: ready, on `node`.
pub fn endpoint(ip: &str, node: &str) -> Endpoint {
    Endpoint {
        addresses: vec![ip.into()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        node_name: (!node.is_empty()).then(|| node.into()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(format!("pod-{ip}")),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Mutators for endpoints.
pub trait EndpointExt {
    /// Sets ready / serving / terminating.
    fn conditions(self, ready: bool, serving: bool, terminating: bool) -> Self;
    /// Zone hints.
    fn zone_hints(self, zones: &[&str]) -> Self;
    /// Node hints.
    fn node_hints(self, nodes: &[&str]) -> Self;
}

impl EndpointExt for Endpoint {
    fn conditions(mut self, ready: bool, serving: bool, terminating: bool) -> Self {
        self.conditions = Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        });
        self
    }
    fn zone_hints(mut self, zones: &[&str]) -> Self {
        let hints = self.hints.get_or_insert_with(EndpointHints::default);
        hints.for_zones = Some(zones.iter().map(|z| ForZone { name: (*z).into() }).collect());
        self
    }
    fn node_hints(mut self, nodes: &[&str]) -> Self {
        let hints = self.hints.get_or_insert_with(EndpointHints::default);
        hints.for_nodes = Some(nodes.iter().map(|n| ForNode { name: (*n).into() }).collect());
        self
    }
}

/// An IPv4 EndpointSlice for `namespace/service` with the given ports (name, port, protocol).
pub fn slice(
    namespace: &str,
    service: &str,
    ports: &[(&str, i32, &str)],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    slice_named(
        namespace,
        service,
        &format!("{service}-abc"),
        "IPv4",
        ports,
        endpoints,
    )
}

/// An EndpointSlice with every field chosen.
pub fn slice_named(
    namespace: &str,
    service: &str,
    name: &str,
    address_type: &str,
    ports: &[(&str, i32, &str)],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".into(),
                service.into(),
            )])),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Some(endpoints),
        ports: Some(
            ports
                .iter()
                .map(|(name, port, protocol)| EndpointPort {
                    name: Some((*name).into()),
                    port: Some(*port),
                    protocol: Some((*protocol).into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// A Node with an InternalIP, a pod CIDR and an optional zone.
pub fn node(name: &str, ip: &str, pod_cidr: &str, zone: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            labels: zone.map(|z| BTreeMap::from([("topology.kubernetes.io/zone".into(), z.into())])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(pod_cidr.into()),
            pod_cidrs: Some(vec![pod_cidr.into()]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
    }
}

/// node-a/b (zone-a) and node-c (zone-b), 192.168.10.11-13, pod CIDRs 10.244.1-3.0/24.
pub fn three_nodes() -> Vec<Node> {
    vec![
        node("node-a", "192.168.10.11", "10.244.1.0/24", Some("zone-a")),
        node("node-b", "192.168.10.12", "10.244.2.0/24", Some("zone-a")),
        node("node-c", "192.168.10.13", "10.244.3.0/24", Some("zone-b")),
    ]
}

/// A snapshot of the three nodes with the given services and slices.
pub fn snapshot(services: Vec<Service>, slices: Vec<EndpointSlice>) -> Snapshot {
    Snapshot {
        services,
        slices,
        nodes: three_nodes(),
    }
}
