//! The real-cluster suite's traffic checks (e2e/testdata/kube-workloads.yaml): flow table ─► probes
//! from pods on each node, from a node, from the outside client ─► verdicts, whatever proxy runs.
//!
//! ```text
//! Flow { from: Pod(client-a) | Node(node-a) | Outside, to: IP:port, expect }
//!   expect Answered { by: "web-", spread, source: Kept | Masqueraded | Any }   which pod, client IP
//!          Sticky { by }                                                     ClientIP affinity
//!          Refused (REJECT: no endpoints)   Dropped (DROP: no local endpoint for a Local policy)
//! check(cluster, flows) ─► one line per flow, and the flows that failed
//! ```
//!
//! The same table runs with the real kube-proxy and with Switchyard, so a difference between the two
//! shows as a failed flow on one of them.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use super::{cluster::KubeCluster, traffic};
use crate::{
    error::{LabError, Result},
    netns,
    probe::ProbeResult,
};

/// Where a connection starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum From {
    /// Inside a pod (namespace `flows`), by name.
    Pod(&'static str),
    /// On a node's host network.
    Node(&'static str),
    /// The client outside the cluster, on the fabric.
    Outside,
}

/// The source address the backend sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The client's own address.
    Kept,
    /// Not the client's address (SNAT to a node).
    Masqueraded,
    /// Either.
    Any,
}

/// What a flow must see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every connection answered by a pod whose name starts with `by`; at least `spread` distinct pods.
    Answered {
        /// Pod name prefix.
        by: &'static str,
        /// Distinct pods at least.
        spread: usize,
        /// The source the pods see.
        source: Source,
    },
    /// Every connection answered by one and the same pod starting with `by`.
    Sticky {
        /// Pod name prefix.
        by: &'static str,
    },
    /// Every connection refused (REJECT).
    Refused,
    /// Every connection timed out (DROP).
    Dropped,
}

/// One traffic check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// What it shows.
    pub name: &'static str,
    /// Where connections start.
    pub from: From,
    /// The destination.
    pub to: SocketAddr,
    /// What must be seen.
    pub expect: Expect,
}

fn at(a: u8, b: u8, c: u8, d: u8, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), port))
}

/// The flows over the suite's workloads on a two-node cluster (node-a at 192.168.30.11, node-b at
/// .12; `local` runs on node-a only).
pub fn standard() -> Vec<Flow> {
    use Expect::{Answered, Dropped, Refused, Sticky};
    let web = |source| Answered {
        by: "web-",
        spread: 2,
        source,
    };
    let local = |source| Answered {
        by: "local-",
        spread: 1,
        source,
    };
    vec![
        Flow {
            name: "ClusterIP from a pod on node-a",
            from: From::Pod("client-a"),
            to: at(10, 96, 100, 10, 80),
            expect: web(Source::Kept),
        },
        Flow {
            name: "ClusterIP from a pod on node-b",
            from: From::Pod("client-b"),
            to: at(10, 96, 100, 10, 80),
            expect: web(Source::Kept),
        },
        Flow {
            name: "ClusterIP from node-a",
            from: From::Node("node-a"),
            to: at(10, 96, 100, 10, 80),
            expect: web(Source::Any),
        },
        Flow {
            name: "NodePort on node-a from outside",
            from: From::Outside,
            to: at(192, 168, 30, 11, 30080),
            expect: web(Source::Masqueraded),
        },
        Flow {
            name: "NodePort on node-b from outside",
            from: From::Outside,
            to: at(192, 168, 30, 12, 30080),
            expect: web(Source::Masqueraded),
        },
        Flow {
            name: "NodePort on node-b from a pod on node-a",
            from: From::Pod("client-a"),
            to: at(192, 168, 30, 12, 30080),
            expect: web(Source::Any),
        },
        Flow {
            name: "externalIP from outside",
            from: From::Outside,
            to: at(198, 51, 100, 10, 80),
            expect: web(Source::Masqueraded),
        },
        Flow {
            name: "LoadBalancer IP from outside",
            from: From::Outside,
            to: at(198, 51, 100, 20, 80),
            expect: web(Source::Masqueraded),
        },
        Flow {
            name: "LoadBalancer IP from a pod",
            from: From::Pod("client-b"),
            to: at(198, 51, 100, 20, 80),
            expect: web(Source::Any),
        },
        Flow {
            name: "eTP=Local NodePort with a local endpoint keeps the client IP",
            from: From::Outside,
            to: at(192, 168, 30, 11, 30082),
            expect: local(Source::Kept),
        },
        Flow {
            name: "eTP=Local NodePort without a local endpoint drops",
            from: From::Outside,
            to: at(192, 168, 30, 12, 30082),
            expect: Dropped,
        },
        Flow {
            name: "eTP=Local ClusterIP from a pod on node-b still reaches node-a",
            from: From::Pod("client-b"),
            to: at(10, 96, 100, 15, 80),
            expect: local(Source::Kept),
        },
        Flow {
            name: "iTP=Local from the endpoint's node",
            from: From::Pod("client-a"),
            to: at(10, 96, 100, 16, 80),
            expect: local(Source::Kept),
        },
        Flow {
            name: "iTP=Local from a node without endpoints drops",
            from: From::Pod("client-b"),
            to: at(10, 96, 100, 16, 80),
            expect: Dropped,
        },
        Flow {
            name: "ClientIP affinity",
            from: From::Pod("client-b"),
            to: at(10, 96, 100, 14, 80),
            expect: Sticky { by: "web-" },
        },
        Flow {
            name: "no endpoints rejects (pod)",
            from: From::Pod("client-a"),
            to: at(10, 96, 100, 17, 80),
            expect: Refused,
        },
        Flow {
            name: "no endpoints rejects (outside, via node-a)",
            from: From::Outside,
            to: at(10, 96, 100, 17, 80),
            expect: Refused,
        },
    ]
}

