//! Server-side apply's field ownership at the grain the fake keeps it: `managedFields` holds one entry
//! per manager and subresource, owning the whole spec (specs are atomic) or the status.

use serde_json::{Value, json};

/// Records `manager` as owner of the spec (or of the status, for the status subresource) in
/// `managedFields`, replacing its earlier entry for the same subresource.
pub(super) fn record_manager(
    object: &mut Value,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    api_version: &str,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let time = now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now);
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let fields = meta.entry("managedFields").or_insert_with(|| json!([]));
    let Some(list) = fields.as_array_mut() else {
        return;
    };
    let owned = if subresource == Some("status") {
        "f:status"
    } else {
        "f:spec"
    };
    list.retain(|entry| {
        !(entry.get("manager").and_then(Value::as_str) == Some(manager)
            && entry.get("subresource").and_then(Value::as_str) == subresource)
    });
    if subresource.is_none() {
        // The spec is atomic: whoever writes it now owns it whole.
        for entry in list.iter_mut() {
            if entry.get("subresource").is_none()
                && let Some(fields) = entry.pointer_mut("/fieldsV1").and_then(Value::as_object_mut)
            {
                fields.remove("f:spec");
            }
        }
        list.retain(|entry| {
            entry.get("subresource").is_some()
                || entry
                    .pointer("/fieldsV1")
                    .and_then(Value::as_object)
                    .is_some_and(|f| !f.is_empty())
        });
    }
    let mut entry = json!({
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": time.to_string(),
        "fieldsType": "FieldsV1",
        "fieldsV1": {owned: {}},
    });
    if let (Some(sub), Some(map)) = (subresource, entry.as_object_mut()) {
        map.insert("subresource".into(), json!(sub));
    }
    list.push(entry);
}

/// The manager that owns the spec now, other than `manager`.
pub(super) fn other_spec_owner(object: &Value, manager: &str) -> Option<String> {
    object
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|e| e.get("subresource").is_none())
        .filter(|e| e.pointer("/fieldsV1/f:spec").is_some())
        .filter_map(|e| e.get("manager").and_then(Value::as_str))
        .find(|m| *m != manager)
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use kube::Api;

    use crate::fake_apiserver::FakeApiServer;

    #[tokio::test]
    async fn server_side_apply_tracks_managers_and_conflicts_without_force() {
        use kube::api::{Patch, PatchParams};
        use switchyard_api::{ForwardingSlice, testing::slice};
        let server = FakeApiServer::new();
        let api: Api<ForwardingSlice> = Api::all(server.client());
        let (name, spec) = slice("all", 0, 1, vec![]);
        let object = ForwardingSlice::new(&name, spec);
        let forced = PatchParams::apply("switchyard-controller").force();
        let written = api.patch(&name, &forced, &Patch::Apply(&object)).await.unwrap();
        let managers: Vec<_> = written
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|f| (f.manager.clone().unwrap(), f.operation.clone().unwrap()))
            .collect();
        assert_eq!(
            managers,
            [("switchyard-controller".to_string(), "Apply".to_string())]
        );
        assert!(switchyard_api::meta::written_at(&written.metadata).is_some());
        let gentle = PatchParams::apply("kubectl");
        let conflict = api.patch(&name, &gentle, &Patch::Apply(&object)).await;
        assert!(
            matches!(&conflict, Err(kube::Error::Api(e)) if e.code == 409),
            "{conflict:?}"
        );
        let taken = api
            .patch(
                &name,
                &PatchParams::apply("kubectl").force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap();
        let owners: Vec<_> = taken
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.manager.clone())
            .collect();
        assert_eq!(owners, ["kubectl"], "an atomic spec has one owner");
    }
}
