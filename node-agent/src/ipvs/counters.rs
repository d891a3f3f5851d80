//! The IPVS traffic counters: every real server's connection count (`IPVS_STATS_ATTR_CONNS` of its
//! 64-bit statistics), read over generic netlink and named after the plan's Services.
//!
//! ```text
//! Ipvs::services ─► virtual servers whose key the plan explains ─► Ipvs::destinations(key)
//!   ─► per real server: Sample(endpoint ip:port, its conns) and Sample(the virtual server's frontend kind)
//! ```
//!
//! IPVS counts a connection when it schedules it to a real server, so a real server's count is its new
//! connections through that virtual server (one virtual server per frontend address and port, NodePorts
//! one per node address) and a frontend's is the sum over its real servers. The agent edits real servers
//! in place (weights), so counts survive every change but the removal of the real server itself.
//! Refusals are not counted here: IPVS rejects through the iptables glue.
//!
//! The kernel hands out its statistics as its rate estimator last summed them from the per-CPU
//! counters (`kstats`, every 2 s), so a read may lag the traffic by up to 2 s.

use std::collections::HashSet;
use switchyard_api::NodeForwardingPlanSpec;

use super::kernel::{Destination, Ipvs, VirtualKey};
use super::netlink::NetlinkIpvs;
use crate::counters::frontends::Frontends;
use crate::counters::{Frontend, Sample, ServicePort, What, element_id};
use crate::error::Error;

/// The Service port and frontend kind of a virtual server (NodePorts: one per node address).
fn find<'a>(index: &'a Frontends, key: &VirtualKey) -> Option<(&'a ServicePort, Frontend)> {
    index.any(key.addr, key.protocol, key.port)
}

/// The counters of the virtual servers in `table`, named after the plan's Service ports; virtual
/// servers the plan does not explain are left out.
pub fn samples(
    table: &[(VirtualKey, Vec<Destination>)],
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Vec<Sample> {
    let index = Frontends::of(spec, skip, None);
    let mut out = Vec::new();
    for (key, reals) in table {
        let Some((service, kind)) = find(&index, key) else {
            continue;
        };
        for real in reals {
            let element = (key, real.real.addr, real.real.port);
            out.push(Sample {
                service: service.clone(),
                what: What::Endpoint(std::net::SocketAddr::new(real.real.addr, real.real.port).to_string()),
                element: element_id(element),
                packets: real.connections,
            });
            out.push(Sample {
                service: service.clone(),
                what: What::Frontend(kind),
                element: element_id((element, "frontend")),
                packets: real.connections,
            });
        }
    }
    out
}

/// Every virtual server of the plan with its real servers, read from `ipvs`.
pub fn read_table(
    ipvs: &mut dyn Ipvs,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Result<Vec<(VirtualKey, Vec<Destination>)>, Error> {
    let index = Frontends::of(spec, skip, None);
    let mut table = Vec::new();
    for service in ipvs.services()? {
        if let Some(key) = service.key()
            && find(&index, &key).is_some()
        {
            table.push((key, ipvs.destinations(&key)?));
        }
    }
    Ok(table)
}

/// One read of every virtual server `spec` explains over `ipvs` (its entries `skip` left out).
pub fn read(
    ipvs: &mut NetlinkIpvs,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Result<Vec<Sample>, Error> {
    let table = read_table(ipvs, spec, skip)?;
    Ok(samples(&table, spec, skip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::fake::FakeIpvs;
    use crate::ipvs::kernel::{RealKey, Service};
    use switchyard_api::Protocol;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn key(addr: &str, port: u16) -> VirtualKey {
        VirtualKey {
            addr: addr.parse().unwrap(),
            protocol: Protocol::TCP,
            port,
        }
    }

    fn real(addr: &str, connections: u64) -> Destination {
        Destination {
            connections,
            ..Destination::new(
                RealKey {
                    addr: addr.parse().unwrap(),
                    port: 8080,
                },
                1,
            )
        }
    }

    #[test]
    fn real_servers_count_for_their_endpoint_and_their_virtual_servers_frontend() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/web:http", "10.96.0.1", 80)
                    .node_port(30080)
                    .with(ep("10.244.1.5", 8080))
                    .with(ep("10.244.2.5", 8080)),
            ],
        );
        let fake = FakeIpvs::new();
        fake.insert(
            Service::new(key("10.96.0.1", 80), "rr", None),
            &[real("10.244.1.5", 6), real("10.244.2.5", 4)],
        );
        fake.insert(
            Service::new(key("192.168.10.11", 30080), "rr", None),
            &[real("10.244.1.5", 3)],
        );
        // Not the plan's (another tool's virtual server): left out.
        fake.insert(
            Service::new(key("10.1.1.1", 443), "rr", None),
            &[real("10.9.9.9", 50)],
        );
        let mut ipvs = fake.clone();
        let table = read_table(&mut ipvs, &spec, &HashSet::new()).unwrap();
        assert_eq!(table.len(), 2);
        let series = crate::counters::Accumulator::default().update(samples(&table, &spec, &HashSet::new()));
        let value = |what: What| series.iter().find(|s| s.what == what).map(|s| s.value);
        assert_eq!(value(What::Frontend(Frontend::ClusterIp)), Some(10));
        assert_eq!(value(What::Frontend(Frontend::NodePort)), Some(3));
        assert_eq!(value(What::Endpoint("10.244.1.5:8080".into())), Some(9));
        assert_eq!(value(What::Endpoint("10.244.2.5:8080".into())), Some(4));
        assert_eq!(series.len(), 4);
    }
}
