//! Nodes → what a plan header needs: name, zone, primary IPs, pod CIDRs, backend, detector CIDRs.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use switchyard_api::{
    Backend, DetectLocalMode, IpFamily,
    ip::{parse_cidr_sloppy, parse_ip_sloppy},
    names::k8s::LABEL_ZONE,
};

use super::diagnostics::Diagnostics;
use crate::config::Config;

/// The planner's view of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`, for the plan's ownerReference.
    pub uid: Option<String>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Primary IPs, at most one per family (kube-proxy's `GetNodeHostIPs`: InternalIP, else ExternalIP).
    pub ips: Vec<IpAddr>,
    /// `spec.podCIDRs` (or `podCIDR`), at most one per family.
    pub pod_cidrs: Vec<IpNet>,
    /// Backend for this node.
    pub backend: Backend,
    /// Set while the Node shows one of the configured leaving signals.
    pub leaving: Option<switchyard_api::Leaving>,
}

/// Reads one Node; `None` (with a warning) when it has no name.
pub fn node_info(node: &Node, config: &Config, diag: &mut Diagnostics) -> Option<NodeInfo> {
    let Some(name) = node.metadata.name.clone().filter(|n| !n.is_empty()) else {
        diag.warn("Node", "<unnamed>", "no metadata.name; node skipped");
        return None;
    };
    let labels = node.metadata.labels.as_ref();
    let zone = labels
        .and_then(|l| l.get(LABEL_ZONE))
        .filter(|z| !z.is_empty())
        .cloned();
    let backend = match labels.and_then(|l| l.get(&config.backend_node_label)) {
        None => config.default_backend,
        Some(value) => Backend::parse(value).unwrap_or_else(|| {
            diag.warn(
                "Node",
                &name,
                format!(
                    "label {}={value:?} is not iptables, ipvs or nftables; using {}",
                    config.backend_node_label, config.default_backend
                ),
            );
            config.default_backend
        }),
    };

    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    let mut ips: Vec<IpAddr> = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for address in addresses.into_iter().flatten().filter(|a| a.type_ == wanted) {
            match parse_ip_sloppy(&address.address) {
                Some(ip) if ips.iter().all(|i| IpFamily::of(i) != IpFamily::of(&ip)) => ips.push(ip),
                Some(_) => {}
                None => diag.warn(
                    "Node",
                    &name,
                    format!("{wanted} {:?} is not an IP address; ignored", address.address),
                ),
            }
        }
    }
    ips.sort_by_key(IpFamily::of);

    let spec = node.spec.as_ref();
    let cidr_texts: Vec<&String> = match spec.and_then(|s| s.pod_cidrs.as_ref()).filter(|c| !c.is_empty()) {
        Some(cidrs) => cidrs.iter().collect(),
        None => spec.and_then(|s| s.pod_cidr.as_ref()).into_iter().collect(),
    };
    let mut pod_cidrs: Vec<IpNet> = Vec::new();
    for text in cidr_texts {
        match parse_cidr_sloppy(text) {
            Some(net)
                if pod_cidrs
                    .iter()
                    .all(|c| IpFamily::of(&c.addr()) != IpFamily::of(&net.addr())) =>
            {
                pod_cidrs.push(net)
            }
            Some(_) => {}
            None => diag.warn("Node", &name, format!("podCIDR {text:?} is not a CIDR; ignored")),
        }
    }
    Some(NodeInfo {
        uid: node.metadata.uid.clone(),
        leaving: super::leaving::leaving(node, &config.leaving_signals, config.drain_grace_period),
        name,
        zone,
        ips,
        pod_cidrs,
        backend,
    })
}

/// The CIDRs the local-traffic detector uses on this node.
pub fn local_traffic_cidrs(node: &NodeInfo, config: &Config) -> Vec<IpNet> {
    match config.detect_local_mode {
        DetectLocalMode::ClusterCIDR => config.cluster_cidrs.clone(),
        DetectLocalMode::NodeCIDR => node.pod_cidrs.clone(),
        // The interface detectors match by name, not address.
        DetectLocalMode::BridgeInterface | DetectLocalMode::InterfaceNamePrefix | DetectLocalMode::None => {
            Vec::new()
        }
    }
}
