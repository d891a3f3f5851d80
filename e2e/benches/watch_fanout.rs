//! Read fan-out against a real kube-apiserver: what one endpoint change costs every node, watched as
//! the agent watches (its plan by `switchyard.io/node`, its views' slices by `switchyard.io/view`) and,
//! side by side, as kube-proxy watches (EndpointSlices, minus headless and other proxies' ones).
//!
//! ```text
//! scratch API server (KUBECONFIG; `make bench` starts one: scripts/with-control-plane.sh)
//!   ─► CRDs, N Nodes in 3 zones, 1,000 Services × 5 endpoints (test-support's synthetic cluster)
//!   ─► the live controller in process writes every slice and plan
//!   ─► N agent watches + N kube-proxy watches (raw HTTP, bytes counted as they arrive)
//!   ─► one endpoint of a plain ClusterIP Service moves to a new pod on the same node
//!   ─► per watch: bytes, events, when the last event arrived; the API server's own metrics: writes,
//!      bytes written and mean write latency of the controller's applies
//! ```
//!
//! `scripts/with-control-plane.sh cargo bench -p switchyard-e2e --bench watch_fanout`
//! (SWITCHYARD_BENCH_WATCHERS=300 by default; SWITCHYARD_BENCH_SMOKE=1 or `cargo test`: 6 nodes ×
//! 60 Services). Without KUBECONFIG it says it is skipped. It creates Nodes named `node-NNNN` and the
//! namespace `bench`, so it refuses an API server that already has Nodes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    names::{LABEL_NODE, views_selector},
};
use switchyard_controller::{
    Config,
    live::run::{Options, run},
};
use switchyard_test_support::synthetic::{self, Shape};

const FIELD_MANAGER: &str = "switchyard-bench";
/// The Service whose endpoint moves: a plain ClusterIP Service of the synthetic mix.
const PLAIN: usize = 50;

fn smoke() -> bool {
    std::env::var_os("SWITCHYARD_BENCH_SMOKE").is_some() || !std::env::args().any(|a| a == "--bench")
}

/// What one watch received after the change.
#[derive(Debug, Default, Clone)]
struct Received {
    bytes: usize,
    events: usize,
    last: Option<Instant>,
    established: bool,
}

type Counter = Arc<Mutex<Received>>;

/// Opens a raw watch from `resource_version` and counts every event line into `counter` once
/// `counting` is set.
fn watch(client: &Client, path: String, counter: Counter, counting: Arc<std::sync::atomic::AtomicBool>) {
    let client = client.clone();
    tokio::spawn(async move {
        let Ok(request) = http::Request::get(path).body(Vec::new()) else {
            return;
        };
        let Ok(stream) = client.request_stream(request).await else {
            return;
        };
        if let Ok(mut c) = counter.lock() {
            c.established = true;
        }
        let mut lines = stream.lines();
        while let Some(Ok(line)) = lines.next().await {
            if counting.load(std::sync::atomic::Ordering::Relaxed)
                && let Ok(mut c) = counter.lock()
            {
                c.bytes += line.len() + 1;
                c.events += 1;
                c.last = Some(Instant::now());
            }
        }
    });
}

fn query(selector: &str) -> String {
    url_escape(selector)
}

fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The API server's counters for one resource: (applies/patches, request body bytes, latency sum s).
async fn write_metrics(client: &Client, resource: &str) -> Result<(f64, f64, f64, f64), String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("reading the API server's /metrics: {e}"))?;
    // The body-size histogram names the resource with its group and the verb in lower case.
    let pick = |metric: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(metric))
            .filter(|l| {
                l.contains(&format!("resource=\"{resource}\""))
                    || l.contains(&format!("resource=\"{resource}.switchyard.io\""))
            })
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("verb=\"apply\"") || l.contains("verb=\"patch\"")
            })
            .filter(|l| !l.contains("subresource=\"status\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok((
        pick("apiserver_request_total{"),
        pick("apiserver_request_body_size_bytes_sum{"),
        pick("apiserver_request_duration_seconds_sum{"),
        pick("apiserver_request_duration_seconds_count{"),
    ))
}

