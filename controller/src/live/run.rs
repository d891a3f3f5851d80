//! The run loop: watches in, plans out, only while leading.
//!
//! ```text
//! watch channel ─► engine.observe ──► every minPlanInterval while dirty: engine.plan ─► writer notified
//!                      └► an object that does not decode (first seen so) ─► warning, undecodable_objects{kind}
//! every second: Service problems, undecodable objects ─► gauges; leader only: rate-limited Events
//! writer task (leader only): engine.next ─► Ticket (slices, then plans, then retired slices)
//!                            ─► reconcile (no engine calls) ─► engine.finish(ticket, Done)
//!                               (on error: stays queued, not before its backoff)
//! orphan sweep (leader only, periodic and on a Node delete event) ─► GET node 404 ─► delete its plans
//! rollouts task (rollouts::run: its own watches; leader only) ─► rollout status, Node labels, Events
//! shutdown ─► stop writing, release the lease
//! ```
//!
//! The loop's own API calls (confirming an empty relist, the orphan sweep) are bounded by
//! `Options::api_timeout`: while one waits, no watch event is taken in.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service, discovery::v1::EndpointSlice};
use kube::{Api, Client, api::ListParams, runtime::watcher};
use switchyard_api::tolerant::Undecodable;
use tokio::sync::{Notify, mpsc, watch};

use super::{
    budget::WriteBudget,
    engine::{Engine, Input},
    events::{self, EventGate},
    intake::SuspectEmpty,
    leader::{self, Timing},
    metrics::{ControllerEndpoints, Health, KindLabel, Metrics, ModeLabel, OutcomeLabel, ReasonLabel},
    object::ObjectRef,
    reconcile::{API_CALL_TIMEOUT, Action, Context, error_policy, reconcile, sweep_orphans},
    rollouts,
    ticket::{Done, Next},
    trim::Delivered,
    watch as watches,
};
use crate::{
    Config, Error,
    planner::{ServiceProblem, Warning},
};

/// After a failed or timed-out confirmation of an empty relist, wait this long before the next one
/// (instead of retrying on every tick).
const CONFIRM_RETRY: Duration = Duration::from_secs(1);

/// How the live controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The validated configuration.
    pub config: Config,
    /// Elect a leader through a Lease (two replicas); otherwise this process always writes.
    pub leader_elect: bool,
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// Lease timing.
    pub timing: Timing,
    /// Where to serve /metrics, /healthz and /readyz.
    pub metrics_bind: Option<SocketAddr>,
    /// How often plans of deleted nodes are looked for.
    pub orphan_sweep_period: Duration,
    /// Longest wait for one API call outside the watches (writes, the orphan sweep, confirming an empty
    /// relist); a call that takes longer fails and is retried later.
    pub api_timeout: Duration,
}

impl Options {
    /// Defaults for a configuration.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            leader_elect: false,
            lease_namespace: "switchyard-system".into(),
            lease_name: "switchyard-controller".into(),
            identity: default_identity(),
            timing: Timing::default(),
            metrics_bind: None,
            orphan_sweep_period: Duration::from_secs(60),
            api_timeout: API_CALL_TIMEOUT,
        }
    }
}

fn default_identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| format!("switchyard-controller-{}", std::process::id()))
}

