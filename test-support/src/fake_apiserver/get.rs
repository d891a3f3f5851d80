//! GET of one object, and LIST of a collection (namespace, label and field selectors; the
//! collection's resource version).

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::{
    FakeBody, State,
    path::{Target, query_param},
    respond::{full, status_error},
    selectors::matches_selectors,
};

/// GET of one object.
pub(super) fn get(state: &State, target: &Target, name: &str) -> Response<FakeBody> {
    let key = State::key(target, name);
    match state.objects.get(&target.kind).and_then(|m| m.get(&key)) {
        Some(object) => full(StatusCode::OK, object),
        None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
    }
}

/// LIST of a collection.
pub(super) fn list(state: &State, target: &Target, query: &str) -> Response<FakeBody> {
    let labels = query_param(query, "labelSelector");
    let fields = query_param(query, "fieldSelector");
    let items: Vec<Value> = state
        .objects
        .get(&target.kind)
        .map(|m| {
            m.iter()
                .filter(|(key, _)| {
                    target
                        .namespace
                        .as_ref()
                        .is_none_or(|ns| key.starts_with(&format!("{ns}/")))
                })
                .map(|(_, v)| v)
                .filter(|v| matches_selectors(v, labels.as_deref(), fields.as_deref()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    full(
        StatusCode::OK,
        &json!({
            "apiVersion": target.kind.api_version(),
            "kind": format!("{}List", target.kind.kind()),
            "metadata": {"resourceVersion": state.resource_version.to_string()},
            "items": items,
        }),
    )
}
