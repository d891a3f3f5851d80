//! Writing one object (a ForwardingSlice or a node's plan): `reconcile(ticket, ctx) -> Result<Done>` and
//! `error_policy`, kube-runtime's shape, driven by the engine's queue of tickets instead of a watch on
//! the object; neither touches the engine (the writer hands the result back: [`super::ticket`]).
//!
//! ```text
//! ticket.work ─► Apply: leader? ─► write budget ─► PATCH …/<plural>/<name>?fieldManager=switchyard-controller&force=true
//!             └─► Delete (a slice no longer wanted) ─► DELETE
//!        ─► metrics (written, unchanged, bytes, network programming latency)
//! error ─► error_policy ─► requeue after 0.5 s · 2^failures (capped at 5 min, at least a 429's
//!          retryAfterSeconds): never a tight loop
//! every API call here is bounded by Context::api_timeout (kube's client has no read timeout)
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
use serde::Serialize;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, names::CONTROLLER_FIELD_MANAGER};
use tokio::sync::watch;

use super::{
    budget::WriteBudget,
    engine::{Engine, Work},
    metrics::Metrics,
    object::ObjectRef,
    ticket::{Done, Ticket},
    trim::Delivered,
};
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
/// Default longest wait for one API call outside the watches (the same bound as the agent's).
pub use switchyard_process::bounded::API_CALL_TIMEOUT;

/// Everything a reconcile needs.
pub struct Context {
    /// The decision state.
    pub engine: Arc<Mutex<Engine>>,
    /// Plan objects.
    pub plans: Api<NodeForwardingPlan>,
    /// ForwardingSlices.
    pub slices: Api<ForwardingSlice>,
    /// Nodes (to confirm deletions; decoded tolerantly: only found or not matters).
    pub nodes: Api<Delivered<Node>>,
    /// The global write budget.
    pub budget: WriteBudget,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
    /// Longest wait for one API call.
    pub api_timeout: Duration,
    failures: Mutex<HashMap<ObjectRef, u32>>,
}

impl Context {
    /// A context.
    pub fn new(
        engine: Arc<Mutex<Engine>>,
        client: kube::Client,
        budget: WriteBudget,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
        api_timeout: Duration,
    ) -> Self {
        Self {
            engine,
            plans: Api::all(client.clone()),
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            budget,
            metrics,
            leader,
            api_timeout,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Runs one API call for at most `api_timeout`. kube's client has no read timeout (a global one
    /// would cut the watches), so without this a hung call would stall its caller for good.
    pub async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        switchyard_process::bounded(self.api_timeout, call).await
    }
}

impl Context {
    /// Like [`Self::bounded`], but abandons the call the moment this replica stops leading (`None`):
    /// a write still waiting then must not land after another replica may have taken the lease over.
    pub async fn bounded_while_leader<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Option<Result<T, kube::Error>> {
        while_leading(self.leader.clone(), self.bounded(call)).await
    }
}

/// Runs `call` while `leader` says this replica leads; `None` as soon as it stops.
pub async fn while_leading<T>(
    mut leader: watch::Receiver<bool>,
    call: impl std::future::Future<Output = T>,
) -> Option<T> {
    let lost = async move {
        // Without a sender (no leader election running) the flag is final: never lost.
        if leader.wait_for(|leading| !*leading).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        // Losing wins a tie: a call must not start once this replica no longer leads.
        biased;
        () = lost => None,
        result = call => Some(result),
    }
}

/// Does one ticket's write, without calling back into the engine: the writer hands the ticket back
/// with the result ([`super::ticket`]). Its log lines carry the object (`NodeForwardingPlan <node>` or
/// `ForwardingSlice <name>`).
#[tracing::instrument(skip_all, fields(object = %ticket.object))]
pub async fn reconcile(ticket: &Ticket, ctx: &Context) -> Result<Done, Error> {
    let object = &ticket.object;
    let done = match &ticket.work {
        None => {
            let unchanged = match object {
                ObjectRef::Plan(_) => &ctx.metrics.plans_unchanged,
                ObjectRef::Slice(_) => &ctx.metrics.slices_unchanged,
            };
            unchanged.inc();
            Done::Unchanged
        }
        Some(Work::ApplyPlan(plan)) => {
            let resource_version = apply(object, &plan.spec.revision, &ctx.plans, plan, ctx).await?;
            Done::Applied { resource_version }
        }
        Some(Work::ApplySlice(slice)) => {
            let resource_version = apply(object, &slice.spec.revision, &ctx.slices, slice, ctx).await?;
            Done::Applied { resource_version }
        }
        Some(Work::DeleteSlice(name)) => {
            if !ctx.is_leader() {
                return Err(Error::NotLeader);
            }
            // A delete is a write for the API server too: it spends the same budget.
            if ctx.budget.acquire().await {
                ctx.metrics.throttled_writes.inc();
            }
            if !ctx.is_leader() {
                return Err(Error::NotLeader);
            }
            match ctx
                .bounded_while_leader(ctx.slices.delete(name, &DeleteParams::default()))
                .await
                .ok_or(Error::NotLeader)?
            {
                Ok(_) => ctx.metrics.slices_deleted.inc(),
                Err(kube::Error::Api(e)) if e.code == 404 => 0,
                Err(source) => {
                    return Err(Error::Delete {
                        kind: object.kind(),
                        name: name.clone(),
                        source,
                    });
                }
            };
            tracing::info!(slice = %name, "deleted a slice no longer needed");
            Done::Deleted
        }
    };
    if let (Some(trigger), Done::Applied { .. }) = (ticket.trigger, &done) {
        let latency = Timestamp::now().duration_since(trigger).as_secs_f64();
        if latency >= 0.0 {
            ctx.metrics.network_programming.observe(latency);
        }
    }
    if let Ok(mut failures) = ctx.failures.lock() {
        failures.remove(object);
    }
    Ok(done)
}

/// Server-side applies one object (spec only, our field manager, forced) under the write budget.
/// Returns the resourceVersion the API server gave it.
async fn apply<K>(
    object: &ObjectRef,
    revision: &str,
    api: &Api<K>,
    body: &K,
    ctx: &Context,
) -> Result<Option<String>, Error>
where
    K: kube::Resource + Clone + Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if !ctx.is_leader() {
        return Err(Error::NotLeader);
    }
    if ctx.budget.acquire().await {
        ctx.metrics.throttled_writes.inc();
    }
    if !ctx.is_leader() {
        return Err(Error::NotLeader);
    }
    let name = object.name().to_string();
    let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
    let written = ctx
        .bounded_while_leader(api.patch(&name, &params, &Patch::Apply(body)))
        .await
        .ok_or(Error::NotLeader)?
        .map_err(|source| Error::Apply {
            kind: object.kind(),
            name: name.clone(),
            source,
        })?;
    let bytes = serde_json::to_vec(body).map_or(0, |v| v.len()) as u64;
    let (count, total) = match object {
        ObjectRef::Plan(_) => (&ctx.metrics.plans_written, &ctx.metrics.bytes_written),
        ObjectRef::Slice(_) => (&ctx.metrics.slices_written, &ctx.metrics.slice_bytes_written),
    };
    count.inc();
    total.inc_by(bytes);
    tracing::debug!(%object, revision, bytes, "written");
    Ok(written.meta().resource_version.clone())
}

