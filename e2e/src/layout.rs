//! The lab's shape, decided before anything is built: description + options ─► [`Layout`] (pure).
//!
//! ```text
//! ClusterDescription ─► nodes (InternalIP, podCIDRs, zone)      ─┐
//!                    ─► pods  (see `pods`: one per endpoint IP)  ─┼─► Layout ─► script (ip batches)
//!                    ─► client routes (service/external/LB IPs)  ─┤         └─► Lab accessors, servers
//! options.balancer_ip ─► an outside load balancer on the fabric   ─┘
//! ```
//!
//! The layout names every namespace and interface and checks the addressing (one fabric subnet, the
//! client and the balancer outside every pod CIDR, pods on known nodes), so a description the lab
//! cannot build fails here, before any namespace exists.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Node, Service};
use switchyard_api::ip::{parse_cidr_sloppy, parse_ip_sloppy};

pub use crate::members::{LabNode, LabPod};
use crate::{
    cluster::ClusterDescription,
    error::{LabError, Result},
    names::{self, NetnsNames},
    options::LabOptions,
    pods,
};

/// The zone label the lab reads from Nodes.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Everything the lab builds, by name.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The lab id, prefix of every namespace name.
    pub id: String,
    /// The fabric namespace (holds the bridge).
    pub fabric_netns: String,
    /// The fabric subnet shared by nodes and the client.
    pub fabric_subnet: Ipv4Net,
    /// The nodes, in description order.
    pub nodes: Vec<LabNode>,
    /// The pods, grouped by node, then by address.
    pub pods: Vec<LabPod>,
    /// The external client.
    pub client: LabClient,
    /// The outside load balancer's host, when the options ask for one.
    pub balancer: Option<LabBalancer>,
}

/// The outside load balancer's host on the fabric: no routes beyond the fabric, so it reaches the
/// nodes' own addresses only, as a cloud load balancer reaches NodePorts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabBalancer {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its namespace.
    pub netns: String,
}

/// The external client on the fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabClient {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its namespace.
    pub netns: String,
    /// Routes towards services: destination ─► node.
    pub routes: Vec<(Ipv4Net, String)>,
}

impl Layout {
    /// Decides the lab for `description`, or says why it cannot be built.
    pub fn plan(id: &str, description: &ClusterDescription, options: &LabOptions) -> Result<Layout> {
        let mut netns_names = NetnsNames::new(id);
        let nodes = plan_nodes(id, &description.nodes, &mut netns_names)?;
        let fabric_subnet = fabric_subnet(&nodes, options)?;
        let pods = pods::plan_pods(
            id,
            &description.endpoint_slices,
            &nodes,
            fabric_subnet,
            &mut netns_names,
        )?;
        let client = plan_client(id, &description.services, &nodes, options)?;
        let balancer = match options.balancer_ip {
            Some(ip) if ip == options.client_ip => {
                return Err(LabError::Layout(format!(
                    "the balancer address {ip} is the client's"
                )));
            }
            Some(ip) => {
                check_fabric_host("the balancer", ip, fabric_subnet, &nodes)?;
                Some(LabBalancer {
                    ip,
                    netns: names::balancer_netns(id),
                })
            }
            None => None,
        };
        Ok(Layout {
            id: id.to_owned(),
            fabric_netns: names::fabric_netns(id),
            fabric_subnet,
            nodes,
            pods,
            client,
            balancer,
        })
    }

    /// Every namespace of the lab, fabric first.
    pub fn all_netns(&self) -> Vec<String> {
        let mut all = vec![self.fabric_netns.clone(), self.client.netns.clone()];
        all.extend(self.balancer.iter().map(|balancer| balancer.netns.clone()));
        all.extend(self.nodes.iter().map(|node| node.netns.clone()));
        all.extend(
            self.pods
                .iter()
                .filter(|pod| !pod.host_network)
                .map(|pod| pod.netns.clone()),
        );
        all
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&LabNode> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .ok_or_else(|| self.unknown("node", name))
    }

    /// The pod called `name`.
    pub fn pod(&self, name: &str) -> Result<&LabPod> {
        self.pods
            .iter()
            .find(|pod| pod.name == name)
            .ok_or_else(|| self.unknown("pod", name))
    }

    /// The IP addresses of pods routed outside their node's pod CIDRs, with that node.
    pub(crate) fn stray_pods(&self) -> Vec<(Ipv4Addr, &LabNode)> {
        self.pods
            .iter()
            .filter(|pod| !pod.host_network)
            .filter_map(|pod| {
                let node = self.nodes.iter().find(|node| node.name == pod.node)?;
                let inside = node.pod_cidrs.iter().any(|cidr| cidr.contains(&pod.ip));
                (!inside).then_some((pod.ip, node))
            })
            .collect()
    }

    fn unknown(&self, kind: &'static str, name: &str) -> LabError {
        LabError::UnknownPlace {
            kind,
            name: name.to_owned(),
            lab: self.id.clone(),
        }
    }
}

