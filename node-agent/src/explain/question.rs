//! The question `explain` answers: where a new connection goes (`--to`) and where it comes from
//! (`--from`), parsed, and resolved against the plan into the first packet and the frontend it meets.
//!
//! ```text
//! --to "IP:PORT[/proto]" | "ns/svc[:port]" ─► Destination ─┐
//! --from "node" | IP ──────────────────────► Source ───────┼─► resolve(plan) ─► (address, protocol, entry + frontend in words)
//!                                                          └─► packet(plan)  ─► Packet { src, proto, dst, dport }
//! ```

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

use crate::error::Error;
use crate::xtables::Packet;

/// Where the connection goes: an address, or a Service by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `IP:PORT[/tcp|udp|sctp]` (tcp when not given).
    Address(SocketAddr, Protocol),
    /// `namespace/service[:port]`: the Service's ClusterIP (the port named or numbered, or its only one).
    Service {
        /// `namespace/name`.
        service: String,
        /// The port's name or number, if given.
        port: Option<String>,
    },
}

impl std::str::FromStr for Destination {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, protocol) = match text.rsplit_once('/') {
            Some((address, proto))
                if ["tcp", "udp", "sctp"].contains(&proto.to_ascii_lowercase().as_str()) =>
            {
                let protocol = match proto.to_ascii_lowercase().as_str() {
                    "udp" => Protocol::UDP,
                    "sctp" => Protocol::SCTP,
                    _ => Protocol::TCP,
                };
                (address, protocol)
            }
            _ => (text, Protocol::TCP),
        };
        if let Ok(addr) = address.parse::<SocketAddr>() {
            return Ok(Self::Address(addr, protocol));
        }
        // An address with a protocol the proxy does not handle, or a port out of range: say which.
        if let Some((address, proto)) = text.rsplit_once('/')
            && address.parse::<SocketAddr>().is_ok()
        {
            return Err(format!(
                "unknown protocol {proto:?} in {text:?}: a Service port is tcp, udp or sctp"
            ));
        }
        if let Some((ip, port)) = address.rsplit_once(':')
            && ip.trim_matches(['[', ']']).parse::<IpAddr>().is_ok()
        {
            return Err(format!("port {port:?} in {text:?} is not a port (1-65535)"));
        }
        match text.split_once('/') {
            Some((namespace, rest)) if !namespace.is_empty() && !rest.is_empty() && !rest.contains('/') => {
                let (name, port) = match rest.split_once(':') {
                    Some((name, port)) => (name, Some(port.to_string())),
                    None => (rest, None),
                };
                Ok(Self::Service {
                    service: format!("{namespace}/{name}"),
                    port,
                })
            }
            _ => Err(format!(
                "{text:?} is neither IP:PORT[/tcp|udp|sctp] ([IPv6]:PORT for IPv6) nor namespace/service[:port]"
            )),
        }
    }
}

/// Where the connection comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The node itself (a host-network process).
    Node,
    /// An address: a pod when it is inside the cluster's pod CIDR, an external client otherwise.
    Address(IpAddr),
}

impl std::str::FromStr for Source {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "node" {
            return Ok(Self::Node);
        }
        text.parse()
            .map(Self::Address)
            .map_err(|_| format!("{text:?} is neither `node` nor an IP address"))
    }
}

/// Which frontend of an entry the destination is.
fn frontend(entry: &ServicePlan, dest: IpAddr, port: u16, node_ips: &[IpAddr]) -> Option<String> {
    let is = |text: &str| text.parse::<IpAddr>().ok() == Some(dest);
    if port == entry.port && is(&entry.cluster_ip) {
        return Some(format!("the ClusterIP {} of {}", entry.cluster_ip, entry.name));
    }
    if port == entry.port && entry.external_ips.iter().any(|ip| is(ip)) {
        return Some(format!("externalIP {dest} of {}", entry.name));
    }
    if port == entry.port && entry.load_balancer_ips.iter().any(|ip| is(ip)) {
        return Some(format!("the LoadBalancer IP {dest} of {}", entry.name));
    }
    if entry.node_port == Some(port) && (node_ips.contains(&dest) || dest.is_loopback()) {
        return Some(format!(
            "NodePort {port} of {} on this node's address {dest}",
            entry.name
        ));
    }
    None
}

/// A destination resolved: its address and protocol, and the entry with the frontend in words.
pub(crate) type Resolved<'a> = (SocketAddr, Protocol, Option<(&'a ServicePlan, String)>);

/// The destination address and the entry it names.
pub(crate) fn resolve<'a>(
    spec: &'a NodeForwardingPlanSpec,
    dest: &Destination,
    node_ips: &[IpAddr],
) -> Result<Resolved<'a>, Error> {
    match dest {
        Destination::Address(addr, protocol) => {
            let found = spec
                .services
                .iter()
                .filter(|e| e.protocol == *protocol)
                .find_map(|e| frontend(e, addr.ip(), addr.port(), node_ips).map(|f| (e.as_ref(), f)));
            Ok((*addr, *protocol, found))
        }
        Destination::Service { service, port } => {
            let candidates: Vec<&ServicePlan> = spec
                .services
                .iter()
                .map(AsRef::as_ref)
                .filter(|e| e.name.split(':').next() == Some(service.as_str()))
                .filter(|e| match port {
                    // A port number (`:80`), or a port name (`:http`; names always hold a letter).
                    Some(port) => match port.parse::<u16>() {
                        Ok(number) => e.port == number,
                        Err(_) => e.name.split_once(':').map(|(_, p)| p) == Some(port.as_str()),
                    },
                    None => true,
                })
                .collect();
            let entry = match candidates.as_slice() {
                [entry] => *entry,
                [] => {
                    return Err(Error::ExplainDestination(format!(
                        "no Service port {service}{} in node {}'s plan",
                        port.as_deref().map(|p| format!(":{p}")).unwrap_or_default(),
                        spec.node_name
                    )));
                }
                several => {
                    let names: Vec<&str> = several.iter().map(|e| e.name.as_str()).collect();
                    return Err(Error::ExplainDestination(format!(
                        "{service} has several ports or families ({}): name or number one as \
                         namespace/service:PORT, or give IP:PORT",
                        names.join(", ")
                    )));
                }
            };
            let ip: IpAddr = entry
                .cluster_ip
                .parse()
                .map_err(|_| Error::ExplainDestination(format!("{} has no usable ClusterIP", entry.name)))?;
            let addr = SocketAddr::new(ip, entry.port);
            let what = format!("the ClusterIP {} of {}", entry.cluster_ip, entry.name);
            Ok((addr, entry.protocol, Some((entry, what))))
        }
    }
}

