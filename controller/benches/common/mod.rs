//! Shared scaffolding of the controller benchmarks (`planner`, `churn`): the smoke-mode rule, peak RSS,
//! and the target lines `make bench` collects into its summary table.
// Each benchmark uses only part of this module.
#![allow(dead_code)]

use std::io::Write as _;
use std::time::Duration;

/// `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and then a benchmark runs as a
/// quick smoke check with tiny sizes (benchmarks are never timed tests). SWITCHYARD_BENCH_SMOKE=1 forces it.
pub fn smoke() -> bool {
    std::env::var_os("SWITCHYARD_BENCH_SMOKE").is_some() || !std::env::args().any(|a| a == "--bench")
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Peak resident set of this process since the last [`reset_peak_rss`] (VmHWM), in MiB.
pub fn peak_rss_mib() -> f64 {
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

/// Resets the peak resident set (VmHWM) to the current one (`5` → /proc/self/clear_refs, Linux ≥ 4.0).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// A measurement against a target: prints `target <what> <target>: <value> met|MISSED` and records it for
/// `make bench`'s summary table.
pub fn target(what: &str, value: &str, target: &str, met: bool) {
    let verdict = if met { "met" } else { "MISSED" };
    println!("target {what} {target}: {value} {verdict}");
    record(what, value, target, verdict);
}

/// A figure without a target, recorded for the summary table.
pub fn figure(what: &str, value: &str) {
    record(what, value, "-", "-");
}

/// Appends `SUMMARY|what|value|target|verdict` to the file named by SWITCHYARD_BENCH_SUMMARY (`make bench`
/// sets it; unset, nothing is recorded).
pub fn record(what: &str, value: &str, target: &str, verdict: &str) {
    let Some(path) = std::env::var_os("SWITCHYARD_BENCH_SUMMARY") else {
        return;
    };
    let clean = |s: &str| s.replace(['|', '\n'], " ");
    let line = format!(
        "SUMMARY|{}|{}|{}|{}\n",
        clean(what),
        clean(value),
        clean(target),
        clean(verdict)
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        eprintln!("cannot append to {}: {error}", path.to_string_lossy());
    }
}
