//! Planner benchmark: full planning and one-endpoint re-planning on synthetic clusters.
//! Run with `make bench` (release build). Prints one table; numbers are recorded in docs/benchmarks.md.

use std::time::{Duration, Instant};

use switchyard_controller::{
    Config,
    output::objects,
    planner::Planner,
    synthetic::{Shape, cluster, service, service_key, slice},
};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Peak resident set of this process (VmHWM), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    // `cargo bench` passes `--bench`; a size can be chosen with SWITCHYARD_BENCH_SMOKE=1 for a quick run.
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then this runs as a quick
    // smoke check with tiny sizes (benchmarks are never timed tests).
    let smoke =
        std::env::var_os("SWITCHYARD_BENCH_SMOKE").is_some() || !std::env::args().any(|a| a == "--bench");
    let sizes: &[(usize, usize)] = if smoke {
        &[(10, 100)]
    } else {
        &[(100, 1_000), (1_000, 1_000), (100, 10_000), (1_000, 10_000)]
    };
    let config = Config::default();
    println!(
        "planner benchmark (5 endpoints per service, 3 zones, 10% eTP=Local, 5% iTP=Local, 20% zone-hinted; one core)"
    );
    println!(
        "{:>6} {:>7} | {:>12} {:>14} {:>14} {:>12} {:>7} {:>16} {:>12}",
        "nodes",
        "svcs",
        "full plan",
        "materialise",
        "re-plan 1 ep",
        "bytes/node",
        "shards",
        "nodes rewritten",
        "peak RSS"
    );
    for &(nodes, services) in sizes {
        let shape = Shape::new(nodes, services, 5);
        let snapshot = cluster(&shape);
        let runs = if nodes * services >= 10_000_000 { 3 } else { 5 };

        let mut full = Vec::new();
        let mut planner = None;
        for _ in 0..runs {
            let start = Instant::now();
            let Ok(built) = Planner::build(&snapshot, &config) else {
                eprintln!("planning failed");
                return;
            };
            full.push(start.elapsed());
            planner = Some(built);
        }
        let Some(mut planner) = planner else { return };

        let rss = peak_rss_mib();
        // Materialise every node's objects one node at a time, as the controller's writer does.
        let names: Vec<String> = planner.node_names().map(str::to_string).collect();
        let start = Instant::now();
        let mut bytes = 0;
        let mut shards = 0;
        for (i, name) in names.iter().enumerate() {
            let Some(plan) = planner.node_plan(name) else {
                continue;
            };
            if i == 0 {
                bytes = objects(&plan)
                    .iter()
                    .map(|o| serde_json::to_vec(o).map_or(0, |v| v.len()))
                    .sum();
                shards = plan.objects.len();
            }
        }
        let materialise = start.elapsed();

        let mut replan = Vec::new();
        let mut rewritten = 0;
        for generation in 1..=runs {
            let s = services / 2 + 11; // a plain ClusterIP service (not eTP/iTP/hinted)
            let svc = service(s, &shape);
            let sl = slice(s, &shape, generation);
            let start = Instant::now();
            let Ok((changed, _)) = planner.replan_service(&service_key(s), Some(&svc), &[&sl]) else {
                eprintln!("re-planning failed");
                return;
            };
            replan.push(start.elapsed());
            rewritten = changed.len();
        }
        println!(
            "{:>6} {:>7} | {:>12} {:>14} {:>14} {:>12} {:>7} {:>16} {:>8.0} MiB",
            nodes,
            services,
            ms(median(full)),
            ms(materialise),
            ms(median(replan)),
            bytes,
            shards,
            rewritten,
            rss
        );
    }
    println!(
        "peak RSS: this process after planning (the objects as the controller caches them, plus the planner)"
    );
}
