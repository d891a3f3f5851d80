//! Condition types and reasons the agent writes into a plan's status, as named constants so both
//! binaries, the docs and the tests agree on the exact strings.

/// The plan's rules are programmed in the kernel.
pub const APPLIED: &str = "Applied";
/// Something is wrong but forwarding continues (per-service failures, backend fallback, stale plan).
pub const DEGRADED: &str = "Degraded";
/// Only while the node is leaving: the connections forwarded through it have ended (or the drain's
/// grace period has).
pub const DRAINED: &str = "Drained";

/// Conditions of a `ForwardingRollout`: nodes are moving.
pub const PROGRESSING: &str = "Progressing";
/// Conditions of a `ForwardingRollout`: every selected node moved (or was skipped).
pub const COMPLETE: &str = "Complete";
/// Conditions of a `ForwardingRollout`: it stopped for good (a gate failed, it was aborted, another
/// rollout holds its nodes).
pub const HALTED: &str = "Halted";

/// Reasons of a `ForwardingRollout`'s conditions and Events.
pub mod rollout_reasons {
    /// Planned: the nodes and their order are fixed.
    pub const PLANNED: &str = "Planned";
    /// A node's label was set to the target.
    pub const SWITCHING: &str = "NodeSwitching";
    /// A node switched and passed its verification; its bake started.
    pub const BAKING: &str = "NodeBaking";
    /// A node baked without a failed gate.
    pub const NODE_DONE: &str = "NodeDone";
    /// A node's gate failed: its label goes back.
    pub const GATE_FAILED: &str = "GateFailed";
    /// A node's label was restored.
    pub const REVERTED: &str = "NodeReverted";
    /// A node's label could not be restored.
    pub const REVERT_FAILED: &str = "RevertFailed";
    /// A node left the cluster before it moved.
    pub const SKIPPED: &str = "NodeSkipped";
    /// spec.paused is true.
    pub const PAUSED: &str = "Paused";
    /// A failure paused the rollout (onFailure: Pause).
    pub const PAUSED_BY_FAILURE: &str = "PausedByFailure";
    /// spec.paused went back to false.
    pub const RESUMED: &str = "Resumed";
    /// spec.abort is true: the nodes in flight were reverted.
    pub const ABORTED: &str = "Aborted";
    /// Every node moved.
    pub const COMPLETE: &str = "Complete";
    /// A node it selects is in another active rollout.
    pub const NODE_HELD: &str = "NodeHeldByAnotherRollout";
    /// The spec changed in a field that cannot change; the rollout keeps its planned spec.
    pub const SPEC_CHANGE_REFUSED: &str = "SpecChangeRefused";
    /// The rollout selects no node.
    pub const NO_NODES: &str = "NoNodes";
}

/// Condition status strings (Kubernetes convention).
pub mod status {
    /// The condition holds.
    pub const TRUE: &str = "True";
    /// The condition does not hold.
    pub const FALSE: &str = "False";
    /// Not known yet.
    pub const UNKNOWN: &str = "Unknown";
}

/// Reasons, in `UpperCamelCase` as Kubernetes expects.
pub mod reasons {
    /// Every entry of the plan was applied.
    pub const SYNCED: &str = "Synced";
    /// Some entries were rejected; the rest were applied.
    pub const PARTIALLY_APPLIED: &str = "PartiallyApplied";
    /// The plan was rejected whole; the last good rules stay in place.
    pub const INVALID_PLAN: &str = "InvalidPlan";
    /// The kernel refused the ruleset; the last good rules stay in place.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The plan's views are not complete yet (a slice is missing, or the slices of a view disagree on
    /// their count); the current rules stay.
    pub const INCOMPLETE_VIEW: &str = "IncompleteView";
    /// A ForwardingSlice failed validation; its last good copy (if any) stays in use.
    pub const INVALID_SLICE: &str = "InvalidSlice";
    /// The backend the plan asks for is unavailable; another one is in use.
    pub const BACKEND_FALLBACK: &str = "BackendFallback";
    /// The plan asks for another backend, but that backend's rendering of the plan gives some frontend
    /// another verdict than the one in use: the switch is refused before anything changes (the message
    /// names the Service), and the backend in use stays.
    pub const BACKEND_SWITCH_REFUSED: &str = "BackendSwitchRefused";
    /// Nothing is wrong.
    pub const HEALTHY: &str = "Healthy";
    /// The plan was deleted; the rules stay until the grace period ends.
    pub const PLAN_DELETED: &str = "PlanDeleted";
    /// The applied plan could not be written to the node's cache (disk full, read-only state
    /// directory): forwarding is unaffected, but a restart without the API server starts empty.
    pub const CACHE_WRITE_FAILED: &str = "CacheWriteFailed";
    /// A conntrack sysctl (a TCP timeout, the table size) could not be read or set as the agent's
    /// settings ask: forwarding is unaffected, long-idle connections may expire as the kernel's
    /// defaults say.
    pub const CONNTRACK_SYSCTL_FAILED: &str = "ConntrackSysctlFailed";
    /// A kube-proxy port the agent serves (the health port 10256 load balancers probe, the status port
    /// 10249) is held by another program, kube-proxy during a migration: the agent keeps forwarding and
    /// takes the port as soon as it is free.
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    /// Drained: no connection goes through the leaving node any more.
    pub const NO_CONNECTIONS: &str = "NoConnections";
    /// Drained: the drain's grace period ended with connections still open.
    pub const GRACE_PERIOD_ENDED: &str = "GracePeriodEnded";
    /// Not drained yet: connections still go through the leaving node.
    pub const CONNECTIONS_REMAIN: &str = "ConnectionsRemain";
}
