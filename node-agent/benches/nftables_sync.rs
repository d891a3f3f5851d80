//! Agent nftables benchmark, against the real kernel in throwaway network namespaces (root).
//!
//! For 1,000 / 5,000 / 10,000 ClusterIP services × 5 endpoints: a full sync in a fresh namespace
//! (validate + render + one `nft -f -`, through the real [`Syncer`] and edge), a restart's full sync
//! (a second agent reads the table back with `nft -j list table` and finds nothing to change), the
//! cheap drift check (netlink), and at the largest size a one-service partial sync (one endpoint
//! replaced; median of 5), both from a self-contained plan and as a live agent gets it: a plan with one
//! view whose slices (100 entries each) it composes before every sync, one slice replaced per change.
//! Then the peak RSS of the real `switchyard-agent apply --plan` process at that size, for both shapes. Prints one table and, at 10,000 Services (not in smoke mode), one `target … met|MISSED` line per
//! target: full sync ≤ 10 s, one-service partial sync ≤ 20 ms, peak RSS ≤ 30 MiB. A partial sync that
//! the agent did not apply as a partial one fails the benchmark.
//!
//! Beside each figure, the kernel's floor: the agent's own full-sync text loaded by the bare `nft -f`
//! in one transaction into a fresh namespace, and a one-endpoint change's own diff text loaded the same
//! way, with the agent's figure as a ratio to it. Sizes are `SERVICES` (× 5 endpoints) or
//! `SERVICESxENDPOINTS`; with `SWITCHYARD_BENCH_SIZES` every size gets its partial syncs, and
//! `SWITCHYARD_BENCH_RSS_ALL=1` measures the peak RSS at every size, not only the largest.
//!
//! ```text
//! cargo bench -p switchyard-agent --bench nftables_sync                         # about a minute
//! SWITCHYARD_BENCH_SMOKE=1 cargo bench -p switchyard-agent --bench nftables_sync  # seconds
//! SWITCHYARD_BENCH_SIZES=1000,5000 cargo bench -p switchyard-agent --bench nftables_sync
//! SWITCHYARD_BENCH_SIZES=10000x15,50000x5,100000x2,5000x50 SWITCHYARD_BENCH_RSS_ALL=1 \
//!   cargo bench -p switchyard-agent --bench nftables_sync                      # the envelope
//! ```
//!
//! Syncs run on a thread that has entered the namespace (`setns`), so the `nft` processes and netlink
//! sockets it opens are in it too; the RSS run is `ip netns exec <ns> switchyard-agent apply`, its
//! high-water mark read from `/proc/<pid>/status` (VmHWM) while it runs.

mod common;

use std::collections::HashSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_agent::backend::HostFacts;
use switchyard_agent::nftables::NftablesDataplane;
use switchyard_agent::nftables::diff::diff;
use switchyard_agent::nftables::exec::ExecNft;
use switchyard_agent::nftables::render;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, Syncer, SystemClock};
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use common::{
    ENDPOINTS, ENTRIES_PER_SLICE, Netns, Size, TARGET_SERVICES, applied, applied_partial, median, ms, ratio,
    report_rss_for, root_bench_main, sizes, sliced, spec_sized, target,
};

/// Targets at [`TARGET_SERVICES`]: full sync and one-service partial sync.
const FULL_TARGET: Duration = Duration::from_secs(10);
const PARTIAL_TARGET: Duration = Duration::from_millis(20);

fn syncer() -> Result<Syncer, String> {
    let nft = ExecNft::detect().map_err(|e| e.to_string())?;
    let dataplane = NftablesDataplane::new(nft, FixedAddrs::default());
    Ok(Syncer::new(
        Box::new(dataplane),
        Arc::new(SystemClock),
        SyncConfig::default(),
        SyncMetrics::default(),
    ))
}

/// Validate, render and write the transaction into memory: the CPU part of a fresh full sync. Returns
/// the text too (the floor loads it with the bare tool).
fn render_only(spec: &NodeForwardingPlanSpec) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let skip: HashSet<usize> = switchyard_api::validate::validate(spec).bad_entries();
    let desired = render(spec, &HostFacts::default(), IpFamily::IPv4, &skip);
    let transaction = diff(None, &desired);
    let mut bytes = Vec::new();
    let _ = transaction.write(&mut bytes);
    (start.elapsed(), bytes)
}

