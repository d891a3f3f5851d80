//! The API source's view of one node's plan objects, fed by watch events; pure, so every decision of
//! the source is tested without a server.
//!
//! ```text
//! watcher::Event ─► observe() ─► objects { name → Entry (Arc<spec>, uid, trigger, written_at) }
//!   Init / InitApply… / InitDone: a relist replaces the set whole (only at InitDone)
//!   Apply / Delete: one object
//! decide() ─► Wait (first list not done)            ─► nothing yet
//!          ─► Missing (no primary)                  ─► confirm with a GET (404: Deleted; found: a glitch)
//!          ─► WrongNode(why)                        ─► PlanUpdate::Invalid
//!          ─► Ready(set) | Incomplete(set, why)     ─► send (an incomplete set only after it settled)
//! ```
//!
//! Only objects named `<node>` (the primary) or `<node>.shard-<i>` count; anything else the label
//! selector lets through is ignored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use switchyard_api::names::{ANNOTATION_TRIGGER_TIME, CONTROLLER_FIELD_MANAGER};
use switchyard_api::{NodeForwardingPlan, NodeForwardingPlanSpec};

use super::{Origin, PlanSet};
use crate::sync::{Assembly, assemble};

/// One plan object, reduced to what the agent needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The spec.
    pub spec: Arc<NodeForwardingPlanSpec>,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// The trigger-time annotation.
    pub trigger_time: Option<SystemTime>,
    /// When its spec was last written (see [`written_at`]).
    pub written_at: Option<SystemTime>,
    /// The metadata kept for the cache: name, uid, labels, annotations, creation time, and the
    /// managedFields entries without their field sets.
    pub meta: ObjectMeta,
}

impl Entry {
    /// Reduces an object (consuming it: the spec is moved, not copied).
    pub fn from_object(object: NodeForwardingPlan) -> Self {
        let written_at = written_at(&object);
        let meta = object.metadata;
        let trigger_time = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map(SystemTime::from);
        let managed_fields = meta.managed_fields.map(|fields| {
            fields
                .into_iter()
                .map(|f| ManagedFieldsEntry { fields_v1: None, ..f })
                .collect()
        });
        Self {
            spec: Arc::new(object.spec),
            uid: meta.uid.clone(),
            trigger_time,
            written_at,
            meta: ObjectMeta {
                name: meta.name,
                uid: meta.uid,
                labels: meta.labels,
                annotations: meta.annotations,
                creation_timestamp: meta.creation_timestamp,
                managed_fields,
                ..ObjectMeta::default()
            },
        }
    }
}

/// When the plan's spec was last written, as honestly as the object tells: the `time` of the
/// `switchyard-controller` entry in `managedFields` (the API server moves it whenever that manager
/// changes a field it owns); without one, the latest entry of any manager that did not write
/// through a subresource (whoever last edited the spec by hand); without managedFields at all, the
/// creation time. Status writes never count.
pub fn written_at(object: &NodeForwardingPlan) -> Option<SystemTime> {
    let fields = object.metadata.managed_fields.as_deref().unwrap_or_default();
    let main = || {
        fields
            .iter()
            .filter(|f| f.subresource.as_deref().unwrap_or_default().is_empty())
    };
    let controller = main()
        .filter(|f| f.manager.as_deref() == Some(CONTROLLER_FIELD_MANAGER))
        .filter_map(|f| f.time.as_ref())
        .max();
    let any = || main().filter_map(|f| f.time.as_ref()).max();
    controller
        .or_else(any)
        .or(object.metadata.creation_timestamp.as_ref())
        .map(|t| SystemTime::from(t.0))
}

/// What the source should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The first list is not complete.
    Wait,
    /// The primary is not there: confirm with a GET before calling it deleted.
    Missing,
    /// The primary is for another node.
    WrongNode(String),
    /// A complete, consistent set.
    Ready(PlanSet),
    /// Not complete or not consistent (yet).
    Incomplete(PlanSet, String),
}

/// A node's plan objects as the watch shows them.
#[derive(Debug, Clone)]
pub struct Store {
    node: String,
    objects: BTreeMap<String, Entry>,
    relist: Option<BTreeMap<String, Entry>>,
    listed: bool,
}

