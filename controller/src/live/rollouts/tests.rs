//! The live rollouts over a simulated cluster: a fake [`Writes`] that stores what is written (with
//! resourceVersions, as the API server answers), the planner's rule (a node's label is its plan's
//! backend), one scripted agent per node, and watches that deliver when the test says so. Each tick is
//! one second.
//!
//! Conventions: nodes `node-a`, `node-b`, …, without a backend label unless said; time starts at
//! 2026-11-30T00:53:20Z; the rollout `to-nft` moves every node to nftables, one at a time, baking 5 s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::watcher;
use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, rollout_reasons as why, status as cond};
use switchyard_api::rollout::{
    ForwardingRolloutSpec, ForwardingRolloutStatus, NodePhase, RolloutPhase, RolloutTarget,
};
use switchyard_api::verification::{KernelCheck, ProbeCheck, Verification};
use switchyard_api::{
    Backend, ForwardingRollout, NodeForwardingPlan, NodeForwardingPlanStatus, PlanCondition,
};
use tokio::time::{Duration, Instant};

use super::driver::{EVENT_BACKLOG, EventQueue, PROGRESS_INTERVAL};
use super::trim::Delivered;
use super::{Driver, Input, Observed, Writes};
use crate::Error;
use crate::live::events::Pending;
use crate::live::metrics::Metrics;
use crate::rollout::world::stamp;

const KEY: &str = "switchyard.io/backend";

/// One write as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    /// A rollout's status: each node's phase, as written.
    Status(String, Vec<(String, NodePhase)>),
    /// A node's label.
    Label(String, Option<String>),
}

#[derive(Default)]
struct State {
    version: u64,
    rollouts: BTreeMap<String, ForwardingRollout>,
    nodes: BTreeMap<String, Node>,
    plans: BTreeMap<String, NodeForwardingPlan>,
    /// Nodes whose agent cannot run nftables (it falls back to iptables and says so).
    lacking: BTreeSet<String>,
    /// Status writes that fail, next first.
    failing_statuses: usize,
    /// Label writes that fail, by node.
    failing_labels: BTreeMap<String, usize>,
    /// Answer NotLeader from the next write on.
    lease_lost: bool,
    writes: Vec<Write>,
}

/// The API server, the planner and the agents.
struct Cluster(Mutex<State>);

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(
        serde_json::from_value(
            serde_json::json!({"code": code, "message": "injected", "reason": "Injected"}),
        )
        .unwrap(),
    ))
}

impl Writes for Cluster {
    async fn status(&self, name: &str, status: &ForwardingRolloutStatus) -> Result<Option<String>, Error> {
        let mut state = self.0.lock().unwrap();
        if state.lease_lost {
            return Err(Error::NotLeader);
        }
        if state.failing_statuses > 0 {
            state.failing_statuses -= 1;
            return Err(Error::RolloutStatus {
                name: name.into(),
                source: api_error(500),
            });
        }
        state.version += 1;
        let version = state.version.to_string();
        let phases = status.nodes.iter().map(|n| (n.name.clone(), n.phase)).collect();
        state.writes.push(Write::Status(name.into(), phases));
        let rollout = state.rollouts.get_mut(name).unwrap();
        rollout.status = Some(status.clone());
        rollout.metadata.resource_version = Some(version.clone());
        Ok(Some(version))
    }

    async fn label(&self, node: &str, value: Option<&str>) -> Result<Option<String>, Error> {
        let mut state = self.0.lock().unwrap();
        if state.lease_lost {
            return Err(Error::NotLeader);
        }
        if let Some(left) = state.failing_labels.get_mut(node)
            && *left > 0
        {
            *left -= 1;
            return Err(Error::NodeLabel {
                node: node.into(),
                key: KEY.into(),
                source: api_error(403),
            });
        }
        state.version += 1;
        let version = state.version.to_string();
        state
            .writes
            .push(Write::Label(node.into(), value.map(str::to_owned)));
        let object = state.nodes.get_mut(node).unwrap();
        let labels = object.metadata.labels.get_or_insert_with(BTreeMap::new);
        match value {
            Some(value) => labels.insert(KEY.into(), value.into()),
            None => labels.remove(KEY),
        };
        object.metadata.resource_version = Some(version.clone());
        Ok(Some(version))
    }
}

