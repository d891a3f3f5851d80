//! The `ForwardingRollout`: moves the nodes it selects to a target backend a few at a time, each one
//! verified by its agent and reverted on its own when a gate fails. Written by users (spec) and the
//! controller (status, field manager `switchyard-controller`).
//!
//! ```text
//! spec (user): target, nodeSelector, maxParallel, bakeSeconds, gates, onFailure, paused, abort
//!    │  controller, leader only: rollout::step (pure) over spec, status, Nodes, each node's plan status
//!    ▼
//! Node label switchyard.io/backend (one node at a time) ─► the node's plan ─► its agent switches (make
//!    before break) and reports status.verification ─► the gates ─► Done, or the label restored
//!    ▼
//! status: planned (the spec it planned from), nodes [{name, phase, from, since, message}], conditions
//!         Progressing | Complete | Halted, counts, Events on the rollout
//! ```
//!
//! Only `paused` and `abort` may change once created: the CRD refuses other edits where the API server
//! can tell (transition rules), and the controller keeps planning from `status.planned` and says so
//! (condition `Progressing` with reason `SpecChangeRefused`, an Event) where it cannot.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::status::PlanCondition;

/// Moves a set of nodes to another backend, node by node, each step verified and reverted on failure.
// kube-derive's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "switchyard.io",
    version = "v1alpha2",
    kind = "ForwardingRollout",
    plural = "forwardingrollouts",
    singular = "forwardingrollout",
    shortname = "fwr",
    category = "switchyard",
    status = "ForwardingRolloutStatus",
    derive = "PartialEq",
    doc = "Moves the nodes it selects to a target backend a few at a time: the controller sets each node's \
           switchyard.io/backend label, its agent switches (new rules before the old ones go) and verifies, \
           and a node whose gate fails is reverted on its own. Only spec.paused and spec.abort may change \
           once created.",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.target.backend",
        description = "The backend the nodes move to"
    ),
    printcolumn(
        name = "Done",
        type_ = "string",
        json_path = ".status.progress",
        description = "Nodes done of the nodes selected"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Progressing, Paused, Complete or Halted"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = 1,
        description = "What the rollout does or why it stopped"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ForwardingRolloutSpec {
    /// Where the nodes go.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "target cannot change once the rollout exists; create another rollout"}]))]
    pub target: RolloutTarget,
    /// Which nodes (a label selector over Nodes); absent or empty: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "nodeSelector cannot change once the rollout exists"}]))]
    pub node_selector: Option<NodeSelector>,
    /// How many nodes switch or bake at once.
    #[serde(default = "default_max_parallel")]
    #[schemars(range(min = 1, max = 1000))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "maxParallel cannot change once the rollout exists"}]))]
    pub max_parallel: u32,
    /// How long a switched node must pass every gate before it is done (and the next one starts).
    #[serde(default = "default_bake_seconds")]
    #[schemars(range(max = 86400))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "bakeSeconds cannot change once the rollout exists"}]))]
    pub bake_seconds: u32,
    /// Which post-switch checks the controller holds each node to.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "gates cannot change once the rollout exists"}]))]
    pub gates: RolloutGates,
    /// What a failed gate does besides reverting its node: halt the rollout, or pause it until resumed.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "onFailure cannot change once the rollout exists"}]))]
    pub on_failure: OnFailure,
    /// No new node starts while true; nodes already switching or baking finish. After a failure with
    /// `onFailure: Pause`, set it true and then false to resume.
    #[serde(default)]
    pub paused: bool,
    /// Reverts the nodes switching or baking and halts the rollout (done nodes stay done).
    #[serde(default)]
    pub abort: bool,
}

fn default_max_parallel() -> u32 {
    1
}

fn default_bake_seconds() -> u32 {
    60
}

/// Where a rollout moves its nodes; an object so later targets (a plan generation, say) fit beside it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutTarget {
    /// The backend.
    pub backend: Backend,
}

/// A label selector over Nodes (Kubernetes' `LabelSelector` shape).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    /// Labels a node must have with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements a node's labels must meet, all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One requirement of a [`NodeSelector`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorRequirement {
    /// The label key.
    #[schemars(length(min = 1, max = 317))]
    pub key: String,
    /// How the key relates to the values.
    pub operator: SelectorOperator,
    /// For `In` and `NotIn` (non-empty); empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub values: Vec<String>,
}

