//! Complete responses: a JSON body with a status code, and the `Status` object the API server
//! answers errors with. (A watch's open stream is built in [`super::watch`].)

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::{FakeBody, FakeBodyInner};

pub(super) fn full(status: StatusCode, body: &Value) -> Response<FakeBody> {
    let mut response = Response::new(FakeBody {
        inner: FakeBodyInner::Full(Some(Bytes::from(body.to_string()))),
    });
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

pub(super) fn status_error(code: StatusCode, reason: &str, message: &str) -> Response<FakeBody> {
    full(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "reason": reason, "code": code.as_u16()}),
    )
}
