//! Shared helpers of the cluster e2e suites (`cluster_controller.rs`, `cluster_agent.rs`): repository
//! paths, random name suffixes, polling, and applying `crds/` to the API server.
#![allow(dead_code)]

use std::{path::PathBuf, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};

/// A path inside the repository.
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

/// Applies `crds/` (server-side apply) and waits until the CRD is established.
pub async fn apply_crd(client: &Client, field_manager: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let text = std::fs::read_to_string(repo("crds/nodeforwardingplans.switchyard.io.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
    crds.patch(
        "nodeforwardingplans.switchyard.io",
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    wait_for(Duration::from_secs(30), "the CRD to be established", || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("nodeforwardingplans.switchyard.io").await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
}
