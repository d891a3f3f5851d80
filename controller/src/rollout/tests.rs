//! The rollout state machine as tables: a small simulated cluster (Nodes with labels, the planner
//! turning a label into a plan, one scripted agent per node reporting its status), stepped second by
//! second, and what the rollout decided: node phases, label writes, conditions and Events.
//!
//! Conventions: nodes are `node-a`, `node-b`, …; without a label a node plans iptables (the default);
//! plan revisions are `<backend>-<n>`; time starts at 2026-11-30T00:00:00Z.

use std::collections::BTreeMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use switchyard_api::conditions::{
    APPLIED, COMPLETE, DEGRADED, HALTED, PROGRESSING, reasons, rollout_reasons as why, status as cond,
};
use switchyard_api::rollout::{
    ForwardingRolloutSpec, ForwardingRolloutStatus, NodePhase, NodeSelector, OnFailure, RolloutGates,
    RolloutPhase, RolloutTarget,
};
use switchyard_api::verification::{KernelCheck, ProbeCheck, RefusedCheck, Verification};
use switchyard_api::{Backend, NodeForwardingPlanStatus, PlanCondition};

use super::world::stamp;
use super::{LabelWrite, NodeView, PlanView, RolloutEvent, RolloutView, World, step};

const LABEL: &str = "switchyard.io/backend";

/// How a node's agent answers a plan asking for another backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    /// Switches, verifies, everything passes.
    Good,
    /// The backend cannot run here (no nft): falls back to iptables and says why.
    Lacks,
    /// Refuses the switch: a frontend's verdict would differ.
    Refuses,
    /// Switches, but the kernel check finds a frontend that differs.
    KernelDiffers,
    /// Switches, but a probe fails.
    ProbeFails,
    /// Switches and verifies, then refuses connections its plan does not refuse while baking.
    RefusesLater,
    /// Switches and verifies, then repairs drift while baking.
    DriftsLater,
    /// Never reports.
    Silent,
}

struct Sim {
    world: World,
    agents: BTreeMap<String, Agent>,
    spec: ForwardingRolloutSpec,
    generation: i64,
    status: ForwardingRolloutStatus,
    events: Vec<RolloutEvent>,
    writes: Vec<LabelWrite>,
    /// Label writes the "API server" refuses, by node.
    refuse_writes: BTreeMap<String, String>,
    revisions: u32,
    /// Seconds since the agent of each node switched (for the later failures).
    switched_for: BTreeMap<String, u32>,
}

fn spec(target: Backend) -> ForwardingRolloutSpec {
    ForwardingRolloutSpec {
        target: RolloutTarget { backend: target },
        node_selector: None,
        max_parallel: 1,
        bake_seconds: 60,
        gates: RolloutGates::default(),
        on_failure: OnFailure::RevertAndHalt,
        paused: false,
        abort: false,
    }
}

fn applied(status: &str, reason: &str, message: &str) -> PlanCondition {
    PlanCondition {
        type_: APPLIED.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: None,
    }
}

fn degraded(reason: &str, message: &str) -> PlanCondition {
    PlanCondition {
        type_: DEGRADED.into(),
        status: if reason == reasons::HEALTHY {
            cond::FALSE
        } else {
            cond::TRUE
        }
        .into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: None,
    }
}

