//! Removing labs: manifest ─► kill every process inside its namespaces, its cgroups and its listed
//! pids ─► remove the cgroups ─► delete the namespaces ─► put host sysctls back ─► remove the mount
//! points it made ─► unmount anything left mounted below its directory ─► retire the directory
//! (never removed across a mount).
//!
//! ```text
//! Lab::drop / Lab::down ─┐
//! signal handler ────────┼─► teardown(state) ── exact: only names listed in the manifest
//! `down ID` ─────────────┤
//! `gc [--all]` ──────────┘   which labs: gc_decision(manifest) — its owner gone, or kept by hand with
//!                            nothing running any more; with --all every lab and any namespace named
//!                            like a lab's; then the scratch folders of processes that are gone
//! Lab::up, KubeCluster::up ─► gc first, so a run finds and removes what a killed run left
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
    problems.extend(unmount_below(state.dir()));
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

/// Detaches whatever is mounted at or below `dir` in this mount namespace (deepest first): a node's
/// binds live in its own mount namespace, which dies with its processes, so anything here is a
/// leftover that a recursive removal must never cross.
fn unmount_below(dir: &Path) -> Vec<String> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    switchyard_test_support::scratch::mounts_below(&dir)
        .into_iter()
        .filter_map(|point| {
            nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH)
                .err()
                .map(|error| format!("unmounting {}: {error}", point.display()))
        })
        .collect()
}

/// `switchyard-lab down ID`.
pub fn down(state_dir: &Path, id: &str) -> Result<()> {
    teardown(&LabState::open(state_dir, id)?, false)
}

/// How long the logs of a lab torn down after a failure are kept for a look (a later gc removes them).
pub const KEEP_FAILED_LOGS: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What `gc` did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Labs torn down (from their manifests).
    pub removed: Vec<String>,
    /// Labs left alone, with why (in use by a live process, or kept and still running).
    pub skipped: Vec<(String, String)>,
    /// Lab-looking namespaces no manifest listed (removed with `--all`).
    pub strays: Vec<String>,
    /// State directories of finished labs (logs only) that were removed.
    pub retired_dirs: Vec<PathBuf>,
    /// Scratch folders of processes that are gone, removed.
    pub scratch: Vec<PathBuf>,
    /// What could not be removed.
    pub problems: Vec<String>,
}

/// What gc does with one lab, from its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcDecision {
    /// Tear it down.
    Remove,
    /// Leave it, for this reason.
    Keep(String),
}

/// A lab is in use while its owner runs; a lab kept by hand (`--keep`, no owner) while any of its
/// processes still runs. Anything else was left by a run that is gone.
pub fn gc_decision(manifest: &crate::state::Manifest, processes_running: bool) -> GcDecision {
    match manifest.owner {
        Some((pid, _)) if manifest.owner_alive() => GcDecision::Keep(format!("in use by process {pid}")),
        None if manifest.kept && processes_running => {
            GcDecision::Keep("kept, and its processes still run (down ID, or gc --all)".into())
        }
        _ => GcDecision::Remove,
    }
}

/// True while any process of the lab runs: in its namespaces, its cgroups, or its listed pids.
fn processes_running(manifest: &crate::state::Manifest) -> bool {
    netns::pids_in(&manifest.netns)
        .values()
        .any(|pids| !pids.is_empty())
        || manifest
            .cgroups
            .iter()
            .any(|name| !cgroups::pids(name).is_empty())
        || manifest
            .pids
            .iter()
            .any(|(pid, start)| crate::state::process_start_time(*pid) == Some(*start))
}

/// Removes what runs that are gone left behind: labs and clusters (see [`gc_decision`]), the logs of
/// failed labs older than [`KEEP_FAILED_LOGS`], and scratch folders of processes that are gone (in
/// `$TMPDIR` and `/tmp`). With `all`, every lab, kept or live, every retired directory, and any
/// namespace named like a lab's.
pub fn gc(state_dir: &Path, all: bool) -> GcReport {
    let mut report = GcReport::default();
    let mut listed: Vec<String> = Vec::new();
    for state in LabState::all(state_dir) {
        match state.read_manifest() {
            Ok(None) => {
                let old = state
                    .modified()
                    .and_then(|at| at.elapsed().ok())
                    .is_some_and(|age| age > KEEP_FAILED_LOGS);
                if all || old {
                    match state.retire(false) {
                        Ok(()) => report.retired_dirs.push(state.dir().to_path_buf()),
                        Err(error) => report.problems.push(error.to_string()),
                    }
                }
            }
            Ok(Some(manifest)) => {
                let decision = if all {
                    GcDecision::Remove
                } else {
                    gc_decision(&manifest, processes_running(&manifest))
                };
                if let GcDecision::Keep(why) = decision {
                    listed.extend(manifest.netns);
                    report.skipped.push((state.id().to_owned(), why));
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
    let mut roots = vec![std::env::temp_dir(), PathBuf::from("/tmp")];
    roots.dedup();
    for root in roots {
        let swept = switchyard_test_support::scratch::sweep(&root);
        report.scratch.extend(swept.removed);
        report.problems.extend(swept.problems);
    }
    report
}

/// The gc a lab runs before it comes up: what killed runs left is removed, and said on stderr.
pub(crate) fn gc_before_up(state_dir: &Path) {
    let report = gc(state_dir, false);
    for id in &report.removed {
        eprintln!("switchyard-lab: removed lab {id}, left by a run that is gone");
    }
    for problem in &report.problems {
        eprintln!("switchyard-lab: gc: {problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Manifest;

    #[test]
    fn gc_removes_only_what_no_live_run_holds() {
        let mine = Manifest::owned_by_me(vec!["sy0001-node-a".into()]);
        let gone = Manifest {
            owner: Some((std::process::id(), 1)),
            ..Manifest::default()
        };
        let kept = Manifest {
            kept: true,
            ..Manifest::default()
        };
        let kept_bound_to_gone = Manifest {
            kept: true,
            ..gone.clone()
        };
        let in_use = |d: &GcDecision| matches!(d, GcDecision::Keep(_));
        // (manifest, its processes still run, kept?)
        for (what, manifest, running, keep) in [
            ("owner alive", &mine, false, true),
            ("owner alive, running", &mine, true, true),
            ("owner gone, processes left", &gone, true, false),
            ("owner gone", &gone, false, false),
            ("kept by hand, running", &kept, true, true),
            ("kept by hand, nothing runs", &kept, false, false),
            (
                "kept for a process that is gone",
                &kept_bound_to_gone,
                true,
                false,
            ),
        ] {
            assert_eq!(in_use(&gc_decision(manifest, running)), keep, "{what}");
        }
    }
}