async fn seed(client: &Client, shape: &Shape) -> Result<(), String> {
    let cluster = synthetic::cluster(shape);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "bench"}}))
        .map_err(|e| e.to_string())?;
    namespaces
        .patch(
            "bench",
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&ns),
        )
        .await
        .map_err(|e| format!("namespace bench: {e}"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(cluster.nodes.into_iter().map(|mut node| {
        let nodes = nodes.clone();
        async move {
            node.metadata.uid = None;
            let status = node.status.take();
            let name = node.metadata.name.clone().unwrap_or_default();
            nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(|e| format!("node {name}: {e}"))?;
            let status = serde_json::json!({"status": status});
            nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(|e| format!("node {name} status: {e}"))?;
            Ok::<(), String>(())
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "bench");
    let plain = cluster.services.into_iter().map(|mut svc| {
        // The API server allocates addresses and NodePorts from its own ranges.
        if let Some(spec) = svc.spec.as_mut() {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec.health_check_node_port = None;
            for port in spec.ports.iter_mut().flatten() {
                port.node_port = None;
            }
        }
        svc
    });
    create_all(&services, plain, "service").await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "bench");
    create_all(&slices, cluster.slices.into_iter(), "endpointslice").await?;
    Ok(())
}

/// Creates every object, 16 at a time.
async fn create_all<K>(api: &Api<K>, objects: impl Iterator<Item = K>, kind: &str) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(objects.map(|object| async move {
        let name = object.meta().name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &object)
            .await
            .map(drop)
            .map_err(|e| format!("{kind} {name}: {e}"))
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await
    .map(drop)
}

/// Removes what the bench created: its Nodes, the plans and slices (the bench refuses an API server
/// that had plans before), the namespace.
async fn clean(client: &Client, shape: &Shape) {
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..shape.nodes {
        let _ = nodes
            .delete(&synthetic::node_name(i), &DeleteParams::default())
            .await;
    }
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let _ = plans
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let fws: Api<ForwardingSlice> = Api::all(client.clone());
    let _ = fws
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete("bench", &DeleteParams::default()).await;
}

#[derive(Debug)]
struct Side {
    mean_bytes: f64,
    max_bytes: usize,
    events: usize,
    lag: Option<Duration>,
    receiving: usize,
}

fn side(counters: &[Counter], changed: Instant) -> Side {
    let got: Vec<Received> = counters
        .iter()
        .filter_map(|c| c.lock().ok().map(|c| c.clone()))
        .collect();
    let bytes: Vec<usize> = got.iter().map(|r| r.bytes).collect();
    Side {
        mean_bytes: bytes.iter().sum::<usize>() as f64 / bytes.len().max(1) as f64,
        max_bytes: bytes.iter().copied().max().unwrap_or(0),
        events: got.iter().map(|r| r.events).sum(),
        lag: got
            .iter()
            .filter_map(|r| r.last)
            .max()
            .map(|t| t.saturating_duration_since(changed)),
        receiving: got.iter().filter(|r| r.events > 0).count(),
    }
}

async fn bench(client: Client, watchers: usize, services: usize) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let existing = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing Nodes: {e}"))?;
    if let Some(name) = existing
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .find(|n| n.starts_with("node-"))
    {
        return Err(format!(
            "the API server already has a Node {name}: run this against a scratch API server \
             (scripts/with-control-plane.sh without KUBECONFIG starts one)"
        ));
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt("bench")
        .await
        .map_err(|e| format!("reading namespace bench: {e}"))?
        .is_some()
    {
        return Err(
            "the API server already has a namespace bench: run this against a scratch API server".into(),
        );
    }
    apply_crds(&client).await?;
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    if !plans
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| format!("listing plans: {e}"))?
        .items
        .is_empty()
    {
        return Err(
            "the API server already has NodeForwardingPlans (Switchyard runs there): \
                    run this against a scratch API server"
                .into(),
        );
    }
    let shape = Shape::new(watchers, services, 5);
    let seeded = Instant::now();
    seed(&client, &shape).await?;
    println!(
        "seeded {watchers} Nodes, {services} Services and EndpointSlices in {:.1} s",
        seeded.elapsed().as_secs_f64()
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller_client = client.clone();
    let controller = tokio::spawn(async move {
        run(
            controller_client,
            Options::new(Config::default()),
            async {
                let _ = stop_rx.await;
            },
            None,
        )
        .await
        .map_err(|e| e.to_string())
    });
    let started = Instant::now();
    let mut plans_written = 0;
    while plans_written < watchers {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {plans_written} of {watchers} plans after 600 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        plans_written = plans
            .list(&ListParams::default())
            .await
            .map_or(0, |l| l.items.len());
    }
    // Let the writes of the fresh start finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "fresh start: {watchers} plans written {:.1} s after the controller started",
        started.elapsed().as_secs_f64()
    );
    let listed = plans
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing plans: {e}"))?;
    let fws: Api<ForwardingSlice> = Api::all(client.clone());
    let slice_list = fws
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing slices: {e}"))?;
    let rv_plans = listed.metadata.resource_version.clone().unwrap_or_default();
    let rv_fws = slice_list.metadata.resource_version.clone().unwrap_or_default();
    let eps_api: Api<EndpointSlice> = Api::all(client.clone());
    let rv_eps = eps_api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|e| format!("listing EndpointSlices: {e}"))?
        .metadata
        .resource_version
        .unwrap_or_default();

    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut agent: Vec<Counter> = Vec::new();
    let mut proxy: Vec<Counter> = Vec::new();
    // Only the bench's own nodes (other Nodes of the API server get plans too, but are not counted).
    for plan in listed
        .items
        .iter()
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("node-")))
    {
        let node = plan.metadata.name.clone().unwrap_or_default();
        let views = views_selector(plan.spec.views.iter().map(String::as_str));
        let counter = Counter::default();
        let node_selector = format!("{LABEL_NODE}={node}");
        watch(
            &client,
            format!(
                "/apis/switchyard.io/v1alpha2/nodeforwardingplans?watch=true&resourceVersion={rv_plans}&labelSelector={}",
                query(&node_selector)
            ),
            counter.clone(),
            counting.clone(),
        );
        watch(
            &client,
            format!(
                "/apis/switchyard.io/v1alpha2/forwardingslices?watch=true&resourceVersion={rv_fws}&labelSelector={}",
                query(&views)
            ),
            counter.clone(),
            counting.clone(),
        );
        agent.push(counter);
        let counter = Counter::default();
        watch(
            &client,
            format!(
                "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion={rv_eps}&labelSelector={}",
                query("!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name")
            ),
            counter.clone(),
            counting.clone(),
        );
        proxy.push(counter);
    }
    let open = Instant::now();
    loop {
        let ready = agent
            .iter()
            .chain(&proxy)
            .filter(|c| c.lock().is_ok_and(|c| c.established))
            .count();
        if ready == agent.len() + proxy.len() {
            break;
        }
        if open.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "{ready} of {} watches open after 60 s",
                agent.len() + proxy.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = write_metrics(&client, "forwardingslices").await?;
    let before_plans = write_metrics(&client, "nodeforwardingplans").await?;
    counting.store(true, std::sync::atomic::Ordering::Relaxed);
    // One endpoint of the plain Service moves to a new pod on the same node.
    let moved = synthetic::slice(PLAIN, &shape, 1);
    let changed = Instant::now();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "bench");
    let name = moved.metadata.name.clone().unwrap_or_default();
    slices
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&moved),
        )
        .await
        .map_err(|e| format!("moving an endpoint: {e}"))?;
    // Quiet for 3 s: everything the change caused has arrived.
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let last = agent
            .iter()
            .chain(&proxy)
            .filter_map(|c| c.lock().ok().and_then(|c| c.last))
            .max()
            .unwrap_or(changed);
        if last.elapsed() > Duration::from_secs(3) || changed.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    let after = write_metrics(&client, "forwardingslices").await?;
    let after_plans = write_metrics(&client, "nodeforwardingplans").await?;
    let ours = side(&agent, changed);
    let theirs = side(&proxy, changed);
    let _ = stop_tx.send(());
    let _ = controller.await;

    let writes = (after.0 - before.0) + (after_plans.0 - before_plans.0);
    let written = (after.1 - before.1) + (after_plans.1 - before_plans.1);
    let (latency_sum, latency_count) = (after.2 + after_plans.2, after.3 + after_plans.3);
    let ratio = ours.mean_bytes / theirs.mean_bytes.max(1.0);
    let ms = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3));
    println!(
        "one endpoint change of a plain ClusterIP Service, {watchers} nodes × {services} Services × 5 endpoints (real kube-apiserver):"
    );
    println!(
        "  {:<22} {:>14} {:>10} {:>8} {:>10} {:>14}",
        "watching as", "bytes per node", "max", "events", "receiving", "last node at"
    );
    for (label, s) in [("switchyard agent", &ours), ("kube-proxy", &theirs)] {
        println!(
            "  {:<22} {:>14.0} {:>10} {:>8} {:>10} {:>14}",
            label,
            s.mean_bytes,
            s.max_bytes,
            s.events,
            s.receiving,
            ms(s.lag)
        );
    }
    println!("  ratio (agent / kube-proxy bytes per node): {ratio:.2}");
    println!(
        "  controller writes for the change: {writes:.0} ({written:.0} bytes of request bodies); mean apply latency \
         over the whole run {:.1} ms ({latency_count:.0} applies)",
        latency_sum / latency_count.max(1.0) * 1e3
    );
    if !smoke() && watchers == 300 {
        summary(
            "bytes per node per endpoint change at 300 nodes, vs kube-proxy's EndpointSlice watch",
            &format!("{ratio:.2}×"),
            "≤ 1.0×",
            ratio <= 1.0,
        );
        summary(
            "one endpoint change at 300 nodes (real API server): writes",
            &format!("{writes:.0}"),
            "≤ 2",
            writes <= 2.0,
        );
        summary(
            "one endpoint change at 300 nodes (real API server): bytes written",
            &format!("{written:.0} bytes"),
            "≤ 8 KiB",
            written <= 8192.0,
        );
        summary(
            "one endpoint change at 300 nodes (real API server): the last node has it",
            &ms(ours.lag),
            "≤ 1 s",
            ours.lag.is_some_and(|l| l <= Duration::from_secs(1)),
        );
    }
    if ours.receiving < watchers {
        return Err(format!(
            "only {} of {watchers} agent watches saw the change",
            ours.receiving
        ));
    }
    Ok(())
}

