//! Removing labs: manifest ─► kill every process inside its namespaces ─► delete the namespaces ─►
//! retire the state directory.
//!
//! ```text
//! Lab::drop / Lab::down ─┐
//! signal handler ────────┼─► teardown(state) ── exact: only names listed in the manifest
//! `down ID` ─────────────┤
//! `cleanup [--all]` ─────┘   + with --all: any namespace named like `sy????-…` that no manifest lists
//! ```
//!
//! The signal handler finds the labs of this process in the `registry`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{
    error::{LabError, Result},
    names, netns,
    registry::LiveLab,
    state::LabState,
};

/// Tears down every lab in the (locked) registry: kills their children, then their namespaces' processes,
/// deletes the namespaces; returns the problems. The signal handler keeps the lock until it exits.
pub(crate) fn teardown_live_labs(live: &mut BTreeMap<String, LiveLab>) -> Vec<String> {
    let mut problems = Vec::new();
    for (_, lab) in std::mem::take(live) {
        for pid in lab.pids {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if let Err(error) = teardown(&lab.state, false) {
            problems.push(error.to_string());
        }
    }
    problems
}

/// Kills the processes in a lab's namespaces, deletes them and retires its directory.
///
/// Idempotent: a lab already torn down (no manifest) only has its directory retired.
pub fn teardown(state: &LabState, keep_logs: bool) -> Result<()> {
    let Some(manifest) = state.read_manifest()? else {
        return state.retire(keep_logs);
    };
    kill_processes_in(&manifest.netns);
    let problems = netns::delete_all(&manifest.netns);
    if !problems.is_empty() {
        return Err(LabError::Teardown {
            lab: state.id().to_owned(),
            problems: problems.join("; "),
        });
    }
    state.retire(keep_logs)
}

/// SIGKILLs every process whose network namespace is one of `names`.
pub(crate) fn kill_processes_in(names: &[String]) {
    for pids in netns::pids_in(names).values() {
        for pid in pids {
            // NB: a process may exit between the scan and the kill; that is fine.
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

/// `switchyard-lab down ID`.
pub fn down(state_dir: &Path, id: &str) -> Result<()> {
    teardown(&LabState::open(state_dir, id)?, false)
}

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Labs torn down (from their manifests).
    pub removed: Vec<String>,
    /// Labs left alone because their owner still runs or they were kept (without `--all`).
    pub skipped: Vec<String>,
    /// Lab-looking namespaces no manifest listed (removed with `--all`).
    pub strays: Vec<String>,
    /// State directories of finished labs (logs only) that were removed.
    pub retired_dirs: Vec<PathBuf>,
    /// What could not be removed.
    pub problems: Vec<String>,
}

/// Removes leftovers of crashed runs: labs whose owner is gone and that were not kept. With `all`,
/// also live and kept labs and any namespace named like a lab's.
pub fn cleanup(state_dir: &Path, all: bool) -> CleanupReport {
    let mut report = CleanupReport::default();
    let mut listed: Vec<String> = Vec::new();
    for state in LabState::all(state_dir) {
        match state.read_manifest() {
            Ok(None) => {
                if state.retire(false).is_ok() {
                    report.retired_dirs.push(state.dir().to_path_buf());
                }
            }
            Ok(Some(manifest)) => {
                if !all && (manifest.kept || manifest.owner_alive()) {
                    listed.extend(manifest.netns);
                    report.skipped.push(state.id().to_owned());
                    continue;
                }
                match teardown(&state, false) {
                    Ok(()) => report.removed.push(state.id().to_owned()),
                    Err(error) => report.problems.push(error.to_string()),
                }
            }
            Err(error) => report.problems.push(error.to_string()),
        }
    }
    if all {
        match netns::list() {
            Ok(names) => {
                let strays: Vec<String> = names
                    .into_iter()
                    .filter(|name| names::lab_id_of_netns(name).is_some() && !listed.contains(name))
                    .collect();
                kill_processes_in(&strays);
                report.problems.extend(netns::delete_all(&strays));
                report.strays = strays;
            }
            Err(error) => report.problems.push(error.to_string()),
        }
    }
    report
}
