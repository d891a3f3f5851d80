//! The frontends of a plan entry, each with the client whose first packet a verdict is asked for.
//!
//! ```text
//! entry ─► ClusterIP ─────────────────────► from a pod (the cluster CIDR of its family), else from outside
//!       ─► externalIPs, LoadBalancer IPs ─► from outside (inside the first source range, when it has any)
//!       ─► NodePort on each node address that serves NodePorts ─► from outside
//! ```
//!
//! One client per frontend, the one the frontend is meant for: the backends agree on what pods and the
//! node itself get through external frontends of a Local policy only up to kube-proxy's own IPVS
//! difference (pods reach only the node's endpoints there), which a switch cannot change.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

use crate::backend::{node_port_ips, scope::parse_ips_of};
use crate::counters::Frontend as Kind;

/// An off-cluster client (TEST-NET-3 and the IPv6 documentation range).
const OUTSIDE_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 77));
const OUTSIDE_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x77));

/// One frontend of an entry and the client that asks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Frontend {
    /// The entry (`namespace/name:port`).
    pub service: String,
    /// Which kind of frontend.
    pub kind: Kind,
    /// Its address and port.
    pub addr: SocketAddr,
    /// Its protocol.
    pub protocol: Protocol,
    /// The client.
    pub source: IpAddr,
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.service, self.addr, self.protocol.lower())
    }
}

/// The node addresses of `family` that serve NodePorts, as the renders resolve them on a host whose
/// only addresses are the planned node IPs.
pub fn node_port_addresses(spec: &NodeForwardingPlanSpec, family: IpFamily) -> Vec<IpAddr> {
    let node_ips: Vec<IpAddr> = parse_ips_of(&spec.node_ips, family).collect();
    node_port_ips(spec, family, &node_ips).unwrap_or(node_ips)
}

fn outside(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::IPv4 => OUTSIDE_V4,
        IpFamily::IPv6 => OUTSIDE_V6,
    }
}

/// An address of `net` that is no endpoint of `entry` (a pod reaching itself is another path).
fn pod_in(net: IpNet, entry: &ServicePlan) -> IpAddr {
    let endpoint = |ip: &IpAddr| {
        entry
            .endpoints
            .iter()
            .any(|e| e.ip.parse::<IpAddr>().ok() == Some(*ip))
    };
    let last = net.broadcast();
    let step_back = |ip: IpAddr, by: u128| match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4).wrapping_sub(by as u32))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6).wrapping_sub(by))),
    };
    (1..=3)
        .map(|by| step_back(last, by))
        .find(|ip| net.contains(ip) && !endpoint(ip))
        .unwrap_or(last)
}

/// The client a LoadBalancer IP is asked for: inside its first source range of the family, so the
/// verdict is where allowed clients go.
fn allowed_source(entry: &ServicePlan, family: IpFamily) -> IpAddr {
    entry
        .source_ranges
        .iter()
        .filter_map(|r| r.parse::<IpNet>().ok())
        .find(|net| IpFamily::of(&net.addr()) == family)
        .map_or_else(
            || outside(family),
            |net| net.hosts().next().unwrap_or_else(|| net.addr()),
        )
}

/// The frontends of `entry` in `spec`, in a fixed order: ClusterIP, externalIPs, LoadBalancer IPs,
/// NodePorts.
pub fn of_entry(spec: &NodeForwardingPlanSpec, entry: &ServicePlan) -> Vec<Frontend> {
    let family = entry.family;
    let of_family = |text: &String| {
        text.parse::<IpAddr>()
            .ok()
            .filter(|ip| IpFamily::of(ip) == family)
    };
    let frontend = |kind, ip: IpAddr, port, source| Frontend {
        service: entry.name.clone(),
        kind,
        addr: SocketAddr::new(ip, port),
        protocol: entry.protocol,
        source,
    };
    let mut out = Vec::new();
    let Some(cluster_ip) = of_family(&entry.cluster_ip) else {
        return out;
    };
    let pod = spec
        .cluster
        .local_traffic_cidrs
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .find(|net| IpFamily::of(&net.addr()) == family)
        .map_or_else(|| outside(family), |net| pod_in(net.trunc(), entry));
    out.push(frontend(Kind::ClusterIp, cluster_ip, entry.port, pod));
    for ip in entry.external_ips.iter().filter_map(of_family) {
        out.push(frontend(Kind::ExternalIp, ip, entry.port, outside(family)));
    }
    let allowed = allowed_source(entry, family);
    for ip in entry.load_balancer_ips.iter().filter_map(of_family) {
        out.push(frontend(Kind::LoadBalancer, ip, entry.port, allowed));
    }
    if let Some(port) = entry.node_port {
        for ip in node_port_addresses(spec, family) {
            out.push(frontend(Kind::NodePort, ip, port, outside(family)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn every_frontend_is_asked_for_by_the_client_it_is_meant_for() {
        let web = entry("ns/web:http", "10.96.0.1", 80)
            .with(ep("10.244.255.254", 8080).local())
            .external_ip("203.0.113.10")
            .lb_ip("203.0.113.20")
            .source_range("198.51.100.0/24")
            .node_port(30080);
        let spec = plan("node-a", vec![web.clone()]);
        let got: Vec<(Kind, String, IpAddr)> = of_entry(&spec, &web)
            .into_iter()
            .map(|f| (f.kind, f.addr.to_string(), f.source))
            .collect();
        assert_eq!(
            got,
            [
                // The last address of the pod CIDR is an endpoint: the one before it asks.
                (Kind::ClusterIp, "10.96.0.1:80".into(), ip("10.244.255.253")),
                (Kind::ExternalIp, "203.0.113.10:80".into(), OUTSIDE_V4),
                (Kind::LoadBalancer, "203.0.113.20:80".into(), ip("198.51.100.1")),
                (Kind::NodePort, "192.168.10.11:30080".into(), OUTSIDE_V4),
            ]
        );
    }

    #[test]
    fn without_a_cluster_cidr_the_cluster_ip_is_asked_from_outside_and_node_ports_follow_the_planned_addresses()
     {
        let v6 = entry("ns/v6:http", "fd00:10:96::1", 80)
            .with(ep("fd00:10:244::5", 80))
            .node_port(30081);
        let mut spec = plan("node-a", vec![v6.clone()]);
        spec.cluster.local_traffic_cidrs.clear();
        spec.node_ips = vec!["192.168.10.11".into(), "fd00:192:168:10::11".into()];
        let got: Vec<String> = of_entry(&spec, &v6)
            .iter()
            .map(|f| format!("{f} from {}", f.source))
            .collect();
        assert_eq!(
            got,
            [
                "ns/v6:http [fd00:10:96::1]:80/tcp from 2001:db8::77",
                "ns/v6:http [fd00:192:168:10::11]:30081/tcp from 2001:db8::77",
            ]
        );
        spec.cluster.node_port_addresses = vec!["10.0.0.0/8".into()];
        assert_eq!(of_entry(&spec, &v6).len(), 2, "no IPv6 range: every address");
        spec.cluster.node_port_addresses = vec!["fd00:1::/64".into()];
        assert_eq!(of_entry(&spec, &v6).len(), 1, "no node address in the range");
    }
}
