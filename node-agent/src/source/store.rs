//! The API source's view of one node's plan and its views' slices, fed by watch events; pure, so every
//! decision of the source is tested without a server.
//!
//! ```text
//! plan watch  ─► observe_plan()  ─► plan   { name → Entry }   (only the object named after the node)
//! slice watch ─► observe_slice() ─► slices { name → Entry }   (the views the watch selects)
//!   (both decoded tolerantly: a version that does not decode leaves the last good Entry in place and
//!    is remembered as unreadable, through relists too, until a good version or a delete)
//!   Init / InitApply… / InitDone: a relist replaces the set whole (only at InitDone)
//!   Apply / Delete: one object
//! decide() ─► Wait (a first list not done, or the slice watch not yet on the plan's views) ─► nothing yet
//!          ─► Unreadable(why) (the plan does not decode) ─► PlanUpdate::Invalid (InvalidPlan; rules stay)
//!          ─► Missing (no plan)                         ─► confirm with a GET (404: Deleted; found: a glitch)
//!          ─► WrongNode(why)                            ─► PlanUpdate::Invalid
//!          ─► Ready(set) | Incomplete(set, why)         ─► send (an incomplete set only after it settled;
//!                                                          unreadable slices in set.unreadable: InvalidSlice)
//! ```
//!
//! A view is incomplete while its slices are being rewritten (a view doubling its slice count) or when a
//! slice is missing; the agent never programs from an incomplete view, and only reports it once it has
//! stayed incomplete for the settle time.
//!
//! A Service slice deleted while the packed slice it shadows still holds another copy of its Service
//! (the controller deletes one only after writing its entries into the packed slice: this is someone
//! else's delete, or a relist that no longer finds it) stays in use as a *ghost*, so the packed copy's
//! older entries are never programmed: until a slice of that name appears again or the packed slice is
//! written anew. Its name and revision stay in the reported slices digest, so `audit` shows the node
//! behind, and the agent logs it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, runtime::watcher};
use serde_json::{Map, Value};
use switchyard_api::compose::{SliceRef, incomplete};
use switchyard_api::names::ANNOTATION_TRIGGER_TIME;
use switchyard_api::tolerant::{Prune, Tolerant, Undecodable};
use switchyard_api::validate::valid_view_id;
use switchyard_api::watch::map_event;
use switchyard_api::{
    ForwardingSlice, ForwardingSliceSpec, NodeForwardingPlan, NodeForwardingPlanSpec, ServiceFailure,
    ServicePlan,
};

use super::{Origin, PlanSet};

/// A plan or slice as the agent's watches deliver it: decoded, or what is known of it and why not.
pub type Delivered<K> = Tolerant<K, Unread>;

/// What the agent never reads of what it watches: its plan's status (it writes it; the watch only
/// echoes it back), so an odd value there cannot make its plan unreadable.
#[derive(Debug, Clone, Copy)]
pub struct Unread;

impl Prune<NodeForwardingPlan> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        object.remove("status");
    }
}

impl Prune<ForwardingSlice> for Unread {
    fn prune(_: &mut Map<String, Value>) {}
}

/// One watched object, reduced.
// Moved once from the watch event into the listing; boxing the entry would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Item<S> {
    /// Decoded.
    Entry(Entry<S>),
    /// Its latest version does not decode.
    Unreadable(Box<Undecodable>),
    /// Not ours (another node's plan).
    Ignored,
}

/// One object (plan or slice), reduced to what the agent needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<S> {
    /// The spec.
    pub spec: Arc<S>,
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