/// Handles a running controller exposes (for tests and embedding).
pub struct Running {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Health.
    pub health: Arc<Health>,
    /// Leadership.
    pub leader: watch::Receiver<bool>,
}

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = ()>,
    started: Option<tokio::sync::oneshot::Sender<Running>>,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    health.beat();
    if let Some(addr) = options.metrics_bind {
        let endpoints = ControllerEndpoints {
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
        };
        switchyard_process::http::serve(addr, Arc::new(endpoints))
            .await
            .map_err(Error::Serve)?;
    }

    let engine = Arc::new(Mutex::new(Engine::new(options.config.clone())));
    let (tx, mut rx) = mpsc::channel(4096);
    watches::start(&client, tx, &metrics);

    let (leader_tx, leader_rx) = watch::channel(!options.leader_elect);
    let (stop_tx, stop_rx) = watch::channel(false);
    let election = options.leader_elect.then(|| {
        let api: Api<Lease> = Api::namespaced(client.clone(), &options.lease_namespace);
        tokio::spawn(leader::run(
            api,
            options.lease_name.clone(),
            options.identity.clone(),
            options.timing,
            leader_tx,
            stop_rx.clone(),
        ))
    });
    if let Some(started) = started {
        let _ = started.send(Running {
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
            leader: leader_rx.clone(),
        });
    }

    let config = &options.config;
    metrics.write_budget_qps.set(config.write_qps);
    let ctx = Arc::new(Context::new(
        Arc::clone(&engine),
        client.clone(),
        WriteBudget::new(config.write_qps, config.write_burst),
        Arc::clone(&metrics),
        leader_rx.clone(),
        options.api_timeout,
    ));
    let wake = Arc::new(Notify::new());
    let writer = tokio::spawn(write_loop(Arc::clone(&ctx), Arc::clone(&wake), stop_rx.clone()));

    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(options.orphan_sweep_period);
    let mut problems_tick = tokio::time::interval(Duration::from_secs(1));
    problems_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut gates = Gates {
        problems: EventGate::new(tokio::time::Instant::now()),
        undecodable: EventGate::new(tokio::time::Instant::now()),
        service_cidrs: EventGate::new(tokio::time::Instant::now()),
    };
    let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(events::publish(
        events::recorder(client.clone()),
        events_rx,
        Arc::clone(&metrics),
    ));
    let rollouts = tokio::spawn(rollouts::run(
        rollouts::Context {
            client: client.clone(),
            label_key: config.backend_node_label.clone(),
            api_timeout: options.api_timeout,
            leader: leader_rx.clone(),
            metrics: Arc::clone(&metrics),
            events: events_tx.clone(),
        },
        stop_rx.clone(),
    ));
    let mut last_plan: Option<tokio::time::Instant> = None;
    let mut confirm_after: Option<tokio::time::Instant> = None;
    let mut skipped = SkippedObjects::default();
    let mut leader_seen = *leader_rx.borrow();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            Some(input) = rx.recv() => {
                // A deleted Node's plan goes within seconds, not at the next periodic sweep; the sweep
                // still confirms with a GET that the Node is gone.
                if matches!(input, Input::Node(watcher::Event::Delete(_))) {
                    sweep.reset_immediately();
                }
                if let Ok(mut engine) = engine.lock() {
                    engine.observe(input);
                    for object in engine.take_restored() {
                        tracing::info!(%object, "changed or deleted by someone else; restoring it");
                        match object {
                            ObjectRef::Plan(_) => metrics.plans_restored.inc(),
                            ObjectRef::Slice(_) => metrics.slices_restored.inc(),
                        };
                    }
                    for broken in engine.take_broken() {
                        tracing::warn!(
                            kind = %broken.kind,
                            object = %broken.object(),
                            field = %broken.path,
                            reason = %broken.message,
                            "cannot decode this object; its last good version (if any) stays in use"
                        );
                        Metrics::count(&metrics.undecodable_objects, &broken.kind);
                    }
                    metrics.queue_depth.set(engine.queue_depth() as i64);
                }
                wake.notify_one();
            }
            _ = tick.tick() => {
                health.beat();
                if confirm_after.is_none_or(|t| tokio::time::Instant::now() >= t) {
                    let confirmed = confirm_suspect_relists(&client, &engine, options.api_timeout).await;
                    confirm_after = (!confirmed).then(|| tokio::time::Instant::now() + CONFIRM_RETRY);
                }
                let due = last_plan.is_none_or(|t| t.elapsed() >= config.min_plan_interval);
                let ready = engine.lock().is_ok_and(|e| e.synced() && e.dirty());
                if due && ready {
                    plan_once(&engine, &metrics, &mut skipped);
                    last_plan = Some(tokio::time::Instant::now());
                    health.set_ready();
                    wake.notify_one();
                }
                let leading = *leader_rx.borrow();
                metrics.leader.set(i64::from(leading));
                if leading && !leader_seen {
                    tracing::info!("leading: writing plans");
                    wake.notify_one();
                }
                leader_seen = leading;
            }
            _ = problems_tick.tick() => {
                report_problems(&engine, &metrics, *leader_rx.borrow(), &mut gates, &events_tx);
            }
            _ = sweep.tick() => {
                if *leader_rx.borrow()
                    && let Err(error) = sweep_orphans(&ctx).await {
                        tracing::warn!(%error, "orphan sweep failed; will retry");
                    }
            }
            _ = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    wake.notify_one();
    let _ = writer.await;
    let _ = rollouts.await;
    if let Some(election) = election {
        let _ = election.await;
    }
    Ok(())
}

/// Events waiting for the publisher at most; more are dropped (and counted): the gate's rate limit
/// keeps the queue far below this unless the API server stops answering.
const EVENT_QUEUE: usize = 256;

