//! The controller's view of the cluster, fed by watch events. Pure: no client.
//!
//! ```text
//! watcher::Event<Decoded<K>> ─► ObjectCache<K>::apply ─► Applied { keys touched } ─► engine marks work dirty
//!   decoded:     Apply / Delete by key; Init / InitApply* / InitDone: buffered, then swapped in atomically
//!                (a relist is never seen half-done)
//!   undecodable: Apply ─► its last good version stays (Kept);  InitApply ─► its last good version is
//!                carried into the new set (never taken for deleted);  Delete ─► removed by key
//! ```
//!
//! Which keys' latest version did not decode is kept beside the objects, through relists the same way,
//! so a warning is said once per breakage and an Event can be published while it lasts.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, runtime::watcher};
use switchyard_api::tolerant::Undecodable;

/// An object from a watch: decoded, or why it was not (see `switchyard_api::tolerant`).
pub type Decoded<K> = Result<K, Box<Undecodable>>;

/// What one event changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied<K> {
    /// One object was added, updated or deleted: the old and new versions.
    One { before: Option<K>, after: Option<K> },
    /// A relist finished and replaced the whole set: every object before it (the cache holds the ones
    /// after; not copied, as a relist of every EndpointSlice would double the cache for a moment).
    Relisted { before: Vec<K> },
    /// The object's latest version does not decode: its last good version, if any, stays. `fresh`:
    /// it was not already known undecodable for the same reason.
    Kept {
        /// What is wrong with it.
        undecodable: Box<Undecodable>,
        /// First seen so (not a repeat of the same failure).
        fresh: bool,
    },
    /// Nothing visible yet (a relist is in progress).
    Nothing,
}

/// The objects of one generation (the current one, or a relist being buffered).
#[derive(Debug, Clone)]
struct Generation<K> {
    /// Last good versions, by key.
    objects: BTreeMap<String, Box<K>>,
    /// Keys whose latest version does not decode.
    undecodable: BTreeMap<String, Box<Undecodable>>,
}

impl<K> Default for Generation<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            undecodable: BTreeMap::new(),
        }
    }
}

/// Objects of one kind, keyed by `namespace/name` (or `name`).
///
/// Boxed: a B-tree node holds up to 11 values inline and a map filled in key order leaves most nodes
/// half empty, so inline k8s-openapi objects (a `Node` is 1.5 KB, a `Service` 0.8 KB, mostly `None`s)
/// cost twice their size; boxed, the slack is a pointer per slot (−16 MB at 5,000 nodes × 10,000
/// Services).
#[derive(Debug, Clone)]
pub struct ObjectCache<K> {
    current: Generation<K>,
    relist: Option<Generation<K>>,
    synced: bool,
    key: fn(&ObjectMeta) -> Option<String>,
}

impl<K: Clone + Resource> ObjectCache<K> {
    /// An empty cache using `key` to name objects (objects without a name are ignored).
    pub fn new(key: fn(&ObjectMeta) -> Option<String>) -> Self {
        Self {
            current: Generation::default(),
            relist: None,
            synced: false,
            key,
        }
    }

    /// Applies one watch event.
    pub fn apply(&mut self, event: watcher::Event<Decoded<K>>) -> Applied<K> {
        match event {
            watcher::Event::Apply(object) => {
                let Some(key) = self.key_of(&object) else {
                    return Applied::Nothing;
                };
                match object {
                    Ok(object) => {
                        self.current.undecodable.remove(&key);
                        let before = self.current.objects.insert(key, Box::new(object.clone()));
                        Applied::One {
                            before: before.map(|b| *b),
                            after: Some(object),
                        }
                    }
                    Err(undecodable) => self.kept(key, undecodable, false),
                }
            }
            watcher::Event::Delete(object) => match self.key_of(&object) {
                Some(key) => {
                    self.current.undecodable.remove(&key);
                    Applied::One {
                        before: self.current.objects.remove(&key).map(|b| *b),
                        after: None,
                    }
                }
                None => Applied::Nothing,
            },
            watcher::Event::Init => {
                self.relist = Some(Generation::default());
                Applied::Nothing
            }
            watcher::Event::InitApply(object) => {
                let (Some(_), Some(key)) = (self.relist.as_ref(), self.key_of(&object)) else {
                    return Applied::Nothing;
                };
                match object {
                    Ok(object) => {
                        if let Some(relist) = self.relist.as_mut() {
                            relist.objects.insert(key, Box::new(object));
                        }
                        Applied::Nothing
                    }
                    Err(undecodable) => self.kept(key, undecodable, true),
                }
            }
            watcher::Event::InitDone => {
                let fresh = self.relist.take().unwrap_or_default();
                let before = std::mem::replace(&mut self.current, fresh);
                self.synced = true;
                Applied::Relisted {
                    before: before.objects.into_values().map(|b| *b).collect(),
                }
            }
        }
    }

