//! One lab node: its directories and binds ─► holder (mount namespace) ─► containerd ─► images
//! imported ─► kubelet (stoppable, restartable) ─► optionally the real kube-proxy.
//!
//! ```text
//! nsenter --net=/run/netns/<id>-node-a unshare --mount --propagation slave switchyard-lab kube hold …
//!   └─ holder: binds the node's directories over the default paths, prints "ready", waits
//! nsenter -t <holder> -m -n containerd --config D/containerd.toml   (socket: D/run-containerd/…)
//! ctr --address D/run-containerd/containerd.sock -n k8s.io images import target/images/<image>.tar
//! nsenter -t <holder> -m -n kubelet --config D/kubelet.yaml --kubeconfig <lab>/kubeconfig/node-a
//! ```

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{
    binaries::K8sBinaries,
    files,
    hold::Bind,
    spec::{KubeNodeSpec, KubeSpec},
};
use crate::{
    command,
    error::{LabError, Result},
    supervisor::{ChildHandle, Stdout, Supervisor},
};

/// How long containerd gets to open its socket.
const CONTAINERD_READY: Duration = Duration::from_secs(20);

/// The default paths a node's own directories are bound over (`D/<dir>` ─► path), and whether the
/// target is a file.
const BINDS: [(&str, &str, bool); 9] = [
    ("kubelet", "/var/lib/kubelet", false),
    ("containerd", "/var/lib/containerd", false),
    ("run-containerd", "/run/containerd", false),
    ("log-pods", "/var/log/pods", false),
    ("log-containers", "/var/log/containers", false),
    ("cni-state", "/var/lib/cni", false),
    ("cni-conf", "/etc/cni/net.d", false),
    // The agent DaemonSet's hostPaths: its plan cache and the xtables lock, per node.
    ("switchyard", "/var/lib/switchyard", false),
    ("xtables.lock", "/run/xtables.lock", true),
];

/// Where the agent DaemonSet mounts kernel modules from; bound to an empty directory where the host
/// has none (a container runtime would otherwise create it on the host).
const LIB_MODULES: &str = "/lib/modules";

/// Every bind of `node` (the source under its directory, the default path it is shown at).
pub fn binds(node: &KubeNodeSpec) -> Vec<(Bind, bool)> {
    let mut binds: Vec<(Bind, bool)> = BINDS
        .iter()
        .map(|(dir, target, is_file)| {
            (
                Bind {
                    source: node.dir.join(dir),
                    target: PathBuf::from(target),
                },
                *is_file,
            )
        })
        .collect();
    if !Path::new(LIB_MODULES).is_dir() {
        binds.push((
            Bind {
                source: node.dir.join("modules"),
                target: PathBuf::from(LIB_MODULES),
            },
            false,
        ));
    }
    binds
}

/// The host paths `binds` need as mount points that do not exist yet (parents first): the lab
/// makes them and removes them at teardown.
pub fn missing_mount_points(binds: &[(Bind, bool)]) -> Vec<(PathBuf, bool)> {
    let mut missing: Vec<(PathBuf, bool)> = Vec::new();
    for (bind, is_file) in binds {
        let mut chain: Vec<(PathBuf, bool)> = Vec::new();
        let mut path = Some(bind.target.as_path());
        let mut file = *is_file;
        while let Some(current) = path {
            if current.exists() || current.as_os_str().is_empty() || current == Path::new("/") {
                break;
            }
            chain.push((current.to_path_buf(), file));
            file = false;
            path = current.parent();
        }
        for entry in chain.into_iter().rev() {
            if !missing.contains(&entry) {
                missing.push(entry);
            }
        }
    }
    missing
}

/// Makes the node's directories and files, and writes its containerd, kubelet and CNI
/// configuration.
pub fn write_files(spec: &KubeSpec, node: &KubeNodeSpec, ca: &Path) -> Result<()> {
    for (bind, is_file) in binds(node) {
        if is_file {
            write(&bind.source, "")?;
        } else {
            make_dir(&bind.source)?;
        }
    }
    write(&node.dir.join("containerd.toml"), &files::containerd_toml())?;
    let resolv = node.dir.join("resolv.conf");
    // Pods get the cluster's search path; nothing answers DNS in the lab yet (no cluster DNS).
    write(
        &resolv,
        &format!(
            "search svc.{} {}\nnameserver 127.0.0.1\n",
            super::spec::CLUSTER_DOMAIN,
            super::spec::CLUSTER_DOMAIN
        ),
    )?;
    write(
        &node.dir.join("kubelet.yaml"),
        &files::kubelet_yaml(node, ca, &resolv, None),
    )?;
    write(
        &node
            .dir
            .join("cni-conf")
            .join(format!("10-{}.conflist", files::CNI_NETWORK)),
        &files::cni_conflist(node),
    )?;
    let _ = spec;
    Ok(())
}

