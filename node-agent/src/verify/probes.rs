//! The probes of a verification: TCP connects from the node to a sample of its ClusterIP frontends that
//! have endpoints the node itself reaches, each with a short timeout.
//!
//! ```text
//! plan entries (not skipped): TCP, has endpoints, usable from the node (Cluster: any; iTP=Local: local)
//!   ─► sample(max): spread evenly over the plan ─► [Target]
//!   ─► probe(targets, Connector, timeout) ─► ProbeCheck { sampled, failed, examples }
//! ```
//!
//! The connection itself goes through the [`Connector`] edge ([`TcpConnector`] on a host; a fake in
//! tests); choosing the sample and judging the outcome are pure.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use switchyard_api::verification::{MAX_EXAMPLES, ProbeCheck};
use switchyard_api::{NodeForwardingPlanSpec, Protocol, ServicePlan, TrafficPolicy};

/// One frontend to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The entry (`namespace/name:port`).
    pub service: String,
    /// Its ClusterIP and port.
    pub addr: SocketAddr,
}

/// Opens (and closes) a TCP connection.
pub trait Connector: Send {
    /// Connects to `to` within `timeout`; `Err` says why not (refused, timed out, unreachable).
    fn connect(&mut self, to: SocketAddr, timeout: Duration) -> Result<(), String>;
}

/// Connections from this host's network namespace.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn connect(&mut self, to: SocketAddr, timeout: Duration) -> Result<(), String> {
        TcpStream::connect_timeout(&to, timeout)
            .map(drop)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    format!("no answer within {} ms", timeout.as_millis())
                }
                _ => e.to_string(),
            })
    }
}

/// A connection from the node reaches an endpoint: ClusterIP traffic from the node follows the internal
/// policy (Local: only this node's endpoints).
fn reachable_from_node(entry: &ServicePlan) -> bool {
    entry.protocol == Protocol::TCP
        && entry.has_endpoints
        && match entry.internal_policy {
            TrafficPolicy::Cluster => entry.cluster_endpoints().next().is_some(),
            TrafficPolicy::Local => entry.local_endpoints().next().is_some(),
        }
}

/// At most `max` frontends of `spec` (without the entries in `skip`) to probe, spread evenly over the
/// plan's order so the same plan gives the same sample.
pub fn sample(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, max: usize) -> Vec<Target> {
    let candidates: Vec<Target> = spec
        .services
        .iter()
        .enumerate()
        .filter(|(i, entry)| !skip.contains(i) && reachable_from_node(entry))
        .filter_map(|(_, entry)| {
            let ip = entry.cluster_ip.parse::<IpAddr>().ok()?;
            Some(Target {
                service: entry.name.clone(),
                addr: SocketAddr::new(ip, entry.port),
            })
        })
        .collect();
    if candidates.len() <= max {
        return candidates;
    }
    let len = candidates.len();
    candidates
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i * max) % len < max)
        .map(|(_, target)| target)
        .take(max)
        .collect()
}

/// Probes each target once; `None` when there is nothing to probe.
pub fn probe(targets: &[Target], connector: &mut dyn Connector, timeout: Duration) -> Option<ProbeCheck> {
    if targets.is_empty() {
        return None;
    }
    let mut check = ProbeCheck {
        sampled: u32::try_from(targets.len()).unwrap_or(u32::MAX),
        ..ProbeCheck::default()
    };
    for target in targets {
        if let Err(why) = connector.connect(target.addr, timeout) {
            check.failed += 1;
            tracing::warn!(service = %target.service, to = %target.addr, %why, "verification probe failed");
            if check.examples.len() < MAX_EXAMPLES {
                check
                    .examples
                    .push(format!("{} {}: {why}", target.service, target.addr));
            }
        }
    }
    Some(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    /// Refuses the addresses it was given, answers the rest; records every attempt.
    struct Fake {
        refused: Vec<SocketAddr>,
        tried: Vec<SocketAddr>,
    }

    impl Connector for Fake {
        fn connect(&mut self, to: SocketAddr, _: Duration) -> Result<(), String> {
            self.tried.push(to);
            if self.refused.contains(&to) {
                Err("Connection refused (os error 111)".into())
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn only_tcp_cluster_ips_the_node_reaches_are_sampled() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns/a:http", "10.96.0.1", 80).with(ep("10.244.2.1", 8080)),
                entry("ns/none:http", "10.96.0.2", 80),
                entry("ns/udp:dns", "10.96.0.3", 53)
                    .protocol(Protocol::UDP)
                    .with(ep("10.244.2.3", 53)),
                entry("ns/itp-remote:http", "10.96.0.4", 80)
                    .with(ep("10.244.2.4", 8080).not_cluster())
                    .has_endpoints(true)
                    .itp_local(),
                entry("ns/itp-here:http", "10.96.0.5", 80)
                    .with(ep("10.244.1.5", 8080).local().not_cluster())
                    .itp_local(),
                entry("ns/skipped:http", "10.96.0.6", 80).with(ep("10.244.2.6", 8080)),
            ],
        );
        let skipped = spec
            .services
            .iter()
            .position(|e| e.name == "ns/skipped:http")
            .unwrap();
        let names: Vec<String> = sample(&spec, &HashSet::from([skipped]), 10)
            .into_iter()
            .map(|t| t.service)
            .collect();
        assert_eq!(names, ["ns/a:http", "ns/itp-here:http"]);
    }

    #[test]
    fn a_bounded_sample_is_spread_and_failures_are_named() {
        let entries = (1..=20)
            .map(|i| {
                entry(&format!("ns/s{i:02}:http"), &format!("10.96.0.{i}"), 80).with(ep("10.244.2.1", 80))
            })
            .collect();
        let spec = plan("node-a", entries);
        let targets = sample(&spec, &HashSet::new(), 4);
        let names: Vec<&str> = targets.iter().map(|t| t.service.as_str()).collect();
        assert_eq!(
            names,
            ["ns/s01:http", "ns/s06:http", "ns/s11:http", "ns/s16:http"]
        );
        let mut fake = Fake {
            refused: vec!["10.96.0.6:80".parse().unwrap()],
            tried: Vec::new(),
        };
        let check = probe(&targets, &mut fake, Duration::from_millis(500)).unwrap();
        assert_eq!(fake.tried.len(), 4);
        assert_eq!((check.sampled, check.failed), (4, 1));
        assert_eq!(
            check.examples,
            ["ns/s06:http 10.96.0.6:80: Connection refused (os error 111)"]
        );
        assert!(!check.passed());
        assert_eq!(probe(&[], &mut fake, Duration::from_millis(500)), None);
    }
}
