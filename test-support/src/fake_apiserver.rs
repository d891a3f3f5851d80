//! A fake Kubernetes API server at the HTTP level, for tests and scale simulations (feature `testing`).
//!
//! ```text
//! kube::Client ─► tower-test mock service ─► FakeApiServer::serve (routes by method + path)
//!     LIST  → items + resourceVersion         WATCH → an open stream of ADDED/MODIFIED/DELETED events
//!     GET / POST / PUT (optimistic concurrency) / PATCH (server-side apply, main or status) / DELETE
//!     every request is recorded; failures can be injected per method and path, or requests left hanging
//!     without an answer; watches can be closed (a restart) or expired with 410 Gone (watchers relist)
//! ```
//!
//! It is state-based, not a script: tests assert on the requests it received and the objects it holds,
//! so a refactor that issues the same writes in another order does not break them. Server-side apply is
//! modelled as "the patch's spec (or status) replaces the stored one" (our specs are atomic), with field
//! ownership at that grain: `managedFields` gets one entry per manager and subresource (operation,
//! apiVersion, time), and an apply without `force=true` of a spec another manager owns answers 409
//! Conflict, as the real server does. Label selectors: equality (`=`, `==`, `!=`), set-based (`in`,
//! `notin`) and existence (`key`, `!key`).

use std::{
    collections::BTreeMap,
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A response body that is either complete or an open watch stream.
pub struct FakeBody {
    inner: FakeBodyInner,
}

enum FakeBodyInner {
    Full(Option<Bytes>),
    Stream(mpsc::UnboundedReceiver<Bytes>),
}

impl http_body::Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.inner {
            FakeBodyInner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            FakeBodyInner::Stream(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// Path without the query.
    pub path: String,
    /// Query string (may be empty).
    pub query: String,
    /// Content type of the body, if any.
    pub content_type: Option<String>,
    /// JSON body, if any (not kept for kinds in count-only mode).
    pub body: Option<Value>,
    /// Size of the request body in bytes.
    pub body_len: usize,
    /// When it arrived (Tokio's clock: virtual time in paused-clock simulations).
    pub at: tokio::time::Instant,
}

impl Recorded {
    /// True for writes (anything but GET).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

/// A resource collection the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 Services.
    Service,
    /// discovery.k8s.io/v1 EndpointSlices.
    EndpointSlice,
    /// core/v1 Nodes.
    Node,
    /// switchyard.io/v1alpha2 NodeForwardingPlans.
    Plan,
    /// switchyard.io/v1alpha2 ForwardingSlices.
    ForwardingSlice,
    /// coordination.k8s.io/v1 Leases.
    Lease,
    /// events.k8s.io/v1 Events.
    Event,
    /// apiextensions.k8s.io/v1 CustomResourceDefinitions (established as soon as they are stored).
    CustomResourceDefinition,
    /// core/v1 Namespaces (stored; nothing is refused for a namespace that does not exist).
    Namespace,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Self::Service | Self::Node | Self::Namespace => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::Plan | Self::ForwardingSlice => "switchyard.io/v1alpha2",
            Self::Lease => "coordination.k8s.io/v1",
            Self::Event => "events.k8s.io/v1",
            Self::CustomResourceDefinition => "apiextensions.k8s.io/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
            Self::Plan => "NodeForwardingPlan",
            Self::ForwardingSlice => "ForwardingSlice",
            Self::Lease => "Lease",
            Self::Event => "Event",
            Self::CustomResourceDefinition => "CustomResourceDefinition",
            Self::Namespace => "Namespace",
        }
    }
}

