//! Result lines a test suite promises its reader (`fault: <name>: N connections, 0 failed`), written
//! where `cargo test` does not capture them.
//!
//! ```text
//! announce(line) ─► stderr, straight through io::Write (the test harness captures only the
//!                   print!/eprint! macros), so `make test` shows it beside the test's `ok`
//! ```

use std::io::Write as _;

/// Writes `line` to standard error past the test harness's capture.
pub fn announce(line: &str) {
    let mut err = std::io::stderr().lock();
    // A closed stderr loses the line; the test's own assertions still decide.
    let _ = writeln!(err, "{line}");
}
