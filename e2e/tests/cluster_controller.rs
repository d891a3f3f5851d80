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
//!
//! Issue 50, on the real API server: objects it accepts but the types library cannot read (a Service
//! status condition with `lastTransitionTime: null`, as the upstream conformance suite writes it), or
//! odd values in EndpointSlices and Nodes, written once a second for 30 s, never hold back a Service
//! created meanwhile or an endpoint change (each in its ForwardingSlice within 1 s) and never restart a
//! watch (`switchyard_controller_watch_errors_total`); and every odd value the server accepts, in every
//! field of each watched kind, leaves every watch running.
//!
//! The tests run one at a time (`SERIAL`): each runs its own controller, and two would fight over the
//! cluster-wide slices.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;

use std::time::Duration;

use cluster::{apply_crd, client_from_kubeconfig, composed, get_raw, suffix, update_raw, wait_for};

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
    live::run::{Options, Running, run},
    live::trim::Delivered,
    planner::{Planner, Snapshot},
};
use switchyard_test_support::odd_values::{self, odd_values};

#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn controller_keeps_plans_current_in_a_real_cluster() {
    let _serial = SERIAL.lock().await;
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
    // The API server's default ServiceCIDR (`kubernetes`, from --service-cluster-ip-range; v1.33+)
    // reaches the plan's header: the agents drop traffic to its unallocated addresses.
    let cidrs: Api<k8s_openapi::api::networking::v1::ServiceCIDR> = Api::all(client.clone());
    let mut ranges: Vec<String> = cidrs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|c| c.spec.and_then(|s| s.cidrs).unwrap_or_default())
        .collect();
    ranges.sort();
    assert!(
        !ranges.is_empty(),
        "a v1.36 API server has its default ServiceCIDR"
    );
    assert_eq!(live.cluster.service_cidrs, ranges);

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

// === issue 50: what the API server accepts but the types library cannot read ===

/// One test at a time: each runs its own controller, which writes the cluster-wide slices.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Issue 50's correctness bound: a Service change is in its ForwardingSlice within this, whatever else
/// is being written meanwhile.
const BOUND: Duration = Duration::from_secs(1);

/// How long the odd writer keeps writing, once a second (the measurement: 33 s late).
const WRITES: usize = 30;

/// A namespace, two Nodes and the controller (in process, its metrics at hand).
struct Live {
    client: kube::Client,
    id: String,
    ns: String,
    nodes: Vec<String>,
    running: Running,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), switchyard_controller::Error>>,
}

