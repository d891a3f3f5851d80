//! Planner benchmark: full planning with every object materialised (ForwardingSlices and every node's
//! NodeForwardingPlan), one-endpoint re-planning with its changed objects, the largest object (also for a
//! node hosting endpoints of every Local-policy Service), the objects a fresh start writes; peak RSS.
//!
//! `cargo bench -p switchyard-controller --bench planner` (release build; `make bench` runs it with the
//! others). Prints one table and, at 1,000 nodes × 10,000 Services, one `target … met|MISSED` line per
//! target; numbers are recorded in docs/benchmarks.md. Under `cargo test` (or SWITCHYARD_BENCH_SMOKE=1)
//! it runs as a smoke check with tiny sizes and judges no target.

mod common;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use switchyard_controller::{
    Config,
    output::{plan_object, slice_object},
    planner::{Changes, Planner, Snapshot},
};
use switchyard_test_support::synthetic::{self, Shape, service, service_key, slice};

use common::{figure, median, ms, peak_rss_mib, secs, target};

/// The synthetic cluster of `shape` as the planner's input.
fn cluster(shape: &Shape) -> Snapshot {
    Snapshot::from(synthetic::cluster(shape).into_parts())
}

/// etcd's object limit is ~1.5 MiB; no object may exceed 1 MiB.
const MAX_OBJECT: usize = 1_048_576;
const FULL_TARGET: Duration = Duration::from_secs(2);
const REPLAN_TARGET: Duration = Duration::from_millis(10);
const CHANGE_BYTES_TARGET: usize = 64 * 1024;
const FRESH_START_TARGET: Duration = Duration::from_secs(60);

/// Endpoints per Service, cycled over the Services: every count from 3 to 10, mean exactly 5 (80 over 16).
const ENDPOINT_MIX: [usize; 16] = [3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5, 6, 7, 8, 9, 10];

/// The shape Service `s` is generated with: its own endpoint count (7 is coprime with 16, so the mix does
/// not line up with the synthetic Service kinds, which go by `s % 100`).
fn shape_of(s: usize, shape: &Shape) -> Shape {
    Shape {
        endpoints: ENDPOINT_MIX[(s * 7) % ENDPOINT_MIX.len()],
        ..*shape
    }
}

