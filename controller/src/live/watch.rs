//! Watches feeding the engine: one kube-runtime watcher per kind, retried with kube's default backoff,
//! decoded tolerantly ([`super::trim`]: what planning never reads is dropped before decoding, and an
//! object that still does not decode is delivered as such, so it never fails its watch), forwarded
//! into one channel so the engine sees a single ordered stream of changes. The rollouts' watches
//! ([`super::rollouts`]) are started with the same [`spawn`], with what they read kept instead.
//!
//! ```text
//! watcher(Api<Tolerant<K, P>>) ─► Ok(event) ─► wrap (Input) ─► channel ─► engine (or the rollouts)
//!                              └► Err (the API server, the connection, invalid JSON) ─► watch_errors{kind}
//!                                   and a warning; the watcher retries with backoff
//! ```

use std::sync::Arc;

use futures::StreamExt;
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use switchyard_api::{
    names::{LABEL_MANAGED_BY, MANAGED_BY},
    tolerant::{Prune, Tolerant},
};
use tokio::sync::mpsc;

use super::{engine::Input, metrics::Metrics};

/// Watches every `K` (as `config` selects), pruned by `P` and decoded tolerantly, into `tx` as `wrap`
/// makes them; until `tx` closes. `on_error` is sent once, at the watch's first failure.
pub fn spawn<K, P, T>(
    client: &Client,
    config: watcher::Config,
    wrap: fn(watcher::Event<Tolerant<K, P>>) -> T,
    on_error: Option<T>,
    tx: mpsc::Sender<T>,
    metrics: Arc<Metrics>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    P: Prune<K> + 'static,
    T: Send + 'static,
{
    let api: Api<Tolerant<K, P>> = Api::all(client.clone());
    tokio::spawn(async move {
        let kind = K::kind(&());
        let mut on_error = on_error;
        let mut stream = watcher(api, config).default_backoff().boxed();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if tx.send(wrap(event)).await.is_err() {
                        break;
                    }
                }
                // The stream retries on its own (with backoff); meanwhile no change of this kind
                // arrives, so it is counted where a test and an operator can see it.
                Err(error) => {
                    Metrics::count(&metrics.watch_errors, &kind);
                    tracing::warn!(%kind, %error, "watch failed; retrying");
                    // Said once, for a kind planning must not wait for.
                    if let Some(input) = on_error.take()
                        && tx.send(input).await.is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
}

/// Starts the six watches. ServiceCIDRs are optional: an API server without them (before 1.33, or
/// with the API off) answers the watch with an error, which tells the engine to plan without Service
/// ranges instead of waiting for them; the watch keeps retrying, and ranges that appear later are
/// planned then.
pub fn start(client: &Client, tx: mpsc::Sender<Input>, metrics: &Arc<Metrics>) {
    let all = watcher::Config::default;
    let m = || Arc::clone(metrics);
    spawn(client, all(), Input::Service, None, tx.clone(), m());
    spawn(client, all(), Input::Slice, None, tx.clone(), m());
    spawn(client, all(), Input::Node, None, tx.clone(), m());
    let unavailable = Some(Input::ServiceCidrsUnavailable);
    spawn(client, all(), Input::ServiceCidr, unavailable, tx.clone(), m());
    let ours = all().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    spawn(client, ours.clone(), Input::Plan, None, tx.clone(), m());
    spawn(client, ours, Input::ForwardingSlice, None, tx, m());
}
