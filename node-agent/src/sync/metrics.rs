//! Counters and gauges of the sync loop, shared with the (later) `/metrics` server.
//!
//! ```text
//! Syncer ─► SyncMetrics (Arc'd atomics, Clone) ─► register(&mut Registry) ─► /metrics (issue 5)
//! ```
//!
//! Names follow kube-proxy's where they mean the same (`sync_proxy_rules_duration_seconds` becomes
//! `switchyard_agent_sync_duration_seconds{mode="full|partial"}`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use switchyard_api::{IpFamily, SyncMode};

/// `mode="full"` or `mode="partial"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `full` or `partial`.
    pub mode: String,
}

impl ModeLabel {
    /// The label of a sync mode.
    pub fn of(mode: SyncMode) -> Self {
        let mode = match mode {
            SyncMode::Full => "full",
            SyncMode::Partial => "partial",
        };
        Self { mode: mode.into() }
    }
}

/// `mode` and `ip_family` (`IPv4` | `IPv6`) of a sync's duration, as kube-proxy labels its per-family
/// proxiers' series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeFamilyLabel {
    /// `full` or `partial`.
    pub mode: String,
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

impl ModeFamilyLabel {
    /// The label of a sync mode and family.
    pub fn of(mode: SyncMode, family: IpFamily) -> Self {
        Self {
            mode: ModeLabel::of(mode).mode,
            ip_family: format!("{family:?}"),
        }
    }
}

/// `traffic_policy` (`internal` | `external`) and `ip_family`: kube-proxy's
/// `sync_proxy_rules_no_local_endpoints_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyFamilyLabel {
    /// `internal` (internalTrafficPolicy Local) or `external` (externalTrafficPolicy Local).
    pub traffic_policy: String,
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

/// `reason="endpoint-removed"` or `reason="udp-stale"`: why conntrack entries were cleared.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`CLEARED_ENDPOINT_REMOVED`] or [`CLEARED_UDP_STALE`].
    pub reason: String,
}

/// Flows of an endpoint that left its Service (any protocol).
pub const CLEARED_ENDPOINT_REMOVED: &str = "endpoint-removed";
/// kube-proxy's stale UDP entries: a UDP frontend's flow not answered by a current endpoint.
pub const CLEARED_UDP_STALE: &str = "udp-stale";

/// `kind="iptables_restore"` and the like: what failed (the error's metric label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// [`crate::error::Error::metric_label`].
    pub kind: String,
}

/// kube-proxy's no-local-endpoints counts of the entries applied (indexes in `skip` left out): per
/// family, (internal, external) — Service ports whose internal (external) traffic policy is Local, that
/// have endpoints, and none of them on this node. Every family of `families` is listed, at 0 if need be.
pub fn no_local_endpoints(
    spec: &switchyard_api::NodeForwardingPlanSpec,
    skip: &std::collections::HashSet<usize>,
    families: impl IntoIterator<Item = IpFamily>,
) -> std::collections::BTreeMap<IpFamily, (i64, i64)> {
    use switchyard_api::TrafficPolicy::Local;
    let mut counts: std::collections::BTreeMap<IpFamily, (i64, i64)> =
        families.into_iter().map(|f| (f, (0, 0))).collect();
    for (_, entry) in spec
        .services
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
    {
        if !entry.has_endpoints || entry.local_endpoints().next().is_some() {
            continue;
        }
        let count = counts.entry(entry.family).or_default();
        if entry.internal_policy == Local {
            count.0 += 1;
        }
        if entry.external_policy == Local && entry.externally_accessible() {
            count.1 += 1;
        }
    }
    counts
}

