//! Shared scaffolding of the agent benchmarks (`iptables_sync`, `nftables_sync`): the synthetic plan,
//! throwaway network namespaces, the smoke-mode rule, the peak-RSS run of the real binary, and the target
//! lines `make bench` collects into its summary table.
// Each benchmark uses only part of this module.
#![allow(dead_code)]

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::iptables::stream::{PayloadJob, StreamMode};
use switchyard_agent::sync::{SliceObject, SyncResult};
use switchyard_agent::xtables::mode::Variant;
use switchyard_api::testing::{EntryExt, entry, ep, finish, live_plan, plan, slice};
use switchyard_api::{
    Backend, ForwardingSlice, IpFamily, NodeForwardingPlan, NodeForwardingPlanSpec, SyncMode,
};

/// Endpoints per Service.
pub const ENDPOINTS: u32 = 5;

/// `n` ClusterIP services with 5 endpoints each, every address distinct, for `backend`.
pub fn spec(n: u32, backend: Backend) -> NodeForwardingPlanSpec {
    spec_sized(Size::new(n, ENDPOINTS), backend)
}

/// A benchmark size: Services × endpoints per Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    /// ClusterIP Services.
    pub services: u32,
    /// Endpoints of each.
    pub endpoints: u32,
}

impl Size {
    pub const fn new(services: u32, endpoints: u32) -> Self {
        Self { services, endpoints }
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}", self.services, self.endpoints)
    }
}

/// The sizes a run measures.
pub struct Sizes {
    /// In order.
    pub list: Vec<Size>,
    /// Given by `SWITCHYARD_BENCH_SIZES` (the envelope runs): every size then gets its partial syncs,
    /// not only the largest.
    pub given: bool,
}

impl Sizes {
    /// The largest (the one the partial syncs and the RSS run are for by default).
    pub fn largest(&self) -> Size {
        self.list.iter().copied().max().unwrap_or(Size::new(0, ENDPOINTS))
    }

    /// Partial-sync runs at `size`.
    pub fn partial_runs(&self, size: Size, runs: usize) -> usize {
        if self.given || size == self.largest() {
            runs
        } else {
            0
        }
    }
}

/// `SWITCHYARD_BENCH_SIZES` as `SERVICES` (× [`ENDPOINTS`]) or `SERVICESxENDPOINTS`, comma-separated;
/// `default` without it.
pub fn sizes(default: Vec<Size>) -> Sizes {
    let Ok(list) = std::env::var("SWITCHYARD_BENCH_SIZES") else {
        return Sizes {
            list: default,
            given: false,
        };
    };
    let list = list
        .split(',')
        .filter_map(|item| {
            let item = item.trim();
            match item.split_once('x') {
                Some((s, e)) => Some(Size::new(s.parse().ok()?, e.parse().ok()?)),
                None => Some(Size::new(item.parse().ok()?, ENDPOINTS)),
            }
        })
        .collect();
    Sizes { list, given: true }
}

/// `a` as a multiple of `b` (a figure against its floor), two decimals.
pub fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64().max(1e-9))
}

/// `size.services` ClusterIP services with `size.endpoints` endpoints each, every address distinct,
/// for `backend`. ClusterIPs past 62,500 come from a second /16 (several ServiceCIDRs, as a cluster of
/// that size has them).
pub fn spec_sized(size: Size, backend: Backend) -> NodeForwardingPlanSpec {
    let services = (0..size.services)
        .map(|i| {
            let mut e = entry(
                &format!("ns{}/svc{i}:http", i / 100),
                &format!("10.{}.{}.{}", 96 + i / 62_500, (i / 250) % 250, i % 250 + 1),
                80,
            );
            for j in 0..size.endpoints {
                let k = i * size.endpoints + j;
                e = e.with(ep(
                    &format!("10.{}.{}.{}", 100 + k / 62_500, (k / 250) % 250, k % 250 + 1),
                    8080,
                ));
            }
            e
        })
        .collect();
    let mut spec = plan("node-a", services);
    spec.backend = backend;
    finish(&mut spec);
    spec
}

/// Entries per ForwardingSlice in [`sliced`]: about what the controller's 48 KiB slices hold.
pub const ENTRIES_PER_SLICE: usize = 100;