/// One Event gate per purpose, so a storm of one cannot use up the other's rate.
struct Gates {
    problems: EventGate,
    undecodable: EventGate,
    service_cidrs: EventGate,
}

/// Sets the problem gauges and, on the leader, hands the problems and the objects that do not decode
/// that the gates let through to the publisher.
fn report_problems(
    engine: &Arc<Mutex<Engine>>,
    metrics: &Metrics,
    leading: bool,
    gates: &mut Gates,
    events: &mpsc::Sender<events::Pending>,
) {
    let Ok(engine) = engine.lock() else { return };
    let problems: Vec<ServiceProblem> = engine.problems().cloned().collect();
    metrics.service_problems.clear();
    for problem in &problems {
        metrics
            .service_problems
            .get_or_create(&ReasonLabel {
                reason: problem.reason.into(),
            })
            .inc();
    }
    let cidr_problems = engine.service_cidr_problems().to_vec();
    metrics.ignored_service_cidrs.clear();
    for problem in &cidr_problems {
        metrics
            .ignored_service_cidrs
            .get_or_create(&ReasonLabel {
                reason: problem.reason.into(),
            })
            .inc();
    }
    if !leading {
        return;
    }
    let now = tokio::time::Instant::now();
    let (due, _) = gates.problems.due(now, &problems);
    let mut pending: Vec<events::Pending> = due
        .into_iter()
        .filter_map(|problem| {
            let regarding = engine.service_reference(&problem.service)?;
            Some(events::Pending::service_problem(problem, regarding))
        })
        .collect();
    let undecodable: Vec<Undecodable> = engine.undecodable().into_iter().cloned().collect();
    let (due, _) = gates.undecodable.due(now, &undecodable);
    pending.extend(due.into_iter().map(events::Pending::undecodable));
    let (due, _) = gates.service_cidrs.due(now, &cidr_problems);
    pending.extend(due.into_iter().filter_map(events::Pending::service_cidr));
    for event in pending {
        let about = event.about;
        if events.try_send(event).is_err() {
            about
                .counter(metrics)
                .get_or_create(&OutcomeLabel {
                    outcome: "dropped".into(),
                })
                .inc();
        }
    }
}

/// Invalid objects already counted in `skipped_objects`: every re-plan reports them again, but each one
/// counts once. A full re-plan reports every current one, so it also forgets those fixed since (which
/// keeps the set bounded, and counts an object again only when it breaks again).
#[derive(Debug, Default)]
struct SkippedObjects {
    counted: BTreeSet<Warning>,
}

impl SkippedObjects {
    /// The warnings of one planning run that were not counted yet.
    fn new_ones<'a>(&mut self, warnings: &'a [Warning], full: bool) -> Vec<&'a Warning> {
        let fresh = warnings.iter().filter(|w| !self.counted.contains(*w)).collect();
        if full {
            self.counted = warnings.iter().cloned().collect();
        } else {
            self.counted.extend(warnings.iter().cloned());
        }
        fresh
    }
}

fn plan_once(engine: &Arc<Mutex<Engine>>, metrics: &Metrics, skipped: &mut SkippedObjects) {
    let Ok(mut engine) = engine.lock() else { return };
    let start = std::time::Instant::now();
    match engine.plan() {
        Ok(outcome) => {
            let mode = if outcome.full { "full" } else { "incremental" };
            metrics
                .planning_duration
                .get_or_create(&ModeLabel { mode: mode.into() })
                .observe(start.elapsed().as_secs_f64());
            for warning in skipped.new_ones(&outcome.diagnostics.warnings, outcome.full) {
                tracing::warn!(kind = warning.kind, object = %warning.object, reason = %warning.reason, "skipped invalid input");
                metrics
                    .skipped_objects
                    .get_or_create(&KindLabel {
                        kind: warning.kind.to_string(),
                    })
                    .inc();
            }
            tracing::info!(mode, services = outcome.services, plans = outcome.changed.len(), slices = outcome.slices.len(), folded = outcome.folded.as_deref(), elapsed = ?start.elapsed(), "planned");
            metrics.queue_depth.set(engine.queue_depth() as i64);
        }
        Err(error) => tracing::error!(%error, "planning failed"),
    }
}