fn duration_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Everything the sync loop counts. Clones share the same values.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    /// Sync durations by mode and family: one sync programs every family of the plan together, so
    /// a dual-stack sync is observed once under each.
    pub sync_duration: Family<ModeFamilyLabel, Histogram>,
    /// Service ports whose Local traffic policy has no endpoint on this node while the Service has
    /// endpoints elsewhere (their traffic of that kind is dropped here), by policy and family, as of
    /// the last sync: kube-proxy's `sync_proxy_rules_no_local_endpoints_total` (a gauge despite the
    /// name).
    pub no_local_endpoints: Family<PolicyFamilyLabel, Gauge>,
    /// Successful syncs by mode.
    pub syncs: Family<ModeLabel, Counter>,
    /// Syncs the kernel refused (restore or jump-rule failures).
    pub sync_failures: Counter,
    /// The same failures by what failed (`iptables_restore`, `nft_transaction`, `ipvs_request`, ...).
    pub restore_failures: Family<KindLabel, Counter>,
    /// Drift found and repaired.
    pub drift_repairs: Counter,
    /// Drift checks run.
    pub drift_checks: Counter,
    /// Plans rejected whole (invalid, unreadable, truncated) or not applied (views' slices incomplete).
    pub rejected_plans: Counter,
    /// Rules programmed after the last successful sync.
    pub rules: Gauge,
    /// Entries programmed.
    pub services: Gauge,
    /// Endpoints programmed.
    pub endpoints: Gauge,
    /// Entries skipped because they failed validation.
    pub skipped_entries: Gauge,
    /// Unix time of the last successful sync.
    pub last_sync_timestamp_seconds: Gauge<f64, AtomicU64>,
    /// Stale UDP conntrack entries deleted.
    pub conntrack_deleted: Counter,
    /// Conntrack entries cleared, by reason (the stale UDP ones are also in `conntrack_deleted`).
    pub conntrack_cleared: Family<ReasonLabel, Counter>,
    /// Conntrack cleanups that failed.
    pub conntrack_failures: Counter,
    /// Conntrack sysctls that could not be read or set (`crate::conntrack::settings`).
    pub conntrack_sysctl_failures: Counter,
    /// Backend switches refused by the switch gate (once per refused target, however many syncs it
    /// stays refused).
    pub backend_switches_refused: Counter,
}

impl Default for SyncMetrics {
    fn default() -> Self {
        Self {
            sync_duration: Family::new_with_constructor(duration_histogram),
            syncs: Family::default(),
            no_local_endpoints: Family::default(),
            sync_failures: Counter::default(),
            restore_failures: {
                // Exported at 0 from the start, so alerts can use rate() on a known series.
                let family = Family::<KindLabel, Counter>::default();
                for kind in [
                    "iptables_restore",
                    "nft_transaction",
                    "ipvs_request",
                    "command_failed",
                ] {
                    let _ = family.get_or_create(&KindLabel { kind: kind.into() });
                }
                family
            },
            drift_repairs: Counter::default(),
            drift_checks: Counter::default(),
            rejected_plans: Counter::default(),
            rules: Gauge::default(),
            services: Gauge::default(),
            endpoints: Gauge::default(),
            skipped_entries: Gauge::default(),
            last_sync_timestamp_seconds: Gauge::default(),
            conntrack_deleted: Counter::default(),
            conntrack_cleared: {
                let family = Family::<ReasonLabel, Counter>::default();
                for reason in [CLEARED_ENDPOINT_REMOVED, CLEARED_UDP_STALE] {
                    let _ = family.get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    });
                }
                family
            },
            conntrack_failures: Counter::default(),
            conntrack_sysctl_failures: Counter::default(),
            backend_switches_refused: Counter::default(),
        }
    }
}

