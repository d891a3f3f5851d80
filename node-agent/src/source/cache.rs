//! The last applied plan on local disk, so a restarted agent re-applies it before the API server is
//! reachable (and keeps forwarding when it is not).
//!
//! ```text
//! applied PlanSet (from the API) ─► write(): JSON List of the plan and its slices ─► <file>.tmp, fsync
//!                                     ─► rename over <state-dir>/plan.yaml ─► fsync the directory
//! start ─► read(): parse, keep this node's plan and its views' slices ─► PlanSet (origin Cache)
//!        ─► applied first (the syncer composes it exactly as a set from the API), from the backend
//!           in use when it was written (in_use(): a switch from it is judged by the switch gate)
//! plan deleted and its grace period over ─► remove()
//! ```
//!
//! The file is a `kind: List` of the NodeForwardingPlan and its ForwardingSlices in JSON (which is YAML
//! too, so `switchyard-agent render --plan <state-dir>/plan.yaml` reads it). The objects keep their
//! name, uid, labels, annotations and managedFields times (no field sets): what the agent needs to
//! report status and plan age.

use std::io::Write;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use switchyard_api::names::ANNOTATION_BACKEND_IN_USE;
use switchyard_api::yaml::MAX_PLAN_BYTES;
use switchyard_api::{
    Backend, ForwardingSlice, ForwardingSliceSpec, NodeForwardingPlan, NodeForwardingPlanSpec,
};

use super::store::{Decision, Store};
use super::{Origin, PlanSet};
use crate::error::Error;

