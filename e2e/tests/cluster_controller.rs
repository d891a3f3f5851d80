//! Cluster e2e for the live controller: runs when `KUBECONFIG` points at a real API server (a bare
//! kube-apiserver + etcd is enough: no kubelet, scheduler or controller-manager is needed, the test
//! creates Nodes, Services and EndpointSlices itself). Without `KUBECONFIG` at build time the test is
//! ignored (e2e/build.rs), so a summary shows it as not run; `make e2e-cluster` runs it.
//!
//! It applies `crds/`, runs the controller (in process, the same `run` the binary calls), and checks what
//! each node forwards (its plan composed with its views' ForwardingSlices, read through the API) and
//! `kubectl get nfp` / `kubectl get fws`; then edits an EndpointSlice (one slice write, no plan write),
//! hand-edits and deletes a plan and a slice, deletes a Node, and checks again. Everything it creates
//! carries a random suffix and is deleted at the end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;

use std::time::Duration;

use cluster::{apply_crd, client_from_kubeconfig, composed, suffix, wait_for};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan};
use switchyard_controller::{
    Config,
    live::run::{Options, run},
    planner::{Planner, Snapshot},
};

#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn controller_keeps_plans_current_in_a_real_cluster() {
    let client = client_from_kubeconfig("controller_keeps_plans_current_in_a_real_cluster").await;
    apply_crd(&client, "switchyard-e2e").await;
    let id = suffix();
    let ns = format!("swyd-e2e-{id}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let node_names: Vec<String> = ["a", "b", "c"].iter().map(|n| format!("swyd-{id}-{n}")).collect();
    for (i, name) in node_names.iter().enumerate() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": if i < 2 { "zone-a" } else { "zone-b" }}},
            "spec": {"podCIDR": format!("10.244.{}.0/24", i + 1), "podCIDRs": [format!("10.244.{}.0/24", i + 1)]},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("192.168.10.{}", 11 + i)}]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}], "selector": {"app": "web"}},
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let slice = |ips: &[&str]| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": ips.iter().enumerate().map(|(i, ip)| json!({
                "addresses": [ip], "nodeName": node_names[i % 3], "conditions": {"ready": true}
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    };
    slices
        .create(&PostParams::default(), &slice(&["10.244.1.5", "10.244.2.5"]))
        .await
        .unwrap();

    let config = Config {
        min_plan_interval: Duration::from_millis(200),
        ..Config::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut options = Options::new(config.clone());
    options.orphan_sweep_period = Duration::from_secs(1);
    let controller = tokio::spawn(run(
        client.clone(),
        options,
        async {
            let _ = stop_rx.await;
        },
        None,
    ));

    // Plans appear for our nodes; composed with their views' slices they forward the Service's ClusterIP
    // to both endpoints.
    let cluster_ip = svc.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap();
    for node in &node_names {
        let client = client.clone();
        let node = node.clone();
        let ip = cluster_ip.clone();
        wait_for(Duration::from_secs(30), "the plan", || {
            let client = client.clone();
            let node = node.clone();
            let ip = ip.clone();
            async move {
                composed(&client, &node)
                    .await?
                    .services
                    .iter()
                    .any(|s| s.cluster_ip == ip && s.endpoints.len() == 2)
                    .then_some(())
            }
        })
        .await;
    }
    // The live plan equals the offline planner's for the same objects (our namespace and nodes only).
    let snapshot = Snapshot {
        services: services.list(&ListParams::default()).await.unwrap().items,
        slices: slices.list(&ListParams::default()).await.unwrap().items,
        nodes: futures::future::join_all(node_names.iter().map(|n| nodes.get(n)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect(),
    };
    let offline = Planner::build(&snapshot, &config).unwrap();
    let live = composed(&client, &node_names[0]).await.unwrap();
    let ours: Vec<_> = live
        .services
        .iter()
        .filter(|s| s.name.starts_with(&format!("{ns}/")))
        .cloned()
        .collect();
    let want = offline.composed(&node_names[0]).unwrap().unwrap().spec.services;
    assert_eq!(ours, want);

    // `kubectl get nfp` and `kubectl get fws` show the audit columns (kubectl reads the same KUBECONFIG).
    for (args, columns) in [
        (
            vec!["get", "nfp", node_names[0].as_str()],
            vec!["DESIRED", "OBSERVED", "SLICES"],
        ),
        (vec!["get", "fws"], vec!["VIEW", "ENTRIES", "REVISION"]),
    ] {
        match std::process::Command::new("kubectl").args(&args).output() {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "kubectl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                for column in columns {
                    assert!(text.contains(column), "{column} missing: {text}");
                }
            }
            Err(e) => eprintln!("SKIP the `kubectl {args:?}` check: cannot run kubectl ({e})"),
        }
    }

    // An endpoint change reaches every node through its views' slices, and rewrites no plan (the
    // new endpoint runs on no node: a plain Service's change is one slice write).
    let revisions_before: Vec<String> = futures::future::join_all(node_names.iter().map(|n| plans.get(n)))
        .await
        .into_iter()
        .map(|p| p.unwrap().spec.revision)
        .collect();
    slices
        .replace("web-1", &PostParams::default(), &{
            let mut s = slice(&["10.244.1.5", "10.244.2.5", "10.244.3.5"]);
            // The third endpoint is on no node.
            if let Some(eps) = s.endpoints.as_mut().and_then(|e| e.get_mut(2)) {
                eps.node_name = None;
            }
            s.metadata.resource_version = slices.get("web-1").await.unwrap().metadata.resource_version;
            s
        })
        .await
        .unwrap();
    for node in &node_names {
        let client = client.clone();
        let node = node.clone();
        let ns = ns.clone();
        wait_for(Duration::from_secs(30), "the endpoint change", || {
            let client = client.clone();
            let node = node.clone();
            let ns = ns.clone();
            async move {
                composed(&client, &node)
                    .await?
                    .services
                    .iter()
                    .any(|s| s.name.starts_with(&ns) && s.endpoints.len() == 3)
                    .then_some(())
            }
        })
        .await;
    }
    let revisions_after: Vec<String> = futures::future::join_all(node_names.iter().map(|n| plans.get(n)))
        .await
        .into_iter()
        .map(|p| p.unwrap().spec.revision)
        .collect();
    assert_eq!(
        revisions_before, revisions_after,
        "a plain endpoint change rewrote a plan"
    );

    // A hand-edited slice is restored.
    let fws: Api<ForwardingSlice> = Api::all(client.clone());
    let all0 = fws.get("all-0000").await.unwrap();
    let edit = json!({"spec": {"count": 1, "index": 0, "entries": []}});
    fws.patch("all-0000", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let fws2 = fws.clone();
    wait_for(
        Duration::from_secs(30),
        "the hand-edited slice to be restored",
        || {
            let fws = fws2.clone();
            let want = all0.spec.clone();
            async move { (fws.get("all-0000").await.ok()?.spec == want).then_some(()) }
        },
    )
    .await;

    // A hand edit is reverted; a deleted plan is recreated.
    let before = plans.get(&node_names[1]).await.unwrap().spec;
    let edit = json!({"spec": {"cluster": {"masqueradeAll": true}}});
    plans
        .patch(&node_names[1], &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let plans2 = plans.clone();
    let name = node_names[1].clone();
    wait_for(Duration::from_secs(30), "the hand edit to be reverted", || {
        let plans = plans2.clone();
        let name = name.clone();
        let before = before.clone();
        async move { (plans.get(&name).await.ok()?.spec == before).then_some(()) }
    })
    .await;
    plans
        .delete(&node_names[2], &DeleteParams::default())
        .await
        .unwrap();
    let plans3 = plans.clone();
    let name = node_names[2].clone();
    wait_for(
        Duration::from_secs(30),
        "the deleted plan to be recreated",
        || {
            let plans = plans3.clone();
            let name = name.clone();
            async move { plans.get_opt(&name).await.ok()?.map(|_| ()) }
        },
    )
    .await;

    // Deleting a Node deletes its plan.
    nodes
        .delete(&node_names[0], &DeleteParams::default())
        .await
        .unwrap();
    let plans4 = plans.clone();
    let name = node_names[0].clone();
    wait_for(
        Duration::from_secs(30),
        "the plan of the deleted node to go",
        || {
            let plans = plans4.clone();
            let name = name.clone();
            async move { plans.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;

    let _ = stop_tx.send(());
    let _ = controller.await;
    for node in &node_names {
        let _ = nodes.delete(node, &DeleteParams::default()).await;
        let _ = plans.delete(node, &DeleteParams::default()).await;
    }
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
