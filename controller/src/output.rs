//! Plans and slices as Kubernetes objects, and how the `plan` command prints them.
//!
//! ```text
//! Planner ─► composed plan per node (what it forwards; self-contained)  ─► yaml | json | table | wide
//!         └► objects the controller writes: ForwardingSlices + live NodeForwardingPlans (--objects)
//! ```
//!
//! YAML is multi-document and JSON a v1 `List`, both ready for `kubectl apply --server-side -f -`,
//! sorted (slices by name, then plans by node) so diffs are reviewable. The object tables evaluate the
//! CRDs' own printer columns, so they have exactly the shape `kubectl get nfp` / `kubectl get fws` show.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;
use serde_json::Value;
use switchyard_api::{
    ForwardingSlice, ForwardingSliceSpec, NodeForwardingPlan, NodeForwardingPlanSpec,
    crd::{printer_columns, slice_printer_columns},
    names::{LABEL_MANAGED_BY, LABEL_NODE, LABEL_VIEW, MANAGED_BY},
    revision,
};

use crate::{Error, planner::Planner};

/// Output formats of the `plan` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Multi-document YAML.
    Yaml,
    /// A v1 List in JSON.
    Json,
    /// A table.
    Table,
    /// A wider table.
    Wide,
}

/// A node's live plan as an object: name, labels and the ownerReference to its Node (`controller: true`,
/// so the API server's garbage collector removes plans with their Node).
pub fn plan_object(node: &str, node_uid: Option<&str>, spec: NodeForwardingPlanSpec) -> NodeForwardingPlan {
    let labels = BTreeMap::from([
        (LABEL_NODE.to_string(), node.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]);
    let owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid: uid.to_string(),
            controller: Some(true),
            ..OwnerReference::default()
        }]
    });
    NodeForwardingPlan {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            labels: Some(labels),
            owner_references,
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// A slice as an object: name and labels (its view, for the agents' selectors).
pub fn slice_object(name: &str, spec: ForwardingSliceSpec) -> ForwardingSlice {
    let labels = BTreeMap::from([
        (LABEL_VIEW.to_string(), spec.view.clone()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]);
    ForwardingSlice {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec,
    }
}

/// What one node forwards, as one self-contained plan object (no views; every entry in `services`,
/// composed from its slices exactly as its agent composes them; the revision hashes this content).
pub fn composed_object(planner: &Planner, node: &str) -> Result<Option<NodeForwardingPlan>, Error> {
    let Some(composed) = planner.composed(node) else {
        return Ok(None);
    };
    let mut spec = composed.map_err(Error::Compose)?.spec;
    spec.revision = revision::compute(&spec)?;
    let uid = planner.node_info(node).and_then(|n| n.uid.clone());
    Ok(Some(plan_object(node, uid.as_deref(), spec)))
}

/// One object the controller writes.
// Printed once and dropped; boxing each would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Written {
    /// A ForwardingSlice.
    Slice(ForwardingSlice),
    /// A live NodeForwardingPlan.
    Plan(NodeForwardingPlan),
}

impl Written {
    /// The object as JSON (for tables).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Every object the controller would write: slices by name, then plans by node.
pub fn written_objects(planner: &Planner) -> Vec<Written> {
    let mut out: Vec<Written> = planner
        .slices(None)
        .into_iter()
        .map(|(name, spec)| Written::Slice(slice_object(&name, spec)))
        .collect();
    for node in planner.node_names() {
        let uid = planner.node_info(node).and_then(|n| n.uid.clone());
        if let Some(spec) = planner.node_plan(node) {
            out.push(Written::Plan(plan_object(node, uid.as_deref(), spec)));
        }
    }
    out
}

/// Renders objects as YAML or JSON.
pub fn serialize<T: Serialize>(objects: &[T], format: Format) -> Result<String, Error> {
    match format {
        Format::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            let mut text =
                serde_json::to_string_pretty(&list).map_err(|e| Error::Serialize(e.to_string()))?;
            text.push('\n');
            Ok(text)
        }
        Format::Yaml | Format::Table | Format::Wide => {
            let mut out = String::new();
            for object in objects {
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(object).map_err(|e| Error::Serialize(e.to_string()))?);
            }
            Ok(out)
        }
    }
}

