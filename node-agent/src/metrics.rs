//! Metrics of the long-running agent beyond the syncer's own ([`crate::sync::SyncMetrics`]): plan age,
//! network programming latency, status writes, the cache, a deleted plan.
//!
//! ```text
//! run loop ─► plan_age_seconds (every tick), network_programming_duration_seconds (new revision applied),
//!             plan_deleted / plan_deleted_seconds, cache_writes / cache_write_failures,
//!             sync_last_queued_timestamp_seconds, leaving, drain_connections{,_by_service}
//! kube-proxy's ports ─► healthz_total{code}, livez_total{code}, kube_proxy_port_bound{port}
//! status writer ─► status_writes / status_write_failures
//! registry() ─► SyncMetrics + these, prefix switchyard_agent_; the traffic collector (counters) ─► GET /metrics
//! ```
//!
//! Plan age is now minus the time the applied plan's spec was last written by the controller (its
//! `managedFields` entry; see [`crate::source::store::written_at`]); 0 while unknown (plan files).
//! Network programming latency is the time the plan was applied minus the primary's
//! `switchyard.io/last-change-trigger-time` (the earliest EndpointSlice change the controller's write
//! carried), observed once per applied revision that came from the API server: it spans the
//! EndpointSlice controller, the switchyard controller, the API server, the watch and the sync, like
//! kube-proxy's `network_programming_duration_seconds`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use switchyard_api::SyncMode;

use crate::sync::SyncMetrics;
use crate::sync::metrics::ModeFamilyLabel;

/// The live agent's metrics. Clones share the same values.
#[derive(Clone, Debug)]
pub struct LiveMetrics {
    /// Seconds since the applied plan's spec was written.
    pub plan_age_seconds: Gauge<f64, AtomicU64>,
    /// Trigger time → applied.
    pub network_programming: Histogram,
    /// Status writes that succeeded.
    pub status_writes: Counter,
    /// Status writes that failed.
    pub status_write_failures: Counter,
    /// 1 while this node's plan is deleted (its rules kept for the grace period, or for good).
    pub plan_deleted: Gauge,
    /// Seconds since the deletion was confirmed (0 when not deleted).
    pub plan_deleted_seconds: Gauge<f64, AtomicU64>,
    /// Plan updates received from the source.
    pub plan_updates: Counter,
    /// Cache files written.
    pub cache_writes: Counter,
    /// Cache writes that failed.
    pub cache_write_failures: Counter,
    /// kube-proxy's `/healthz` answers, by status code.
    pub healthz_total: Family<CodeLabel, Counter>,
    /// kube-proxy's `/livez` answers, by status code.
    pub livez_total: Family<CodeLabel, Counter>,
    /// 1 while a kube-proxy port (10256, 10249) is served, 0 while it is taken.
    pub kube_proxy_port_bound: Family<PortLabel, Gauge>,
    /// When the oldest update still waiting for a sync arrived (Unix seconds; 0 when none waits), as
    /// kube-proxy's `sync_proxy_rules_last_queued_timestamp_seconds`.
    pub last_queued_timestamp_seconds: Gauge<f64, AtomicU64>,
    /// 1 while the plan says this node is leaving.
    pub leaving: Gauge,
    /// While leaving: the connections still forwarded through this node.
    pub drain_connections: Gauge,
    /// While leaving: the connections still forwarded through this node, for its busiest Services.
    pub drain_connections_by_service: Family<ServiceLabel, Gauge>,
}

/// `code="200"` or `code="503"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The HTTP status code.
    pub code: u16,
}

/// `port="10256"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabel {
    /// The port.
    pub port: u16,
}

/// A Service, `namespace` and `service`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub service: String,
}