/// `nft -f FILE` of `text`, timed from spawn to exit (run inside a namespace).
fn bare_nft(dir: &std::path::Path, name: &str, text: &[u8]) -> Result<Duration, String> {
    let file = dir.join(name);
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let out = std::process::Command::new("nft")
        .arg("-f")
        .arg(&file)
        .output()
        .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    if !out.status.success() {
        return Err(format!("nft -f {name}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(elapsed)
}

/// The kernel's floor beside the agent's figures: the agent's own full-sync text loaded by the bare
/// tool in one transaction into a fresh namespace, then `runs` one-endpoint changes, each the agent's
/// own diff text, loaded the same way (median).
fn floors(
    spec: &NodeForwardingPlanSpec,
    text: Vec<u8>,
    runs: usize,
) -> Result<(Duration, Option<Duration>), String> {
    let netns = Netns::new("floor")?;
    let dir = switchyard_test_support::scratch::dir("bench-floor").map_err(|e| e.to_string())?;
    let spec = spec.clone();
    let work_dir = dir.path().to_path_buf();
    let result = netns.within(move || {
        let full = bare_nft(&work_dir, "full.nft", &text)?;
        drop(text);
        let facts = HostFacts::default();
        let skip = HashSet::new();
        let mut current = spec;
        let mut before = render(&current, &facts, IpFamily::IPv4, &skip);
        let mut changes = Vec::new();
        for run in 0..runs {
            let index = current.services.len() / 2;
            Arc::make_mut(&mut current.services[index]).endpoints[0].ip =
                format!("10.252.{}.{}", run / 250, run % 250 + 1);
            switchyard_api::testing::finish(&mut current);
            let after = render(&current, &facts, IpFamily::IPv4, &skip);
            let mut change = Vec::new();
            diff(Some(&before), &after)
                .write(&mut change)
                .map_err(|e| e.to_string())?;
            changes.push(bare_nft(&work_dir, "change.nft", &change)?);
            before = after;
        }
        Ok((full, (!changes.is_empty()).then(|| median(changes))))
    });
    drop(dir);
    result
}

struct Row {
    size: Size,
    programmed: u64,
    bytes: usize,
    render: Duration,
    full: Duration,
    restart: Duration,
    drift_check: Duration,
    partial: Option<Duration>,
    /// The one-service partial sync through the slices path (compose + sync).
    partial_sliced: Option<Duration>,
    /// The same full-sync text loaded by the bare `nft -f` in one transaction.
    floor_full: Duration,
    /// A one-endpoint change's diff text loaded by the bare `nft -f` (median).
    floor_change: Option<Duration>,
}

fn measure(size: Size, partial_runs: usize) -> Result<Row, String> {
    let netns = Netns::new(&format!("{}x{}", size.services, size.endpoints))?;
    let spec = spec_sized(size, Backend::Nftables);
    let (render, text) = render_only(&spec);
    let bytes = text.len();
    let (floor_full, floor_change) = floors(&spec, text, partial_runs.max(1))?;
    let (full, programmed, restart, drift_check, partial, partial_sliced) = netns.within(move || {
        let mut first = syncer()?;
        let (full, programmed) = applied(first.sync_plan(&Arc::new(spec.clone())))?;
        // A restarted agent: reads the table back, diffs, finds nothing to do.
        let mut restarted = syncer()?;
        let (restart, _) = applied(restarted.sync_plan(&Arc::new(spec.clone())))?;
        let started = Instant::now();
        if let Some(result) = restarted.check_drift() {
            return Err(format!("unexpected drift: {result:?}"));
        }
        let drift_check = started.elapsed();
        let mut partial = Vec::new();
        let mut current = spec;
        for run in 0..partial_runs {
            // Replace one endpoint of one service (a rolling update's step).
            let index = current.services.len() / 2;
            std::sync::Arc::make_mut(&mut current.services[index]).endpoints[0].ip =
                format!("10.250.{}.{}", run / 250, run % 250 + 1);
            switchyard_api::testing::finish(&mut current);
            partial.push(applied_partial(restarted.sync_plan(&Arc::new(current.clone())))?);
        }
        // The live agent's path: the same entries as a plan with one view and its slices, composed
        // before every sync; a change replaces one slice (its revision changes).
        let mut partial_sliced = Vec::new();
        if partial_runs > 0 {
            let (live, mut slices) = sliced(&current);
            let live = Arc::new(live);
            drop(current);
            let mut agent = syncer()?;
            applied(agent.sync(&live, &slices))?;
            for run in 0..partial_runs {
                let index = slices.len() / 2;
                let mut changed = (*slices[index].1).clone();
                std::sync::Arc::make_mut(&mut changed.entries[ENTRIES_PER_SLICE / 2]).endpoints[0].ip =
                    format!("10.251.{}.{}", run / 250, run % 250 + 1);
                changed.revision =
                    switchyard_api::revision::compute_slice(&changed).map_err(|e| e.to_string())?;
                slices[index].1 = Arc::new(changed);
                let started = Instant::now();
                applied_partial(agent.sync(&live, &slices))?;
                partial_sliced.push(started.elapsed());
            }
        }
        Ok((full, programmed, restart, drift_check, partial, partial_sliced))
    })?;
    Ok(Row {
        size,
        programmed,
        bytes,
        render,
        full,
        restart,
        drift_check,
        partial: (!partial.is_empty()).then(|| median(partial)),
        partial_sliced: (!partial_sliced.is_empty()).then(|| median(partial_sliced)),
        floor_full,
        floor_change,
    })
}

fn run() -> Result<(), String> {
    let smoke = common::smoke();
    let default = if smoke {
        vec![Size::new(20, ENDPOINTS), Size::new(100, ENDPOINTS)]
    } else {
        vec![
            Size::new(1_000, ENDPOINTS),
            Size::new(5_000, ENDPOINTS),
            Size::new(10_000, ENDPOINTS),
        ]
    };
    let sizes = sizes(default);
    let partial_runs = if smoke { 2 } else { 5 };
    let judged = Size::new(TARGET_SERVICES, ENDPOINTS);
    println!("agent nftables benchmark: ClusterIP services × endpoints, fresh network namespaces");
    println!(
        "{:>10} | {:>9} {:>10} | {:>15} {:>11} {:>11} {:>6} | {:>17} {:>11} | {:>23} {:>17} {:>12} {:>6}",
        "services×e",
        "rules+el.",
        "nft bytes",
        "validate+render",
        "full sync",
        "nft -f",
        "ratio",
        "restart (no-op)",
        "drift check",
        "1-service partial (med)",
        "via slices (med)",
        "change nft",
        "ratio"
    );
    for &size in &sizes.list {
        let runs = sizes.partial_runs(size, partial_runs);
        let row = measure(size, runs)?;
        println!(
            "{:>10} | {:>9} {:>10} | {:>15} {:>11} {:>11} {:>6} | {:>17} {:>11} | {:>23} {:>17} {:>12} {:>6}",
            row.size.to_string(),
            row.programmed,
            row.bytes,
            ms(row.render),
            ms(row.full),
            ms(row.floor_full),
            ratio(row.full, row.floor_full),
            ms(row.restart),
            ms(row.drift_check),
            row.partial.map(ms).unwrap_or_else(|| "-".into()),
            row.partial_sliced.map(ms).unwrap_or_else(|| "-".into()),
            row.floor_change.map(ms).unwrap_or_else(|| "-".into()),
            match (row.partial, row.floor_change) {
                (Some(p), Some(f)) => ratio(p, f),
                _ => "-".into(),
            }
        );
        let _ = std::io::stdout().flush();
        if !smoke && size == judged {
            target(
                "agent (nftables) full sync at 10,000 Services",
                &ms(row.full),
                "≤ 10 s",
                row.full <= FULL_TARGET,
            );
            if let Some(partial) = row.partial {
                target(
                    "agent (nftables) one-service partial sync at 10,000 Services",
                    &ms(partial),
                    "≤ 20 ms",
                    partial <= PARTIAL_TARGET,
                );
            }
            if let Some(partial) = row.partial_sliced {
                target(
                    "agent (nftables) one-service partial sync at 10,000 Services, composed from slices",
                    &ms(partial),
                    "≤ 20 ms",
                    partial <= PARTIAL_TARGET,
                );
            }
        }
    }
    report_rss_for(&sizes, Backend::Nftables, smoke)
}

fn main() -> ExitCode {
    root_bench_main("nftables_sync", "agent nftables benchmark", run)
}
