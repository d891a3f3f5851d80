//! Removing labs: manifest ─► kill every process inside its namespaces, its cgroups and its listed
//! pids ─► remove the cgroups ─► delete the namespaces ─► put host sysctls back ─► remove the mount
//! points it made ─► retire the state directory.
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
    cgroups,
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
    let mut problems = Vec::new();
    if !manifest.cgroups.is_empty() || !manifest.pids.is_empty() {
        problems.extend(kill_cgroups_and_pids(&manifest));
        // NB: pods killed above may have left processes in the namespaces (hostNetwork pods); again.
        kill_processes_in(&manifest.netns);
    }
    problems.extend(netns::delete_all(&manifest.netns));
    problems.extend(restore_sysctls(&manifest.sysctls));
    problems.extend(remove_mount_points(state, &manifest.mount_points));
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

/// Kills every process of the manifest's cgroups and listed pids, waits for them to be gone, and
/// removes the cgroups; returns what could not be removed.
fn kill_cgroups_and_pids(manifest: &crate::state::Manifest) -> Vec<String> {
    for (pid, start) in &manifest.pids {
        // NB: only the process that was recorded, never one that reused its pid.
        if crate::state::process_start_time(*pid) == Some(*start)
            && let Ok(pid) = i32::try_from(*pid)
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = manifest
            .cgroups
            .iter()
            .flat_map(|name| cgroups::pids(name))
            .collect();
        if pids.is_empty() || std::time::Instant::now() > deadline {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut left = Vec::new();
    for name in &manifest.cgroups {
        // NB: a cgroup whose last process just died may need a moment before rmdir succeeds.
        for attempt in 0..20 {
            let remaining = cgroups::remove(name);
            if remaining.is_empty() {
                break;
            }
            if attempt == 19 {
                left.extend(remaining);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    left
}

/// Writes back the host sysctls the lab recorded before changing them.
fn restore_sysctls(sysctls: &[(String, String)]) -> Vec<String> {
    sysctls
        .iter()
        .filter_map(|(key, value)| {
            let path = Path::new("/proc/sys").join(key);
            let current = std::fs::read_to_string(&path).ok();
            if current.as_deref().map(str::trim) == Some(value.as_str()) {
                return None;
            }
            std::fs::write(&path, value)
                .err()
                .map(|error| format!("restoring {} to {value}: {error}", path.display()))
        })
        .collect()
}

/// Removes the empty mount points the lab made on the host, unless another lab's manifest still
/// lists them (it may have bound something over them in its own mount namespace).
fn remove_mount_points(state: &LabState, paths: &[PathBuf]) -> Vec<String> {
    if paths.is_empty() {
        return Vec::new();
    }
    let state_dir = state.dir().parent().map(Path::to_path_buf).unwrap_or_default();
    let others: Vec<PathBuf> = LabState::all(&state_dir)
        .into_iter()
        .filter(|other| other.id() != state.id())
        .filter_map(|other| other.read_manifest().ok().flatten())
        .flat_map(|manifest| manifest.mount_points)
        .collect();
    let mut problems = Vec::new();
    // NB: deepest first, so a directory made for a deeper mount point goes after it.
    let mut paths: Vec<&PathBuf> = paths.iter().filter(|path| !others.contains(path)).collect();
    paths.sort_by_key(|path| std::cmp::Reverse(path.components().count()));
    for path in paths {
        let result = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir(path),
            Ok(meta) if meta.len() == 0 => std::fs::remove_file(path),
            Ok(_) => continue,
            Err(_) => continue,
        };
        if let Err(error) = result {
            problems.push(format!("removing mount point {}: {error}", path.display()));
        }
    }
    problems
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
