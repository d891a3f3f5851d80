//! A lab's own files: id allocation ─► `<state dir>/<id>/` ─► manifest, logs, plans.
//!
//! ```text
//! /tmp/switchyard-lab/sy1a2b/manifest   owner <pid> <start time>, kept?, netns <name> … (written before
//!                                        any namespace exists, so teardown and gc are exact)
//! /tmp/switchyard-lab/sy1a2b/logs/      stdout/stderr of every process the lab started
//! /tmp/switchyard-lab/sy1a2b/plans/     where the planner hook writes plans
//! ```
//!
//! Creating the directory claims the id, and a manifest naming this process as the owner is written at
//! once, so a `gc` running beside it never takes the new directory for a finished lab's. An id whose
//! directory or namespaces exist is never reused. A lab torn down after a failure keeps only `logs/`
//! (the manifest and the rest, such as a cluster's node folders and containerd roots, are removed).

use std::{
    fmt::Write as _,
    io::Read,
    path::{Path, PathBuf},
};

use crate::{
    error::{LabError, Result},
    names, netns,
};

const MANIFEST: &str = "manifest";

/// The files of one lab.
#[derive(Clone, Debug)]
pub struct LabState {
    id: String,
    dir: PathBuf,
}

/// What a lab created, as recorded on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The process that owns the lab: pid and start time (clock ticks since boot).
    pub owner: Option<(u32, u64)>,
    /// True when the lab was left up on purpose (`up --keep`).
    pub kept: bool,
    /// Every namespace the lab creates.
    pub netns: Vec<String>,
    /// cgroups (one name, in every v1 hierarchy) whose processes teardown kills (a cluster's pods).
    pub cgroups: Vec<String>,
    /// Processes outside the lab's namespaces that teardown kills: pid and start time.
    pub pids: Vec<(u32, u64)>,
    /// Host settings below /proc/sys the lab changed (or lets a kubelet change), with the value to
    /// put back.
    pub sysctls: Vec<(String, String)>,
    /// Empty files and directories the lab made on the host as mount points; removed when no other
    /// lab still lists them.
    pub mount_points: Vec<PathBuf>,
}

