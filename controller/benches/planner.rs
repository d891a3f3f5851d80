//! Planner benchmark: full planning, materialising every node's plan objects, and one-endpoint
//! re-planning on synthetic clusters; the largest plan object over every node; peak RSS.
//!
//! `cargo bench -p switchyard-controller --bench planner` (release build; `make bench` runs it with the
//! others). Prints one table and, at 1,000 nodes × 10,000 Services, one `target … met|MISSED` line per
//! target; numbers are recorded in docs/benchmarks.md. Under `cargo test` (or SWITCHYARD_BENCH_SMOKE=1)
//! it runs as a smoke check with tiny sizes and judges no target.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use switchyard_controller::{
    Config,
    output::object,
    planner::{Planner, Snapshot},
    synthetic::{Shape, cluster, service, service_key, slice},
};

use common::{figure, median, ms, peak_rss_mib, secs, target};

/// etcd's object limit is ~1.5 MiB; the planner's budget per plan object is 1 MiB.
const MAX_OBJECT: usize = 1_048_576;
const FULL_TARGET: Duration = Duration::from_secs(5);
const REPLAN_TARGET: Duration = Duration::from_millis(50);

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

/// The largest serialised plan object seen: bytes and which.
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
    objects_per_node: usize,
    replan: Duration,
    replan_materialised: Duration,
    nodes_rewritten: usize,
    objects_rewritten: usize,
    rss_planned: f64,
    rss_materialised: f64,
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

    // Materialise every node's objects one node at a time, as the controller's writer does, and
    // serialise each (untimed here, the write path's cost) to find the largest.
    let names: Vec<String> = planner.node_names().map(str::to_string).collect();
    let mut materialise = Duration::ZERO;
    let mut serialise = Duration::ZERO;
    let mut largest = Largest::default();
    let mut objects_per_node = 0;
    // Services of the first node's secondary shards (empty when its plan is one object).
    let mut in_secondary: HashSet<String> = HashSet::new();
    for name in &names {
        let start = Instant::now();
        let plan = planner
            .node_plan(name)
            .ok_or_else(|| format!("node {name} has no plan"))?;
        // By value, as the writer does (`output::objects` would clone every spec).
        let count = plan.objects.len() as u32;
        let uid = plan.node_uid.as_deref();
        let built: Vec<_> = (0..count)
            .zip(plan.objects)
            .map(|(index, spec)| object(&plan.node, uid, index, count, spec))
            .collect();
        materialise += start.elapsed();
        objects_per_node = objects_per_node.max(built.len());
        if in_secondary.is_empty() {
            in_secondary = built
                .iter()
                .skip(1)
                .flat_map(|o| o.spec.services.iter().map(|e| e.service_key().to_string()))
                .collect();
        }
        let start = Instant::now();
        for o in &built {
            let bytes = serde_json::to_vec(o).map_err(|e| e.to_string())?.len();
            largest.see(bytes, o.metadata.name.as_deref().unwrap_or(name));
        }
        serialise += start.elapsed();
    }
    let rss_materialised = peak_rss_mib();

    // One endpoint of one plain ClusterIP Service (bucket 50 of the synthetic mix: not eTP/iTP/hinted)
    // moves to a new pod; re-plan, then materialise only the changed shards of the changed nodes, as
    // the writer does (it compares shard revisions with what it wrote). Where plans are sharded, the
    // Service is one in a secondary shard, like most: a change rewrites that shard and the primary
    // (which lists the shards' revisions).
    let plain = (0..services / 100).map(|k| k * 100 + 50);
    let s = plain
        .clone()
        .find(|&s| in_secondary.contains(&service_key(s)))
        .or_else(|| plain.clone().next_back())
        .unwrap_or_default();
    let svc_shape = shape_of(s, &shape);
    let svc = service(s, &svc_shape);
    let mut replans = Vec::new();
    let mut materialised = Vec::new();
    let mut nodes_rewritten = 0;
    let mut objects_rewritten = 0;
    for generation in 1..=runs {
        let before: BTreeMap<String, Vec<String>> = names
            .iter()
            .filter_map(|n| planner.shard_revisions(n).map(|r| (n.clone(), r.to_vec())))
            .collect();
        let sl = slice(s, &svc_shape, generation);
        let start = Instant::now();
        let (changed, _) = planner
            .replan_service(&service_key(s), Some(&svc), &[&sl])
            .map_err(|e| format!("re-planning failed: {e}"))?;
        let replan = start.elapsed();
        // Node by node, as the writer does: materialise the stale objects (timed), then serialise them
        // (untimed, for the largest object) and let them go.
        let mut elapsed = replan;
        let mut count = 0;
        for node in &changed {
            let start = Instant::now();
            let revisions = planner
                .shard_revisions(node)
                .ok_or_else(|| format!("node {node} lost its plan"))?;
            let old = before.get(node).map_or(&[][..], Vec::as_slice);
            let stale: BTreeSet<u32> = (0..revisions.len())
                .filter(|&i| old.len() != revisions.len() || old.get(i) != revisions.get(i))
                .map(|i| i as u32)
                .collect();
            let total = revisions.len() as u32;
            let uid = planner.node_info(node).and_then(|i| i.uid.clone());
            let shards = planner
                .node_shards(node, &stale)
                .ok_or_else(|| format!("node {node} has no shards"))?;
            let rewritten: Vec<_> = shards
                .into_iter()
                .map(|(index, spec)| object(node, uid.as_deref(), index, total, spec))
                .collect();
            elapsed += start.elapsed();
            count += rewritten.len();
            for o in &rewritten {
                let bytes = serde_json::to_vec(o).map_err(|e| e.to_string())?.len();
                largest.see(bytes, o.metadata.name.as_deref().unwrap_or_default());
            }
        }
        replans.push(replan);
        materialised.push(elapsed);
        nodes_rewritten = changed.len();
        objects_rewritten = count;
    }
    Ok(Row {
        build: median(builds),
        materialise,
        serialise,
        largest,
        objects_per_node,
        replan: median(replans),
        replan_materialised: median(materialised),
        nodes_rewritten,
        objects_rewritten,
        rss_planned,
        rss_materialised,
    })
}