/// How many connections each flow makes (enough to see two of four endpoints with certainty
/// 1 - 2·(1/2)^12 for an even spread).
pub const CONNECTIONS: usize = 12;

/// Where a flow's connections start: the namespace file and the address the client has there.
pub fn resolve(cluster: &KubeCluster, from: &From) -> Result<(PathBuf, IpAddr)> {
    match from {
        From::Outside => {
            let (name, ip) = cluster.outside_client();
            Ok((netns::netns_path(name), IpAddr::V4(ip)))
        }
        From::Node(node) => {
            let spec = cluster
                .spec()
                .node(node)
                .ok_or_else(|| LabError::Refused(format!("no node {node}")))?;
            Ok((netns::netns_path(&spec.netns), IpAddr::V4(spec.ip)))
        }
        From::Pod(pod) => pod_source(cluster, "flows", pod),
    }
}

/// The namespace file and IP of pod `namespace/name`, found through its node's cgroup.
pub fn pod_source(cluster: &KubeCluster, namespace: &str, name: &str) -> Result<(PathBuf, IpAddr)> {
    let out = cluster.kubectl(&[
        "-n",
        namespace,
        "get",
        "pod",
        name,
        "-o",
        "jsonpath={.metadata.uid} {.spec.nodeName} {.status.podIP}",
    ])?;
    let words: Vec<&str> = out.split_whitespace().collect();
    let [uid, node, ip] = words[..] else {
        return Err(LabError::Kube {
            what: format!("pod {namespace}/{name}"),
            detail: format!("no uid, node and IP yet ({out:?})"),
        });
    };
    let spec = cluster
        .spec()
        .node(node)
        .ok_or_else(|| LabError::Refused(format!("pod {name} is on {node}, not a lab node")))?;
    let ip: IpAddr = ip.parse().map_err(|_| LabError::Kube {
        what: format!("pod {namespace}/{name}"),
        detail: format!("IP {ip:?}"),
    })?;
    Ok((traffic::pod_netns(&spec.cgroup, uid)?, ip))
}

