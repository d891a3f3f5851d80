//! Condition types and reasons the agent writes into a plan's status, as named constants so both
//! binaries, the docs and the tests agree on the exact strings.

/// The plan's rules are programmed in the kernel.
pub const APPLIED: &str = "Applied";
/// Something is wrong but forwarding continues (per-service failures, backend fallback, stale plan).
pub const DEGRADED: &str = "Degraded";
/// Only while the node is leaving: the connections forwarded through it have ended (or the drain's
/// grace period has).
pub const DRAINED: &str = "Drained";

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