fn spec() -> ForwardingRolloutSpec {
    ForwardingRolloutSpec {
        target: RolloutTarget {
            backend: Backend::Nftables,
        },
        node_selector: None,
        max_parallel: 1,
        bake_seconds: 5,
        gates: Default::default(),
        on_failure: Default::default(),
        paused: false,
        abort: false,
    }
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> PlanCondition {
    PlanCondition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: None,
    }
}

struct Sim {
    cluster: Cluster,
    observed: Observed,
    driver: Driver,
    metrics: Metrics,
    now: Timestamp,
    events: Vec<Pending>,
}

impl Sim {
    fn new(nodes: &[(&str, Option<&str>)]) -> Self {
        let mut state = State::default();
        for (name, label) in nodes {
            let labels = label.map(|l| BTreeMap::from([(KEY.to_owned(), l.to_owned())]));
            state.nodes.insert(
                name.to_string(),
                Node {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        resource_version: Some("1".into()),
                        labels,
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                },
            );
        }
        let mut sim = Self {
            cluster: Cluster(Mutex::new(state)),
            observed: Observed::new(KEY.into()),
            driver: Driver::default(),
            metrics: Metrics::default(),
            now: Timestamp::from_second(1_796_000_000).unwrap(),
            events: Vec::new(),
        };
        sim.agents();
        sim.relist();
        sim
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.cluster.0.lock().unwrap()
    }

    fn create(&mut self, name: &str, created: i64, spec: ForwardingRolloutSpec) {
        let mut rollout = ForwardingRollout::new(name, spec);
        rollout.metadata.uid = Some(format!("uid-{name}"));
        rollout.metadata.generation = Some(1);
        rollout.metadata.resource_version = Some("1".into());
        rollout.metadata.creation_timestamp = Some(Time(self.now + SignedDuration::from_secs(created)));
        self.state().rollouts.insert(name.into(), rollout);
        self.deliver();
    }

