//! A real Kubernetes cluster in the lab: [`KubeCluster::up`] ─► tests and users ─► drop / `kube down`.
//!
//! ```text
//! preflight (root, binaries, images) ─► LabState (id) ─► manifest: namespaces, node cgroups, host
//!   sysctls a kubelet changes, mount points to make ─► namespaces + fabric ─► PKI + kubeconfigs
//! <id>-cp:      etcd ─► kube-apiserver (ready) ─► controller-manager, scheduler
//! host:         relay 127.0.0.1:<port> ─► <id>-cp 192.168.30.10:6443   (kubeconfig/admin-host)
//! API:          Nodes created with their podCIDRs (nothing allocates them)
//! every node:   holder ─► containerd ─► images imported ─► kubelet ─► Node Ready
//! ```
//!
//! No proxy runs: Services work only once one is installed (Switchyard, or the real kube-proxy with
//! [`KubeCluster::start_kube_proxy`]). Dropping the cluster (or `switchyard-lab kube down ID`, or a
//! signal) kills every process of its namespaces and cgroups, removes them, puts the host's sysctls
//! back and removes the mount points it made.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use super::{
    binaries::K8sBinaries,
    control_plane::{self, ApiAddress},
    files,
    node::{self, NodeProcesses},
    pki::{IDENTITIES, Pki},
    spec::{APISERVER_PORT, KubeSpec},
};
use crate::{
    cgroups, command,
    error::{LabError, Result},
    netns, preflight, registry,
    state::{LabState, Manifest},
    supervisor::{ChildHandle, Stdout, Supervisor},
    teardown,
};

/// Host sysctls a kubelet sets (its kernel tunables); recorded first and put back at teardown.
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// The xtables lock: bound into each node, made when the host has none, never removed.
const XTABLES_LOCK: &str = "/run/xtables.lock";
/// How long processes get between SIGTERM and SIGKILL at teardown.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What to bring up.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// How many nodes.
    pub nodes: usize,
    /// The Kubernetes binaries.
    pub binaries: K8sBinaries,
    /// OCI archives imported into every node (pause first).
    pub images: Vec<PathBuf>,
    /// The `switchyard-lab` binary (the holder and the host relay run it).
    pub lab_binary: PathBuf,
    /// Where lab state lives.
    pub state_dir: PathBuf,
    /// How long nodes get to become Ready.
    pub ready_timeout: Duration,
}

/// A running lab cluster.
#[derive(Debug)]
pub struct KubeCluster {
    spec: KubeSpec,
    options: KubeOptions,
    state: LabState,
    supervisor: Supervisor,
    pki: Pki,
    nodes: Vec<NodeProcesses>,
    apiserver: Option<ChildHandle>,
    relay: Option<ChildHandle>,
    host_server: String,
    up: bool,
}

impl KubeCluster {
    /// Brings up the control plane and every node, all Ready; on error, what exists is removed.
    pub fn up(options: KubeOptions) -> Result<KubeCluster> {
        preflight::check()?;
        let missing: Vec<String> = options
            .images
            .iter()
            .filter(|image| !image.is_file())
            .map(|image| image.display().to_string())
            .collect();
        if !missing.is_empty() {
            return Err(LabError::Preflight(format!(
                "images to import are missing: {} (make image builds them)",
                missing.join(", ")
            )));
        }
        teardown::gc_before_up(&options.state_dir);
        let state = {
            let mut live = registry::lock();
            let state = LabState::allocate(&options.state_dir)?;
            registry::register(&mut live, &state);
            state
        };
        let id = state.id().to_owned();
        KubeCluster::build(options, state).map_err(|source| LabError::BringUp {
            lab: id,
            source: Box::new(source),
        })
    }

