//! One tick of the rollouts on the leader: every rollout that can still change is stepped (the pure
//! [`crate::rollout::step`]) over what [`Observed`] shows, and what the step decided is written
//! through [`Writes`] (the API server in production, a fake in tests).
//!
//! ```text
//! Observed::rollouts (oldest first) ─► live? ─► world + nodes other rollouts hold + this rollout's
//!   failed label writes ─► step ─► Step { status, labels, events }
//!   status changed? ─► Writes::status (progress alone: at most every PROGRESS_INTERVAL)
//!        failed ─► nothing else for this rollout now: the next tick steps again from its status
//!   ─► Writes::label for each label, in order ─► failures kept for its next step (RevertFailed)
//!   ─► Events (only once the status that records them is written) ─► EventQueue ─► the publisher
//! metrics: steps by reason, writes by outcome, rollouts and their nodes by phase
//! ```
//!
//! The status is written before the labels, so whatever cuts a tick short (a failed write, a lost
//! lease, a crash) the next leader finds in the status every node it was about to move, with the
//! label it had, and finishes the job ([`crate::rollout::step`] re-asserts labels from the status).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use switchyard_api::rollout::ForwardingRolloutStatus;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::observed::{Observed, Rollout, held_by_others};
use crate::Error;
use crate::live::events::{EventGate, Pending};
use crate::live::metrics::{Metrics, OutcomeLabel, PhaseLabel, ReasonLabel, WriteLabel};
use crate::rollout::{RolloutEvent, step};

/// A status that changed only in its progress words (how long a node has baked, what it waits for)
/// is written at most this often: otherwise every baking rollout would write once a second.
pub const PROGRESS_INTERVAL: SignedDuration = SignedDuration::from_secs(5);

/// Events waiting for the rate limit at most; older ones are dropped (and counted) beyond it.
pub const EVENT_BACKLOG: usize = 1000;

/// The writes a tick makes. Each answers with the resourceVersion the API server gave the object.
pub trait Writes {
    /// Server-side applies a rollout's status (its status subresource).
    fn status(
        &self,
        name: &str,
        status: &ForwardingRolloutStatus,
    ) -> impl Future<Output = Result<Option<String>, Error>> + Send;

    /// Server-side applies a Node's backend label: `value`, or no label (`None`).
    fn label(
        &self,
        node: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<Option<String>, Error>> + Send;
}

/// What the driver remembers between ticks (nothing a new leader needs: that is in the statuses).
#[derive(Debug, Default)]
pub struct Driver {
    /// Per rollout, the nodes whose last label write failed and why (its next step reads them).
    write_errors: BTreeMap<String, BTreeMap<String, String>>,
    /// When each rollout's status was last written.
    written_at: BTreeMap<String, Timestamp>,
}

/// `status` without its progress words.
fn without_progress(status: &ForwardingRolloutStatus) -> ForwardingRolloutStatus {
    let mut status = status.clone();
    status.message = None;
    for node in &mut status.nodes {
        node.message = None;
    }
    for condition in &mut status.conditions {
        condition.message.clear();
    }
    status
}

fn count_write(metrics: &Metrics, write: &str, ok: bool) {
    metrics
        .rollout_writes
        .get_or_create(&WriteLabel {
            write: write.into(),
            outcome: if ok { "ok" } else { "failed" }.into(),
        })
        .inc();
}

impl Driver {
    /// Steps every rollout that can still change, at `now`; returns the Events to publish. Stops
    /// where this replica stops leading (the Events of what it wrote until then are returned).
    pub async fn tick<W: Writes>(
        &mut self,
        observed: &mut Observed,
        writes: &W,
        now: Timestamp,
        metrics: &Metrics,
    ) -> Vec<Pending> {
        let mut events = Vec::new();
        let rollouts = observed.rollouts();
        let live: Vec<&Rollout> = rollouts.iter().filter(|r| r.live()).collect();
        let names: Vec<&str> = rollouts.iter().map(|r| r.name.as_str()).collect();
        self.write_errors.retain(|name, _| names.contains(&name.as_str()));
        self.written_at.retain(|name, _| names.contains(&name.as_str()));
        if !live.is_empty() {
            let mut world = observed.world(now);
            'rollouts: for rollout in live {
                // The statuses written earlier in this tick: a rollout planned a moment ago holds
                // its nodes against the next one.
                world.held = held_by_others(&observed.rollouts(), &rollout.name);
                world.write_errors = self.write_errors.remove(&rollout.name).unwrap_or_default();
                let step = step(rollout.view(), &world);
                let changed = step.status != rollout.status;
                let progress_only = without_progress(&step.status) == without_progress(&rollout.status);
                let recently = self
                    .written_at
                    .get(&rollout.name)
                    .is_some_and(|at| now.duration_since(*at) < PROGRESS_INTERVAL);
                if changed && !(progress_only && recently && step.events.is_empty()) {
                    match writes.status(&rollout.name, &step.status).await {
                        Ok(version) => {
                            count_write(metrics, "status", true);
                            observed.wrote_status(rollout, version, step.status.clone());
                            self.written_at.insert(rollout.name.clone(), now);
                        }
                        Err(Error::NotLeader) => break 'rollouts,
                        Err(error) => {
                            count_write(metrics, "status", false);
                            tracing::warn!(rollout = %rollout.name, %error, "writing the rollout's status failed; retrying");
                            continue;
                        }
                    }
                }
                let mut failed = BTreeMap::new();
                for write in &step.labels {
                    match writes.label(&write.node, write.value.as_deref()).await {
                        Ok(version) => {
                            count_write(metrics, "label", true);
                            observed.wrote_label(&write.node, write.value.clone(), version);
                            if let Some(node) = world.nodes.get_mut(&write.node) {
                                match &write.value {
                                    Some(value) => node.labels.insert(world.label_key.clone(), value.clone()),
                                    None => node.labels.remove(&world.label_key),
                                };
                            }
                        }
                        // Its status is written: its Events go out, the next leader writes the label.
                        Err(Error::NotLeader) => {
                            publish(rollout, &step.events, metrics, &mut events);
                            break 'rollouts;
                        }
                        Err(error) => {
                            count_write(metrics, "label", false);
                            tracing::warn!(rollout = %rollout.name, node = %write.node, %error, "writing the node's backend label failed");
                            failed.insert(write.node.clone(), error.to_string());
                        }
                    }
                }
                if !failed.is_empty() {
                    self.write_errors.insert(rollout.name.clone(), failed);
                }
                publish(rollout, &step.events, metrics, &mut events);
            }
        }
        phases(metrics, &observed.rollouts());
        events
    }
}

