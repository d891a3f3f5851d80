//! Writing one node's plan: `reconcile(node, ctx) -> Result<Action>` and `error_policy`, kube-runtime's
//! shape, driven by the engine's queue instead of a watch on the node itself.
//!
//! ```text
//! node ─► Engine::work_for ─► for each stale shard (others first, primary last):
//!            leader? ─► write budget ─► PATCH …/nodeforwardingplans/<name>?fieldManager=switchyard-controller&force=true
//!        ─► delete shards no longer needed ─► metrics (written, unchanged, bytes, network programming latency)
//! error ─► error_policy ─► requeue after 0.5 s · 2^failures (capped at 5 min): never a tight loop
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use switchyard_api::{NodeForwardingPlan, names::CONTROLLER_FIELD_MANAGER};
use tokio::sync::watch;

use super::{budget::WriteBudget, engine::Engine, metrics::Metrics};
use crate::Error;

/// What to do next with a node, after a reconcile or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until something changes.
    AwaitChange,
    /// Try again after this long.
    Requeue(Duration),
}

/// First retry delay after a failed write.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Everything a reconcile needs.
pub struct Context {
    /// The decision state.
    pub engine: Arc<Mutex<Engine>>,
    /// Plan objects.
    pub plans: Api<NodeForwardingPlan>,
    /// Nodes (to confirm deletions).
    pub nodes: Api<Node>,
    /// The global write budget.
    pub budget: WriteBudget,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// A context.
    pub fn new(
        engine: Arc<Mutex<Engine>>,
        client: kube::Client,
        budget: WriteBudget,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
    ) -> Self {
        Self {
            engine,
            plans: Api::all(client.clone()),
            nodes: Api::all(client),
            budget,
            metrics,
            leader,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }
}

/// Brings one node's plan objects up to date.
pub async fn reconcile(
    node: Arc<String>,
    trigger: Option<Timestamp>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let work = match ctx.engine.lock() {
        Ok(engine) => engine.work_for(&node, trigger),
        Err(_) => None,
    };
    let Some(work) = work else {
        return Ok(Action::AwaitChange);
    };
    let total = work.apply.len() as u64;
    let planned = ctx
        .engine
        .lock()
        .ok()
        .and_then(|e| e.shard_count(&node))
        .unwrap_or(0) as u64;
    for object in &work.apply {
        if !ctx.is_leader() {
            return Err(Error::NotLeader);
        }
        if ctx.budget.acquire().await {
            ctx.metrics.throttled_writes.inc();
        }
        if !ctx.is_leader() {
            return Err(Error::NotLeader);
        }
        let name = object.metadata.name.clone().unwrap_or_default();
        let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
        ctx.plans
            .patch(&name, &params, &Patch::Apply(object))
            .await
            .map_err(|source| Error::ApplyPlan {
                name: name.clone(),
                source,
            })?;
        let bytes = serde_json::to_vec(object).map_or(0, |v| v.len()) as u64;
        ctx.metrics.plans_written.inc();
        ctx.metrics.bytes_written.inc_by(bytes);
        if let Ok(mut engine) = ctx.engine.lock() {
            engine.written(&node, &name, &object.spec.revision);
        }
        tracing::debug!(plan = %name, revision = %object.spec.revision, bytes, "plan written");
    }
    ctx.metrics.plans_unchanged.inc_by(planned.saturating_sub(total));
    for name in &work.delete {
        if !ctx.is_leader() {
            return Err(Error::NotLeader);
        }
        match ctx.plans.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.metrics.plans_deleted.inc();
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(Error::DeletePlan {
                    name: name.clone(),
                    source,
                });
            }
        }
        if let Ok(mut engine) = ctx.engine.lock() {
            engine.deleted(name);
        }
        tracing::info!(plan = %name, "deleted a shard no longer needed");
    }
    if let (Some(trigger), true) = (work.trigger, total > 0) {
        let latency = Timestamp::now().duration_since(trigger).as_secs_f64();
        if latency >= 0.0 {
            ctx.metrics.network_programming.observe(latency);
        }
    }
    if let Ok(mut failures) = ctx.failures.lock() {
        failures.remove(node.as_str());
    }
    Ok(Action::AwaitChange)
}

/// What to do after a failed reconcile: back off exponentially per node.
pub fn error_policy(node: Arc<String>, error: &Error, ctx: Arc<Context>) -> Action {
    if matches!(error, Error::NotLeader) {
        // Not a failure of this node: the new leader writes it.
        return Action::AwaitChange;
    }
    ctx.metrics.write_failures.inc();
    let failures = match ctx.failures.lock() {
        Ok(mut failures) => {
            let n = failures.entry(node.to_string()).or_insert(0);
            *n += 1;
            *n
        }
        Err(_) => 1,
    };
    let delay = backoff(failures);
    tracing::warn!(%node, %error, failures, retry_in = ?delay, "writing the plan failed");
    Action::Requeue(delay)
}

/// 0.5 s · 2^(failures-1), capped at 5 min.
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(1 << exponent).min(BACKOFF_MAX)
}

/// Deletes the plans of nodes that are confirmed gone (GET answers 404). A relist that lost nodes, or an
/// API server answering errors, never deletes anything.
pub async fn sweep_orphans(ctx: &Context) -> Result<usize, Error> {
    let orphans = match ctx.engine.lock() {
        Ok(engine) => engine.orphans(),
        Err(_) => return Ok(0),
    };
    let mut deleted = 0;
    for (node, names) in orphans {
        match ctx.nodes.get_opt(&node).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(source) => return Err(Error::GetNode { name: node, source }),
        }
        for name in names {
            if !ctx.is_leader() {
                return Err(Error::NotLeader);
            }
            match ctx.plans.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => return Err(Error::DeletePlan { name, source }),
            }
            tracing::info!(plan = %name, %node, "deleted the plan of a node that no longer exists");
            ctx.metrics.plans_deleted.inc();
            if let Ok(mut engine) = ctx.engine.lock() {
                engine.deleted(&name);
            }
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }
}
