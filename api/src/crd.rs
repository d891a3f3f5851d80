//! The CustomResourceDefinitions generated from the Rust types, and the schemas used to check objects.
//!
//! `make generate` writes [`crd_files`] to `crds/` (for `kubectl apply -f crds/`) and to `config/crd/`
//! (for kustomize, which may not read outside its root); a test fails when either copy differs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};
use kube::CustomResourceExt;

use crate::{Error, plan::NodeForwardingPlan, rollout::ForwardingRollout, slice::ForwardingSlice};

/// File name of the generated NodeForwardingPlan CRD in `crds/` and `config/crd/`.
pub const CRD_FILE: &str = "nodeforwardingplans.switchyard.io.yaml";
/// File name of the generated ForwardingSlice CRD in `crds/` and `config/crd/`.
pub const SLICE_CRD_FILE: &str = "forwardingslices.switchyard.io.yaml";
/// File name of the generated ForwardingRollout CRD in `crds/` and `config/crd/`.
pub const ROLLOUT_CRD_FILE: &str = "forwardingrollouts.switchyard.io.yaml";

/// Every CRD file `make generate` writes, in the order [`crd_files`] gives them; a CRD's name is its
/// file name without `.yaml`.
pub const CRD_FILES: [&str; 3] = [SLICE_CRD_FILE, CRD_FILE, ROLLOUT_CRD_FILE];

const HEADER: &str =
    "# Generated from api/src/plan.rs and api/src/status.rs by `make generate`. Do not edit.\n";
const SLICE_HEADER: &str = "# Generated from api/src/slice.rs by `make generate`. Do not edit.\n";
const ROLLOUT_HEADER: &str = "# Generated from api/src/rollout.rs by `make generate`. Do not edit.\n";

/// Integer formats the API server recognises; schemars' `uint8`/`uint16`/… are dropped because the API
/// server does not know them (the explicit minimum/maximum carry the range instead).
const KNOWN_INTEGER_FORMATS: [&str; 2] = ["int32", "int64"];

/// The NodeForwardingPlan CRD object.
pub fn crd() -> CustomResourceDefinition {
    tidy(NodeForwardingPlan::crd())
}

/// The ForwardingSlice CRD object.
pub fn slice_crd() -> CustomResourceDefinition {
    tidy(ForwardingSlice::crd())
}

/// The ForwardingRollout CRD object.
pub fn rollout_crd() -> CustomResourceDefinition {
    tidy(ForwardingRollout::crd())
}