impl LabState {
    /// Claims a fresh lab id under `state_dir`.
    pub fn allocate(state_dir: &Path) -> Result<LabState> {
        std::fs::create_dir_all(state_dir).map_err(|source| LabError::File {
            action: "creating",
            path: state_dir.to_path_buf(),
            source,
        })?;
        let existing = netns::list()?;
        for _ in 0..64 {
            let id = names::lab_id(random_bytes()?);
            if existing
                .iter()
                .any(|name| names::lab_id_of_netns(name) == Some(id.as_str()))
            {
                continue;
            }
            let dir = state_dir.join(&id);
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let state = LabState { id, dir };
                    state.write_manifest(&Manifest::owned_by_me(Vec::new()))?;
                    return Ok(state);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(LabError::File {
                        action: "creating",
                        path: dir,
                        source,
                    });
                }
            }
        }
        Err(LabError::AllocateId(format!(
            "64 random ids were all taken under {}",
            state_dir.display()
        )))
    }

    /// The files of an existing lab.
    pub fn open(state_dir: &Path, id: &str) -> Result<LabState> {
        let dir = state_dir.join(id);
        if !names::is_lab_id(id) || !dir.join(MANIFEST).is_file() {
            return Err(LabError::NoSuchLab(id.to_owned()));
        }
        Ok(LabState {
            id: id.to_owned(),
            dir,
        })
    }

    /// Every lab directory under `state_dir` (with or without a manifest).
    pub fn all(state_dir: &Path) -> Vec<LabState> {
        let Ok(entries) = std::fs::read_dir(state_dir) else {
            return Vec::new();
        };
        let mut labs: Vec<LabState> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let id = entry.file_name().into_string().ok()?;
                names::is_lab_id(&id).then(|| LabState {
                    id,
                    dir: entry.path(),
                })
            })
            .collect();
        labs.sort_by(|a, b| a.id.cmp(&b.id));
        labs
    }

    /// The lab id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lab's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where process logs go (created on demand).
    pub fn logs_dir(&self) -> Result<PathBuf> {
        self.subdir("logs")
    }

    /// Where plans go (created on demand).
    pub fn plans_dir(&self) -> Result<PathBuf> {
        self.subdir("plans")
    }

    fn subdir(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::create_dir_all(&path).map_err(|source| LabError::File {
            action: "creating",
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// Writes the manifest (replacing it).
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let path = self.dir.join(MANIFEST);
        let temp = self.dir.join(".manifest.tmp");
        let write = std::fs::write(&temp, manifest.to_text()).and_then(|()| std::fs::rename(&temp, &path));
        write.map_err(|source| LabError::File {
            action: "writing",
            path,
            source,
        })
    }

    /// Reads the manifest; `None` once the lab has been torn down.
    pub fn read_manifest(&self) -> Result<Option<Manifest>> {
        let path = self.dir.join(MANIFEST);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(Manifest::from_text(&text))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(LabError::File {
                action: "reading",
                path,
                source,
            }),
        }
    }

    /// Removes the manifest (the lab is gone) and everything else in the directory but, with
    /// `keep_logs`, its `logs/`. Never across a mount: while something is mounted below the directory
    /// nothing is removed and the error names it.
    pub fn retire(&self, keep_logs: bool) -> Result<()> {
        let refused = |problem: String| LabError::Teardown {
            lab: self.id.clone(),
            problems: problem,
        };
        if !keep_logs {
            return switchyard_test_support::scratch::remove_tree(&self.dir).map_err(refused);
        }
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(LabError::File {
                    action: "reading",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        // NB: the manifest goes last, so a retire cut short is still a lab that gc tears down.
        let mut manifest = None;
        for entry in entries.filter_map(std::result::Result::ok) {
            let path = entry.path();
            match entry.file_name().to_str() {
                Some("logs") => continue,
                Some(MANIFEST) => manifest = Some(path),
                _ if path.is_dir() && !path.is_symlink() => {
                    switchyard_test_support::scratch::remove_tree(&path).map_err(refused)?
                }
                _ => remove_file(&path)?,
            }
        }
        manifest.map_or(Ok(()), |path| remove_file(&path))
    }

    /// When the directory last changed (a finished lab's logs are kept for a while after it).
    pub fn modified(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(&self.dir).and_then(|meta| meta.modified()).ok()
    }
}

impl Manifest {
    /// A manifest owned by this process.
    pub fn owned_by_me(netns: Vec<String>) -> Manifest {
        Manifest {
            owner: own_start_time().map(|start| (std::process::id(), start)),
            kept: false,
            netns,
            ..Manifest::default()
        }
    }

    /// A manifest bound to `pid`: gc removes the lab once that process is gone, kept or not.
    pub fn bind_to(&mut self, pid: u32) -> Result<()> {
        let start = process_start_time(pid).ok_or_else(|| {
            LabError::Preflight(format!("no process {pid} to bind the lab to (--bound-to)"))
        })?;
        self.owner = Some((pid, start));
        Ok(())
    }

    /// True while the owning process is still the one that wrote the manifest.
    pub fn owner_alive(&self) -> bool {
        self.owner
            .is_some_and(|(pid, start)| switchyard_test_support::scratch::process_alive(pid, start))
    }

    fn to_text(&self) -> String {
        let mut text = String::from("# switchyard-lab manifest: what this lab created\n");
        if let Some((pid, start)) = self.owner {
            let _ = writeln!(text, "owner {pid} {start}");
        }
        if self.kept {
            text.push_str("kept\n");
        }
        for name in &self.netns {
            let _ = writeln!(text, "netns {name}");
        }
        for name in &self.cgroups {
            let _ = writeln!(text, "cgroup {name}");
        }
        for (pid, start) in &self.pids {
            let _ = writeln!(text, "pid {pid} {start}");
        }
        for (key, value) in &self.sysctls {
            let _ = writeln!(text, "sysctl {key} {value}");
        }
        for path in &self.mount_points {
            let _ = writeln!(text, "mount-point {}", path.display());
        }
        text
    }

    fn from_text(text: &str) -> Manifest {
        let mut manifest = Manifest::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("owner"), Some(pid), Some(start)) => {
                    manifest.owner = pid.parse().ok().zip(start.parse().ok());
                }
                (Some("kept"), None, None) => manifest.kept = true,
                (Some("netns"), Some(name), None) => manifest.netns.push(name.to_owned()),
                (Some("cgroup"), Some(name), None) => manifest.cgroups.push(name.to_owned()),
                (Some("pid"), Some(pid), Some(start)) => {
                    if let (Ok(pid), Ok(start)) = (pid.parse(), start.parse()) {
                        manifest.pids.push((pid, start));
                    }
                }
                (Some("sysctl"), Some(key), Some(value)) => {
                    manifest.sysctls.push((key.to_owned(), value.to_owned()))
                }
                (Some("mount-point"), Some(path), None) => manifest.mount_points.push(PathBuf::from(path)),
                _ => {}
            }
        }
        manifest
    }
}

