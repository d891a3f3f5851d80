//! The controller's Prometheus metrics and what its HTTP endpoints answer (`/metrics`, `/healthz`,
//! `/readyz`; served by `switchyard_process::http`).
//!
//! ```text
//! engine / writer ─► Metrics (counters, gauges, histograms) ─► GET /metrics (OpenMetrics text)
//! run loop heartbeat ─► /healthz        first planning after initial sync ─► /readyz
//! ```

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use switchyard_process::http::{Endpoints, Probe};

/// Label of per-kind counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `Service`, `EndpointSlice`, `Node`, `NodeForwardingPlan` or `ForwardingSlice`.
    pub kind: String,
}

/// Label of the planning histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `full` or `incremental`.
    pub mode: String,
}

/// Label of the Service problem gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The Event reason (`NoEndpoints`, ...).
    pub reason: String,
}

/// Label of the Event counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `published`, `failed`, or `dropped` (the publisher's queue was full).
    pub outcome: String,
}

/// Label of the rollout gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// A rollout's phase (`Pending`, `Progressing`, ...) or a node's (`Waiting`, `Switching`, ...).
    pub phase: String,
}

/// Label of the rollout write counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `status` (a rollout's status) or `label` (a Node's backend label).
    pub write: String,
    /// `ok` or `failed`.
    pub outcome: String,
}