impl Sim {
    /// Nodes `(name, label, agent)`; the rollout moves them to `target`.
    fn new(nodes: &[(&str, Option<&str>, Agent)], spec: ForwardingRolloutSpec) -> Self {
        let mut sim = Self {
            world: World {
                now: Timestamp::from_second(1_796_000_000).unwrap(),
                label_key: LABEL.into(),
                nodes: BTreeMap::new(),
                plans: BTreeMap::new(),
                held: BTreeMap::new(),
                write_errors: BTreeMap::new(),
            },
            agents: BTreeMap::new(),
            spec,
            generation: 1,
            status: ForwardingRolloutStatus::default(),
            events: Vec::new(),
            writes: Vec::new(),
            refuse_writes: BTreeMap::new(),
            revisions: 0,
            switched_for: BTreeMap::new(),
        };
        for (name, label, agent) in nodes {
            let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_string())]);
            if let Some(label) = label {
                labels.insert(LABEL.into(), label.to_string());
            }
            sim.world.nodes.insert(name.to_string(), NodeView { labels });
            sim.agents.insert(name.to_string(), *agent);
        }
        sim.plan_and_report();
        sim
    }

    /// The planner (label → plan backend, a new revision on change) and each agent's report.
    fn plan_and_report(&mut self) {
        let names: Vec<String> = self.world.nodes.keys().cloned().collect();
        for name in names {
            let backend = self
                .world
                .label(&name)
                .and_then(Backend::parse)
                .unwrap_or(Backend::Iptables);
            let changed = self.world.plans.get(&name).is_none_or(|p| p.backend != backend);
            if changed {
                self.revisions += 1;
                let previous = self.world.plans.get(&name).and_then(|p| p.status.clone());
                let revision = format!("{backend}-{}", self.revisions);
                let status = self.report(&name, backend, &revision, previous);
                self.world.plans.insert(
                    name.clone(),
                    PlanView {
                        backend,
                        revision,
                        status,
                    },
                );
            } else if let Some(plan) = self.world.plans.get(&name).cloned()
                && plan.status.as_ref().and_then(|s| s.backend) == Some(backend)
                && backend != Backend::Iptables
            {
                // Time passes for a switched node: the later failures show up.
                let seconds = self.switched_for.entry(name.clone()).or_default();
                *seconds += 1;
                let later = *seconds;
                let agent = self.agents[&name];
                let plan = self.world.plans.get_mut(&name).unwrap();
                let status = plan.status.as_mut().unwrap();
                match agent {
                    Agent::RefusesLater if later > 10 => {
                        if let Some(refused) = status.verification.as_mut().and_then(|v| v.refused.as_mut()) {
                            refused.unexpected = 3;
                            refused.examples = vec!["ns/web:http no-endpoints +3".into()];
                        }
                    }
                    Agent::DriftsLater if later > 10 => status.drift_repairs = 1,
                    _ => {}
                }
            }
        }
    }

    /// What `name`'s agent reports for a plan asking for `backend`.
    fn report(
        &self,
        name: &str,
        backend: Backend,
        revision: &str,
        previous: Option<NodeForwardingPlanStatus>,
    ) -> Option<NodeForwardingPlanStatus> {
        let agent = self.agents[name];
        let at = self.world.stamp();
        let was = previous
            .as_ref()
            .and_then(|s| s.backend)
            .unwrap_or(Backend::Iptables);
        let mut status = NodeForwardingPlanStatus {
            observed_revision: Some(revision.into()),
            backend: Some(backend),
            conditions: vec![
                applied(cond::TRUE, reasons::SYNCED, "programmed"),
                degraded(reasons::HEALTHY, ""),
            ],
            drift_repairs: previous.as_ref().map_or(0, |s| s.drift_repairs),
            ..NodeForwardingPlanStatus::default()
        };
        let verification = |kernel: KernelCheck, probes: ProbeCheck| Verification {
            backend,
            revision: revision.into(),
            at: at.clone(),
            kernel,
            probes: Some(probes),
            refused: Some(RefusedCheck {
                unexpected: 0,
                examples: Vec::new(),
                checked_at: at.clone(),
            }),
        };
        let passing = KernelCheck {
            frontends: 14,
            ..KernelCheck::default()
        };
        let probes = ProbeCheck {
            sampled: 3,
            ..ProbeCheck::default()
        };
        match agent {
            Agent::Silent if backend != Backend::Iptables => return previous,
            Agent::Lacks if backend == Backend::Nftables => {
                status.backend = Some(Backend::Iptables);
                let reason = "the plan asks for nftables, but nftables is unavailable on this node (nft is not in $PATH); using iptables";
                status.backend_reason = Some(reason.into());
                status.conditions[1] = degraded(reasons::BACKEND_FALLBACK, reason);
            }
            Agent::Refuses if backend != was => {
                status.backend = Some(was);
                let reason = format!(
                    "switch from {was} to {backend} refused: ns/web:http (10.96.0.10:80/tcp from a pod): {was} forwards to 10.244.1.5:8080, {backend} rejects"
                );
                status.backend_reason = Some(reason.clone());
                status.conditions[1] = degraded(reasons::BACKEND_SWITCH_REFUSED, &reason);
            }
            Agent::KernelDiffers if backend != Backend::Iptables => {
                let kernel = KernelCheck {
                    frontends: 14,
                    mismatches: 1,
                    examples: vec!["ns/web:http 10.96.0.10:80/tcp: element missing".into()],
                    error: None,
                };
                status.verification = Some(verification(kernel, probes));
            }
            Agent::ProbeFails if backend != Backend::Iptables => {
                let probes = ProbeCheck {
                    sampled: 3,
                    failed: 1,
                    examples: vec!["ns/web:http 10.96.0.10:80: connection refused".into()],
                };
                status.verification = Some(verification(passing, probes));
            }
            _ => status.verification = Some(verification(passing, probes)),
        }
        Some(status)
    }

    /// One step of the rollout, its label writes applied as the API server would, then the planner and
    /// the agents catch up.
    fn step(&mut self) {
        let step = step(
            RolloutView {
                name: "to-nftables",
                generation: Some(self.generation),
                spec: &self.spec,
                status: &self.status,
            },
            &self.world,
        );
        self.status = step.status;
        self.events.extend(step.events);
        self.world.write_errors.clear();
        for write in step.labels {
            if let Some(error) = self.refuse_writes.get(&write.node) {
                self.world.write_errors.insert(write.node.clone(), error.clone());
                continue;
            }
            if let Some(node) = self.world.nodes.get_mut(&write.node) {
                match &write.value {
                    Some(value) => node.labels.insert(LABEL.into(), value.clone()),
                    None => node.labels.remove(LABEL),
                };
            }
            self.writes.push(write);
        }
        self.plan_and_report();
    }

    /// Steps once a second for `seconds`.
    fn run(&mut self, seconds: u32) {
        for _ in 0..seconds {
            self.step();
            self.world.now += SignedDuration::from_secs(1);
        }
    }

    fn edit(&mut self, change: impl FnOnce(&mut ForwardingRolloutSpec)) {
        change(&mut self.spec);
        self.generation += 1;
    }

    fn phases(&self) -> Vec<(String, NodePhase)> {
        self.status
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.phase))
            .collect()
    }

    fn phase_of(&self, node: &str) -> NodePhase {
        self.status
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.phase)
            .unwrap()
    }

    fn label(&self, node: &str) -> Option<&str> {
        self.world.label(node)
    }

    fn condition(&self, kind: &str) -> Option<&PlanCondition> {
        self.status.conditions.iter().find(|c| c.type_ == kind)
    }

    fn warnings(&self) -> Vec<&RolloutEvent> {
        self.events.iter().filter(|e| e.warning).collect()
    }

    fn has_event(&self, reason: &str, text: &str) -> bool {
        self.events
            .iter()
            .any(|e| e.reason == reason && e.note.contains(text))
    }
}

