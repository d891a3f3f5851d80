//! Pods from EndpointSlices: every distinct endpoint address ─► one [`LabPod`] on its node.
//!
//! ```text
//! EndpointSlice (IPv4) ─► endpoint.addresses[0] ─┬─ = a node's InternalIP ─► host-network pod in that node's netns
//!   ports (TCP/UDP)      targetRef.name          └─ otherwise ─► routed pod on endpoint.nodeName
//!                                                                 (else the node whose podCIDR holds it)
//! ```
//!
//! A pod listens on the union of the ports of every slice it appears in. SCTP ports, ports without a
//! number, IPv6 and FQDN slices are skipped: the lab is IPv4, TCP and UDP. A TCP port with
//! `appProtocol: switchyard.io/echo` is served as an echo (its answer line, then every byte back), for
//! long-lived connections that exchange data; every other TCP port answers one line and half-closes.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use ipnet::Ipv4Net;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use switchyard_api::ip::parse_ip_sloppy;

use crate::{
    error::{LabError, Result},
    members::{LabNode, LabPod},
    names::{self, NetnsNames},
};

/// A pod before it has namespace and interface names.
struct Draft {
    name: String,
    node: String,
    host_network: bool,
    tcp_ports: BTreeSet<u16>,
    udp_ports: BTreeSet<u16>,
    echo_ports: BTreeSet<u16>,
}

/// The ports of a slice, by how they are served.
#[derive(Default)]
struct SlicePorts {
    tcp: BTreeSet<u16>,
    udp: BTreeSet<u16>,
    echo: BTreeSet<u16>,
}

/// The `appProtocol` of a slice port that a pod serves as an echo.
pub(crate) const ECHO_APP_PROTOCOL: &str = "switchyard.io/echo";

/// Plans the pods of `slices` on `nodes`; `fabric` is the node subnet no routed pod may use.
pub(crate) fn plan_pods(
    id: &str,
    slices: &[EndpointSlice],
    nodes: &[LabNode],
    fabric: Ipv4Net,
    netns_names: &mut NetnsNames,
) -> Result<Vec<LabPod>> {
    let mut drafts: BTreeMap<Ipv4Addr, Draft> = BTreeMap::new();
    for slice in slices.iter().filter(|slice| slice.address_type == "IPv4") {
        let ports = slice_ports(slice);
        for endpoint in slice.endpoints.iter().flatten() {
            let Some(ip) = endpoint_ipv4(endpoint) else {
                continue;
            };
            let (name, node, host_network) = place_endpoint(ip, endpoint, nodes, fabric)?;
            let draft = drafts.entry(ip).or_insert_with(|| Draft {
                name: name.clone(),
                node: node.clone(),
                host_network,
                tcp_ports: BTreeSet::new(),
                udp_ports: BTreeSet::new(),
                echo_ports: BTreeSet::new(),
            });
            if draft.name != name || draft.node != node {
                return Err(LabError::Layout(format!(
                    "address {ip} is pod {} on {} in one slice and pod {name} on {node} in another",
                    draft.name, draft.node
                )));
            }
            draft.tcp_ports.extend(&ports.tcp);
            draft.udp_ports.extend(&ports.udp);
            draft.echo_ports.extend(&ports.echo);
        }
    }
    check_unique_names(&drafts)?;
    Ok(assign_names(id, drafts, nodes, netns_names))
}

/// The TCP, UDP and echo port numbers of a slice.
fn slice_ports(slice: &EndpointSlice) -> SlicePorts {
    let mut ports = SlicePorts::default();
    for port in slice.ports.iter().flatten() {
        let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) else {
            continue;
        };
        let echo = port.app_protocol.as_deref() == Some(ECHO_APP_PROTOCOL);
        match port.protocol.as_deref().unwrap_or("TCP") {
            "TCP" if echo => ports.echo.insert(number),
            "TCP" => ports.tcp.insert(number),
            "UDP" => ports.udp.insert(number),
            _ => false,
        };
    }
    ports
}