    fn build(options: KubeOptions, state: LabState) -> Result<KubeCluster> {
        let spec = KubeSpec::new(state.id(), state.dir(), options.nodes);
        let logs = state.logs_dir()?;
        let supervisor = Supervisor::new(state.id(), logs);
        let mut cluster = KubeCluster {
            pki: Pki::open(&spec.pki_dir()),
            spec,
            options,
            state,
            supervisor,
            nodes: Vec::new(),
            apiserver: None,
            relay: None,
            host_server: String::new(),
            up: true,
        };
        // From here on, dropping `cluster` (also on an early return) removes whatever exists.
        let binds: Vec<_> = cluster.spec.nodes.iter().flat_map(node::binds).collect();
        let mount_points = node::missing_mount_points(&binds);
        // Other labs' manifests: a mount point another lab made and we bind over is ours too until
        // we are gone, and the host's original sysctls are what the oldest lab recorded (a running
        // kubelet has changed them since).
        let state_dir = cluster.options.state_dir.clone();
        let others: Vec<Manifest> = LabState::all(&state_dir)
            .into_iter()
            .filter(|other| other.id() != cluster.state.id())
            .filter_map(|other| other.read_manifest().ok().flatten())
            .collect();
        let targets: Vec<&Path> = binds.iter().map(|(bind, _)| bind.target.as_path()).collect();
        let shared: Vec<PathBuf> = others
            .iter()
            .flat_map(|manifest| manifest.mount_points.iter())
            .filter(|path| targets.contains(&path.as_path()))
            .cloned()
            .collect();
        let sysctls = if cluster.spec.nodes.is_empty() {
            // No kubelet: nothing to put back.
            Vec::new()
        } else if let Some(recorded) = others.iter().map(|m| &m.sysctls).find(|s| !s.is_empty()) {
            recorded.clone()
        } else {
            KUBELET_SYSCTLS
                .iter()
                .filter_map(|key| {
                    let value = std::fs::read_to_string(Path::new("/proc/sys").join(key)).ok()?;
                    Some(((*key).to_owned(), value.trim().to_owned()))
                })
                .collect()
        };
        let manifest = Manifest {
            netns: cluster.spec.namespaces(),
            cgroups: cluster
                .spec
                .nodes
                .iter()
                .map(|node| node.cgroup.clone())
                .collect(),
            sysctls,
            // NB: never /run/xtables.lock: host iptables may hold it, and it is what iptables makes anyway.
            mount_points: mount_points
                .iter()
                .map(|(path, _)| path.clone())
                .filter(|path| path != Path::new(XTABLES_LOCK))
                .chain(shared)
                .collect(),
            ..Manifest::owned_by_me(Vec::new())
        };
        cluster.state.write_manifest(&manifest)?;
        cluster.create_network()?;
        for (path, is_file) in &mount_points {
            let made = if *is_file {
                std::fs::write(path, "")
            } else {
                std::fs::create_dir(path)
            };
            made.map_err(|source| LabError::File {
                action: "creating mount point",
                path: path.clone(),
                source,
            })?;
        }
        let node_names: Vec<String> = cluster.spec.nodes.iter().map(|node| node.name.clone()).collect();
        cluster.pki = Pki::create(&cluster.spec.pki_dir(), cluster.spec.cp_ip, &node_names)?;
        cluster.start_control_plane()?;
        cluster.create_nodes()?;
        for index in 0..cluster.spec.nodes.len() {
            cluster.start_node(index)?;
        }
        cluster.wait_nodes_ready(cluster.options.ready_timeout)?;
        Ok(cluster)
    }

    fn create_network(&self) -> Result<()> {
        {
            // NB: namespaces appear under the registry lock, so a signal teardown sees them all.
            let _live = registry::lock();
            netns::add_all(&self.spec.namespaces())?;
        }
        for name in self.spec.namespaces() {
            let forwarding = if self.spec.nodes.iter().any(|node| node.netns == name) {
                "1"
            } else {
                "0"
            };
            netns::write_sysctls(
                &name,
                &[
                    ("net/ipv4/ip_forward".to_owned(), forwarding.to_owned()),
                    ("net/ipv4/conf/all/rp_filter".to_owned(), "0".to_owned()),
                    ("net/ipv4/conf/default/rp_filter".to_owned(), "0".to_owned()),
                    // NB: a node routing the outside client's packet back out of eth0 would send
                    // redirects, and those use up the ICMP rate limit a REJECT's answer needs.
                    ("net/ipv4/conf/all/send_redirects".to_owned(), "0".to_owned()),
                    ("net/ipv4/conf/default/send_redirects".to_owned(), "0".to_owned()),
                ],
            )?;
        }
        let (fabric, members) = self.spec.topology();
        for (name, lines) in fabric.iter().chain(&members) {
            let script = lines.join("\n") + "\n";
            command::ip(&["-n", name, "-batch", "-"], Some(&script))?;
        }
        Ok(())
    }

