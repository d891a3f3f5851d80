//! `switchyard-lab demo-cluster` (`make demo-cluster`) end to end against the fake API server served
//! over HTTP, reached through a kubeconfig like any API server: the CRDs and the example's objects
//! applied, the controller and the lab's agents on it, the checks passing before and after a change,
//! and nothing of the demo's left on the server afterwards; and the same against the real API server
//! `KUBECONFIG` names (`make unit` starts a lab control plane for it when `SWITCHYARD_K8S_BIN` is
//! set; ignored when neither was set at build time). Needs root (the lab).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use switchyard_e2e::cluster_demo::{ClusterDemoOptions, run};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind};

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

#[test]
fn the_cluster_demo_runs_through_an_api_server_and_removes_what_it_created() {
    if !common::lab_allowed("cluster_demo") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = FakeApiServer::new();
    // Someone else's Service on the same server: the demo must leave it alone.
    server.put(
        Kind::Service,
        serde_json::json!({"metadata": {"name": "theirs", "namespace": "default"}, "spec": {"clusterIP": "10.96.9.9"}}),
    );
    let (addr, _task) = rt.block_on(server.serve_http()).unwrap();
    let dir = switchyard_test_support::scratch::dir("cluster-demo").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: demo\n\
             current-context: fake\nusers:\n- name: demo\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let options = ClusterDemoOptions {
        cluster: repo("examples/cluster.yaml"),
        config: repo("examples/controller-config.yaml"),
        kubeconfig,
        crds: repo("crds"),
    };
    let failed = run(&options, common::options()).unwrap();
    assert_eq!(failed, 0);
    // The demo wrote through the API: CRDs, objects, plans and slices (the request log says so) …
    let wrote = |path: &str| {
        server
            .requests()
            .iter()
            .any(|r| r.is_write() && r.path.contains(path))
    };
    for path in [
        "customresourcedefinitions",
        "/nodes/",
        "/services/",
        "/endpointslices/",
        "nodeforwardingplans",
        "forwardingslices",
    ] {
        assert!(wrote(path), "no write to {path}");
    }
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/status") && r.is_write()),
        "agents wrote no status"
    );
    // … and removed all of it, leaving the other Service.
    for kind in [
        Kind::CustomResourceDefinition,
        Kind::Node,
        Kind::EndpointSlice,
        Kind::Plan,
        Kind::ForwardingSlice,
    ] {
        assert_eq!(server.keys(kind), Vec::<String>::new(), "{kind:?} left behind");
    }
    assert_eq!(server.keys(Kind::Service), vec!["default/theirs".to_string()]);
}

#[test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` to start one"
)]
fn the_cluster_demo_runs_on_a_real_api_server() {
    if !common::lab_allowed("cluster_demo (real API server)") {
        return;
    }
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .map(std::path::PathBuf::from)
        .expect("KUBECONFIG names the API server (it was set when this test was built)");
    let options = ClusterDemoOptions {
        cluster: repo("examples/cluster.yaml"),
        config: repo("examples/controller-config.yaml"),
        kubeconfig,
        crds: repo("crds"),
    };
    let failed = run(&options, common::options()).unwrap();
    assert_eq!(failed, 0, "checks failed through the real API server");
}