    fn key_of(&self, object: &Decoded<K>) -> Option<String> {
        match object {
            Ok(object) => (self.key)(object.meta()),
            Err(undecodable) => (self.key)(&undecodable.metadata),
        }
    }

    /// An object whose latest version does not decode: its last good version stays (in a relist: is
    /// carried into the new set), and the failure is remembered.
    fn kept(&mut self, key: String, undecodable: Box<Undecodable>, relisting: bool) -> Applied<K> {
        let fresh =
            self.current.undecodable.get(&key).is_none_or(|known| {
                (&known.path, &known.message) != (&undecodable.path, &undecodable.message)
            });
        let last_good = self.current.objects.get(&key).cloned();
        let target = match self.relist.as_mut() {
            Some(relist) if relisting => relist,
            _ => &mut self.current,
        };
        if let Some(last_good) = last_good {
            target.objects.insert(key.clone(), last_good);
        }
        target.undecodable.insert(key, undecodable.clone());
        Applied::Kept { undecodable, fresh }
    }

    /// Replaces the whole set (used to undo an unconfirmed empty relist).
    pub fn restore(&mut self, objects: Vec<K>) {
        self.current.objects = objects
            .into_iter()
            .filter_map(|o| Some(((self.key)(o.meta())?, Box::new(o))))
            .collect();
    }

    /// True once the first list completed.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// One object.
    pub fn get(&self, key: &str) -> Option<&K> {
        self.current.objects.get(key).map(|b| &**b)
    }

    /// Every object, sorted by key.
    pub fn values(&self) -> impl Iterator<Item = &K> {
        self.current.objects.values().map(|b| &**b)
    }

    /// The objects whose latest version does not decode, sorted by key.
    pub fn undecodable(&self) -> impl Iterator<Item = &Undecodable> {
        self.current.undecodable.values().map(|b| &**b)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.current.objects.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.current.objects.is_empty()
    }
}

/// `namespace/name` of a namespaced object.
pub fn namespaced(meta: &ObjectMeta) -> Option<String> {
    Some(format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref()?
    ))
}

/// `name` of a cluster-scoped object.
pub fn cluster(meta: &ObjectMeta) -> Option<String> {
    meta.name.clone()
}

