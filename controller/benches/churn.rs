//! Write fan-out: churn simulated through the live controller's real write path against the fake API
//! server, which counts requests and bytes. Virtual time (Tokio's paused clock) makes minutes of churn
//! run in seconds; planning still costs real CPU.
//!
//! The churn advances one step per 0.5 s tick, each step one EndpointSlice update. Scenarios: a rolling
//! update of a 50-pod Deployment (one pod replaced per second: two ticks per replacement, the old pod
//! starts terminating, then its successor is ready and the old pod is gone) and scaling one Service
//! 0 → 100 → 0 (one pod per 0.5 s tick each way, two pods per second). Each runs with coalescing
//! (minPlanInterval 1 s) and without (50 ms). After each cluster size it prints the peak RSS of the
//! process: the live controller (kube-runtime watch caches, engine, planner, writer) plus the fake API
//! server's copy of the objects.
//!
//! `cargo bench -p switchyard-controller --bench churn` (SWITCHYARD_BENCH_SMOKE=1 for a tiny run).

mod common;

use std::process::ExitCode;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
use switchyard_controller::{
    Config,
    live::run::{Options, run},
    synthetic::{Shape, cluster, slice},
    testing::fake_apiserver::{FakeApiServer, Kind},
};

use common::{figure, peak_rss_mib, reset_peak_rss};

struct Outcome {
    changes: usize,
    writes: usize,
    bytes: usize,
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

/// The slice of Service 0 holding the given endpoints.
fn set_endpoints(server: &FakeApiServer, shape: &Shape, endpoints: Vec<Endpoint>) {
    let mut s = slice(0, shape, 0);
    s.endpoints = Some(endpoints);
    server.put(Kind::EndpointSlice, s);
}

fn node(i: usize, shape: &Shape) -> String {
    format!("node-{:04}", i % shape.nodes)
}

async fn scenario(
    shape: Shape,
    coalesce: bool,
    steps: impl Fn(&FakeApiServer, &Shape, usize) -> bool,
) -> Outcome {
    let server = FakeApiServer::new();
    server.count_only(Kind::Plan);
    let snapshot = cluster(&shape);
    for n in &snapshot.nodes {
        server.put(Kind::Node, n);
    }
    for s in &snapshot.services {
        server.put(Kind::Service, s);
    }
    for s in &snapshot.slices {
        server.put(Kind::EndpointSlice, s);
    }
    // The fake API server holds its own copy; this one would only inflate the measured RSS.
    drop(snapshot);
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
    // Initial sync: every node gets its plan (at least one object written per node).
    loop {
        let written: std::collections::BTreeSet<String> = server
            .requests()
            .iter()
            .filter(|r| r.method == Method::PATCH)
            .map(|r| {
                r.path
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        if written.len() >= shape.nodes {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    server.clear_requests();
    let start = tokio::time::Instant::now();
    let mut changes = 0;
    let mut step = 0;
    while steps(&server, &shape, step) {
        changes += 1;
        step += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let churn_end = tokio::time::Instant::now();
    // Drain: wait until writes stop.
    let mut last = 0;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let writes = server
            .requests()
            .iter()
            .filter(|r| r.method == Method::PATCH)
            .count();
        if writes != last {
            last = writes;
            quiet_since = tokio::time::Instant::now();
        } else if quiet_since.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::PATCH)
        .collect();
    let bytes = patches.iter().map(|r| r.body_len).sum();
    let _ = stop_tx.send(());
    let _ = controller.await;
    Outcome {
        changes,
        writes: patches.len(),
        bytes,
        // Over the whole time writes were happening: the churn and the drain after it.
        minutes: (quiet_since.max(churn_end) - start).as_secs_f64() / 60.0,
        lag: quiet_since.saturating_duration_since(churn_end),
    }
}

/// Rolling update of 50 pods, one pod replaced per second (two 0.5 s ticks): on odd steps old pod `k`
/// is terminating (its successor is starting, not yet in the slice); on the next even step new pod `k`
/// is ready and old pod `k` is gone. 50 pods take 102 slice updates (51 s).
fn rolling(server: &FakeApiServer, shape: &Shape, step: usize) -> bool {
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
    set_endpoints(server, shape, eps);
    true
}

/// Scale 0 → 100 → 0, one pod per 0.5 s tick (two pods per second): 201 slice updates (100.5 s).
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
    set_endpoints(server, shape, eps);
    true
}

fn benchmark() -> Result<(), String> {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then this runs as a quick
    // smoke check with tiny sizes (benchmarks are never timed tests).
    let smoke = common::smoke();
    let shapes: Vec<Shape> = if smoke {
        vec![Shape::new(5, 50, 3)]
    } else {
        vec![
            Shape::new(10, 1_000, 5),
            Shape::new(100, 1_000, 5),
            Shape::new(100, 10_000, 5),
            Shape::new(1_000, 10_000, 5),
        ]
    };
    println!(
        "write fan-out (fake API server; write budget {} QPS, burst {}; virtual time)",
        Config::default().write_qps,
        Config::default().write_burst
    );
    println!(
        "{:>6} {:>7} {:>10} {:>9} | {:>8} {:>8} {:>11} {:>12} {:>14} {:>10}",
        "nodes",
        "svcs",
        "scenario",
        "coalesce",
        "changes",
        "writes",
        "writes/min",
        "MiB/min",
        "bytes/change",
        "lag"
    );
    for shape in shapes {
        let mut peak_rss: f64 = 0.0;
        for (name, steps) in [
            ("rolling-50", rolling as fn(&FakeApiServer, &Shape, usize) -> bool),
            ("scale-100", scale),
        ] {
            for coalesce in [true, false] {
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
                        "{name} at {} nodes × {} Services: {} changes led to {} plan writes",
                        shape.nodes, shape.services, outcome.changes, outcome.writes
                    ));
                }
                println!(
                    "{:>6} {:>7} {:>10} {:>9} | {:>8} {:>8} {:>11.0} {:>12.1} {:>14.0} {:>9.0}s",
                    shape.nodes,
                    shape.services,
                    name,
                    if coalesce { "1s" } else { "off" },
                    outcome.changes,
                    outcome.writes,
                    outcome.writes as f64 / outcome.minutes,
                    outcome.bytes as f64 / outcome.minutes / 1_048_576.0,
                    outcome.bytes as f64 / outcome.changes.max(1) as f64,
                    outcome.lag.as_secs_f64()
                );
                if !smoke && (shape.nodes, shape.services) == (1_000, 10_000) && coalesce {
                    figure(
                        &format!(
                            "write fan-out at 1,000 × 10,000, {name}, coalesce 1s (writes/min; last node's lag)"
                        ),
                        &format!(
                            "{:.0} writes/min (budget {:.0}/min + burst), lag {:.0} s",
                            outcome.writes as f64 / outcome.minutes,
                            Config::default().write_qps * 60.0,
                            outcome.lag.as_secs_f64()
                        ),
                    );
                }
            }
        }
        println!(
            "peak RSS at {} nodes × {} Services (live controller + fake API server, highest of the four runs): {:.0} MiB",
            shape.nodes, shape.services, peak_rss
        );
        if !smoke && (shape.nodes, shape.services) == (1_000, 10_000) {
            figure(
                "controller memory at 1,000 × 10,000, live controller in the churn bench (incl. the fake API server)",
                &format!("{peak_rss:.0} MiB peak RSS"),
            );
        }
    }
    Ok(())
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