    /// The planner and the agents catch up with the labels: a plan asks for its node's label (the
    /// default iptables without one); its agent applies it (or, lacking nft, falls back) and verifies.
    fn agents(&mut self) {
        let at = stamp(self.now);
        let mut state = self.state();
        let names: Vec<String> = state.nodes.keys().cloned().collect();
        for name in names {
            let wanted = state.nodes[&name]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(KEY))
                .and_then(|v| Backend::parse(v))
                .unwrap_or(Backend::Iptables);
            if state.plans.get(&name).is_some_and(|p| p.spec.backend == wanted) {
                continue;
            }
            state.version += 1;
            let mut spec = switchyard_api::testing::plan(&name, vec![]);
            spec.backend = wanted;
            spec.revision = format!("{wanted}-{}", state.version);
            let lacking = state.lacking.contains(&name) && wanted == Backend::Nftables;
            let used = if lacking { Backend::Iptables } else { wanted };
            let degraded = if lacking {
                condition(
                    DEGRADED,
                    cond::TRUE,
                    reasons::BACKEND_FALLBACK,
                    "nftables is unavailable on this node (nft is not in $PATH); using iptables",
                )
            } else {
                condition(DEGRADED, cond::FALSE, reasons::HEALTHY, "")
            };
            let status = NodeForwardingPlanStatus {
                observed_revision: Some(spec.revision.clone()),
                backend: Some(used),
                conditions: vec![condition(APPLIED, cond::TRUE, reasons::SYNCED, ""), degraded],
                verification: Some(Verification {
                    backend: used,
                    revision: spec.revision.clone(),
                    at: at.clone(),
                    kernel: KernelCheck {
                        frontends: 3,
                        ..KernelCheck::default()
                    },
                    probes: Some(ProbeCheck {
                        sampled: 3,
                        ..ProbeCheck::default()
                    }),
                    refused: None,
                }),
                ..NodeForwardingPlanStatus::default()
            };
            let mut plan = NodeForwardingPlan::new(&name, spec);
            plan.metadata.resource_version = Some(state.version.to_string());
            plan.status = Some(status);
            state.plans.insert(name.clone(), plan);
        }
    }

    fn inputs(&self) -> Vec<Input> {
        let state = self.state();
        let mut inputs: Vec<Input> = Vec::new();
        inputs.extend(
            state
                .rollouts
                .values()
                .map(|r| Input::Rollout(watcher::Event::Apply(Delivered::Decoded(r.clone())))),
        );
        inputs.extend(
            state
                .nodes
                .values()
                .map(|n| Input::Node(watcher::Event::Apply(Delivered::Decoded(n.clone())))),
        );
        inputs.extend(
            state
                .plans
                .values()
                .map(|p| Input::Plan(watcher::Event::Apply(Delivered::Decoded(p.clone())))),
        );
        inputs
    }

    /// Every watch delivers what the cluster holds now.
    fn deliver(&mut self) {
        for input in self.inputs() {
            self.observed.observe(input);
        }
    }

    /// A fresh list of every kind (a new leader's, or the first).
    fn relist(&mut self) {
        let mut by_kind: [Vec<Input>; 3] = Default::default();
        for input in self.inputs() {
            let slot = match &input {
                Input::Rollout(_) => 0,
                Input::Node(_) => 1,
                Input::Plan(_) => 2,
            };
            by_kind[slot].push(input);
        }
        self.observed.observe(Input::Rollout(watcher::Event::Init));
        self.observed.observe(Input::Node(watcher::Event::Init));
        self.observed.observe(Input::Plan(watcher::Event::Init));
        for input in by_kind.into_iter().flatten() {
            let input = match input {
                Input::Rollout(watcher::Event::Apply(o)) => Input::Rollout(watcher::Event::InitApply(o)),
                Input::Node(watcher::Event::Apply(o)) => Input::Node(watcher::Event::InitApply(o)),
                Input::Plan(watcher::Event::Apply(o)) => Input::Plan(watcher::Event::InitApply(o)),
                other => other,
            };
            self.observed.observe(input);
        }
        self.observed.observe(Input::Rollout(watcher::Event::InitDone));
        self.observed.observe(Input::Node(watcher::Event::InitDone));
        self.observed.observe(Input::Plan(watcher::Event::InitDone));
    }

    /// One tick, then the planner and agents, then the watches; one second passes.
    async fn tick(&mut self) {
        let events = self
            .driver
            .tick(&mut self.observed, &self.cluster, self.now, &self.metrics)
            .await;
        self.events.extend(events);
        self.agents();
        self.deliver();
        self.now += SignedDuration::from_secs(1);
    }

    async fn run(&mut self, seconds: u32) {
        for _ in 0..seconds {
            self.tick().await;
        }
    }

    /// A new leader: nothing kept but what the cluster holds.
    fn new_leader(&mut self) {
        self.observed = Observed::new(KEY.into());
        self.driver = Driver::default();
        self.relist();
    }

    fn status(&self, name: &str) -> ForwardingRolloutStatus {
        self.state().rollouts[name].status.clone().unwrap_or_default()
    }

    fn phase_of(&self, name: &str, node: &str) -> NodePhase {
        self.status(name)
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.phase)
            .unwrap()
    }

    fn label(&self, node: &str) -> Option<String> {
        self.state().nodes[node]
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(KEY).cloned())
    }

    fn writes(&self) -> Vec<Write> {
        self.state().writes.clone()
    }

    fn label_writes(&self, node: &str) -> Vec<Option<String>> {
        self.writes()
            .into_iter()
            .filter_map(|w| match w {
                Write::Label(n, value) if n == node => Some(value),
                _ => None,
            })
            .collect()
    }

    fn reasons(&self) -> Vec<&'static str> {
        self.events.iter().map(|e| e.reason).collect()
    }

    fn notes(&self, reason: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e.reason == reason)
            .map(|e| e.note.clone())
            .collect()
    }
}

fn nodes3() -> Vec<(&'static str, Option<&'static str>)> {
    vec![("node-a", None), ("node-b", None), ("node-c", None)]
}