/// The cache file in a state directory.
pub fn cache_path(state_dir: &Path) -> PathBuf {
    state_dir.join("plan.yaml")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CachedObject<'a, S> {
    api_version: &'a str,
    kind: &'a str,
    metadata: &'a ObjectMeta,
    spec: &'a S,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Cached<'a> {
    Plan(CachedObject<'a, NodeForwardingPlanSpec>),
    Slice(CachedObject<'a, ForwardingSliceSpec>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CachedList<'a> {
    api_version: &'a str,
    kind: &'a str,
    items: Vec<Cached<'a>>,
}

/// One cached object: its spec stays raw text until its kind says what it is (no second copy of a
/// 10,000-entry plan in a generic value tree).
#[derive(Deserialize)]
struct ReadObject<'a> {
    kind: String,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(borrow)]
    spec: &'a serde_json::value::RawValue,
}

#[derive(Deserialize)]
struct ReadList<'a> {
    #[serde(borrow)]
    items: Vec<ReadObject<'a>>,
}

/// Writes `set` to `path` atomically: readers (and a crash) see the old file or the new one, whole.
/// The plan carries `in_use`, the backend that programmed it, as an annotation ([`in_use`]).
pub fn write(path: &Path, set: &PlanSet, in_use: Backend) -> Result<(), Error> {
    let fail = |source| Error::WriteCache {
        path: path.to_path_buf(),
        source,
    };
    let api_version = NodeForwardingPlan::api_version(&());
    let plan_kind = NodeForwardingPlan::kind(&());
    let slice_kind = ForwardingSlice::kind(&());
    let empty = ObjectMeta::default();
    let mut plan_meta = set.plan_meta.clone();
    plan_meta
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_BACKEND_IN_USE.to_owned(), in_use.as_str().to_owned());
    let mut items = vec![Cached::Plan(CachedObject {
        api_version: &api_version,
        kind: &plan_kind,
        metadata: &plan_meta,
        spec: &set.plan,
    })];
    items.extend(set.slices.iter().enumerate().map(|(i, (_, spec))| {
        Cached::Slice(CachedObject {
            api_version: &api_version,
            kind: &slice_kind,
            metadata: set.slice_meta.get(i).unwrap_or(&empty),
            spec,
        })
    }));
    let list = CachedList {
        api_version: "v1",
        kind: "List",
        items,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    switchyard_process::write_atomic(path, |writer| {
        serde_json::to_writer(&mut *writer, &list).map_err(std::io::Error::other)?;
        writer.write_all(b"\n")
    })
    .map_err(fail)
}

/// Reads the cache for `node`: `None` when there is no file; an error when it cannot be used.
pub fn read(path: &Path, node: &str) -> Result<Option<PlanSet>, Error> {
    let fail = |message: String| Error::ReadCache {
        path: path.to_path_buf(),
        message,
    };
    // The cache holds what the API server served, but it is a file: bounded as a plan file is.
    let size = match std::fs::metadata(path) {
        Ok(metadata) => metadata.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    if size > MAX_PLAN_BYTES as u64 {
        return Err(fail(format!(
            "the file is {size} bytes, more than the {MAX_PLAN_BYTES} a plan file may hold"
        )));
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    let list: ReadList<'_> = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let mut store = Store::new(node);
    store.observe_plan(watcher::Event::Init);
    let mut slices = Vec::new();
    for object in list.items {
        let name = object.metadata.name.clone().unwrap_or_default();
        match object.kind.as_str() {
            "NodeForwardingPlan" => {
                let spec = serde_json::from_str(object.spec.get())
                    .map_err(|e| fail(format!("NodeForwardingPlan {name}: {e}")))?;
                store.observe_plan(watcher::Event::InitApply(
                    NodeForwardingPlan {
                        metadata: object.metadata,
                        spec,
                        status: None,
                    }
                    .into(),
                ));
            }
            "ForwardingSlice" => {
                let spec = serde_json::from_str(object.spec.get())
                    .map_err(|e| fail(format!("ForwardingSlice {name}: {e}")))?;
                slices.push(ForwardingSlice {
                    metadata: object.metadata,
                    spec,
                });
            }
            other => return Err(fail(format!("unexpected object of kind {other:?}"))),
        }
    }
    drop(text);
    store.observe_plan(watcher::Event::InitDone);
    if let Some(views) = store.plan_views().map(<[String]>::to_vec) {
        store.watch_slices(views);
    }
    store.observe_slice(watcher::Event::Init);
    for slice in slices {
        store.observe_slice(watcher::Event::InitApply(slice.into()));
    }
    store.observe_slice(watcher::Event::InitDone);
    let set = match store.decide() {
        Decision::Ready(set) => set,
        Decision::Incomplete(_, why) => return Err(fail(format!("not a complete plan: {why}"))),
        Decision::WrongNode(why) | Decision::Unreadable(why) => return Err(fail(why)),
        Decision::Missing | Decision::Wait => {
            return Err(fail(format!("it holds no plan named {node}")));
        }
    };
    Ok(Some(PlanSet {
        origin: Origin::Cache,
        ..set
    }))
}

/// The backend the agent that wrote the cache had in use (`None` in a cache written before it said so).
pub fn in_use(set: &PlanSet) -> Option<Backend> {
    set.plan_meta
        .annotations
        .as_ref()?
        .get(ANNOTATION_BACKEND_IN_USE)
        .and_then(|value| Backend::parse(value))
}

/// Removes the cache (the plan was deleted and its grace period is over).
pub fn remove(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::WriteCache {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use switchyard_api::testing::{EntryExt, entry, ep, live_plan, plan, slice};

    fn dir(tag: &str) -> switchyard_test_support::scratch::TempDir {
        switchyard_test_support::scratch::dir(&format!("cache-{tag}")).unwrap()
    }

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        }
    }

    fn set(node: &str) -> PlanSet {
        let spec = plan(
            node,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        PlanSet {
            plan_meta: meta(node),
            uid: Some(format!("uid-{node}")),
            origin: Origin::Api,
            ..PlanSet::from_file(Arc::new(spec), vec![])
        }
    }

    fn set_with_slices(node: &str) -> PlanSet {
        let (name, all) = slice(
            "all",
            0,
            1,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        PlanSet {
            plan_meta: meta(node),
            slice_meta: vec![meta(&name)],
            uid: Some(format!("uid-{node}")),
            origin: Origin::Api,
            ..PlanSet::from_file(
                Arc::new(live_plan(node, &["all"], vec![])),
                vec![(name, Arc::new(all))],
            )
        }
    }

    #[test]
    fn a_written_cache_reads_back_and_is_a_plan_file_too() {
        let dir = dir("roundtrip");
        let path = cache_path(&dir.path().join("state"));
        assert_eq!(read(&path, "node-a").unwrap(), None);
        for (written, backend) in [
            (set("node-a"), Backend::Iptables),
            (set_with_slices("node-a"), Backend::Ipvs),
        ] {
            assert_eq!(in_use(&written), None, "a plan from the API says nothing of it");
            write(&path, &written, backend).unwrap();
            assert!(!path.with_file_name(".plan.yaml.tmp").exists());
            let back = read(&path, "node-a").unwrap().unwrap();
            assert_eq!(back.origin, Origin::Cache);
            assert_eq!(in_use(&back), Some(backend));
            assert_eq!((&back.plan, &back.slices), (&written.plan, &written.slices));
            assert_eq!(back.uid.as_deref(), Some("uid-node-a"));
            let as_plan_file = crate::planfile::read_plan_file(&path).unwrap();
            assert_eq!(
                (as_plan_file.plan, as_plan_file.slices),
                (written.plan, written.slices)
            );
        }
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path, "node-a").unwrap(), None);
    }

    #[test]
    fn a_cache_for_another_node_an_incomplete_one_or_garbage_is_refused() {
        let dir = dir("refused");
        let path = cache_path(dir.path());
        write(&path, &set("node-b"), Backend::Iptables).unwrap();
        let err = read(&path, "node-a").unwrap_err().to_string();
        assert!(err.contains("no plan named node-a"), "{err}");
        let mut incomplete = set_with_slices("node-a");
        incomplete.slices.clear();
        incomplete.slice_meta.clear();
        write(&path, &incomplete, Backend::Iptables).unwrap();
        let err = read(&path, "node-a").unwrap_err().to_string();
        assert!(err.contains("not a complete plan"), "{err}");
        std::fs::write(&path, "{\"items\": [").unwrap();
        assert!(read(&path, "node-a").is_err());
    }
}