fn plan_nodes(id: &str, nodes: &[Node], netns_names: &mut NetnsNames) -> Result<Vec<LabNode>> {
    let mut planned: Vec<LabNode> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(LabError::Layout("a Node has no metadata.name".into()));
        }
        if planned.iter().any(|other| other.name == name) {
            return Err(LabError::Layout(format!("Node {name} appears twice")));
        }
        let ip = internal_ipv4(node).ok_or_else(|| {
            LabError::Layout(format!("Node {name} has no IPv4 InternalIP in status.addresses"))
        })?;
        if let Some(other) = planned.iter().find(|other| other.ip == ip) {
            return Err(LabError::Layout(format!(
                "Nodes {} and {name} share the address {ip}",
                other.name
            )));
        }
        let zone = node
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(ZONE_LABEL))
            .cloned();
        planned.push(LabNode {
            pod_cidrs: pod_cidrs(node),
            zone,
            netns: netns_names.node(id, &name),
            fabric_port: names::fabric_port(planned.len()),
            name,
            ip,
        });
    }
    if planned.is_empty() {
        return Err(LabError::Layout("the description has no Nodes".into()));
    }
    for node in &planned {
        if let Some(owner) = planned
            .iter()
            .find(|other| other.pod_cidrs.iter().any(|c| c.contains(&node.ip)))
        {
            return Err(LabError::Layout(format!(
                "Node {}'s address {} is inside Node {}'s pod CIDR",
                node.name, node.ip, owner.name
            )));
        }
    }
    Ok(planned)
}

fn internal_ipv4(node: &Node) -> Option<Ipv4Addr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses
        .iter()
        .filter(|address| address.type_ == "InternalIP")
        .find_map(|address| match parse_ip_sloppy(&address.address)? {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
}

fn pod_cidrs(node: &Node) -> Vec<Ipv4Net> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let listed = spec.pod_cidrs.clone().filter(|cidrs| !cidrs.is_empty());
    let texts = listed.unwrap_or_else(|| spec.pod_cidr.iter().cloned().collect());
    texts
        .iter()
        .filter_map(|text| match parse_cidr_sloppy(text)? {
            ipnet::IpNet::V4(net) => Some(net),
            ipnet::IpNet::V6(_) => None,
        })
        .collect()
}

fn fabric_subnet(nodes: &[LabNode], options: &LabOptions) -> Result<Ipv4Net> {
    let subnet = Ipv4Net::new(options.client_ip, options.fabric_prefix_len)
        .map_err(|error| LabError::Layout(format!("fabric prefix length: {error}")))?
        .trunc();
    for node in nodes {
        if !subnet.contains(&node.ip) {
            return Err(LabError::Layout(format!(
                "Node {}'s address {} is outside the fabric subnet {subnet} (the client is {})",
                node.name, node.ip, options.client_ip
            )));
        }
    }
    check_fabric_host("the client", options.client_ip, subnet, nodes)?;
    Ok(subnet)
}

/// A host outside the cluster on the fabric (`what`: "the client", "the balancer") needs an address
/// of the fabric that no node has and no pod CIDR holds.
fn check_fabric_host(what: &str, ip: Ipv4Addr, subnet: Ipv4Net, nodes: &[LabNode]) -> Result<()> {
    if !subnet.contains(&ip) {
        return Err(LabError::Layout(format!(
            "{what}'s address {ip} is outside the fabric subnet {subnet}"
        )));
    }
    if let Some(node) = nodes.iter().find(|node| node.ip == ip) {
        return Err(LabError::Layout(format!(
            "Node {} has {what}'s address",
            node.name
        )));
    }
    if let Some(node) = nodes
        .iter()
        .find(|node| node.pod_cidrs.iter().any(|cidr| cidr.contains(&ip)))
    {
        return Err(LabError::Layout(format!(
            "{what}'s address {ip} is inside Node {}'s pod CIDR",
            node.name
        )));
    }
    if ip == subnet.network() || ip == subnet.broadcast() {
        return Err(LabError::Layout(format!(
            "{what}'s address {ip} is not a host address"
        )));
    }
    Ok(())
}

fn plan_client(id: &str, services: &[Service], nodes: &[LabNode], options: &LabOptions) -> Result<LabClient> {
    let gateway = match &options.client_gateway {
        Some(name) => nodes
            .iter()
            .find(|node| &node.name == name)
            .ok_or_else(|| LabError::Layout(format!("the client gateway {name} is not a Node")))?,
        None => nodes.first().ok_or_else(|| LabError::Layout("no Nodes".into()))?,
    };
    let excluded: BTreeSet<Ipv4Addr> = nodes
        .iter()
        .map(|node| node.ip)
        .chain([options.client_ip])
        .collect();
    let destinations: BTreeSet<Ipv4Addr> = services
        .iter()
        .flat_map(service_ips)
        .filter(|ip| !excluded.contains(ip) && !ip.is_unspecified())
        .collect();
    Ok(LabClient {
        ip: options.client_ip,
        netns: names::client_netns(id),
        routes: destinations
            .into_iter()
            .map(|ip| (Ipv4Net::from(ip), gateway.name.clone()))
            .collect(),
    })
}

