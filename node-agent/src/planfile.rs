//! Plan files and status files on local disk.
//!
//! ```text
//! file ─► parse_plan_text() ─► PlanFile { plan, slices }
//!           one NodeForwardingPlan object (YAML or JSON), or a bare spec: a self-contained plan
//!           (`switchyard-controller plan --node N`), or a live plan with views
//!           + ForwardingSlices (multi-document YAML or a `kind: List`, as `plan --objects --node N` or
//!             `kubectl get nfp,fws -o yaml` print them): composed like the API source does
//! status ─► write_status() ─► <file>.tmp ─► rename ─► <file>   (readers never see half a file)
//! ```
//!
//! JSON goes through serde_json (fastest, least memory for a 10,000-service plan); YAML through
//! serde-saphyr with its resource budget raised to fit such plans (its defaults stop at 250,000 nodes,
//! which a 2,000-service plan already exceeds). Files holding slices are read as generic documents
//! first (their kinds differ); plan-only files are read straight into the typed spec.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use switchyard_api::{ForwardingSliceSpec, NodeForwardingPlanSpec, NodeForwardingPlanStatus};

use crate::error::Error;
use crate::sync::SliceObject;

/// What a plan file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanFile {
    /// The node's plan.
    pub plan: NodeForwardingPlanSpec,
    /// ForwardingSlices (name, spec), for a plan with views.
    pub slices: Vec<(String, ForwardingSliceSpec)>,
}

/// A NodeForwardingPlan object: only the spec matters here (apiVersion, kind, metadata and status are
/// read past).
#[derive(Deserialize)]
struct Object {
    spec: NodeForwardingPlanSpec,
}

/// `kubectl get nfp -o yaml|json` output.
#[derive(Deserialize)]
struct List {
    items: Vec<Object>,
}

fn yaml_options() -> serde_saphyr::Options {
    switchyard_api::yaml::large_file_options()
}

/// Parses the text of a plan file.
pub fn parse_plan_text(text: &str) -> Result<PlanFile, String> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err("the file is empty".into());
    }
    let plans = if text.contains("ForwardingSlice") {
        return parse_documents(text);
    } else if trimmed.starts_with('{') || trimmed.starts_with('[') {
        parse_json(text)?
    } else {
        parse_yaml(text)?
    };
    one_plan(plans, Vec::new())
}

fn one_plan(
    mut plans: Vec<NodeForwardingPlanSpec>,
    slices: Vec<(String, ForwardingSliceSpec)>,
) -> Result<PlanFile, String> {
    match plans.len() {
        1 => Ok(PlanFile {
            plan: plans.remove(0),
            slices,
        }),
        0 => Err("the file holds no NodeForwardingPlan".into()),
        n => Err(format!(
            "the file holds {n} NodeForwardingPlans, want one: pass one node's plan \
             (`switchyard-controller plan -f DUMP --node NAME`)"
        )),
    }
}

fn parse_yaml(text: &str) -> Result<Vec<NodeForwardingPlanSpec>, String> {
    let object_error = match serde_saphyr::from_multiple_with_options::<Option<Object>>(text, yaml_options())
    {
        Ok(objects) => {
            let specs: Vec<_> = objects.into_iter().flatten().map(|o| o.spec).collect();
            if !specs.is_empty() {
                return Ok(specs);
            }
            "no document".to_string()
        }
        Err(e) => e.to_string(),
    };
    if let Ok(list) = serde_saphyr::from_str_with_options::<List>(text, yaml_options()) {
        return Ok(list.items.into_iter().map(|o| o.spec).collect());
    }
    match serde_saphyr::from_multiple_with_options::<Option<NodeForwardingPlanSpec>>(text, yaml_options()) {
        Ok(specs) if specs.iter().any(Option::is_some) => Ok(specs.into_iter().flatten().collect()),
        Ok(_) => Err("no document".into()),
        Err(spec_error) => Err(explain(text, &object_error, &spec_error.to_string())),
    }
}