/// Operators of a label selector requirement.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl NodeSelector {
    /// Whether a node with `labels` is selected (an empty selector selects every node).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self.match_expressions.iter().all(|req| {
                let value = labels.get(&req.key);
                match req.operator {
                    SelectorOperator::In => value.is_some_and(|v| req.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !req.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// The post-switch checks a node must pass, from the verification its agent reports
/// (`status.verification` of its plan). The pre-switch check (every frontend's verdict equal under the
/// old and the new backend's rendering) always runs: the agent refuses a switch that fails it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutGates {
    /// The plan is Applied with the target backend and no drift is repaired while it bakes.
    #[serde(default = "yes")]
    pub applied: bool,
    /// The kernel's rules agree with the plan for every frontend (`explain --kernel`'s comparison).
    #[serde(default = "yes")]
    pub kernel: bool,
    /// TCP connects from the node to a sample of its ClusterIP frontends with endpoints all succeed (the
    /// agent's `--verify-probes` sets the sample size).
    #[serde(default = "yes")]
    pub probes: bool,
    /// The node refuses no connection its plan does not refuse (a REJECT for a Service with endpoints,
    /// a DROP for one with local endpoints) while it bakes.
    #[serde(default = "yes")]
    pub refused_connections: bool,
    /// How long a node may take from its label change to a verified switch.
    #[serde(default = "default_switch_timeout")]
    #[schemars(range(min = 10, max = 3600))]
    pub switch_timeout_seconds: u32,
}

fn yes() -> bool {
    true
}

fn default_switch_timeout() -> u32 {
    120
}

impl Default for RolloutGates {
    fn default() -> Self {
        Self {
            applied: true,
            kernel: true,
            probes: true,
            refused_connections: true,
            switch_timeout_seconds: default_switch_timeout(),
        }
    }
}

/// What a failed gate does to the rollout (its node is reverted either way).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum OnFailure {
    /// Revert the node and halt: the rollout ends (create another to continue).
    #[default]
    RevertAndHalt,
    /// Revert the node and pause: no node starts until `paused` is set and cleared again.
    Pause,
}

/// The part of the spec a rollout plans from, fixed when it starts (`paused` and `abort` excluded).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedRollout {
    /// `spec.target`.
    pub target: RolloutTarget,
    /// `spec.nodeSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// `spec.maxParallel`.
    pub max_parallel: u32,
    /// `spec.bakeSeconds`.
    pub bake_seconds: u32,
    /// `spec.gates`.
    pub gates: RolloutGates,
    /// `spec.onFailure`.
    pub on_failure: OnFailure,
}

impl PlannedRollout {
    /// The plan of a spec.
    pub fn of(spec: &ForwardingRolloutSpec) -> Self {
        Self {
            target: spec.target.clone(),
            node_selector: spec.node_selector.clone(),
            max_parallel: spec.max_parallel.max(1),
            bake_seconds: spec.bake_seconds,
            gates: spec.gates.clone(),
            on_failure: spec.on_failure,
        }
    }
}

/// The rollout's state as a whole (a printer column).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Not planned yet.
    Pending,
    /// Nodes are moving.
    Progressing,
    /// No node starts (spec.paused, or a failure with onFailure Pause).
    Paused,
    /// Every selected node is done (or skipped).
    Complete,
    /// Stopped for good: a gate failed, it was aborted, or another rollout holds its nodes.
    Halted,
}

/// One node's step.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum NodePhase {
    /// Not started.
    Waiting,
    /// Its label says the target; waiting for its agent to switch and verify.
    Switching,
    /// Switched and verified; the gates hold it for `bakeSeconds`.
    Baking,
    /// Moved.
    Done,
    /// A gate failed (or the rollout was aborted): its label is back to what it was.
    Reverted,
    /// A gate failed and its label could not be restored.
    Failed,
    /// Not moved: the node left the cluster.
    Skipped,
}

impl NodePhase {
    /// Switching or baking: the node holds one of the rollout's parallel slots.
    pub fn in_flight(self) -> bool {
        matches!(self, Self::Switching | Self::Baking)
    }

    /// Nothing more happens to the node.
    pub fn finished(self) -> bool {
        matches!(self, Self::Done | Self::Reverted | Self::Failed | Self::Skipped)
    }
}