impl Store {
    /// An empty store for `node`'s objects.
    pub fn new(node: &str) -> Self {
        Self {
            node: node.to_string(),
            objects: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }

    /// True for the names of this node's objects: `<node>` and `<node>.shard-<i>`.
    pub fn ours(&self, name: &str) -> bool {
        name == self.node
            || name
                .strip_prefix(&self.node)
                .and_then(|rest| rest.strip_prefix(".shard-"))
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    }

    /// Takes one watch event; true when the set may have changed (and the first list is done).
    pub fn observe(&mut self, event: watcher::Event<NodeForwardingPlan>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(object) => {
                if let Some((name, entry)) = self.entry(object) {
                    self.relist.get_or_insert_with(BTreeMap::new).insert(name, entry);
                }
                false
            }
            watcher::Event::InitDone => {
                self.objects = self.relist.take().unwrap_or_default();
                self.listed = true;
                true
            }
            watcher::Event::Apply(object) => {
                if let Some((name, entry)) = self.entry(object) {
                    self.objects.insert(name, entry);
                }
                self.listed
            }
            watcher::Event::Delete(object) => {
                let name = object.metadata.name.unwrap_or_default();
                self.objects.remove(&name).is_some() && self.listed
            }
        }
    }

    /// Adds an object found by a GET (after a watch said it was gone, and it was not).
    pub fn insert(&mut self, object: NodeForwardingPlan) {
        if let Some((name, entry)) = self.entry(object) {
            self.objects.insert(name, entry);
        }
    }

    fn entry(&self, object: NodeForwardingPlan) -> Option<(String, Entry)> {
        let name = object.metadata.name.clone()?;
        if !self.ours(&name) {
            tracing::debug!(plan = %name, "ignoring a plan object that is not this node's");
            return None;
        }
        Some((name, Entry::from_object(object)))
    }

    /// The objects by name.
    pub fn objects(&self) -> &BTreeMap<String, Entry> {
        &self.objects
    }

    /// What to do with the current objects.
    pub fn decide(&self) -> Decision {
        if !self.listed {
            return Decision::Wait;
        }
        let Some(primary) = self.objects.get(&self.node) else {
            return Decision::Missing;
        };
        if primary.spec.node_name != self.node {
            return Decision::WrongNode(format!(
                "plan {} is for node {:?}, this agent runs on {:?}",
                self.node, primary.spec.node_name, self.node
            ));
        }
        let entries: Vec<&Entry> = std::iter::once(primary)
            .chain(
                self.objects
                    .iter()
                    .filter(|(name, _)| **name != self.node)
                    .map(|(_, e)| e),
            )
            .collect();
        let set = PlanSet {
            objects: entries.iter().map(|e| Arc::clone(&e.spec)).collect(),
            metadata: entries.iter().map(|e| e.meta.clone()).collect(),
            origin: Origin::Api,
            uid: primary.uid.clone(),
            trigger_time: primary.trigger_time,
            written_at: primary.written_at,
        };
        match assemble(&set.objects) {
            Assembly::Ready(_) => Decision::Ready(set),
            Assembly::Incomplete(why) => Decision::Incomplete(set, why),
        }
    }