fn tidy(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    tidy_schema(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// Drops integer formats the API server does not know.
fn tidy_schema(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let unknown_format = map.get("format").and_then(|f| f.as_str()).is_some_and(|f| {
                f.starts_with("uint") || (f.starts_with("int") && !KNOWN_INTEGER_FORMATS.contains(&f))
            });
            if unknown_format {
                map.remove("format");
            }
            map.values_mut().for_each(tidy_schema);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(tidy_schema),
        _ => {}
    }
}

/// The printer columns of the served version (what `kubectl get nfp` shows).
pub fn printer_columns() -> Vec<CustomResourceColumnDefinition> {
    columns_of(crd())
}

/// The ForwardingSlice printer columns (what `kubectl get fws` shows).
pub fn slice_printer_columns() -> Vec<CustomResourceColumnDefinition> {
    columns_of(slice_crd())
}

/// The ForwardingRollout printer columns (what `kubectl get fwr` shows).
pub fn rollout_printer_columns() -> Vec<CustomResourceColumnDefinition> {
    columns_of(rollout_crd())
}

fn columns_of(crd: CustomResourceDefinition) -> Vec<CustomResourceColumnDefinition> {
    crd.spec
        .versions
        .into_iter()
        .next()
        .and_then(|v| v.additional_printer_columns)
        .unwrap_or_default()
}

/// The NodeForwardingPlan CRD as committed YAML.
pub fn crd_yaml() -> Result<String, Error> {
    let body = serde_saphyr::to_string(&crd()).map_err(|e| Error::SerializeCrd(e.to_string()))?;
    Ok(format!("{HEADER}{body}"))
}

/// Every generated CRD file: (file name, YAML).
pub fn crd_files() -> Result<Vec<(&'static str, String)>, Error> {
    let slice = serde_saphyr::to_string(&slice_crd()).map_err(|e| Error::SerializeCrd(e.to_string()))?;
    let rollout = serde_saphyr::to_string(&rollout_crd()).map_err(|e| Error::SerializeCrd(e.to_string()))?;
    Ok(vec![
        (SLICE_CRD_FILE, format!("{SLICE_HEADER}{slice}")),
        (CRD_FILE, crd_yaml()?),
        (ROLLOUT_CRD_FILE, format!("{ROLLOUT_HEADER}{rollout}")),
    ])
}

/// The served version's `openAPIV3Schema` as JSON Schema a draft-4 validator understands: OpenAPI's
/// `nullable: true` becomes `type: [T, "null"]`. CEL rules and `x-kubernetes-*` extensions are not
/// checked by such a validator; the API server checks them.
pub fn validation_schema() -> serde_json::Value {
    schema_of(crd())
}

/// [`validation_schema`] of the ForwardingRollout CRD.
pub fn rollout_validation_schema() -> serde_json::Value {
    schema_of(rollout_crd())
}

/// [`validation_schema`] of the ForwardingSlice CRD.
pub fn slice_validation_schema() -> serde_json::Value {
    schema_of(slice_crd())
}

fn schema_of(crd: CustomResourceDefinition) -> serde_json::Value {
    let schema = crd
        .spec
        .versions
        .into_iter()
        .next()
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or_default();
    let mut schema = schema;
    translate_nullable(&mut schema);
    schema
}

fn translate_nullable(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map.remove("nullable") == Some(serde_json::Value::Bool(true))
                && let Some(serde_json::Value::String(ty)) = map.get("type").cloned()
            {
                map.insert("type".into(), serde_json::json!([ty, "null"]));
            }
            map.values_mut().for_each(translate_nullable);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(translate_nullable),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn repo_file(parts: &[&str]) -> PathBuf {
        let mut path = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        path.pop();
        parts.iter().for_each(|p| path.push(p));
        path
    }

    #[test]
    fn committed_crd_yaml_matches_the_types() {
        for (file, want) in crd_files().unwrap() {
            for dir in ["crds", "config/crd"] {
                let path = repo_file(&[dir, file]);
                let have = std::fs::read_to_string(&path).unwrap_or_default();
                assert!(
                    have == want,
                    "{} differs from the Rust types: run `make generate` and commit the result",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn the_slice_crd_is_cluster_scoped_without_status_and_selectable_by_view() {
        let crd = slice_crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("forwardingslices.switchyard.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["fws".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha2");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_none()
        );
        let columns: Vec<String> = slice_printer_columns().into_iter().map(|c| c.name).collect();
        for want in ["View", "Entries", "Revision"] {
            assert!(columns.iter().any(|c| c == want), "missing column {want}");
        }
    }

    #[test]
    fn crd_is_cluster_scoped_with_status_and_short_name() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("nodeforwardingplans.switchyard.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["nfp".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha2");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }

    #[test]
    fn the_spec_is_atomic_so_a_forced_apply_replaces_hand_added_fields() {
        let crd = crd();
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("spec"))
            .cloned()
            .unwrap();
        assert_eq!(schema.x_kubernetes_map_type.as_deref(), Some("atomic"));
    }

    #[test]
    fn printer_columns_show_desired_and_observed_revision_side_by_side() {
        let names: Vec<String> = printer_columns().into_iter().map(|c| c.name).collect();
        let desired = names.iter().position(|n| n == "Desired").unwrap();
        assert_eq!(names[desired + 1], "Observed");
        assert_eq!(names[desired + 2], "Slices");
        for want in [
            "Backend",
            "Services",
            "Endpoints",
            "Applied",
            "Rules",
            "Last Sync",
            "Age",
        ] {
            assert!(names.iter().any(|n| n == want), "missing column {want}");
        }
    }

    #[test]
    fn the_rollout_crd_is_cluster_scoped_with_status_progress_columns_and_fixed_plan_fields() {
        let crd = rollout_crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("forwardingrollouts.switchyard.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["fwr".to_string()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["switchyard".to_string()]));
        let version = &crd.spec.versions[0];
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<String> = rollout_printer_columns().into_iter().map(|c| c.name).collect();
        assert_eq!(columns, ["Target", "Done", "Phase", "Message", "Age"]);
        let spec = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("spec"))
            .and_then(|s| s.properties.clone())
            .unwrap();
        // Every field but paused and abort carries a transition rule: the API server refuses edits.
        for (field, schema) in &spec {
            let rules = schema.x_kubernetes_validations.as_deref().unwrap_or_default();
            let fixed = rules.iter().any(|r| r.rule == "self == oldSelf");
            assert_eq!(fixed, !["paused", "abort"].contains(&field.as_str()), "{field}");
        }
    }

    #[test]
    fn nullable_becomes_a_type_union() {
        let mut v = serde_json::json!({"properties": {"a": {"type": "string", "nullable": true}}});
        translate_nullable(&mut v);
        assert_eq!(
            v["properties"]["a"]["type"],
            serde_json::json!(["string", "null"])
        );
    }
}
