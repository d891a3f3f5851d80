//! The answer `explain` gives, and its words: the outcome, the endpoints with their shares, the steps,
//! drift found in the kernel, as text or JSON, and the exit status.
//!
//! ```text
//! Explanation { node, backend, service, steps, outcome, drift } ─► text() | serde JSON ─► stdout
//!                                                               └► exit_code(): 0 forwarded, 3 not
//! ```

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;
use switchyard_api::{NodeForwardingPlanSpec, ServicePlan, TrafficPolicy};

/// Exit status: the connection is forwarded to an endpoint (the shared table's "done").
pub const EXIT_FORWARDED: u8 = switchyard_process::exit::OK;
/// Exit status: rejected, dropped, or not a frontend of any Service (the shared table's "the answer is
/// no").
pub const EXIT_NOT_FORWARDED: u8 = switchyard_process::exit::NO;

/// What happens to the connection.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum Outcome {
    /// DNATed to one of these endpoints.
    Forwarded {
        /// Each endpoint with its share of new connections.
        endpoints: Vec<Candidate>,
    },
    /// Refused at once (ICMP port unreachable), as kube-proxy does for a Service without endpoints.
    Rejected,
    /// Dropped silently.
    Dropped,
    /// No Service of this plan has this frontend: Switchyard leaves the packet alone.
    NotAService,
}

/// One endpoint a new connection may go to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// `ip:port`.
    pub endpoint: String,
    /// Share of new connections (iptables/nftables: uniform; IPVS: by weight with a weighted scheduler).
    pub probability: f64,
    /// IPVS weight, with the IPVS backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u16>,
    /// The source is rewritten to the node's address on the way to this endpoint.
    pub masquerade: bool,
    /// With `--kernel` on nftables: new connections the kernel counted to this endpoint of the Service
    /// (all its frontends) since its element was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
}

/// The answer: the steps in words, and the outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The node whose plan was asked.
    pub node: String,
    /// The backend the plan asks for.
    pub backend: String,
    /// The Service entry (`namespace/name:port`), if a frontend matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// What happens, step by step, in plain words.
    pub steps: Vec<String>,
    /// The outcome.
    pub outcome: Outcome,
    /// With `--kernel`: where the installed rules differ from the plan on this path (empty: they agree).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<Vec<String>>,
}

impl Explanation {
    /// [`EXIT_FORWARDED`] or [`EXIT_NOT_FORWARDED`].
    pub fn exit_code(&self) -> u8 {
        match self.outcome {
            Outcome::Forwarded { .. } => EXIT_FORWARDED,
            _ => EXIT_NOT_FORWARDED,
        }
    }

    /// The steps as numbered lines, then the outcome and any drift.
    pub fn text(&self) -> String {
        let mut out = format!(
            "node {} (backend {}): a new connection\n",
            self.node, self.backend
        );
        for (i, step) in self.steps.iter().enumerate() {
            out.push_str(&format!("{:>2}. {step}\n", i + 1));
        }
        out.push_str(&match &self.outcome {
            Outcome::Forwarded { endpoints } => {
                let list: Vec<String> = endpoints
                    .iter()
                    .map(|c| {
                        let weight = c.weight.map(|w| format!(", weight {w}")).unwrap_or_default();
                        let masquerade = if c.masquerade { ", masqueraded" } else { "" };
                        let counted = c
                            .connections
                            .map(|n| format!(", {n} connections counted"))
                            .unwrap_or_default();
                        format!(
                            "{} ({:.0}%{weight}{masquerade}{counted})",
                            c.endpoint,
                            c.probability * 100.0
                        )
                    })
                    .collect();
                format!("=> FORWARDED to {}\n", list.join(", "))
            }
            Outcome::Rejected => "=> REJECTED (connection refused at once)\n".to_string(),
            Outcome::Dropped => "=> DROPPED (the client sees a timeout)\n".to_string(),
            Outcome::NotAService => "=> NOT A SERVICE: Switchyard leaves this packet alone\n".to_string(),
        });
        match &self.drift {
            Some(drift) if drift.is_empty() => {
                out.push_str("kernel: the installed rules take the same path as the plan\n");
            }
            Some(drift) => {
                out.push_str("kernel: DRIFT — the installed rules differ from the plan on this path:\n");
                for line in drift {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            None => {}
        }
        out
    }
}

/// Where a connection comes from and which kind of frontend it meets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub(crate) cluster_ip: bool,
    pub(crate) from_pod: bool,
    pub(crate) from_node: bool,
    pub(crate) source: IpAddr,
}

/// Why the source is (or is not) masqueraded, as kube-proxy decides it.
pub(crate) fn masquerade_reason(
    endpoints: &[Candidate],
    spec: &NodeForwardingPlanSpec,
    entry: &ServicePlan,
    origin: Origin,
) -> String {
    let masqueraded: Vec<&Candidate> = endpoints.iter().filter(|c| c.masquerade).collect();
    if masqueraded.is_empty() {
        return "no masquerade: the endpoint sees the client's own address".to_string();
    }
    if masqueraded.len() < endpoints.len() {
        let hairpin = masqueraded.iter().all(|c| {
            c.endpoint
                .parse::<SocketAddr>()
                .is_ok_and(|e| e.ip() == origin.source)
        });
        return if hairpin {
            "masquerade only when the connection comes back to the client itself (hairpin): otherwise the \
             reply would skip the reverse DNAT"
                .to_string()
        } else {
            "masquerade on some paths only".to_string()
        };
    }
    let why = if spec.cluster.masquerade_all {
        "masqueradeAll is set"
    } else if origin.from_node {
        "the connection starts on the node"
    } else if origin.cluster_ip && !origin.from_pod {
        "the client is outside the pod CIDR: replies must come back through this node"
    } else if !origin.cluster_ip && entry.external_policy == TrafficPolicy::Cluster {
        "externalTrafficPolicy Cluster: the endpoint may be on another node, replies must come back here"
    } else {
        "the only endpoint is the client itself (hairpin): otherwise the reply would skip the reverse DNAT"
    };
    format!("masquerade: {why}")
}
