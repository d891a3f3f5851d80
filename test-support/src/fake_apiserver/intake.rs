//! What every request meets before its verb handler: writes of a count-only kind answered at once,
//! the request log, hangs and delays, injected failures.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::{
    FakeApiServer, FakeBody, FakeBodyInner, Recorded, State, path::parse_path, respond::status_error,
};

impl FakeApiServer {
    /// Whether the request is a write of a kind in count-only mode ([`FakeApiServer::count_only`]).
    pub(super) fn counted(&self, parts: &http::request::Parts) -> bool {
        parse_path(parts.uri.path()).is_some_and(|t| {
            parts.method != Method::GET && self.state.lock().is_ok_and(|s| s.count_only.contains(&t.kind))
        })
    }

    /// Records a count-only write and answers it without storing anything.
    pub(super) fn count(&self, parts: &http::request::Parts, bytes: Bytes) -> Response<FakeBody> {
        if let Ok(mut state) = self.state.lock() {
            state.log.push(Recorded {
                method: parts.method.clone(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: None,
                body: None,
                body_len: bytes.len(),
                at: tokio::time::Instant::now(),
            });
        }
        // A counted write answers with what it sent (an apply's object), a delete with a Status.
        let answer = if parts.method == Method::DELETE {
            Bytes::from(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}).to_string())
        } else {
            bytes
        };
        let mut response = Response::new(FakeBody {
            inner: FakeBodyInner::Full(Some(answer)),
        });
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    /// Records the request, then holds it back if a hang or delay matches (for good: the future never
    /// completes): its path, query and JSON body.
    pub(super) async fn admit(
        &self,
        parts: &http::request::Parts,
        bytes: &Bytes,
    ) -> (String, String, Option<Value>) {
        let body_len = bytes.len();
        let body: Option<Value> = if bytes.is_empty() {
            None
        } else {
            serde_json::from_slice(bytes).ok()
        };
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let held: Option<Option<std::time::Duration>> = match self.state.lock() {
            Ok(mut state) => {
                state.log.push(Recorded {
                    method: parts.method.clone(),
                    path: path.clone(),
                    query: query.clone(),
                    content_type,
                    body: body.clone(),
                    body_len,
                    at: tokio::time::Instant::now(),
                });
                state
                    .hangs
                    .iter()
                    .find(|h| h.matches(&parts.method, &path, &query))
                    .map(|h| h.delay)
            }
            Err(_) => None,
        };
        match held {
            Some(None) => return std::future::pending().await,
            Some(Some(delay)) => tokio::time::sleep(delay).await,
            None => {}
        }
        (path, query, body)
    }
}

/// The answer of an injected failure that matches the request, if one is left.
pub(super) fn injected_failure(state: &mut State, method: &Method, path: &str) -> Option<Response<FakeBody>> {
    if let Some(failure) = state
        .failures
        .iter_mut()
        .find(|f| f.remaining > 0 && f.method == *method && path.contains(&f.path_contains))
    {
        failure.remaining -= 1;
        let code = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Some(status_error(code, "Injected", "injected failure"));
    }
    None
}
