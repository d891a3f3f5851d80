//! Network namespaces by name: create, enter (one thread at a time), find processes in, delete.
//!
//! ```text
//! host netns ── ip netns add/del <name> ──► /run/netns/<name>   (the only thing done in the host namespace)
//!                                               │ open + setns(CLONE_NEWNET) on a fresh thread
//!                                               ▼
//!                             in_netns(name, f): f runs inside; sockets it opens stay there
//! ```
//!
//! Entering happens on a dedicated thread, never on the caller's, so the caller (and the rest of the
//! process) stays in the host namespace. `/proc/sys/net` resolves against the writing thread's
//! namespace, which is how sysctls are set without spawning processes.

use std::{
    collections::BTreeMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use nix::sched::{CloneFlags, setns};

use crate::{
    command::{self, IP},
    error::{LabError, Result},
    script::Action,
};

/// Where iproute2 keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// The bind-mount file of a named namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// True if a namespace of that name exists.
pub fn exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// The names of all named namespaces on this machine.
pub fn list() -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LabError::File {
                action: "listing",
                path: NETNS_DIR.into(),
                source,
            });
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Creates the named namespaces (one `ip` process for all of them).
pub fn add_all(names: &[String]) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let script: String = names.iter().map(|name| format!("netns add {name}\n")).collect();
    command::ip(&["-batch", "-"], Some(&script)).map(drop)
}

/// Deletes those of the named namespaces that exist; returns what could not be deleted.
pub fn delete_all(names: &[String]) -> Vec<String> {
    let present: Vec<&String> = names.iter().filter(|name| exists(name)).collect();
    if present.is_empty() {
        return Vec::new();
    }
    let script: String = present
        .iter()
        .map(|name| format!("netns delete {name}\n"))
        .collect();
    let result = command::output(Command::new(IP).args(["-force", "-batch", "-"]), Some(&script));
    let mut problems: Vec<String> = present
        .iter()
        .filter(|name| exists(name))
        .map(|name| format!("namespace {name} still exists"))
        .collect();
    if let Err(error) = result {
        problems.push(error.to_string());
    }
    problems
}

/// Runs `f` on a new thread that has entered namespace `name`; the caller's thread never moves.
pub fn in_netns<T, F>(name: &str, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    in_netns_at(&netns_path(name), name, f)
}

/// Runs `f` on a new thread that has entered the namespace of file `path` (a named namespace, or
/// `/proc/<pid>/ns/net` of a process such as a pod's sandbox); `name` is for messages.
pub fn in_netns_at<T, F>(path: &Path, name: &str, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let enter_error = |reason: String| LabError::EnterNetns {
        netns: name.to_owned(),
        reason,
    };
    let file = File::open(path).map_err(|error| enter_error(error.to_string()))?;
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || -> Result<T> {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| enter_error(errno.to_string()))?;
            drop(file);
            Ok(f())
        });
        worker
            .join()
            .map_err(|_| LabError::ThreadPanicked(format!("working inside namespace {name}")))?
    })
}

/// Writes `/proc/sys/<key> = value` for each setting, inside namespace `name`.
pub fn write_sysctls(name: &str, settings: &[(String, String)]) -> Result<()> {
    in_netns(name, || {
        settings.iter().try_for_each(|(key, value)| {
            let path = Path::new("/proc/sys").join(key);
            std::fs::write(&path, value).map_err(|source| LabError::File {
                action: "writing sysctl",
                path,
                source,
            })
        })
    })?
}

/// Performs one build action.
pub(crate) fn perform(action: &Action) -> Result<()> {
    match action {
        Action::Sysctl { netns, settings } => write_sysctls(netns, settings),
        Action::Ip { netns, lines } => {
            let script = lines.join("\n") + "\n";
            command::ip(&["-n", netns, "-batch", "-"], Some(&script))
                .map(drop)
                .map_err(|error| match error {
                    LabError::CommandFailed {
                        command,
                        status,
                        stderr,
                    } => LabError::CommandFailed {
                        command,
                        status,
                        stderr: format!("{stderr}\nthe script was:\n{script}"),
                    },
                    other => other,
                })
        }
    }
}

/// Performs the actions of one stage, a few at a time in parallel; the first error wins.
pub(crate) fn perform_stage(actions: &[Action], parallelism: usize) -> Result<()> {
    for chunk in actions.chunks(parallelism.max(1)) {
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let workers: Vec<_> = chunk
                .iter()
                .map(|action| scope.spawn(move || perform(action)))
                .collect();
            workers
                .into_iter()
                .map(|worker| {
                    worker
                        .join()
                        .map_err(|_| LabError::ThreadPanicked("building the topology".into()))?
                })
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
    }
    Ok(())
}

/// The processes (other than this one) whose network namespace is one of `names`, by namespace.
pub fn pids_in(names: &[String]) -> BTreeMap<String, Vec<i32>> {
    let wanted: BTreeMap<(u64, u64), &String> = names
        .iter()
        .filter_map(|name| {
            let meta = std::fs::metadata(netns_path(name)).ok()?;
            Some(((meta.dev(), meta.ino()), name))
        })
        .collect();
    let mut found: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    if wanted.is_empty() {
        return found;
    }
    let own = i32::try_from(std::process::id()).unwrap_or(-1);
    let Ok(proc_entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in proc_entries.filter_map(|entry| entry.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(meta) = std::fs::metadata(entry.path().join("ns/net")) else {
            continue;
        };
        if let Some(name) = wanted.get(&(meta.dev(), meta.ino())) {
            found.entry((*name).clone()).or_default().push(pid);
        }
    }
    found
}