fn endpoint_ipv4(endpoint: &Endpoint) -> Option<Ipv4Addr> {
    match parse_ip_sloppy(endpoint.addresses.first()?)? {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(_) => None,
    }
}

/// The pod name, its node and whether it is host-network.
fn place_endpoint(
    ip: Ipv4Addr,
    endpoint: &Endpoint,
    nodes: &[LabNode],
    fabric: Ipv4Net,
) -> Result<(String, String, bool)> {
    let name = endpoint
        .target_ref
        .as_ref()
        .and_then(|target| target.name.clone())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("pod-{}", ip.to_string().replace('.', "-")));
    if let Some(node) = nodes.iter().find(|node| node.ip == ip) {
        return Ok((name, node.name.clone(), true));
    }
    if fabric.contains(&ip) {
        return Err(LabError::Layout(format!(
            "pod {name} at {ip} is inside the fabric subnet {fabric} but is no node's address"
        )));
    }
    let node = match &endpoint.node_name {
        Some(node_name) => nodes.iter().find(|node| &node.name == node_name).ok_or_else(|| {
            LabError::Layout(format!(
                "pod {name} at {ip} is on node {node_name}, which is not a Node"
            ))
        })?,
        None => nodes
            .iter()
            .find(|node| node.pod_cidrs.iter().any(|cidr| cidr.contains(&ip)))
            .ok_or_else(|| {
                LabError::Layout(format!(
                    "pod {name} at {ip} has no nodeName and is in no node's pod CIDR"
                ))
            })?,
    };
    Ok((name, node.name.clone(), false))
}

fn check_unique_names(drafts: &BTreeMap<Ipv4Addr, Draft>) -> Result<()> {
    let mut seen: BTreeMap<&str, Ipv4Addr> = BTreeMap::new();
    for (ip, draft) in drafts {
        if let Some(other) = seen.insert(&draft.name, *ip) {
            return Err(LabError::Layout(format!(
                "two pods are named {} ({other} and {ip}); backends answer with their name, so names must be unique",
                draft.name
            )));
        }
    }
    Ok(())
}