/// Where a request points: the collection, optional namespace, optional name, optional subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/..., /apis/<group>/<version>/...
    let rest = match parts.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(name.to_string()), None),
        [resource, name, sub] => (*resource, Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    let kind = match resource {
        "services" => Kind::Service,
        "endpointslices" => Kind::EndpointSlice,
        "nodes" => Kind::Node,
        "nodeforwardingplans" => Kind::Plan,
        "forwardingslices" => Kind::ForwardingSlice,
        "leases" => Kind::Lease,
        "events" => Kind::Event,
        "customresourcedefinitions" => Kind::CustomResourceDefinition,
        "namespaces" => Kind::Namespace,
        _ => return None,
    };
    Some(Target {
        kind,
        namespace,
        name,
        subresource,
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A label or field selector against a map: comma-separated terms, each `k=v`, `k==v`, `k!=v`,
/// `k in (a,b)`, `k notin (a,b)`, `k` or `!k` (commas inside parentheses belong to the set).
fn selector_matches(selector: &str, lookup: impl Fn(&str) -> Option<String>) -> bool {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| term_matches(term, &lookup))
}

fn term_matches(term: &str, lookup: &impl Fn(&str) -> Option<String>) -> bool {
    let set = |rest: &str| -> Vec<String> {
        rest.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.trim().to_string())
            .collect()
    };
    if let Some((key, rest)) = term.split_once(" notin ") {
        return lookup(key.trim()).is_none_or(|v| !set(rest).contains(&v));
    }
    if let Some((key, rest)) = term.split_once(" in ") {
        return lookup(key.trim()).is_some_and(|v| set(rest).contains(&v));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return lookup(k.trim()).as_deref() != Some(v.trim());
    }
    if let Some((k, v)) = term.split_once('=') {
        return lookup(k.trim()).as_deref() == Some(v.trim_start_matches('=').trim());
    }
    match term.strip_prefix('!') {
        Some(key) => lookup(key.trim()).is_none(),
        None => lookup(term).is_some(),
    }
}

/// Records `manager` as owner of the spec (or of the status, for the status subresource) in
/// `managedFields`, replacing its earlier entry for the same subresource.
fn record_manager(
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
fn other_spec_owner(object: &Value, manager: &str) -> Option<String> {
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

struct Watcher {
    kind: Kind,
    labels: Option<String>,
    fields: Option<String>,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// An injected failure.
#[derive(Debug, Clone)]
struct Failure {
    method: Method,
    path_contains: String,
    status: u16,
    remaining: usize,
}

/// Requests that are never answered (a hung API server or connection).
#[derive(Debug, Clone)]
struct Hang {
    method: Method,
    path_contains: String,
    /// One `key=value` pair the query must hold, if any.
    query_pair: Option<String>,
    /// How long the answer is held back; `None`: for good.
    delay: Option<std::time::Duration>,
}

impl Hang {
    fn matches(&self, method: &Method, path: &str, query: &str) -> bool {
        self.method == method
            && path.contains(&self.path_contains)
            && self
                .query_pair
                .as_deref()
                .is_none_or(|pair| query.split('&').any(|p| p == pair))
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<Kind, BTreeMap<String, Value>>,
    resource_version: u64,
    watchers: Vec<Watcher>,
    log: Vec<Recorded>,
    failures: Vec<Failure>,
    hangs: Vec<Hang>,
    /// Kinds whose writes are only counted (scale simulations): bodies are neither kept nor parsed.
    count_only: Vec<Kind>,
    /// The last events (resource version, kind, watch line, object), replayed to a watch that starts
    /// from an older resource version, as the API server's watch cache does.
    history: std::collections::VecDeque<(u64, Kind, String, Value)>,
    /// Events up to this resource version are gone (history full, or [`FakeApiServer::expire_watches`]):
    /// a watch from there or older gets `410 Gone`.
    compacted_through: u64,
}

/// How many events the watch cache keeps.
const WATCH_HISTORY: usize = 10_000;

/// The watch event a real API server sends for a resource version it no longer has.
fn gone_line() -> String {
    format!(
        "{}\n",
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Expired", "message": "too old resource version", "code": 410}})
    )
}

impl State {
    fn key(target: &Target, name: &str) -> String {
        match &target.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        }
    }

    fn bump(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    fn notify(&mut self, kind: Kind, event: &str, object: &Value) {
        let mut object = object.clone();
        // As the real server: a DELETED event carries the deletion's resource version.
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.resource_version.to_string()));
        }
        let line = format!("{}\n", json!({"type": event, "object": object}));
        if self.history.len() == WATCH_HISTORY
            && let Some((dropped, ..)) = self.history.pop_front()
        {
            self.compacted_through = dropped;
        }
        self.history
            .push_back((self.resource_version, kind, line.clone(), object.clone()));
        let object = &object;
        self.watchers.retain(|w| {
            if w.kind != kind || !matches_selectors(object, w.labels.as_deref(), w.fields.as_deref()) {
                return !w.tx.is_closed();
            }
            w.tx.send(Bytes::from(line.clone())).is_ok()
        });
    }

    fn upsert(&mut self, kind: Kind, key: String, mut object: Value) -> (Value, bool) {
        let rv = self.bump();
        let existing = self.objects.get(&kind).and_then(|m| m.get(&key)).cloned();
        let created = existing.is_none();
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv));
            let uid = existing
                .as_ref()
                .and_then(|e| e.pointer("/metadata/uid").cloned())
                .or_else(|| meta.get("uid").cloned())
                .unwrap_or_else(|| json!(format!("uid-{}-{rv}", kind.kind().to_lowercase())));
            meta.insert("uid".into(), uid);
            let created_at = existing
                .as_ref()
                .and_then(|e| e.pointer("/metadata/creationTimestamp").cloned())
                .unwrap_or_else(|| json!("2026-11-29T00:00:00Z"));
            meta.insert("creationTimestamp".into(), created_at);
        }
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(kind.api_version()));
            map.insert("kind".into(), json!(kind.kind()));
            // The real server's CRD controller marks a definition Established within moments.
            if kind == Kind::CustomResourceDefinition {
                map.insert(
                    "status".into(),
                    json!({"conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted", "lastTransitionTime": "2026-11-29T00:00:00Z"}]}),
                );
            }
        }
        self.objects.entry(kind).or_default().insert(key, object.clone());
        self.notify(kind, if created { "ADDED" } else { "MODIFIED" }, &object);
        (object, created)
    }
}