/// A relist that suddenly returned nothing is confirmed with an independent list before it may empty
/// any plan. Returns false when a list failed or timed out (the suspects stay; retry later).
async fn confirm_suspect_relists(client: &Client, engine: &Arc<Mutex<Engine>>, timeout: Duration) -> bool {
    let suspects = engine.lock().map(|e| e.suspects()).unwrap_or_default();
    let mut confirmed = true;
    for suspect in suspects {
        let params = ListParams::default().limit(1);
        let list = async {
            match suspect {
                SuspectEmpty::Services => Api::<Delivered<Service>>::all(client.clone())
                    .list(&params)
                    .await
                    .map(|l| l.items.is_empty()),
                SuspectEmpty::Slices => Api::<Delivered<EndpointSlice>>::all(client.clone())
                    .list(&params)
                    .await
                    .map(|l| l.items.is_empty()),
            }
        };
        let empty = tokio::time::timeout(timeout, list)
            .await
            .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))));
        match empty {
            Ok(true) => {
                tracing::warn!(
                    ?suspect,
                    "an empty relist was confirmed; plans will be emptied accordingly"
                );
                if let Ok(mut engine) = engine.lock() {
                    engine.confirm_empty(suspect);
                }
            }
            Ok(false) => {
                tracing::warn!(
                    ?suspect,
                    "a relist returned nothing but a fresh list does not; keeping the last known objects"
                );
                if let Ok(mut engine) = engine.lock() {
                    engine.dismiss_suspect(suspect);
                }
            }
            Err(error) => {
                tracing::warn!(?suspect, %error, "confirming an empty relist failed; keeping the last known objects");
                confirmed = false;
            }
        }
    }
    confirmed
}

async fn write_loop(ctx: Arc<Context>, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    let mut leader = ctx.leader.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        if !*leader.borrow() {
            // A closed channel is a stop too: `run` was dropped (or the election ended) without
            // saying so, and a loop that `continue`d on the error would spin.
            let open = tokio::select! {
                changed = leader.changed() => changed.is_ok(),
                changed = stop.changed() => changed.is_ok(),
            };
            if !open {
                return;
            }
            continue;
        }
        let now = tokio::time::Instant::now();
        let next = match ctx.engine.lock() {
            Ok(mut engine) => engine.next(now),
            Err(_) => Next::Idle { retry_at: None },
        };
        let ticket = match next {
            Next::Write(ticket) => ticket,
            Next::Idle { retry_at } => {
                let wait = retry_at.map_or(Duration::from_secs(1), |at| {
                    at.saturating_duration_since(now)
                        .clamp(Duration::from_millis(10), Duration::from_secs(1))
                });
                let open = tokio::select! {
                    _ = wake.notified() => true,
                    _ = tokio::time::sleep(wait) => true,
                    changed = stop.changed() => changed.is_ok(),
                };
                if !open {
                    return;
                }
                continue;
            }
        };
        let done = match reconcile(&ticket, &ctx).await {
            Ok(done) => done,
            // The object already left the queue: it goes back (not a failure), for when this replica
            // leads again; otherwise its write would wait for an unrelated change.
            Err(Error::NotLeader) => Done::NotLeader,
            Err(error) => match error_policy(&ticket.object, &error, &ctx) {
                // It stays queued while it backs off, so what must be written after it keeps waiting.
                Action::Requeue(delay) => Done::Failed {
                    retry_at: tokio::time::Instant::now() + delay,
                },
                Action::AwaitChange => Done::NotLeader,
            },
        };
        if let Ok(mut engine) = ctx.engine.lock() {
            let depth = engine.finish(&ticket, done);
            ctx.metrics.queue_depth.set(depth as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warning(object: &str) -> Warning {
        Warning {
            kind: "Service",
            object: object.into(),
            reason: "no cluster IP".into(),
        }
    }

    #[test]
    fn each_skipped_object_counts_once() {
        let mut skipped = SkippedObjects::default();
        let (a, b, c) = (warning("ns/a"), warning("ns/b"), warning("ns/c"));
        assert_eq!(skipped.new_ones(&[a.clone(), b.clone()], true).len(), 2);
        // Re-plans report them again: nothing new.
        assert!(skipped.new_ones(std::slice::from_ref(&a), false).is_empty());
        assert!(skipped.new_ones(&[a.clone(), b.clone()], true).is_empty());
        assert_eq!(skipped.new_ones(std::slice::from_ref(&c), false), vec![&c]);
        // A full re-plan without `b` forgets it: `b` breaking again is a new occurrence.
        assert!(skipped.new_ones(&[a, c], true).is_empty());
        assert_eq!(skipped.new_ones(std::slice::from_ref(&b), false), vec![&b]);
    }
}