/// The same entries as the controller delivers them to a live agent: a plan with one view (`all`) and
/// that view's slices of [`ENTRIES_PER_SLICE`] entries each.
pub fn sliced(spec: &NodeForwardingPlanSpec) -> (NodeForwardingPlanSpec, Vec<SliceObject>) {
    let mut live = live_plan(&spec.node_name, &["all"], vec![]);
    live.backend = spec.backend;
    finish(&mut live);
    let chunks: Vec<&[Arc<switchyard_api::ServicePlan>]> = spec.services.chunks(ENTRIES_PER_SLICE).collect();
    let count = chunks.len().max(1) as u32;
    let mut slices: Vec<SliceObject> = chunks
        .iter()
        .enumerate()
        .map(|(i, entries)| {
            let entries = entries
                .iter()
                .map(|e| switchyard_api::ServicePlan::clone(e))
                .collect();
            let (name, spec) = slice("all", i as u32, count, entries);
            (name, Arc::new(spec))
        })
        .collect();
    if slices.is_empty() {
        let (name, spec) = slice("all", 0, 1, vec![]);
        slices.push((name, Arc::new(spec)));
    }
    (live, slices)
}

/// `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then a benchmark runs as a
/// quick smoke check with tiny sizes (benchmarks are never timed tests).
pub fn smoke() -> bool {
    std::env::var_os("SWITCHYARD_BENCH_SMOKE").is_some() || !std::env::args().any(|a| a == "--bench")
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// A named network namespace, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    pub fn new(tag: &str) -> Result<Self, String> {
        let name = format!("swyd-bench-{}-{tag}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map_err(|e| e.to_string())?
            .success();
        if !ok {
            return Err(format!("ip netns add {name} failed"));
        }
        Ok(Self(name))
    }

    /// Runs a shell script inside the namespace and returns its stdout.
    pub fn exec(&self, script: &str) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", script])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("{script}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `work` on a thread inside the namespace.
    pub fn within<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns: {e}"))?;
            work()
        })
        .join()
        .map_err(|_| "the benchmark thread panicked".to_string())?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Duration and rule count of an applied sync.
pub fn applied(result: SyncResult) -> Result<(Duration, u64), String> {
    match result {
        SyncResult::Applied { duration, rules, .. } => Ok((duration, rules)),
        other => Err(format!("sync did not apply: {other:?}")),
    }
}

/// Duration of an applied sync that must have been partial (a full one would measure something else).
pub fn applied_partial(result: SyncResult) -> Result<Duration, String> {
    match result {
        SyncResult::Applied {
            mode: SyncMode::Partial,
            duration,
            ..
        } => Ok(duration),
        SyncResult::Applied { mode, .. } => Err(format!(
            "a one-service change was applied as a {mode:?} sync, not a partial one"
        )),
        other => Err(format!("sync did not apply: {other:?}")),
    }
}

#[path = "../../../benches/summary.rs"]
mod summary;
#[allow(unused_imports)] // each bench uses its own subset
pub use summary::{record, target};

/// Peak RSS (VmHWM, KiB) and wall time of `switchyard-agent apply --plan` in a fresh namespace: the
/// plan self-contained, or (`sliced`) a live plan with its view's slices, which the agent composes.
pub fn apply_rss(
    agent: &Path,
    size: Size,
    backend: Backend,
    sliced_plan: bool,
) -> Result<(u64, Duration), String> {
    let netns = Netns::new(&format!("rss-{}-{}-{sliced_plan}", size.services, size.endpoints))?;
    // The generated plan (up to 100,000 Services: hundreds of MB) goes with `dir`, also on an error.
    let dir = switchyard_test_support::scratch::dir("bench-rss").map_err(|e| e.to_string())?;
    let file: PathBuf = dir.path().join("plan.json");
    let spec = spec_sized(size, backend);
    let body = if sliced_plan {
        let (live, slices) = sliced(&spec);
        drop(spec);
        let mut items: Vec<serde_json::Value> = slices
            .into_iter()
            .map(|(name, s)| serde_json::to_value(ForwardingSlice::new(&name, (*s).clone())))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        items.push(
            serde_json::to_value(NodeForwardingPlan::new(&live.node_name.clone(), live))
                .map_err(|e| e.to_string())?,
        );
        serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
    } else {
        serde_json::to_vec(&NodeForwardingPlan::new(&spec.node_name.clone(), spec))
    };
    std::fs::write(&file, body.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &netns.0])
        .arg(agent)
        .args(["apply", "--plan"])
        .arg(&file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_path)
            && let Some(kib) = text
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    drop(dir);
    if !status.success() {
        return Err(format!("switchyard-agent apply exited with {status}"));
    }
    Ok((peak, elapsed))
}

