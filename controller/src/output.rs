//! Plans as Kubernetes objects and how the `plan` command prints them.
//!
//! ```text
//! NodePlan ─► NodeForwardingPlan objects (name, labels, ownerReference) ─► yaml | json | table | wide
//! ```
//!
//! YAML is multi-document and JSON a v1 `List`, both ready for `kubectl apply -f -`, sorted by node and
//! shard so diffs are reviewable. The table evaluates the CRD's own printer columns, so it has exactly
//! the shape `kubectl get nfp` shows.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;
use switchyard_api::{
    NodeForwardingPlan, NodeForwardingPlanSpec,
    crd::printer_columns,
    names::{LABEL_MANAGED_BY, LABEL_NODE, LABEL_SHARD, MANAGED_BY, plan_object_name, shard_label},
};

use crate::{Error, planner::NodePlan};

/// Output formats of the `plan` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Multi-document YAML.
    Yaml,
    /// A v1 List in JSON.
    Json,
    /// The `kubectl get nfp` table.
    Table,
    /// The `kubectl get nfp -o wide` table.
    Wide,
}

/// The objects of one node's plan.
pub fn objects(plan: &NodePlan) -> Vec<NodeForwardingPlan> {
    let count = plan.objects.len() as u32;
    plan.objects
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            object(
                &plan.node,
                plan.node_uid.as_deref(),
                index as u32,
                count,
                spec.clone(),
            )
        })
        .collect()
}

/// Shard `index` of `count` of a node's plan as an object: name, labels and the ownerReference to its Node
/// (`controller: true`, so the API server's garbage collector removes plans with their Node).
pub fn object(
    node: &str,
    node_uid: Option<&str>,
    index: u32,
    count: u32,
    spec: NodeForwardingPlanSpec,
) -> NodeForwardingPlan {
    let mut labels = BTreeMap::from([
        (LABEL_NODE.to_string(), node.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ]);
    if count > 1 {
        labels.insert(LABEL_SHARD.to_string(), shard_label(index, count));
    }
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
            name: Some(plan_object_name(node, index)),
            labels: Some(labels),
            owner_references,
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// Renders plans in the chosen format.
pub fn render(plans: &[NodePlan], format: Format) -> Result<String, Error> {
    let objects: Vec<NodeForwardingPlan> = plans.iter().flat_map(objects).collect();
    match format {
        Format::Yaml => {
            let mut out = String::new();
            for object in &objects {
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(object).map_err(|e| Error::Serialize(e.to_string()))?);
            }
            Ok(out)
        }
        Format::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            let mut text =
                serde_json::to_string_pretty(&list).map_err(|e| Error::Serialize(e.to_string()))?;
            text.push('\n');
            Ok(text)
        }
        Format::Table | Format::Wide => {
            let values: Vec<Value> = objects
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect();
            Ok(table(&values, format == Format::Wide))
        }
    }
}

/// `kubectl get nfp` for already-serialised objects (also used for objects read back from a cluster).
pub fn table(objects: &[Value], wide: bool) -> String {
    let columns: Vec<_> = printer_columns()
        .into_iter()
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
