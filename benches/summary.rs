//! Target lines and the summary records every benchmark shares (included by `#[path]` from each crate's
//! benches, which cannot depend on one another).
//!
//! ```text
//! target()/figure() ─► stdout `target … met|MISSED` ─► record() ─► $SWITCHYARD_BENCH_SUMMARY
//!                                                                  (`SUMMARY|what|value|target|verdict`)
//!                                                   ─► scripts/bench-summary.sh prints the table
//! ```
#![allow(dead_code)]

use std::io::Write as _;

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
