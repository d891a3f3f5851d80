//! The rollouts' only contact with the API server: their three watches in, and the two writes out
//! ([`KubeWrites`]); and the loop that ticks the [`Driver`] on the leader.
//!
//! ```text
//! watch ForwardingRollouts, Nodes, plans (managed-by) ─► Input ─► Observed::observe ─► dirty
//! every TICK: leading? ── no ─► forget what this replica wrote; gauges cleared
//!             └ yes, every watch listed, dirty or a second passed ─► Driver::tick ─► EventQueue
//! EventQueue ─(rate limit)─► the controller's Event publisher
//! KubeWrites::status ─► PATCH …/forwardingrollouts/<name>/status?fieldManager=switchyard-controller&force=true
//! KubeWrites::label  ─► PATCH /api/v1/nodes/<node>?fieldManager=switchyard-rollout&force=true
//!                        {metadata: {name, labels: {switchyard.io/backend: value}}} (no labels: removed)
//! each write: bounded by the API timeout, abandoned the moment this replica stops leading
//! ```
//!
//! A Node label written by server-side apply with our own field manager changes that label only: the
//! other labels are other managers' and stay. Removing ours (a revert to "no label") is applying
//! without it, which the API server turns into its removal since no other manager owns it (a forced
//! apply took it over from whoever set it before).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use serde_json::json;
use switchyard_api::ForwardingRollout;
use switchyard_api::names::{CONTROLLER_FIELD_MANAGER, LABEL_MANAGED_BY, MANAGED_BY, ROLLOUT_FIELD_MANAGER};
use switchyard_api::rollout::ForwardingRolloutStatus;
use tokio::sync::{mpsc, watch};

use super::driver::{Driver, EventQueue, TICK, Writes, phases};
use super::observed::{Input, Observed};
use super::trim::Delivered;
use crate::Error;
use crate::live::events::Pending;
use crate::live::metrics::Metrics;
use crate::live::reconcile::while_leading;
use crate::live::watch::spawn;

/// Watched changes waiting for the loop at most (the watches wait while it is full).
const INPUT_QUEUE: usize = 1024;

/// The writes, to the API server.
pub struct KubeWrites {
    rollouts: Api<Delivered<ForwardingRollout>>,
    nodes: Api<Delivered<Node>>,
    label_key: String,
    timeout: Duration,
    leader: watch::Receiver<bool>,
}

impl KubeWrites {
    /// Writes through `client`, each bounded by `timeout` and only while `leader` says so.
    pub fn new(client: Client, label_key: String, timeout: Duration, leader: watch::Receiver<bool>) -> Self {
        Self {
            rollouts: Api::all(client.clone()),
            nodes: Api::all(client),
            label_key,
            timeout,
            leader,
        }
    }

    /// Runs one API call for at most the timeout, while this replica leads.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, Error> {
        while_leading(
            self.leader.clone(),
            switchyard_process::bounded(self.timeout, call),
        )
        .await
        .ok_or(Error::NotLeader)
    }
}

/// The body of a status write: the status alone, under our field manager.
pub fn status_patch(name: &str, status: &ForwardingRolloutStatus) -> serde_json::Value {
    let dt = ();
    json!({
        "apiVersion": ForwardingRollout::api_version(&dt),
        "kind": ForwardingRollout::kind(&dt),
        "metadata": {"name": name},
        "status": status,
    })
}

/// The body of a label write: the one label, or none (which removes ours).
pub fn label_patch(node: &str, key: &str, value: Option<&str>) -> serde_json::Value {
    let mut metadata = json!({"name": node});
    if let Some(value) = value {
        metadata["labels"] = json!({key: value});
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata})
}

impl Writes for KubeWrites {
    async fn status(&self, name: &str, status: &ForwardingRolloutStatus) -> Result<Option<String>, Error> {
        let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
        let patch = status_patch(name, status);
        let written = self
            .bounded(self.rollouts.patch_status(name, &params, &Patch::Apply(&patch)))
            .await?
            .map_err(|source| Error::RolloutStatus {
                name: name.to_owned(),
                source,
            })?;
        Ok(written.meta().resource_version.clone())
    }

    async fn label(&self, node: &str, value: Option<&str>) -> Result<Option<String>, Error> {
        let params = PatchParams::apply(ROLLOUT_FIELD_MANAGER).force();
        let patch = label_patch(node, &self.label_key, value);
        let written = self
            .bounded(self.nodes.patch(node, &params, &Patch::Apply(&patch)))
            .await?
            .map_err(|source| Error::NodeLabel {
                node: node.to_owned(),
                key: self.label_key.clone(),
                source,
            })?;
        Ok(written.meta().resource_version.clone())
    }
}

/// What the rollouts' loop needs from the controller.
pub struct Context {
    /// The API server.
    pub client: Client,
    /// The Node label that decides a node's backend (`backendNodeLabel`).
    pub label_key: String,
    /// Longest wait for one write.
    pub api_timeout: Duration,
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The controller's Event publisher.
    pub events: mpsc::Sender<Pending>,
}

/// Watches and steps the rollouts until `stop` says so (or its sender is gone).
pub async fn run(ctx: Context, mut stop: watch::Receiver<bool>) {
    let (tx, mut rx) = mpsc::channel(INPUT_QUEUE);
    let all = watcher::Config::default;
    let client = &ctx.client;
    let m = || Arc::clone(&ctx.metrics);
    spawn(client, all(), Input::Rollout, None, tx.clone(), m());
    spawn(client, all(), Input::Node, None, tx.clone(), m());
    let ours = all().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    spawn(client, ours, Input::Plan, None, tx, m());

    let writes = KubeWrites::new(
        ctx.client.clone(),
        ctx.label_key.clone(),
        ctx.api_timeout,
        ctx.leader.clone(),
    );
    let mut observed = Observed::new(ctx.label_key.clone());
    let mut driver = Driver::default();
    let mut queue = EventQueue::new(tokio::time::Instant::now());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = true;
    let mut last_tick: Option<tokio::time::Instant> = None;
    let mut leading = false;
    loop {
        tokio::select! {
            Some(input) = rx.recv() => {
                dirty |= observed.observe(input);
                for broken in observed.take_broken() {
                    tracing::warn!(
                        kind = %broken.kind,
                        object = %broken.object(),
                        field = %broken.path,
                        reason = %broken.message,
                        "cannot decode this object; its last good version (if any) stays in use"
                    );
                    Metrics::count(&ctx.metrics.undecodable_objects, &broken.kind);
                }
            }
            _ = tick.tick() => {
                let now = tokio::time::Instant::now();
                if !*ctx.leader.borrow() {
                    if leading {
                        tracing::info!("no longer leading: rollouts are the next leader's");
                        observed.forget_writes();
                        driver = Driver::default();
                        phases(&ctx.metrics, &[]);
                    }
                    leading = false;
                    continue;
                }
                if !leading {
                    tracing::info!("leading: stepping rollouts from their status");
                    leading = true;
                }
                let due = dirty || last_tick.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
                if due && observed.synced() {
                    dirty = false;
                    last_tick = Some(now);
                    let events = driver.tick(&mut observed, &writes, Timestamp::now(), &ctx.metrics).await;
                    queue.extend(events, &ctx.metrics);
                }
                queue.send(tokio::time::Instant::now(), &ctx.events, &ctx.metrics);
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}