#[tokio::test]
async fn a_rollout_moves_every_node_writing_its_status_before_each_label() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    sim.run(40).await;
    let status = sim.status("to-nft");
    assert_eq!(status.phase, Some(RolloutPhase::Complete), "{status:#?}");
    assert_eq!(status.progress.as_deref(), Some("3/3"));
    for node in ["node-a", "node-b", "node-c"] {
        assert_eq!(sim.label(node).as_deref(), Some("nftables"));
        assert_eq!(
            sim.label_writes(node),
            vec![Some("nftables".to_owned())],
            "{node}: one write"
        );
    }
    // Every label write follows a status write that already shows its node Switching.
    let mut last_status: Vec<(String, NodePhase)> = Vec::new();
    for write in sim.writes() {
        match write {
            Write::Status(_, phases) => last_status = phases,
            Write::Label(node, _) => assert!(
                last_status.contains(&(node.clone(), NodePhase::Switching)),
                "{node} labelled before a status recorded it: {last_status:?}"
            ),
        }
    }
    let reasons = sim.reasons();
    for (reason, count) in [
        (why::PLANNED, 1),
        (why::SWITCHING, 3),
        (why::BAKING, 3),
        (why::NODE_DONE, 3),
        (why::COMPLETE, 1),
    ] {
        assert_eq!(
            reasons.iter().filter(|r| **r == reason).count(),
            count,
            "{reason}: {reasons:?}"
        );
    }
    let event = &sim.events[0];
    assert_eq!(event.regarding.kind.as_deref(), Some("ForwardingRollout"));
    assert_eq!(event.regarding.name.as_deref(), Some("to-nft"));
    assert_eq!(event.regarding.uid.as_deref(), Some("uid-to-nft"));
    let metrics = sim.metrics.render();
    for line in [
        "switchyard_controller_rollouts{phase=\"Complete\"} 1",
        "switchyard_controller_rollout_steps_total{reason=\"NodeDone\"} 3",
        "switchyard_controller_rollout_writes_total{write=\"label\",outcome=\"ok\"} 3",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    // Complete: nothing more is written.
    let before = sim.writes().len();
    sim.run(5).await;
    assert_eq!(sim.writes().len(), before);
}

#[tokio::test]
async fn progress_alone_is_written_at_most_every_few_seconds() {
    let mut sim = Sim::new(&[("node-a", None)]);
    sim.create(
        "to-nft",
        0,
        ForwardingRolloutSpec {
            bake_seconds: 60,
            ..spec()
        },
    );
    sim.run(40).await;
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Baking);
    let statuses = sim
        .writes()
        .iter()
        .filter(|w| matches!(w, Write::Status(..)))
        .count();
    let bound = 40 / PROGRESS_INTERVAL.as_secs() as usize + 4;
    assert!(
        statuses <= bound,
        "{statuses} status writes in 40 s (at most {bound})"
    );
    assert!(statuses >= 3, "{statuses}");
}

#[tokio::test]
async fn a_new_leader_resumes_at_the_same_step() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    for _ in 0..10 {
        sim.tick().await;
        if sim.phase_of("to-nft", "node-a") == NodePhase::Baking {
            break;
        }
    }
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Baking);
    let since = sim.status("to-nft").nodes[0].since.clone();
    sim.new_leader();
    sim.tick().await;
    assert_eq!(
        sim.status("to-nft").nodes[0].since,
        since,
        "node-a bakes on from where it was"
    );
    sim.run(40).await;
    assert_eq!(sim.status("to-nft").phase, Some(RolloutPhase::Complete));
    assert_eq!(sim.label_writes("node-a"), vec![Some("nftables".to_owned())]);
    assert_eq!(
        sim.notes(why::SWITCHING)
            .iter()
            .filter(|n| n.contains("node node-a"))
            .count(),
        1,
        "node-a switched once: {:?}",
        sim.notes(why::SWITCHING)
    );
}

#[tokio::test]
async fn a_lease_lost_between_status_and_label_is_finished_by_the_next_leader() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    // The first status write (planned, node-a Switching) goes through; then the lease is lost.
    let events = sim
        .driver
        .tick(
            &mut sim.observed,
            &LoseLeaseAfterStatus(&sim.cluster),
            sim.now,
            &sim.metrics,
        )
        .await;
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Switching);
    assert_eq!(sim.label("node-a"), None, "the label was not written");
    assert!(
        events.iter().any(|e| e.reason == why::SWITCHING),
        "the Events of the written status go out"
    );
    sim.events.extend(events);
    sim.new_leader();
    sim.run(40).await;
    assert_eq!(sim.status("to-nft").phase, Some(RolloutPhase::Complete));
    assert_eq!(sim.label_writes("node-a"), vec![Some("nftables".to_owned())]);
    assert_eq!(
        sim.notes(why::SWITCHING)
            .iter()
            .filter(|n| n.contains("node node-a"))
            .count(),
        1
    );
}