/// The synthetic cluster with 3–10 endpoints per Service.
fn snapshot(shape: &Shape) -> Snapshot {
    let mut snapshot = cluster(&Shape {
        endpoints: 0,
        ..*shape
    });
    snapshot.slices = (0..shape.services)
        .map(|s| slice(s, &shape_of(s, shape), 0))
        .collect();
    snapshot
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The largest serialised object seen: bytes and which.
#[derive(Default)]
struct Largest {
    bytes: usize,
    name: String,
}

impl Largest {
    fn see(&mut self, bytes: usize, name: &str) {
        if bytes > self.bytes {
            self.bytes = bytes;
            self.name = name.to_string();
        }
    }
}

struct Row {
    build: Duration,
    materialise: Duration,
    serialise: Duration,
    largest: Largest,
    slices: usize,
    plans: usize,
    overrides: usize,
    total_bytes: usize,
    replan: Duration,
    replan_materialised: Duration,
    change_objects: usize,
    change_bytes: usize,
    hinted_slices: usize,
    hinted_plans: usize,
    local_heavy: Largest,
    local_heavy_overflow: bool,
    rss_planned: f64,
    rss_materialised: f64,
}

/// Materialises (timed) and serialises (untimed) the objects a planning run changed, as the writer does.
fn write_changes(
    planner: &Planner,
    changes: &Changes,
    largest: &mut Largest,
) -> Result<(Duration, usize, usize), String> {
    let mut elapsed = Duration::ZERO;
    let (mut count, mut bytes) = (0, 0);
    for change in &changes.slices {
        let start = Instant::now();
        let object = slice_object(
            &change.name,
            planner
                .slice(&change.name)
                .ok_or_else(|| format!("slice {} vanished", change.name))?,
        );
        elapsed += start.elapsed();
        let size = serde_json::to_vec(&object).map_err(|e| e.to_string())?.len();
        largest.see(size, &change.name);
        count += 1;
        bytes += size;
    }
    for node in &changes.plans {
        let start = Instant::now();
        let uid = planner.node_info(node).and_then(|i| i.uid.clone());
        let object = plan_object(
            node,
            uid.as_deref(),
            planner
                .node_plan(node)
                .ok_or_else(|| format!("node {node} lost its plan"))?,
        );
        elapsed += start.elapsed();
        let size = serde_json::to_vec(&object).map_err(|e| e.to_string())?.len();
        largest.see(size, node);
        count += 1;
        bytes += size;
    }
    Ok((elapsed, count, bytes))
}

fn measure(nodes: usize, services: usize, config: &Config) -> Result<Row, String> {
    let shape = Shape::new(nodes, services, 5);
    let snapshot = snapshot(&shape);
    let runs = if nodes * services >= 10_000_000 { 3 } else { 5 };

    let mut builds = Vec::new();
    let mut planner = None;
    for _ in 0..runs {
        drop(planner.take());
        let start = Instant::now();
        let built = Planner::build(&snapshot, config).map_err(|e| format!("planning failed: {e}"))?;
        builds.push(start.elapsed());
        planner = Some(built);
    }
    let mut planner = planner.ok_or("no planning run")?;
    let rss_planned = peak_rss_mib();

    // A fresh start: every object, as the writer materialises them (timed) and serialises them
    // (untimed here, the write path's cost; it gives the largest object and the bytes written).
    let mut largest = Largest::default();
    let all = Changes {
        plans: planner.node_names().map(str::to_string).collect(),
        slices: planner
            .slice_names()
            .into_keys()
            .map(|name| switchyard_controller::planner::SliceChange { name, first: false })
            .collect(),
        ..Changes::default()
    };
    let start = Instant::now();
    let (materialise, count, total_bytes) = write_changes(&planner, &all, &mut largest)?;
    let serialise = start.elapsed().saturating_sub(materialise);
    let rss_materialised = peak_rss_mib();

    // One endpoint of one plain ClusterIP Service (bucket 50 of the synthetic mix: not eTP/iTP/hinted)
    // moves to a new pod on the same node: re-plan, then materialise the changed objects.
    let s = (0..services / 100)
        .map(|k| k * 100 + 50)
        .next_back()
        .unwrap_or_default();
    let svc_shape = shape_of(s, &shape);
    let svc = service(s, &svc_shape);
    let mut replans = Vec::new();
    let mut materialised = Vec::new();
    let (mut change_objects, mut change_bytes) = (0, 0);
    for generation in 1..=runs {
        let sl = slice(s, &svc_shape, generation);
        let start = Instant::now();
        let changes = planner
            .replan_service(&service_key(s), Some(&svc), &[&sl])
            .map_err(|e| format!("re-planning failed: {e}"))?;
        let replan = start.elapsed();
        let (elapsed, objects, bytes) = write_changes(&planner, &changes, &mut largest)?;
        replans.push(replan);
        materialised.push(replan + elapsed);
        change_objects = change_objects.max(objects);
        change_bytes = change_bytes.max(bytes);
    }

    // A zone-hinted Service (bucket 20 of the mix) changes one endpoint.
    let h = (0..services / 100)
        .map(|k| k * 100 + 20)
        .next_back()
        .unwrap_or_default();
    let hinted_shape = shape_of(h, &shape);
    let changes = planner
        .replan_service(
            &service_key(h),
            Some(&service(h, &hinted_shape)),
            &[&slice(h, &hinted_shape, 1)],
        )
        .map_err(|e| format!("re-planning failed: {e}"))?;
    let (hinted_slices, hinted_plans) = (changes.slices.len(), changes.plans.len());
    let overrides = planner.override_count();
    drop(planner);

    // The worst case for one plan: node-0000 hosts an endpoint of every Local-policy Service.
    let mut heavy = snapshot;
    for (i, s) in heavy.slices.iter_mut().enumerate() {
        if i % 100 < shape.etp_local_percent + shape.itp_local_percent
            && let Some(ep) = s.endpoints.as_mut().and_then(|e| e.first_mut())
        {
            ep.node_name = Some("node-0000".into());
            ep.zone = Some("zone-0".into());
        }
    }
    let planner = Planner::build(&heavy, config).map_err(|e| format!("planning failed: {e}"))?;
    let mut local_heavy = Largest::default();
    let every = Changes {
        plans: planner.node_names().map(str::to_string).collect(),
        slices: planner
            .slice_names()
            .into_keys()
            .map(|name| switchyard_controller::planner::SliceChange { name, first: false })
            .collect(),
        ..Changes::default()
    };
    write_changes(&planner, &every, &mut local_heavy)?;
    let local_heavy_overflow = planner.overflowing_nodes().any(|n| n == "node-0000");

    Ok(Row {
        build: median(builds),
        materialise,
        serialise,
        largest,
        slices: all.slices.len(),
        plans: all.plans.len(),
        overrides,
        total_bytes,
        replan: median(replans),
        replan_materialised: median(materialised),
        change_objects,
        change_bytes,
        hinted_slices,
        hinted_plans,
        local_heavy,
        local_heavy_overflow,
        rss_planned,
        rss_materialised,
    })
    .and_then(|row| {
        (count == row.slices + row.plans)
            .then_some(row)
            .ok_or_else(|| "materialised a different number of objects than planned".to_string())
    })
}

/// Set in the process that measures one size: `<nodes>x<services>`.
const SIZE_VAR: &str = "SWITCHYARD_BENCH_PLANNER_SIZE";

/// Every size runs in a fresh process (this binary again, with SIZE_VAR), so that its peak RSS is its own
/// and not the allocator's leftovers from a smaller size.
fn run() -> Result<(), String> {
    let smoke = common::smoke();
    let mut sizes: Vec<(usize, usize)> = if smoke {
        vec![(10, 100)]
    } else {
        vec![(100, 1_000), (1_000, 1_000), (100, 10_000), (1_000, 10_000)]
    };
    // SWITCHYARD_BENCH_SIZES=1000x10000,5000x10000 runs these sizes instead.
    if let Ok(list) = std::env::var("SWITCHYARD_BENCH_SIZES") {
        sizes = list
            .split(',')
            .filter_map(|size| {
                let (nodes, services) = size.trim().split_once('x')?;
                Some((nodes.parse().ok()?, services.parse().ok()?))
            })
            .collect();
    }
    println!(
        "planner benchmark (3–10 endpoints per Service, mean 5; 3 zones; 10% eTP=Local, 5% iTP=Local, 20% zone-hinted; one core)"
    );
    println!(
        "{:>5} {:>6} | {:>9} {:>11} {:>10} {:>9} | {:>6} {:>6} {:>9} {:>9} {:>9} | {:>8} {:>9} {:>5} {:>7} {:>7} | {:>9} {:>9}",
        "nodes",
        "svcs",
        "build",
        "materialise",
        "end-to-end",
        "serialise",
        "slices",
        "plans",
        "overrides",
        "all bytes",
        "largest",
        "re-plan",
        "+ objects",
        "objs",
        "bytes",
        "hinted",
        "RSS plan",
        "RSS mat."
    );
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut largest = Largest::default();
    let mut largest_at = (0, 0);
    let mut heavy = Largest::default();
    for &(nodes, services) in &sizes {
        let out = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(SIZE_VAR, format!("{nodes}x{services}"))
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        let mut seen = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((bytes, name)) = line.strip_prefix("largest|").and_then(|l| l.split_once('|')) {
                seen = bytes.parse::<usize>().ok().map(|b| (b, name.to_string()));
            } else if let Some((bytes, name)) = line.strip_prefix("heavy|").and_then(|l| l.split_once('|')) {
                if let Ok(bytes) = bytes.parse::<usize>() {
                    heavy.see(bytes, &format!("{name}, {nodes} × {services}"));
                }
            } else {
                println!("{line}");
            }
        }
        if !out.status.success() {
            return Err(format!("{nodes} nodes × {services} Services: {}", out.status));
        }
        let (bytes, name) =
            seen.ok_or_else(|| format!("{nodes} × {services}: no largest object reported"))?;
        if bytes > largest.bytes {
            largest = Largest { bytes, name };
            largest_at = (nodes, services);
        }
    }
    for line in [
        "build: Planner::build (median). materialise: every object (ForwardingSlices and every node's plan), as the",
        "writer does on a fresh start. end-to-end: build + materialise. serialise: JSON of every object (the write",
        "path's cost, not in end-to-end). slices / plans: objects a fresh start writes; overrides: entries over all",
        "plans; all bytes: their JSON. largest: the largest serialised object (bytes). re-plan: Planner::replan_service",
        "after one endpoint of a plain ClusterIP Service moved to a new pod (median); + objects: re-plan plus",
        "materialising the changed objects; objs / bytes: how many objects that change writes and their JSON size.",
        "hinted: slices (+ plans) one endpoint change of a zone-hinted Service writes. RSS: peak of a fresh process",
        "per size after planning and after materialising (synthetic objects, the planner, the objects).",
    ] {
        println!("{line}");
    }
    if smoke && largest.bytes.max(heavy.bytes) > MAX_OBJECT {
        return Err(format!(
            "object {} is {} bytes, over 1 MiB",
            largest.name, largest.bytes
        ));
    }
    if !smoke {
        target(
            "no object over 1 MiB (largest serialised slice or plan, every size)",
            &format!(
                "{} bytes ({}, {} nodes × {} Services)",
                thousands(largest.bytes),
                largest.name,
                thousands(largest_at.0),
                thousands(largest_at.1)
            ),
            "≤ 1,048,576 bytes",
            largest.bytes <= MAX_OBJECT,
        );
        target(
            "no object over 1 MiB when a node hosts an endpoint of every Local-policy Service",
            &format!("{} bytes ({})", thousands(heavy.bytes), heavy.name),
            "≤ 1,048,576 bytes",
            heavy.bytes <= MAX_OBJECT,
        );
    }
    Ok(())
}

