//! The sysctls IPVS mode needs, as kube-proxy's IPVS mode sets them, behind [`Sysctls`]
//! ([`ProcSysctls`] writes `/proc/sys`, `FakeSysctls` a map).
//!
//! ```text
//! kernel release ─► wanted(release) ─► [(net/ipv4/vs/conntrack, 1), ...] ─► Sysctls::set each
//! ```
//!
//! - `net/ipv4/vs/conntrack=1`: IPVS connections go through conntrack, so the glue's MASQUERADE (and
//!   hairpin) apply to them.
//! - `net/ipv4/vs/expire_nodest_conn=1`: packets of a connection whose real server was deleted drop
//!   the connection at once instead of being black-holed until it times out.
//! - `net/ipv4/vs/expire_quiescent_template=1`: persistence templates of a weight-0 real server expire,
//!   so ClientIP affinity moves off a server being drained.
//! - `net/ipv4/vs/conn_reuse_mode=0` only on kernels before 5.9 (kubernetes#93297: the kernel bug it
//!   worked around is fixed since, and 0 there breaks removal of real servers).
//! - `net/ipv4/ip_forward=1`: traffic to pods on other nodes is forwarded.
//!
//! In a DaemonSet /proc/sys is often read-only to the agent (an init container sets them), so a write
//! that fails is logged by the caller, not fatal.

#[cfg(any(test, feature = "testing"))]
use std::collections::BTreeMap;
use std::path::PathBuf;
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Error;

/// Where the kernel release is read.
pub const OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// `(major, minor)` of a release string such as `6.1.0-57-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The sysctls to set on a kernel of `release` (paths relative to /proc/sys), in order.
pub fn wanted(release: &str) -> Vec<(&'static str, &'static str)> {
    let mut list = vec![
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/vs/expire_quiescent_template", "1"),
        ("net/ipv4/ip_forward", "1"),
    ];
    if kernel_version(release).is_some_and(|v| v < (5, 9)) {
        list.push(("net/ipv4/vs/conn_reuse_mode", "0"));
    }
    list
}

/// Reading and writing sysctls.
pub trait Sysctls: Send {
    /// The value (trimmed).
    fn get(&mut self, path: &str) -> Result<String, Error>;
    /// Writes `value`.
    fn set(&mut self, path: &str, value: &str) -> Result<(), Error>;
}

/// `/proc/sys` of the agent's network namespace.
#[derive(Debug, Clone, Default)]
pub struct ProcSysctls;

fn proc_path(path: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(path)
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

/// An in-memory sysctl tree; clones share it. Paths not present read as missing.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Default)]
pub struct FakeSysctls {
    values: Arc<Mutex<BTreeMap<String, String>>>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeSysctls {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every value.
    pub fn values(&self) -> BTreeMap<String, String> {
        self.lock().clone()
    }
}

#[cfg(any(test, feature = "testing"))]
impl Sysctls for FakeSysctls {
    fn get(&mut self, path: &str) -> Result<String, Error> {
        self.lock().get(path).cloned().ok_or_else(|| Error::Sysctl {
            path: proc_path(path),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    fn set(&mut self, path: &str, value: &str) -> Result<(), Error> {
        self.lock().insert(path.to_string(), value.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_reuse_mode_is_set_only_before_5_9() {
        assert_eq!(kernel_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("garbage"), None);
        let has_reuse = |release| {
            wanted(release)
                .iter()
                .any(|(p, _)| p.ends_with("conn_reuse_mode"))
        };
        assert!(!has_reuse("6.1.0-57-amd64"));
        assert!(!has_reuse("5.9.0"));
        assert!(has_reuse("5.4.0-100-generic"));
        assert!(!has_reuse("weird"));
        assert_eq!(wanted("6.1.0")[0], ("net/ipv4/vs/conntrack", "1"));
    }

    #[test]
    fn the_fake_keeps_what_was_set() {
        let mut sysctls = FakeSysctls::new();
        assert!(sysctls.get("net/ipv4/vs/conntrack").is_err());
        sysctls.set("net/ipv4/vs/conntrack", "1").unwrap();
        assert_eq!(sysctls.get("net/ipv4/vs/conntrack").unwrap(), "1");
        // The real tree has the release; a path that does not exist is an error, not a panic.
        assert!(ProcSysctls.get("kernel/osrelease").is_ok());
        assert!(ProcSysctls.get("net/ipv4/vs/switchyard-none").is_err());
    }
}