/// Every metric the controller exports (prefix `switchyard_controller_`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Plan objects written.
    pub plans_written: Counter,
    /// Plan objects found already up to date when they were reconciled.
    pub plans_unchanged: Counter,
    /// Plan and slice writes and deletes that failed.
    pub write_failures: Counter,
    /// Bytes of plan objects written.
    pub bytes_written: Counter,
    /// Plan objects deleted (plans of nodes that are gone).
    pub plans_deleted: Counter,
    /// Plans restored after someone else edited or deleted them.
    pub plans_restored: Counter,
    /// ForwardingSlices written.
    pub slices_written: Counter,
    /// ForwardingSlices found already up to date when they were reconciled.
    pub slices_unchanged: Counter,
    /// Bytes of ForwardingSlices written.
    pub slice_bytes_written: Counter,
    /// ForwardingSlices deleted (no longer needed).
    pub slices_deleted: Counter,
    /// ForwardingSlices restored after someone else edited or deleted them.
    pub slices_restored: Counter,
    /// Writes that waited for the write budget.
    pub throttled_writes: Counter,
    /// Input objects the planner skipped as invalid: each counted once, not once per re-plan (again only
    /// if it breaks again after a full re-plan found it fixed).
    pub skipped_objects: Family<KindLabel, Counter>,
    /// Planning run durations.
    pub planning_duration: Family<ModeLabel, Histogram>,
    /// EndpointSlice change trigger time → plan written.
    pub network_programming: Histogram,
    /// Nodes waiting for a write.
    pub queue_depth: Gauge,
    /// 1 while this replica holds the lease.
    pub leader: Gauge,
    /// The write budget (writes per second), for dashboards to set the write rate against.
    pub write_budget_qps: Gauge<f64, AtomicU64>,
    /// Services with each problem now.
    pub service_problems: Family<ReasonLabel, Gauge>,
    /// Events about Service problems, by outcome.
    pub service_events: Family<OutcomeLabel, Counter>,
    /// Watched objects that did not decode (their last good version stays), by kind: each counted
    /// when it breaks (again only after it was read well, or broke another way).
    pub undecodable_objects: Family<KindLabel, Counter>,
    /// Events about objects that did not decode, by outcome.
    pub undecodable_events: Family<OutcomeLabel, Counter>,
    /// ServiceCIDRs ignored now (invalid, or overlapping a pod CIDR), by reason.
    pub ignored_service_cidrs: Family<ReasonLabel, Gauge>,
    /// Events about ignored ServiceCIDRs, by outcome.
    pub service_cidr_events: Family<OutcomeLabel, Counter>,
    /// Watch failures, by kind: each is retried with backoff, during which no change of that kind
    /// arrives.
    pub watch_errors: Family<KindLabel, Counter>,
    /// ForwardingRollouts by phase (set on the leader).
    pub rollouts: Family<PhaseLabel, Gauge>,
    /// Nodes of the rollouts still running (not Complete or Halted), by node phase.
    pub rollout_nodes: Family<PhaseLabel, Gauge>,
    /// Steps of rollouts, by the reason of their Event (`NodeDone`, `GateFailed`, ...).
    pub rollout_steps: Family<ReasonLabel, Counter>,
    /// Rollout status and Node label writes, by outcome.
    pub rollout_writes: Family<WriteLabel, Counter>,
    /// Events about rollouts, by outcome.
    pub rollout_events: Family<OutcomeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("switchyard_controller");
        let m = Self {
            registry: Registry::default(),
            plans_written: Counter::default(),
            plans_unchanged: Counter::default(),
            write_failures: Counter::default(),
            bytes_written: Counter::default(),
            plans_deleted: Counter::default(),
            plans_restored: Counter::default(),
            slices_written: Counter::default(),
            slices_unchanged: Counter::default(),
            slice_bytes_written: Counter::default(),
            slices_deleted: Counter::default(),
            slices_restored: Counter::default(),
            throttled_writes: Counter::default(),
            skipped_objects: Family::default(),
            planning_duration: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.0005, 2.0, 16,
                ))
            }),
            network_programming: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.01, 2.0, 14,
            )),
            queue_depth: Gauge::default(),
            leader: Gauge::default(),
            write_budget_qps: Gauge::default(),
            service_problems: Family::default(),
            service_events: Family::default(),
            undecodable_objects: Family::default(),
            undecodable_events: Family::default(),
            ignored_service_cidrs: Family::default(),
            service_cidr_events: Family::default(),
            watch_errors: Family::default(),
            rollouts: Family::default(),
            rollout_nodes: Family::default(),
            rollout_steps: Family::default(),
            rollout_writes: Family::default(),
            rollout_events: Family::default(),
        };
        registry.register(
            "plans_written",
            "Plan objects written (server-side apply)",
            m.plans_written.clone(),
        );
        registry.register(
            "plans_unchanged",
            "Plan objects already up to date, not written",
            m.plans_unchanged.clone(),
        );
        registry.register(
            "plan_write_failures",
            "Plan and slice writes and deletes that failed",
            m.write_failures.clone(),
        );
        registry.register(
            "plan_bytes_written",
            "Bytes of plan objects written",
            m.bytes_written.clone(),
        );
        registry.register("plans_deleted", "Plan objects deleted", m.plans_deleted.clone());
        registry.register(
            "plans_restored",
            "Plans restored after an outside edit or delete",
            m.plans_restored.clone(),
        );
        registry.register(
            "slices_written",
            "ForwardingSlices written (server-side apply)",
            m.slices_written.clone(),
        );
        registry.register(
            "slices_unchanged",
            "ForwardingSlices already up to date, not written",
            m.slices_unchanged.clone(),
        );
        registry.register(
            "slice_bytes_written",
            "Bytes of ForwardingSlices written",
            m.slice_bytes_written.clone(),
        );
        registry.register(
            "slices_deleted",
            "ForwardingSlices deleted (no longer needed)",
            m.slices_deleted.clone(),
        );
        registry.register(
            "slices_restored",
            "ForwardingSlices restored after an outside edit or delete",
            m.slices_restored.clone(),
        );
        registry.register(
            "throttled_writes",
            "Plan and slice writes that waited for the write budget",
            m.throttled_writes.clone(),
        );
        registry.register(
            "skipped_objects",
            "Input objects the planner skipped as invalid",
            m.skipped_objects.clone(),
        );
        registry.register(
            "planning_duration_seconds",
            "Duration of planning runs",
            m.planning_duration.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "From the EndpointSlice last-change-trigger-time to the plan or slice write",
            m.network_programming.clone(),
        );
        registry.register(
            "queue_depth",
            "Plans and slices waiting for a write or delete",
            m.queue_depth.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        registry.register(
            "write_budget_qps",
            "The global write budget for plans and slices, writes per second (writeQPS)",
            m.write_budget_qps.clone(),
        );
        registry.register(
            "service_problems",
            "Services with a problem that leaves them without working forwarding, by reason",
            m.service_problems.clone(),
        );
        registry.register(
            "service_problem_events",
            "Warning Events about Service problems, by outcome",
            m.service_events.clone(),
        );
        registry.register(
            "undecodable_objects",
            "Watched objects that did not decode, by kind (their last good version stays in use)",
            m.undecodable_objects.clone(),
        );
        registry.register(
            "undecodable_object_events",
            "Warning Events about watched objects that did not decode, by outcome",
            m.undecodable_events.clone(),
        );
        registry.register(
            "ignored_service_cidrs",
            "ServiceCIDR objects ignored (invalid, or overlapping a pod CIDR), by reason",
            m.ignored_service_cidrs.clone(),
        );
        registry.register(
            "service_cidr_events",
            "Warning Events about ignored ServiceCIDRs, by outcome",
            m.service_cidr_events.clone(),
        );
        registry.register(
            "watch_errors",
            "Watch failures by kind, each retried with backoff",
            m.watch_errors.clone(),
        );
        registry.register(
            "rollouts",
            "ForwardingRollouts by phase (on the leader)",
            m.rollouts.clone(),
        );
        registry.register(
            "rollout_nodes",
            "Nodes of the ForwardingRollouts still running, by node phase (on the leader)",
            m.rollout_nodes.clone(),
        );
        registry.register(
            "rollout_steps",
            "Steps of ForwardingRollouts, by the reason of their Event (GateFailed counts failed gates)",
            m.rollout_steps.clone(),
        );
        registry.register(
            "rollout_writes",
            "ForwardingRollout status and Node backend label writes, by outcome",
            m.rollout_writes.clone(),
        );
        registry.register(
            "rollout_events",
            "Events about ForwardingRollouts, by outcome",
            m.rollout_events.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Counts one of `family` for `kind`.
    pub fn count(family: &Family<KindLabel, Counter>, kind: &str) {
        family.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Liveness and readiness, shared with the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    heartbeat: AtomicU64,
}

/// The run loop must beat at least this often to count as alive.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Health {
    /// The run loop is alive.
    pub fn beat(&self) {
        self.heartbeat.store(unix_now(), Ordering::Relaxed);
    }

    /// The initial sync and first planning are done.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The initial sync and first planning are done.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn alive(&self) -> bool {
        unix_now().saturating_sub(self.heartbeat.load(Ordering::Relaxed)) < HEARTBEAT_TIMEOUT.as_secs()
    }
}

