//! Can this process build a lab? effective uid 0 and a working `ip` ─► Ok, else a clear error.
//!
//! Checked before anything is created, so a non-root run fails with one sentence instead of a
//! half-built topology.

use std::process::Command;

use crate::{
    command::{self, IP},
    error::{LabError, Result},
};

/// The effective user id, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// True when running as root.
pub fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// Fails unless the process is root and iproute2's `ip` runs.
pub fn check() -> Result<()> {
    match effective_uid() {
        Some(0) => {}
        Some(uid) => return Err(LabError::Preflight(format!("running as uid {uid}, not root"))),
        None => {
            return Err(LabError::Preflight(
                "cannot read the effective uid from /proc/self/status".into(),
            ));
        }
    }
    command::run(Command::new(IP).arg("-V"), None)
        .map(drop)
        .map_err(|error| LabError::Preflight(format!("`{IP}` does not run: {error}")))
}
