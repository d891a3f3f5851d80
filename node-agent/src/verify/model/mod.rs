//! Every backend's verdicts for the frontends of a plan, each read from that backend's own render (the
//! rules it would program), on a host whose addresses are the planned node IPs.
//!
//! ```text
//! spec ─► frontends::of_entry ─► [Frontend]
//!      ─► iptables: render ─► Tracer (explain's path) ─────┐
//!      ─► nftables: render per family ─► maps and chains ──┼─► [Verdict], one per frontend
//!      ─► ipvs: render ─► glue sets and virtual servers ───┘
//! ```
//!
//! Facts are fixed (`--random-fully`, no liberal TCP): they change how rules are spelled, never where a
//! packet goes.

pub mod iptables;
pub mod ipvs;
pub mod nftables;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use super::frontends::{Frontend, node_port_addresses, of_entry};
use super::verdict::Verdict;
use crate::backend::HostFacts;

/// The frontends of every entry of `spec`, in entry order.
pub fn frontends(spec: &NodeForwardingPlanSpec) -> Vec<Frontend> {
    spec.services
        .iter()
        .flat_map(|entry| of_entry(spec, entry))
        .collect()
}

/// The host the verdicts are asked on: the planned node IPs as its only addresses.
fn facts(spec: &NodeForwardingPlanSpec) -> HostFacts {
    HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        local_addrs: spec.node_ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
    }
}

