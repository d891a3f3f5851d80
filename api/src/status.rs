//! The `NodeForwardingPlan` status: what the node's agent actually applied. Written only by the agent,
//! through the status subresource. Kept small: counts, conditions and a capped list of failures.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::verification::Verification;

/// The most per-service failures a status lists; `failuresTotal` counts the rest.
pub const MAX_LISTED_FAILURES: usize = 10;

/// What the agent applied, and how it went.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeForwardingPlanStatus {
    /// The plan revision the kernel state corresponds to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<String>,
    /// The ForwardingSlices composed into that state (absent for a self-contained plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_slices: Option<ObservedSlices>,
    /// The backend actually in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// Why the backend in use differs from the one the plan asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_reason: Option<String>,
    /// `Applied` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub conditions: Vec<PlanCondition>,
    /// Service entries programmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<u32>,
    /// Endpoints programmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<u32>,
    /// Rules (iptables/nftables) or virtual plus real servers (IPVS) programmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<u64>,
    /// When the last sync finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<String>,
    /// How long the last sync took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_duration_ms: Option<u64>,
    /// Whether the last sync rewrote everything or only changed services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_mode: Option<SyncMode>,
    /// Times the agent found its kernel state changed behind its back and repaired it, since it started.
    #[serde(default)]
    pub drift_repairs: u64,
    /// Conntrack entries the agent cleared since it started: connections to endpoints that left their
    /// Service, and kube-proxy's stale UDP entries (its metrics split them by reason).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub conntrack_flows_cleared: u64,
    /// Entries that could not be applied (at most ten listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub failures: Vec<ServiceFailure>,
    /// All failed entries, listed or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures_total: Option<u32>,
    /// While the applied plan says the node is leaving: the connections still forwarded through it
    /// (counted at least every 10 s; the `Drained` condition says when they ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<DrainStatus>,
    /// What the agent found when it last checked the backend it switched to (a `ForwardingRollout`'s
    /// gates read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

/// A leaving node's drain, as its agent sees it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Why the node is leaving (the plan's `leaving.reason`).
    #[schemars(length(max = 330))]
    pub reason: String,
    /// When this agent first applied a plan saying so (RFC 3339).
    pub since: String,
    /// Connections still forwarded through the node: conntrack entries to its NodePorts, external IPs
    /// and load-balancer IPs (absent until first counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// The Services with the most of them (at most five).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub services: Vec<ServiceConnections>,
    /// When they were last counted (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
}

/// One Service's connections through a leaving node.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceConnections {
    /// `namespace/name`.
    #[schemars(length(max = 320))]
    pub service: String,
    /// Its connections through the node.
    pub connections: u64,
}

/// Which ForwardingSlices an applied state was composed from, small enough for every status: the count
/// and a digest of their names and revisions ([`crate::compose::slices_digest`]). Every current node of
/// one zone shows the same digest; `switchyard-controller audit` names the slices a node misses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSlices {
    /// Slices composed.
    pub count: u32,
    /// Digest of their `name=revision` lines, sorted (12 hex characters).
    #[schemars(length(max = 64))]
    pub digest: String,
}

/// Full or partial sync.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum SyncMode {
    /// Every owned chain or object was rewritten.
    Full,
    /// Only changed services were rewritten.
    Partial,
}

/// A Kubernetes-style condition.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanCondition {
    /// `Applied` or `Degraded` (see [`crate::conditions`]).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason in UpperCamelCase.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// One entry the agent could not apply.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceFailure {
    /// The entry's ServicePortName (`namespace/name:port`), with protocol and family.
    pub service: String,
    /// Why.
    #[schemars(length(max = 512))]
    pub reason: String,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}