fn parse_json(text: &str) -> Result<Vec<NodeForwardingPlanSpec>, String> {
    let object_error = match serde_json::from_str::<Object>(text) {
        Ok(object) => return Ok(vec![object.spec]),
        Err(e) => e.to_string(),
    };
    if let Ok(list) = serde_json::from_str::<List>(text) {
        return Ok(list.items.into_iter().map(|o| o.spec).collect());
    }
    if let Ok(objects) = serde_json::from_str::<Vec<Object>>(text) {
        return Ok(objects.into_iter().map(|o| o.spec).collect());
    }
    match serde_json::from_str::<NodeForwardingPlanSpec>(text) {
        Ok(spec) => Ok(vec![spec]),
        Err(spec_error) => Err(explain(text, &object_error, &spec_error.to_string())),
    }
}

/// A file with ForwardingSlices: documents (or List items) dispatched by kind.
fn parse_documents(text: &str) -> Result<PlanFile, String> {
    let trimmed = text.trim_start();
    let documents: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("invalid JSON: {e}"))?
    } else {
        serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options())
            .map_err(|e| format!("invalid YAML: {e}"))?
    };
    let mut plans = Vec::new();
    let mut slices = Vec::new();
    let mut queue: Vec<Value> = documents.into_iter().rev().collect();
    while let Some(document) = queue.pop() {
        let kind = document
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = document
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match kind.as_str() {
            "List" | "NodeForwardingPlanList" | "ForwardingSliceList" => {
                if let Some(Value::Array(items)) = document.get("items") {
                    queue.extend(items.iter().rev().cloned());
                }
            }
            "NodeForwardingPlan" => {
                let spec = document.get("spec").cloned().unwrap_or(Value::Null);
                plans.push(
                    serde_json::from_value(spec)
                        .map_err(|e| format!("NodeForwardingPlan {name}: not a valid spec: {e}"))?,
                );
            }
            "ForwardingSlice" => {
                let spec = document.get("spec").cloned().unwrap_or(Value::Null);
                let spec: ForwardingSliceSpec = serde_json::from_value(spec)
                    .map_err(|e| format!("ForwardingSlice {name}: not a valid spec: {e}"))?;
                if name.is_empty() {
                    return Err("a ForwardingSlice without metadata.name".into());
                }
                slices.push((name, spec));
            }
            "" if document.is_null() => {}
            other => return Err(format!("unexpected object of kind {other:?}")),
        }
    }
    one_plan(plans, slices)
}

/// The error that matches what the file looks like: an object's when it has a `spec`, else a bare
/// spec's.
fn explain(text: &str, object_error: &str, spec_error: &str) -> String {
    let looks_like_object =
        text.contains("\nspec:") || text.starts_with("spec:") || text.contains("\"spec\"");
    if looks_like_object {
        format!("not a valid NodeForwardingPlan object: {object_error}")
    } else {
        format!("neither a NodeForwardingPlan object nor a bare spec: {spec_error}")
    }
}

/// A plan file read: the plan and its slices, shared.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPlan {
    /// The plan.
    pub plan: Arc<NodeForwardingPlanSpec>,
    /// Its slices.
    pub slices: Vec<SliceObject>,
}

/// Reads and parses a plan file.
pub fn read_plan_file(path: &Path) -> Result<LoadedPlan, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadPlan {
        path: path.to_path_buf(),
        source,
    })?;
    let file = parse_plan_text(&text).map_err(|message| Error::ParsePlan {
        path: path.to_path_buf(),
        message,
    })?;
    drop(text);
    let mut plan = file.plan;
    // The parser grows the entry list by doubling, which would leave up to ~40% of a 10,000-entry list
    // (over 1 MB) unused for the agent's life.
    plan.services.shrink_to_fit();
    Ok(LoadedPlan {
        plan: Arc::new(plan),
        slices: file
            .slices
            .into_iter()
            .map(|(name, mut spec)| {
                spec.entries.shrink_to_fit();
                (name, Arc::new(spec))
            })
            .collect(),
    })
}