impl<S> Entry<S> {
    /// Reduces an object's metadata and spec (moved, not copied).
    pub fn new(meta: ObjectMeta, spec: S) -> Self {
        let written_at = switchyard_api::meta::written_at(&meta).map(SystemTime::from);
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
            spec: Arc::new(spec),
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

/// When the plan's spec was last written (see [`switchyard_api::meta::written_at`]).
pub fn written_at(object: &NodeForwardingPlan) -> Option<SystemTime> {
    switchyard_api::meta::written_at(&object.metadata).map(SystemTime::from)
}

/// Objects of one kind as a watch shows them.
#[derive(Debug, Clone)]
struct Listing<S> {
    objects: BTreeMap<String, Entry<S>>,
    /// Names whose latest version does not decode; their last good entry, if any, stays in `objects`.
    unreadable: BTreeMap<String, Box<Undecodable>>,
    relist: Option<Generation<S>>,
    listed: bool,
}

/// A relist being buffered: its entries and unreadable names.
type Generation<S> = (BTreeMap<String, Entry<S>>, BTreeMap<String, Box<Undecodable>>);

impl<S> Default for Listing<S> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<S: Clone> Listing<S> {
    /// Takes one event (already reduced to name and item); true when the set may have changed and the
    /// first list is done.
    fn observe(&mut self, event: watcher::Event<(String, Item<S>)>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relist = Some(Generation::default());
                false
            }
            watcher::Event::InitApply((name, item)) => {
                // An unreadable object is carried into the new set with its last good entry: a relist
                // never takes it for deleted.
                let last_good = match &item {
                    Item::Unreadable(_) => self.objects.get(&name).cloned(),
                    Item::Entry(_) | Item::Ignored => None,
                };
                let (objects, unreadable) = self.relist.get_or_insert_with(Generation::default);
                match item {
                    Item::Entry(entry) => {
                        objects.insert(name, entry);
                    }
                    Item::Unreadable(undecodable) => {
                        if let Some(entry) = last_good {
                            objects.insert(name.clone(), entry);
                        }
                        unreadable.insert(name, undecodable);
                    }
                    Item::Ignored => {}
                }
                false
            }
            watcher::Event::InitDone => {
                (self.objects, self.unreadable) = self.relist.take().unwrap_or_default();
                self.listed = true;
                true
            }
            watcher::Event::Apply((name, item)) => self.put(name, item) && self.listed,
            watcher::Event::Delete((name, _)) => {
                let gone = self.objects.remove(&name).is_some();
                (self.unreadable.remove(&name).is_some() || gone) && self.listed
            }
        }
    }

    /// One object's latest version; true when something changed.
    fn put(&mut self, name: String, item: Item<S>) -> bool {
        match item {
            Item::Entry(entry) => {
                self.unreadable.remove(&name);
                self.objects.insert(name, entry);
                true
            }
            Item::Unreadable(undecodable) => {
                self.unreadable.insert(name, undecodable);
                true
            }
            Item::Ignored => false,
        }
    }
}

/// A plan watch event's object, reduced to what the agent keeps: only the plan named after `node`.
fn plan_item(node: &str, object: Delivered<NodeForwardingPlan>) -> (String, Item<NodeForwardingPlanSpec>) {
    let name = object.meta().name.clone().unwrap_or_default();
    if name != node {
        tracing::debug!(plan = %name, "ignoring a plan object that is not this node's");
        return (name, Item::Ignored);
    }
    match object.into_result() {
        Ok(object) => {
            let mut spec = object.spec;
            spec.shrink_to_fit();
            // A /0 source range allows every source, as kube-proxy reads it (see the API's
            // `open_zero_source_ranges`).
            spec.open_zero_source_ranges();
            (name, Item::Entry(Entry::new(object.metadata, spec)))
        }
        Err(undecodable) => {
            tracing::warn!(%undecodable, "this node's plan cannot be read; its rules stay");
            (name, Item::Unreadable(undecodable))
        }
    }
}

/// A slice watch event's object, reduced to what the agent keeps.
fn slice_item(object: Delivered<ForwardingSlice>) -> (String, Item<ForwardingSliceSpec>) {
    let name = object.meta().name.clone().unwrap_or_default();
    match object.into_result() {
        Ok(object) => {
            let mut spec = object.spec;
            spec.shrink_to_fit();
            spec.open_zero_source_ranges();
            (name, Item::Entry(Entry::new(object.metadata, spec)))
        }
        Err(undecodable) => {
            tracing::warn!(%undecodable, "a slice cannot be read; its last good copy (if any) stays in use");
            (name, Item::Unreadable(undecodable))
        }
    }
}

