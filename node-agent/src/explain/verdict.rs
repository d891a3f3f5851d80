//! The verdict: what the plan makes the node do with the connection, from the same render the agent
//! programs and the same packet model the tests use, with each deciding rule said in words.
//!
//! ```text
//! plan ─► render (iptables rules of the plan) ─► Tracer ─► trace(packet) ─► outcome(): endpoints with
//!   │                                                                       shares, masquerade, REJECT/DROP
//!   └► entry: source ranges, traffic policy and topology, affinity, IPVS scheduler ─► steps in words
//! ```

use std::net::IpAddr;
use std::net::SocketAddr;

use ipnet::IpNet;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, ServicePlan, TrafficPolicy};

use super::question::{Destination, Source, node_ips, packet, pod_cidr, resolve};
use super::words::{Candidate, Explanation, Origin, Outcome, masquerade_reason};
use crate::backend::HostFacts;
use crate::error::Error;
use crate::iptables::render;
use crate::xtables::{Packet, Trace, Tracer, Verdict};

/// The rules the plan makes the agent program for one family, as the packet model; `local` are the
/// host's addresses (the plan's node IPs when `None`).
pub fn plan_tracer(
    spec: &NodeForwardingPlanSpec,
    family: IpFamily,
    local: Option<&[IpAddr]>,
) -> Result<Tracer, Error> {
    let report = switchyard_api::validate::validate(spec);
    let local = local.map_or_else(|| node_ips(spec), <[IpAddr]>::to_vec);
    let facts = HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        // NodePorts resolved as the agent resolves them on this host.
        local_addrs: local.clone(),
    };
    let ruleset = render(spec, &facts, family, &report.bad_entries());
    Tracer::from_ruleset(&ruleset, &local)
}

/// Explains a new connection from `source` to `dest` on the node of `spec` (with the host's `local`
/// addresses when it runs there, for `--kernel`). Returns the packet and the plan's trace too.
pub fn explain(
    spec: &NodeForwardingPlanSpec,
    dest: &Destination,
    source: Source,
    local: Option<&[IpAddr]>,
) -> Result<(Explanation, Packet, Trace), Error> {
    let ips = node_ips(spec);
    let (addr, protocol, found) = resolve(spec, dest, &ips)?;
    let packet = packet(spec, source, addr, protocol)?;
    let family = IpFamily::of(&addr.ip());
    let trace = plan_tracer(spec, family, local)?.trace(&packet)?;
    let mut steps = Vec::new();
    let Some((entry, what)) = found else {
        steps.push(format!(
            "{}/{} matches no frontend (ClusterIP, externalIP, LoadBalancer IP or NodePort) in the plan",
            addr,
            protocol.lower()
        ));
        // NB: the plan holds only what is forwarded; why a Service is not is the controller's to say.
        steps.push(
            "a Service the controller does not forward is in no plan: headless (clusterIP None, or \
             labelled service.kubernetes.io/headless), type ExternalName, or another proxy's \
             (service.kubernetes.io/service-proxy-name); `switchyard-controller plan` notes each one \
             with its reason"
                .to_owned(),
        );
        return Ok((
            Explanation {
                node: spec.node_name.clone(),
                backend: spec.backend.to_string(),
                service: None,
                steps,
                outcome: Outcome::NotAService,
                drift: None,
            },
            packet,
            trace,
        ));
    };
    steps.push(format!("{addr}/{} is {what}", protocol.lower()));

    let pods = pod_cidr(spec, family);
    let from_pod = pods.is_some_and(|net| net.contains(&packet.source));
    let from_node = matches!(source, Source::Node) || ips.contains(&packet.source);
    steps.push(match (from_node, from_pod, pods) {
        (true, _, _) => format!("from the node itself ({})", packet.source),
        (false, true, Some(net)) => format!("from pod {} (inside the pod CIDR {net})", packet.source),
        (false, _, Some(net)) => format!(
            "from {} outside the cluster (not in the pod CIDR {net})",
            packet.source
        ),
        (false, _, None) => format!(
            "from {} (the plan has no pod CIDR: pods and outside clients are not told apart)",
            packet.source
        ),
    });

    let cluster_ip = entry.cluster_ip.parse::<IpAddr>().ok() == Some(addr.ip());
    let lb = entry
        .load_balancer_ips
        .iter()
        .any(|ip| ip.parse::<IpAddr>().ok() == Some(addr.ip()));
    let mut denied = false;
    if lb && !entry.source_ranges.is_empty() {
        let allowed = entry
            .source_ranges
            .iter()
            .filter_map(|r| r.parse::<IpNet>().ok())
            .find(|net| net.contains(&packet.source));
        denied = allowed.is_none();
        steps.push(match allowed {
            Some(net) => format!("loadBalancerSourceRanges: {net} allows {}", packet.source),
            None => format!(
                "loadBalancerSourceRanges ({}) do not include {}: DROP (pods and the node are filtered \
                 too; NodePorts never are)",
                entry.source_ranges.join(", "),
                packet.source
            ),
        });
    }

    let used_cluster = entry.cluster_endpoints().count();
    let used_local = entry.local_endpoints().count();
    let terminating_only = entry
        .endpoints
        .iter()
        .filter(|e| e.cluster || e.local)
        .all(|e| e.terminating)
        && entry.endpoints.iter().any(|e| e.cluster || e.local);
    if denied {
        // Nothing after the source-range verdict applies.
    } else if !entry.has_endpoints {
        steps.push(format!(
            "{} has no usable endpoint: kube-proxy rejects such connections",
            entry.name
        ));
    } else if cluster_ip {
        steps.push(match entry.internal_policy {
            TrafficPolicy::Local if used_local == 0 => format!(
                "internalTrafficPolicy Local, and this node hosts no ready endpoint of {}: DROP",
                entry.name
            ),
            TrafficPolicy::Local => {
                format!("internalTrafficPolicy Local: only the {used_local} endpoint(s) on this node")
            }
            TrafficPolicy::Cluster => format!(
                "internalTrafficPolicy Cluster: {used_cluster} of the Service's {} endpoint(s){}",
                entry.endpoints.len(),
                if used_cluster < entry.endpoints.len() {
                    " (the others are not ready, terminating, or routed elsewhere by topology hints)"
                } else {
                    ""
                }
            ),
        });
    } else if entry.external_policy == TrafficPolicy::Local && !from_pod && !from_node {
        steps.push(if used_local == 0 {
            format!(
                "externalTrafficPolicy Local, and this node hosts no ready endpoint of {}: DROP (the load \
                 balancer's health check on this node fails, so it sends no traffic here)",
                entry.name
            )
        } else {
            format!(
                "externalTrafficPolicy Local: only the {used_local} endpoint(s) on this node; client IP kept"
            )
        });
    } else if entry.external_policy == TrafficPolicy::Local {
        steps.push(
            "externalTrafficPolicy Local does not apply to pods and the node itself: they reach every \
             endpoint, as if through the load balancer"
                .to_string(),
        );
    } else {
        steps.push(format!(
            "externalTrafficPolicy Cluster: any of {used_cluster} endpoint(s), on any node"
        ));
    }
    if terminating_only && entry.has_endpoints && !denied {
        steps.push("no endpoint is ready: the serving terminating ones are used as a fallback".to_string());
    }
    if let Some(seconds) = entry.affinity_timeout_seconds {
        steps.push(format!(
            "ClientIP session affinity ({seconds} s): later connections from {} go to the endpoint chosen \
             first",
            packet.source
        ));
    }
    if spec.backend == Backend::Ipvs {
        steps.push(format!(
            "IPVS scheduler {}: endpoints weighted by their node (switchyard.io/ipvs-weights)",
            entry.scheduler.as_deref().unwrap_or("rr")
        ));
    }

    let outcome = outcome(&trace, spec.backend, Some(entry));
    if let Outcome::Forwarded { endpoints } = &outcome {
        let origin = Origin {
            cluster_ip,
            from_pod,
            from_node,
            source: packet.source,
        };
        steps.push(masquerade_reason(endpoints, spec, entry, origin));
    }
    Ok((
        Explanation {
            node: spec.node_name.clone(),
            backend: spec.backend.to_string(),
            service: Some(entry.name.clone()),
            steps,
            outcome,
            drift: None,
        },
        packet,
        trace,
    ))
}