impl Default for LiveMetrics {
    fn default() -> Self {
        Self {
            plan_age_seconds: Gauge::default(),
            // 10 ms .. ~160 s, as the controller's histogram.
            network_programming: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            status_writes: Counter::default(),
            status_write_failures: Counter::default(),
            plan_deleted: Gauge::default(),
            plan_deleted_seconds: Gauge::default(),
            plan_updates: Counter::default(),
            cache_writes: Counter::default(),
            cache_write_failures: Counter::default(),
            healthz_total: Family::default(),
            livez_total: Family::default(),
            kube_proxy_port_bound: Family::default(),
            last_queued_timestamp_seconds: Gauge::default(),
            leaving: Gauge::default(),
            drain_connections: Gauge::default(),
            drain_connections_by_service: Family::default(),
        }
    }
}

impl LiveMetrics {
    /// Adds these metrics to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "plan_age_seconds",
            "Seconds since the controller wrote the spec of the applied plan (0 when unknown)",
            self.plan_age_seconds.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "From the plan's last-change-trigger-time (earliest EndpointSlice change) to the plan applied",
            self.network_programming.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes to the plan that succeeded",
            self.status_writes.clone(),
        );
        registry.register(
            "status_write_failures",
            "Status writes to the plan that failed",
            self.status_write_failures.clone(),
        );
        registry.register(
            "plan_deleted",
            "1 while this node's plan is deleted and its rules are kept",
            self.plan_deleted.clone(),
        );
        registry.register(
            "plan_deleted_seconds",
            "Seconds since this node's plan was found deleted (0 when it exists)",
            self.plan_deleted_seconds.clone(),
        );
        registry.register(
            "plan_updates",
            "Plan updates received from the plan source",
            self.plan_updates.clone(),
        );
        registry.register(
            "plan_cache_writes",
            "Applied plans written to the local cache",
            self.cache_writes.clone(),
        );
        registry.register(
            "plan_cache_write_failures",
            "Writes of the local plan cache that failed",
            self.cache_write_failures.clone(),
        );
        registry.register(
            "healthz",
            "Answers of kube-proxy's /healthz (--healthz-bind-address), by status code",
            self.healthz_total.clone(),
        );
        registry.register(
            "livez",
            "Answers of kube-proxy's /livez (--healthz-bind-address), by status code",
            self.livez_total.clone(),
        );
        registry.register(
            "kube_proxy_port_bound",
            "1 while a kube-proxy port (health 10256, status 10249) is served, 0 while another program holds it",
            self.kube_proxy_port_bound.clone(),
        );
        registry.register(
            "sync_last_queued_timestamp_seconds",
            "When the oldest plan update still waiting for a sync arrived (Unix seconds; 0 when none waits)",
            self.last_queued_timestamp_seconds.clone(),
        );
        registry.register(
            "leaving",
            "1 while this node's plan says it is leaving (kube-proxy's /healthz answers 503)",
            self.leaving.clone(),
        );
        registry.register(
            "drain_connections",
            "While leaving: connections still forwarded through this node (conntrack entries to its Service frontends)",
            self.drain_connections.clone(),
        );
        registry.register(
            "drain_service_connections",
            "While leaving: connections still forwarded through this node, for its busiest Services",
            self.drain_connections_by_service.clone(),
        );
    }
}

/// The agent's whole registry: the syncer's metrics and the live ones, prefix `switchyard_agent`.
/// The sync duration series of both modes exist from the start (empty histograms), so dashboards and
/// alerts see them before the first partial sync.
/// With `traffic`, the per-Service traffic series ([`crate::counters`]) too, under their own
/// `switchyard_` names.
pub fn registry(
    sync: &SyncMetrics,
    live: &LiveMetrics,
    traffic: Option<crate::counters::TrafficCollector>,
) -> Registry {
    for mode in [SyncMode::Full, SyncMode::Partial] {
        let _ = sync
            .sync_duration
            .get_or_create(&ModeFamilyLabel::of(mode, switchyard_api::IpFamily::IPv4));
    }
    let mut registry = Registry::default();
    let agent = registry.sub_registry_with_prefix("switchyard_agent");
    sync.register(agent);
    live.register(agent);
    if let Some(traffic) = traffic {
        registry.register_collector(Box::new(traffic));
    }
    registry
}