/// The running processes of one node.
#[derive(Debug)]
pub struct NodeProcesses {
    /// The node.
    pub spec: KubeNodeSpec,
    holder: ChildHandle,
    containerd: ChildHandle,
    kubelet: Option<ChildHandle>,
    kube_proxy: Option<ChildHandle>,
}

impl NodeProcesses {
    /// Starts the holder and containerd, and imports `images` into containerd.
    pub(crate) fn start(
        supervisor: &Supervisor,
        node: &KubeNodeSpec,
        lab_binary: &Path,
        images: &[PathBuf],
    ) -> Result<NodeProcesses> {
        let mut argv = vec![
            lab_binary.display().to_string(),
            "kube".to_owned(),
            "hold".to_owned(),
        ];
        for (bind, _) in binds(node) {
            argv.push("--bind".to_owned());
            argv.push(bind.to_arg());
        }
        let entry = [
            "nsenter".to_owned(),
            format!("--net={}", crate::netns::netns_path(&node.netns).display()),
            "--".to_owned(),
            "unshare".to_owned(),
            "--mount".to_owned(),
            "--propagation".to_owned(),
            "slave".to_owned(),
            "--".to_owned(),
        ];
        let (holder, pipe) =
            supervisor.spawn_entered(&entry, &format!("{}-holder", node.name), &argv, Stdout::Pipe)?;
        if let Some(pipe) = pipe {
            holder.await_line(pipe, "ready", Duration::from_secs(10))?;
        }
        let containerd = supervisor
            .spawn_entered(
                &enter(&holder),
                &format!("{}-containerd", node.name),
                &[
                    "containerd".to_owned(),
                    "--config".to_owned(),
                    node.dir.join("containerd.toml").display().to_string(),
                ],
                Stdout::Log,
            )?
            .0;
        let processes = NodeProcesses {
            spec: node.clone(),
            holder,
            containerd,
            kubelet: None,
            kube_proxy: None,
        };
        processes.wait_for_containerd()?;
        for image in images {
            processes.import(image)?;
        }
        Ok(processes)
    }

    fn socket(&self) -> PathBuf {
        self.spec.dir.join("run-containerd").join("containerd.sock")
    }