/// Measures one size in this process: prints its row (and, at 1,000 × 10,000, the target lines) and a
/// `largest|<bytes>|<name>` line for the parent.
fn one_size(size: &str) -> Result<(), String> {
    let parse = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| format!("{SIZE_VAR}={size}: {e}"))
    };
    let (nodes, services) = size
        .split_once('x')
        .ok_or_else(|| format!("{SIZE_VAR}={size}: want <nodes>x<services>"))?;
    let (nodes, services) = (parse(nodes)?, parse(services)?);
    let config = Config::default();
    let row = measure(nodes, services, &config)?;
    println!(
        "{:>5} {:>6} | {:>9} {:>11} {:>10} {:>9} | {:>6} {:>6} {:>9} {:>9} {:>9} | {:>8} {:>9} {:>5} {:>7} {:>7} | {:>5.0} MiB {:>5.0} MiB",
        nodes,
        services,
        ms(row.build),
        ms(row.materialise),
        ms(row.build + row.materialise),
        ms(row.serialise),
        row.slices,
        row.plans,
        row.overrides,
        thousands(row.total_bytes),
        thousands(row.largest.bytes),
        ms(row.replan),
        ms(row.replan_materialised),
        row.change_objects,
        thousands(row.change_bytes),
        format!("{}+{}", row.hinted_slices, row.hinted_plans),
        row.rss_planned,
        row.rss_materialised
    );
    if !common::smoke() && (nodes, services) == (1_000, 10_000) {
        judge(&row, &config);
    }
    println!("largest|{}|{}", row.largest.bytes, row.largest.name);
    println!(
        "heavy|{}|{}{}",
        row.local_heavy.bytes,
        row.local_heavy.name,
        if row.local_heavy_overflow {
            ", overrides in its own view"
        } else {
            ""
        }
    );
    Ok(())
}