/// Writes statuses, then answers NotLeader to everything.
struct LoseLeaseAfterStatus<'a>(&'a Cluster);

impl Writes for LoseLeaseAfterStatus<'_> {
    async fn status(&self, name: &str, status: &ForwardingRolloutStatus) -> Result<Option<String>, Error> {
        self.0.status(name, status).await
    }

    async fn label(&self, _: &str, _: Option<&str>) -> Result<Option<String>, Error> {
        Err(Error::NotLeader)
    }
}

#[tokio::test]
async fn a_failed_status_write_writes_no_label_and_says_nothing_until_it_succeeds() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    sim.state().failing_statuses = 2;
    sim.run(2).await;
    assert!(sim.writes().is_empty(), "{:?}", sim.writes());
    assert!(sim.events.is_empty());
    assert!(
        sim.metrics
            .render()
            .contains("switchyard_controller_rollout_writes_total{write=\"status\",outcome=\"failed\"} 2")
    );
    sim.run(1).await;
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Switching);
    assert_eq!(sim.label("node-a").as_deref(), Some("nftables"));
    assert_eq!(sim.reasons(), vec![why::PLANNED, why::SWITCHING]);
}

#[tokio::test]
async fn a_watch_behind_the_writes_does_not_take_a_switching_node_for_done() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    // One tick without the rollout's watch: the Node's new label arrives, the status write does not.
    let events = sim
        .driver
        .tick(&mut sim.observed, &sim.cluster, sim.now, &sim.metrics)
        .await;
    sim.events.extend(events);
    let node = sim.state().nodes["node-a"].clone();
    sim.observed
        .observe(Input::Node(watcher::Event::Apply(Delivered::Decoded(node))));
    sim.now += SignedDuration::from_secs(1);
    sim.run(3).await;
    assert_ne!(sim.phase_of("to-nft", "node-a"), NodePhase::Done);
    assert!(
        sim.notes(why::NODE_DONE).is_empty(),
        "{:?}",
        sim.notes(why::NODE_DONE)
    );
}

#[tokio::test]
async fn a_node_that_lacks_the_target_is_reverted_at_its_gate_and_the_rollout_halts() {
    let mut sim = Sim::new(&[("node-a", Some("iptables")), ("node-b", None)]);
    sim.state().lacking.insert("node-a".into());
    sim.create("to-nft", 0, spec());
    sim.run(10).await;
    let status = sim.status("to-nft");
    assert_eq!(status.phase, Some(RolloutPhase::Halted), "{status:#?}");
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Reverted);
    assert_eq!(sim.phase_of("to-nft", "node-b"), NodePhase::Waiting);
    assert_eq!(
        sim.label("node-a").as_deref(),
        Some("iptables"),
        "exactly its old label"
    );
    assert_eq!(sim.label("node-b"), None, "no other node changes");
    let failed = sim.notes(why::GATE_FAILED);
    assert!(
        failed
            .iter()
            .any(|n| n.contains("node node-a") && n.contains("gate backend")),
        "{failed:?}"
    );
    let warning = sim.events.iter().find(|e| e.reason == why::GATE_FAILED).unwrap();
    assert!(warning.warning);
}

#[tokio::test]
async fn a_revert_whose_label_write_fails_is_failed_then_retried_until_restored() {
    let mut sim = Sim::new(&[("node-a", Some("iptables"))]);
    sim.state().lacking.insert("node-a".into());
    sim.create("to-nft", 0, spec());
    sim.run(1).await;
    assert_eq!(sim.label("node-a").as_deref(), Some("nftables"));
    sim.state().failing_labels.insert("node-a".into(), 2);
    sim.run(3).await;
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Failed);
    assert!(
        sim.notes(why::REVERT_FAILED)
            .iter()
            .any(|n| n.contains("injected")),
        "{:?}",
        sim.notes(why::REVERT_FAILED)
    );
    sim.run(3).await;
    assert_eq!(sim.label("node-a").as_deref(), Some("iptables"));
    let node = sim.status("to-nft").nodes[0].clone();
    assert!(
        node.label_restored && node.phase == NodePhase::Reverted,
        "{node:?}"
    );
}