/// The outcome the trace shows, with IPVS weights where the backend uses them.
/// `entry` gives IPVS weights; without one (rules the plan does not have) every endpoint weighs 1.
pub(crate) fn outcome(trace: &Trace, backend: Backend, entry: Option<&ServicePlan>) -> Outcome {
    let verdicts = trace.verdicts();
    let dnat: Vec<SocketAddr> = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Dnat(to) => Some(*to),
            _ => None,
        })
        .collect();
    if dnat.is_empty() {
        return if verdicts.contains(&Verdict::Reject) {
            Outcome::Rejected
        } else if verdicts.contains(&Verdict::Drop) {
            Outcome::Dropped
        } else {
            Outcome::NotAService
        };
    }
    let weight_of = |to: &SocketAddr| {
        entry
            .into_iter()
            .flat_map(|e| &e.endpoints)
            .find(|e| e.ip.parse::<IpAddr>().ok() == Some(to.ip()) && e.port == to.port())
            .map(|e| e.weight.unwrap_or(1))
            .unwrap_or(1)
    };
    let total: u32 = dnat.iter().map(|to| u32::from(weight_of(to))).sum();
    let endpoints = dnat
        .iter()
        .map(|to| {
            let verdict = Verdict::Dnat(*to);
            let masquerade = trace.branches_to(&verdict).any(|b| b.masquerade);
            let (probability, weight) = if backend == Backend::Ipvs {
                let weight = weight_of(to);
                (f64::from(weight) / f64::from(total.max(1)), Some(weight))
            } else {
                (trace.probability(&verdict), None)
            };
            Candidate {
                endpoint: to.to_string(),
                probability,
                weight,
                masquerade,
                connections: None,
            }
        })
        .collect();
    Outcome::Forwarded { endpoints }
}