    /// A key that changes whenever something the agent applies changes (not on status writes).
    pub fn key(&self) -> Vec<(String, Option<String>, String)> {
        self.objects
            .iter()
            .map(|(name, e)| (name.clone(), e.uid.clone(), e.spec.revision.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use switchyard_api::ShardInfo;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn object(name: &str, spec: NodeForwardingPlanSpec) -> NodeForwardingPlan {
        let mut object = NodeForwardingPlan::new(name, spec);
        object.metadata.uid = Some(format!("uid-{name}"));
        object
    }

    fn spec(node: &str) -> NodeForwardingPlanSpec {
        plan(
            node,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        )
    }

    fn time(text: &str) -> Time {
        Time(text.parse().unwrap())
    }

    fn field(manager: &str, subresource: Option<&str>, at: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            subresource: subresource.map(str::to_string),
            time: Some(time(at)),
            operation: Some("Apply".into()),
            ..Default::default()
        }
    }

    #[test]
    fn written_at_prefers_the_controller_then_any_spec_writer_then_creation() {
        let at = |text: &str| SystemTime::from(text.parse::<Timestamp>().unwrap());
        let mut o = object("node-a", spec("node-a"));
        assert_eq!(written_at(&o), None);
        o.metadata.creation_timestamp = Some(time("2026-01-01T00:00:00Z"));
        assert_eq!(written_at(&o), Some(at("2026-01-01T00:00:00Z")));
        o.metadata.managed_fields = Some(vec![
            field("kubectl-edit", None, "2026-01-01T00:00:05Z"),
            field("switchyard-agent", Some("status"), "2026-01-01T00:00:09Z"),
        ]);
        assert_eq!(written_at(&o), Some(at("2026-01-01T00:00:05Z")));
        o.metadata.managed_fields.as_mut().unwrap().push(field(
            "switchyard-controller",
            None,
            "2026-01-01T00:00:03Z",
        ));
        assert_eq!(written_at(&o), Some(at("2026-01-01T00:00:03Z")));
    }

    #[test]
    fn only_this_nodes_objects_count() {
        let store = Store::new("node-a");
        assert!(store.ours("node-a"));
        assert!(store.ours("node-a.shard-3"));
        assert!(!store.ours("node-ab"));
        assert!(!store.ours("node-a.shard-"));
        assert!(!store.ours("node-a.shard-x"));
        assert!(!store.ours("node-b"));
    }

    #[test]
    fn nothing_is_decided_before_the_first_list_and_relists_replace_the_set() {
        let mut store = Store::new("node-a");
        assert!(!store.observe(watcher::Event::Apply(object("node-a", spec("node-a")))));
        assert_eq!(store.decide(), Decision::Wait);
        store.observe(watcher::Event::Init);
        store.observe(watcher::Event::InitApply(object("node-a", spec("node-a"))));
        store.observe(watcher::Event::InitApply(object("node-b", spec("node-b"))));
        assert_eq!(store.decide(), Decision::Wait);
        assert!(store.observe(watcher::Event::InitDone));
        let Decision::Ready(set) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert_eq!(set.uid.as_deref(), Some("uid-node-a"));
        assert_eq!(set.origin, Origin::Api);
        assert_eq!(store.objects().len(), 1, "node-b's plan is ignored");

        // A relist without the primary: Missing (the source confirms with a GET).
        store.observe(watcher::Event::Init);
        assert!(store.decide() != Decision::Missing, "not before InitDone");
        store.observe(watcher::Event::InitDone);
        assert_eq!(store.decide(), Decision::Missing);
        store.insert(object("node-a", spec("node-a")));
        assert!(matches!(store.decide(), Decision::Ready(_)));
        assert!(store.observe(watcher::Event::Delete(object("node-a", spec("node-a")))));
        assert_eq!(store.decide(), Decision::Missing);
    }

    #[test]
    fn shards_are_ready_only_when_consistent_and_the_trigger_comes_from_the_primary() {
        let mut shard = spec("node-a");
        shard.shard = Some(ShardInfo {
            index: 1,
            count: 2,
            members: vec![],
        });
        shard.revision = "rev-one".into();
        let mut primary = spec("node-a");
        primary.shard = Some(ShardInfo {
            index: 0,
            count: 2,
            members: vec!["rev-one".into()],
        });
        let mut primary_object = object("node-a", primary);
        primary_object.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_TRIGGER_TIME.to_string(),
            "2026-01-01T00:00:00.250Z".to_string(),
        )]));
        let mut store = Store::new("node-a");
        store.observe(watcher::Event::Init);
        store.observe(watcher::Event::InitApply(primary_object));
        store.observe(watcher::Event::InitDone);
        let Decision::Incomplete(set, why) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert!(why.contains("shard 1 of 2 is missing"), "{why}");
        assert_eq!(
            set.trigger_time,
            Some(SystemTime::from(
                "2026-01-01T00:00:00.250Z".parse::<Timestamp>().unwrap()
            ))
        );
        let before = store.key();
        store.observe(watcher::Event::Apply(object("node-a.shard-1", shard)));
        assert_ne!(store.key(), before);
        let Decision::Ready(set) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert_eq!(set.objects.len(), 2);
        assert_eq!(set.objects[0].shard.as_ref().unwrap().index, 0, "primary first");
    }

    #[test]
    fn a_primary_for_another_node_is_refused() {
        let mut store = Store::new("node-a");
        store.observe(watcher::Event::Init);
        store.observe(watcher::Event::InitApply(object("node-a", spec("node-b"))));
        store.observe(watcher::Event::InitDone);
        assert!(matches!(store.decide(), Decision::WrongNode(why) if why.contains("node-b")));
    }
}
