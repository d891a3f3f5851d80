//! Agent iptables benchmark, against the real kernel in throwaway network namespaces (root).
//!
//! For 1,000 / 5,000 / 10,000 ClusterIP services × 5 endpoints, with iptables-nft and iptables-legacy:
//! a full sync (validate + render + `iptables-restore`, through the real [`Syncer`] and edge), then at
//! the largest size a one-service partial sync (one endpoint replaced; median of 5) and its floor (a bare
//! `iptables-restore --noflush` of that Service's chains alone, in the same namespace), drift checks
//! (the first reads whole tables with iptables-save; "steady" is the third, the kind later resync
//! periods settle on: top-level chains and jumps only with iptables-nft at scale), the rule and chain counts,
//! and the peak RSS of the real `switchyard-agent apply --plan` process at that size. Prints one table
//! and, at 10,000 Services (not in smoke mode), one `target … met|MISSED` line per target: partial sync
//! ≤ 50 ms (each iptables variant), peak RSS ≤ 30 MiB. A partial sync that the agent did not apply as a
//! partial one fails the benchmark.
//!
//! ```text
//! cargo bench -p switchyard-agent --bench iptables_sync         # minutes, most of it iptables-nft-restore
//! SWITCHYARD_BENCH_SMOKE=1 cargo bench -p switchyard-agent --bench iptables_sync   # seconds
//! SWITCHYARD_BENCH_SIZES=1000,5000 SWITCHYARD_BENCH_IPTABLES=nft cargo bench …     # a subset
//! SWITCHYARD_BENCH_SIZES=10000x15,50000x5 SWITCHYARD_BENCH_IPTABLES=nft cargo bench …  # the envelope
//! ```
//!
//! Beside the full sync, its floor: the agent's own full payload restored by the bare
//! `iptables-<variant>-restore --noflush` into a fresh namespace, and each as a ratio to its floor.
//! Sizes are `SERVICES` (× 5 endpoints) or `SERVICESxENDPOINTS`; with `SWITCHYARD_BENCH_SIZES` every
//! size gets its partial syncs, and `SWITCHYARD_BENCH_RSS_ALL=1` measures the peak RSS at every size.
//!
//! Syncs run on a thread that has entered the namespace (`setns`), so the iptables processes it starts
//! are in it too; the RSS run is `ip netns exec <ns> switchyard-agent apply`, its high-water mark read
//! from `/proc/<pid>/status` (VmHWM) while it runs.

mod common;

use std::collections::HashSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::dataplane::IptablesDataplane;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{SyncConfig, SyncMetrics, Syncer, SystemClock};
use switchyard_agent::xtables::exec::ExecIptables;
use switchyard_agent::xtables::mode::Variant;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use common::{
    ENDPOINTS, Netns, Size, TARGET_SERVICES, applied, applied_partial, bare_iptables_restore,
    iptables_full_payload, median, ms, ratio, report_rss_for, root_bench_main, sizes, spec_sized, target,
};

/// One-service partial sync target at [`TARGET_SERVICES`].
const PARTIAL_TARGET: Duration = Duration::from_millis(50);

fn syncer(variant: Variant) -> Result<Syncer, String> {
    let iptables = ExecIptables::with_variant(variant).map_err(|e| e.to_string())?;
    let features = HostFacts {
        random_fully: true,
        ..HostFacts::default()
    };
    let dataplane = IptablesDataplane::new(iptables, FixedAddrs::default(), features);
    Ok(Syncer::new(
        Box::new(dataplane),
        Arc::new(SystemClock),
        SyncConfig::default(),
        SyncMetrics::default(),
    ))
}

/// The full-sync payload restored by the bare `iptables-<variant>-restore --noflush` in one run, into
/// a fresh namespace: the floor of a full sync.
fn full_floor(variant: Variant, payload: Vec<u8>) -> Result<Duration, String> {
    let netns = Netns::new(&format!("{variant}-floor"))?;
    netns.within(move || {
        let text = String::from_utf8(payload).map_err(|e| e.to_string())?;
        bare_iptables_restore(variant, &text)
    })
}

struct Row {
    variant: Variant,
    size: Size,
    rules: u64,
    save_lines: usize,
    render: Duration,
    full: Duration,
    /// The same full payload restored by the bare tool into a fresh namespace.
    full_floor: Duration,
    partial: Option<Duration>,
    /// A bare `iptables-restore --noflush` of the smallest payload with a partial sync's effect (the
    /// changed Service's chains, flushed and rewritten), in the same namespace afterwards: the floor
    /// of a one-Service change, whatever the agent does around it.
    floor: Option<Duration>,
    /// Our chains in the nat table.
    nat_chains: usize,
    /// The first drift check (whole-table saves) and the third (the kind resync periods settle on).
    drift_check: (Duration, Duration),
}

