//! One step of a rollout: its spec and status and the world in, the next status, the node label writes
//! and the Events out. Pure; the live edge runs it on the leader whenever something changed (and every
//! few seconds while a node bakes) and writes the status before the labels, so a new leader resumes
//! from the status whatever was cut short.
//!
//! ```text
//! not planned ─► select nodes (nodeSelector, by name) ─► another active rollout holds one? ─► Halted
//!                 └► status.planned = the spec, every node Waiting
//! spec differs from status.planned (but paused, abort) ─► condition SpecChangeRefused, Event; plan kept
//! each node:  gone ─► Skipped;  Switching ─► gates::switched ─► Baking | revert;  Baking ─► gates::baking
//!             ─► bakeSeconds passed: Done | revert;  Reverted ─► label seen back ─► labelRestored
//! abort ─► revert the nodes in flight, Halted
//! a revert ─► RevertAndHalt: the others in flight reverted too, Halted | Pause: pausedAtGeneration
//! not paused ─► start Waiting nodes up to maxParallel: record `from`, Switching, label := target
//! every node finished ─► Complete;  conditions, counts, phase, message
//! ```

use switchyard_api::conditions::{COMPLETE, HALTED, PROGRESSING, rollout_reasons as why, status as cond};
use switchyard_api::rollout::{
    ForwardingRolloutSpec, ForwardingRolloutStatus, NodePhase, OnFailure, PlannedRollout, RolloutNode,
    RolloutPhase,
};
use switchyard_api::{Backend, PlanCondition};

use super::gates::{self, GateFailure, SwitchCheck};
use super::world::World;

/// A rollout as the step reads it.
#[derive(Debug, Clone, Copy)]
pub struct RolloutView<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its spec.
    pub spec: &'a ForwardingRolloutSpec,
    /// Its status (empty before the first step).
    pub status: &'a ForwardingRolloutStatus,
}

/// A node label to write: `value`, or removed when `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelWrite {
    /// The Node.
    pub node: String,
    /// The value.
    pub value: Option<String>,
}

/// An Event on the rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutEvent {
    /// Warning (a failure) or Normal.
    pub warning: bool,
    /// Its reason ([`switchyard_api::conditions::rollout_reasons`]).
    pub reason: &'static str,
    /// The node it is about, if one (its Event's related object, so Events of one reason about
    /// different nodes stay apart instead of folding into one series).
    pub node: Option<String>,
    /// What happened, naming the node and the gate.
    pub note: String,
}

/// What one step decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The next status (write it first).
    pub status: ForwardingRolloutStatus,
    /// The node labels to write then, in order.
    pub labels: Vec<LabelWrite>,
    /// The Events to publish.
    pub events: Vec<RolloutEvent>,
}

/// How to show "no label" in words.
fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "absent".to_owned(), |v| format!("{v:?}"))
}

struct Stepper<'a> {
    world: &'a World,
    status: ForwardingRolloutStatus,
    labels: Vec<LabelWrite>,
    events: Vec<RolloutEvent>,
}