/// `namespace/name` of a namespaced object.
pub fn namespaced_key<K: Resource>(object: &K) -> Option<String> {
    namespaced(object.meta())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use watcher::Event;

    use super::*;
    use crate::planner::fixtures::node;

    fn a() -> Node {
        node("a", "192.168.10.11", "10.244.1.0/24", None)
    }

    fn b() -> Node {
        node("b", "192.168.10.12", "10.244.2.0/24", None)
    }

    /// Node `name` as a watch delivers it when `field` does not decode.
    fn broken(name: &str, field: &str) -> Decoded<Node> {
        Err(Box::new(Undecodable {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            kind: "Node".into(),
            api_version: "v1".into(),
            path: field.into(),
            message: "invalid type: null".into(),
        }))
    }

    fn relist(cache: &mut ObjectCache<Node>, objects: Vec<Decoded<Node>>) -> Applied<Node> {
        cache.apply(Event::Init);
        for object in objects {
            cache.apply(Event::InitApply(object));
        }
        cache.apply(Event::InitDone)
    }

    fn names(cache: &ObjectCache<Node>) -> Vec<String> {
        cache.values().filter_map(|n| n.metadata.name.clone()).collect()
    }

    fn undecodable(cache: &ObjectCache<Node>) -> Vec<String> {
        cache.undecodable().map(|u| u.path.clone()).collect()
    }

    #[test]
    fn relists_swap_in_atomically() {
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster);
        assert!(!cache.synced());
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(Ok(a())));
        assert!(cache.is_empty(), "nothing visible before InitDone");
        let applied = cache.apply(Event::InitDone);
        assert!(matches!(applied, Applied::Relisted { ref before } if before.is_empty()) && cache.len() == 1);
        assert!(cache.synced());

        // A second relist that drops `a` and adds `b`.
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(Ok(b())));
        assert!(cache.get("a").is_some());
        cache.apply(Event::InitDone);
        assert!(cache.get("a").is_none() && cache.get("b").is_some());
    }

    #[test]
    fn apply_and_delete_report_before_and_after() {
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster);
        assert_eq!(
            cache.apply(Event::Apply(Ok(a()))),
            Applied::One {
                before: None,
                after: Some(a())
            }
        );
        assert_eq!(
            cache.apply(Event::Delete(Ok(a()))),
            Applied::One {
                before: Some(a()),
                after: None
            }
        );
        assert!(cache.is_empty());
    }

    /// An object that stops decoding keeps its last good version, on an update and through relists;
    /// the failure is remembered (and `fresh` only when it is new) until a good version or a delete.
    #[test]
    fn an_undecodable_version_keeps_the_last_good_one() {
        struct Step {
            what: &'static str,
            events: Vec<Event<Decoded<Node>>>,
            /// The last event's outcome: `Some(fresh)` for Kept, `None` for anything else.
            kept: Option<bool>,
            names: &'static [&'static str],
            undecodable: &'static [&'static str],
        }
        let relisted = |objects: Vec<Decoded<Node>>| {
            let mut events = vec![Event::Init];
            events.extend(objects.into_iter().map(Event::InitApply));
            events.push(Event::InitDone);
            events
        };
        let steps = vec![
            Step {
                what: "listed",
                events: relisted(vec![Ok(a()), Ok(b())]),
                kept: None,
                names: &["a", "b"],
                undecodable: &[],
            },
            Step {
                what: "an update of a does not decode",
                events: vec![Event::Apply(broken("a", "spec.taints[0]"))],
                kept: Some(true),
                names: &["a", "b"],
                undecodable: &["spec.taints[0]"],
            },
            Step {
                what: "the same again: not fresh",
                events: vec![Event::Apply(broken("a", "spec.taints[0]"))],
                kept: Some(false),
                names: &["a", "b"],
                undecodable: &["spec.taints[0]"],
            },
            Step {
                what: "another field: fresh",
                events: vec![Event::Apply(broken("a", "spec.podCIDR"))],
                kept: Some(true),
                names: &["a", "b"],
                undecodable: &["spec.podCIDR"],
            },
            Step {
                what: "a relist still cannot read a: its last good version is carried over, not deleted",
                events: relisted(vec![broken("a", "spec.podCIDR"), Ok(b())]),
                kept: None,
                names: &["a", "b"],
                undecodable: &["spec.podCIDR"],
            },
            Step {
                what: "a good version of a: no longer undecodable",
                events: vec![Event::Apply(Ok(a()))],
                kept: None,
                names: &["a", "b"],
                undecodable: &[],
            },
            Step {
                what: "a new object that never decoded: nothing to keep, but remembered",
                events: vec![Event::Apply(broken("c", "status.addresses[0]"))],
                kept: Some(true),
                names: &["a", "b"],
                undecodable: &["status.addresses[0]"],
            },
            Step {
                what: "deleted while undecodable: gone by key",
                events: vec![Event::Delete(broken("c", "status.addresses[0]"))],
                kept: None,
                names: &["a", "b"],
                undecodable: &[],
            },
            Step {
                what: "b breaks and is deleted: its last good version goes",
                events: vec![
                    Event::Apply(broken("b", "spec.taints")),
                    Event::Delete(broken("b", "spec.taints")),
                ],
                kept: None,
                names: &["a"],
                undecodable: &[],
            },
        ];
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster);
        for step in steps {
            let mut last = Applied::Nothing;
            for event in step.events {
                last = cache.apply(event);
            }
            let kept = match last {
                Applied::Kept { fresh, .. } => Some(fresh),
                _ => None,
            };
            assert_eq!(kept, step.kept, "{}", step.what);
            assert_eq!(names(&cache), step.names, "{}", step.what);
            assert_eq!(undecodable(&cache), step.undecodable, "{}", step.what);
        }
        assert_eq!(
            cache.get("a"),
            Some(&a()),
            "the last good version is what is planned"
        );
    }

    #[test]
    fn a_relist_that_no_longer_lists_an_undecodable_object_forgets_it() {
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster);
        relist(&mut cache, vec![Ok(a()), broken("b", "spec")]);
        assert_eq!(
            (names(&cache), undecodable(&cache)),
            (vec!["a".into()], vec!["spec".into()])
        );
        relist(&mut cache, vec![Ok(a())]);
        assert_eq!((names(&cache), undecodable(&cache)), (vec!["a".into()], vec![]));
    }
}
