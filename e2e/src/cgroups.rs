//! cgroup v1 roots of lab nodes: a name ─► `/sys/fs/cgroup/<hierarchy>/<name>` in every hierarchy.
//!
//! ```text
//! create(name)   mkdir in every mounted v1 hierarchy (cpuset: cpus and mems copied from the root),
//!                so a kubelet with `cgroupRoot: /<name>` finds its root everywhere
//! pids(name)     every process in that subtree, any hierarchy (pods, containers, their children)
//! remove(name)   rmdir depth-first (a cgroup can only go once it is empty)
//! ```
//!
//! The kubelet puts every pod below its cgroup root, so these three are how a lab node's pods are
//! found and removed without asking the container runtime.

use std::path::{Path, PathBuf};

use crate::error::{LabError, Result};

/// Where cgroup v1 hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The directories of the mounted v1 hierarchies (cpu, memory, pids, name=systemd, …), without the
/// v2 `unified` mount and without symlinked aliases (cpu,cpuacct).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(CGROUP_ROOT) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name().is_some_and(|name| name != "unified") && path.join("cgroup.procs").is_file()
        })
        .collect();
    dirs.sort();
    dirs
}

/// Creates cgroup `name` in every hierarchy.
pub fn create(name: &str) -> Result<()> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(name);
        std::fs::create_dir_all(&dir).map_err(|source| LabError::File {
            action: "creating cgroup",
            path: dir.clone(),
            source,
        })?;
        // A new cpuset has no CPUs or memory nodes; nothing could run in it until they are copied.
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = hierarchy.join(file);
            if let Ok(value) = std::fs::read_to_string(&parent) {
                let path = dir.join(file);
                std::fs::write(&path, value.trim()).map_err(|source| LabError::File {
                    action: "writing",
                    path,
                    source,
                })?;
            }
        }
    }
    Ok(())
}

/// Every process in cgroup `name` or below it, in any hierarchy.
pub fn pids(name: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for hierarchy in hierarchies() {
        collect_pids(&hierarchy.join(name), &mut found);
    }
    found.sort_unstable();
    found.dedup();
    found
}

fn collect_pids(dir: &Path, found: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        found.extend(text.lines().filter_map(|line| line.trim().parse::<i32>().ok()));
    }
    for child in subdirs(dir) {
        collect_pids(&child, found);
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .map(|entry| entry.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes cgroup `name` and everything below it, in every hierarchy; returns what is left.
pub fn remove(name: &str) -> Vec<String> {
    let mut left = Vec::new();
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(name);
        if dir.exists() {
            remove_tree(&dir, &mut left);
        }
    }
    left
}

fn remove_tree(dir: &Path, left: &mut Vec<String>) {
    for child in subdirs(dir) {
        remove_tree(&child, left);
    }
    if let Err(error) = std::fs::remove_dir(dir) {
        left.push(format!("cgroup {}: {error}", dir.display()));
    }
}