/// Orders pods by node, then address, and names their namespaces and node-side veths.
fn assign_names(
    id: &str,
    drafts: BTreeMap<Ipv4Addr, Draft>,
    nodes: &[LabNode],
    netns_names: &mut NetnsNames,
) -> Vec<LabPod> {
    let mut pods = Vec::with_capacity(drafts.len());
    for node in nodes {
        let mut routed = 0;
        for (ip, draft) in drafts.iter().filter(|(_, draft)| draft.node == node.name) {
            let (netns, node_veth) = if draft.host_network {
                (node.netns.clone(), None)
            } else {
                routed += 1;
                (
                    netns_names.pod(id, &draft.name),
                    Some(names::pod_veth(routed - 1)),
                )
            };
            pods.push(LabPod {
                name: draft.name.clone(),
                ip: *ip,
                node: node.name.clone(),
                host_network: draft.host_network,
                netns,
                node_veth,
                // NB: a port one slice names echo is an echo everywhere: one socket serves it.
                tcp_ports: draft.tcp_ports.difference(&draft.echo_ports).copied().collect(),
                udp_ports: draft.udp_ports.clone(),
                echo_ports: draft.echo_ports.clone(),
            });
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::{cluster::ClusterDescription, layout::Layout, options::LabOptions};

    fn layout_of(yaml: &str) -> crate::error::Result<Layout> {
        let mut text = include_str!("../testdata/cluster.yaml").to_owned();
        text.push_str("---\n");
        text.push_str(yaml);
        let description = ClusterDescription::from_yaml(&text)?;
        Layout::plan("sy0001", &description, &LabOptions::with_binary("/bin/false"))
    }

    #[test]
    fn pods_of_the_example_cluster() {
        let layout = layout_of("").unwrap();
        let pods: Vec<String> = layout
            .pods
            .iter()
            .map(|p| {
                let veth = p.node_veth.as_deref().unwrap_or("-");
                format!(
                    "{} {} {} {} {} tcp{:?} udp{:?}",
                    p.name, p.ip, p.node, p.netns, veth, p.tcp_ports, p.udp_ports
                )
            })
            .collect();
        assert_eq!(
            pods,
            [
                "web-a1 10.244.1.10 node-a sy0001-pod-web-a1 pv0 tcp{8080} udp{}",
                "web-a2 10.244.1.11 node-a sy0001-pod-web-a2 pv1 tcp{8080} udp{}",
                "web-b1 10.244.2.10 node-b sy0001-pod-web-b1 pv0 tcp{8080} udp{}",
                "hostnet-b 192.168.10.12 node-b sy0001-node-b - tcp{9000} udp{}",
                "edge-c1 10.244.3.20 node-c sy0001-pod-edge-c1 pv0 tcp{8443} udp{}",
                "dns-c1 10.244.3.53 node-c sy0001-pod-dns-c1 pv1 tcp{53} udp{53}",
            ]
        );
        assert!(layout.pods[3].host_network);
    }

    const EXTRA: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: extra, namespace: default}
addressType: IPv4
ports: [{port: 7000, protocol: UDP}, {port: 7001, protocol: SCTP}]
endpoints:
- addresses: ["10.244.1.010"]
  targetRef: {kind: Pod, name: web-a1}
- addresses: ["10.244.2.99"]
- addresses: ["10.77.0.1"]
  nodeName: node-c
"#;

    #[test]
    fn merges_ports_and_places_pods_without_node_names() {
        let layout = layout_of(EXTRA).unwrap();
        let web = layout.pod("web-a1").unwrap();
        assert_eq!(web.udp_ports.iter().copied().collect::<Vec<_>>(), [7000]);
        let anonymous = layout.pod("pod-10-244-2-99").unwrap();
        assert_eq!(anonymous.node, "node-b");
        let stray: Vec<_> = layout
            .stray_pods()
            .iter()
            .map(|(ip, node)| (ip.to_string(), node.name.clone()))
            .collect();
        assert_eq!(stray, [("10.77.0.1".to_owned(), "node-c".to_owned())]);
    }

    #[test]
    fn a_tcp_port_whose_app_protocol_says_echo_is_served_as_an_echo() {
        let echo = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo, namespace: default}
addressType: IPv4
ports:
- {name: http, port: 8080}
- {name: echo, port: 7007, appProtocol: switchyard.io/echo}
- {name: echo-udp, port: 7008, protocol: UDP, appProtocol: switchyard.io/echo}
- {name: echo, port: 7009}
endpoints:
- addresses: ["10.244.1.10"]
  targetRef: {kind: Pod, name: web-a1}
"#;
        let layout = layout_of(echo).unwrap();
        let web = layout.pod("web-a1").unwrap();
        let listed = |ports: &BTreeSet<u16>| ports.iter().copied().collect::<Vec<_>>();
        assert_eq!(
            (
                listed(&web.tcp_ports),
                listed(&web.echo_ports),
                listed(&web.udp_ports)
            ),
            (vec![7009, 8080], vec![7007], vec![7008])
        );
    }

    #[test]
    fn rejects_unplaceable_and_conflicting_pods() {
        let nowhere = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\nendpoints: [{addresses: [10.99.0.1]}]\n";
        assert!(
            layout_of(nowhere)
                .unwrap_err()
                .to_string()
                .contains("no nodeName")
        );
        let renamed = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.10], targetRef: {name: other}}]\n";
        assert!(layout_of(renamed).unwrap_err().to_string().contains("in another"));
        let twin = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.12], targetRef: {name: web-a1}}]\n";
        assert!(
            layout_of(twin)
                .unwrap_err()
                .to_string()
                .contains("two pods are named web-a1")
        );
        let unknown = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.12], nodeName: node-z}]\n";
        assert!(layout_of(unknown).unwrap_err().to_string().contains("not a Node"));
    }
}