fn matches_selectors(object: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    let label_ok = labels.is_none_or(|sel| {
        selector_matches(sel, |k| {
            object
                .pointer("/metadata/labels")?
                .get(k)?
                .as_str()
                .map(str::to_string)
        })
    });
    let field_ok = fields.is_none_or(|sel| {
        selector_matches(sel, |k| {
            let pointer = format!("/{}", k.replace('.', "/"));
            object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .map(str::to_string)
        })
    });
    label_ok && field_ok
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

fn full(status: StatusCode, body: &Value) -> Response<FakeBody> {
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

fn status_error(code: StatusCode, reason: &str, message: &str) -> Response<FakeBody> {
    full(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "reason": reason, "code": code.as_u16()}),
    )
}

/// The fake server. Cheap to clone; all clones share state.
#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
}

impl FakeApiServer {
    /// An empty server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A `kube::Client` talking to this server through a tower-test mock service. Needs a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<FakeBody>>();
        let server = self.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let response = server.serve(request).await;
                    respond.send_response(response);
                });
            }
        });
        kube::Client::new(service, "default")
    }

    /// Serves the same API over plain HTTP on `127.0.0.1:<ephemeral>` (for a controller in another
    /// process, so its memory can be measured on its own): the address and the server task.
    pub async fn serve_http(&self) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = self.clone();
        let app = axum::Router::new().fallback(move |request: Request<axum::body::Body>| {
            let server = server.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let request = Request::from_parts(parts, Body::from(bytes.to_vec()));
                server.serve(request).await.map(axum::body::Body::new)
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((addr, task))
    }

    /// Adds or replaces an object (as if someone else wrote it); watchers see it.
    pub fn put(&self, kind: Kind, object: impl serde::Serialize) {
        let Ok(object) = serde_json::to_value(object) else {
            return;
        };
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let key = match object.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        };
        if let Ok(mut state) = self.state.lock() {
            state.upsert(kind, key, object);
        }
    }

    /// Puts a cluster's Nodes, Services and EndpointSlices (as their controllers would have written
    /// them).
    pub fn seed(
        &self,
        nodes: &[k8s_openapi::api::core::v1::Node],
        services: &[k8s_openapi::api::core::v1::Service],
        slices: &[k8s_openapi::api::discovery::v1::EndpointSlice],
    ) {
        for node in nodes {
            self.put(Kind::Node, node);
        }
        for service in services {
            self.put(Kind::Service, service);
        }
        for slice in slices {
            self.put(Kind::EndpointSlice, slice);
        }
    }

    /// Deletes an object (as if someone else did); watchers see it.
    pub fn remove(&self, kind: Kind, key: &str) {
        if let Ok(mut state) = self.state.lock()
            && let Some(object) = state.objects.get_mut(&kind).and_then(|m| m.remove(key))
        {
            state.bump();
            state.notify(kind, "DELETED", &object);
        }
    }

    /// One stored object.
    pub fn get(&self, kind: Kind, key: &str) -> Option<Value> {
        self.state.lock().ok()?.objects.get(&kind)?.get(key).cloned()
    }

    /// Keys of every stored object of a kind.
    pub fn keys(&self, kind: Kind) -> Vec<String> {
        self.state
            .lock()
            .map(|s| {
                s.objects
                    .get(&kind)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().map(|s| s.log.clone()).unwrap_or_default()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.log.clear();
        }
    }

    /// Makes the next `times` requests with this method whose path contains `path_contains` fail.
    pub fn fail(&self, method: Method, path_contains: &str, status: u16, times: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.failures.push(Failure {
                method,
                path_contains: path_contains.to_string(),
                status,
                remaining: times,
            });
        }
    }

    /// Leaves every later request with this method whose path contains `path_contains` (and whose query
    /// holds `query_pair`, e.g. `limit=1`, when given) without an answer, for good: the request is
    /// recorded, then its response never comes, as with a hung API server or connection.
    pub fn hang(&self, method: Method, path_contains: &str, query_pair: Option<&str>) {
        if let Ok(mut state) = self.state.lock() {
            state.hangs.push(Hang {
                method,
                path_contains: path_contains.to_string(),
                query_pair: query_pair.map(str::to_string),
                delay: None,
            });
        }
    }

    /// Answers every later request with this method whose path contains `path_contains` only after
    /// `delay` (a slow API server); [`Self::clear_faults`] ends it.
    pub fn slow(&self, method: Method, path_contains: &str, delay: std::time::Duration) {
        if let Ok(mut state) = self.state.lock() {
            state.hangs.push(Hang {
                method,
                path_contains: path_contains.to_string(),
                query_pair: None,
                delay: Some(delay),
            });
        }
    }

    /// Removes every injected failure, hang and delay: the server answers normally again (requests
    /// already hanging stay so).
    pub fn clear_faults(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.failures.clear();
            state.hangs.clear();
        }
    }

    /// Removes an object without telling the watchers, as if the event was lost while a watch was
    /// down; a relist (see [`Self::expire_watches`]) shows the object gone.
    pub fn remove_unseen(&self, kind: Kind, key: &str) {
        if let Ok(mut state) = self.state.lock()
            && state.objects.get_mut(&kind).and_then(|m| m.remove(key)).is_some()
        {
            state.bump();
        }
    }

    /// Ends every open watch stream (as an API server restart would).
    pub fn close_watches(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.watchers.clear();
        }
    }

    /// Scale simulations: writes of `kind` are recorded with their size and answered with their own body,
    /// but nothing is stored, parsed or sent to watchers (a thousand 1 MiB plans would not fit in memory).
    pub fn count_only(&self, kind: Kind) {
        if let Ok(mut state) = self.state.lock() {
            state.count_only.push(kind);
        }
    }

    /// Ends every open watch with an `ERROR` event `410 Gone` (the resource version is too old), as an
    /// API server does after etcd compaction: watchers must relist.
    pub fn expire_watches(&self) {
        if let Ok(mut state) = self.state.lock() {
            // Compaction: nothing before now can be watched from any more.
            state.compacted_through = state.resource_version;
            state.history.clear();
            let line = gone_line();
            for watcher in state.watchers.drain(..) {
                let _ = watcher.tx.send(Bytes::from(line.clone()));
            }
        }
    }

    async fn serve(&self, request: Request<Body>) -> Response<FakeBody> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let counted = parse_path(parts.uri.path()).is_some_and(|t| {
            parts.method != Method::GET && self.state.lock().is_ok_and(|s| s.count_only.contains(&t.kind))
        });
        if counted {
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
            return response;
        }
        let body_len = bytes.len();
        let body: Option<Value> = if bytes.is_empty() {
            None
        } else {
            serde_json::from_slice(&bytes).ok()
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
        let Ok(mut state) = self.state.lock() else {
            return status_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "poisoned");
        };
        if let Some(failure) = state
            .failures
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == parts.method && path.contains(&f.path_contains))
        {
            failure.remaining -= 1;
            let code = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return status_error(code, "Injected", "injected failure");
        }
        let Some(target) = parse_path(&path) else {
            return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("no route for {path}"));
        };
        match (parts.method.clone(), target.name.clone()) {
            (Method::GET, None) => Self::list_or_watch(&mut state, &target, &query),
            (Method::GET, Some(name)) => {
                let key = State::key(&target, &name);
                match state.objects.get(&target.kind).and_then(|m| m.get(&key)) {
                    Some(object) => full(StatusCode::OK, object),
                    None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
                }
            }
            (Method::POST, None) => {
                let Some(object) = body else {
                    return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let key = State::key(&target, &name);
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
                let manager = query_param(&query, "fieldManager").unwrap_or_else(|| "unknown".into());
                record_manager(&mut object, &manager, "Update", None, target.kind.api_version());
                let (object, _) = state.upsert(target.kind, key, object);
                full(StatusCode::CREATED, &object)
            }
            (Method::PUT, Some(name)) => {
                let Some(object) = body else {
                    return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let key = State::key(&target, &name);
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
                let manager = query_param(&query, "fieldManager").unwrap_or_else(|| "unknown".into());
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
            (Method::PATCH, Some(name)) if target.kind == Kind::Event => {
                // Events have no spec: a JSON merge patch (RFC 7386) of an existing one, as the
                // Recorder sends to extend a series.
                let Some(patch) = body else {
                    return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let key = State::key(&target, &name);
                let Some(mut current) = state.objects.get(&target.kind).and_then(|m| m.get(&key)).cloned()
                else {
                    return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found"));
                };
                merge_patch(&mut current, &patch);
                let (object, _) = state.upsert(target.kind, key, current);
                full(StatusCode::OK, &object)
            }
            (Method::PATCH, Some(name)) => {
                let Some(patch) = body else {
                    return status_error(StatusCode::BAD_REQUEST, "BadRequest", "no body");
                };
                let key = State::key(&target, &name);
                let current = state.objects.get(&target.kind).and_then(|m| m.get(&key)).cloned();
                let status_only = target.subresource.as_deref() == Some("status");
                let manager = query_param(&query, "fieldManager").unwrap_or_else(|| "unknown".into());
                let forced = query_param(&query, "force").as_deref() == Some("true");
                let apply = content_type_is_apply(&parts);
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
                                    if !matches!(
                                        field.as_str(),
                                        "metadata" | "status" | "apiVersion" | "kind"
                                    ) {
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
            (Method::DELETE, Some(name)) => {
                let key = State::key(&target, &name);
                match state.objects.get_mut(&target.kind).and_then(|m| m.remove(&key)) {
                    Some(object) => {
                        state.bump();
                        state.notify(target.kind, "DELETED", &object);
                        full(StatusCode::OK, &object)
                    }
                    None => status_error(StatusCode::NOT_FOUND, "NotFound", &format!("{name} not found")),
                }
            }
            _ => status_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "not supported",
            ),
        }
    }

    fn list_or_watch(state: &mut State, target: &Target, query: &str) -> Response<FakeBody> {
        let labels = query_param(query, "labelSelector");
        let fields = query_param(query, "fieldSelector");
        if query_param(query, "watch").as_deref() == Some("true")
            || query_param(query, "watch").as_deref() == Some("1")
        {
            let (tx, rx) = mpsc::unbounded_channel();
            // A watch from a resource version gets what happened after it (the watch cache), or
            // 410 Gone when that is no longer known; "0" or none means "from now".
            let from = query_param(query, "resourceVersion")
                .and_then(|rv| rv.parse::<u64>().ok())
                .filter(|rv| *rv > 0);
            if let Some(from) = from {
                if from < state.compacted_through {
                    let _ = tx.send(Bytes::from(gone_line()));
                } else {
                    for (rv, kind, line, object) in &state.history {
                        if *rv > from
                            && *kind == target.kind
                            && matches_selectors(object, labels.as_deref(), fields.as_deref())
                        {
                            let _ = tx.send(Bytes::from(line.clone()));
                        }
                    }
                }
            }
            state.watchers.push(Watcher {
                kind: target.kind,
                labels,
                fields,
                tx,
            });
            let mut response = Response::new(FakeBody {
                inner: FakeBodyInner::Stream(rx),
            });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return response;
        }
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
}

/// Waits until `check` holds, polling every 10 ms, for at most `timeout`. Returns whether it held.
pub async fn eventually(timeout: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::{Api, api::ListParams};

    use super::*;

    #[tokio::test]
    async fn lists_gets_and_watches() {
        let server = FakeApiServer::new();
        server.put(
            Kind::Node,
            json!({"metadata": {"name": "a", "labels": {"zone": "z1"}}}),
        );
        let client = server.client();
        let nodes: Api<Node> = Api::all(client);
        let list = nodes
            .list(&ListParams::default().labels("zone=z1"))
            .await
            .unwrap();
        assert_eq!(list.items.len(), 1);
        assert!(nodes.get("a").await.is_ok());
        assert!(matches!(nodes.get("b").await, Err(kube::Error::Api(e)) if e.code == 404));

        let mut stream = nodes
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        server.put(Kind::Node, json!({"metadata": {"name": "b"}}));
        let event = stream.next().await.unwrap().unwrap();
        assert!(matches!(event, kube::api::WatchEvent::Added(n) if n.metadata.name.as_deref() == Some("b")));
    }

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
    async fn a_watch_from_an_old_resource_version_replays_what_it_missed_or_gets_410() {
        let server = FakeApiServer::new();
        server.put(
            Kind::Node,
            json!({"metadata": {"name": "a", "labels": {"zone": "z1"}}}),
        );
        let nodes: Api<Node> = Api::all(server.client());
        let seen = nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        // While nobody watches: one change that matches the selector, one that does not, a delete.
        server.put(
            Kind::Node,
            json!({"metadata": {"name": "b", "labels": {"zone": "z1"}}}),
        );
        server.put(
            Kind::Node,
            json!({"metadata": {"name": "c", "labels": {"zone": "z2"}}}),
        );
        server.remove(Kind::Node, "a");
        let params = kube::api::WatchParams::default().labels("zone=z1");
        let mut stream = nodes.watch(&params, &seen).await.unwrap().boxed();
        let added = stream.next().await.unwrap().unwrap();
        assert!(matches!(added, kube::api::WatchEvent::Added(n) if n.metadata.name.as_deref() == Some("b")));
        let deleted = stream.next().await.unwrap().unwrap();
        let kube::api::WatchEvent::Deleted(gone) = deleted else {
            panic!("want DELETED of a, got {deleted:?}");
        };
        assert_eq!(gone.metadata.name.as_deref(), Some("a"));
        // The deletion carries its own resource version, after the one of b's creation.
        let rv = |n: &Node| {
            n.metadata
                .resource_version
                .clone()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        assert!(rv(&gone) > seen.parse::<u64>().unwrap() + 2);

        // After compaction the old resource version is gone: 410, so the client relists.
        server.expire_watches();
        let mut stream = nodes.watch(&params, &seen).await.unwrap().boxed();
        let event = stream.next().await.unwrap().unwrap();
        assert!(
            matches!(event, kube::api::WatchEvent::Error(ref e) if e.code == 410),
            "{event:?}"
        );
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

    #[tokio::test]
    async fn injected_failures_and_conflicts() {
        let server = FakeApiServer::new();
        server.put(Kind::Node, json!({"metadata": {"name": "a"}}));
        server.fail(Method::GET, "/nodes/a", 500, 1);
        let nodes: Api<Node> = Api::all(server.client());
        assert!(matches!(nodes.get("a").await, Err(kube::Error::Api(e)) if e.code == 500));
        let mut node = nodes.get("a").await.unwrap();
        node.metadata.resource_version = Some("999".into());
        assert!(
            matches!(nodes.replace("a", &Default::default(), &node).await, Err(kube::Error::Api(e)) if e.code == 409)
        );
        assert_eq!(server.requests().len(), 3);
    }

    #[test]
    fn paths_and_selectors() {
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/sys/leases/ctl").unwrap();
        assert_eq!(
            (t.kind, t.namespace.as_deref(), t.name.as_deref()),
            (Kind::Lease, Some("sys"), Some("ctl"))
        );
        let t = parse_path("/apis/switchyard.io/v1alpha2/nodeforwardingplans/node-a/status").unwrap();
        assert_eq!(t.subresource.as_deref(), Some("status"));
        assert_eq!(percent_decode("a%3Db%2Cc"), "a=b,c");
        let object = json!({"metadata": {"name": "n", "labels": {"x": "1", "view": "all"}}});
        assert!(matches_selectors(&object, Some("x=1"), Some("metadata.name=n")));
        assert!(!matches_selectors(&object, Some("x=2"), None));
        let cases = [
            ("x==1", true),
            ("x!=1", false),
            ("view in (all,zone-a)", true),
            ("view in (zone-a, zone-b)", false),
            ("view notin (zone-a)", true),
            ("missing notin (a)", true),
            ("x=1,view in (all,zone-a)", true),
            ("view in (all,zone-a),x=2", false),
            ("x", true),
            ("!x", false),
            ("!missing", true),
        ];
        for (selector, want) in cases {
            assert_eq!(
                matches_selectors(&object, Some(selector), None),
                want,
                "{selector}"
            );
        }
    }

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