impl SyncMetrics {
    /// Adds every metric to `registry` (prefix `switchyard_agent_` expected on the registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sync_duration_seconds",
            "Sync durations",
            self.sync_duration.clone(),
        );
        registry.register("syncs", "Successful syncs", self.syncs.clone());
        registry.register(
            "no_local_endpoints",
            "Service ports with a Local traffic policy and no endpoint on this node (their traffic of that \
             kind is dropped here), by traffic_policy (internal, external) and ip_family",
            self.no_local_endpoints.clone(),
        );
        registry.register(
            "sync_failures",
            "Syncs the kernel refused",
            self.sync_failures.clone(),
        );
        registry.register(
            "restore_failures",
            "Kernel transactions refused, by what failed",
            self.restore_failures.clone(),
        );
        registry.register(
            "drift_repairs",
            "Drift found and repaired",
            self.drift_repairs.clone(),
        );
        registry.register("drift_checks", "Drift checks run", self.drift_checks.clone());
        registry.register("rejected_plans", "Plans not applied", self.rejected_plans.clone());
        registry.register("rules", "Rules programmed", self.rules.clone());
        registry.register("services", "Plan entries programmed", self.services.clone());
        registry.register("endpoints", "Endpoints programmed", self.endpoints.clone());
        registry.register(
            "skipped_entries",
            "Entries skipped as invalid",
            self.skipped_entries.clone(),
        );
        registry.register(
            "last_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            self.last_sync_timestamp_seconds.clone(),
        );
        registry.register(
            "conntrack_deleted_entries",
            "Stale UDP conntrack entries deleted",
            self.conntrack_deleted.clone(),
        );
        registry.register(
            "conntrack_flows_cleared",
            "Conntrack entries cleared, by reason: endpoint-removed (an endpoint left its Service), udp-stale (kube-proxy's UDP cleanup)",
            self.conntrack_cleared.clone(),
        );
        registry.register(
            "conntrack_cleanup_failures",
            "Conntrack cleanups that failed",
            self.conntrack_failures.clone(),
        );
        registry.register(
            "conntrack_sysctl_failures",
            "Conntrack sysctls (timeouts, table size) that could not be read or set",
            self.conntrack_sysctl_failures.clone(),
        );
        registry.register(
            "backend_switches_refused",
            "Backend switches refused before anything changed: the new backend's rules would forward some frontend differently",
            self.backend_switches_refused.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_local_endpoints_counts_as_kube_proxy() {
        use switchyard_api::TrafficPolicy::Local;
        use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};
        let mut itp = entry("ns/itp:p", "10.96.0.1", 80).with(ep("10.244.2.5", 80));
        itp.internal_policy = Local;
        let mut etp = entry("ns/etp:p", "10.96.0.2", 80)
            .node_port(30080)
            .with(ep("10.244.2.6", 80));
        etp.external_policy = Local;
        let mut served = entry("ns/served:p", "10.96.0.3", 80)
            .node_port(30081)
            .with(ep("10.244.1.7", 80).local());
        served.external_policy = Local;
        served.internal_policy = Local;
        let mut none = entry("ns/none:p", "10.96.0.4", 80);
        none.internal_policy = Local;
        none.has_endpoints = false;
        let spec = plan("node-a", vec![itp, etp, served, none]);
        let counts = no_local_endpoints(&spec, &Default::default(), [IpFamily::IPv4, IpFamily::IPv6]);
        assert_eq!(counts[&IpFamily::IPv4], (1, 1));
        assert_eq!(counts[&IpFamily::IPv6], (0, 0));
        let itp = spec.services.iter().position(|e| e.name == "ns/itp:p").unwrap();
        let skip = [itp].into_iter().collect();
        assert_eq!(no_local_endpoints(&spec, &skip, [])[&IpFamily::IPv4], (0, 1));
    }

    #[test]
    fn metrics_encode_with_mode_labels() {
        let metrics = SyncMetrics::default();
        metrics
            .sync_duration
            .get_or_create(&ModeFamilyLabel::of(SyncMode::Full, IpFamily::IPv4))
            .observe(0.5);
        metrics
            .syncs
            .get_or_create(&ModeLabel::of(SyncMode::Partial))
            .inc();
        metrics.rules.set(42);
        let mut registry = Registry::with_prefix("switchyard_agent");
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("switchyard_agent_sync_duration_seconds_count{mode=\"full\",ip_family=\"IPv4\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_agent_syncs_total{mode=\"partial\"} 1"),
            "{text}"
        );
        assert!(text.contains("switchyard_agent_rules 42"), "{text}");
        assert!(
            text.contains("switchyard_agent_conntrack_flows_cleared_total{reason=\"endpoint-removed\"} 0"),
            "{text}"
        );
    }
}
