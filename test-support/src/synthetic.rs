//! Synthetic clusters for benchmarks and scale simulations (never for semantics tests).
//!
//! ```text
//! Shape { nodes, services, endpoints, zones, shares } ─► Cluster of real k8s-openapi objects (the
//!                                                       controller's planner Snapshot, field for field)
//! ```
//!
//! Every Service has one TCP port (80 → 8080) and one EndpointSlice; endpoints are spread over nodes
//! deterministically. A share of Services is eTP=Local (LoadBalancer with a NodePort and a VIP), a share
//! iTP=Local, and a share carries zone hints (trafficDistribution PreferClose).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec, NodeStatus, Service,
            ServicePort, ServiceSpec, ServiceStatus,
        },
        discovery::v1::{Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

/// A synthetic cluster: the objects a controller would list.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// `v1` Services.
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// `v1` Nodes.
    pub nodes: Vec<Node>,
}

/// The size and mix of a synthetic cluster.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Nodes.
    pub nodes: usize,
    /// Services.
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Zones the nodes are spread over.
    pub zones: usize,
    /// Percent of Services with externalTrafficPolicy Local (LoadBalancer).
    pub etp_local_percent: usize,
    /// Percent of Services with internalTrafficPolicy Local.
    pub itp_local_percent: usize,
    /// Percent of Services with zone hints.
    pub hinted_percent: usize,
}

impl Shape {
    /// The benchmark's default mix: 3 zones, 10% eTP=Local, 5% iTP=Local, 20% zone-hinted.
    pub fn new(nodes: usize, services: usize, endpoints: usize) -> Self {
        Self {
            nodes,
            services,
            endpoints,
            zones: 3,
            etp_local_percent: 10,
            itp_local_percent: 5,
            hinted_percent: 20,
        }
    }
}

/// Name of Node `i`: `node-%04d`.
pub fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

fn zone_of(node: usize, shape: &Shape) -> String {
    format!("zone-{}", node % shape.zones.max(1))
}

/// Node of endpoint `j` of Service `s`.
fn placement(s: usize, j: usize, shape: &Shape) -> usize {
    (s * 7 + j * 131) % shape.nodes.max(1)
}

/// Pod IP of endpoint `j` of Service `s` (unique per cluster; `generation` changes it for churn).
pub fn pod_ip(s: usize, j: usize, generation: usize) -> String {
    let n = (s * 16 + j + generation * 7919) % (1 << 22);
    format!("10.{}.{}.{}", 64 + (n >> 16), (n >> 8) & 0xff, n & 0xff)
}

impl Cluster {
    /// Services, EndpointSlices and Nodes, as the controller's `Snapshot::from` takes them.
    pub fn into_parts(self) -> (Vec<Service>, Vec<EndpointSlice>, Vec<Node>) {
        (self.services, self.slices, self.nodes)
    }
}

/// The cluster.
pub fn cluster(shape: &Shape) -> Cluster {
    let nodes = (0..shape.nodes).map(|i| node(i, shape)).collect();
    let mut services = Vec::with_capacity(shape.services);
    let mut slices = Vec::with_capacity(shape.services);
    for s in 0..shape.services {
        services.push(service(s, shape));
        slices.push(slice(s, shape, 0));
    }
    Cluster {
        services,
        slices,
        nodes,
    }
}

/// Node `i` (`node-%04d`, zone `i mod zones`); `i ≥ shape.nodes` is a Node joining the cluster.
pub fn node(i: usize, shape: &Shape) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(node_name(i)),
            uid: Some(format!("00000000-0000-0000-0000-{i:012}")),
            labels: Some(BTreeMap::from([(
                "topology.kubernetes.io/zone".to_string(),
                zone_of(i, shape),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(format!("10.{}.{}.0/24", 128 + i / 256, i % 256)),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: format!("172.16.{}.{}", i / 250, i % 250 + 1),
            }]),
            ..Default::default()
        }),
    }
}

fn kind_of(s: usize, shape: &Shape) -> (bool, bool, bool) {
    let bucket = s % 100;
    let etp = bucket < shape.etp_local_percent;
    let itp = !etp && bucket < shape.etp_local_percent + shape.itp_local_percent;
    let hinted =
        !etp && !itp && bucket < shape.etp_local_percent + shape.itp_local_percent + shape.hinted_percent;
    (etp, itp, hinted)
}

/// Service `s`.
pub fn service(s: usize, shape: &Shape) -> Service {
    let (etp, itp, _) = kind_of(s, shape);
    let cluster_ip = format!("10.{}.{}.{}", 96 + s / 65536, (s / 256) % 256, s % 256);
    let mut spec = ServiceSpec {
        type_: Some(if etp { "LoadBalancer" } else { "ClusterIP" }.into()),
        cluster_ip: Some(cluster_ip.clone()),
        cluster_ips: Some(vec![cluster_ip]),
        ports: Some(vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            protocol: Some("TCP".into()),
            target_port: Some(IntOrString::Int(8080)),
            node_port: etp.then_some(30000 + (s % 2768) as i32),
            ..Default::default()
        }]),
        ..Default::default()
    };
    if etp {
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32768 + (s % 1000) as i32);
    }
    if itp {
        spec.internal_traffic_policy = Some("Local".into());
    }
    let status = etp.then(|| ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(format!("203.0.{}.{}", (s / 250) % 250, s % 250 + 1)),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    Service {
        metadata: ObjectMeta {
            name: Some(format!("svc-{s:05}")),
            namespace: Some("bench".into()),
            ..Default::default()
        },
        spec: Some(spec),
        status,
    }
}

/// The EndpointSlice of Service `s`; `generation` > 0 moves its first endpoint to a new pod IP.
pub fn slice(s: usize, shape: &Shape, generation: usize) -> EndpointSlice {
    let (_, _, hinted) = kind_of(s, shape);
    let endpoints = (0..shape.endpoints)
        .map(|j| {
            let node = placement(s, j, shape);
            let ip = pod_ip(s, j, if j == 0 { generation } else { 0 });
            Endpoint {
                addresses: vec![ip],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: Some(node_name(node)),
                zone: Some(zone_of(node, shape)),
                hints: hinted.then(|| EndpointHints {
                    for_zones: Some(vec![ForZone {
                        name: zone_of(node, shape),
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("svc-{s:05}-abcde")),
            namespace: Some("bench".into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_string(),
                format!("svc-{s:05}"),
            )])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// `namespace/name` of Service `s`.
pub fn service_key(s: usize) -> String {
    format!("bench/svc-{s:05}")
}