fn measure(variant: Variant, size: Size, partial_runs: usize) -> Result<Row, String> {
    let netns = Netns::new(&format!("{variant}-{}x{}", size.services, size.endpoints))?;
    let spec = spec_sized(size, Backend::Iptables);
    let (render, payload) = iptables_full_payload(&spec);
    let full_floor = full_floor(variant, payload)?;
    let (full, rules, partial, drift_check, floor) = netns.within(move || {
        let mut syncer = syncer(variant)?;
        let (full, rules) = applied(syncer.sync_plan(&Arc::new(spec.clone())))?;
        let mut drift_checks = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            if let Some(result) = syncer.check_drift() {
                return Err(format!("unexpected drift: {result:?}"));
            }
            drift_checks.push(started.elapsed());
        }
        // The first reads whole tables; the next ones settle on the cheaper kind (top-level chains
        // only with iptables-nft at scale, whole tables with iptables-legacy): the third is what most
        // resync periods then run.
        let drift_check = (drift_checks[0], drift_checks[2]);
        let mut partial = Vec::new();
        let mut current = spec;
        for run in 0..partial_runs {
            // Replace one endpoint of one service (a rolling update's step).
            let index = current.services.len() / 2;
            std::sync::Arc::make_mut(&mut current.services[index]).endpoints[0].ip =
                format!("10.250.{}.{}", run / 250, run % 250 + 1);
            switchyard_api::testing::finish(&mut current);
            partial.push(applied_partial(syncer.sync_plan(&Arc::new(current.clone())))?);
        }
        let floor = if partial_runs == 0 {
            None
        } else {
            let index = current.services.len() / 2;
            let payload = service_payload(&current, index);
            let mut runs = Vec::new();
            for _ in 0..partial_runs {
                runs.push(bare_iptables_restore(variant, &payload)?);
            }
            Some(median(runs))
        };
        Ok((full, rules, partial, drift_check, floor))
    })?;
    let nat_chains = netns
        .exec(&format!(
            "iptables-{variant}-save -t nat | grep -c '^:SWYD-' || true"
        ))?
        .trim()
        .parse()
        .unwrap_or_default();
    let save_lines = netns
        .exec(&format!("iptables-{variant}-save -t nat | grep -c '^-A SWYD-'; iptables-{variant}-save -t filter | grep -c '^-A SWYD-' || true"))?
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .sum();
    Ok(Row {
        variant,
        size,
        rules,
        save_lines,
        render,
        full,
        full_floor,
        partial: (!partial.is_empty()).then(|| median(partial)),
        floor,
        nat_chains,
        drift_check,
    })
}

/// The nat chains of entry `index` as a restore payload that flushes and rewrites them: what a
/// partial sync of a one-endpoint change writes, less its bookkeeping.
fn service_payload(spec: &NodeForwardingPlanSpec, index: usize) -> String {
    let mut one = spec.clone();
    one.services = vec![Arc::clone(&spec.services[index])];
    let facts = HostFacts {
        random_fully: true,
        ..HostFacts::default()
    };
    let ruleset = switchyard_agent::iptables::render(&one, &facts, IpFamily::IPv4, &HashSet::new());
    let chains = ruleset.services().iter().flat_map(|group| &group.chains);
    let mut payload = String::from("*nat\n");
    for chain in chains.clone() {
        payload.push_str(&format!(":{} - [0:0]\n", chain.name));
    }
    for chain in chains {
        for rule in &chain.rules {
            payload.push_str(&format!("-A {} {rule}\n", chain.name));
        }
    }
    payload.push_str("COMMIT\n");
    payload
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
    let variants: Vec<Variant> = match std::env::var("SWITCHYARD_BENCH_IPTABLES").as_deref() {
        Ok("nft") => vec![Variant::Nft],
        Ok("legacy") => vec![Variant::Legacy],
        _ => vec![Variant::Nft, Variant::Legacy],
    };
    let partial_runs = if smoke { 2 } else { 5 };
    println!("agent iptables benchmark: ClusterIP services × endpoints, fresh network namespaces");
    println!(
        "{:>8} {:>10} | {:>8} {:>8} {:>10} | {:>16} {:>12} {:>12} {:>6} | {:>22} {:>12} {:>6} | {:>12} {:>12}",
        "iptables",
        "services×e",
        "rules",
        "in save",
        "nat chains",
        "validate+render",
        "full sync",
        "bare restore",
        "ratio",
        "1-service partial (med)",
        "bare floor",
        "ratio",
        "drift: whole",
        "steady"
    );
    for &variant in &variants {
        for &size in &sizes.list {
            let runs = sizes.partial_runs(size, partial_runs);
            let row = measure(variant, size, runs)?;
            println!(
                "{:>8} {:>10} | {:>8} {:>8} {:>10} | {:>16} {:>12} {:>12} {:>6} | {:>22} {:>12} {:>6} | {:>12} {:>12}",
                row.variant.to_string(),
                row.size.to_string(),
                row.rules,
                row.save_lines,
                row.nat_chains,
                ms(row.render),
                ms(row.full),
                ms(row.full_floor),
                ratio(row.full, row.full_floor),
                row.partial.map(ms).unwrap_or_else(|| "-".into()),
                row.floor.map(ms).unwrap_or_else(|| "-".into()),
                match (row.partial, row.floor) {
                    (Some(p), Some(f)) => ratio(p, f),
                    _ => "-".into(),
                },
                ms(row.drift_check.0),
                ms(row.drift_check.1)
            );
            let _ = std::io::stdout().flush();
            if let Some(partial) = row
                .partial
                .filter(|_| !smoke && size == Size::new(TARGET_SERVICES, ENDPOINTS))
            {
                target(
                    &format!("agent (iptables-{variant}) one-service partial sync at 10,000 Services"),
                    &ms(partial),
                    "≤ 50 ms",
                    partial <= PARTIAL_TARGET,
                );
            }
        }
    }
    report_rss_for(&sizes, Backend::Iptables, smoke)
}

fn main() -> ExitCode {
    root_bench_main("iptables_sync", "agent iptables benchmark", run)
}
