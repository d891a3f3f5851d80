//! Write fan-out: churn simulated through the live controller's real write path against the fake API
//! server, which counts requests and bytes. Virtual time (Tokio's paused clock) makes minutes of churn
//! run in seconds; planning still costs real CPU.
//!
//! Per cluster size: a fresh start (every slice and plan written from nothing: how long at the default
//! write budget), then, each in a fresh run, the churn scenarios on one Service; the churn advances one
//! step per 0.5 s tick, each step one EndpointSlice update:
//! - one-change: one endpoint of a plain ClusterIP Service moves to a new pod on the same node;
//! - rolling-50: a rolling update of a 50-pod Deployment behind a plain ClusterIP Service (one pod
//!   replaced per second: two ticks per replacement, the old pod starts terminating, then its successor
//!   is ready and the old pod is gone);
//! - rolling-50-local: the same behind an externalTrafficPolicy=Local LoadBalancer (every node hosting
//!   one of its pods carries the entry as an override, so their plans change too);
//! - scale-100: scaling a plain Service 0 → 100 → 0, one pod per 0.5 s tick each way.
//!
//! "lag" is the time from the last change to the last write it caused. At the largest size the
//! controller also runs in its own process against the fake API server served over HTTP, so its peak
//! RSS is its own (real time: a fresh start, a rolling update, then a Node joining, which rebuilds the
//! whole plan).
//!
//! `cargo bench -p switchyard-controller --bench churn` (SWITCHYARD_BENCH_SMOKE=1 for a tiny run;
//! SWITCHYARD_BENCH_SIZES=1000x10000 for a subset of sizes).

mod common;

use std::process::ExitCode;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
use switchyard_controller::{
    Config,
    live::run::{Options, run},
    planner::Snapshot,
};
use switchyard_test_support::fake_apiserver::{FakeApiServer, Kind, Recorded};
use switchyard_test_support::synthetic::{self, Shape, slice};

use common::{figure, peak_rss_mib, peak_rss_mib_of, reset_peak_rss, target};

/// The synthetic cluster of `shape` as the planner's input.
fn cluster(shape: &Shape) -> Snapshot {
    Snapshot::from(synthetic::cluster(shape).into_parts())
}

/// A plain ClusterIP Service of the synthetic mix (bucket 50: not eTP/iTP/hinted).
const PLAIN: usize = 50;
/// An externalTrafficPolicy=Local LoadBalancer of the synthetic mix (bucket 0).
const LOCAL: usize = 0;

struct Outcome {
    /// Virtual time from the controller's start to the last write of the fresh start.
    fresh_start: Duration,
    fresh_writes: usize,
    changes: usize,
    writes: usize,
    bytes: usize,
    /// Bytes of the writes times the nodes whose watches deliver them (a slice: every node of its
    /// view; a plan: its node). Request bodies: the watch event adds ~0.4 KiB of metadata each.
    delivered: usize,
    minutes: f64,
    lag: Duration,
}

fn endpoint(ip: String, node: String, ready: bool, terminating: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(ready || terminating),
            terminating: Some(terminating),
        }),
        node_name: Some(node),
        ..Default::default()
    }
}

/// The slice of Service `s` holding the given endpoints.
fn set_endpoints(server: &FakeApiServer, shape: &Shape, s: usize, endpoints: Vec<Endpoint>) {
    let mut slice = slice(s, shape, 0);
    slice.endpoints = Some(endpoints);
    server.put(Kind::EndpointSlice, slice);
}

fn node(i: usize, shape: &Shape) -> String {
    format!("node-{:04}", i % shape.nodes)
}

/// How many nodes' watches deliver a write: a slice goes to every node of its view (its name starts
/// with the view id), a plan to its own node.
fn receivers(write: &Recorded, shape: &Shape) -> usize {
    let Some(name) = write
        .path
        .strip_prefix("/apis/switchyard.io/v1alpha2/forwardingslices/")
    else {
        return 1;
    };
    let view = switchyard_api::slice::view_of_name(name);
    if view == "all" {
        return shape.nodes;
    }
    (0..shape.nodes)
        .filter(|i| {
            let node = synthetic::node(*i, shape);
            let zone = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("topology.kubernetes.io/zone"))
                .cloned();
            switchyard_api::View::Zone(zone).id() == view
        })
        .count()
        .max(1)
}