/// What the source should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A first list is not complete, or the slice watch does not follow the plan's views yet.
    Wait,
    /// The plan is not there: confirm with a GET before calling it deleted.
    Missing,
    /// The plan is for another node, or names views no label selector can carry.
    WrongNode(String),
    /// The plan's latest version does not decode (its last good rules stay).
    Unreadable(String),
    /// The plan and every slice of its views.
    Ready(PlanSet),
    /// The plan's views are not complete (yet).
    Incomplete(PlanSet, String),
}

/// A node's plan and its views' slices as the watches show them.
#[derive(Debug, Clone)]
pub struct Store {
    node: String,
    plan: Listing<NodeForwardingPlanSpec>,
    slices: Listing<ForwardingSliceSpec>,
    /// The views the slice watch selects (`None`: no slice watch yet).
    watched_views: Option<Vec<String>>,
    /// Deleted Service slices still in use: name → (the slice, the packed copy of its Service then).
    ghosts: BTreeMap<String, (Entry<ForwardingSliceSpec>, Vec<Arc<ServicePlan>>)>,
}

impl Store {
    /// An empty store for `node`'s objects.
    pub fn new(node: &str) -> Self {
        Self {
            node: node.to_string(),
            plan: Listing::default(),
            slices: Listing::default(),
            watched_views: None,
            ghosts: BTreeMap::new(),
        }
    }

    /// True for the name of this node's plan.
    pub fn ours(&self, name: &str) -> bool {
        name == self.node
    }

    /// Takes one plan watch event; true when the state may have changed (and the first list is done).
    pub fn observe_plan(&mut self, event: watcher::Event<Delivered<NodeForwardingPlan>>) -> bool {
        let node = self.node.clone();
        self.plan
            .observe(map_event(event, |object| plan_item(&node, object)))
    }

    /// Takes one slice watch event; true when the state may have changed.
    pub fn observe_slice(&mut self, event: watcher::Event<Delivered<ForwardingSlice>>) -> bool {
        let before: Vec<(String, Entry<ForwardingSliceSpec>)> = match &event {
            watcher::Event::Delete(object) => object
                .meta()
                .name
                .as_ref()
                .and_then(|name| self.slices.objects.get(name).map(|e| (name.clone(), e.clone())))
                .into_iter()
                .collect(),
            watcher::Event::InitDone => self
                .slices
                .objects
                .iter()
                .map(|(name, e)| (name.clone(), e.clone()))
                .collect(),
            _ => Vec::new(),
        };
        let relisted = matches!(event, watcher::Event::InitDone);
        let old: BTreeMap<String, Entry<ForwardingSliceSpec>> = if relisted {
            before.iter().cloned().collect()
        } else {
            BTreeMap::new()
        };
        let changed = self.slices.observe(map_event(event, slice_item));
        for (name, entry) in before {
            let Some(service) = entry.spec.service.as_deref() else {
                continue;
            };
            if self.slices.objects.contains_key(&name) {
                continue;
            }
            let copy = packed_copy(&self.slices.objects, &entry.spec.view, service);
            let mut last: Vec<Arc<ServicePlan>> = entry.spec.entries.clone();
            last.sort_by(|a, b| a.key().cmp(&b.key()));
            // After a relist the delete may have been a fold missed while the watch was down: then
            // the packed copy changed meanwhile, and it is the newer one.
            if copy == last || (relisted && packed_copy(&old, &entry.spec.view, service) != copy) {
                continue;
            }
            tracing::warn!(
                slice = %name,
                "a Service slice was deleted while the packed slices of its view hold another copy of \
                 its Service: its last entries stay in use until it is written again or that copy changes"
            );
            self.ghosts.insert(name, (entry, copy));
        }
        // A ghost ends when its name is back or the packed copy it shadowed was written anew.
        let objects = &self.slices.objects;
        self.ghosts.retain(|name, (ghost, copy)| {
            let service = ghost.spec.service.as_deref().unwrap_or_default();
            !objects.contains_key(name) && packed_copy(objects, &ghost.spec.view, service) == *copy
        });
        changed
    }

    /// Names of the deleted Service slices still in use (see the module doc).
    pub fn ghosts(&self) -> impl Iterator<Item = &String> {
        self.ghosts.keys()
    }