use Agent::*;
use NodePhase::*;

fn phases(list: &[(&str, NodePhase)]) -> Vec<(String, NodePhase)> {
    list.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

#[test]
fn a_rollout_moves_one_node_at_a_time_and_completes() {
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        spec(Backend::Nftables),
    );
    sim.run(1);
    assert_eq!(
        sim.phases(),
        phases(&[("node-a", Switching), ("node-b", Waiting)])
    );
    assert_eq!(sim.label("node-a"), Some("nftables"));
    assert_eq!(sim.label("node-b"), None, "one at a time");
    sim.run(1);
    assert_eq!(sim.phase_of("node-a"), Baking);
    sim.run(59);
    assert_eq!(sim.phase_of("node-a"), Baking, "60 s of bake");
    sim.run(1);
    assert_eq!(sim.phases(), phases(&[("node-a", Done), ("node-b", Switching)]));
    sim.run(70);
    assert_eq!(sim.phases(), phases(&[("node-a", Done), ("node-b", Done)]));
    assert_eq!(sim.status.phase, Some(RolloutPhase::Complete));
    assert_eq!(sim.status.progress.as_deref(), Some("2/2"));
    assert_eq!(sim.condition(COMPLETE).unwrap().status, cond::TRUE);
    assert_eq!(sim.condition(PROGRESSING).unwrap().status, cond::FALSE);
    assert_eq!(sim.condition(HALTED).unwrap().status, cond::FALSE);
    assert!(sim.warnings().is_empty(), "{:#?}", sim.warnings());
    for (reason, text) in [
        (
            why::PLANNED,
            "2 nodes to nftables (node-a, node-b), 1 at a time, each baking 60 s",
        ),
        (
            why::SWITCHING,
            "node node-a switching: switchyard.io/backend absent → \"nftables\"",
        ),
        (
            why::BAKING,
            "node node-a switched to nftables and passed its verification",
        ),
        (why::NODE_DONE, "node node-b is on nftables"),
        (why::COMPLETE, "2 of 2 nodes on nftables"),
    ] {
        assert!(sim.has_event(reason, text), "{reason}: {text}: {:#?}", sim.events);
    }
    // Where each node came from is kept: a later revert would restore exactly that.
    assert!(sim.status.nodes.iter().all(|n| n.from.is_none()));
    // Nothing is written once it is complete.
    let writes = sim.writes.len();
    sim.run(5);
    assert_eq!(sim.writes.len(), writes);
}

