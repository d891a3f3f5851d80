//! Shared helpers of the cluster e2e suites (`cluster_controller.rs`, `cluster_agent.rs`): repository
//! paths, random name suffixes, polling, applying `crds/` to the API server, composing a node's
//! plan with its views' slices as read from the API server, and reading and writing objects as raw
//! JSON (values the API server accepts but the types library refuses).
#![allow(dead_code)]

use std::{path::PathBuf, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, Resource,
    api::{GetParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::Value;
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan, NodeForwardingPlanSpec,
    compose::{SliceRef, compose},
    names::views_selector,
};

/// A path inside the repository.
/// A client from `KUBECONFIG`. The suites are ignored unless `KUBECONFIG` was set when they were built
/// (e2e/build.rs); run with `--include-ignored` without it, they fail rather than pass unrun.
pub async fn client_from_kubeconfig(test: &str) -> Client {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "{test}: set KUBECONFIG to a real API server (make e2e-cluster)"
    );
    Client::try_default().await.expect("a client from KUBECONFIG")
}

pub fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

/// A short random suffix, so objects of concurrent or repeated runs never collide.
pub fn suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:06x}", (std::process::id() ^ nanos) & 0xff_ffff)
}

/// Polls `check` every 250 ms until it returns Some, for at most `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Applies every CRD in `crds/` (server-side apply) and waits until each is established.
pub async fn apply_crd(client: &Client, field_manager: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Every CRD of crds/, as `kubectl apply -f crds/` does: the controller watches them all (a missing
    // one fails its watch, which the tests count).
    for file in switchyard_api::crd::CRD_FILES {
        let file = file.trim_end_matches(".yaml");
        let text = std::fs::read_to_string(repo(&format!("crds/{file}.yaml"))).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        crds.patch(
            file,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        wait_for(Duration::from_secs(30), "the CRD to be established", || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(file).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await;
    }
}

/// What `node` forwards according to the API server: its plan composed with its views' slices, as
/// its agent composes them. `None` while the plan or a view is missing.
pub async fn composed(client: &Client, node: &str) -> Option<NodeForwardingPlanSpec> {
    composition(client, node).await.map(|c| c.spec)
}

/// [`composed`] with the digest of the slices used, as the agent reports it in
/// `status.observedSlices`.
pub async fn composition(client: &Client, node: &str) -> Option<switchyard_api::compose::Composed> {
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let plan = plans.get_opt(node).await.ok()??;
    let selector = views_selector(plan.spec.views.iter().map(String::as_str));
    let slices: Api<ForwardingSlice> = Api::all(client.clone());
    let listed = slices.list(&ListParams::default().labels(&selector)).await.ok()?;
    let named: Vec<(String, &ForwardingSlice)> = listed
        .items
        .iter()
        .filter_map(|s| Some((s.metadata.name.clone()?, s)))
        .collect();
    let refs: Vec<SliceRef<'_>> = named
        .iter()
        .map(|(name, s)| SliceRef { name, spec: &s.spec })
        .collect();
    compose(&plan.spec, &refs).ok()
}

/// The object `name` of kind `K` exactly as the API server serves it (raw JSON: nothing is decoded
/// into the types library, which may refuse it).
pub async fn get_raw<K>(client: &Client, namespace: Option<&str>, name: &str) -> Result<Value, kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let request = kube::core::Request::new(K::url_path(&(), namespace))
        .get(name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    client.request::<Value>(request).await
}

/// PUTs `object` (raw JSON, its resourceVersion as given) to `name` of kind `K`, or to its status
/// subresource; the API server's answer, raw.
pub async fn put_raw<K>(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    object: &Value,
    status: bool,
) -> Result<Value, kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let url = kube::core::Request::new(K::url_path(&(), namespace));
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let params = PostParams::default();
    let request = if status {
        url.replace_subresource("status", name, &params, body)
    } else {
        url.replace(name, &params, body)
    }
    .map_err(kube::Error::BuildRequest)?;
    client.request::<Value>(request).await
}

/// [`put_raw`] of `object` as the current version of `name` (its resourceVersion read first).
pub async fn update_raw<K>(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    mut object: Value,
    status: bool,
) -> Result<Value, kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let current = get_raw::<K>(client, namespace, name).await?;
    object["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    put_raw::<K>(client, namespace, name, &object, status).await
}