/// Set in the process that measures one size: `<nodes>x<services>`.
const SIZE_VAR: &str = "SWITCHYARD_BENCH_PLANNER_SIZE";

/// Every size runs in a fresh process (this binary again, with SIZE_VAR), so that its peak RSS is its own
/// and not the allocator's leftovers from a smaller size.
fn run() -> Result<(), String> {
    let smoke = common::smoke();
    let sizes: &[(usize, usize)] = if smoke {
        &[(10, 100)]
    } else {
        &[(100, 1_000), (1_000, 1_000), (100, 10_000), (1_000, 10_000)]
    };
    println!(
        "planner benchmark (3–10 endpoints per Service, mean 5; 3 zones; 10% eTP=Local, 5% iTP=Local, 20% zone-hinted; one core)"
    );
    println!(
        "{:>5} {:>6} | {:>10} {:>12} {:>10} {:>11} | {:>11} {:>7} | {:>9} {:>12} {:>9} {:>8} | {:>11} {:>12}",
        "nodes",
        "svcs",
        "build",
        "materialise",
        "end-to-end",
        "serialise",
        "largest obj",
        "obj/node",
        "re-plan",
        "+ shards",
        "nodes rw",
        "objs rw",
        "RSS planned",
        "RSS material."
    );
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut largest = Largest::default();
    let mut largest_at = (0, 0);
    for &(nodes, services) in sizes {
        let out = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(SIZE_VAR, format!("{nodes}x{services}"))
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        let mut seen = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match line.strip_prefix("largest|").and_then(|l| l.split_once('|')) {
                Some((bytes, name)) => seen = bytes.parse::<usize>().ok().map(|b| (b, name.to_string())),
                None => println!("{line}"),
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
        "build: Planner::build (median). materialise: every node's plan objects, one node at a time, as the writer",
        "does. end-to-end: build + materialise. serialise: JSON of every object (the write path's cost, not in",
        "end-to-end). largest obj: the largest serialised plan object over all nodes, primaries and shards (bytes).",
        "re-plan: Planner::replan_service after one endpoint moved (median); + shards: re-plan plus materialising the",
        "changed shards of every rewritten node. RSS: peak of a fresh process per size after planning and after",
        "materialising (the synthetic Services, EndpointSlices and Nodes, the planner, one node's objects at a time).",
    ] {
        println!("{line}");
    }
    if smoke && largest.bytes > MAX_OBJECT {
        return Err(format!(
            "plan object {} is {} bytes, over the 1 MiB budget",
            largest.name, largest.bytes
        ));
    }
    if !smoke {
        target(
            "no plan object over 1 MiB (largest serialised object, every node and shard, every size)",
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
    let row = measure(nodes, services, &Config::default())?;
    println!(
        "{:>5} {:>6} | {:>10} {:>12} {:>10} {:>11} | {:>11} {:>7} | {:>9} {:>12} {:>9} {:>8} | {:>7.0} MiB {:>8.0} MiB",
        nodes,
        services,
        ms(row.build),
        ms(row.materialise),
        ms(row.build + row.materialise),
        ms(row.serialise),
        row.largest.bytes,
        row.objects_per_node,
        ms(row.replan),
        ms(row.replan_materialised),
        row.nodes_rewritten,
        row.objects_rewritten,
        row.rss_planned,
        row.rss_materialised
    );
    if !common::smoke() && (nodes, services) == (1_000, 10_000) {
        judge(&row);
    }
    println!("largest|{}|{}", row.largest.bytes, row.largest.name);
    Ok(())
}

/// The targets at 1,000 nodes × 10,000 Services × 5 (mean) endpoints.
fn judge(row: &Row) {
    let end_to_end = row.build + row.materialise;
    println!(
        "full planning at 1,000 × 10,000: the ≤ 5 s target is judged end to end (Planner::build {}, plus \
         materialising every node's objects {}); the one-endpoint ≤ 50 ms target likewise on re-plan plus \
         materialising the changed shards (Planner::replan_service alone: {})",
        secs(row.build),
        secs(row.materialise),
        ms(row.replan)
    );
    target(
        "planner full plan at 1,000 × 10,000, end to end (Planner::build + materialising every node's objects)",
        &secs(end_to_end),
        "≤ 5 s",
        end_to_end <= FULL_TARGET,
    );
    target(
        "planner full plan at 1,000 × 10,000, Planner::build alone (not the judged number)",
        &secs(row.build),
        "≤ 5 s",
        row.build <= FULL_TARGET,
    );
    target(
        "one-endpoint re-plan at 1,000 × 10,000, end to end (re-plan + materialising the changed shards)",
        &format!(
            "{} ({} objects on {} nodes)",
            ms(row.replan_materialised),
            thousands(row.objects_rewritten),
            thousands(row.nodes_rewritten)
        ),
        "≤ 50 ms",
        row.replan_materialised <= REPLAN_TARGET,
    );
    target(
        "one-endpoint re-plan at 1,000 × 10,000, Planner::replan_service alone (not the judged number)",
        &ms(row.replan),
        "≤ 50 ms",
        row.replan <= REPLAN_TARGET,
    );
    figure(
        "controller memory at 1,000 × 10,000 (planner bench: objects + planner + one node's plan; no kube-runtime caches)",
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
