//! Scratch folders for tests and benches, and the sweep that removes those a killed run left behind.
//!
//! ```text
//! scratch::dir("tag") ─► $TMPDIR/switchyard-scratch.<pid>.<start>.<tag>.XXXXXX   (a tempfile::TempDir)
//!   dropped (the test passed, or panicked and unwound) ─► removed
//!   the process killed (Ctrl-C, SIGKILL: no destructor runs) ─► left, named after a process that is gone
//! scratch::sweep(root) ─► each switchyard-scratch.* of root whose <pid>.<start> no longer runs
//!   ─► remove_tree: refused while anything is mounted below it, else removed
//! ```
//!
//! The owner is named by pid *and* start time (field 22 of `/proc/<pid>/stat`), so a folder is never
//! taken for a live run's because its pid was reused. `switchyard-lab gc` sweeps `$TMPDIR` and `/tmp`;
//! `make test` and the other suite targets also give each run a `TMPDIR` of its own and remove it
//! when the run ends (`scripts/scoped-run.sh`).

use std::path::{Path, PathBuf};

pub use tempfile::TempDir;

/// Every scratch folder's name starts with this.
pub const PREFIX: &str = "switchyard-scratch.";

/// A fresh folder under the temporary directory, removed when the value is dropped. `tag` says what
/// made it (letters, digits and `-`; anything else becomes `-`).
pub fn dir(tag: &str) -> std::io::Result<TempDir> {
    let tag: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let pid = std::process::id();
    let start = process_start_time(pid).unwrap_or(0);
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{pid}.{start}.{tag}."))
        .tempdir()
}

/// The process that made a scratch folder, from its name: pid and start time.
fn owner_of(name: &str) -> Option<(u32, u64)> {
    let mut parts = name.strip_prefix(PREFIX)?.splitn(3, '.');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    Some((pid, start))
}

/// True while `pid` is the process that started at `start` (clock ticks since boot).
pub fn process_alive(pid: u32, start: u64) -> bool {
    process_start_time(pid) == Some(start)
}

/// Field 22 of `/proc/<pid>/stat`: the start time, which tells a live process from a reused pid.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Folders removed.
    pub removed: Vec<PathBuf>,
    /// Folders of runs that are gone but could not be removed, with why.
    pub problems: Vec<String>,
}

/// Removes the scratch folders under `root` whose process is gone. Folders of live processes, and
/// anything not named like a scratch folder, are left alone.
pub fn sweep(root: &Path) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(root) else {
        return swept;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some((pid, start)) = name.to_str().and_then(owner_of) else {
            continue;
        };
        if process_alive(pid, start) {
            continue;
        }
        let path = entry.path();
        match remove_tree(&path) {
            Ok(()) => swept.removed.push(path),
            Err(problem) => swept.problems.push(problem),
        }
    }
    swept
}

/// Every mount point at or below `path` in this process's mount namespace, deepest first.
pub fn mounts_below(path: &Path) -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = table
        .lines()
        // Field 5 is the mount point, with spaces and the like written as octal escapes.
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape_mount_point(point)))
        .filter(|point| point.starts_with(path))
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    found.dedup();
    found
}

fn unescape_mount_point(point: &str) -> String {
    let mut out = String::with_capacity(point.len());
    let mut rest = point;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Removes `path` and everything below it, but never across a mount: while anything is mounted at
/// or below it, nothing is removed and the answer names the mount (unmount it first).
pub fn remove_tree(path: &Path) -> Result<(), String> {
    let canonical = match path.canonicalize() {
        Ok(canonical) => canonical,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(format!("{}: {error}", path.display())),
    };
    if let Some(mount) = mounts_below(&canonical).first() {
        return Err(format!(
            "not removing {}: {} is mounted there (unmount it first)",
            path.display(),
            mount.display()
        ));
    }
    match std::fs::remove_dir_all(&canonical) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("removing {}: {error}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_folder_is_named_after_its_process_and_removed_on_drop() {
        let scratch = dir("naming test/1").unwrap();
        let name = scratch.path().file_name().unwrap().to_str().unwrap().to_owned();
        let (pid, start) = owner_of(&name).expect("an owner in the name");
        assert_eq!(pid, std::process::id());
        assert!(process_alive(pid, start), "{name}: this process");
        assert!(name.contains(".naming-test-1."), "{name}");
        let path = scratch.path().to_path_buf();
        std::fs::write(path.join("file"), "x").unwrap();
        drop(scratch);
        assert!(!path.exists());
    }

    #[test]
    fn names_that_are_not_scratch_folders_have_no_owner() {
        for name in [
            "switchyard-scratch.",
            "switchyard-scratch.12",
            "switchyard-scratch.x.1.tag.abc",
            "switchyard-lab",
            "tmp.abc",
        ] {
            assert_eq!(owner_of(name), None, "{name}");
        }
        assert_eq!(owner_of("switchyard-scratch.12.34.tag.x.y"), Some((12, 34)));
    }

    #[test]
    fn the_sweep_removes_folders_of_gone_processes_only() {
        let root = dir("sweep-root").unwrap();
        let live = root.path().join(format!(
            "{PREFIX}{}.{}.live.abc",
            std::process::id(),
            process_start_time(std::process::id()).unwrap()
        ));
        // The same pid with another start time: a process that is gone (its pid reused by us).
        let gone = root
            .path()
            .join(format!("{PREFIX}{}.1.gone.abc", std::process::id()));
        let other = root.path().join("someone-elses");
        for path in [&live, &gone, &other] {
            std::fs::create_dir_all(path.join("inner")).unwrap();
        }
        let swept = sweep(root.path());
        assert_eq!(swept.removed, vec![gone.clone()]);
        assert!(swept.problems.is_empty(), "{:?}", swept.problems);
        assert!(live.exists() && other.exists() && !gone.exists());
    }

    #[test]
    fn mount_points_are_read_with_their_escapes() {
        assert_eq!(unescape_mount_point(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_point(r"/plain"), "/plain");
        assert_eq!(unescape_mount_point(r"/odd\x"), r"/odd\x");
        // The root is always mounted, so a tree holding it is refused.
        assert!(mounts_below(Path::new("/")).contains(&PathBuf::from("/")));
        let refused = remove_tree(Path::new("/proc")).unwrap_err();
        assert!(refused.contains("is mounted there"), "{refused}");
    }
}