#[test]
fn a_failed_gate_reverts_its_node_exactly_and_halts_the_rollout() {
    type Case = (&'static str, Agent, Option<&'static str>, &'static str, u32);
    let cases: [Case; 8] = [
        (
            "no nft on the node",
            Lacks,
            None,
            "gate backend failed: nftables cannot run on the node",
            2,
        ),
        (
            "verdicts differ",
            Refuses,
            None,
            "gate verdicts failed: switch from iptables to nftables refused: ns/web:http",
            2,
        ),
        (
            "the kernel differs",
            KernelDiffers,
            Some("iptables"),
            "gate kernel failed: 1 of 14 frontends differ",
            2,
        ),
        (
            "a probe fails",
            ProbeFails,
            None,
            "gate probes failed: 1 of 3 connections from the node failed",
            2,
        ),
        (
            "refusals while baking",
            RefusesLater,
            None,
            "gate refusedConnections failed: 3 connections refused",
            20,
        ),
        (
            "drift while baking",
            DriftsLater,
            Some("iptables"),
            "gate applied failed: the agent repaired drift 1 times",
            20,
        ),
        (
            "the agent never reports",
            Silent,
            None,
            "gate switchTimeout failed: not switched within 120 s",
            125,
        ),
        (
            "a label from an operator",
            KernelDiffers,
            Some("ipvs"),
            "gate kernel failed",
            2,
        ),
    ];
    for (name, agent, label, failure, seconds) in cases {
        let mut sim = Sim::new(
            &[("node-a", label, agent), ("node-b", None, Good)],
            spec(Backend::Nftables),
        );
        sim.run(seconds);
        assert_eq!(
            sim.phases(),
            phases(&[("node-a", Reverted), ("node-b", Waiting)]),
            "{name}"
        );
        assert_eq!(sim.label("node-a"), label, "{name}: the label is back exactly");
        assert_eq!(sim.label("node-b"), None, "{name}: no other node changes");
        assert_eq!(sim.status.phase, Some(RolloutPhase::Halted), "{name}");
        let halted = sim.condition(HALTED).unwrap();
        assert_eq!(
            (halted.status.as_str(), halted.reason.as_str()),
            (cond::TRUE, why::GATE_FAILED),
            "{name}"
        );
        assert!(halted.message.contains(failure), "{name}: {}", halted.message);
        let event = sim
            .warnings()
            .into_iter()
            .find(|e| e.reason == why::GATE_FAILED)
            .unwrap_or_else(|| panic!("{name}: {:#?}", sim.events));
        assert!(
            event.note.contains("node node-a") && event.note.contains(failure),
            "{name}: {}",
            event.note
        );
        // The restored label is confirmed once seen, and nothing else happens.
        sim.run(3);
        let node = &sim.status.nodes[0];
        assert!(node.label_restored, "{name}: {node:?}");
        assert!(
            sim.has_event(why::REVERTED, "node node-a is back on its label"),
            "{name}"
        );
        let writes = sim.writes.len();
        sim.run(5);
        assert_eq!(
            sim.writes.len(),
            writes,
            "{name}: a halted rollout writes nothing"
        );
    }
}

#[test]
fn on_failure_pause_reverts_the_node_and_waits_for_a_resume() {
    let mut spec = spec(Backend::Nftables);
    spec.on_failure = OnFailure::Pause;
    let mut sim = Sim::new(&[("node-a", None, Lacks), ("node-b", None, Good)], spec);
    sim.run(5);
    assert_eq!(sim.phases(), phases(&[("node-a", Reverted), ("node-b", Waiting)]));
    assert_eq!(sim.status.phase, Some(RolloutPhase::Paused));
    assert_eq!(sim.status.paused_at_generation, Some(1));
    assert!(sim.has_event(why::PAUSED_BY_FAILURE, "node node-a: gate backend failed"));
    sim.run(30);
    assert_eq!(sim.phase_of("node-b"), Waiting, "no node starts while paused");
    sim.edit(|s| s.paused = true);
    sim.run(2);
    assert_eq!(sim.status.phase, Some(RolloutPhase::Paused));
    sim.edit(|s| s.paused = false);
    sim.run(1);
    assert_eq!(sim.phase_of("node-b"), Switching);
    assert!(sim.has_event(why::RESUMED, "resumed after its failure pause"));
    sim.run(70);
    assert_eq!(sim.phases(), phases(&[("node-a", Reverted), ("node-b", Done)]));
    // A node reverted is not a completed move: the rollout still completes (every node finished).
    assert_eq!(sim.status.phase, Some(RolloutPhase::Complete));
    assert_eq!((sim.status.done, sim.status.reverted), (1, 1));
}

#[test]
fn paused_starts_nothing_but_lets_nodes_in_flight_finish() {
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        spec(Backend::Nftables),
    );
    sim.run(5);
    sim.edit(|s| s.paused = true);
    sim.run(70);
    assert_eq!(sim.phases(), phases(&[("node-a", Done), ("node-b", Waiting)]));
    assert_eq!(sim.status.phase, Some(RolloutPhase::Paused));
    assert!(sim.has_event(why::PAUSED, "paused (spec.paused)"));
    sim.edit(|s| s.paused = false);
    sim.run(1);
    assert_eq!(sim.phase_of("node-b"), Switching);
    assert!(sim.has_event(why::RESUMED, "to-nftables: resumed"));
}