fn random_bytes() -> Result<[u8; 2]> {
    let mut bytes = [0u8; 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|source| LabError::File {
            action: "reading",
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(bytes)
}

fn own_start_time() -> Option<u64> {
    process_start_time(std::process::id())
}

pub use switchyard_test_support::scratch::process_start_time;

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(LabError::File {
            action: "removing",
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips() {
        let manifest = Manifest {
            owner: Some((42, 1234)),
            kept: true,
            netns: vec!["sy0001-fabric".into(), "sy0001-node-a".into()],
            cgroups: vec!["switchyard-lab-sy0001-node-a".into()],
            pids: vec![(7, 99)],
            sysctls: vec![("vm/overcommit_memory".into(), "0".into())],
            mount_points: vec![PathBuf::from("/var/lib/kubelet")],
        };
        assert_eq!(Manifest::from_text(&manifest.to_text()), manifest);
    }

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        assert!(Manifest::owned_by_me(Vec::new()).owner_alive());
        let stale = Manifest {
            owner: Some((std::process::id(), 1)),
            ..Manifest::default()
        };
        assert!(!stale.owner_alive());
    }

    #[test]
    fn allocates_distinct_ids_each_owned_at_once() {
        let root = switchyard_test_support::scratch::dir("lab-state").unwrap();
        let a = LabState::allocate(root.path()).unwrap();
        let b = LabState::allocate(root.path()).unwrap();
        assert_ne!(a.id(), b.id());
        for state in [&a, &b] {
            let manifest = state.read_manifest().unwrap().expect("a manifest from the start");
            assert!(manifest.owner_alive() && manifest.netns.is_empty());
            assert!(LabState::open(root.path(), state.id()).is_ok());
        }
        assert_eq!(LabState::all(root.path()).len(), 2);
    }

    #[test]
    fn a_failed_lab_keeps_only_its_logs() {
        let root = switchyard_test_support::scratch::dir("lab-retire").unwrap();
        let state = LabState::allocate(root.path()).unwrap();
        let logs = state.logs_dir().unwrap();
        std::fs::write(logs.join("agent.log"), "what happened").unwrap();
        let node = state.dir().join("nodes/node-a/containerd");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("layer"), "big").unwrap();
        std::fs::write(state.dir().join("kubeconfig"), "x").unwrap();

        state.retire(true).unwrap();
        let left: Vec<String> = std::fs::read_dir(state.dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["logs".to_string()]);
        assert_eq!(
            std::fs::read_to_string(logs.join("agent.log")).unwrap(),
            "what happened"
        );
        assert!(state.read_manifest().unwrap().is_none(), "torn down");

        state.retire(false).unwrap();
        assert!(!state.dir().exists());
        state.retire(false).unwrap();
    }

    #[test]
    fn a_lab_can_be_bound_to_a_live_process_only() {
        let mut manifest = Manifest::default();
        manifest.bind_to(std::process::id()).unwrap();
        assert!(manifest.owner_alive());
        // Pid 0 has no /proc entry.
        assert!(manifest.bind_to(0).is_err());
    }
}
