//! What the rollouts see of the cluster, fed by their own watches, and what they wrote that the
//! watches do not show yet. Pure: no client.
//!
//! ```text
//! watch events (trimmed: super::trim) ─► ObjectCache per kind: ForwardingRollouts, Nodes, plans
//!    (a relist swapped in whole; a version that does not decode keeps the last good one ─► broken)
//! the driver's writes ─► written statuses (by rollout) and labels (by node), each with the
//!    resourceVersion the API server answered ─► shown instead of the watched copy until the watch
//!    shows that version (or a later one)
//!    ─► rollouts()      every rollout, oldest first, its status as last written
//!    ─► world(now)      the Nodes' labels as last written, every plan's header and status
//!    ─► held_by_others  the nodes other rollouts still act on, and which
//! ```
//!
//! Why the written copies: the next step must start from the status the last step wrote. Stepping
//! from an older one the watch still shows would, for example, find a node's new label (written after
//! that status) and take the node for already done.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, runtime::watcher};
use switchyard_api::rollout::{ForwardingRolloutSpec, ForwardingRolloutStatus, NodePhase, RolloutPhase};
use switchyard_api::tolerant::Undecodable;
use switchyard_api::watch::map_event;
use switchyard_api::{ForwardingRollout, NodeForwardingPlan};

use super::trim::Delivered;
use crate::live::cache::{Applied, ObjectCache, cluster};
use crate::rollout::{NodeView, PlanView, RolloutView, World};

/// What the rollouts' watches deliver.
// Events are moved once through a channel; boxing each would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    /// ForwardingRollouts.
    Rollout(watcher::Event<Delivered<ForwardingRollout>>),
    /// Nodes (metadata only).
    Node(watcher::Event<Delivered<Node>>),
    /// Our plans (header and status).
    Plan(watcher::Event<Delivered<NodeForwardingPlan>>),
}

/// One rollout as the driver steps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.creationTimestamp` (rollouts are stepped oldest first).
    pub created: Option<Timestamp>,
    /// Its spec.
    pub spec: ForwardingRolloutSpec,
    /// Its status, as last written.
    pub status: ForwardingRolloutStatus,
}