impl Live {
    async fn start(test: &str) -> Self {
        let client = client_from_kubeconfig(test).await;
        apply_crd(&client, "switchyard-e2e").await;
        let id = suffix();
        let ns = format!("swyd-e2e-{id}");
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
        let nodes: Vec<String> = ["a", "b"].iter().map(|n| format!("swyd-{id}-{n}")).collect();
        let api: Api<Node> = Api::all(client.clone());
        for (i, name) in nodes.iter().enumerate() {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
                "spec": {"podCIDR": format!("10.244.{}.0/24", i + 1), "podCIDRs": [format!("10.244.{}.0/24", i + 1)]},
            }))
            .unwrap();
            api.create(&PostParams::default(), &node).await.unwrap();
            let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("192.168.10.{}", 11 + i)}]}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
        }
        let mut options = Options::new(Config {
            min_plan_interval: Duration::from_millis(100),
            ..Config::default()
        });
        options.orphan_sweep_period = Duration::from_secs(1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run(
            client.clone(),
            options,
            async {
                let _ = stopped.await;
            },
            Some(started_tx),
        ));
        let running = started_rx.await.unwrap();
        let live = Self {
            client,
            id,
            ns,
            nodes,
            running,
            stop: Some(stop),
            task,
        };
        for node in live.nodes.clone() {
            let client = live.client.clone();
            wait_for(Duration::from_secs(30), "the plans", || {
                let (client, node) = (client.clone(), node.clone());
                async move { composed(&client, &node).await.map(drop) }
            })
            .await;
        }
        live
    }

    async fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        // A bare API server has no namespace controller: what the namespace holds is deleted here, or
        // it stays (and an odd object left behind would be in every later test's watches).
        let all = ListParams::default();
        let _ = Api::<Delivered<Service>>::namespaced(self.client.clone(), &self.ns)
            .delete_collection(&DeleteParams::default(), &all)
            .await;
        let _ = Api::<Delivered<EndpointSlice>>::namespaced(self.client.clone(), &self.ns)
            .delete_collection(&DeleteParams::default(), &all)
            .await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let plans: Api<NodeForwardingPlan> = Api::all(self.client.clone());
        for node in &self.nodes {
            let _ = nodes.delete(node, &DeleteParams::default()).await;
            let _ = plans.delete(node, &DeleteParams::default()).await;
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }

    /// A ClusterIP Service `name` with one ready endpoint `ip` on the first node; its ClusterIP.
    async fn service(&self, name: &str, ip: &str) -> String {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
        let svc = Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
        Api::<EndpointSlice>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &self.endpoint_slice(name, ip))
            .await
            .unwrap();
        svc.spec.and_then(|s| s.cluster_ip).unwrap()
    }

    fn endpoint_slice(&self, service: &str, ip: &str) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{service}-1"), "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "nodeName": self.nodes[0], "conditions": {"ready": true}}],
        }))
        .unwrap()
    }

    /// How long until the first node forwards `cluster_ip` to `endpoint` (its plan composed with its
    /// views' slices, as read from the API server), polled every 20 ms.
    async fn until_forwarded(&self, cluster_ip: &str, endpoint: &str) -> Duration {
        let started = tokio::time::Instant::now();
        loop {
            let forwarded = composed(&self.client, &self.nodes[0]).await.is_some_and(|plan| {
                plan.services
                    .iter()
                    .any(|s| s.cluster_ip == cluster_ip && s.endpoints.iter().any(|e| e.ip == endpoint))
            });
            if forwarded {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{cluster_ip} → {endpoint} never programmed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Watch restarts so far, per kind (`switchyard_controller_watch_errors_total` lines).
    fn watch_errors(&self) -> Vec<String> {
        self.running
            .metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("switchyard_controller_watch_errors_total{"))
            .map(str::to_string)
            .collect()
    }

    /// While `writer` writes, a Service created every few seconds and an endpoint change of another
    /// each reach the first node's slices within [`BOUND`]; no watch restarts. Returns the slowest.
    async fn programming_stays_prompt_while(
        &self,
        test: &str,
        writer: tokio::task::JoinHandle<Vec<Result<(), kube::Error>>>,
    ) -> Duration {
        let moving = self.service("moving", "10.244.1.10").await;
        self.until_forwarded(&moving, "10.244.1.10").await;
        let errors_before = self.watch_errors();
        let mut took = Vec::new();
        for round in 0..6 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let endpoint = format!("10.244.1.{}", 20 + round);
            let ip = self.service(&format!("new-{round}"), &endpoint).await;
            took.push((
                format!("Service new-{round} created"),
                self.until_forwarded(&ip, &endpoint).await,
            ));
            let endpoint = format!("10.244.1.{}", 50 + round);
            let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
            let mut slice = self.endpoint_slice("moving", &endpoint);
            slice.metadata.resource_version = slices.get("moving-1").await.unwrap().metadata.resource_version;
            slices
                .replace("moving-1", &PostParams::default(), &slice)
                .await
                .unwrap();
            took.push((
                format!("an endpoint of moving changed to {endpoint}"),
                self.until_forwarded(&moving, &endpoint).await,
            ));
        }
        let writes = writer.await.unwrap();
        let failed: Vec<String> = writes
            .iter()
            .filter_map(|w| w.as_ref().err())
            .map(|e| e.to_string())
            .collect();
        assert!(
            failed.is_empty(),
            "the odd writes must be accepted, or nothing is tested: {failed:?}"
        );
        let slowest = took.iter().map(|(_, d)| *d).max().unwrap_or_default();
        eprintln!(
            "{test}: {} odd writes in {WRITES} s; {} changes meanwhile, each in its slice after {}; slowest {slowest:?}; \
             watch errors before {errors_before:?}, after {:?}",
            writes.len(),
            took.len(),
            took.iter()
                .map(|(_, d)| format!("{d:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.watch_errors()
        );
        for (what, after) in &took {
            assert!(
                *after <= BOUND,
                "{test}: {what}: in its slice only after {after:?}"
            );
        }
        assert_eq!(
            self.watch_errors(),
            Vec::<String>::new(),
            "{test}: a watch restarted"
        );
        slowest
    }
}

/// Writes `write(round)` once a second, [`WRITES`] times.
fn once_a_second<F, Fut>(write: F) -> tokio::task::JoinHandle<Vec<Result<(), kube::Error>>>
where
    F: Fn(usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + Send,
{
    tokio::spawn(async move {
        let mut results = Vec::new();
        for round in 0..WRITES {
            results.push(write(round).await);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        results
    })
}

/// The upstream conformance spec "should complete a service status lifecycle" patches a Service's
/// status (merge patch, status subresource) with a condition whose `lastTransitionTime` is null.
#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn a_null_status_condition_never_stalls_service_programming() {
    let _serial = SERIAL.lock().await;
    let test = "a_null_status_condition_never_stalls_service_programming";
    let live = Live::start(test).await;
    live.service("conformance", "10.244.1.9").await;
    let patch = |round: usize| {
        json!({
            "metadata": {"labels": {"test-service": "patched"}},
            "status": {
                "conditions": [{"type": "StatusUpdate", "status": "True", "reason": "E2E",
                                "message": format!("Set from e2e test, round {round}"),
                                "lastTransitionTime": null}],
            },
        })
    };
    // Read tolerantly: the plain type cannot read the answer.
    let tolerant: Api<Delivered<Service>> = Api::namespaced(live.client.clone(), &live.ns);
    tolerant
        .patch_status("conformance", &PatchParams::default(), &Patch::Merge(&patch(0)))
        .await
        .unwrap();
    // The fault is live on this server: it serves the null, and k8s-openapi refuses it.
    let served = get_raw::<Service>(&live.client, Some(&live.ns), "conformance")
        .await
        .unwrap();
    assert!(
        served["status"]["conditions"][0]["lastTransitionTime"].is_null(),
        "{served}"
    );
    let refused = Api::<Service>::namespaced(live.client.clone(), &live.ns)
        .get("conformance")
        .await
        .expect_err("the types library reads a null lastTransitionTime: the fault is gone upstream");
    eprintln!("{test}: k8s-openapi refuses the served Service: {refused}");
    let writer = once_a_second(move |round| {
        let (tolerant, patch) = (tolerant.clone(), patch(round + 1));
        async move {
            tolerant
                .patch_status("conformance", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
    });
    live.programming_stays_prompt_while(test, writer).await;
    live.finish().await;
}

/// An EndpointSlice rewritten once a second with odd but accepted values (nulls where the types
/// library has defaults, empty hints, a target reference with only a kind and a fieldPath).
#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn an_odd_endpoint_slice_never_stalls_service_programming() {
    let _serial = SERIAL.lock().await;
    let test = "an_odd_endpoint_slice_never_stalls_service_programming";
    let live = Live::start(test).await;
    live.service("odd", "10.244.1.8").await;
    let (client, ns, node) = (live.client.clone(), live.ns.clone(), live.nodes[0].clone());
    let writer = once_a_second(move |round| {
        let odd = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "odd-1", "labels": {"kubernetes.io/service-name": "odd"},
                         "annotations": {"example.com/round": round.to_string()}},
            "addressType": "IPv4",
            "ports": [{"name": null, "port": 8080, "protocol": null, "appProtocol": null}],
            "endpoints": [{"addresses": ["10.244.1.8"], "nodeName": node,
                           "conditions": {"ready": null, "serving": null, "terminating": null},
                           "hostname": null, "zone": null,
                           "targetRef": {"kind": "Pod", "fieldPath": "spec.containers{odd}"},
                           "hints": {"forZones": [], "forNodes": []},
                           "deprecatedTopology": {"example.com/odd": ""}}],
        });
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            update_raw::<EndpointSlice>(&client, Some(&ns), "odd-1", odd, false)
                .await
                .map(drop)
        }
    });
    live.programming_stays_prompt_while(test, writer).await;
    live.finish().await;
}

