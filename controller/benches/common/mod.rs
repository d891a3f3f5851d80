//! Shared scaffolding of the controller benchmarks (`planner`, `churn`): the smoke-mode rule, peak RSS,
//! and the target lines `make bench` collects into its summary table.
// Each benchmark uses only part of this module.
#![allow(dead_code)]

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
    peak_rss_mib_of("self")
}

/// Peak resident set (VmHWM) of process `pid` (or `self`), in MiB; 0 when it cannot be read.
pub fn peak_rss_mib_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
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

#[path = "../../../benches/summary.rs"]
mod summary;
#[allow(unused_imports)] // each bench uses its own subset
pub use summary::{figure, target};