impl Rollout {
    /// The pure step's view of it.
    pub fn view(&self) -> RolloutView<'_> {
        RolloutView {
            name: &self.name,
            generation: self.generation,
            spec: &self.spec,
            status: &self.status,
        }
    }

    /// Complete or Halted: no node starts or moves any more.
    pub fn ended(&self) -> bool {
        matches!(
            self.status.phase,
            Some(RolloutPhase::Complete | RolloutPhase::Halted)
        )
    }

    /// Nodes whose label it still restores (reverted or failed, not seen back yet).
    pub fn restoring(&self) -> impl Iterator<Item = &str> {
        self.status
            .nodes
            .iter()
            .filter(|n| matches!(n.phase, NodePhase::Reverted | NodePhase::Failed) && !n.label_restored)
            .map(|n| n.name.as_str())
    }

    /// Whether a step can change anything: it runs, it restores a label, or its spec changed since
    /// its last step (an edit is answered even after the end).
    pub fn live(&self) -> bool {
        !self.ended()
            || self.restoring().next().is_some()
            || self.status.observed_generation != self.generation
    }

    /// The object, for Events.
    pub fn reference(&self) -> ObjectReference {
        let dt = ();
        ObjectReference {
            api_version: Some(ForwardingRollout::api_version(&dt).into_owned()),
            kind: Some(ForwardingRollout::kind(&dt).into_owned()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

/// Something written, until the watch shows it.
#[derive(Debug, Clone, PartialEq)]
struct Written<T> {
    /// What the API server answered the write with.
    resource_version: Option<String>,
    value: T,
}

/// Whether a watched object at `watched` shows a write answered with `written`: the same version, or
/// (versions are etcd revisions in practice, though opaque by contract) a higher number. A version
/// that is not a number is shown only by the same version.
fn shows(watched: Option<&str>, written: Option<&str>) -> bool {
    match (watched, written) {
        (Some(watched), Some(written)) => {
            watched == written
                || matches!(
                    (watched.parse::<u64>(), written.parse::<u64>()),
                    (Ok(w), Ok(x)) if w >= x
                )
        }
        // An answer without a version cannot be matched: the watch's copy is taken at once.
        (_, None) => true,
        (None, Some(_)) => false,
    }
}

/// The rollouts' view of the cluster.
#[derive(Debug)]
pub struct Observed {
    label_key: String,
    rollouts: ObjectCache<ForwardingRollout>,
    nodes: ObjectCache<Node>,
    plans: ObjectCache<NodeForwardingPlan>,
    /// Statuses written by rollout name: (uid, status).
    statuses: BTreeMap<String, Written<(Option<String>, ForwardingRolloutStatus)>>,
    /// Backend labels written by node name (`None`: removed).
    labels: BTreeMap<String, Written<Option<String>>>,
    broken: Vec<Undecodable>,
}

impl Observed {
    /// Nothing seen yet; `label_key` is the Node label that decides a node's backend.
    pub fn new(label_key: String) -> Self {
        Self {
            label_key,
            rollouts: ObjectCache::new(cluster),
            nodes: ObjectCache::new(cluster),
            plans: ObjectCache::new(cluster),
            statuses: BTreeMap::new(),
            labels: BTreeMap::new(),
            broken: Vec::new(),
        }
    }

    /// Takes in one watch event; true when what a step sees may have changed.
    pub fn observe(&mut self, input: Input) -> bool {
        let (changed, broken) = match input {
            Input::Rollout(event) => seen(self.rollouts.apply(map_event(event, Delivered::into_result))),
            Input::Node(event) => seen(self.nodes.apply(map_event(event, Delivered::into_result))),
            Input::Plan(event) => seen(self.plans.apply(map_event(event, Delivered::into_result))),
        };
        if let Some(broken) = broken {
            self.broken.push(*broken);
        }
        self.settle();
        changed
    }

    /// Drops the written copies the watches show by now (or whose object is gone or replaced).
    fn settle(&mut self) {
        let rollouts = &self.rollouts;
        self.statuses.retain(|name, written| {
            rollouts.get(name).is_some_and(|watched| {
                watched.metadata.uid == written.value.0
                    && !shows(
                        watched.metadata.resource_version.as_deref(),
                        written.resource_version.as_deref(),
                    )
            })
        });
        let nodes = &self.nodes;
        self.labels.retain(|name, written| {
            nodes.get(name).is_some_and(|watched| {
                !shows(
                    watched.metadata.resource_version.as_deref(),
                    written.resource_version.as_deref(),
                )
            })
        });
    }

    /// Every watch has listed once: until then a step would see a cluster without Nodes.
    pub fn synced(&self) -> bool {
        self.rollouts.synced() && self.nodes.synced() && self.plans.synced()
    }

    /// The objects whose latest version did not decode since the last call, each once per breakage.
    pub fn take_broken(&mut self) -> Vec<Undecodable> {
        std::mem::take(&mut self.broken)
    }

    /// A status the driver wrote, with the resourceVersion the API server answered.
    pub fn wrote_status(
        &mut self,
        rollout: &Rollout,
        resource_version: Option<String>,
        status: ForwardingRolloutStatus,
    ) {
        self.statuses.insert(
            rollout.name.clone(),
            Written {
                resource_version,
                value: (rollout.uid.clone(), status),
            },
        );
        self.settle();
    }

    /// A backend label the driver wrote (`None`: removed).
    pub fn wrote_label(&mut self, node: &str, value: Option<String>, resource_version: Option<String>) {
        self.labels.insert(
            node.to_owned(),
            Written {
                resource_version,
                value,
            },
        );
        self.settle();
    }

    /// Forgets what this replica wrote (it no longer leads: what it wrote may be overwritten by the
    /// next leader, whose writes only the watches show).
    pub fn forget_writes(&mut self) {
        self.statuses.clear();
        self.labels.clear();
    }

    /// Every rollout, oldest first (then by name), with its status as last written; those being
    /// deleted are left out.
    pub fn rollouts(&self) -> Vec<Rollout> {
        let mut all: Vec<Rollout> = self
            .rollouts
            .values()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
            .filter_map(|r| {
                let name = r.metadata.name.clone()?;
                let status = match self.statuses.get(&name) {
                    Some(written) if written.value.0 == r.metadata.uid => written.value.1.clone(),
                    _ => r.status.clone().unwrap_or_default(),
                };
                Some(Rollout {
                    uid: r.metadata.uid.clone(),
                    generation: r.metadata.generation,
                    created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    spec: r.spec.clone(),
                    status,
                    name,
                })
            })
            .collect();
        all.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
        all
    }

    /// The cluster at `now`, as a step sees it (no node held, no write failed: the driver fills those
    /// per rollout).
    pub fn world(&self, now: Timestamp) -> World {
        let nodes = self
            .nodes
            .values()
            .filter_map(|node| {
                let name = node.metadata.name.clone()?;
                let mut labels = node.metadata.labels.clone().unwrap_or_default();
                if let Some(written) = self.labels.get(&name) {
                    match &written.value {
                        Some(value) => labels.insert(self.label_key.clone(), value.clone()),
                        None => labels.remove(&self.label_key),
                    };
                }
                Some((name, NodeView { labels }))
            })
            .collect();
        let plans = self
            .plans
            .values()
            .map(|plan| {
                (
                    plan.spec.node_name.clone(),
                    PlanView {
                        backend: plan.spec.backend,
                        revision: plan.spec.revision.clone(),
                        status: plan.status.clone(),
                    },
                )
            })
            .collect();
        World {
            now,
            label_key: self.label_key.clone(),
            nodes,
            plans,
            held: BTreeMap::new(),
            write_errors: BTreeMap::new(),
        }
    }
}

/// The nodes rollouts other than `name` still act on, and which rollout: every node of one that has
/// planned and not ended, and the nodes an ended one still restores (two rollouts writing one label
/// would fight).
pub fn held_by_others(rollouts: &[Rollout], name: &str) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for other in rollouts.iter().filter(|r| r.name != name) {
        let nodes: Vec<&str> = if other.ended() {
            other.restoring().collect()
        } else {
            other
                .status
                .nodes
                .iter()
                .filter(|n| n.phase != NodePhase::Skipped)
                .map(|n| n.name.as_str())
                .collect()
        };
        for node in nodes {
            held.entry(node.to_owned()).or_insert_with(|| other.name.clone());
        }
    }
    held
}

/// What one event did, to the rollouts: whether a step may see something new, and the object that
/// broke (first seen so), if one did.
fn seen<K>(applied: Applied<K>) -> (bool, Option<Box<Undecodable>>) {
    match applied {
        Applied::Nothing => (false, None),
        Applied::Kept { undecodable, fresh } => (false, fresh.then_some(undecodable)),
        Applied::One { .. } | Applied::Relisted { .. } => (true, None),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use switchyard_api::rollout::{RolloutNode, RolloutTarget};
    use switchyard_api::{Backend, ForwardingRolloutSpec};

    use super::*;

    const KEY: &str = "switchyard.io/backend";

    fn node(name: &str, version: &str, label: Option<&str>) -> Delivered<Node> {
        let labels = label.map(|l| BTreeMap::from([(KEY.to_owned(), l.to_owned())]));
        Delivered::Decoded(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                labels,
                ..ObjectMeta::default()
            },
            ..Node::default()
        })
    }

    fn rollout(
        name: &str,
        version: &str,
        created: i64,
        status: ForwardingRolloutStatus,
    ) -> Delivered<ForwardingRollout> {
        let mut object = ForwardingRollout::new(
            name,
            ForwardingRolloutSpec {
                target: RolloutTarget {
                    backend: Backend::Nftables,
                },
                node_selector: None,
                max_parallel: 1,
                bake_seconds: 60,
                gates: Default::default(),
                on_failure: Default::default(),
                paused: false,
                abort: false,
            },
        );
        object.metadata.uid = Some(format!("uid-{name}"));
        object.metadata.resource_version = Some(version.into());
        object.metadata.generation = Some(1);
        object.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        object.status = Some(status);
        Delivered::Decoded(object)
    }

    fn listed(observed: &mut Observed) {
        for input in [
            Input::Rollout(watcher::Event::InitDone),
            Input::Node(watcher::Event::InitDone),
            Input::Plan(watcher::Event::InitDone),
        ] {
            observed.observe(input);
        }
    }

    fn status(phase: RolloutPhase, nodes: &[(&str, NodePhase)]) -> ForwardingRolloutStatus {
        ForwardingRolloutStatus {
            phase: Some(phase),
            nodes: nodes
                .iter()
                .map(|(name, phase)| RolloutNode {
                    name: (*name).into(),
                    phase: *phase,
                    from: None,
                    since: None,
                    message: None,
                    label_restored: false,
                    baseline: None,
                })
                .collect(),
            ..ForwardingRolloutStatus::default()
        }
    }

    #[test]
    fn not_synced_until_every_watch_listed() {
        let mut observed = Observed::new(KEY.into());
        observed.observe(Input::Node(watcher::Event::InitDone));
        observed.observe(Input::Rollout(watcher::Event::InitDone));
        assert!(!observed.synced());
        observed.observe(Input::Plan(watcher::Event::InitDone));
        assert!(observed.synced());
    }

    #[test]
    fn a_written_status_is_shown_until_the_watch_reaches_its_version() {
        let mut observed = Observed::new(KEY.into());
        listed(&mut observed);
        observed.observe(Input::Rollout(watcher::Event::Apply(rollout(
            "r",
            "10",
            1,
            ForwardingRolloutStatus::default(),
        ))));
        let r = observed.rollouts().remove(0);
        let planned = status(RolloutPhase::Progressing, &[("node-a", NodePhase::Switching)]);
        observed.wrote_status(&r, Some("12".into()), planned.clone());
        assert_eq!(observed.rollouts()[0].status, planned);
        // A late event of an older version does not take the written status back ...
        observed.observe(Input::Rollout(watcher::Event::Apply(rollout(
            "r",
            "11",
            1,
            ForwardingRolloutStatus::default(),
        ))));
        assert_eq!(observed.rollouts()[0].status, planned);
        // ... the written version (or a later one) does: from then on the watch is the truth.
        let later = status(RolloutPhase::Progressing, &[("node-a", NodePhase::Baking)]);
        observed.observe(Input::Rollout(watcher::Event::Apply(rollout(
            "r",
            "13",
            1,
            later.clone(),
        ))));
        assert_eq!(observed.rollouts()[0].status, later);
    }

    #[test]
    fn a_written_label_is_seen_in_the_world_until_the_watch_shows_it() {
        let mut observed = Observed::new(KEY.into());
        observed.observe(Input::Node(watcher::Event::Apply(node("node-a", "5", None))));
        let now = Timestamp::from_second(1_796_000_000).unwrap();
        observed.wrote_label("node-a", Some("nftables".into()), Some("6".into()));
        assert_eq!(observed.world(now).label("node-a"), Some("nftables"));
        observed.observe(Input::Node(watcher::Event::Apply(node(
            "node-a",
            "6",
            Some("nftables"),
        ))));
        // Someone else changes it afterwards: the watch is the truth again.
        observed.observe(Input::Node(watcher::Event::Apply(node(
            "node-a",
            "7",
            Some("ipvs"),
        ))));
        assert_eq!(observed.world(now).label("node-a"), Some("ipvs"));
        // A removal written shows as no label.
        observed.wrote_label("node-a", None, Some("8".into()));
        assert_eq!(observed.world(now).label("node-a"), None);
        observed.forget_writes();
        assert_eq!(observed.world(now).label("node-a"), Some("ipvs"));
    }

    #[test]
    fn rollouts_come_oldest_first_and_hold_the_nodes_they_act_on() {
        let mut observed = Observed::new(KEY.into());
        listed(&mut observed);
        let running = status(
            RolloutPhase::Progressing,
            &[
                ("node-a", NodePhase::Done),
                ("node-b", NodePhase::Switching),
                ("node-c", NodePhase::Skipped),
            ],
        );
        let mut halted = status(
            RolloutPhase::Halted,
            &[("node-d", NodePhase::Reverted), ("node-e", NodePhase::Reverted)],
        );
        halted.nodes[1].label_restored = true;
        for (name, created, status) in [
            ("young", 30, ForwardingRolloutStatus::default()),
            ("old", 10, running),
            ("halted", 20, halted),
        ] {
            observed.observe(Input::Rollout(watcher::Event::Apply(rollout(
                name, "1", created, status,
            ))));
        }
        let rollouts = observed.rollouts();
        let names: Vec<&str> = rollouts.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["old", "halted", "young"]);
        let held = held_by_others(&rollouts, "young");
        assert_eq!(
            held,
            BTreeMap::from([
                ("node-a".to_owned(), "old".to_owned()),
                ("node-b".to_owned(), "old".to_owned()),
                ("node-d".to_owned(), "halted".to_owned()),
            ])
        );
        assert!(held_by_others(&rollouts, "old").contains_key("node-d"));
        assert!(!held_by_others(&rollouts, "old").contains_key("node-a"));
        assert!(
            rollouts[1].live(),
            "a halted rollout still restoring a label is stepped"
        );
    }

    #[test]
    fn a_rollout_that_does_not_decode_keeps_its_last_good_version_and_is_reported_once() {
        let mut observed = Observed::new(KEY.into());
        listed(&mut observed);
        observed.observe(Input::Rollout(watcher::Event::Apply(rollout(
            "r",
            "1",
            1,
            ForwardingRolloutStatus::default(),
        ))));
        let broken = || {
            serde_json::from_value::<Delivered<ForwardingRollout>>(serde_json::json!({
                "apiVersion": "switchyard.io/v1alpha2", "kind": "ForwardingRollout",
                "metadata": {"name": "r", "resourceVersion": "2"},
                "spec": {"target": {"backend": "bpf"}},
            }))
            .unwrap()
        };
        observed.observe(Input::Rollout(watcher::Event::Apply(broken())));
        observed.observe(Input::Rollout(watcher::Event::Apply(broken())));
        let reported = observed.take_broken();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert!(
            reported[0].path.starts_with("spec.target"),
            "{}",
            reported[0].path
        );
        assert_eq!(observed.rollouts()[0].spec.target.backend, Backend::Nftables);
    }

    #[test]
    fn versions_are_compared_as_numbers_when_they_are() {
        assert!(shows(Some("12"), Some("12")));
        assert!(shows(Some("13"), Some("12")));
        assert!(!shows(Some("11"), Some("12")));
        assert!(!shows(Some("abc"), Some("abd")));
        assert!(shows(Some("11"), None));
        assert!(!shows(None, Some("1")));
    }
}