#[test]
fn abort_reverts_the_nodes_in_flight_and_keeps_those_done() {
    let mut spec = spec(Backend::Nftables);
    spec.max_parallel = 2;
    let nodes = [
        ("node-a", None, Good),
        ("node-b", Some("iptables"), Good),
        ("node-c", None, Good),
    ];
    let mut sim = Sim::new(&nodes, spec);
    sim.run(62);
    assert_eq!(
        sim.phases(),
        phases(&[("node-a", Done), ("node-b", Done), ("node-c", Switching)])
    );
    sim.run(10);
    assert_eq!(sim.phase_of("node-c"), Baking);
    sim.edit(|s| s.abort = true);
    sim.run(1);
    assert_eq!(
        sim.phases(),
        phases(&[("node-a", Done), ("node-b", Done), ("node-c", Reverted)])
    );
    assert_eq!(sim.label("node-c"), None);
    assert_eq!(sim.label("node-b"), Some("nftables"), "done nodes stay");
    let halted = sim.condition(HALTED).unwrap();
    assert_eq!(halted.reason, why::ABORTED);
    assert!(sim.has_event(why::REVERTED, "node node-c reverted: the rollout was aborted"));
}

#[test]
fn max_parallel_moves_that_many_nodes_at_once() {
    let mut spec = spec(Backend::Nftables);
    spec.max_parallel = 2;
    let nodes = [
        ("node-a", None, Good),
        ("node-b", None, Good),
        ("node-c", None, Good),
    ];
    let mut sim = Sim::new(&nodes, spec);
    sim.run(1);
    assert_eq!(
        sim.phases(),
        phases(&[("node-a", Switching), ("node-b", Switching), ("node-c", Waiting)])
    );
}