    fn wait_for_containerd(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + CONTAINERD_READY;
        loop {
            if self.socket().exists() && self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.containerd.exit_status() {
                return Err(LabError::Kube {
                    what: format!("containerd on {}", self.spec.name),
                    detail: format!("exited ({status}): {}", tail(&self.containerd.stderr())),
                });
            }
            if std::time::Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!(
                        "containerd on {} to open {}",
                        self.spec.name,
                        self.socket().display()
                    ),
                    waited_ms: CONTAINERD_READY.as_millis(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr … args` against this node's containerd, in the k8s.io namespace the kubelet uses.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        command::run(
            Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .args(["--namespace", "k8s.io"])
                .args(args),
            None,
        )
    }

    /// Imports an OCI archive (its index names the image) into this node's containerd.
    pub fn import(&self, archive: &Path) -> Result<()> {
        let archive = archive.display().to_string();
        self.ctr(&["images", "import", &archive]).map(drop)
    }

    /// Tags `source` as `target` in this node's containerd (a "new" image of the same content).
    pub fn tag(&self, source: &str, target: &str) -> Result<()> {
        self.ctr(&["images", "tag", "--force", source, target]).map(drop)
    }

    /// Starts the kubelet (again, after [`NodeProcesses::stop_kubelet`]).
    pub(crate) fn start_kubelet(
        &mut self,
        supervisor: &Supervisor,
        bin: &K8sBinaries,
        kubeconfig: &Path,
    ) -> Result<()> {
        if self.kubelet.as_ref().is_some_and(ChildHandle::is_running) {
            return Ok(());
        }
        let argv = vec![
            bin.path("kubelet").display().to_string(),
            format!("--config={}", self.spec.dir.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--node-ip={}", self.spec.ip),
            format!("--hostname-override={}", self.spec.name),
            "--v=1".to_owned(),
        ];
        let (kubelet, _) = supervisor.spawn_entered(
            &enter(&self.holder),
            &format!("{}-kubelet", self.spec.name),
            &argv,
            Stdout::Log,
        )?;
        self.kubelet = Some(kubelet);
        Ok(())
    }

    /// Stops the kubelet (its pods keep running, as on a real node whose kubelet dies).
    pub fn stop_kubelet(&mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(5));
        }
    }

    /// The kubelet, while it runs.
    pub fn kubelet(&self) -> Option<&ChildHandle> {
        self.kubelet.as_ref()
    }

    /// Starts the real kube-proxy (iptables mode) on this node, as the reference proxy.
    pub(crate) fn start_kube_proxy(
        &mut self,
        supervisor: &Supervisor,
        bin: &K8sBinaries,
        kubeconfig: &Path,
    ) -> Result<()> {
        if self.kube_proxy.as_ref().is_some_and(ChildHandle::is_running) {
            return Ok(());
        }
        let argv = kube_proxy_argv(bin, kubeconfig, &self.spec, false);
        let (proxy, _) = supervisor.spawn_entered(
            &enter(&self.holder),
            &format!("{}-kube-proxy", self.spec.name),
            &argv,
            Stdout::Log,
        )?;
        self.kube_proxy = Some(proxy);
        Ok(())
    }

    /// Stops kube-proxy and runs `kube-proxy --cleanup` on the node (what removing it means).
    pub fn remove_kube_proxy(&mut self, bin: &K8sBinaries, kubeconfig: &Path) -> Result<()> {
        if let Some(proxy) = self.kube_proxy.take() {
            proxy.stop(Duration::from_secs(5));
        }
        let argv = kube_proxy_argv(bin, kubeconfig, &self.spec, true);
        self.run_in(&argv).map(drop)
    }

    /// The real kube-proxy, while it runs.
    pub fn kube_proxy(&self) -> Option<&ChildHandle> {
        self.kube_proxy.as_ref()
    }

    /// Runs `argv` to completion inside the node (its network and mount namespaces).
    pub fn run_in(&self, argv: &[String]) -> Result<String> {
        let mut entry = enter(&self.holder);
        entry.extend(argv.iter().cloned());
        let (program, args) = entry
            .split_first()
            .ok_or_else(|| LabError::Refused("empty command".into()))?;
        command::run(Command::new(program).args(args), None)
    }

    /// The holder's pid (its namespaces are the node's).
    pub fn holder_pid(&self) -> u32 {
        self.holder.pid()
    }
}

/// kube-proxy in iptables mode on `node`; never touching host-wide settings it may not change here.
fn kube_proxy_argv(bin: &K8sBinaries, kubeconfig: &Path, node: &KubeNodeSpec, cleanup: bool) -> Vec<String> {
    let mut argv = vec![
        bin.path("kube-proxy").display().to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={}", node.name),
        "--proxy-mode=iptables".to_owned(),
        format!("--cluster-cidr={}", super::spec::CLUSTER_CIDR),
        // This machine's root may not lower OOM scores, nor change the host's conntrack table size.
        "--oom-score-adj=0".to_owned(),
        "--conntrack-max-per-core=0".to_owned(),
        "--metrics-bind-address=127.0.0.1:10249".to_owned(),
        "--healthz-bind-address=127.0.0.1:10256".to_owned(),
    ];
    if cleanup {
        argv.push("--cleanup".to_owned());
    }
    argv
}

/// `nsenter` into the holder's network and mount namespaces.
fn enter(holder: &ChildHandle) -> Vec<String> {
    vec![
        "nsenter".to_owned(),
        "-t".to_owned(),
        holder.pid().to_string(),
        "-m".to_owned(),
        "-n".to_owned(),
        "--".to_owned(),
    ]
}

fn make_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| LabError::File {
        action: "creating",
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        make_dir(parent)?;
    }
    std::fs::write(path, text).map_err(|source| LabError::File {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bind_comes_from_the_nodes_own_directory() {
        let spec = KubeSpec::new("sy00aa", Path::new("/tmp/lab/sy00aa"), 2);
        let node = &spec.nodes[0];
        let binds = binds(node);
        assert!(
            binds
                .iter()
                .all(|(bind, _)| bind.source.starts_with("/tmp/lab/sy00aa/nodes/node-a"))
        );
        let lock = binds
            .iter()
            .find(|(bind, _)| bind.target == Path::new("/run/xtables.lock"))
            .unwrap();
        assert!(lock.1, "the lock is a file");
        assert!(
            binds
                .iter()
                .any(|(bind, _)| bind.target == Path::new("/var/lib/switchyard"))
        );
    }

    #[test]
    fn missing_mount_points_are_listed_parents_first() {
        let root = std::env::temp_dir().join(format!("mount-points-{}", std::process::id()));
        let binds = vec![
            (
                Bind {
                    source: PathBuf::from("/src"),
                    target: root.join("etc/cni/net.d"),
                },
                false,
            ),
            (
                Bind {
                    source: PathBuf::from("/src"),
                    target: root.join("etc/cni/lock"),
                },
                true,
            ),
        ];
        let missing = missing_mount_points(&binds);
        assert_eq!(
            missing,
            vec![
                (root.clone(), false),
                (root.join("etc"), false),
                (root.join("etc/cni"), false),
                (root.join("etc/cni/net.d"), false),
                (root.join("etc/cni/lock"), true),
            ]
        );
    }
}