/// The status as YAML.
pub fn status_yaml(status: &NodeForwardingPlanStatus) -> Result<String, Error> {
    serde_saphyr::to_string(status).map_err(|e| Error::SerializeStatus(e.to_string()))
}

/// Writes the status as YAML to `path` atomically (a temporary file in the same directory, renamed).
pub fn write_status(path: &Path, status: &NodeForwardingPlanStatus) -> Result<(), Error> {
    let yaml = status_yaml(status)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "status".into());
    let tmp: PathBuf = path.with_file_name(format!(".{file_name}.tmp"));
    let fail = |source| Error::WriteStatus {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, yaml).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, live_plan, plan, slice};
    use switchyard_api::{ForwardingSlice, NodeForwardingPlan};

    fn spec(node: &str) -> NodeForwardingPlanSpec {
        plan(
            node,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        )
    }

    fn object(spec: NodeForwardingPlanSpec) -> NodeForwardingPlan {
        NodeForwardingPlan::new(&spec.node_name.clone(), spec)
    }

    #[test]
    fn every_plan_file_shape_parses() {
        let one = spec("node-a");
        let object_yaml = serde_saphyr::to_string(&object(one.clone())).unwrap();
        let object_json = serde_json::to_string_pretty(&object(one.clone())).unwrap();
        let bare_yaml = serde_saphyr::to_string(&one).unwrap();
        let bare_json = serde_json::to_string(&one).unwrap();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [object(one.clone())]});
        for (name, text) in [
            ("object yaml", object_yaml),
            ("object json", object_json),
            ("bare yaml", bare_yaml),
            ("bare json", bare_json),
            ("list json", list.to_string()),
            ("list yaml", serde_saphyr::to_string(&list).unwrap()),
        ] {
            let file = parse_plan_text(&text).unwrap();
            assert_eq!(file.plan, one, "{name}");
            assert!(file.slices.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_live_plan_with_its_slices_parses_from_yaml_documents_or_a_list() {
        let live = live_plan("node-a", &["all"], vec![]);
        let (name, all) = slice(
            "all",
            0,
            1,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        let slice_object = ForwardingSlice::new(&name, all.clone());
        let yaml = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&slice_object).unwrap(),
            serde_saphyr::to_string(&object(live.clone())).unwrap()
        );
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [slice_object, object(live.clone())]});
        for text in [yaml, list.to_string()] {
            let file = parse_plan_text(&text).unwrap();
            assert_eq!(file.plan, live);
            assert_eq!(file.slices, vec![(name.clone(), all.clone())]);
        }
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(parse_plan_text("").unwrap_err().contains("empty"));
        let err = parse_plan_text(
            "apiVersion: switchyard.io/v1alpha2\nkind: NodeForwardingPlan\nspec:\n  nodeName: 3\n",
        )
        .unwrap_err();
        assert!(err.contains("NodeForwardingPlan object"), "{err}");
        let err = parse_plan_text("nodeName: a\n").unwrap_err();
        assert!(err.contains("bare spec"), "{err}");
        assert!(parse_plan_text("{\"nodeName\": ").is_err());
        let two = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&object(spec("node-a"))).unwrap(),
            serde_saphyr::to_string(&object(spec("node-b"))).unwrap()
        );
        let err = parse_plan_text(&two).unwrap_err();
        assert!(
            err.contains("2 NodeForwardingPlans, want one") && err.contains("--node NAME"),
            "{err}"
        );
    }

    #[test]
    fn status_files_are_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("switchyard-status-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("status.yaml");
        let status = NodeForwardingPlanStatus {
            observed_revision: Some("abc".into()),
            drift_repairs: 2,
            ..Default::default()
        };
        write_status(&path, &status).unwrap();
        let back: NodeForwardingPlanStatus =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, status);
        assert!(!dir.join(".status.yaml.tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
