//! The sysctl edge: `/proc/sys` of the agent's network namespace behind [`Sysctls`] ([`ProcSysctls`];
//! `FakeSysctls`, an in-memory tree, for tests). Its users decide what to write: [`crate::ipvs::sysctl`]
//! (what IPVS mode needs) and [`crate::conntrack::settings`] (conntrack's, on every backend).
//!
//! ```text
//! ipvs::sysctl::wanted ───────┐
//! conntrack::settings::apply ─┴─► Sysctls::get / set ─► /proc/sys/<path>
//! ```
//!
//! The files under `/proc/sys/net` are those of the opening process's network namespace: the agent
//! runs in the node's (host network), a lab agent in its node's namespace. In a container `/proc/sys`
//! is read-only unless privileged, so a write fails there with `EROFS` and the caller reports it.

#[cfg(any(test, feature = "testing"))]
use std::collections::BTreeMap;
use std::path::PathBuf;
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Error;

/// Reading and writing sysctls, by path relative to `/proc/sys` (`net/ipv4/ip_forward`).
pub trait Sysctls: Send {
    /// The value (trimmed).
    fn get(&mut self, path: &str) -> Result<String, Error>;
    /// Writes `value`.
    fn set(&mut self, path: &str, value: &str) -> Result<(), Error>;
}

/// `/proc/sys` of the agent's network namespace.
#[derive(Debug, Clone, Default)]
pub struct ProcSysctls;

/// Where a sysctl's file is.
pub fn proc_path(path: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(path)
}

/// `net/netfilter/nf_conntrack_max` as `sysctl` names it: `net.netfilter.nf_conntrack_max`.
pub fn dotted(path: &str) -> String {
    path.replace('/', ".")
}

impl Sysctls for ProcSysctls {
    fn get(&mut self, path: &str) -> Result<String, Error> {
        let file = proc_path(path);
        std::fs::read_to_string(&file)
            .map(|v| v.trim().to_string())
            .map_err(|source| Error::Sysctl { path: file, source })
    }

    fn set(&mut self, path: &str, value: &str) -> Result<(), Error> {
        let file = proc_path(path);
        std::fs::write(&file, value).map_err(|source| Error::Sysctl { path: file, source })
    }
}

#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
struct Tree {
    values: BTreeMap<String, String>,
    read_only: bool,
}

/// An in-memory sysctl tree; clones share it. Paths not present read as missing.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Default)]
pub struct FakeSysctls {
    tree: Arc<Mutex<Tree>>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeSysctls {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every value.
    pub fn values(&self) -> BTreeMap<String, String> {
        self.lock().values.clone()
    }

    /// Sets a value as the host had it (works while read-only).
    pub fn put(&self, path: &str, value: &str) {
        self.lock().values.insert(path.to_string(), value.to_string());
    }

    /// Makes every write fail as a container's read-only `/proc/sys` does (`EROFS`).
    pub fn set_read_only(&self, read_only: bool) {
        self.lock().read_only = read_only;
    }
}

#[cfg(any(test, feature = "testing"))]
impl Sysctls for FakeSysctls {
    fn get(&mut self, path: &str) -> Result<String, Error> {
        self.lock()
            .values
            .get(path)
            .cloned()
            .ok_or_else(|| Error::Sysctl {
                path: proc_path(path),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
    }

    fn set(&mut self, path: &str, value: &str) -> Result<(), Error> {
        let mut tree = self.lock();
        if tree.read_only {
            return Err(Error::Sysctl {
                path: proc_path(path),
                source: std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem),
            });
        }
        tree.values.insert(path.to_string(), value.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_keeps_what_was_set_and_refuses_writes_when_read_only() {
        let mut sysctls = FakeSysctls::new();
        assert!(sysctls.get("net/ipv4/vs/conntrack").is_err());
        sysctls.set("net/ipv4/vs/conntrack", "1").unwrap();
        assert_eq!(sysctls.get("net/ipv4/vs/conntrack").unwrap(), "1");
        sysctls.set_read_only(true);
        assert!(sysctls.set("net/ipv4/vs/conntrack", "0").is_err());
        sysctls.put("net/ipv4/vs/conntrack", "2");
        assert_eq!(sysctls.get("net/ipv4/vs/conntrack").unwrap(), "2");
        // The real tree has the release; a path that does not exist is an error, not a panic.
        assert!(ProcSysctls.get("kernel/osrelease").is_ok());
        assert!(ProcSysctls.get("net/ipv4/vs/switchyard-none").is_err());
        assert_eq!(
            dotted("net/netfilter/nf_conntrack_max"),
            "net.netfilter.nf_conntrack_max"
        );
    }
}