fn summary(what: &str, value: &str, goal: &str, met: bool) {
    let verdict = if met { "met" } else { "MISSED" };
    println!("target {what}: {value} ({goal}) {verdict}");
    if let Some(path) = std::env::var_os("SWITCHYARD_BENCH_SUMMARY") {
        use std::io::Write as _;
        if let Ok(mut file) = std::fs::OpenOptions::new().append(true).create(true).open(path) {
            let _ = writeln!(file, "SUMMARY|{what}|{value}|{goal}|{verdict}");
        }
    }
}

/// Every CRD of crds/ by name: the controller watches ForwardingRollouts too.
fn crd_names() -> impl Iterator<Item = &'static str> {
    switchyard_api::crd::CRD_FILES
        .into_iter()
        .map(|file| file.trim_end_matches(".yaml"))
}

async fn apply_crds(client: &Client) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in crd_names() {
        let path = format!("{}/../crds/{file}.yaml", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        crds.patch(
            file,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("applying {file}: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for file in crd_names() {
        loop {
            let established = crds
                .get(file)
                .await
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{file} not established after 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    if std::env::var_os("KUBECONFIG").is_none() {
        if let Some(path) = std::env::var_os("SWITCHYARD_BENCH_SUMMARY") {
            use std::io::Write as _;
            if let Ok(mut file) = std::fs::OpenOptions::new().append(true).create(true).open(path) {
                let _ = writeln!(file, "SUMMARY|watch_fanout benchmark|skipped: no API server|-|-");
            }
        }
        println!(
            "watch_fanout: SKIPPED: needs a scratch API server (KUBECONFIG; `make bench` with SWITCHYARD_K8S_BIN \
             starts one through scripts/with-control-plane.sh)"
        );
        return std::process::ExitCode::SUCCESS;
    }
    let (watchers, services) = if smoke() {
        (6, 60)
    } else {
        let watchers = std::env::var("SWITCHYARD_BENCH_WATCHERS")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or(300);
        (watchers, 1_000)
    };
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread().enable_all().build() else {
        eprintln!("watch_fanout: no runtime");
        return std::process::ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(async {
        let client = Client::try_default()
            .await
            .map_err(|e| format!("a client from KUBECONFIG: {e}"))?;
        let outcome = bench(client.clone(), watchers, services).await;
        if !matches!(&outcome, Err(why) if why.contains("scratch API server")) {
            clean(&client, &Shape::new(watchers, services, 5)).await;
        }
        outcome
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("watch_fanout: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