    fn start_control_plane(&mut self) -> Result<()> {
        let internal = format!("https://{}:{APISERVER_PORT}", self.spec.cp_ip);
        std::fs::create_dir_all(self.spec.dir.join("kubeconfig")).map_err(|source| LabError::File {
            action: "creating",
            path: self.spec.dir.join("kubeconfig"),
            source,
        })?;
        let mut identities: Vec<String> = IDENTITIES
            .iter()
            .map(|identity| identity.name.to_owned())
            .collect();
        identities.extend(self.spec.nodes.iter().map(|node| node.name.clone()));
        for name in &identities {
            let (cert, key) = self.pki.pair(name);
            write(
                &self.spec.kubeconfig(name),
                &files::kubeconfig(&internal, &self.pki.ca(), &cert, &key),
            )?;
        }
        let address = ApiAddress {
            ip: self.spec.cp_ip,
            port: APISERVER_PORT,
            etcd_port: 2379,
        };
        let bin = self.options.binaries.clone();
        let cp = self.spec.cp_netns.clone();
        self.supervisor.spawn(
            &cp,
            "etcd",
            &control_plane::etcd(&bin, &self.spec.dir.join("etcd"), address),
            Stdout::Log,
        )?;
        let apiserver = self
            .supervisor
            .spawn(
                &cp,
                "kube-apiserver",
                &control_plane::apiserver(&bin, &self.pki, address),
                Stdout::Log,
            )?
            .0;
        self.apiserver = Some(apiserver);

        // The host's way in: a relay on the host's loopback, connecting from inside the cp namespace.
        let relay_argv = vec![
            self.options.lab_binary.display().to_string(),
            "kube".to_owned(),
            "relay".to_owned(),
            "--netns".to_owned(),
            cp.clone(),
            "--to".to_owned(),
            SocketAddrV4::new(self.spec.cp_ip, APISERVER_PORT).to_string(),
        ];
        let (relay, pipe) = self
            .supervisor
            .spawn_entered(&[], "api-relay", &relay_argv, Stdout::Pipe)?;
        let listen = match pipe {
            Some(pipe) => read_listen_line(pipe, Duration::from_secs(10))?,
            None => return Err(LabError::Refused("the relay's stdout was not piped".into())),
        };
        // The relay is started outside the lab's namespaces: recorded now, so a teardown after a
        // SIGKILL of this process finds it.
        if let Some(start) = crate::state::process_start_time(relay.pid()) {
            let mut manifest = self.state.read_manifest()?.unwrap_or_default();
            manifest.pids.push((relay.pid(), start));
            self.state.write_manifest(&manifest)?;
        }
        self.relay = Some(relay);
        self.host_server = format!("https://{listen}");
        let (cert, key) = self.pki.pair("admin");
        write(
            &self.admin_kubeconfig(),
            &files::kubeconfig(&self.host_server, &self.pki.ca(), &cert, &key),
        )?;
        self.wait_for_apiserver(Duration::from_secs(60))?;
        if self.spec.nodes.is_empty() {
            // A bare API server (the cluster suites'): no controller rewrites the objects they write.
            return Ok(());
        }
        self.supervisor.spawn(
            &cp,
            "kube-controller-manager",
            &control_plane::controller_manager(&bin, &self.pki, &self.spec.kubeconfig("controller-manager")),
            Stdout::Log,
        )?;
        self.supervisor.spawn(
            &cp,
            "kube-scheduler",
            &control_plane::scheduler(&bin, &self.spec.kubeconfig("scheduler")),
            Stdout::Log,
        )?;
        Ok(())
    }