#[tokio::test]
async fn a_second_rollout_over_the_same_node_is_refused_with_why() {
    let mut sim = Sim::new(&nodes3());
    sim.create("first", 0, spec());
    sim.create(
        "second",
        1,
        ForwardingRolloutSpec {
            target: RolloutTarget {
                backend: Backend::Ipvs,
            },
            ..spec()
        },
    );
    sim.run(2).await;
    let second = sim.status("second");
    assert_eq!(second.phase, Some(RolloutPhase::Halted));
    let halted = second.conditions.iter().find(|c| c.type_ == "Halted").unwrap();
    assert_eq!(halted.reason, why::NODE_HELD);
    assert!(
        halted.message.contains("node-a (rollout first)"),
        "{}",
        halted.message
    );
    assert!(
        sim.notes(why::NODE_HELD)
            .iter()
            .any(|n| n.contains("rollout first"))
    );
    assert_eq!(sim.status("first").phase, Some(RolloutPhase::Progressing));
    sim.run(40).await;
    assert_eq!(sim.status("first").phase, Some(RolloutPhase::Complete));
    for node in ["node-a", "node-b", "node-c"] {
        assert_eq!(sim.label(node).as_deref(), Some("nftables"));
    }
}

#[tokio::test]
async fn a_node_removed_mid_rollout_is_skipped_and_the_rest_move() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    sim.run(1).await;
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Switching);
    let gone = sim.state().nodes.remove("node-a").unwrap();
    sim.state().plans.remove("node-a");
    sim.observed
        .observe(Input::Node(watcher::Event::Delete(Delivered::Decoded(gone))));
    sim.run(40).await;
    let status = sim.status("to-nft");
    assert_eq!(status.phase, Some(RolloutPhase::Complete), "{status:#?}");
    assert_eq!(sim.phase_of("to-nft", "node-a"), NodePhase::Skipped);
    assert_eq!(status.skipped, 1);
    assert_eq!(status.done, 2);
}

#[tokio::test]
async fn an_edit_while_running_is_refused_and_said_once() {
    let mut sim = Sim::new(&nodes3());
    sim.create("to-nft", 0, spec());
    sim.run(2).await;
    {
        let mut state = sim.state();
        let rollout = state.rollouts.get_mut("to-nft").unwrap();
        rollout.spec.max_parallel = 3;
        rollout.metadata.generation = Some(2);
        state.version += 1;
        let version = state.version.to_string();
        state
            .rollouts
            .get_mut("to-nft")
            .unwrap()
            .metadata
            .resource_version = Some(version);
    }
    sim.deliver();
    sim.run(3).await;
    let status = sim.status("to-nft");
    assert_eq!(status.observed_generation, Some(2));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == why::SPEC_CHANGE_REFUSED && c.message.contains("spec.maxParallel")),
        "{:?}",
        status.conditions
    );
    assert_eq!(sim.notes(why::SPEC_CHANGE_REFUSED).len(), 1);
    let in_flight = status.nodes.iter().filter(|n| n.phase.in_flight()).count();
    assert_eq!(in_flight, 1, "still one at a time");
}

#[test]
fn rollout_events_wait_for_the_rate_limit_and_the_oldest_go_beyond_the_backlog() {
    let metrics = Metrics::default();
    let start = Instant::now();
    let mut queue = EventQueue::new(start);
    let event = |i: usize| crate::rollout::RolloutEvent {
        warning: false,
        reason: why::NODE_DONE,
        node: Some(format!("node-{i}")),
        note: format!("node {i}"),
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference::default();
    queue.extend(
        (0..30)
            .map(|i| Pending::rollout(&event(i), reference.clone()))
            .collect(),
        &metrics,
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(100);
    queue.send(start, &tx, &metrics);
    assert_eq!(queue.len(), 10, "a burst of 20 at once");
    queue.send(start + Duration::from_secs(2), &tx, &metrics);
    assert_eq!(queue.len(), 9, "then one every 2 s");
    let first = rx.try_recv().unwrap();
    assert_eq!(first.note, "node 0", "in order");
    queue.extend(
        (0..EVENT_BACKLOG)
            .map(|i| Pending::rollout(&event(i), reference.clone()))
            .collect(),
        &metrics,
    );
    assert_eq!(queue.len(), EVENT_BACKLOG);
    assert!(
        metrics
            .render()
            .contains("switchyard_controller_rollout_events_total{outcome=\"dropped\"} 9")
    );
}