#[test]
fn a_node_removed_mid_rollout_is_skipped_and_the_rollout_continues() {
    let nodes = [
        ("node-a", None, Good),
        ("node-b", None, Good),
        ("node-c", None, Good),
    ];
    let mut sim = Sim::new(&nodes, spec(Backend::Nftables));
    sim.run(5);
    assert_eq!(sim.phase_of("node-a"), Baking);
    sim.world.nodes.remove("node-a");
    sim.world.nodes.remove("node-c");
    sim.run(1);
    assert_eq!(
        sim.phases(),
        phases(&[("node-a", Skipped), ("node-b", Switching), ("node-c", Skipped)])
    );
    assert!(sim.has_event(
        why::SKIPPED,
        "node node-a skipped: the node left the cluster while Baking"
    ));
    sim.run(70);
    assert_eq!(sim.status.phase, Some(RolloutPhase::Complete));
    assert!(sim.has_event(
        why::COMPLETE,
        "1 of 3 nodes on nftables (2 skipped: they left the cluster)"
    ));
}

#[test]
fn a_second_rollout_over_a_held_node_is_refused_and_says_which_holds_it() {
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        spec(Backend::Nftables),
    );
    sim.world.held.insert("node-b".into(), "first".into());
    sim.run(3);
    assert!(sim.status.nodes.is_empty());
    assert_eq!(sim.status.phase, Some(RolloutPhase::Halted));
    let halted = sim.condition(HALTED).unwrap();
    assert_eq!(halted.reason, why::NODE_HELD);
    assert!(
        halted.message.contains("node-b (rollout first)"),
        "{}",
        halted.message
    );
    assert!(sim.writes.is_empty(), "nothing changed");
    assert_eq!(sim.warnings().len(), 1);
}

#[test]
fn a_selector_picks_the_nodes_and_one_selecting_none_is_refused() {
    let mut selected = spec(Backend::Nftables);
    selected.node_selector = Some(NodeSelector {
        match_labels: BTreeMap::from([("kubernetes.io/hostname".to_owned(), "node-b".to_owned())]),
        ..NodeSelector::default()
    });
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        selected.clone(),
    );
    sim.run(1);
    assert_eq!(sim.phases(), phases(&[("node-b", Switching)]));
    let mut none = selected;
    none.node_selector
        .as_mut()
        .unwrap()
        .match_labels
        .insert("kubernetes.io/hostname".into(), "node-z".into());
    let mut sim = Sim::new(&[("node-a", None, Good)], none);
    sim.run(1);
    assert_eq!(sim.condition(HALTED).unwrap().reason, why::NO_NODES);
}

#[test]
fn an_edit_of_a_planned_field_is_refused_and_the_plan_kept() {
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        spec(Backend::Nftables),
    );
    sim.run(5);
    sim.edit(|s| {
        s.target.backend = Backend::Ipvs;
        s.bake_seconds = 5;
    });
    sim.run(3);
    let refused = sim.condition(why::SPEC_CHANGE_REFUSED).unwrap();
    assert_eq!(refused.status, cond::TRUE);
    assert!(
        refused
            .message
            .contains("spec.target, spec.bakeSeconds changed after the rollout started: refused"),
        "{}",
        refused.message
    );
    assert_eq!(
        sim.events
            .iter()
            .filter(|e| e.reason == why::SPEC_CHANGE_REFUSED)
            .count(),
        1,
        "one Event per edit"
    );
    sim.run(150);
    assert_eq!(sim.label("node-a"), Some("nftables"), "the planned target");
    assert_eq!(sim.status.phase, Some(RolloutPhase::Complete));
    // Editing it back clears the condition.
    sim.edit(|s| {
        s.target.backend = Backend::Nftables;
        s.bake_seconds = 60;
    });
    sim.run(1);
    assert!(sim.condition(why::SPEC_CHANGE_REFUSED).is_none());
}