/// The composed plans as a table: per node what it forwards, and how (views, overrides). Two
/// revisions, because there are two objects: REVISION is the live plan's (what the controller writes
/// and `kubectl get nfp` shows as DESIRED), FILE REVISION the self-contained plan's (what `plan --node N
/// -o yaml` prints and `render`/`apply` report for that file). LOCAL counts the node's entries of
/// Local-policy Services with an endpoint on it.
pub fn composed_table(planner: &Planner, composed: &[NodeForwardingPlan], wide: bool) -> String {
    let mut head = vec![
        "NODE",
        "BACKEND",
        "ZONE",
        "SERVICES",
        "ENDPOINTS",
        "OVERRIDES",
        "LOCAL",
        "REVISION",
        "FILE REVISION",
    ];
    if wide {
        head.extend(["VIEWS", "ENDPOINTS ON NODE"]);
    }
    let mut rows: Vec<Vec<String>> = vec![head.into_iter().map(str::to_string).collect()];
    for object in composed {
        let node = object.spec.node_name.as_str();
        let live = planner.node_plan(node);
        let mut row = vec![
            node.to_string(),
            object.spec.backend.to_string(),
            object.spec.zone.clone().unwrap_or_else(|| "<none>".into()),
            object.spec.summary.entries.to_string(),
            object.spec.summary.endpoints.to_string(),
            live.as_ref().map_or(0, |p| p.overrides.len()).to_string(),
            live.as_ref().map_or(0, |p| p.local_endpoints.len()).to_string(),
            live.as_ref().map_or_else(String::new, |p| p.revision.clone()),
            object.spec.revision.clone(),
        ];
        if wide {
            row.push(live.as_ref().map_or_else(String::new, |p| p.views.join(",")));
            row.push(live.as_ref().map_or(0, |p| p.endpoints_on_node.len()).to_string());
        }
        rows.push(row);
    }
    align(rows)
}

/// `kubectl get fws` and `kubectl get nfp` for the objects the controller writes.
pub fn objects_table(objects: &[Written], wide: bool) -> String {
    let slices: Vec<Value> = objects
        .iter()
        .filter(|o| matches!(o, Written::Slice(_)))
        .map(Written::to_value)
        .collect();
    let plans: Vec<Value> = objects
        .iter()
        .filter(|o| matches!(o, Written::Plan(_)))
        .map(Written::to_value)
        .collect();
    let mut out = String::new();
    if !slices.is_empty() {
        out.push_str(&table_with(&slice_printer_columns(), &slices, wide));
    }
    if !plans.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&table(&plans, wide));
    }
    out
}

/// `kubectl get nfp` for already-serialised objects (also used for objects read back from a cluster).
pub fn table(objects: &[Value], wide: bool) -> String {
    table_with(&printer_columns(), objects, wide)
}

fn table_with(columns: &[CustomResourceColumnDefinition], objects: &[Value], wide: bool) -> String {
    let columns: Vec<_> = columns
        .iter()
        .filter(|c| wide || c.priority.unwrap_or(0) == 0)
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(objects.len() + 1);
    rows.push(
        std::iter::once("NAME".to_string())
            .chain(columns.iter().map(|c| c.name.to_uppercase()))
            .collect(),
    );
    for object in objects {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut row = vec![name];
        for column in &columns {
            row.push(json_path(object, &column.json_path).map_or_else(|| "<none>".to_string(), display));
        }
        rows.push(row);
    }
    align(rows)
}

/// Left-aligned columns three spaces apart, as kubectl prints them (the first row is the header).
pub(crate) fn align(rows: Vec<Vec<String>>) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

fn display(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".into(),
        other => other.to_string(),
    }
}

/// Evaluates the JSONPath subset printer columns use: `.a.b`, and `[?(@.key=="value")]` filters on lists.
pub fn json_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = value;
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("[?(@.") {
            let (condition, tail) = after.split_once(")]")?;
            let (key, wanted) = condition.split_once("==")?;
            let wanted = wanted.trim_matches('"');
            current = current
                .as_array()?
                .iter()
                .find(|item| item.get(key).and_then(Value::as_str) == Some(wanted))?;
            rest = tail.strip_prefix('.').unwrap_or(tail);
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        current = current.get(&rest[..end])?;
        rest = rest[end..].strip_prefix('.').unwrap_or(&rest[end..]);
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_follows_fields_and_filters() {
        let object = serde_json::json!({
            "spec": {"summary": {"services": 3}},
            "status": {"conditions": [
                {"type": "Degraded", "status": "False"},
                {"type": "Applied", "status": "True"}
            ]}
        });
        assert_eq!(
            json_path(&object, ".spec.summary.services"),
            Some(&serde_json::json!(3))
        );
        assert_eq!(
            json_path(&object, ".status.conditions[?(@.type==\"Applied\")].status"),
            Some(&serde_json::json!("True"))
        );
        assert_eq!(
            json_path(&object, ".status.conditions[?(@.type==\"Ready\")].status"),
            None
        );
        assert_eq!(json_path(&object, ".spec.missing"), None);
    }
}