    fn wait_for_apiserver(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|out| out.trim() == "ok")
            {
                return Ok(());
            }
            if let Some(status) = self.apiserver.as_ref().and_then(ChildHandle::exit_status) {
                let stderr = self
                    .apiserver
                    .as_ref()
                    .map(ChildHandle::stderr)
                    .unwrap_or_default();
                return Err(LabError::Kube {
                    what: "kube-apiserver".into(),
                    detail: format!("exited ({status}): {}", last_lines(&stderr, 10)),
                });
            }
            if Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: "kube-apiserver to answer /readyz".into(),
                    waited_ms: timeout.as_millis(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The Nodes, created before their kubelets with the pod CIDRs the CNI configuration uses.
    fn create_nodes(&self) -> Result<()> {
        if self.spec.nodes.is_empty() {
            // A control plane only (the cluster suites' API server).
            return Ok(());
        }
        let mut text = String::new();
        for node in &self.spec.nodes {
            text.push_str(&format!(
                "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    \
                 kubernetes.io/hostname: {name}\n    kubernetes.io/os: linux\n    \
                 switchyard.io/lab: {id}\nspec:\n  podCIDR: {cidr}\n  podCIDRs: [{cidr}]\n",
                name = node.name,
                cidr = node.pod_cidr,
                id = self.spec.id,
            ));
        }
        self.kubectl_stdin(&["apply", "-f", "-"], &text).map(drop)
    }

    fn start_node(&mut self, index: usize) -> Result<()> {
        let spec = self.spec.nodes[index].clone();
        node::write_files(&self.spec, &spec, &self.pki.ca())?;
        cgroups::create(&spec.cgroup)?;
        let mut processes = NodeProcesses::start(
            &self.supervisor,
            &spec,
            &self.options.lab_binary,
            &self.options.images,
        )?;
        processes.start_kubelet(
            &self.supervisor,
            &self.options.binaries,
            &self.spec.kubeconfig(&spec.name),
        )?;
        self.nodes.push(processes);
        Ok(())
    }

    /// Waits until every running kubelet's Node reports Ready.
    pub fn wait_nodes_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]);
            let wanted: Vec<&str> = self
                .nodes
                .iter()
                .filter(|node| node.kubelet().is_some())
                .map(|node| node.spec.name.as_str())
                .collect();
            if let Ok(out) = &out {
                let ready: Vec<&str> = out
                    .lines()
                    .filter_map(|line| line.strip_suffix("=True"))
                    .collect();
                if wanted.iter().all(|name| ready.contains(name)) {
                    return Ok(());
                }
            }
            for node in &self.nodes {
                if let Some(status) = node.kubelet().and_then(ChildHandle::exit_status) {
                    let stderr = node.kubelet().map(ChildHandle::stderr).unwrap_or_default();
                    return Err(LabError::Kube {
                        what: format!("the kubelet of {}", node.spec.name),
                        detail: format!("exited ({status}): {}", last_lines(&stderr, 10)),
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(LabError::Timeout {
                    what: format!("nodes {} to be Ready (kubectl said: {out:?})", wanted.join(", ")),
                    waited_ms: timeout.as_millis(),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The lab id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// The cluster's shape.
    pub fn spec(&self) -> &KubeSpec {
        &self.spec
    }

    /// The Kubernetes binaries.
    pub fn binaries(&self) -> &K8sBinaries {
        &self.options.binaries
    }

    /// The admin kubeconfig for the host (through the relay on 127.0.0.1).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.spec.kubeconfig("admin-host")
    }

    /// The API server as pods and nodes reach it.
    pub fn apiserver_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.spec.cp_ip, APISERVER_PORT))
    }

    /// The outside client's namespace and address.
    pub fn outside_client(&self) -> (&str, Ipv4Addr) {
        (&self.spec.client_netns, self.spec.client_ip)
    }

    /// The processes of node `name`.
    pub fn node(&self, name: &str) -> Result<&NodeProcesses> {
        self.nodes
            .iter()
            .find(|node| node.spec.name == name)
            .ok_or_else(|| self.unknown(name))
    }

    fn node_mut(&mut self, name: &str) -> Result<&mut NodeProcesses> {
        let id = self.spec.id.clone();
        self.nodes
            .iter_mut()
            .find(|node| node.spec.name == name)
            .ok_or(LabError::UnknownPlace {
                kind: "node",
                name: name.to_owned(),
                lab: id,
            })
    }

    fn unknown(&self, name: &str) -> LabError {
        LabError::UnknownPlace {
            kind: "node",
            name: name.to_owned(),
            lab: self.spec.id.clone(),
        }
    }

    /// Every node's processes.
    pub fn nodes(&self) -> &[NodeProcesses] {
        &self.nodes
    }

    /// Stops node `name`'s kubelet (pods keep running).
    pub fn stop_kubelet(&mut self, name: &str) -> Result<()> {
        self.node_mut(name)?.stop_kubelet();
        Ok(())
    }

    /// Starts node `name`'s kubelet again.
    pub fn start_kubelet(&mut self, name: &str) -> Result<()> {
        let kubeconfig = self.spec.kubeconfig(name);
        let bin = self.options.binaries.clone();
        let supervisor = &self.supervisor;
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.spec.name == name)
            .ok_or_else(|| LabError::Refused(format!("no node {name}")))?;
        node.start_kubelet(supervisor, &bin, &kubeconfig)
    }

    /// Starts the real kube-proxy on every node.
    pub fn start_kube_proxy(&mut self) -> Result<()> {
        let kubeconfig = self.spec.kubeconfig("kube-proxy");
        let bin = self.options.binaries.clone();
        for node in &mut self.nodes {
            node.start_kube_proxy(&self.supervisor, &bin, &kubeconfig)?;
        }
        Ok(())
    }

    /// Starts the real kube-proxy on one node (a node moved back to it).
    pub fn start_kube_proxy_on(&mut self, name: &str) -> Result<()> {
        let kubeconfig = self.spec.kubeconfig("kube-proxy");
        let bin = self.options.binaries.clone();
        let supervisor = &self.supervisor;
        self.nodes
            .iter_mut()
            .find(|node| node.spec.name == name)
            .ok_or_else(|| LabError::Refused(format!("no node {name}")))?
            .start_kube_proxy(supervisor, &bin, &kubeconfig)
    }

    /// Stops kube-proxy on one node and runs `kube-proxy --cleanup` there (a node moved off it).
    pub fn remove_kube_proxy_on(&mut self, name: &str) -> Result<()> {
        let kubeconfig = self.spec.kubeconfig("kube-proxy");
        let bin = self.options.binaries.clone();
        self.nodes
            .iter_mut()
            .find(|node| node.spec.name == name)
            .ok_or_else(|| LabError::Refused(format!("no node {name}")))?
            .remove_kube_proxy(&bin, &kubeconfig)
    }

    /// Stops kube-proxy on every node and runs `kube-proxy --cleanup` there.
    pub fn remove_kube_proxy(&mut self) -> Result<()> {
        let kubeconfig = self.spec.kubeconfig("kube-proxy");
        let bin = self.options.binaries.clone();
        for node in &mut self.nodes {
            node.remove_kube_proxy(&bin, &kubeconfig)?;
        }
        Ok(())
    }

    /// Runs the real `kubectl` as the cluster's admin; returns stdout, or the failure with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        command::run(self.kubectl_command().args(args), None)
    }

    /// `kubectl` with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        command::run(self.kubectl_command().args(args), Some(stdin))
    }

    /// A `kubectl` command as the cluster's admin, for callers that need the exit status.
    pub fn kubectl_command(&self) -> Command {
        let mut cmd = Command::new(self.options.binaries.kubectl());
        cmd.arg("--kubeconfig").arg(self.admin_kubeconfig());
        // Discovery and HTTP caches beside the kubeconfig, not in ~/.kube/cache: they go with the
        // cluster instead of growing by megabytes per run on a machine kept from day to day.
        if let Some(dir) = self.admin_kubeconfig().parent() {
            cmd.arg("--cache-dir").arg(dir.join("kubectl-cache"));
        }
        cmd
    }

    /// A kube client as the cluster's admin.
    pub async fn client(&self) -> Result<kube::Client> {
        let api = |source: kube::Error| LabError::Api {
            what: "a client for the lab cluster".into(),
            source: Box::new(source),
        };
        let text = std::fs::read_to_string(self.admin_kubeconfig()).map_err(|source| LabError::File {
            action: "reading",
            path: self.admin_kubeconfig(),
            source,
        })?;
        let kubeconfig =
            kube::config::Kubeconfig::from_yaml(&text).map_err(|error| api(kube::Error::from(error)))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|error| api(kube::Error::from(error)))?;
        kube::Client::try_from(config).map_err(api)
    }

    /// Starts `argv` in the control plane's namespace (it reaches the API server, every node and,
    /// through them, every pod), supervised: it stops with the cluster, also after a killed run.
    pub fn spawn_in_control_plane(&self, label: &str, argv: &[String]) -> Result<ChildHandle> {
        Ok(self
            .supervisor
            .spawn(&self.spec.cp_netns, label, argv, Stdout::Log)?
            .0)
    }

    /// The lab's state directory.
    pub fn dir(&self) -> &Path {
        self.state.dir()
    }

    /// Where process logs are.
    pub fn logs_dir(&self) -> PathBuf {
        self.state.dir().join("logs")
    }

    /// Leaves the cluster up (and its relay running); returns its id for `kube down`. Bound to
    /// `bound_to` (a process id), gc removes it once that process is gone; otherwise it stays while its
    /// processes run.
    pub fn keep(mut self, bound_to: Option<u32>) -> Result<String> {
        let mut manifest = self.state.read_manifest()?.unwrap_or_default();
        manifest.kept = true;
        manifest.owner = None;
        if let Some(pid) = bound_to {
            manifest.bind_to(pid)?;
        }
        // The relay outlives this process; teardown kills it by the pid recorded when it started.
        self.state.write_manifest(&manifest)?;
        self.supervisor.detach_all();
        registry::lock().remove(self.state.id());
        self.up = false;
        Ok(self.spec.id.clone())
    }

    /// Tears everything down now.
    pub fn down(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if !self.up {
            return Ok(());
        }
        self.up = false;
        for node in &mut self.nodes {
            node.stop_kubelet();
        }
        self.supervisor.stop_all(STOP_GRACE);
        let result = teardown::teardown(
            &self.state,
            std::env::var_os("SWITCHYARD_LAB_KEEP_LOGS").is_some(),
        );
        registry::lock().remove(self.state.id());
        result
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if let Err(error) = self.teardown() {
            eprintln!("switchyard-lab: {error}");
        }
    }
}