/// The IPv4 cluster, external and load-balancer addresses of a Service.
fn service_ips(service: &Service) -> Vec<Ipv4Addr> {
    let mut texts: Vec<String> = Vec::new();
    if let Some(spec) = &service.spec {
        texts.extend(spec.cluster_ip.iter().cloned());
        texts.extend(spec.cluster_ips.iter().flatten().cloned());
        texts.extend(spec.external_ips.iter().flatten().cloned());
        texts.extend(spec.load_balancer_ip.iter().cloned());
    }
    let ingress = service
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    texts.extend(
        ingress
            .into_iter()
            .flatten()
            .filter_map(|ingress| ingress.ip.clone()),
    );
    texts
        .iter()
        .filter_map(|text| match parse_ip_sloppy(text)? {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> ClusterDescription {
        ClusterDescription::from_yaml(include_str!("../testdata/cluster.yaml")).unwrap()
    }

    fn options() -> LabOptions {
        LabOptions::with_binary("/bin/false")
    }

    #[test]
    fn plans_the_example_cluster() {
        let layout = Layout::plan("sy0001", &example(), &options()).unwrap();
        let nodes: Vec<_> = layout
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.ip, n.netns.as_str()))
            .collect();
        assert_eq!(
            nodes,
            [
                ("node-a", Ipv4Addr::new(192, 168, 10, 11), "sy0001-node-a"),
                ("node-b", Ipv4Addr::new(192, 168, 10, 12), "sy0001-node-b"),
                ("node-c", Ipv4Addr::new(192, 168, 10, 13), "sy0001-node-c"),
            ]
        );
        assert_eq!(layout.nodes[2].zone.as_deref(), Some("zone-2"));
        assert_eq!(layout.fabric_subnet.to_string(), "192.168.10.0/24");
        let routes: Vec<String> = layout
            .client
            .routes
            .iter()
            .map(|(dst, via)| format!("{dst}>{via}"))
            .collect();
        assert_eq!(
            routes,
            [
                "10.96.0.10/32>node-a",
                "10.96.0.20/32>node-a",
                "10.96.0.30/32>node-a",
                "10.96.0.53/32>node-a",
                "198.51.100.10/32>node-a",
                "203.0.113.10/32>node-a",
            ]
        );
        assert!(layout.stray_pods().is_empty());
        let all = layout.all_netns();
        assert_eq!(all.len(), 1 + 1 + 3 + 5, "{all:?}");
    }

    #[test]
    fn rejects_a_client_inside_a_pod_cidr() {
        let mut options = options();
        options.client_ip = Ipv4Addr::new(10, 244, 1, 200);
        options.fabric_prefix_len = 0;
        let error = Layout::plan("sy0001", &example(), &options).unwrap_err();
        assert!(
            error.to_string().contains("inside Node node-a's pod CIDR"),
            "{error}"
        );
    }

    #[test]
    fn rejects_nodes_outside_the_fabric() {
        let mut options = options();
        options.client_ip = Ipv4Addr::new(192, 168, 11, 200);
        let error = Layout::plan("sy0001", &example(), &options).unwrap_err();
        assert!(error.to_string().contains("outside the fabric subnet"), "{error}");
    }

    #[test]
    fn a_balancer_gets_its_own_namespace_on_the_fabric_when_asked_for() {
        assert_eq!(
            Layout::plan("sy0001", &example(), &options()).unwrap().balancer,
            None
        );
        let mut options = options();
        options.balancer_ip = Some(Ipv4Addr::new(192, 168, 10, 250));
        let layout = Layout::plan("sy0001", &example(), &options).unwrap();
        let balancer = layout.balancer.clone().unwrap();
        assert_eq!(
            (balancer.ip, balancer.netns.as_str()),
            (Ipv4Addr::new(192, 168, 10, 250), "sy0001-balancer")
        );
        assert!(layout.all_netns().contains(&balancer.netns));
        for (ip, why) in [
            ([192, 168, 10, 12], "Node node-b has the balancer's address"),
            ([192, 168, 10, 200], "is the client's"),
            ([192, 168, 11, 250], "outside the fabric subnet"),
            ([192, 168, 10, 255], "not a host address"),
        ] {
            options.balancer_ip = Some(Ipv4Addr::from(ip));
            let error = Layout::plan("sy0001", &example(), &options).unwrap_err();
            assert!(error.to_string().contains(why), "{error}");
        }
    }

    #[test]
    fn honours_the_client_gateway() {
        let mut options = options();
        options.client_gateway = Some("node-c".into());
        let layout = Layout::plan("sy0001", &example(), &options).unwrap();
        assert!(layout.client.routes.iter().all(|(_, via)| via == "node-c"));
        options.client_gateway = Some("nope".into());
        assert!(Layout::plan("sy0001", &example(), &options).is_err());
    }
}
