//! Plan files and status files on local disk.
//!
//! ```text
//! file ─► parse_plan_text() ─► [spec, …]   one NodeForwardingPlan object (YAML or JSON), a `kind: List` of them,
//!                                           multi-document YAML of shard objects, or a bare spec
//! status ─► write_status() ─► <file>.tmp ─► rename ─► <file>   (readers never see half a file)
//! ```
//!
//! JSON goes through serde_json (fastest, least memory for a 10,000-service plan); YAML through
//! serde-saphyr with its resource budget raised to fit such plans (its defaults stop at 250,000 nodes,
//! which a 2,000-service plan already exceeds).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use switchyard_api::{NodeForwardingPlanSpec, NodeForwardingPlanStatus};

use crate::error::Error;

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

/// Parses the text of a plan file into the objects it holds.
pub fn parse_plan_text(text: &str) -> Result<Vec<NodeForwardingPlanSpec>, String> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err("the file is empty".into());
    }
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return parse_json(text);
    }
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

/// Reads and parses a plan file.
pub fn read_plan_file(path: &Path) -> Result<Vec<Arc<NodeForwardingPlanSpec>>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadPlan {
        path: path.to_path_buf(),
        source,
    })?;
    let specs = parse_plan_text(&text).map_err(|message| Error::ParsePlan {
        path: path.to_path_buf(),
        message,
    })?;
    drop(text);
    Ok(specs
        .into_iter()
        .map(|mut spec| {
            // The parser grows the entry list by doubling, which would leave up to ~40% of a
            // 10,000-entry list (over 1 MB) unused for the agent's life.
            spec.services.shrink_to_fit();
            Arc::new(spec)
        })
        .collect())
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
    use switchyard_api::testing::{EntryExt, entry, ep, plan};
    use switchyard_api::{NodeForwardingPlan, ShardInfo};

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
        for (name, text) in [
            ("object yaml", &object_yaml),
            ("object json", &object_json),
            ("bare yaml", &bare_yaml),
            ("bare json", &bare_json),
        ] {
            assert_eq!(parse_plan_text(text).unwrap(), vec![one.clone()], "{name}");
        }

        let mut shard = spec("node-a");
        shard.shard = Some(ShardInfo {
            index: 1,
            count: 2,
            members: vec![],
        });
        let multi = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&object(one.clone())).unwrap(),
            serde_saphyr::to_string(&object(shard.clone())).unwrap()
        );
        assert_eq!(parse_plan_text(&multi).unwrap(), vec![one.clone(), shard.clone()]);

        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [object(one.clone()), object(shard.clone())]});
        assert_eq!(parse_plan_text(&list.to_string()).unwrap().len(), 2);
        let list_yaml = serde_saphyr::to_string(&list).unwrap();
        assert_eq!(parse_plan_text(&list_yaml).unwrap().len(), 2);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(parse_plan_text("").unwrap_err().contains("empty"));
        let err = parse_plan_text(
            "apiVersion: switchyard.io/v1alpha1\nkind: NodeForwardingPlan\nspec:\n  nodeName: 3\n",
        )
        .unwrap_err();
        assert!(err.contains("NodeForwardingPlan object"), "{err}");
        let err = parse_plan_text("nodeName: a\n").unwrap_err();
        assert!(err.contains("bare spec"), "{err}");
        assert!(parse_plan_text("{\"nodeName\": ").is_err());
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