/// Reads the relay's "listening ADDR" line.
fn read_listen_line(pipe: std::process::ChildStdout, timeout: Duration) -> Result<String> {
    use std::io::BufRead;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = std::io::BufReader::new(pipe).read_line(&mut line).map(|_| line);
        let _ = sender.send(read);
    });
    match receiver.recv_timeout(timeout) {
        Ok(Ok(line)) => line
            .trim()
            .strip_prefix("listening ")
            .map(str::to_owned)
            .ok_or_else(|| LabError::Kube {
                what: "the API relay".into(),
                detail: format!("said {line:?} instead of its address"),
            }),
        _ => Err(LabError::Timeout {
            what: "the API relay to listen".into(),
            waited_ms: timeout.as_millis(),
        }),
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| LabError::File {
            action: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| LabError::File {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The archives a cluster imports from `dir` (scripts/image/build.sh's names), the sandbox image
/// first; those that do not exist are kept, so [`KubeCluster::up`] can say which are missing.
pub fn image_archives(dir: &Path) -> Vec<PathBuf> {
    let mut archives: Vec<PathBuf> = ["pause", "agnhost", "switchyard-agent", "switchyard-controller"]
        .iter()
        .map(|name| dir.join(format!("{name}.tar")))
        .collect();
    // The bad-input variant, when it was built (`build.sh agent-no-nft`).
    let lacking_nft = dir.join("switchyard-agent-no-nft.tar");
    if lacking_nft.is_file() {
        archives.push(lacking_nft);
    }
    archives
}