/// What the controller answers on `--metrics-bind`.
pub struct ControllerEndpoints {
    /// The registry behind `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The run loop's heartbeat and readiness.
    pub health: Arc<Health>,
}

impl Endpoints for ControllerEndpoints {
    fn healthz(&self) -> Probe {
        if self.health.alive() {
            Probe::text(true, "ok\n")
        } else {
            Probe::text(false, "run loop stalled\n")
        }
    }

    fn readyz(&self) -> Probe {
        if self.health.is_ready() {
            Probe::text(true, "ready\n")
        } else {
            Probe::text(false, "initial sync not done\n")
        }
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_prefix() {
        let metrics = Metrics::default();
        metrics.plans_written.inc();
        metrics
            .skipped_objects
            .get_or_create(&KindLabel {
                kind: "Service".into(),
            })
            .inc();
        let text = metrics.render();
        assert!(
            text.contains("switchyard_controller_plans_written_total 1"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_controller_skipped_objects_total{kind=\"Service\"} 1"),
            "{text}"
        );
        assert!(text.contains("switchyard_controller_network_programming_duration_seconds"));
        Metrics::count(&metrics.undecodable_objects, "Service");
        Metrics::count(&metrics.watch_errors, "Node");
        let text = metrics.render();
        for line in [
            "switchyard_controller_undecodable_objects_total{kind=\"Service\"} 1",
            "switchyard_controller_watch_errors_total{kind=\"Node\"} 1",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn health_follows_heartbeat_and_readiness() {
        let health = Health::default();
        assert!(!health.alive());
        health.beat();
        assert!(health.alive());
        assert!(!health.ready.load(Ordering::Relaxed));
        health.set_ready();
        assert!(health.ready.load(Ordering::Relaxed));
    }
}
