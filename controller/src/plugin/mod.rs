//! `kubectl switchyard`: what an operator asks of the cluster's Service proxy, from kubectl, without SSH
//! to a node and without remembering which binary answers which question.
//!
//! ```text
//! kubectl switchyard status   ─► plans, slices, Nodes ─► audit + rows (status) ─► table
//!                    audit    ─► plans, slices ─► audit::table (as `switchyard-controller audit`)
//!                    plan     ─► one node's plan + its views' slices ─► compose (node_plan) ─► YAML/JSON
//!                    explain  ─► the node's agent pod (agent_pod) ─► exec `switchyard-agent explain --node N …`
//!                    top      ─► the node's agent pod ─► exec `switchyard-agent top --node N …`
//! ```
//!
//! The pure parts (rows, the pod's verdict, composition) are here; [`cluster`] is the only edge.

pub mod agent_pod;
pub mod cluster;
pub mod node_plan;
pub mod status;

/// The namespace the agents run in when `-n` does not say (config/default).
pub const DEFAULT_NAMESPACE: &str = "switchyard-system";