impl Stepper<'_> {
    fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(RolloutEvent {
            warning,
            reason,
            node: None,
            note,
        });
    }

    /// An Event about one node (its Event names the Node as the related object).
    fn node_event(&mut self, node: &str, warning: bool, reason: &'static str, note: String) {
        self.events.push(RolloutEvent {
            warning,
            reason,
            node: Some(node.to_owned()),
            note,
        });
    }

    fn label(&mut self, node: &str, value: Option<&str>) {
        self.labels.push(LabelWrite {
            node: node.to_owned(),
            value: value.map(str::to_owned),
        });
    }

    fn condition(&mut self, kind: &str, status: &str, reason: &str, message: String) {
        let now = self.world.stamp();
        let conditions = &mut self.status.conditions;
        match conditions.iter_mut().find(|c| c.type_ == kind) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Some(now);
                }
                c.status = status.to_owned();
                c.reason = reason.to_owned();
                c.message = message;
            }
            None => conditions.push(PlanCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
                last_transition_time: Some(now),
            }),
        }
    }

    fn is(&self, kind: &str) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == cond::TRUE)
    }

    fn halt(&mut self, reason: &'static str, message: String) {
        self.condition(HALTED, cond::TRUE, reason, message.clone());
        self.condition(PROGRESSING, cond::FALSE, reason, message);
    }

    fn set_phase(&mut self, index: usize, phase: NodePhase, message: String) {
        let stamp = self.world.stamp();
        let node = &mut self.status.nodes[index];
        node.phase = phase;
        node.since = Some(stamp);
        node.message = Some(message);
    }

    /// Fixes the nodes and the order; false when the rollout cannot start (it is halted then).
    fn plan(&mut self, name: &str, spec: &ForwardingRolloutSpec) -> bool {
        let planned = PlannedRollout::of(spec);
        let selected: Vec<&String> = self
            .world
            .nodes
            .iter()
            .filter(|(_, node)| {
                planned
                    .node_selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&node.labels))
            })
            .map(|(name, _)| name)
            .collect();
        self.status.planned = Some(planned.clone());
        let held: Vec<String> = selected
            .iter()
            .filter_map(|node| {
                let holder = self.world.held.get(node.as_str())?;
                Some(format!("{node} (rollout {holder})"))
            })
            .collect();
        if !held.is_empty() {
            let message = format!(
                "refused: nodes it selects are held by another active rollout: {}; delete this rollout, or \
                 wait for the other to finish and create it again",
                held.join(", ")
            );
            self.event(true, why::NODE_HELD, message.clone());
            self.halt(why::NODE_HELD, message);
            return false;
        }
        if selected.is_empty() {
            let message = "refused: the nodeSelector selects no node".to_owned();
            self.event(true, why::NO_NODES, message.clone());
            self.halt(why::NO_NODES, message);
            return false;
        }
        self.status.nodes = selected
            .iter()
            .map(|node| RolloutNode {
                name: (*node).clone(),
                phase: NodePhase::Waiting,
                from: None,
                since: None,
                message: None,
                label_restored: false,
                baseline: None,
            })
            .collect();
        let shown: Vec<&str> = selected.iter().take(10).map(|n| n.as_str()).collect();
        let more = selected.len().saturating_sub(shown.len());
        let note = format!(
            "{name}: {} nodes to {} ({}{}), {} at a time, each baking {} s",
            selected.len(),
            planned.target.backend,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            planned.max_parallel,
            planned.bake_seconds
        );
        self.event(false, why::PLANNED, note);
        true
    }

    /// Refuses edits of the planned fields: the rollout keeps its plan and says so once per generation.
    fn check_spec(&mut self, spec: &ForwardingRolloutSpec, planned: &PlannedRollout, new_generation: bool) {
        let asked = PlannedRollout::of(spec);
        if asked == *planned {
            self.status
                .conditions
                .retain(|c| c.type_ != why::SPEC_CHANGE_REFUSED);
            return;
        }
        let mut fields = Vec::new();
        if asked.target != planned.target {
            fields.push("target");
        }
        if asked.node_selector != planned.node_selector {
            fields.push("nodeSelector");
        }
        if asked.max_parallel != planned.max_parallel {
            fields.push("maxParallel");
        }
        if asked.bake_seconds != planned.bake_seconds {
            fields.push("bakeSeconds");
        }
        if asked.gates != planned.gates {
            fields.push("gates");
        }
        if asked.on_failure != planned.on_failure {
            fields.push("onFailure");
        }
        let message = format!(
            "spec.{} changed after the rollout started: refused, it keeps the spec it planned from \
             (status.planned); only paused and abort may change — create another rollout instead",
            fields.join(", spec.")
        );
        if new_generation {
            self.event(true, why::SPEC_CHANGE_REFUSED, message.clone());
        }
        self.condition(
            why::SPEC_CHANGE_REFUSED,
            cond::TRUE,
            why::SPEC_CHANGE_REFUSED,
            message,
        );
    }

    /// Reverted (or failed) nodes whose label is not seen back yet: written again until it is.
    fn follow_reverts(&mut self, name: &str) {
        for index in 0..self.status.nodes.len() {
            let node = &self.status.nodes[index];
            if !matches!(node.phase, NodePhase::Reverted | NodePhase::Failed) || node.label_restored {
                continue;
            }
            let (node_name, from) = (node.name.clone(), node.from.clone());
            if !self.world.nodes.contains_key(&node_name) {
                continue;
            }
            if self.world.label(&node_name) == from.as_deref() {
                let node = &mut self.status.nodes[index];
                node.label_restored = true;
                node.phase = NodePhase::Reverted;
                self.node_event(
                    &node_name,
                    false,
                    why::REVERTED,
                    format!(
                        "{name}: node {node_name} is back on its label {} ({} = {})",
                        shown(from.as_deref()),
                        self.world.label_key,
                        shown(from.as_deref())
                    ),
                );
                continue;
            }
            if let Some(error) = self.world.write_errors.get(&node_name) {
                let message = format!(
                    "its label cannot be restored to {}: {error}",
                    shown(from.as_deref())
                );
                if node.phase != NodePhase::Failed {
                    self.node_event(
                        &node_name,
                        true,
                        why::REVERT_FAILED,
                        format!("{name}: node {node_name}: {message}"),
                    );
                    self.set_phase(index, NodePhase::Failed, message);
                }
            }
            self.label(&node_name, from.as_deref());
        }
    }

    /// Reverts a node in flight: its phase first (with why), then its label back to `from`.
    fn revert(&mut self, index: usize, message: String) {
        let node = &self.status.nodes[index];
        let (node_name, from) = (node.name.clone(), node.from.clone());
        self.set_phase(index, NodePhase::Reverted, message);
        self.status.nodes[index].baseline = None;
        self.label(&node_name, from.as_deref());
    }

    /// Follows the nodes in flight; returns the failures of this step (node, gate failure).
    fn follow_nodes(&mut self, name: &str, planned: &PlannedRollout) -> Vec<(String, GateFailure)> {
        let target = planned.target.backend;
        let mut failed = Vec::new();
        for index in 0..self.status.nodes.len() {
            let node = self.status.nodes[index].clone();
            if node.phase.finished() {
                continue;
            }
            if !self.world.nodes.contains_key(&node.name) {
                let message = format!("the node left the cluster while {:?}", node.phase);
                self.node_event(
                    &node.name,
                    true,
                    why::SKIPPED,
                    format!(
                        "{name}: node {} skipped: {message}; the rollout continues",
                        node.name
                    ),
                );
                self.set_phase(index, NodePhase::Skipped, message);
                continue;
            }
            if node.phase == NodePhase::Waiting {
                continue;
            }
            // In flight: its label says the target (again, after a cut-short write or a leader change).
            if self.world.label(&node.name) != Some(target.as_str()) {
                self.label(&node.name, Some(target.as_str()));
            }
            let plan = self.world.plans.get(&node.name);
            let outcome = match node.phase {
                NodePhase::Switching => {
                    match gates::switched(self.world, &planned.gates, target, plan, node.since.as_deref()) {
                        SwitchCheck::Pending(what) => {
                            self.status.nodes[index].message = Some(what);
                            Ok(())
                        }
                        SwitchCheck::Verified(baseline) => {
                            let note = format!(
                                "{name}: node {} switched to {target} and passed its verification; baking {} s",
                                node.name, planned.bake_seconds
                            );
                            self.node_event(&node.name, false, why::BAKING, note);
                            self.set_phase(
                                index,
                                NodePhase::Baking,
                                format!("baking {} s", planned.bake_seconds),
                            );
                            self.status.nodes[index].baseline = Some(baseline);
                            Ok(())
                        }
                        SwitchCheck::Failed(failure) => Err(failure),
                    }
                }
                NodePhase::Baking => {
                    let baseline = node.baseline.clone().unwrap_or_default();
                    gates::baking(&planned.gates, target, plan, &baseline).map(|()| {
                        let baked = self.world.elapsed(node.since.as_deref()).as_secs();
                        if baked >= i64::from(planned.bake_seconds) {
                            self.node_event(
                                &node.name,
                                false,
                                why::NODE_DONE,
                                format!(
                                    "{name}: node {} is on {target}: every gate held for {baked} s",
                                    node.name
                                ),
                            );
                            self.set_phase(index, NodePhase::Done, format!("on {target}"));
                            self.status.nodes[index].baseline = None;
                        } else {
                            self.status.nodes[index].message =
                                Some(format!("baking: {baked} s of {} s", planned.bake_seconds));
                        }
                    })
                }
                _ => Ok(()),
            };
            if let Err(failure) = outcome {
                let message = format!(
                    "gate {} failed: {}; label {} restored to {}",
                    failure.gate,
                    failure.why,
                    self.world.label_key,
                    shown(node.from.as_deref())
                );
                self.node_event(
                    &node.name,
                    true,
                    why::GATE_FAILED,
                    format!("{name}: node {}: {message}", node.name),
                );
                self.revert(index, message);
                failed.push((node.name.clone(), failure));
            }
        }
        failed
    }

    /// Reverts every node still in flight (abort, or a halt after another node's failure).
    fn revert_in_flight(&mut self, name: &str, why_text: &str) {
        for index in 0..self.status.nodes.len() {
            if !self.status.nodes[index].phase.in_flight() {
                continue;
            }
            let node_name = self.status.nodes[index].name.clone();
            self.node_event(
                &node_name,
                true,
                why::REVERTED,
                format!("{name}: node {node_name} reverted: {why_text}"),
            );
            self.revert(index, format!("reverted: {why_text}"));
        }
    }

    /// Starts Waiting nodes while fewer than `maxParallel` are in flight.
    fn start_nodes(&mut self, name: &str, planned: &PlannedRollout) {
        let target = planned.target.backend;
        let mut in_flight = self.status.nodes.iter().filter(|n| n.phase.in_flight()).count();
        for index in 0..self.status.nodes.len() {
            if in_flight >= planned.max_parallel as usize {
                return;
            }
            let node = &self.status.nodes[index];
            if node.phase != NodePhase::Waiting || !self.world.nodes.contains_key(&node.name) {
                continue;
            }
            let node_name = node.name.clone();
            let label = self.world.label(&node_name).map(str::to_owned);
            if label.as_deref() == Some(target.as_str()) {
                self.set_phase(index, NodePhase::Done, format!("already labelled {target}"));
                self.status.nodes[index].from = label;
                self.node_event(
                    &node_name,
                    false,
                    why::NODE_DONE,
                    format!("{name}: node {node_name} is already labelled {target}"),
                );
                continue;
            }
            if self.already_on(&node_name, target) {
                self.set_phase(index, NodePhase::Done, format!("already on {target}; label set"));
                self.status.nodes[index].from = label;
                self.label(&node_name, Some(target.as_str()));
                self.node_event(
                    &node_name,
                    false,
                    why::NODE_DONE,
                    format!(
                        "{name}: node {node_name} already forwards with {target}; its label is set so it stays"
                    ),
                );
                continue;
            }
            self.set_phase(index, NodePhase::Switching, format!("label set to {target}"));
            self.status.nodes[index].from = label.clone();
            self.label(&node_name, Some(target.as_str()));
            self.node_event(
                &node_name,
                false,
                why::SWITCHING,
                format!(
                    "{name}: node {node_name} switching: {} {} → \"{target}\"",
                    self.world.label_key,
                    shown(label.as_deref())
                ),
            );
            in_flight += 1;
        }
    }

    /// The node's plan asks for `target` and its agent uses it already.
    fn already_on(&self, node: &str, target: Backend) -> bool {
        self.world.plans.get(node).is_some_and(|plan| {
            plan.backend == target
                && plan.status.as_ref().is_some_and(|s| {
                    s.backend == Some(target) && s.observed_revision.as_deref() == Some(&plan.revision)
                })
        })
    }

    /// Complete and Halted say False while the rollout runs, so `kubectl wait` has them to watch.
    fn not_ended(&mut self) {
        self.condition(
            COMPLETE,
            cond::FALSE,
            why::SWITCHING,
            "nodes are still moving".to_owned(),
        );
        self.condition(HALTED, cond::FALSE, why::SWITCHING, String::new());
    }

    /// Counts, phase, message and the Progressing and Complete conditions.
    fn summarize(&mut self, paused: bool) {
        let nodes = &self.status.nodes;
        let count = |phases: &[NodePhase]| nodes.iter().filter(|n| phases.contains(&n.phase)).count() as u32;
        self.status.total = nodes.len() as u32;
        self.status.done = count(&[NodePhase::Done]);
        self.status.reverted = count(&[NodePhase::Reverted, NodePhase::Failed]);
        self.status.skipped = count(&[NodePhase::Skipped]);
        self.status.progress = Some(format!("{}/{}", self.status.done, self.status.total));
        let in_flight: Vec<String> = nodes
            .iter()
            .filter(|n| n.phase.in_flight())
            .map(|n| {
                format!(
                    "{} {:?}: {}",
                    n.name,
                    n.phase,
                    n.message.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let halted = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == HALTED && c.status == cond::TRUE)
            .map(|c| c.message.clone());
        let (phase, message) = if let Some(message) = halted {
            (RolloutPhase::Halted, message)
        } else if self.is(COMPLETE) {
            (RolloutPhase::Complete, "every node moved".to_owned())
        } else if paused {
            let message = if self.status.paused_at_generation.is_some() {
                "paused after a failed gate: set spec.paused to true, then false, to resume".to_owned()
            } else {
                "paused (spec.paused)".to_owned()
            };
            let message = if in_flight.is_empty() {
                message
            } else {
                format!("{message}; finishing {}", in_flight.join("; "))
            };
            self.condition(PROGRESSING, cond::FALSE, why::PAUSED, message.clone());
            self.not_ended();
            (RolloutPhase::Paused, message)
        } else {
            let message = if in_flight.is_empty() {
                "starting the next node".to_owned()
            } else {
                in_flight.join("; ")
            };
            self.condition(PROGRESSING, cond::TRUE, why::SWITCHING, message.clone());
            self.not_ended();
            (RolloutPhase::Progressing, message)
        };
        self.status.phase = Some(phase);
        self.status.message = Some(message);
    }
}

/// One step of `rollout` in `world`.
pub fn step(rollout: RolloutView<'_>, world: &World) -> Step {
    let mut s = Stepper {
        world,
        status: rollout.status.clone(),
        labels: Vec::new(),
        events: Vec::new(),
    };
    let name = rollout.name;
    let spec = rollout.spec;
    let new_generation = rollout.status.observed_generation != rollout.generation;
    s.status.observed_generation = rollout.generation;
    let ended = matches!(
        rollout.status.phase,
        Some(RolloutPhase::Complete | RolloutPhase::Halted)
    );
    if s.status.planned.is_none() && !s.plan(name, spec) {
        s.summarize(false);
        return s.finish();
    }
    let Some(planned) = s.status.planned.clone() else {
        return s.finish();
    };
    s.check_spec(spec, &planned, new_generation);
    s.follow_reverts(name);
    if ended {
        s.summarize(false);
        return s.finish();
    }
    let failed = s.follow_nodes(name, &planned);
    if spec.abort {
        s.revert_in_flight(name, "the rollout was aborted (spec.abort)");
        let message = "aborted (spec.abort): the nodes in flight were reverted".to_owned();
        s.event(true, why::ABORTED, format!("{name}: {message}"));
        s.halt(why::ABORTED, message);
        s.summarize(false);
        return s.finish();
    }
    if let Some((node, failure)) = failed.first() {
        let what = format!("node {node}: gate {} failed: {}", failure.gate, failure.why);
        match planned.on_failure {
            OnFailure::RevertAndHalt => {
                s.revert_in_flight(name, &format!("the rollout halted ({what})"));
                s.event(true, why::GATE_FAILED, format!("{name}: halted: {what}"));
                s.halt(why::GATE_FAILED, format!("halted: {what}"));
                s.summarize(false);
                return s.finish();
            }
            OnFailure::Pause => {
                s.status.paused_at_generation = rollout.generation.or(Some(0));
                s.event(
                    true,
                    why::PAUSED_BY_FAILURE,
                    format!("{name}: paused: {what}; set spec.paused to true, then false, to resume"),
                );
            }
        }
    }
    let failure_pause = match s.status.paused_at_generation {
        Some(at) if rollout.generation.unwrap_or(0) > at && !spec.paused => {
            s.status.paused_at_generation = None;
            s.event(
                false,
                why::RESUMED,
                format!("{name}: resumed after its failure pause"),
            );
            false
        }
        Some(_) => true,
        None => false,
    };
    let was_paused = rollout.status.phase == Some(RolloutPhase::Paused);
    let paused = spec.paused || failure_pause;
    if paused && !was_paused && failed.is_empty() {
        s.event(false, why::PAUSED, format!("{name}: paused (spec.paused)"));
    } else if !paused && was_paused && rollout.status.paused_at_generation.is_none() {
        s.event(false, why::RESUMED, format!("{name}: resumed"));
    }
    if !paused {
        s.start_nodes(name, &planned);
    }
    if s.status.nodes.iter().all(|n| n.phase.finished()) {
        let message = format!(
            "{} of {} nodes on {}{}",
            s.status
                .nodes
                .iter()
                .filter(|n| n.phase == NodePhase::Done)
                .count(),
            s.status.nodes.len(),
            planned.target.backend,
            match s
                .status
                .nodes
                .iter()
                .filter(|n| n.phase == NodePhase::Skipped)
                .count()
            {
                0 => String::new(),
                skipped => format!(" ({skipped} skipped: they left the cluster)"),
            }
        );
        s.event(false, why::COMPLETE, format!("{name}: complete: {message}"));
        s.condition(COMPLETE, cond::TRUE, why::COMPLETE, message.clone());
        s.condition(PROGRESSING, cond::FALSE, why::COMPLETE, message);
    }
    s.summarize(paused);
    s.finish()
}

impl Stepper<'_> {
    fn finish(mut self) -> Step {
        // The API server refuses a status with a longer message (the CRD's maxLength), and a refused
        // status would stall the rollout: many nodes in flight, or a gate's examples, can exceed it.
        clip(&mut self.status.message);
        for node in &mut self.status.nodes {
            clip(&mut node.message);
        }
        for condition in &mut self.status.conditions {
            let mut message = Some(std::mem::take(&mut condition.message));
            clip(&mut message);
            condition.message = message.unwrap_or_default();
        }
        Step {
            status: self.status,
            labels: self.labels,
            events: self.events,
        }
    }
}

/// The most characters a message in a rollout's status may have (the CRD's `maxLength`).
pub const MAX_MESSAGE: usize = 1024;

/// Cuts `message` to [`MAX_MESSAGE`] characters, `...` marking the cut.
fn clip(message: &mut Option<String>) {
    if let Some(text) = message
        && text.chars().count() > MAX_MESSAGE
    {
        let mut cut: String = text.chars().take(MAX_MESSAGE - 3).collect();
        cut.push_str("...");
        *text = cut;
    }
}
