//! DELETE of one object: watchers see it DELETED, with the deletion's resource version.

use http::{Response, StatusCode};

use super::{
    FakeBody, State,
    path::Target,
    respond::{full, status_error},
};

/// DELETE of an object.
pub(super) fn delete(state: &mut State, target: &Target, name: &str) -> Response<FakeBody> {
    let key = State::key(target, name);
    match state.objects.get_mut(&target.kind).and_then(|m| m.remove(&key)) {
        Some(object) => {
            state.bump();
            state.notify(target.kind, "DELETED", &object);
            full(StatusCode::OK, &object)
        }
        None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
    }
}
