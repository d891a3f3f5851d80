//! POST (create: 409 AlreadyExists for a name taken) and PUT (replace, of the object or its status:
//! optimistic concurrency on `metadata.resourceVersion`, 409 Conflict when it is stale). Both record
//! the writer's `fieldManager` as an `Update` in `managedFields`.

use http::{Response, StatusCode};
use serde_json::Value;

use super::{
    FakeBody, State,
    managers::record_manager,
    path::{Target, query_param},
    respond::{full, status_error},
};

/// POST to a collection.
pub(super) fn create(
    state: &mut State,
    target: &Target,
    query: &str,
    body: Option<Value>,
) -> Response<FakeBody> {
    let Some(object) = body else {
        return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let key = State::key(target, &name);
    if state
        .objects
        .get(&target.kind)
        .is_some_and(|m| m.contains_key(&key))
    {
        return status_error(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("{name} already exists"),
        );
    }
    let mut object = object;
    let manager = query_param(query, "fieldManager").unwrap_or_else(|| "unknown".into());
    record_manager(&mut object, &manager, "Update", None, target.kind.api_version());
    let (object, _) = state.upsert(target.kind, key, object);
    full(StatusCode::CREATED, &object)
}

/// PUT of an object (or of its status subresource).
pub(super) fn replace(
    state: &mut State,
    target: &Target,
    name: &str,
    query: &str,
    body: Option<Value>,
) -> Response<FakeBody> {
    let Some(object) = body else {
        return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
    };
    let key = State::key(target, name);
    let current = state.objects.get(&target.kind).and_then(|m| m.get(&key)).cloned();
    let Some(current) = current else {
        return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found"));
    };
    let want = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let have = current
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if want.is_some() && want != have {
        return status_error(StatusCode::CONFLICT, "Conflict", "the object has been modified");
    }
    let mut object = object;
    if let Some(fields) = current.pointer("/metadata/managedFields") {
        object["metadata"]["managedFields"] = fields.clone();
    }
    let manager = query_param(query, "fieldManager").unwrap_or_else(|| "unknown".into());
    record_manager(
        &mut object,
        &manager,
        "Update",
        target.subresource.as_deref(),
        target.kind.api_version(),
    );
    let (object, _) = state.upsert(target.kind, key, object);
    full(StatusCode::OK, &object)
}