/// One node of a rollout.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutNode {
    /// The Node.
    #[schemars(length(max = 253))]
    pub name: String,
    /// Where it is.
    pub phase: NodePhase,
    /// Its `switchyard.io/backend` label before the rollout changed it (absent: there was none); a
    /// revert restores exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// When it entered this phase (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Reverted: its label is seen back at `from`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub label_restored: bool,
    /// While baking: the counters the gates compare against (what they were when it started baking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<GateBaseline>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What a node's counters were when it started baking.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateBaseline {
    /// `status.driftRepairs` of its plan.
    pub drift_repairs: u64,
    /// `status.verification.refused.unexpected` of its plan.
    pub unexpected_refusals: u64,
}

/// Where the rollout is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForwardingRolloutStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The spec it planned from (fixed at the start; later edits but `paused` and `abort` are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned: Option<PlannedRollout>,
    /// Pending, Progressing, Paused, Complete or Halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutPhase>,
    /// `done/total`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// What it does now, or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Nodes selected.
    #[serde(default)]
    pub total: u32,
    /// Nodes done.
    #[serde(default)]
    pub done: u32,
    /// Nodes reverted or failed.
    #[serde(default)]
    pub reverted: u32,
    /// Nodes skipped.
    #[serde(default)]
    pub skipped: u32,
    /// Set when a failure paused the rollout (`onFailure: Pause`): the generation then; it resumes at a
    /// later generation with `paused` false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at_generation: Option<i64>,
    /// Every selected node, in the order they move.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10000))]
    pub nodes: Vec<RolloutNode>,
    /// `Progressing`, `Complete` and `Halted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub conditions: Vec<PlanCondition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn requirement(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_node_selector_matches_as_kubernetes_label_selectors_do() {
        use SelectorOperator::{DoesNotExist, Exists, In, NotIn};
        let zone_a = labels(&[("zone", "a"), ("pool", "web")]);
        let zone_b = labels(&[("zone", "b")]);
        let bare = labels(&[]);
        type Case = (&'static str, NodeSelector, [bool; 3]);
        let cases: Vec<Case> = vec![
            ("empty selects all", NodeSelector::default(), [true, true, true]),
            (
                "matchLabels",
                NodeSelector {
                    match_labels: labels(&[("zone", "a")]),
                    ..NodeSelector::default()
                },
                [true, false, false],
            ),
            (
                "In",
                NodeSelector {
                    match_expressions: vec![requirement("zone", In, &["a", "b"])],
                    ..NodeSelector::default()
                },
                [true, true, false],
            ),
            (
                "NotIn matches an absent label",
                NodeSelector {
                    match_expressions: vec![requirement("zone", NotIn, &["a"])],
                    ..NodeSelector::default()
                },
                [false, true, true],
            ),
            (
                "Exists",
                NodeSelector {
                    match_expressions: vec![requirement("pool", Exists, &[])],
                    ..NodeSelector::default()
                },
                [true, false, false],
            ),
            (
                "DoesNotExist and matchLabels together",
                NodeSelector {
                    match_labels: labels(&[("zone", "b")]),
                    match_expressions: vec![requirement("pool", DoesNotExist, &[])],
                },
                [false, true, false],
            ),
        ];
        for (name, selector, want) in cases {
            let got = [&zone_a, &zone_b, &bare].map(|l| selector.matches(l));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_minimal_rollout_gets_the_documented_defaults() {
        let rollout: ForwardingRollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "switchyard.io/v1alpha2",
            "kind": "ForwardingRollout",
            "metadata": {"name": "to-nftables"},
            "spec": {"target": {"backend": "nftables"}}
        }))
        .unwrap();
        let spec = rollout.spec;
        assert_eq!(spec.target.backend, Backend::Nftables);
        assert_eq!((spec.max_parallel, spec.bake_seconds), (1, 60));
        assert_eq!(spec.gates, RolloutGates::default());
        assert_eq!(spec.on_failure, OnFailure::RevertAndHalt);
        assert!(!spec.paused && !spec.abort && spec.node_selector.is_none());
        let planned = PlannedRollout::of(&spec);
        assert_eq!(planned.gates.switch_timeout_seconds, 120);
    }
}
