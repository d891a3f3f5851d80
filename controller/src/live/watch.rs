//! Watches feeding the engine: one kube-runtime watcher per kind, retried with kube's default backoff,
//! trimmed of what planning never reads ([`super::trim`]), forwarded into one channel so the engine sees
//! a single ordered stream of changes.

use futures::StreamExt;
use k8s_openapi::api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    names::{LABEL_MANAGED_BY, MANAGED_BY},
};
use tokio::sync::mpsc;

use super::{engine::Input, trim};

fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    wrap: fn(watcher::Event<K>) -> Input,
    tx: mpsc::Sender<Input>,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let kind = std::any::type_name::<K>().rsplit("::").next().unwrap_or("object");
        let mut stream = watcher(api, config).default_backoff().modify(trim).boxed();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if tx.send(wrap(event)).await.is_err() {
                        break;
                    }
                }
                // The stream retries on its own (with backoff); a failure is only worth a line.
                Err(error) => tracing::warn!(kind, %error, "watch failed; retrying"),
            }
        }
    });
}

/// Starts the five watches.
pub fn start(client: &Client, tx: mpsc::Sender<Input>) {
    spawn(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        trim::service,
        Input::Service,
        tx.clone(),
    );
    spawn(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
        trim::endpoint_slice,
        Input::Slice,
        tx.clone(),
    );
    spawn(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        trim::node,
        Input::Node,
        tx.clone(),
    );
    let ours = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    spawn(
        Api::<NodeForwardingPlan>::all(client.clone()),
        ours.clone(),
        |_| {},
        Input::Plan,
        tx.clone(),
    );
    spawn(
        Api::<ForwardingSlice>::all(client.clone()),
        ours,
        |_| {},
        Input::ForwardingSlice,
        tx,
    );
}
