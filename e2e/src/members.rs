//! A node and a pod of the lab as [`Layout`](crate::Layout) holds them: plain records that `layout`
//! (nodes) and `pods` (the pods on those nodes) both build, so neither module needs the other's.
//! `layout` re-exports both: `layout::{LabNode, LabPod}` still names them.

use std::{collections::BTreeSet, net::Ipv4Addr};

use ipnet::Ipv4Net;

/// A lab node: a namespace on the fabric that routes to its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabNode {
    /// The Node's name.
    pub name: String,
    /// Its first InternalIP, the address of its `eth0` on the fabric.
    pub ip: Ipv4Addr,
    /// Its IPv4 pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
    pub pod_cidrs: Vec<Ipv4Net>,
    /// Its `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
    /// Its namespace.
    pub netns: String,
    /// Its port on the fabric bridge.
    pub fabric_port: String,
}

/// A lab pod: a backend serving the ports of every slice it appears in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabPod {
    /// The pod name (`targetRef.name`, else `pod-<ip>`); what its server answers with.
    pub name: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The node it lives on.
    pub node: String,
    /// True when its address is its node's InternalIP: it is served from the node's namespace.
    pub host_network: bool,
    /// Its namespace (the node's, for host-network pods).
    pub netns: String,
    /// The node-side veth (routed pods only).
    pub node_veth: Option<String>,
    /// TCP ports it listens on.
    pub tcp_ports: BTreeSet<u16>,
    /// UDP ports it listens on.
    pub udp_ports: BTreeSet<u16>,
    /// TCP ports it serves as an echo (`appProtocol: switchyard.io/echo`): its answer line, then every byte back.
    pub echo_ports: BTreeSet<u16>,
}