    /// Adds the plan found by a GET (after a watch said it was gone, and it was not).
    pub fn insert(&mut self, object: Delivered<NodeForwardingPlan>) {
        let (name, item) = plan_item(&self.node, object);
        self.plan.put(name, item);
    }

    /// The views the plan asks for, once known (`None` as well when one is not a view id: no selector
    /// can be built from it, and `decide` refuses the plan).
    pub fn plan_views(&self) -> Option<&[String]> {
        self.plan
            .objects
            .get(&self.node)
            .map(|e| e.spec.views.as_slice())
            .filter(|views| views.iter().all(|v| valid_view_id(v)))
    }

    /// The views the slice watch selects.
    pub fn watched_views(&self) -> Option<&[String]> {
        self.watched_views.as_deref()
    }

    /// A slice watch for `views` starts: its slices replace the old watch's once listed.
    pub fn watch_slices(&mut self, views: Vec<String>) {
        self.slices = Listing::default();
        self.ghosts.clear();
        self.watched_views = Some(views);
    }

    /// The plan's and slices' entries, for tests and the cache.
    pub fn slice_names(&self) -> impl Iterator<Item = &String> {
        self.slices.objects.keys()
    }

    /// What to do with the current objects.
    pub fn decide(&self) -> Decision {
        if !self.plan.listed {
            return Decision::Wait;
        }
        if let Some(undecodable) = self.plan.unreadable.get(&self.node) {
            return Decision::Unreadable(undecodable.to_string());
        }
        let Some(plan) = self.plan.objects.get(&self.node) else {
            return Decision::Missing;
        };
        if plan.spec.node_name != self.node {
            return Decision::WrongNode(format!(
                "plan {} is for node {:?}, this agent runs on {:?}",
                self.node, plan.spec.node_name, self.node
            ));
        }
        let views = &plan.spec.views;
        if let Some(bad) = views.iter().find(|v| !valid_view_id(v)) {
            return Decision::WrongNode(format!(
                "plan {} names the view {bad:?}, which is not a view id (all, unzoned, zone-…, node-…)",
                self.node
            ));
        }
        if !views.is_empty() && (self.watched_views.as_ref() != Some(views) || !self.slices.listed) {
            return Decision::Wait;
        }
        let slices: Vec<(&String, &Entry<ForwardingSliceSpec>)> = self
            .slices
            .objects
            .iter()
            .chain(self.ghosts.iter().map(|(name, (e, _))| (name, e)))
            .filter(|(_, e)| views.contains(&e.spec.view))
            .collect();
        let newest = |a: Option<SystemTime>, b: Option<SystemTime>| a.max(b);
        let set = PlanSet {
            plan: Arc::clone(&plan.spec),
            slices: slices
                .iter()
                .map(|(n, e)| ((*n).clone(), Arc::clone(&e.spec)))
                .collect(),
            plan_meta: plan.meta.clone(),
            slice_meta: slices.iter().map(|(_, e)| e.meta.clone()).collect(),
            origin: Origin::Api,
            uid: plan.uid.clone(),
            trigger_time: slices
                .iter()
                .map(|(_, e)| e.trigger_time)
                .fold(plan.trigger_time, newest),
            written_at: slices
                .iter()
                .map(|(_, e)| e.written_at)
                .fold(plan.written_at, newest),
            unreadable: self.unreadable_slices(),
        };
        let refs: Vec<SliceRef<'_>> = set
            .slices
            .iter()
            .map(|(name, spec)| SliceRef { name, spec })
            .collect();
        match incomplete(&set.plan, &refs) {
            Some(why) => Decision::Incomplete(set, why),
            None => Decision::Ready(set),
        }
    }

    /// The slices whose latest version does not decode, as status failures (`InvalidSlice`): what is
    /// wrong, and whether their last good copy stands in.
    fn unreadable_slices(&self) -> Vec<ServiceFailure> {
        self.slices
            .unreadable
            .iter()
            .map(|(name, undecodable)| {
                let stand_in = match self.slices.objects.get(name) {
                    Some(good) => format!("its last good revision {} stays in use", good.spec.revision),
                    None => "nothing from it is applied".to_string(),
                };
                ServiceFailure {
                    service: format!("ForwardingSlice {name}"),
                    reason: format!(
                        "cannot be read: {}: {}; {stand_in}",
                        undecodable.path, undecodable.message
                    ),
                }
            })
            .collect()
    }