fn writes(server: &FakeApiServer) -> Vec<Recorded> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PATCH || r.method == Method::DELETE)
        .collect()
}

/// Seeds the fake API server with the synthetic cluster; plans and slices are only counted.
fn seeded(shape: &Shape) -> FakeApiServer {
    let server = FakeApiServer::new();
    server.count_only(Kind::Plan);
    server.count_only(Kind::ForwardingSlice);
    let snapshot = cluster(shape);
    server.seed(&snapshot.nodes, &snapshot.services, &snapshot.slices);
    server
}

/// Waits until no write arrived for `quiet`; returns when the last write arrived (`None`: none yet).
async fn drain(server: &FakeApiServer, quiet: Duration) -> Option<tokio::time::Instant> {
    let since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = writes(server).iter().map(|r| r.at).max();
        if last.unwrap_or(since).elapsed() > quiet {
            return last;
        }
    }
}

type Steps = fn(&FakeApiServer, &Shape, usize) -> bool;

async fn scenario(shape: Shape, coalesce: bool, steps: Steps) -> Outcome {
    let server = seeded(&shape);
    let config = Config {
        min_plan_interval: if coalesce {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(50)
        },
        ..Config::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let client = server.client();
    let started = tokio::time::Instant::now();
    let controller = tokio::spawn(async move {
        let _ = run(
            client,
            Options::new(config),
            async {
                let _ = stop_rx.await;
            },
            None,
        )
        .await;
    });
    // The fresh start: every slice and plan, until writes stop.
    let fresh_end = drain(&server, Duration::from_secs(5)).await.unwrap_or(started);
    let fresh_writes = writes(&server).len();
    server.clear_requests();
    let start = tokio::time::Instant::now();
    let mut changes = 0;
    let mut step = 0;
    while steps(&server, &shape, step) {
        changes += 1;
        step += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The last change was made 0.5 s ago.
    let churn_end = tokio::time::Instant::now() - Duration::from_millis(500);
    let last_write = drain(&server, Duration::from_secs(5)).await.unwrap_or(churn_end);
    let done = writes(&server);
    let bytes = done.iter().map(|r| r.body_len).sum();
    let delivered = done
        .iter()
        .filter(|r| r.method == Method::PATCH)
        .map(|r| r.body_len * receivers(r, &shape))
        .sum();
    let _ = stop_tx.send(());
    let _ = controller.await;
    Outcome {
        fresh_start: fresh_end - started,
        fresh_writes,
        changes,
        writes: done.len(),
        bytes,
        delivered,
        // Over the whole time writes were happening: the churn and the drain after it.
        minutes: (last_write.max(churn_end) - start).as_secs_f64().max(1.0) / 60.0,
        lag: last_write.saturating_duration_since(churn_end),
    }
}

/// One endpoint of the plain Service moves to a new pod on the same node.
fn one_change(server: &FakeApiServer, shape: &Shape, step: usize) -> bool {
    if step > 0 {
        return false;
    }
    server.put(Kind::EndpointSlice, slice(PLAIN, shape, 1));
    true
}

/// Rolling update of 50 pods of Service `s`, one pod replaced per second (two 0.5 s ticks): on odd
/// steps old pod `k` is terminating (its successor is starting, not yet in the slice); on the next even
/// step new pod `k` is ready and old pod `k` is gone. 50 pods take 102 slice updates (51 s).
fn rolling(server: &FakeApiServer, shape: &Shape, step: usize, s: usize) -> bool {
    let pods = if common::smoke() { 8 } else { 50 };
    let replaced = step / 2;
    if replaced > pods {
        return false;
    }
    let eps = (0..pods)
        .map(|i| {
            if i < replaced {
                endpoint(format!("10.200.1.{i}"), node(i * 7 + 1, shape), true, false)
            } else {
                // Odd steps: the next old pod is terminating while its successor starts (not yet listed).
                let terminating = i == replaced && step % 2 == 1;
                endpoint(
                    format!("10.200.0.{i}"),
                    node(i * 7, shape),
                    !terminating,
                    terminating,
                )
            }
        })
        .collect();
    set_endpoints(server, shape, s, eps);
    true
}

fn rolling_plain(server: &FakeApiServer, shape: &Shape, step: usize) -> bool {
    rolling(server, shape, step, PLAIN)
}

fn rolling_local(server: &FakeApiServer, shape: &Shape, step: usize) -> bool {
    rolling(server, shape, step, LOCAL)
}

/// Scale the plain Service 0 → 100 → 0, one pod per 0.5 s tick (two pods per second): 201 slice
/// updates (100.5 s).
fn scale(server: &FakeApiServer, shape: &Shape, step: usize) -> bool {
    let top = if common::smoke() { 10 } else { 100 };
    let count = if step <= top {
        step
    } else if step <= 2 * top {
        2 * top - step
    } else {
        return false;
    };
    let eps = (0..count)
        .map(|i| {
            endpoint(
                format!("10.201.{}.{}", i / 250, i % 250),
                node(i, shape),
                true,
                false,
            )
        })
        .collect();
    set_endpoints(server, shape, PLAIN, eps);
    true
}

/// The controller binary in its own process against the fake API server over HTTP (real time): a
/// fresh start, a rolling update, then a Node joining (a full rebuild); its peak RSS (VmHWM) in MiB and
/// the fresh start's duration.
fn controller_process_rss(shape: Shape) -> Result<(f64, Duration), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("no runtime: {e}"))?;
    runtime.block_on(async move {
        let server = seeded(&shape);
        let (addr, _serving) = server.serve_http().await.map_err(|e| format!("serving: {e}"))?;
        let dir = switchyard_test_support::scratch::dir("bench-churn").map_err(|e| e.to_string())?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\n\
                 clusters:\n- name: k\n  cluster: {{server: 'http://{addr}'}}\nusers:\n- name: u\n  user: {{token: t}}\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        let started = tokio::time::Instant::now();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchyard-controller"))
            .args(["run", "--kubeconfig"])
            .arg(&kubeconfig)
            .env("RUST_LOG", "warn")
            // As config/controller/deployment.yaml runs it.
            .env("MALLOC_ARENA_MAX", "2")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the controller: {e}"))?;
        let pid = child.id().unwrap_or_default().to_string();
        let fresh_end = drain(&server, Duration::from_secs(5)).await.unwrap_or(started);
        let fresh = fresh_end - started;
        let mut step = 0;
        while rolling_plain(&server, &shape, step) {
            step += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        drain(&server, Duration::from_secs(3)).await;
        let joined = tokio::time::Instant::now();
        server.put(Kind::Node, synthetic::node(shape.nodes, &shape));
        let last = drain(&server, Duration::from_secs(5)).await;
        let peak = peak_rss_mib_of(&pid);
        let _ = child.kill().await;
        if last.is_none_or(|at| at < joined) {
            return Err("a Node joining led to no write (its plan)".into());
        }
        Ok((peak, fresh))
    })
}

fn benchmark() -> Result<(), String> {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then this runs as a quick
    // smoke check with tiny sizes (benchmarks are never timed tests).
    let smoke = common::smoke();
    let mut shapes: Vec<Shape> = if smoke {
        vec![Shape::new(5, 100, 3)]
    } else {
        vec![
            Shape::new(10, 1_000, 5),
            Shape::new(100, 1_000, 5),
            Shape::new(100, 10_000, 5),
            Shape::new(1_000, 10_000, 5),
        ]
    };
    // SWITCHYARD_BENCH_SIZES=100x10000,1000x10000 runs a subset.
    if let Ok(list) = std::env::var("SWITCHYARD_BENCH_SIZES") {
        shapes = list
            .split(',')
            .filter_map(|size| {
                let (nodes, services) = size.trim().split_once('x')?;
                Some(Shape::new(nodes.parse().ok()?, services.parse().ok()?, 5))
            })
            .collect();
    }
    let defaults = Config::default();
    println!(
        "write fan-out (fake API server; write budget {} QPS, burst {}; objects up to {} bytes; virtual time)",
        defaults.write_qps, defaults.write_burst, defaults.max_object_bytes
    );
    println!(
        "{:>6} {:>7} {:>16} {:>9} | {:>11} {:>8} | {:>8} {:>8} {:>11} {:>9} {:>14} {:>17} {:>8}",
        "nodes",
        "svcs",
        "scenario",
        "coalesce",
        "fresh start",
        "objects",
        "changes",
        "writes",
        "writes/min",
        "MiB/min",
        "bytes/change",
        "delivered/change",
        "lag"
    );
    let scenarios: [(&str, Steps); 4] = [
        ("one-change", one_change),
        ("rolling-50", rolling_plain),
        ("rolling-50-local", rolling_local),
        ("scale-100", scale),
    ];
    // SWITCHYARD_BENCH_SCENARIOS=one-change,rolling-50 runs a subset of the scenarios.
    let wanted: Option<Vec<String>> = std::env::var("SWITCHYARD_BENCH_SCENARIOS")
        .ok()
        .map(|list| list.split(',').map(|s| s.trim().to_string()).collect());
    for shape in shapes {
        let full = !smoke && (shape.nodes, shape.services) == (1_000, 10_000);
        let mut peak_rss: f64 = 0.0;
        for (name, steps) in scenarios {
            for coalesce in [true, false] {
                let skipped = wanted.as_ref().is_some_and(|w| !w.iter().any(|n| n == name));
                if skipped || (!coalesce && (name == "one-change" || full)) {
                    continue;
                }
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .start_paused(true)
                    .build()
                    .map_err(|e| format!("no runtime: {e}"))?;
                reset_peak_rss();
                let outcome = runtime.block_on(scenario(shape, coalesce, steps));
                drop(runtime);
                peak_rss = peak_rss.max(peak_rss_mib());
                if outcome.changes == 0 || outcome.writes == 0 {
                    return Err(format!(
                        "{name} at {} nodes × {} Services: {} changes led to {} writes",
                        shape.nodes, shape.services, outcome.changes, outcome.writes
                    ));
                }
                let per_min = |n: f64| n / outcome.minutes;
                println!(
                    "{:>6} {:>7} {:>16} {:>9} | {:>10.1}s {:>8} | {:>8} {:>8} {:>11.0} {:>9.2} {:>14.0} {:>17.0} {:>7.2}s",
                    shape.nodes,
                    shape.services,
                    name,
                    if coalesce { "1s" } else { "off" },
                    outcome.fresh_start.as_secs_f64(),
                    outcome.fresh_writes,
                    outcome.changes,
                    outcome.writes,
                    per_min(outcome.writes as f64),
                    per_min(outcome.bytes as f64) / 1_048_576.0,
                    outcome.bytes as f64 / outcome.changes.max(1) as f64,
                    outcome.delivered as f64 / outcome.changes.max(1) as f64,
                    outcome.lag.as_secs_f64()
                );
                if full && coalesce {
                    judge(name, &outcome);
                }
                if !smoke && coalesce && (shape.nodes, shape.services) == (5_000, 10_000) {
                    judge_5000(name, &outcome);
                }
            }
        }
        println!(
            "peak RSS at {} nodes × {} Services (in-process: controller + fake API server + its copies): {:.0} MiB",
            shape.nodes, shape.services, peak_rss
        );
        let at_5000 = !smoke && (shape.nodes, shape.services) == (5_000, 10_000);
        if full || at_5000 || (smoke && shape.nodes == 5) {
            let (rss, fresh) = controller_process_rss(shape)?;
            println!(
                "controller in its own process at {} nodes × {} Services (fake API server over HTTP, real time): \
                 peak RSS {rss:.0} MiB over a fresh start ({:.1} s), a rolling update and a Node joining",
                shape.nodes,
                shape.services,
                fresh.as_secs_f64()
            );
            if full || at_5000 {
                target(
                    &format!(
                        "live controller peak RSS at {} × 10,000 (its own process; fresh start, rolling update, Node join)",
                        if full { "1,000" } else { "5,000" }
                    ),
                    &format!("{rss:.0} MiB"),
                    "≤ 250 MiB",
                    rss <= 250.0,
                );
            }
        }
    }
    Ok(())
}

/// The targets at 5,000 nodes × 10,000 Services (`SWITCHYARD_BENCH_SIZES=5000x10000`).
fn judge_5000(name: &str, outcome: &Outcome) {
    if name != "one-change" {
        return;
    }
    target(
        "fresh start at 5,000 × 10,000: every object written at the default budget",
        &format!(
            "{:.1} s ({} objects)",
            outcome.fresh_start.as_secs_f64(),
            outcome.fresh_writes
        ),
        "≤ 120 s",
        outcome.fresh_start <= Duration::from_secs(120),
    );
    target(
        "one endpoint change at 5,000 × 10,000: objects written",
        &outcome.writes.to_string(),
        "≤ 2",
        outcome.writes <= 2,
    );
    target(
        "one endpoint change at 5,000 × 10,000: bytes delivered to all nodes (request bodies × receivers)",
        &format!("{:.2} MB", outcome.delivered as f64 / 1e6),
        "≤ 10 MB",
        outcome.delivered <= 10_000_000,
    );
}

/// The targets at 1,000 nodes × 10,000 Services (coalescing at the default 1 s).
fn judge(name: &str, outcome: &Outcome) {
    match name {
        "one-change" => {
            target(
                "one endpoint change at 1,000 × 10,000 (live controller): objects written",
                &outcome.writes.to_string(),
                "≤ 2",
                outcome.writes <= 2,
            );
            target(
                "one endpoint change at 1,000 × 10,000 (live controller): bytes written",
                &format!("{} bytes", outcome.bytes),
                "≤ 64 KiB",
                outcome.bytes <= 64 * 1024,
            );
            figure(
                "one endpoint change at 1,000 × 10,000: bytes delivered to all nodes (request bodies × receivers)",
                &format!("{:.2} MB", outcome.delivered as f64 / 1e6),
            );
            target(
                "one endpoint change at 1,000 × 10,000: change → last write (every agent of the view receives that write)",
                &format!("{:.2} s", outcome.lag.as_secs_f64()),
                "≤ 1 s",
                outcome.lag <= Duration::from_secs(1),
            );
            target(
                "fresh start at 1,000 × 10,000: every object written at the default budget (live controller)",
                &format!(
                    "{:.1} s ({} objects)",
                    outcome.fresh_start.as_secs_f64(),
                    outcome.fresh_writes
                ),
                "≤ 60 s",
                outcome.fresh_start <= Duration::from_secs(60),
            );
        }
        "rolling-50" => {
            let mib = outcome.bytes as f64 / 1_048_576.0 / outcome.minutes;
            target(
                "rolling update of a 50-pod Deployment at 1,000 × 10,000: written to the API server",
                &format!("{mib:.2} MiB/min"),
                "≤ 5 MiB/min",
                mib <= 5.0,
            );
            target(
                "rolling update of a 50-pod Deployment at 1,000 × 10,000: lag after the last change",
                &format!("{:.2} s", outcome.lag.as_secs_f64()),
                "≤ 2 s",
                outcome.lag <= Duration::from_secs(2),
            );
        }
        _ => figure(
            &format!("write fan-out at 1,000 × 10,000, {name}, coalesce 1s"),
            &format!(
                "{:.0} writes/min, {:.2} MiB/min, lag {:.2} s",
                outcome.writes as f64 / outcome.minutes,
                outcome.bytes as f64 / 1_048_576.0 / outcome.minutes,
                outcome.lag.as_secs_f64()
            ),
        ),
    }
}

fn main() -> ExitCode {
    match benchmark() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("churn benchmark failed: {error}");
            ExitCode::FAILURE
        }
    }
}