/// Services at which the targets are judged.
pub const TARGET_SERVICES: u32 = 10_000;
/// Agent peak RSS target at [`TARGET_SERVICES`].
pub const RSS_TARGET_MIB: f64 = 30.0;

/// [`report_rss_sized`] at the largest size, or at every size with `SWITCHYARD_BENCH_RSS_ALL=1`.
pub fn report_rss_for(sizes: &Sizes, backend: Backend, smoke: bool) -> Result<(), String> {
    let all = std::env::var_os("SWITCHYARD_BENCH_RSS_ALL").is_some();
    for &size in sizes.list.iter().filter(|&&s| all || s == sizes.largest()) {
        report_rss_sized(size, backend, smoke)?;
    }
    Ok(())
}

/// Measures and prints the peak RSS of the real binary applying a `size` plan for `backend`, and judges
/// the RSS target at [`TARGET_SERVICES`] × [`ENDPOINTS`].
pub fn report_rss_sized(size: Size, backend: Backend, smoke: bool) -> Result<(), String> {
    let agent = Path::new(env!("CARGO_BIN_EXE_switchyard-agent"));
    for sliced_plan in [false, true] {
        let (kib, wall) = apply_rss(agent, size, backend, sliced_plan)?;
        let mib = kib as f64 / 1024.0;
        let shape = if sliced_plan {
            "a live plan and its view's slices, composed"
        } else {
            "one self-contained plan"
        };
        println!(
            "peak RSS of `switchyard-agent apply --plan` ({size} services × endpoints, backend {backend}, {shape}, JSON, fresh namespace): {mib:.1} MiB (VmHWM), {:.1} s",
            wall.as_secs_f64()
        );
        if !smoke && size == Size::new(TARGET_SERVICES, ENDPOINTS) {
            let what = if sliced_plan { ", composed from slices" } else { "" };
            target(
                &format!("agent ({backend}) peak RSS at 10,000 Services{what}"),
                &format!("{mib:.1} MiB"),
                "≤ 30 MiB",
                mib <= RSS_TARGET_MIB,
            );
        }
    }
    Ok(())
}

/// A root-only benchmark's `main`: skips with a line (and a summary record) under
/// SWITCHYARD_SKIP_LAB=1 when not root, fails otherwise; runs `run` and reports its error.
pub fn root_bench_main(name: &str, what: &str, run: impl FnOnce() -> Result<(), String>) -> ExitCode {
    if !is_root() {
        if std::env::var("SWITCHYARD_SKIP_LAB").as_deref() == Ok("1") {
            println!("skip {name}: needs root for network namespaces (SWITCHYARD_SKIP_LAB=1)");
            record(what, "skipped: needs root", "-", "-");
            return ExitCode::SUCCESS;
        }
        eprintln!("{name} needs root (network namespaces); set SWITCHYARD_SKIP_LAB=1 to skip it");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Validate and render alone (the payload written into memory): the CPU part of a full sync. Returns
/// the payload too (the floor restores it with the bare tool).
pub fn iptables_full_payload(spec: &NodeForwardingPlanSpec) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let report = switchyard_api::validate::validate(spec);
    let skip: HashSet<usize> = report.bad_entries();
    let existing = Default::default();
    let facts = HostFacts {
        random_fully: true,
        ..HostFacts::default()
    };
    let job = PayloadJob {
        spec,
        facts: &facts,
        family: IpFamily::IPv4,
        skip: &skip,
        mode: StreamMode::Full {
            existing: &existing,
            existing_filter: &existing,
        },
        jumps: &[],
    };
    let mut payload = Vec::new();
    let _ = job.write(&mut payload);
    (start.elapsed(), payload)
}

/// One `iptables-<variant>-restore --noflush` of `payload`, timed from spawn to exit.
pub fn bare_iptables_restore(variant: Variant, payload: &str) -> Result<Duration, String> {
    use std::process::{Command, Stdio};
    let started = Instant::now();
    let mut child = Command::new(format!("iptables-{variant}-restore"))
        .args(["--noflush", "-w"])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(payload.as_bytes())
        .map_err(|e| e.to_string())?;
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("bare restore failed: {status}\n{payload}"));
    }
    Ok(started.elapsed())
}
