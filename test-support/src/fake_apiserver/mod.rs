//! A fake Kubernetes API server at the HTTP level, for tests and scale simulations (the switchyard-test-support crate: never shipped).
//!
//! ```text
//! request ─► intake ─► parse_path ─► verb handler ─► store / watch fan-out ─► response
//!
//! request        from client() (a tower-test mock service) or serve_http() (plain HTTP)
//! intake         intake.rs: count-only writes answered at once, the request log, hangs and delays,
//!                injected failures
//! parse_path     path.rs: the path into a Target (kind, namespace, name, subresource); query parameters
//! verb handler   serve's match on method and target:
//!                  GET     get.rs (one object, LIST) · watch.rs (?watch=true)
//!                  POST    write.rs create            PUT     write.rs replace
//!                  PATCH   patch.rs (server-side apply, field managers in managers.rs; Event merge patch)
//!                  DELETE  delete.rs
//!                selectors.rs: label and field selectors, for LIST and WATCH
//! store          State (here): objects by kind and key, one resourceVersion counter (State::upsert)
//! watch fan-out  State::notify (watch.rs): each change to the watchers it matches, and to the history
//!                a watch from an older resourceVersion replays (410 Gone once that is compacted)
//! response       respond.rs: full, status_error; a watch answers with an open stream
//! ```
//!
//! What a client sees:
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

mod delete;
mod get;
mod intake;
mod managers;
mod patch;
mod path;
mod respond;
mod selectors;
mod watch;
mod write;

use path::{Target, parse_path};
use respond::status_error;

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
    /// switchyard.io/v1alpha2 ForwardingRollouts.
    Rollout,
    /// coordination.k8s.io/v1 Leases.
    Lease,
    /// events.k8s.io/v1 Events.
    Event,
    /// apiextensions.k8s.io/v1 CustomResourceDefinitions (established as soon as they are stored).
    CustomResourceDefinition,
    /// core/v1 Namespaces (stored; nothing is refused for a namespace that does not exist).
    Namespace,
    /// networking.k8s.io/v1 ServiceCIDRs.
    ServiceCidr,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Self::Service | Self::Node | Self::Namespace => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::Plan | Self::ForwardingSlice | Self::Rollout => "switchyard.io/v1alpha2",
            Self::Lease => "coordination.k8s.io/v1",
            Self::Event => "events.k8s.io/v1",
            Self::CustomResourceDefinition => "apiextensions.k8s.io/v1",
            Self::ServiceCidr => "networking.k8s.io/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
            Self::Plan => "NodeForwardingPlan",
            Self::ForwardingSlice => "ForwardingSlice",
            Self::Rollout => "ForwardingRollout",
            Self::Lease => "Lease",
            Self::Event => "Event",
            Self::CustomResourceDefinition => "CustomResourceDefinition",
            Self::Namespace => "Namespace",
            Self::ServiceCidr => "ServiceCIDR",
        }
    }
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
            let line = watch::gone_line();
            for watcher in state.watchers.drain(..) {
                let _ = watcher.tx.send(Bytes::from(line.clone()));
            }
        }
    }

    /// Answers one request: intake (see [`intake`]), then the handler of its verb.
    async fn serve(&self, request: Request<Body>) -> Response<FakeBody> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        if self.counted(&parts) {
            return self.count(&parts, bytes);
        }
        let (path, query, body) = self.admit(&parts, &bytes).await;
        let Ok(mut state) = self.state.lock() else {
            return status_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "poisoned");
        };
        if let Some(response) = intake::injected_failure(&mut state, &parts.method, &path) {
            return response;
        }
        let Some(target) = parse_path(&path) else {
            return status_error(StatusCode::NOT_FOUND, "NotFound", &format!("no route for {path}"));
        };
        match (parts.method.clone(), target.name.clone()) {
            (Method::GET, None) if watch::requested(&query) => watch::watch(&mut state, &target, &query),
            (Method::GET, None) => get::list(&state, &target, &query),
            (Method::GET, Some(name)) => get::get(&state, &target, &name),
            (Method::POST, None) => write::create(&mut state, &target, &query, body),
            (Method::PUT, Some(name)) => write::replace(&mut state, &target, &name, &query, body),
            (Method::PATCH, Some(name)) if target.kind == Kind::Event => {
                patch::merge(&mut state, &target, &name, body)
            }
            (Method::PATCH, Some(name)) => patch::apply(&mut state, &target, &name, &query, &parts, body),
            (Method::DELETE, Some(name)) => delete::delete(&mut state, &target, &name),
            _ => status_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "not supported",
            ),
        }
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
}
