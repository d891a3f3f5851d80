//! The controller's view of the cluster, fed by watch events. Pure: no client.
//!
//! ```text
//! watcher::Event<K> ─► ObjectCache<K>::apply ─► Applied { keys touched } ─► engine marks work dirty
//!   Init / InitApply* / InitDone: buffered, then swapped in atomically (a relist is never seen half-done)
//! ```

use std::collections::BTreeMap;

use kube::runtime::watcher;

/// What one event changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied<K> {
    /// One object was added, updated or deleted: the old and new versions.
    One { before: Option<K>, after: Option<K> },
    /// A relist finished and replaced the whole set: every object before it (the cache holds the ones
    /// after; not copied, as a relist of every EndpointSlice would double the cache for a moment).
    Relisted { before: Vec<K> },
    /// Nothing visible yet (a relist is in progress).
    Nothing,
}

/// Objects of one kind, keyed by `namespace/name` (or `name`).
///
/// Boxed: a B-tree node holds up to 11 values inline and a map filled in key order leaves most nodes
/// half empty, so inline k8s-openapi objects (a `Node` is 1.5 KB, a `Service` 0.8 KB, mostly `None`s)
/// cost twice their size; boxed, the slack is a pointer per slot (−16 MB at 5,000 nodes × 10,000
/// Services).
#[derive(Debug, Clone)]
pub struct ObjectCache<K> {
    objects: BTreeMap<String, Box<K>>,
    buffer: Option<BTreeMap<String, Box<K>>>,
    synced: bool,
    key: fn(&K) -> Option<String>,
}

impl<K: Clone> ObjectCache<K> {
    /// An empty cache using `key` to name objects (objects without a name are ignored).
    pub fn new(key: fn(&K) -> Option<String>) -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: None,
            synced: false,
            key,
        }
    }

    /// Applies one watch event.
    pub fn apply(&mut self, event: watcher::Event<K>) -> Applied<K> {
        match event {
            watcher::Event::Apply(object) => match (self.key)(&object) {
                Some(key) => {
                    let before = self.objects.insert(key, Box::new(object.clone()));
                    Applied::One {
                        before: before.map(|b| *b),
                        after: Some(object),
                    }
                }
                None => Applied::Nothing,
            },
            watcher::Event::Delete(object) => match (self.key)(&object) {
                Some(key) => Applied::One {
                    before: self.objects.remove(&key).map(|b| *b),
                    after: None,
                },
                None => Applied::Nothing,
            },
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                Applied::Nothing
            }
            watcher::Event::InitApply(object) => {
                if let (Some(buffer), Some(key)) = (self.buffer.as_mut(), (self.key)(&object)) {
                    buffer.insert(key, Box::new(object));
                }
                Applied::Nothing
            }
            watcher::Event::InitDone => {
                let fresh = self.buffer.take().unwrap_or_default();
                let before = std::mem::replace(&mut self.objects, fresh);
                self.synced = true;
                Applied::Relisted {
                    before: before.into_values().map(|b| *b).collect(),
                }
            }
        }
    }

    /// Replaces the whole set (used to undo an unconfirmed empty relist).
    pub fn restore(&mut self, objects: Vec<K>) {
        self.objects = objects
            .into_iter()
            .filter_map(|o| Some(((self.key)(&o)?, Box::new(o))))
            .collect();
    }

    /// True once the first list completed.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// One object.
    pub fn get(&self, key: &str) -> Option<&K> {
        self.objects.get(key).map(|b| &**b)
    }

    /// Every object, sorted by key.
    pub fn values(&self) -> impl Iterator<Item = &K> {
        self.objects.values().map(|b| &**b)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// `namespace/name` of a namespaced object.
pub fn namespaced_key<K: kube::Resource>(object: &K) -> Option<String> {
    let meta = object.meta();
    Some(format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref()?
    ))
}

/// `name` of a cluster-scoped object.
pub fn cluster_key<K: kube::Resource>(object: &K) -> Option<String> {
    object.meta().name.clone()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::planner::fixtures::node;

    #[test]
    fn relists_swap_in_atomically() {
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster_key);
        assert!(!cache.synced());
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(node(
            "a",
            "192.168.10.11",
            "10.244.1.0/24",
            None,
        )));
        assert!(cache.is_empty(), "nothing visible before InitDone");
        let applied = cache.apply(watcher::Event::InitDone);
        assert!(matches!(applied, Applied::Relisted { ref before } if before.is_empty()) && cache.len() == 1);
        assert!(cache.synced());

        // A second relist that drops `a` and adds `b`.
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(node(
            "b",
            "192.168.10.12",
            "10.244.2.0/24",
            None,
        )));
        assert!(cache.get("a").is_some());
        cache.apply(watcher::Event::InitDone);
        assert!(cache.get("a").is_none() && cache.get("b").is_some());
    }

    #[test]
    fn apply_and_delete_report_before_and_after() {
        let mut cache: ObjectCache<Node> = ObjectCache::new(cluster_key);
        let a = node("a", "192.168.10.11", "10.244.1.0/24", None);
        assert_eq!(
            cache.apply(watcher::Event::Apply(a.clone())),
            Applied::One {
                before: None,
                after: Some(a.clone())
            }
        );
        assert_eq!(
            cache.apply(watcher::Event::Delete(a.clone())),
            Applied::One {
                before: Some(a),
                after: None
            }
        );
        assert!(cache.is_empty());
    }
}