/// Runs each flow; returns one report line per flow and whether it passed.
pub fn check(cluster: &KubeCluster, flows: &[Flow]) -> Vec<(String, bool)> {
    flows
        .iter()
        .map(|flow| match resolve(cluster, &flow.from) {
            Ok((netns, client_ip)) => {
                let timeout = match flow.expect {
                    Expect::Dropped => Duration::from_millis(800),
                    _ => Duration::from_secs(3),
                };
                let count = match flow.expect {
                    Expect::Dropped | Expect::Refused => 3,
                    _ => CONNECTIONS,
                };
                let results = traffic::http_probe_many(&netns, flow.to, count, timeout);
                let (ok, detail) = judge(&flow.expect, client_ip, &results);
                (
                    format!("{} ({} → {}): {detail}", flow.name, describe(&flow.from), flow.to),
                    ok,
                )
            }
            Err(error) => (format!("{}: {error}", flow.name), false),
        })
        .collect()
}

fn describe(from: &From) -> String {
    match from {
        From::Pod(pod) => format!("pod {pod}"),
        From::Node(node) => node.to_string(),
        From::Outside => "outside".to_owned(),
    }
}

/// The verdict of one flow's results.
pub fn judge(expect: &Expect, client_ip: IpAddr, results: &[ProbeResult]) -> (bool, String) {
    let pods: BTreeSet<&str> = results.iter().filter_map(ProbeResult::pod).collect();
    let sources: BTreeSet<IpAddr> = results.iter().filter_map(ProbeResult::seen_ip).collect();
    let other: Vec<&ProbeResult> = results.iter().filter(|r| !r.is_answered()).collect();
    let summary = format!(
        "{} of {} answered by {:?}, sources {:?}{}",
        results.len() - other.len(),
        results.len(),
        pods,
        sources,
        other
            .first()
            .map_or_else(String::new, |r| format!(", first other result {r:?}"))
    );
    let ok = match expect {
        Expect::Answered { by, spread, source } => {
            other.is_empty()
                && pods.iter().all(|pod| pod.starts_with(by))
                && pods.len() >= *spread
                && match source {
                    Source::Kept => sources.iter().all(|ip| *ip == client_ip),
                    Source::Masqueraded => sources.iter().all(|ip| *ip != client_ip),
                    Source::Any => true,
                }
        }
        Expect::Sticky { by } => {
            other.is_empty() && pods.len() == 1 && pods.iter().all(|pod| pod.starts_with(by))
        }
        Expect::Refused => results.iter().all(|r| *r == ProbeResult::Refused),
        Expect::Dropped => results.iter().all(|r| *r == ProbeResult::TimedOut),
    };
    (ok, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(pod: &str, ip: [u8; 4]) -> ProbeResult {
        ProbeResult::Answered {
            pod: pod.into(),
            seen_source: SocketAddr::from((ip, 40000)),
        }
    }

    #[test]
    fn verdicts_follow_the_expectation() {
        let client = IpAddr::from([10, 244, 0, 5]);
        let spread = vec![answer("web-1", [10, 244, 0, 5]), answer("web-2", [10, 244, 0, 5])];
        let kept = Expect::Answered {
            by: "web-",
            spread: 2,
            source: Source::Kept,
        };
        assert!(judge(&kept, client, &spread).0);
        let masq = Expect::Answered {
            by: "web-",
            spread: 2,
            source: Source::Masqueraded,
        };
        assert!(!judge(&masq, client, &spread).0, "the client IP was kept");
        let one = vec![answer("web-1", [10, 244, 0, 5]), answer("web-1", [10, 244, 0, 5])];
        assert!(!judge(&kept, client, &one).0, "one pod is no spread");
        assert!(judge(&Expect::Sticky { by: "web-" }, client, &one).0);
        assert!(!judge(&Expect::Sticky { by: "web-" }, client, &spread).0);
        assert!(judge(&Expect::Refused, client, &[ProbeResult::Refused]).0);
        assert!(
            !judge(&Expect::Dropped, client, &[ProbeResult::Refused]).0,
            "REJECT is not DROP"
        );
        assert!(
            !judge(
                &kept,
                client,
                &[answer("web-1", [1, 1, 1, 1]), ProbeResult::TimedOut]
            )
            .0
        );
    }

    #[test]
    fn every_flow_names_a_lab_address_and_never_the_registries_range() {
        for flow in standard() {
            assert!(
                !flow.to.ip().to_string().starts_with("203.0.113."),
                "{}",
                flow.name
            );
        }
    }
}