/// The targets at 1,000 nodes × 10,000 Services × 5 (mean) endpoints.
fn judge(row: &Row, config: &Config) {
    let end_to_end = row.build + row.materialise;
    target(
        "planner at 1,000 × 10,000, end to end (Planner::build + materialising every slice and plan)",
        &format!(
            "{} (build {}, materialise {})",
            secs(end_to_end),
            secs(row.build),
            secs(row.materialise)
        ),
        "≤ 2 s",
        end_to_end <= FULL_TARGET,
    );
    target(
        "one endpoint change at 1,000 × 10,000: re-plan + its changed objects",
        &format!(
            "{} (re-plan alone {})",
            ms(row.replan_materialised),
            ms(row.replan)
        ),
        "≤ 10 ms",
        row.replan_materialised <= REPLAN_TARGET,
    );
    target(
        "one endpoint change of a plain ClusterIP Service: objects written",
        &row.change_objects.to_string(),
        "≤ 2",
        row.change_objects <= 2,
    );
    target(
        "one endpoint change of a plain ClusterIP Service: bytes written",
        &format!("{} bytes", thousands(row.change_bytes)),
        "≤ 64 KiB",
        row.change_bytes <= CHANGE_BYTES_TARGET,
    );
    target(
        "one endpoint change of a zone-hinted Service: slices written (3 zones)",
        &format!("{} slices + {} plans", row.hinted_slices, row.hinted_plans),
        "≤ one per zone",
        row.hinted_slices <= 3,
    );
    // At the default write budget every object of a fresh start goes out at writeQPS after the burst.
    let objects = row.slices + row.plans;
    let fresh = Duration::from_secs_f64(
        objects.saturating_sub(config.write_burst as usize) as f64 / config.write_qps,
    );
    target(
        "fresh start at 1,000 × 10,000: every object written at the default write budget (objects / writeQPS)",
        &format!(
            "{} ({} slices + {} plans, {} bytes)",
            secs(fresh),
            row.slices,
            row.plans,
            thousands(row.total_bytes)
        ),
        "≤ 60 s",
        fresh <= FRESH_START_TARGET,
    );
    figure(
        "controller memory at 1,000 × 10,000 (planner bench: synthetic objects + planner + every object materialised; no kube-runtime caches)",
        &format!(
            "{:.0} MiB peak RSS after planning, {:.0} MiB after materialising",
            row.rss_planned, row.rss_materialised
        ),
    );
}

fn main() -> ExitCode {
    let result = match std::env::var(SIZE_VAR) {
        Ok(size) => one_size(&size),
        Err(_) => run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("planner benchmark failed: {error}");
            ExitCode::FAILURE
        }
    }
}
