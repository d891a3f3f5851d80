//! PATCH: server-side apply (and other patches, taken the same way) of an object or its status,
//! with field managers and 409 Conflict for an unforced apply of a spec another manager owns; and the
//! JSON merge patch (RFC 7386) of an Event that the event recorder sends to extend a series.

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::{
    FakeBody, State,
    managers::{other_spec_owner, record_manager},
    path::{Target, query_param},
    respond::{full, status_error},
};

/// PATCH of an Event.
pub(super) fn merge(
    state: &mut State,
    target: &Target,
    name: &str,
    body: Option<Value>,
) -> Response<FakeBody> {
    // Events have no spec: a JSON merge patch (RFC 7386) of an existing one, as the
    // Recorder sends to extend a series.
    let Some(patch) = body else {
        return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
    };
    let key = State::key(target, name);
    let Some(mut current) = state.objects.get(&target.kind).and_then(|m| m.get(&key)).cloned() else {
        return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found"));
    };
    merge_patch(&mut current, &patch);
    let (object, _) = state.upsert(target.kind, key, current);
    full(StatusCode::OK, &object)
}

/// PATCH of an object or its status subresource: a server-side apply (operation `Apply`), or any
/// other patch, taken the same way (operation `Update`).
pub(super) fn apply(
    state: &mut State,
    target: &Target,
    name: &str,
    query: &str,
    parts: &http::request::Parts,
    body: Option<Value>,
) -> Response<FakeBody> {
    let Some(patch) = body else {
        return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
    };
    let key = State::key(target, name);
    let current = state.objects.get(&target.kind).and_then(|m| m.get(&key)).cloned();
    let status_only = target.subresource.as_deref() == Some("status");
    let manager = query_param(query, "fieldManager").unwrap_or_else(|| "unknown".into());
    let forced = query_param(query, "force").as_deref() == Some("true");
    let apply = content_type_is_apply(parts);
    if apply
        && !forced
        && !status_only
        && patch.get("spec").is_some()
        && let Some(owner) = current.as_ref().and_then(|c| other_spec_owner(c, &manager))
    {
        return status_error(
            StatusCode::CONFLICT,
            "Conflict",
            &format!("Apply failed with 1 conflict: conflict with \"{owner}\": .spec"),
        );
    }
    let merged = match (current, status_only) {
        (None, true) => {
            return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found"));
        }
        (None, false) => {
            let mut object = patch;
            if let Some(map) = object.as_object_mut() {
                map.remove("status");
            }
            object
        }
        (Some(mut current), status_only) => {
            if status_only {
                current["status"] = patch.get("status").cloned().unwrap_or(Value::Null);
            } else {
                // Every top-level field but the server's own: `spec`, and for kinds
                // without one (EndpointSlice) their `endpoints`, `ports`, … .
                if let Some(fields) = patch.as_object() {
                    for (field, value) in fields {
                        if !matches!(field.as_str(), "metadata" | "status" | "apiVersion" | "kind") {
                            current[field.as_str()] = value.clone();
                        }
                    }
                }
                for field in ["labels", "annotations", "ownerReferences"] {
                    if let Some(value) = patch.pointer(&format!("/metadata/{field}")) {
                        current["metadata"][field] = value.clone();
                    }
                }
            }
            current
        }
    };
    let mut merged = merged;
    let operation = if apply { "Apply" } else { "Update" };
    if status_only || merged.get("spec").is_some() {
        record_manager(
            &mut merged,
            &manager,
            operation,
            target.subresource.as_deref(),
            target.kind.api_version(),
        );
    }
    let (object, _) = state.upsert(target.kind, key, merged);
    full(StatusCode::OK, &object)
}

/// A server-side apply patch (`application/apply-patch+yaml`).
/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(map) = target.as_object_mut() {
        for (key, value) in fields {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn content_type_is_apply(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/apply-patch"))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;

    use super::*;
    use crate::fake_apiserver::{FakeApiServer, Kind};

    #[tokio::test]
    async fn an_apply_replaces_top_level_fields_of_kinds_without_a_spec_and_drops_status_on_create() {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let server = FakeApiServer::new();
        let slices: Api<EndpointSlice> = Api::namespaced(server.client(), "default");
        let apply = kube::api::PatchParams::apply("test").force();
        let slice = |ready: bool| {
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                   "metadata": {"name": "s", "namespace": "default"},
                   "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready}}]})
        };
        slices
            .patch("s", &apply, &kube::api::Patch::Apply(slice(false)))
            .await
            .unwrap();
        slices
            .patch("s", &apply, &kube::api::Patch::Apply(slice(true)))
            .await
            .unwrap();
        let stored = slices.get("s").await.unwrap();
        assert_eq!(
            stored.endpoints.unwrap()[0].conditions.as_ref().unwrap().ready,
            Some(true)
        );

        let nodes: Api<Node> = Api::all(server.client());
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                          "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}});
        nodes
            .patch("n", &apply, &kube::api::Patch::Apply(node.clone()))
            .await
            .unwrap();
        assert!(
            nodes.get("n").await.unwrap().status.is_none(),
            "a create keeps no status"
        );
        nodes
            .patch_status("n", &apply, &kube::api::Patch::Apply(node))
            .await
            .unwrap();
        assert!(nodes.get("n").await.unwrap().status.is_some());
    }

    #[tokio::test]
    async fn events_are_created_then_merge_patched_like_the_recorder_expects() {
        use kube::runtime::events::{Event, EventType, Recorder, Reporter};
        let server = FakeApiServer::new();
        let recorder = Recorder::new(
            server.client(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Service".into()),
            namespace: Some("ns1".into()),
            name: Some("web".into()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "NoEndpoints".into(),
            note: Some("none".into()),
            action: "Proxy".into(),
            secondary: None,
        };
        recorder.publish(&event, &regarding).await.unwrap();
        recorder.publish(&event, &regarding).await.unwrap();
        let keys = server.keys(Kind::Event);
        assert_eq!(keys.len(), 1, "the repeat extends the series: {keys:?}");
        let stored = server.get(Kind::Event, &keys[0]).unwrap();
        assert!(keys[0].starts_with("ns1/web."), "{keys:?}");
        assert_eq!(stored["series"]["count"], 2, "{stored}");
        assert_eq!(stored["reason"], "NoEndpoints");
        // A merge patch of an Event that does not exist is a 404, as on a real API server.
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(server.client(), "ns1");
        let missing = api
            .patch(
                "nope",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"note": "x"})),
            )
            .await;
        assert!(matches!(missing, Err(kube::Error::Api(e)) if e.code == 404));
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        merge_patch(
            &mut target,
            &json!({"a": null, "b": {"c": 4}, "e": [2], "f": "new"}),
        );
        assert_eq!(target, json!({"b": {"c": 4, "d": 3}, "e": [2], "f": "new"}));
    }
}