/// Logs and counts a step's Events and queues them for the publisher.
fn publish(rollout: &Rollout, step: &[RolloutEvent], metrics: &Metrics, out: &mut Vec<Pending>) {
    for event in step {
        tracing::info!(rollout = %rollout.name, reason = event.reason, warning = event.warning, "{}", event.note);
        metrics
            .rollout_steps
            .get_or_create(&ReasonLabel {
                reason: event.reason.into(),
            })
            .inc();
        out.push(Pending::rollout(event, rollout.reference()));
    }
}

/// The rollout gauges: rollouts by phase, the nodes of those still running by phase.
pub fn phases(metrics: &Metrics, rollouts: &[Rollout]) {
    metrics.rollouts.clear();
    metrics.rollout_nodes.clear();
    for rollout in rollouts {
        let phase = rollout
            .status
            .phase
            .map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}"));
        metrics.rollouts.get_or_create(&PhaseLabel { phase }).inc();
        if rollout.ended() {
            continue;
        }
        for node in &rollout.status.nodes {
            metrics
                .rollout_nodes
                .get_or_create(&PhaseLabel {
                    phase: format!("{:?}", node.phase),
                })
                .inc();
        }
    }
}

/// Rollout Events waiting for the rate limit: unlike Service problems they are said once (a step is
/// not repeated), so they queue rather than wait to be found again.
#[derive(Debug)]
pub struct EventQueue {
    gate: EventGate,
    waiting: VecDeque<Pending>,
}

impl EventQueue {
    /// An empty queue with a full burst.
    pub fn new(now: Instant) -> Self {
        Self {
            gate: EventGate::new(now),
            waiting: VecDeque::new(),
        }
    }

    /// Queues `events`; beyond [`EVENT_BACKLOG`] the oldest are dropped and counted.
    pub fn extend(&mut self, events: Vec<Pending>, metrics: &Metrics) {
        self.waiting.extend(events);
        while self.waiting.len() > EVENT_BACKLOG {
            self.waiting.pop_front();
            dropped(metrics);
        }
    }

    /// Hands the publisher what the rate limit lets through at `now`.
    pub fn send(&mut self, now: Instant, publisher: &mpsc::Sender<Pending>, metrics: &Metrics) {
        while !self.waiting.is_empty() && self.gate.take(now) {
            let Some(event) = self.waiting.pop_front() else {
                return;
            };
            if publisher.try_send(event).is_err() {
                dropped(metrics);
            }
        }
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

fn dropped(metrics: &Metrics) {
    metrics
        .rollout_events
        .get_or_create(&OutcomeLabel {
            outcome: "dropped".into(),
        })
        .inc();
}

/// How often the run loop looks at the rollouts: every second at least (bakes and switch timeouts
/// are counted in seconds), and this soon after a watched change.
pub const TICK: Duration = Duration::from_millis(250);
