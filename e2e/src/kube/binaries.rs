//! The Kubernetes binaries a lab cluster runs: `$SWITCHYARD_K8S_BIN` (a folder) ─► checked paths.
//!
//! `../shared/k8s/unpack.sh` unpacks v1.36.2 (kube-apiserver, kube-controller-manager,
//! kube-scheduler, kubelet, kubectl, kube-proxy), etcd 3.6.14, agnhost and pause into such a folder
//! and prints it. containerd, runc, the CNI plugins, openssl and ctr are Debian's and found on PATH.

use std::path::{Path, PathBuf};

use crate::error::{LabError, Result};

/// The variable naming the folder.
pub const K8S_BIN_ENV: &str = "SWITCHYARD_K8S_BIN";

/// The binaries the folder must hold.
const REQUIRED: [&str; 9] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "kube-proxy",
    "agnhost",
    "pause",
];

/// Host programs a node needs (Debian packages: containerd, runc, containernetworking-plugins,
/// openssl, util-linux).
const HOST_PROGRAMS: [(&str, &str); 6] = [
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("openssl", "openssl"),
    ("nsenter", "util-linux"),
];

/// A checked folder of Kubernetes binaries.
#[derive(Clone, Debug)]
pub struct K8sBinaries {
    dir: PathBuf,
}

impl K8sBinaries {
    /// The folder `$SWITCHYARD_K8S_BIN` names, if it is set.
    pub fn from_env() -> Option<Result<K8sBinaries>> {
        std::env::var_os(K8S_BIN_ENV).map(|dir| K8sBinaries::at(Path::new(&dir)))
    }

    /// The folder `dir`, checked: every binary there and executable, and the host programs on PATH.
    pub fn at(dir: &Path) -> Result<K8sBinaries> {
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|name| !is_executable(&dir.join(name)))
            .collect();
        if !missing.is_empty() {
            return Err(LabError::Preflight(format!(
                "{K8S_BIN_ENV}={} lacks {} (../shared/k8s/unpack.sh prints a folder that has them)",
                dir.display(),
                missing.join(", ")
            )));
        }
        let absent: Vec<String> = HOST_PROGRAMS
            .iter()
            .filter(|(program, _)| find_program(program).is_none())
            .map(|(program, package)| format!("{program} (Debian package {package})"))
            .collect();
        if !absent.is_empty() {
            return Err(LabError::Preflight(format!(
                "a lab cluster node needs {}",
                absent.join(", ")
            )));
        }
        Ok(K8sBinaries {
            dir: dir.to_path_buf(),
        })
    }

    /// A folder taken as it is (tests of command lines).
    #[cfg(test)]
    pub(crate) fn unchecked(dir: &Path) -> K8sBinaries {
        K8sBinaries {
            dir: dir.to_path_buf(),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One binary of the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `kubectl`, as a string for command lines.
    pub fn kubectl(&self) -> PathBuf {
        self.path("kubectl")
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `program` as a path, or found on PATH.
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return is_executable(&path).then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_without_the_binaries_says_which_are_missing_and_where_to_get_them() {
        let dir = switchyard_test_support::scratch::dir("k8s-bin").unwrap();
        std::fs::write(dir.path().join("kubectl"), "").unwrap();
        let error = K8sBinaries::at(dir.path()).unwrap_err().to_string();
        assert!(error.contains("lacks etcd, kube-apiserver"), "{error}");
        assert!(
            error.contains("kubectl") && error.contains("unpack.sh"),
            "{error}"
        );
    }
}