/// A Node whose status is rewritten once a second with odd but accepted values (null times in its
/// conditions, an unknown condition type, an image without names, empty node info).
#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn an_odd_node_never_stalls_service_programming() {
    let _serial = SERIAL.lock().await;
    let test = "an_odd_node_never_stalls_service_programming";
    let live = Live::start(test).await;
    let (client, node) = (live.client.clone(), live.nodes[1].clone());
    let writer = once_a_second(move |round| {
        let (client, node) = (client.clone(), node.clone());
        async move {
            let mut odd = get_raw::<Node>(&client, None, &node).await?;
            odd["status"]["conditions"] = json!([
                {"type": "Ready", "status": "Unknown", "lastHeartbeatTime": null, "lastTransitionTime": null,
                 "reason": null, "message": format!("round {round}")},
                {"type": "example.com/Odd", "status": "", "lastHeartbeatTime": null},
            ]);
            odd["status"]["images"] = json!([{"names": null, "sizeBytes": 0}]);
            odd["status"]["nodeInfo"] = json!({});
            odd["status"]["daemonEndpoints"] = json!({"kubeletEndpoint": {}});
            update_raw::<Node>(&client, None, &node, odd, true)
                .await
                .map(drop)
        }
    });
    live.programming_stays_prompt_while(test, writer).await;
    live.finish().await;
}

