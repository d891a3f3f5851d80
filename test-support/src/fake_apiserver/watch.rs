//! WATCH: open streams of ADDED / MODIFIED / DELETED lines, the fan-out of every change to the
//! watchers whose kind and selectors match, the watch cache that replays what a watch from an older
//! resource version missed, and `410 Gone` once that history is compacted away.

use bytes::Bytes;
use http::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    FakeBody, FakeBodyInner, Kind, State, Watcher,
    path::{Target, query_param},
    selectors::matches_selectors,
};

/// How many events the watch cache keeps.
const WATCH_HISTORY: usize = 10_000;

/// The watch event a real API server sends for a resource version it no longer has.
pub(super) fn gone_line() -> String {
    format!(
        "{}\n",
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Expired", "message": "too old resource version", "code": 410}})
    )
}

/// Whether a GET of a collection asks for a watch (`watch=true` or `watch=1`) rather than a list.
pub(super) fn requested(query: &str) -> bool {
    query_param(query, "watch").as_deref() == Some("true")
        || query_param(query, "watch").as_deref() == Some("1")
}

/// A watch of a collection: an open stream, first of what happened after the requested resource
/// version (or `410 Gone`), then of every matching change.
pub(super) fn watch(state: &mut State, target: &Target, query: &str) -> Response<FakeBody> {
    let labels = query_param(query, "labelSelector");
    let fields = query_param(query, "fieldSelector");
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
    response
}

impl State {
    /// Tells the watchers of `kind` whose selectors match, and keeps the event for later watches.
    pub(super) fn notify(&mut self, kind: Kind, event: &str, object: &Value) {
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
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::{Api, api::ListParams};
    use serde_json::json;

    use crate::fake_apiserver::{FakeApiServer, Kind};

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
}