#[test]
fn a_node_already_on_the_target_is_done_at_once() {
    let nodes = [("node-a", Some("nftables"), Good), ("node-b", None, Good)];
    let mut sim = Sim::new(&nodes, spec(Backend::Nftables));
    sim.run(1);
    assert_eq!(sim.phases(), phases(&[("node-a", Done), ("node-b", Switching)]));
    assert_eq!(sim.status.nodes[0].from.as_deref(), Some("nftables"));
    // Its plan asks for iptables through the default and its agent uses it: labelled, nothing switches.
    let mut sim = Sim::new(&[("node-a", None, Good)], spec(Backend::Iptables));
    sim.run(1);
    assert_eq!(sim.phases(), phases(&[("node-a", Done)]));
    assert_eq!(sim.label("node-a"), Some("iptables"));
}

#[test]
fn a_new_leader_resumes_from_the_status_alone() {
    // The status is all a step keeps: a label write cut short by a leader change (the status said
    // Switching, the write never happened) is made again by the next leader's first step.
    let mut sim = Sim::new(
        &[("node-a", None, Good), ("node-b", None, Good)],
        spec(Backend::Nftables),
    );
    sim.run(1);
    assert_eq!(sim.phase_of("node-a"), Switching);
    sim.world.nodes.get_mut("node-a").unwrap().labels.remove(LABEL);
    sim.plan_and_report();
    let before = sim.writes.len();
    sim.run(1);
    assert_eq!(
        sim.writes[before],
        LabelWrite {
            node: "node-a".into(),
            value: Some("nftables".into())
        }
    );
    sim.run(3);
    assert_eq!(sim.phase_of("node-a"), Baking, "the same step, not a restart");
    // A bake resumes with its time: `since` is in the status.
    let since = sim.status.nodes[0].since.clone().unwrap();
    sim.run(60);
    assert_eq!(sim.phase_of("node-a"), Done);
    assert!(since <= stamp(sim.world.now));
}

#[test]
fn a_label_that_cannot_be_restored_is_failed_and_retried_until_it_is() {
    let mut sim = Sim::new(
        &[("node-a", Some("iptables"), KernelDiffers)],
        spec(Backend::Nftables),
    );
    sim.run(1);
    sim.refuse_writes
        .insert("node-a".into(), "denied by admission".into());
    sim.run(3);
    assert_eq!(sim.phase_of("node-a"), Failed);
    assert!(sim.has_event(
        why::REVERT_FAILED,
        "its label cannot be restored to \"iptables\": denied by admission"
    ));
    assert_eq!(sim.label("node-a"), Some("nftables"));
    sim.refuse_writes.clear();
    sim.run(3);
    assert_eq!(sim.phase_of("node-a"), Reverted);
    assert_eq!(sim.label("node-a"), Some("iptables"));
    assert!(sim.status.nodes[0].label_restored);
}

#[test]
fn messages_stay_within_what_the_api_server_accepts_however_many_nodes_are_in_flight() {
    let mut spec = spec(Backend::Nftables);
    spec.max_parallel = 40;
    let names: Vec<String> = (0..40).map(|i| format!("node-with-a-long-name-{i:03}")).collect();
    let nodes: Vec<(&str, Option<&str>, Agent)> = names.iter().map(|n| (n.as_str(), None, Silent)).collect();
    let mut sim = Sim::new(&nodes, spec);
    sim.run(3);
    let status = &sim.status;
    assert_eq!(status.phase, Some(RolloutPhase::Progressing));
    let message = status.message.as_deref().unwrap();
    assert_eq!(
        message.chars().count(),
        super::step::MAX_MESSAGE,
        "cut, not dropped"
    );
    assert!(message.ends_with("..."));
    let progressing = sim.condition(PROGRESSING).unwrap();
    assert!(progressing.message.chars().count() <= super::step::MAX_MESSAGE);
}
