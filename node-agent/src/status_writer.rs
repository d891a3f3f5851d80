//! Writes the agent's status into its plan: server-side apply to the status subresource of the
//! primary object, coalesced and retried.
//!
//! ```text
//! run loop ─► StatusSink (watch: latest StatusReport wins) ─► writer task:
//!   wait for a new report ─► at most one write per min interval ─► same as last written? skip
//!   ─► only progress changed (slices digest, sync time, counts)? at most one write per progress interval
//!   ─► PATCH /apis/switchyard.io/v1alpha2/nodeforwardingplans/<node>/status
//!          ?fieldManager=switchyard-agent&force=true   (application/apply-patch+yaml;
//!          body: apiVersion, kind, metadata.name, status — nothing else)
//!   ok ─► remembered      404 ─► the plan is gone: wait for the next report (a new plan's uid)
//!   other error ─► failures += 1, retry the latest report after 1 s, 2 s, … 30 s (never a tight loop)
//! ```
//!
//! The report carries the plan's uid, so a plan deleted and created again gets its status written even
//! when the status itself did not change.
//!
//! Why a progress interval: with shared ForwardingSlices one endpoint change reaches every node of a
//! view, and each agent syncs. Writing every sync's status would turn one slice write into one status
//! write per node (1,000 writes at 1,000 nodes); a report that changes only what moves on every sync
//! waits up to the progress interval (default 1 minute: 5,000 nodes write at most ~83 statuses/s however
//! fast slices change), while a new plan revision, a condition, a failure
//! or a drift repair is written at once.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;
use switchyard_api::names::AGENT_FIELD_MANAGER;
use switchyard_api::{NodeForwardingPlan, NodeForwardingPlanStatus};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;
use crate::metrics::LiveMetrics;
use crate::sync::backoff::Backoff;

/// What the loop wants written.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusReport {
    /// The primary object's uid when known.
    pub uid: Option<String>,
    /// The status.
    pub status: NodeForwardingPlanStatus,
}

/// The loop's end of the writer.
pub type StatusSink = watch::Sender<Option<StatusReport>>;

/// How the writer paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// At most one write this often.
    pub min_interval: Duration,
    /// A report that changes only progress (slices applied, sync time and duration, counts) is
    /// written at most this often.
    pub progress_interval: Duration,
    /// First retry delay after a failed write.
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            progress_interval: Duration::from_secs(60),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// True when `next` differs from `written` only in what moves on every sync: which slices were
/// applied, the sync's time, duration and mode, and the counts (and when refusals were last counted).
pub fn only_progress(written: &StatusReport, next: &StatusReport) -> bool {
    let strip = |report: &StatusReport| {
        let mut status = report.status.clone();
        status.observed_slices = None;
        status.last_sync_time = None;
        status.last_sync_duration_ms = None;
        status.last_sync_mode = None;
        status.services = None;
        status.endpoints = None;
        status.rules = None;
        // Refusals are counted every few seconds after a verification: a count that found nothing new
        // is progress, a new unexpected refusal is not.
        if let Some(refused) = status.verification.as_mut().and_then(|v| v.refused.as_mut()) {
            refused.checked_at.clear();
        }
        (report.uid.clone(), status)
    };
    strip(written) == strip(next)
}

/// The server-side apply body: only the status.
pub fn apply_body(name: &str, status: &NodeForwardingPlanStatus) -> serde_json::Value {
    json!({
        "apiVersion": NodeForwardingPlan::api_version(&()),
        "kind": NodeForwardingPlan::kind(&()),
        "metadata": {"name": name},
        "status": status,
    })
}

/// Writes one status to the API server: a server-side apply of [`apply_body`] to the status subresource.
pub async fn apply_status(
    api: &Api<NodeForwardingPlan>,
    name: &str,
    status: &NodeForwardingPlanStatus,
) -> Result<(), Error> {
    let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
    let body = apply_body(name, status);
    bounded(api.patch_status(name, &params, &Patch::Apply(body)))
        .await
        .map(|_| ())
        .map_err(|source| Error::WriteStatusToApi {
            name: name.to_string(),
            source: Box::new(source),
        })
}

/// One API call for at most the agent's bound: a hung status write would otherwise stop status
/// reporting for good.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    switchyard_process::bounded(switchyard_process::bounded::API_CALL_TIMEOUT, call).await
}