/// The pod CIDR of the family, if the plan has one.
pub(crate) fn pod_cidr(spec: &NodeForwardingPlanSpec, family: IpFamily) -> Option<IpNet> {
    spec.cluster
        .local_traffic_cidrs
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .find(|net| IpFamily::of(&net.addr()) == family)
}

/// The node's own addresses of the plan.
pub(crate) fn node_ips(spec: &NodeForwardingPlanSpec) -> Vec<IpAddr> {
    spec.node_ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}

/// The packet a connection from `source` to `dest` starts with (a node source uses the node's address
/// of the family).
pub(crate) fn packet(
    spec: &NodeForwardingPlanSpec,
    source: Source,
    dest: SocketAddr,
    protocol: Protocol,
) -> Result<Packet, Error> {
    let family = IpFamily::of(&dest.ip());
    let from = match source {
        Source::Address(ip) if IpFamily::of(&ip) != family => {
            return Err(Error::ExplainFamilies {
                from: ip,
                to: dest.ip(),
            });
        }
        Source::Address(ip) => ip,
        Source::Node => node_ips(spec)
            .into_iter()
            .find(|ip| IpFamily::of(ip) == family)
            .unwrap_or(match family {
                IpFamily::IPv4 => IpAddr::from([127, 0, 0, 1]),
                IpFamily::IPv6 => IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
            }),
    };
    Ok(Packet::new(from, protocol, dest.ip(), dest.port()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{entry, plan};

    #[test]
    fn a_service_port_is_found_by_its_name_or_its_number() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/web:http", "10.96.0.1", 80),
                entry("ns1/web:https", "10.96.0.1", 443),
                entry("ns1/plain", "10.96.0.2", 8080),
            ],
        );
        let port_of = |to: &str| match resolve(&spec, &to.parse().unwrap(), &[]) {
            Ok((addr, _, Some((entry, _)))) => Ok((addr.port(), entry.name.clone())),
            Ok(_) => Err("no entry".to_string()),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(port_of("ns1/web:443"), Ok((443, "ns1/web:https".into())));
        assert_eq!(port_of("ns1/web:http"), Ok((80, "ns1/web:http".into())));
        assert_eq!(port_of("ns1/plain:8080"), Ok((8080, "ns1/plain".into())));
        assert_eq!(port_of("ns1/plain"), Ok((8080, "ns1/plain".into())));
        let several = port_of("ns1/web").unwrap_err();
        assert!(several.contains("name or number one"), "{several}");
        let none = port_of("ns1/web:81").unwrap_err();
        assert!(none.contains("no Service port ns1/web:81"), "{none}");
    }

    #[test]
    fn destinations_and_sources_parse_or_say_why_not() {
        let cases: [(&str, Option<Destination>); 6] = [
            (
                "10.96.0.1:80",
                Some(Destination::Address(
                    "10.96.0.1:80".parse().unwrap(),
                    Protocol::TCP,
                )),
            ),
            (
                "10.96.0.1:53/udp",
                Some(Destination::Address(
                    "10.96.0.1:53".parse().unwrap(),
                    Protocol::UDP,
                )),
            ),
            (
                "[fd00::1]:80/SCTP",
                Some(Destination::Address(
                    "[fd00::1]:80".parse().unwrap(),
                    Protocol::SCTP,
                )),
            ),
            (
                "ns1/web",
                Some(Destination::Service {
                    service: "ns1/web".into(),
                    port: None,
                }),
            ),
            (
                "ns1/web:http",
                Some(Destination::Service {
                    service: "ns1/web".into(),
                    port: Some("http".into()),
                }),
            ),
            ("web", None),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Destination>().ok(), want, "{text}");
        }
        for (text, says) in [
            ("10.96.0.1:80/icmp", "unknown protocol \"icmp\""),
            ("[fd00::1]:80/gre", "unknown protocol \"gre\""),
            ("10.96.0.1:70000", "port \"70000\""),
            ("10.96.0.1:http", "port \"http\""),
        ] {
            let error = text.parse::<Destination>().unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert_eq!(
            "default/apache:80".parse::<Destination>(),
            Ok(Destination::Service {
                service: "default/apache".into(),
                port: Some("80".into()),
            })
        );
        assert_eq!("node".parse::<Source>(), Ok(Source::Node));
        assert_eq!(
            "10.244.1.5".parse::<Source>(),
            Ok(Source::Address("10.244.1.5".parse().unwrap()))
        );
        assert!(
            "pod-a"
                .parse::<Source>()
                .unwrap_err()
                .contains("neither `node` nor an IP")
        );
    }
}