/// Every field of each watched kind, one odd value at a time (null, a scalar of another type, an
/// unknown member: `switchyard_test_support::odd_values`), written to the API server; what it accepts
/// is read back. No watch restarts, a Service created after it all is programmed within the bound,
/// and the summary says which accepted values the types library refuses (each would have failed the
/// kind's watch before issue 50) and which leave an object undecodable for the controller.
#[tokio::test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn odd_values_the_api_server_accepts_never_fail_a_watch() {
    let _serial = SERIAL.lock().await;
    let test = "odd_values_the_api_server_accepts_never_fail_a_watch";
    let live = Live::start(test).await;
    let (client, ns) = (live.client.clone(), live.ns.clone());

    let service = odd_values::service(&ns, "fuzz");
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(service.clone()).unwrap(),
        )
        .await
        .unwrap();
    update_raw::<Service>(&client, Some(&ns), "fuzz", service, true)
        .await
        .unwrap();
    let slice = odd_values::endpoint_slice(&ns, "fuzz-1", "fuzz", &live.nodes[0]);
    Api::<EndpointSlice>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(slice).unwrap())
        .await
        .unwrap();
    let node_name = format!("swyd-{}-fuzz", live.id);
    let node = odd_values::node(&node_name);
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(node.clone()).unwrap(),
        )
        .await
        .unwrap();
    update_raw::<Node>(&client, None, &node_name, node, true)
        .await
        .unwrap();

    let summaries = [
        fuzz::<Service>(&client, Some(&ns), "fuzz").await,
        fuzz::<EndpointSlice>(&client, Some(&ns), "fuzz-1").await,
        fuzz::<Node>(&client, None, &node_name).await,
    ];
    for summary in &summaries {
        eprintln!("{test}: {summary}");
    }
    let ip = live.service("after-fuzz", "10.244.1.99").await;
    let after = live.until_forwarded(&ip, "10.244.1.99").await;
    eprintln!("{test}: a Service created after it all was in its slice after {after:?}");
    assert!(after <= BOUND, "{after:?}");
    assert_eq!(live.watch_errors(), Vec::<String>::new(), "a watch restarted");
    let _ = Api::<Node>::all(client.clone())
        .delete(&node_name, &DeleteParams::default())
        .await;
    let _ = Api::<NodeForwardingPlan>::all(client.clone())
        .delete(&node_name, &DeleteParams::default())
        .await;
    live.finish().await;
}

/// What one kind's fuzz found.
struct Fuzzed {
    kind: String,
    tried: usize,
    accepted: usize,
    /// Accepted values the types library refuses: the watch failed on each before issue 50.
    refused_by_types: Vec<String>,
    /// Accepted values that leave the object undecodable for the controller (a field it reads).
    undecodable: Vec<String>,
}

impl std::fmt::Display for Fuzzed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} odd values written, {} accepted; the types library refuses {} of those ({}); {} leave \
             the object undecodable for the controller ({})",
            self.kind,
            self.tried,
            self.accepted,
            self.refused_by_types.len(),
            self.refused_by_types.join("; "),
            self.undecodable.len(),
            self.undecodable.join("; "),
        )
    }
}

/// Writes every odd value of object `name` of kind `K` (as served) and reads back what is accepted.
async fn fuzz<K>(client: &kube::Client, namespace: Option<&str>, name: &str) -> Fuzzed
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    switchyard_controller::live::trim::Unread: switchyard_api::tolerant::Prune<K>,
{
    let served = get_raw::<K>(client, namespace, name).await.unwrap();
    let mut fuzzed = Fuzzed {
        kind: K::kind(&()).to_string(),
        tried: 0,
        accepted: 0,
        refused_by_types: Vec::new(),
        undecodable: Vec::new(),
    };
    for odd in odd_values(&served) {
        // Bookkeeping the server owns: every change is refused or ignored.
        if odd.path.starts_with("metadata.managedFields") {
            continue;
        }
        fuzzed.tried += 1;
        let status = odd.path.starts_with("status");
        if update_raw::<K>(client, namespace, name, odd.object, status)
            .await
            .is_err()
        {
            continue;
        }
        fuzzed.accepted += 1;
        let back = get_raw::<K>(client, namespace, name).await.unwrap();
        let what = format!("{} = {}", odd.path, odd.value);
        if let Err(error) = serde_json::from_value::<K>(back.clone()) {
            fuzzed.refused_by_types.push(format!("{what}: {error}"));
        }
        let delivered: Delivered<K> = serde_json::from_value(back).unwrap();
        if let Some(undecodable) = delivered.undecodable() {
            fuzzed.undecodable.push(format!("{what}: {undecodable}"));
        }
    }
    fuzzed
}
