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
//! serde-saphyr with the limits of `switchyard_api::yaml` (its defaults stop at 250,000 nodes, which a
//! 2,000-service plan already exceeds; an exceeded limit is reported in words). Files holding slices are dispatched by each document's
//! kind (JSON specs parsed in place from the text, YAML through a generic tree); plan-only files are read
//! straight into the typed spec.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Value, value::RawValue};
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
        Err(e) => match switchyard_api::yaml::exceeded_limit(&e) {
            // Every reading below would stop at the same limit.
            Some(limit) => return Err(limit),
            None => e.to_string(),
        },
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

/// A file with ForwardingSlices: documents (or List items) dispatched by kind. JSON is read in place:
/// each document's `spec` is parsed straight from its text into the typed spec (a generic JSON tree of
/// 10,000 entries would take several times the memory of the typed one); YAML goes through a generic
/// tree, moved rather than copied.
fn parse_documents(text: &str) -> Result<PlanFile, String> {
    let trimmed = text.trim_start();
    let mut found = Found::default();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        for document in serde_json::Deserializer::from_str(text).into_iter::<&RawValue>() {
            found.take(document.map_err(|e| format!("invalid JSON: {e}"))?)?;
        }
    } else {
        let documents =
            serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options()).map_err(|e| {
                switchyard_api::yaml::exceeded_limit(&e).unwrap_or_else(|| format!("invalid YAML: {e}"))
            })?;
        for document in documents {
            found.take(document)?;
        }
    }
    one_plan(found.plans, found.slices)
}

/// Lists inside Lists: `kubectl` prints one level, a hand-made bundle maybe two; a limit keeps a hostile
/// file from recursing the reader off its stack.
const MAX_LIST_DEPTH: usize = 4;

/// The plans and slices of a file, as its documents are read.
#[derive(Default)]
struct Found {
    plans: Vec<NodeForwardingPlanSpec>,
    slices: Vec<(String, ForwardingSliceSpec)>,
}

impl Found {
    fn take<D: Document>(&mut self, document: D) -> Result<(), String> {
        self.take_nested(document, 0)
    }

    fn take_nested<D: Document>(&mut self, document: D, depth: usize) -> Result<(), String> {
        let Some(parts) = document.parts()? else {
            return Ok(());
        };
        match parts.kind.as_str() {
            "List" | "NodeForwardingPlanList" | "ForwardingSliceList" if depth >= MAX_LIST_DEPTH => {
                return Err(format!("Lists nested more than {MAX_LIST_DEPTH} deep"));
            }
            "List" | "NodeForwardingPlanList" | "ForwardingSliceList" => {
                for item in parts.items {
                    self.take_nested(item, depth + 1)?;
                }
            }
            "NodeForwardingPlan" => self.plans.push(
                D::decode(parts.spec)
                    .map_err(|e| format!("NodeForwardingPlan {}: not a valid spec: {e}", parts.name))?,
            ),
            "ForwardingSlice" => {
                let spec: ForwardingSliceSpec = D::decode(parts.spec)
                    .map_err(|e| format!("ForwardingSlice {}: not a valid spec: {e}", parts.name))?;
                if parts.name.is_empty() {
                    return Err("a ForwardingSlice without metadata.name".into());
                }
                self.slices.push((parts.name, spec));
            }
            other => return Err(format!("unexpected object of kind {other:?}")),
        }
        Ok(())
    }
}

/// What the dispatch reads of one document.
struct Parts<D> {
    kind: String,
    name: String,
    spec: Option<D>,
    items: Vec<D>,
}

/// A document of a plan file: JSON text in place, or a YAML document's generic tree.
trait Document: Sized {
    /// Its kind, name, spec and List items; `None` for an empty document.
    fn parts(self) -> Result<Option<Parts<Self>>, String>;
    /// A spec (missing: an error).
    fn decode<T: DeserializeOwned>(spec: Option<Self>) -> Result<T, String>;
}

/// The fields of a JSON document, borrowed from the file's text.
#[derive(Deserialize)]
struct RawDocument<'a> {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Option<RawMetadata>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct RawMetadata {
    #[serde(default)]
    name: Option<String>,
}

impl<'a> Document for &'a RawValue {
    fn parts(self) -> Result<Option<Parts<Self>>, String> {
        if self.get() == "null" {
            return Ok(None);
        }
        let raw: RawDocument<'a> =
            serde_json::from_str(self.get()).map_err(|e| format!("invalid JSON: {e}"))?;
        Ok(Some(Parts {
            kind: raw.kind,
            name: raw.metadata.and_then(|m| m.name).unwrap_or_default(),
            spec: raw.spec,
            items: raw.items.unwrap_or_default(),
        }))
    }

    fn decode<T: DeserializeOwned>(spec: Option<Self>) -> Result<T, String> {
        serde_json::from_str(spec.map_or("null", RawValue::get)).map_err(|e| e.to_string())
    }
}

impl Document for Value {
    fn parts(mut self) -> Result<Option<Parts<Self>>, String> {
        if self.is_null() {
            return Ok(None);
        }
        let kind = self
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = self
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let items = match self.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        Ok(Some(Parts {
            kind,
            name,
            spec: self.get_mut("spec").map(Value::take),
            items,
        }))
    }

