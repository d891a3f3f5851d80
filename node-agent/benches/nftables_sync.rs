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
//! ```text
//! cargo bench -p switchyard-agent --bench nftables_sync                         # about a minute
//! SWITCHYARD_BENCH_SMOKE=1 cargo bench -p switchyard-agent --bench nftables_sync  # seconds
//! SWITCHYARD_BENCH_SIZES=1000,5000 cargo bench -p switchyard-agent --bench nftables_sync
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
    ENDPOINTS, ENTRIES_PER_SLICE, Netns, TARGET_SERVICES, applied, applied_partial, median, ms, report_rss,
    root_bench_main, sliced, spec, target,
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

/// Validate, render and write the transaction nowhere: the CPU part of a fresh full sync.
fn render_only(spec: &NodeForwardingPlanSpec) -> (Duration, usize) {
    let start = Instant::now();
    let skip: HashSet<usize> = switchyard_api::validate::validate(spec).bad_entries();
    let transaction = diff(None, &render(spec, &HostFacts::default(), IpFamily::IPv4, &skip));
    let mut bytes = Vec::new();
    let _ = transaction.write(&mut bytes);
    (start.elapsed(), bytes.len())
}

struct Row {
    services: u32,
    programmed: u64,
    bytes: usize,
    render: Duration,
    full: Duration,
    restart: Duration,
    drift_check: Duration,
    partial: Option<Duration>,
    /// The one-service partial sync through the slices path (compose + sync).
    partial_sliced: Option<Duration>,
}

fn measure(services: u32, partial_runs: usize) -> Result<Row, String> {
    let netns = Netns::new(&services.to_string())?;
    let spec = spec(services, Backend::Nftables);
    let (render, bytes) = render_only(&spec);
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
        services,
        programmed,
        bytes,
        render,
        full,
        restart,
        drift_check,
        partial: (!partial.is_empty()).then(|| median(partial)),
        partial_sliced: (!partial_sliced.is_empty()).then(|| median(partial_sliced)),
    })
}

fn run() -> Result<(), String> {
    let smoke = common::smoke();
    let mut sizes: Vec<u32> = if smoke {
        vec![20, 100]
    } else {
        vec![1_000, 5_000, 10_000]
    };
    if let Ok(list) = std::env::var("SWITCHYARD_BENCH_SIZES") {
        sizes = list.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    }
    let partial_runs = if smoke { 2 } else { 5 };
    let largest = sizes.iter().copied().max().unwrap_or_default();
    println!(
        "agent nftables benchmark: ClusterIP services × {ENDPOINTS} endpoints, fresh network namespaces"
    );
    println!(
        "{:>8} | {:>9} {:>10} | {:>15} {:>11} | {:>17} {:>11} | {:>23} {:>17}",
        "services",
        "rules+el.",
        "nft bytes",
        "validate+render",
        "full sync",
        "restart (no-op)",
        "drift check",
        "1-service partial (med)",
        "via slices (med)"
    );
    for &services in &sizes {
        let runs = if services == largest { partial_runs } else { 0 };
        let row = measure(services, runs)?;
        println!(
            "{:>8} | {:>9} {:>10} | {:>15} {:>11} | {:>17} {:>11} | {:>23} {:>17}",
            row.services,
            row.programmed,
            row.bytes,
            ms(row.render),
            ms(row.full),
            ms(row.restart),
            ms(row.drift_check),
            row.partial.map(ms).unwrap_or_else(|| "-".into()),
            row.partial_sliced.map(ms).unwrap_or_else(|| "-".into())
        );
        let _ = std::io::stdout().flush();
        if !smoke && services == TARGET_SERVICES {
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
    report_rss(largest, Backend::Nftables, smoke)
}

fn main() -> ExitCode {
    root_bench_main("nftables_sync", "agent nftables benchmark", run)
}