/// Starts the writer for plan `name`; it stops when the sink is dropped.
pub fn spawn(
    api: Api<NodeForwardingPlan>,
    name: String,
    config: WriterConfig,
    metrics: LiveMetrics,
) -> (StatusSink, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(write_loop(api, name, config, metrics, rx));
    (tx, task)
}

async fn write_loop(
    api: Api<NodeForwardingPlan>,
    name: String,
    config: WriterConfig,
    metrics: LiveMetrics,
    mut rx: watch::Receiver<Option<StatusReport>>,
) {
    let mut written: Option<StatusReport> = None;
    let mut last_attempt: Option<Instant> = None;
    let mut last_write: Option<Instant> = None;
    let mut backoff = Backoff::new(config.retry_min, config.retry_max);
    let mut retry = false;
    let mut failing = false;
    loop {
        if !retry && rx.changed().await.is_err() {
            return;
        }
        retry = false;
        if let Some(at) = last_attempt {
            // Coalesce: whatever arrives meanwhile replaces the report (latest wins).
            tokio::time::sleep_until(at + config.min_interval).await;
        }
        let Some(report) = rx.borrow_and_update().clone() else {
            continue;
        };
        if written.as_ref() == Some(&report) {
            continue;
        }
        if let (Some(done), Some(at)) = (&written, last_write)
            && only_progress(done, &report)
            && Instant::now() < at + config.progress_interval
        {
            // Hold progress back, unless something that matters more arrives meanwhile.
            tokio::select! {
                () = tokio::time::sleep_until(at + config.progress_interval) => {}
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            retry = true;
            continue;
        }
        last_attempt = Some(Instant::now());
        match apply_status(&api, &name, &report.status).await {
            Ok(()) => {
                if failing {
                    tracing::info!(plan = %name, "status written again");
                    failing = false;
                }
                backoff.reset();
                last_write = Some(Instant::now());
                metrics.status_writes.inc();
                tracing::debug!(plan = %name, revision = ?report.status.observed_revision, "status written");
                written = Some(report);
            }
            Err(Error::WriteStatusToApi { source, .. }) if matches!(source.as_ref(), kube::Error::Api(e) if e.code == 404) =>
            {
                metrics.status_write_failures.inc();
                tracing::info!(plan = %name, "cannot write status: the plan does not exist (yet)");
            }
            Err(error) => {
                metrics.status_write_failures.inc();
                let delay = backoff.next_delay();
                tracing::warn!(plan = %name, %error, retry_in_ms = delay.as_millis() as u64, "status write failed; will retry with the latest status");
                failing = true;
                tokio::time::sleep(delay).await;
                retry = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::Backend;
    use switchyard_api::verification::{KernelCheck, RefusedCheck, Verification};

    fn report(verification: Option<Verification>) -> StatusReport {
        StatusReport {
            uid: Some("u1".into()),
            status: NodeForwardingPlanStatus {
                verification,
                ..NodeForwardingPlanStatus::default()
            },
        }
    }

    fn verified(unexpected: Option<(u64, &str)>) -> Option<Verification> {
        Some(Verification {
            backend: Backend::Nftables,
            revision: "r1".into(),
            at: "2026-12-03T10:00:00Z".into(),
            kernel: KernelCheck::default(),
            probes: None,
            refused: unexpected.map(|(unexpected, at)| RefusedCheck {
                unexpected,
                examples: Vec::new(),
                checked_at: at.into(),
            }),
        })
    }

    #[test]
    fn a_verification_is_written_at_once_and_a_quiet_refusal_count_is_progress() {
        let cases = [
            ("first verification", report(None), report(verified(None)), false),
            (
                "first refusal count",
                report(verified(None)),
                report(verified(Some((0, "10:00:05")))),
                false,
            ),
            (
                "counted again, nothing new",
                report(verified(Some((0, "10:00:05")))),
                report(verified(Some((0, "10:00:10")))),
                true,
            ),
            (
                "an unexpected refusal",
                report(verified(Some((0, "10:00:10")))),
                report(verified(Some((2, "10:00:15")))),
                false,
            ),
        ];
        for (what, written, next, progress) in cases {
            assert_eq!(only_progress(&written, &next), progress, "{what}");
        }
    }
}