    fn decode<T: DeserializeOwned>(spec: Option<Self>) -> Result<T, String> {
        serde_json::from_value(spec.unwrap_or(Value::Null)).map_err(|e| e.to_string())
    }
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
    let read_error = |source| Error::ReadPlan {
        path: path.to_path_buf(),
        source,
    };
    // `-` is standard input, so `switchyard-controller plan … --node N -o yaml | switchyard-agent …
    // --plan -` works without a file.
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(read_error)?
    } else {
        std::fs::read_to_string(path).map_err(read_error)?
    };
    let file = parse_plan_text(&text).map_err(|message| Error::ParsePlan {
        path: path.to_path_buf(),
        message,
    })?;
    drop(text);
    let mut plan = file.plan;
    // The parser grows lists by doubling: unshrunk, ~20% of a 10,000-entry plan's memory would be spare
    // capacity for the agent's life.
    plan.shrink_to_fit();
    Ok(LoadedPlan {
        plan: Arc::new(plan),
        slices: file
            .slices
            .into_iter()
            .map(|(name, mut spec)| {
                spec.shrink_to_fit();
                (name, Arc::new(spec))
            })
            .collect(),
    })
}

/// The status as YAML.
pub fn status_yaml(status: &NodeForwardingPlanStatus) -> Result<String, Error> {
    serde_saphyr::to_string(status).map_err(Error::SerializeStatus)
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
        let nested = serde_json::json!({"kind": "List", "items": [
            {"kind": "ForwardingSliceList", "items": [slice_object]},
            object(live.clone()),
        ]});
        let json_stream = format!(
            "{}\n{}",
            serde_json::to_string(&slice_object).unwrap(),
            serde_json::to_string_pretty(&object(live.clone())).unwrap()
        );
        for (shape, text) in [
            ("yaml documents", yaml),
            ("json list", list.to_string()),
            ("yaml list", serde_saphyr::to_string(&list).unwrap()),
            ("nested lists", nested.to_string()),
            ("json documents", json_stream),
        ] {
            let file = parse_plan_text(&text).unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert_eq!(file.plan, live, "{shape}");
            assert_eq!(file.slices, vec![(name.clone(), all.clone())], "{shape}");
        }
    }

    #[test]
    fn null_lists_and_names_read_as_empty_and_deep_nesting_is_an_error_not_a_crash() {
        let live = serde_json::to_value(object(live_plan("node-a", &["all"], vec![]))).unwrap();
        let (name, all) = slice("all", 0, 1, vec![]);
        let good = serde_json::to_value(ForwardingSlice::new(&name, all.clone())).unwrap();
        // Go encodes an empty list as null.
        let text = serde_json::json!({"kind": "List", "items": [
            {"kind": "ForwardingSliceList", "items": null},
            good,
            live,
        ]})
        .to_string();
        let file = parse_plan_text(&text).unwrap();
        assert_eq!(file.slices, vec![(name, all)]);

        let mut deep = String::from("{\"kind\":\"ForwardingSlice\"}");
        for _ in 0..20_000 {
            deep = format!("{{\"kind\":\"List\",\"items\":[{deep}]}}");
        }
        let error = parse_plan_text(&deep).expect_err("too deep");
        assert!(error.contains("nested"), "{error}");
    }

    #[test]
    fn files_with_slices_name_what_is_wrong() {
        let live = serde_json::to_value(object(live_plan("node-a", &["all"], vec![]))).unwrap();
        let (name, all) = slice("all", 0, 1, vec![]);
        let good = serde_json::to_value(ForwardingSlice::new(&name, all)).unwrap();
        let mut unnamed = good.clone();
        unnamed["metadata"] = serde_json::json!({});
        let mut bad_spec = good.clone();
        bad_spec["spec"]["index"] = serde_json::json!("first");
        let mut no_spec = live.clone();
        no_spec.as_object_mut().unwrap().remove("spec");
        let cases = [
            (
                vec![unnamed, live.clone()],
                "a ForwardingSlice without metadata.name",
            ),
            (
                vec![bad_spec, live.clone()],
                "ForwardingSlice all-0000: not a valid spec",
            ),
            (
                vec![good.clone(), no_spec],
                "NodeForwardingPlan node-a: not a valid spec",
            ),
            (
                vec![good.clone(), serde_json::json!({"kind": "ConfigMap"})],
                "unexpected object of kind \"ConfigMap\"",
            ),
            (vec![good.clone()], "the file holds no NodeForwardingPlan"),
            (
                vec![good, live.clone(), live],
                "the file holds 2 NodeForwardingPlans",
            ),
        ];
        for (items, want) in cases {
            let text = serde_json::json!({"kind": "List", "items": items}).to_string();
            let yaml = serde_saphyr::to_string(&serde_json::json!({"kind": "List", "items": items})).unwrap();
            for (shape, text) in [("json", text), ("yaml", yaml)] {
                let error = parse_plan_text(&text).expect_err(want);
                assert!(error.contains(want), "{shape}: {error:?} should say {want:?}");
            }
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