/// The verdict of each of `frontends` under `backend`'s render of `spec` (every entry rendered: `spec`
/// holds only valid ones).
pub fn verdicts(spec: &NodeForwardingPlanSpec, backend: Backend, frontends: &[Frontend]) -> Vec<Verdict> {
    let facts = facts(spec);
    let none = HashSet::new();
    match backend {
        Backend::Iptables => iptables::verdicts(spec, &facts.local_addrs, frontends),
        Backend::Ipvs => {
            let desired = crate::ipvs::render(spec, &facts, &none);
            frontends.iter().map(|f| ipvs::verdict(&desired, f)).collect()
        }
        Backend::Nftables => {
            let mut tables = BTreeMap::new();
            frontends
                .iter()
                .map(|f| {
                    let family = IpFamily::of(&f.addr.ip());
                    let (state, node_ports): &(_, Vec<IpAddr>) = tables.entry(family).or_insert_with(|| {
                        (
                            crate::nftables::render(spec, &facts, family, &none),
                            node_port_addresses(spec, family),
                        )
                    });
                    nftables::verdict(state, node_ports, f)
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    /// Every kind of entry the planner writes: the three backends must agree on every frontend.
    fn everything() -> NodeForwardingPlanSpec {
        let mut spec = plan(
            "node-a",
            vec![
                entry("ns/plain:http", "10.96.0.1", 80)
                    .with(ep("10.244.2.1", 8080))
                    .with(ep("10.244.3.1", 8080))
                    .with(ep("10.244.4.1", 8080))
                    .external_ip("203.0.113.10")
                    .node_port(30080),
                entry("ns/one:http", "10.96.0.2", 80).with(ep("10.244.2.2", 8080)),
                entry("ns/none:http", "10.96.0.3", 80)
                    .node_port(30083)
                    .external_ip("203.0.113.13"),
                entry("ns/etp:http", "10.96.0.4", 80)
                    .with(ep("10.244.1.4", 8080).local())
                    .with(ep("10.244.2.4", 8080))
                    .lb_ip("203.0.113.14")
                    .node_port(30084)
                    .etp_local(),
                entry("ns/etp-none:http", "10.96.0.5", 80)
                    .with(ep("10.244.2.5", 8080))
                    .lb_ip("203.0.113.15")
                    .node_port(30085)
                    .etp_local(),
                entry("ns/itp:http", "10.96.0.6", 80)
                    .with(ep("10.244.1.6", 8080).local())
                    .with(ep("10.244.2.6", 8080))
                    .itp_local(),
                entry("ns/itp-none:http", "10.96.0.7", 80)
                    .with(ep("10.244.2.7", 8080))
                    .itp_local(),
                entry("ns/affinity:http", "10.96.0.8", 80)
                    .with(ep("10.244.2.8", 8080))
                    .with(ep("10.244.3.8", 8080))
                    .affinity(10800)
                    .node_port(30088),
                entry("ns/ranges:http", "10.96.0.9", 80)
                    .with(ep("10.244.2.9", 8080))
                    .lb_ip("203.0.113.19")
                    .source_range("198.51.100.0/24"),
                entry("ns/udp:dns", "10.96.0.10", 53)
                    .protocol(switchyard_api::Protocol::UDP)
                    .with(ep("10.244.2.10", 5353)),
                entry("ns/terminating:http", "10.96.0.11", 80)
                    .with(ep("10.244.2.11", 8080).terminating())
                    .has_endpoints(true),
                entry("ns/v6:http", "fd00:10:96::1", 80)
                    .with(ep("fd00:10:244:2::1", 8080))
                    .with(ep("fd00:10:244:3::1", 8080))
                    .node_port(30090),
            ],
        );
        spec.node_ips.push("fd00:192:168:10::11".into());
        switchyard_api::testing::finish(&mut spec);
        spec
    }

    #[test]
    fn the_three_renders_give_every_frontend_the_same_verdict() {
        let spec = everything();
        assert!(switchyard_api::validate::validate(&spec).bad_entries().is_empty());
        let frontends = frontends(&spec);
        let iptables = verdicts(&spec, Backend::Iptables, &frontends);
        for backend in [Backend::Nftables, Backend::Ipvs] {
            let other = verdicts(&spec, backend, &frontends);
            for ((frontend, want), got) in frontends.iter().zip(&iptables).zip(&other) {
                assert!(
                    want.agrees(got),
                    "{frontend} from {}: iptables {want}, {backend} {got}",
                    frontend.source
                );
            }
        }
        // And they are the verdicts kube-proxy gives.
        let said: Vec<String> = frontends
            .iter()
            .zip(&iptables)
            .map(|(f, v)| format!("{f}: {v}"))
            .collect();
        let want = [
            "ns/affinity:http 10.96.0.8:80/tcp: forwards to 10.244.2.8:8080 50.0%, 10.244.3.8:8080 50.0%",
            "ns/affinity:http 192.168.10.11:30088/tcp: forwards to 10.244.2.8:8080 50.0%, 10.244.3.8:8080 50.0%",
            "ns/etp-none:http 10.96.0.5:80/tcp: forwards to 10.244.2.5:8080 100.0%",
            "ns/etp-none:http 203.0.113.15:80/tcp: drops",
            "ns/etp-none:http 192.168.10.11:30085/tcp: drops",
            "ns/etp:http 10.96.0.4:80/tcp: forwards to 10.244.1.4:8080 50.0%, 10.244.2.4:8080 50.0%",
            "ns/etp:http 203.0.113.14:80/tcp: forwards to 10.244.1.4:8080 100.0%",
            "ns/etp:http 192.168.10.11:30084/tcp: forwards to 10.244.1.4:8080 100.0%",
            "ns/itp-none:http 10.96.0.7:80/tcp: drops",
            "ns/itp:http 10.96.0.6:80/tcp: forwards to 10.244.1.6:8080 100.0%",
            "ns/none:http 10.96.0.3:80/tcp: rejects",
            "ns/none:http 203.0.113.13:80/tcp: rejects",
            "ns/none:http 192.168.10.11:30083/tcp: rejects",
            "ns/one:http 10.96.0.2:80/tcp: forwards to 10.244.2.2:8080 100.0%",
        ];
        for line in want {
            assert!(said.iter().any(|s| s == line), "{line} not in {said:#?}");
        }
        assert!(
            said.iter().any(
                |s| s.starts_with("ns/plain:http 203.0.113.10:80/tcp: forwards to 10.244.2.1:8080 33.3%")
            ),
            "{said:#?}"
        );
    }

    #[test]
    fn ipvs_weights_and_a_source_outside_the_ranges_are_told_apart() {
        let weighted = entry("ns/w:http", "10.96.0.1", 80)
            .with(ep("10.244.2.1", 8080).weight(3))
            .with(ep("10.244.3.1", 8080));
        let spec = plan("node-a", vec![weighted]);
        let frontends = frontends(&spec);
        let ipvs = verdicts(&spec, Backend::Ipvs, &frontends);
        let nft = verdicts(&spec, Backend::Nftables, &frontends);
        assert_eq!(
            ipvs[0].to_string(),
            "forwards to 10.244.2.1:8080 75.0%, 10.244.3.1:8080 25.0%"
        );
        assert!(!ipvs[0].agrees(&nft[0]), "{} vs {}", ipvs[0], nft[0]);

        let ranged = entry("ns/r:http", "10.96.0.1", 80)
            .with(ep("10.244.2.1", 8080))
            .lb_ip("203.0.113.19")
            .source_range("198.51.100.0/24");
        let spec = plan("node-a", vec![ranged]);
        let mut lb = frontends_of(&spec)[1].clone();
        lb.source = "192.0.2.1".parse().unwrap();
        for backend in [Backend::Iptables, Backend::Nftables, Backend::Ipvs] {
            assert_eq!(
                verdicts(&spec, backend, std::slice::from_ref(&lb)),
                [Verdict::Drop],
                "{backend}"
            );
        }
    }

    #[test]
    fn the_nftables_model_reads_the_table_not_the_plan() {
        use crate::nftables::model::{ChainBody, Key, SetId};
        let spec = plan(
            "node-a",
            vec![
                entry("ns/plain:http", "10.96.0.1", 80).with(ep("10.244.2.1", 8080)),
                entry("ns/local:http", "10.96.0.2", 80)
                    .with(ep("10.244.1.2", 8080).local())
                    .itp_local(),
            ],
        );
        let frontends = frontends(&spec);
        let mut state = crate::nftables::render(&spec, &facts(&spec), IpFamily::IPv4, &HashSet::new());
        let ask = |state: &crate::nftables::model::TableState| -> Vec<String> {
            frontends
                .iter()
                .map(|f| nftables::verdict(state, &[], f).to_string())
                .collect()
        };
        assert_eq!(
            ask(&state),
            [
                "forwards to 10.244.1.2:8080 100.0%",
                "forwards to 10.244.2.1:8080 100.0%"
            ]
        );
        // A class element gone, and a policy chain holding a rule the render never writes.
        let key = Key::Frontend("10.96.0.1".parse().unwrap(), switchyard_api::Protocol::TCP, 80);
        if let Some(elements) = state.elements.get_mut(&SetId::Fast(1)) {
            elements.remove(&key);
        }
        for chain in state.chains.values_mut() {
            if let ChainBody::Rules(rules) = &mut chain.body
                && rules.iter().any(|r| r.contains("dnat ip to 10.244.1.2:8080"))
            {
                *rules = vec!["ip daddr 10.0.0.1 counter accept".into()];
            }
        }
        assert_eq!(
            ask(&state),
            [
                "cannot be modelled (ip daddr 10.0.0.1 counter accept)",
                "does not forward"
            ]
        );
    }

    fn frontends_of(spec: &NodeForwardingPlanSpec) -> Vec<Frontend> {
        frontends(spec)
    }
}