    /// A key that changes whenever something the agent applies changes (not on status writes), or an
    /// object becomes readable or unreadable.
    // Ghosts only appear or go with a slice event that changes the objects' key as well.
    pub fn key(&self) -> Vec<(String, Option<String>, String)> {
        let unreadable = self.plan.unreadable.iter().chain(&self.slices.unreadable);
        self.plan
            .objects
            .iter()
            .map(|(name, e)| (name.clone(), e.uid.clone(), e.spec.revision.clone()))
            .chain(
                self.slices
                    .objects
                    .iter()
                    .map(|(name, e)| (name.clone(), e.uid.clone(), e.spec.revision.clone())),
            )
            .chain(unreadable.map(|(name, u)| {
                (
                    name.clone(),
                    None,
                    format!("unreadable {}: {}", u.path, u.message),
                )
            }))
            .collect()
    }
}

/// The entries of `service` in the packed slices of `view`, sorted by key.
fn packed_copy(
    objects: &BTreeMap<String, Entry<ForwardingSliceSpec>>,
    view: &str,
    service: &str,
) -> Vec<Arc<ServicePlan>> {
    let mut copy: Vec<Arc<ServicePlan>> = objects
        .values()
        .filter(|e| e.spec.service.is_none() && e.spec.view == view)
        .flat_map(|e| {
            e.spec
                .entries
                .iter()
                .filter(|x| x.service_key() == service)
                .cloned()
        })
        .collect();
    copy.sort_by(|a, b| a.key().cmp(&b.key()));
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use switchyard_api::testing::{EntryExt, entry, ep, live_plan, plan, slice};

    fn object(name: &str, spec: NodeForwardingPlanSpec) -> NodeForwardingPlan {
        let mut object = NodeForwardingPlan::new(name, spec);
        object.metadata.uid = Some(format!("uid-{name}"));
        object
    }

    fn slice_object(view: &str, index: u32, count: u32) -> ForwardingSlice {
        let (name, spec) = slice(
            view,
            index,
            count,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        ForwardingSlice::new(&name, spec)
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
    fn nothing_is_decided_before_the_first_list_and_relists_replace_the_set() {
        let mut store = Store::new("node-a");
        assert!(!store.observe_plan(watcher::Event::Apply(object("node-a", spec("node-a")).into())));
        assert_eq!(store.decide(), Decision::Wait);
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(object("node-a", spec("node-a")).into()));
        store.observe_plan(watcher::Event::InitApply(object("node-b", spec("node-b")).into()));
        assert_eq!(store.decide(), Decision::Wait);
        assert!(store.observe_plan(watcher::Event::InitDone));
        let Decision::Ready(set) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert_eq!(set.uid.as_deref(), Some("uid-node-a"));
        assert_eq!(set.origin, Origin::Api);
        assert!(set.slices.is_empty(), "a self-contained plan needs no slices");

        // A relist without the plan: Missing (the source confirms with a GET).
        store.observe_plan(watcher::Event::Init);
        assert!(store.decide() != Decision::Missing, "not before InitDone");
        store.observe_plan(watcher::Event::InitDone);
        assert_eq!(store.decide(), Decision::Missing);
        store.insert(object("node-a", spec("node-a")).into());
        assert!(matches!(store.decide(), Decision::Ready(_)));
        assert!(store.observe_plan(watcher::Event::Delete(object("node-a", spec("node-a")).into())));
        assert_eq!(store.decide(), Decision::Missing);
    }

    #[test]
    fn a_plan_with_views_waits_for_the_first_complete_list_of_its_slices() {
        let mut store = Store::new("node-a");
        let mut live = object("node-a", live_plan("node-a", &["all"], vec![]));
        live.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_TRIGGER_TIME.to_string(),
            "2026-01-01T00:00:00.250Z".to_string(),
        )]));
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(live.into()));
        store.observe_plan(watcher::Event::InitDone);
        assert_eq!(store.plan_views(), Some(&["all".to_string()][..]));
        assert_eq!(store.decide(), Decision::Wait, "no slice watch yet");
        store.watch_slices(vec!["all".into()]);
        assert_eq!(store.decide(), Decision::Wait, "the slices are not listed yet");
        store.observe_slice(watcher::Event::Init);
        store.observe_slice(watcher::Event::InitApply(slice_object("all", 0, 2).into()));
        assert_eq!(
            store.decide(),
            Decision::Wait,
            "never from an incomplete first list"
        );
        store.observe_slice(watcher::Event::InitDone);
        let Decision::Incomplete(set, why) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert!(why.contains("all-0001"), "{why}");
        assert_eq!(
            set.trigger_time,
            Some(SystemTime::from(
                "2026-01-01T00:00:00.250Z".parse::<Timestamp>().unwrap()
            ))
        );
        let before = store.key();
        assert!(store.observe_slice(watcher::Event::Apply(slice_object("all", 1, 2).into())));
        assert_ne!(store.key(), before);
        let Decision::Ready(set) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert_eq!(set.slices.len(), 2);
        // A slice that goes away makes the view incomplete again.
        assert!(store.observe_slice(watcher::Event::Delete(slice_object("all", 1, 2).into())));
        assert!(matches!(store.decide(), Decision::Incomplete(..)));
    }

    #[test]
    fn a_service_slice_deleted_before_its_packed_slice_holds_it_stays_in_use() {
        let web = |ip: &str| entry("ns/web:p", "10.96.0.9", 80).with(ep(ip, 80));
        let packed = |ip: &str| {
            let (name, spec) = slice("all", 0, 1, vec![web(ip)]);
            ForwardingSlice::new(&name, spec)
        };
        let own = |ip: &str| {
            let (name, spec) = switchyard_api::testing::service_slice("all", 0, 1, "ns/web", vec![web(ip)]);
            ForwardingSlice::new(&name, spec)
        };
        let forwarded = |store: &Store| -> Vec<String> {
            let (Decision::Ready(set) | Decision::Incomplete(set, _)) = store.decide() else {
                panic!("{:?}", store.decide())
            };
            let refs: Vec<SliceRef<'_>> = set
                .slices
                .iter()
                .map(|(name, spec)| SliceRef { name, spec })
                .collect();
            let composed = switchyard_api::compose::compose(&set.plan, &refs).unwrap();
            composed
                .spec
                .services
                .iter()
                .map(|s| s.endpoints[0].ip.clone())
                .collect()
        };
        let mut store = Store::new("node-a");
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(
            object("node-a", live_plan("node-a", &["all"], vec![])).into(),
        ));
        store.observe_plan(watcher::Event::InitDone);
        store.watch_slices(vec!["all".into()]);
        store.observe_slice(watcher::Event::Init);
        store.observe_slice(watcher::Event::InitApply(packed("10.244.1.1").into()));
        store.observe_slice(watcher::Event::InitApply(own("10.244.1.2").into()));
        store.observe_slice(watcher::Event::InitDone);
        assert_eq!(forwarded(&store), ["10.244.1.2"]);

        // Someone deletes the Service slice: its entries stay in use, not the packed slice's older ones.
        store.observe_slice(watcher::Event::Delete(own("10.244.1.2").into()));
        assert_eq!(store.ghosts().collect::<Vec<_>>(), ["all.ns.web"]);
        assert_eq!(forwarded(&store), ["10.244.1.2"]);
        // The controller restores it: the real one again.
        store.observe_slice(watcher::Event::Apply(own("10.244.1.3").into()));
        assert_eq!(store.ghosts().count(), 0);
        assert_eq!(forwarded(&store), ["10.244.1.3"]);

        // A fold: the packed slice is written with the entries first, then the Service slice goes.
        store.observe_slice(watcher::Event::Apply(packed("10.244.1.3").into()));
        store.observe_slice(watcher::Event::Delete(own("10.244.1.3").into()));
        assert_eq!(
            store.ghosts().count(),
            0,
            "the packed slice holds the same entries"
        );
        assert_eq!(forwarded(&store), ["10.244.1.3"]);

        // Deleted behind our back, then the packed slice is written anew: the ghost ends there.
        store.observe_slice(watcher::Event::Apply(own("10.244.1.4").into()));
        store.observe_slice(watcher::Event::Delete(own("10.244.1.4").into()));
        assert_eq!(forwarded(&store), ["10.244.1.4"]);
        store.observe_slice(watcher::Event::Apply(packed("10.244.1.5").into()));
        assert_eq!(store.ghosts().count(), 0);
        assert_eq!(forwarded(&store), ["10.244.1.5"]);

        // A relist that no longer finds it, the packed copy unchanged, counts like a delete.
        store.observe_slice(watcher::Event::Apply(own("10.244.1.6").into()));
        store.observe_slice(watcher::Event::Init);
        store.observe_slice(watcher::Event::InitApply(packed("10.244.1.5").into()));
        store.observe_slice(watcher::Event::InitDone);
        assert_eq!(store.ghosts().collect::<Vec<_>>(), ["all.ns.web"]);
        assert_eq!(forwarded(&store), ["10.244.1.6"]);
        // A relist after a fold missed while the watch was down (packed copy newer, Service slice
        // gone): the packed copy is used, no ghost.
        store.observe_slice(watcher::Event::Apply(own("10.244.1.7").into()));
        assert_eq!(store.ghosts().count(), 0);
        store.observe_slice(watcher::Event::Init);
        store.observe_slice(watcher::Event::InitApply(packed("10.244.1.8").into()));
        store.observe_slice(watcher::Event::InitDone);
        assert_eq!(store.ghosts().count(), 0);
        assert_eq!(forwarded(&store), ["10.244.1.8"]);
    }

    #[test]
    fn a_plan_naming_a_view_no_selector_can_carry_is_refused_not_waited_for() {
        let mut store = Store::new("node-a");
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(
            object("node-a", live_plan("node-a", &["all", "Zone A"], vec![])).into(),
        ));
        store.observe_plan(watcher::Event::InitDone);
        assert_eq!(store.plan_views(), None, "no slice watch is started for it");
        assert!(matches!(store.decide(), Decision::WrongNode(why) if why.contains("\"Zone A\"")));
    }

    #[test]
    fn a_plan_for_another_node_is_refused() {
        let mut store = Store::new("node-a");
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(object("node-a", spec("node-b")).into()));
        store.observe_plan(watcher::Event::InitDone);
        assert!(matches!(store.decide(), Decision::WrongNode(why) if why.contains("node-b")));
    }

    /// Slice `name` as a watch delivers it when `spec.index` is past u32 (the CRD schema bounds it
    /// below only, so a real API server accepts it).
    fn unreadable_slice(name: &str, view: &str) -> Delivered<ForwardingSlice> {
        let delivered: Delivered<ForwardingSlice> = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                         "labels": {"switchyard.io/view": view}},
            "spec": {"view": view, "index": 4_294_967_296_u64, "count": 2, "revision": "r-bad",
                     "unknownField": true},
        }))
        .unwrap();
        assert!(delivered.undecodable().is_some());
        delivered
    }

    fn listed(store: &mut Store, slices: Vec<Delivered<ForwardingSlice>>) {
        store.observe_slice(watcher::Event::Init);
        for slice in slices {
            store.observe_slice(watcher::Event::InitApply(slice));
        }
        store.observe_slice(watcher::Event::InitDone);
    }

    fn with_views() -> Store {
        let mut store = Store::new("node-a");
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(
            object("node-a", live_plan("node-a", &["all"], vec![])).into(),
        ));
        store.observe_plan(watcher::Event::InitDone);
        store.watch_slices(vec!["all".into()]);
        store
    }

    /// What the agent would program: the set's slices and the problems it reports.
    fn decided(store: &Store) -> (Vec<String>, Vec<String>) {
        let (Decision::Ready(set) | Decision::Incomplete(set, _)) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        let slices = set
            .slices
            .iter()
            .map(|(n, s)| format!("{n}@{}", s.revision))
            .collect();
        (slices, set.unreadable.iter().map(|f| f.reason.clone()).collect())
    }

    /// A slice that stops decoding keeps its last good copy in use and says why, through a relist;
    /// the view is never taken for incomplete because of it, and a delete removes it.
    #[test]
    fn an_unreadable_slice_keeps_its_last_good_copy_and_says_why() {
        let mut store = with_views();
        let (good0, good1) = (slice_object("all", 0, 2), slice_object("all", 1, 2));
        let revision = good0.spec.revision.clone();
        listed(&mut store, vec![good0.clone().into(), good1.clone().into()]);
        let healthy = decided(&store);
        assert_eq!(healthy.0.len(), 2);
        assert!(healthy.1.is_empty());
        let key = store.key();

        assert!(store.observe_slice(watcher::Event::Apply(unreadable_slice("all-0000", "all"))));
        assert_ne!(
            store.key(),
            key,
            "the change is passed on (the status must say it)"
        );
        let (slices, problems) = decided(&store);
        assert_eq!(slices, healthy.0, "the last good copy stays in use");
        assert!(matches!(store.decide(), Decision::Ready(_)));
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("cannot be read: spec.index: 4294967296 is out of range")
                && problems[0].ends_with(&format!("its last good revision {revision} stays in use")),
            "{problems:?}"
        );

        listed(
            &mut store,
            vec![unreadable_slice("all-0000", "all"), good1.clone().into()],
        );
        assert_eq!(
            decided(&store),
            (healthy.0.clone(), problems),
            "carried through a relist"
        );

        assert!(store.observe_slice(watcher::Event::Apply(good0.clone().into())));
        assert_eq!(decided(&store), healthy, "readable again");

        store.observe_slice(watcher::Event::Apply(unreadable_slice("all-0000", "all")));
        assert!(store.observe_slice(watcher::Event::Delete(unreadable_slice("all-0000", "all"))));
        let Decision::Incomplete(set, why) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert!(why.contains("all-0000") && set.unreadable.is_empty(), "{why}");
    }

    #[test]
    fn a_slice_unreadable_from_the_start_applies_nothing_of_it() {
        let mut store = with_views();
        listed(
            &mut store,
            vec![
                unreadable_slice("all-0000", "all"),
                slice_object("all", 1, 2).into(),
            ],
        );
        let Decision::Incomplete(set, _) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert_eq!(set.unreadable.len(), 1);
        assert!(
            set.unreadable[0].reason.ends_with("nothing from it is applied"),
            "{:?}",
            set.unreadable
        );
    }

    /// A plan that stops decoding is refused (its rules stay), never taken for deleted; an odd value
    /// in its status (which the agent writes and never reads back) changes nothing.
    #[test]
    fn an_unreadable_plan_is_refused_not_deleted() {
        let mut store = Store::new("node-a");
        let bad = |status: serde_json::Value, revision: serde_json::Value| -> Delivered<NodeForwardingPlan> {
            let mut value = serde_json::to_value(object("node-a", spec("node-a"))).unwrap();
            value["spec"]["revision"] = revision;
            value["status"] = status;
            serde_json::from_value(value).unwrap()
        };
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(bad(
            serde_json::json!(null),
            serde_json::json!(7),
        )));
        store.observe_plan(watcher::Event::InitDone);
        let Decision::Unreadable(why) = store.decide() else {
            panic!("{:?}", store.decide())
        };
        assert!(why.contains("spec.revision"), "{why}");
        store.observe_plan(watcher::Event::Apply(bad(
            serde_json::json!({"conditions": "odd", "observedRevision": 7}),
            serde_json::json!("r1"),
        )));
        assert!(matches!(store.decide(), Decision::Ready(_)));
        store.observe_plan(watcher::Event::Apply(bad(
            serde_json::json!(null),
            serde_json::json!(7),
        )));
        assert!(matches!(store.decide(), Decision::Unreadable(_)));
        // A relist that still cannot read it: refused again, not Missing.
        store.observe_plan(watcher::Event::Init);
        store.observe_plan(watcher::Event::InitApply(bad(
            serde_json::json!(null),
            serde_json::json!(7),
        )));
        store.observe_plan(watcher::Event::InitDone);
        assert!(matches!(store.decide(), Decision::Unreadable(_)));
    }
}
