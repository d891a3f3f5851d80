//! Writes the agent's status into its plan: server-side apply to the status subresource of the
//! primary object, coalesced and retried.
//!
//! ```text
//! run loop ─► StatusSink (watch: latest StatusReport wins) ─► writer task:
//!   wait for a new report ─► at most one write per min interval ─► same as last written? skip
//!   ─► PATCH /apis/switchyard.io/v1alpha1/nodeforwardingplans/<node>/status
//!          ?fieldManager=switchyard-agent&force=true   (application/apply-patch+yaml;
//!          body: apiVersion, kind, metadata.name, status — nothing else)
//!   ok ─► remembered      404 ─► the plan is gone: wait for the next report (a new plan's uid)
//!   other error ─► failures += 1, retry the latest report after 1 s, 2 s, … 30 s (never a tight loop)
//! ```
//!
//! The report carries the primary's uid, so a plan deleted and created again gets its status written
//! even when the status itself did not change.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;
use switchyard_api::names::AGENT_FIELD_MANAGER;
use switchyard_api::{NodeForwardingPlan, NodeForwardingPlanStatus};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;
use crate::run::metrics::LiveMetrics;
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
    /// First retry delay after a failed write.
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
        }
    }
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

/// Writes one status.
pub async fn write_status(
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

/// Longest wait for one API call: kube's client has no read timeout (a global one would cut the
/// watch), and a hung status write would otherwise stop status reporting for good.
pub const API_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Runs one API call for at most [`API_CALL_TIMEOUT`]; a timeout is an error like any other.
pub async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(API_CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
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
        last_attempt = Some(Instant::now());
        match write_status(&api, &name, &report.status).await {
            Ok(()) => {
                if failing {
                    tracing::info!(plan = %name, "status written again");
                    failing = false;
                }
                backoff.reset();
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