/// What to do after a failed reconcile: back off exponentially per object.
pub fn error_policy(object: &ObjectRef, error: &Error, ctx: &Context) -> Action {
    if matches!(error, Error::NotLeader) {
        // Not a failure of this node: the new leader writes it.
        return Action::AwaitChange;
    }
    ctx.metrics.write_failures.inc();
    let failures = match ctx.failures.lock() {
        Ok(mut failures) => {
            let n = failures.entry(object.clone()).or_insert(0);
            *n += 1;
            *n
        }
        Err(_) => 1,
    };
    // The API server's retryAfterSeconds (sent with a 429) is a floor: retrying sooner only adds load.
    let delay = backoff(failures).max(retry_after(error).unwrap_or_default());
    tracing::warn!(%object, %error, failures, retry_in = ?delay, "writing failed");
    Action::Requeue(delay)
}

/// How long a 429 asked us to wait. kube's error does not carry the `Retry-After` header, but the
/// API server puts the same value in the Status body's `details.retryAfterSeconds`.
pub fn retry_after(error: &Error) -> Option<Duration> {
    let source = match error {
        Error::Apply { source, .. } | Error::Delete { source, .. } | Error::GetNode { source, .. } => source,
        _ => return None,
    };
    match source {
        kube::Error::Api(status) if status.code == 429 => {
            let seconds = status.details.as_ref()?.retry_after_seconds;
            (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)).min(BACKOFF_MAX))
        }
        _ => None,
    }
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
        match ctx.bounded(ctx.nodes.get_opt(&node)).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(source) => return Err(Error::GetNode { name: node, source }),
        }
        for name in names {
            if !ctx.is_leader() {
                return Err(Error::NotLeader);
            }
            match ctx
                .bounded(ctx.plans.delete(&name, &DeleteParams::default()))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    return Err(Error::Delete {
                        kind: "NodeForwardingPlan",
                        name,
                        source,
                    });
                }
            }
            tracing::info!(plan = %name, %node, "deleted the plan of a node that no longer exists");
            ctx.metrics.plans_deleted.inc();
            if let Ok(mut engine) = ctx.engine.lock() {
                engine.deleted(&ObjectRef::Plan(name.clone()));
            }
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_is_abandoned_when_leadership_is_lost() {
        let (tx, rx) = watch::channel(true);
        let lose = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send_replace(false);
        };
        let (outcome, ()) = tokio::join!(while_leading(rx, std::future::pending::<()>()), lose);
        assert_eq!(outcome, None);

        let (tx, rx) = watch::channel(false);
        drop(tx);
        assert_eq!(
            while_leading(rx, async { 7 }).await,
            None,
            "not leading: never started"
        );

        let (tx, rx) = watch::channel(true);
        drop(tx);
        assert_eq!(
            while_leading(rx, async { 7 }).await,
            Some(7),
            "a final true flag (no election) never stops a call"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }

    fn apply_error(status: serde_json::Value) -> Error {
        Error::Apply {
            kind: "NodeForwardingPlan",
            name: "node-a".into(),
            source: kube::Error::Api(Box::new(serde_json::from_value(status).unwrap())),
        }
    }

    #[test]
    fn a_429_retry_after_is_honoured_as_the_minimum_delay() {
        // As the API server sends it (priority and fairness): the header's value is also in the body.
        let throttled = apply_error(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
            "reason": "TooManyRequests", "message": "too many requests",
            "details": {"retryAfterSeconds": 7},
        }));
        assert_eq!(retry_after(&throttled), Some(Duration::from_secs(7)));
        let plain = apply_error(serde_json::json!({"code": 429, "reason": "TooManyRequests"}));
        assert_eq!(retry_after(&plain), None);
        let other = apply_error(serde_json::json!({"code": 500, "details": {"retryAfterSeconds": 7}}));
        assert_eq!(retry_after(&other), None);
        assert_eq!(retry_after(&Error::NotLeader), None);
    }
}
