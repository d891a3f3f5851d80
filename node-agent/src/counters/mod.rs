//! Per-Service traffic counters from the data plane: new connections per frontend and per endpoint,
//! and the connections a Service refused, counted by the kernel in the rules the agent owns.
//!
//! ```text
//! applied plan ──────────────────────────────┐ (AppliedPlan, set by the run loop after each sync)
//! kernel counters ─► CounterSource::read ─► [Sample { entry, what, element, packets }]
//!   nftables: per-element counters of the counted sets (nftables::counters, over netlink)
//!   IPVS: every real server's connection count (ipvs::counters, generic netlink)
//!   iptables: the packet counts of the agent's rules (iptables::counters, iptables-save -c)
//!                                  ─► Accumulator::update (per element: resets and moves absorbed)
//!                                  ─► [Series] monotonic within one process ─► TrafficCollector ─► /metrics
//! ```
//!
//! The NAT hooks and the `ct state new` filter paths see only a connection's first packet, so a packet
//! count there is a connection count, nearly free. A series is the sum of one or more kernel counters
//! (an endpoint is reached through every frontend of its Service; a Service may have several external
//! IPs). Kernel counters start at 0 whenever the agent rewrites the element (a changed Service, a
//! Service whose endpoint count moves it to another class); the [`series::Accumulator`] keeps each
//! series monotonic by remembering every element's last value, so a changed Service keeps its count up
//! to the last read. A restart of the agent starts every series again at what the kernel holds (reset
//! semantics of a new process).

pub mod collector;
pub mod frontends;
pub mod series;
pub mod top;

pub use collector::{CountersConfig, TrafficCollector};
pub use series::{Accumulator, Series};

use std::collections::HashSet;
use std::sync::{Arc, PoisonError, RwLock};

use switchyard_api::{Backend, NodeForwardingPlanSpec, Protocol};

use crate::error::Error;

/// Which frontend of a Service a connection came in through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frontend {
    /// The ClusterIP.
    ClusterIp,
    /// The NodePort, on any of the node's NodePort addresses.
    NodePort,
    /// One of `spec.externalIPs`.
    ExternalIp,
    /// A LoadBalancer ingress IP.
    LoadBalancer,
}

impl Frontend {
    /// The `frontend` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::ClusterIp => "clusterIP",
            Self::NodePort => "nodePort",
            Self::ExternalIp => "externalIP",
            Self::LoadBalancer => "loadBalancer",
        }
    }
}

/// Why a connection to a Service was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The Service has no usable endpoint: REJECT.
    NoEndpoints,
    /// `externalTrafficPolicy: Local` (or `internalTrafficPolicy: Local`) and none on this node: DROP.
    NoLocalEndpoints,
    /// A LoadBalancer connection from outside `loadBalancerSourceRanges`: DROP.
    SourceRange,
}

impl Refusal {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoEndpoints => "no-endpoints",
            Self::NoLocalEndpoints => "no-local-endpoints",
            Self::SourceRange => "source-range",
        }
    }
}

/// A node-wide counter kube-proxy's iptables mode keeps with nfacct (no Service's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCounter {
    /// Forwarded packets dropped in conntrack state INVALID (`iptables_ct_state_invalid_dropped_packets_total`).
    InvalidDropped,
    /// Connections accepted on a localhost NodePort (`iptables_localhost_nodeports_accepted_packets_total`).
    LocalhostNodePorts,
}

impl NodeCounter {
    /// The metric's name (without `_total`) and help.
    pub fn metric(self) -> (&'static str, &'static str) {
        match self {
            Self::InvalidDropped => (
                "switchyard_agent_iptables_ct_state_invalid_dropped_packets",
                "Forwarded packets the iptables backend dropped in conntrack state INVALID (kube-proxy's \
                 iptables_ct_state_invalid_dropped_packets_total)",
            ),
            Self::LocalhostNodePorts => (
                "switchyard_agent_iptables_localhost_nodeports_accepted_packets",
                "Connections the iptables backend accepted on a NodePort at 127.0.0.0/8 (kube-proxy's \
                 iptables_localhost_nodeports_accepted_packets_total; 0 says nothing depends on them)",
            ),
        }
    }
}

/// What a kernel counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum What {
    /// New connections through one frontend.
    Frontend(Frontend),
    /// New connections DNATed to one endpoint (`ip:port`).
    Endpoint(String),
    /// Connections refused.
    Refused(Refusal),
    /// A node-wide counter (its sample's Service port is the one the rule belongs to, or none).
    Node(NodeCounter),
}

/// The Service port a counter belongs to: kube-proxy's ServicePortName and the protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePort {
    /// `namespace/name:port` (`namespace/name` for an unnamed port), as in the plan.
    pub name: Arc<str>,
    /// Its protocol.
    pub protocol: Protocol,
}

impl ServicePort {
    /// (namespace, service, port name) from the ServicePortName.
    pub fn parts(&self) -> (&str, &str, &str) {
        let (namespace, rest) = self.name.split_once('/').unwrap_or(("", &self.name));
        let (service, port) = rest.split_once(':').unwrap_or((rest, ""));
        (namespace, service, port)
    }
}

/// One kernel counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The Service port.
    pub service: ServicePort,
    /// What it counts.
    pub what: What,
    /// Identifies the kernel object holding the counter (a set element, a rule), stable while the
    /// object lives: a new object starts a new counter.
    pub element: u64,
    /// Its packets (= connections, on the paths counted).
    pub packets: u64,
}

/// Reads the kernel's counters for the plan it was last told about.
pub trait CounterSource: Send {
    /// Every counter of the applied plan (none before a plan is applied).
    fn read(&mut self) -> Result<Vec<Sample>, Error>;
}

/// The plan the kernel holds now, as the run loop last applied it: what a [`CounterSource`] maps the
/// kernel's counters back to. Clones share the slot.
#[derive(Debug, Clone, Default)]
pub struct AppliedPlan {
    slot: Arc<RwLock<Option<Applied>>>,
}

/// A plan and the indexes of its entries that are not in the kernel (invalid, or refused).
#[derive(Debug, Clone)]
pub struct Applied {
    /// The composed plan.
    pub spec: Arc<NodeForwardingPlanSpec>,
    /// The backend that applied it: the plan's, or the one the agent fell back to.
    pub backend: Backend,
    /// Entries left out.
    pub skip: Arc<HashSet<usize>>,
}

impl AppliedPlan {
    /// Records the plan now applied.
    pub fn set(&self, applied: Option<Applied>) {
        *self.slot.write().unwrap_or_else(PoisonError::into_inner) = applied;
    }

    /// The plan now applied.
    pub fn get(&self) -> Option<Applied> {
        self.slot.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// An element identity from the parts that name it.
pub fn element_id(parts: impl std::hash::Hash) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_port_names_split_into_their_labels() {
        let named = ServicePort {
            name: "ns1/web:http".into(),
            protocol: Protocol::TCP,
        };
        assert_eq!(named.parts(), ("ns1", "web", "http"));
        let unnamed = ServicePort {
            name: "ns1/web".into(),
            protocol: Protocol::TCP,
        };
        assert_eq!(unnamed.parts(), ("ns1", "web", ""));
    }
}
