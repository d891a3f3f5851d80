//! Which Service port and frontend a kernel object's key stands for: the one index both backends'
//! counters name their samples with.
//!
//! ```text
//! applied plan (entries not skipped, of one family or all)
//!   ─► clusterIP / externalIPs / LB IPs ─► (address, protocol, port) ─► (ServicePort, Frontend)
//!   ─► nodePort                         ─► (protocol, port)          ─► ServicePort
//! ```
//!
//! The first entry to claim a frontend wins, as in the renders.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan};

use super::{Frontend, ServicePort};

/// The entries of `spec` in the kernel (not in `skip`), of `family` when one is given.
pub fn applied_entries<'a>(
    spec: &'a NodeForwardingPlanSpec,
    skip: &'a HashSet<usize>,
    family: Option<IpFamily>,
) -> impl Iterator<Item = &'a ServicePlan> {
    spec.services
        .iter()
        .enumerate()
        .filter(move |(i, e)| family.is_none_or(|f| e.family == f) && !skip.contains(i))
        .map(|(_, e)| e.as_ref())
}

/// The Service port of a plan entry.
pub fn service_port(entry: &ServicePlan) -> ServicePort {
    ServicePort {
        name: entry.name.as_str().into(),
        protocol: entry.protocol,
    }
}

/// Frontends by address and NodePorts by port.
#[derive(Debug, Default)]
pub struct Frontends {
    addresses: HashMap<(IpAddr, Protocol, u16), (ServicePort, Frontend)>,
    node_ports: HashMap<(Protocol, u16), ServicePort>,
}

impl Frontends {
    /// The index of the entries [`applied_entries`] yields.
    pub fn of(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, family: Option<IpFamily>) -> Self {
        let mut index = Self::default();
        for entry in applied_entries(spec, skip, family) {
            let service = service_port(entry);
            let addresses = std::iter::once((&entry.cluster_ip, Frontend::ClusterIp))
                .chain(entry.external_ips.iter().map(|a| (a, Frontend::ExternalIp)))
                .chain(
                    entry
                        .load_balancer_ips
                        .iter()
                        .map(|a| (a, Frontend::LoadBalancer)),
                );
            for (address, kind) in addresses {
                if let Ok(address) = address.parse::<IpAddr>() {
                    index
                        .addresses
                        .entry((address, entry.protocol, entry.port))
                        .or_insert_with(|| (service.clone(), kind));
                }
            }
            if let Some(port) = entry.node_port {
                index
                    .node_ports
                    .entry((entry.protocol, port))
                    .or_insert_with(|| service);
            }
        }
        index
    }

    /// The Service port and frontend kind of a ClusterIP, external IP or LoadBalancer IP.
    pub fn address(
        &self,
        address: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Option<(&ServicePort, Frontend)> {
        self.addresses
            .get(&(address, protocol, port))
            .map(|(service, kind)| (service, *kind))
    }

    /// The Service port of a NodePort.
    pub fn node_port(&self, protocol: Protocol, port: u16) -> Option<(&ServicePort, Frontend)> {
        self.node_ports
            .get(&(protocol, port))
            .map(|service| (service, Frontend::NodePort))
    }

    /// An address frontend, else a NodePort on any address (IPVS: one virtual server per node address).
    pub fn any(&self, address: IpAddr, protocol: Protocol, port: u16) -> Option<(&ServicePort, Frontend)> {
        self.address(address, protocol, port)
            .or_else(|| self.node_port(protocol, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn every_frontend_of_an_applied_entry_is_found_and_the_first_claim_wins() {
        let mut web = entry("ns1/web:http", "10.96.0.1", 80)
            .node_port(30080)
            .with(ep("10.244.1.5", 8080));
        web.external_ips = vec!["192.0.2.1".into()];
        web.load_balancer_ips = vec!["198.51.100.1".into()];
        // Claims web's ClusterIP and port again: web keeps them.
        let shadow = entry("ns1/x-shadow", "10.96.0.1", 80).with(ep("10.244.1.6", 80));
        let skipped = entry("ns1/y-skipped", "10.96.0.9", 80).node_port(30090);
        let spec = plan("node-a", vec![web, shadow, skipped]);
        let index = Frontends::of(&spec, &HashSet::from([2]), None);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let name =
            |found: Option<(&ServicePort, Frontend)>| found.map(|(s, kind)| (s.name.to_string(), kind));
        let web = |kind| Some(("ns1/web:http".to_string(), kind));
        assert_eq!(
            name(index.address(ip("10.96.0.1"), Protocol::TCP, 80)),
            web(Frontend::ClusterIp)
        );
        assert_eq!(
            name(index.address(ip("192.0.2.1"), Protocol::TCP, 80)),
            web(Frontend::ExternalIp)
        );
        assert_eq!(
            name(index.address(ip("198.51.100.1"), Protocol::TCP, 80)),
            web(Frontend::LoadBalancer)
        );
        assert_eq!(
            name(index.any(ip("192.168.10.11"), Protocol::TCP, 30080)),
            web(Frontend::NodePort)
        );
        assert_eq!(name(index.address(ip("10.96.0.1"), Protocol::UDP, 80)), None);
        assert_eq!(name(index.node_port(Protocol::TCP, 30090)), None);
        assert_eq!(name(index.address(ip("10.96.0.9"), Protocol::TCP, 80)), None);
        assert_eq!(
            Frontends::of(&spec, &HashSet::new(), Some(IpFamily::IPv6))
                .address(ip("10.96.0.1"), Protocol::TCP, 80)
                .map(|(s, _)| s.clone()),
            None
        );
    }
}
