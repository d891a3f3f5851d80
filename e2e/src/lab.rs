//! A running lab: description ─► [`Lab::up`] ─► namespaces, links, routes, backends ─► tests probe,
//! spawn agents, read state ─► drop ─► everything removed.
//!
//! ```text
//! Lab::up_with(description, options)
//!   preflight (root, ip) ─► LabState::allocate (id) ─► Layout::plan ─► manifest ─► ip netns add …
//!   ─► BuildScript stages ─► one `switchyard-lab serve` per pod (waits for each "ready")
//! Lab (tests)
//!   probe / probe_many / await_answer   traffic from a node, pod or the client
//!   spawn_in / exec_in                  agents and one-shot commands inside a namespace
//!   client_route_via                    steer the client's traffic to a node
//!   write_plans                         planner hook (not wired yet)
//! drop / down ─► stop children ─► kill leftovers in the namespaces ─► delete them ─► remove state
//! ```

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use ipnet::Ipv4Net;

use crate::{
    cluster::ClusterDescription,
    command::{self, IP},
    error::{LabError, Result},
    layout::{LabClient, LabNode, LabPod, Layout},
    names::UPLINK,
    netns,
    options::LabOptions,
    place::Place,
    preflight,
    probe::{self, ProbeResult, ProbeTally, Proto},
    registry,
    script::BuildScript,
    serve,
    state::{LabState, Manifest},
    supervisor::{ChildHandle, Stdout, Supervisor},
    teardown,
};

/// How many build actions run at once.
const BUILD_PARALLELISM: usize = 8;
/// How long supervised processes get between SIGTERM and SIGKILL at teardown.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Pause between attempts of [`Lab::await_answer`].
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// A virtual cluster in network namespaces; dropping it removes everything it created.
#[derive(Debug)]
pub struct Lab {
    layout: Layout,
    description: ClusterDescription,
    options: LabOptions,
    state: LabState,
    supervisor: Supervisor,
    servers: Vec<ChildHandle>,
    /// False once torn down or kept.
    up: bool,
}

impl Lab {
    /// Brings up a lab for `description` with [`LabOptions::default`].
    pub fn up(description: ClusterDescription) -> Result<Lab> {
        Lab::up_with(description, LabOptions::default())
    }

    /// Brings up a lab for `description`: namespaces, topology, one backend per pod, all ready.
    ///
    /// On any error, what was created so far is removed before the error is returned.
    pub fn up_with(description: ClusterDescription, options: LabOptions) -> Result<Lab> {
        preflight::check()?;
        teardown::gc_before_up(&options.state_dir);
        // NB: allocate and register under the registry lock: a signal teardown sees the directory.
        let state = {
            let mut live = registry::lock();
            let state = LabState::allocate(&options.state_dir)?;
            registry::register(&mut live, &state);
            state
        };
        let id = state.id().to_owned();
        Lab::build(description, options, state).map_err(|source| LabError::BringUp {
            lab: id,
            source: Box::new(source),
        })
    }

    fn build(description: ClusterDescription, options: LabOptions, state: LabState) -> Result<Lab> {
        let planned = Layout::plan(state.id(), &description, &options).and_then(|layout| {
            let logs = state.logs_dir()?;
            Ok((layout, logs))
        });
        let (layout, logs) = match planned {
            Ok(planned) => planned,
            Err(error) => {
                registry::lock().remove(state.id());
                let _ = state.retire(false);
                return Err(error);
            }
        };
        // From here on, dropping `lab` (also on an early return) removes whatever exists.
        let supervisor = Supervisor::new(state.id(), logs);
        let mut lab = Lab {
            layout,
            description,
            options,
            state,
            supervisor,
            servers: Vec::new(),
            up: true,
        };
        lab.create_namespaces()?;
        for stage in &BuildScript::for_layout(&lab.layout).stages {
            netns::perform_stage(stage, BUILD_PARALLELISM)?;
        }
        lab.start_servers()?;
        Ok(lab)
    }

    /// Records the namespaces in the manifest, then creates them (under the registry lock, so a signal
    /// teardown runs before or after, never in between).
    fn create_namespaces(&self) -> Result<()> {
        let names = self.layout.all_netns();
        let _live = registry::lock();
        self.state.write_manifest(&Manifest::owned_by_me(names.clone()))?;
        netns::add_all(&names)
    }

    fn start_servers(&mut self) -> Result<()> {
        let mut pending = Vec::new();
        for pod in &self.layout.pods {
            if pod.tcp_ports.is_empty() && pod.udp_ports.is_empty() && pod.echo_ports.is_empty() {
                continue;
            }
            let mut argv = vec![
                self.options.lab_binary.to_string_lossy().into_owned(),
                "serve".into(),
                "--name".into(),
                pod.name.clone(),
                "--bind".into(),
                pod.ip.to_string(),
            ];
            for port in &pod.tcp_ports {
                argv.extend(["--tcp".to_owned(), port.to_string()]);
            }
            for port in &pod.udp_ports {
                argv.extend(["--udp".to_owned(), port.to_string()]);
            }
            for port in &pod.echo_ports {
                argv.extend(["--echo".to_owned(), port.to_string()]);
            }
            let label = format!("serve-{}", pod.name);
            let (handle, pipe) = self.supervisor.spawn(&pod.netns, &label, &argv, Stdout::Pipe)?;
            self.servers.push(handle.clone());
            pending.push((handle, pipe));
        }
        let deadline = Instant::now() + self.options.ready_timeout;
        for (handle, pipe) in pending {
            let Some(pipe) = pipe else { continue };
            handle.await_line(
                pipe,
                serve::READY,
                deadline.saturating_duration_since(Instant::now()),
            )?;
        }
        Ok(())
    }

    /// The lab id (prefix of every namespace name).
    pub fn id(&self) -> &str {
        self.state.id()
    }

    /// The lab's state directory (manifest, logs, plans).
    pub fn state_dir(&self) -> &Path {
        self.state.dir()
    }

    /// The description the lab was built from.
    pub fn description(&self) -> &ClusterDescription {
        &self.description
    }

    /// The full layout: every namespace, address and route.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The nodes, in description order.
    pub fn nodes(&self) -> &[LabNode] {
        &self.layout.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&LabNode> {
        self.layout.node(name)
    }

    /// The pods.
    pub fn pods(&self) -> &[LabPod] {
        &self.layout.pods
    }

    /// The pod called `name`.
    pub fn pod(&self, name: &str) -> Result<&LabPod> {
        self.layout.pod(name)
    }

    /// The external client.
    pub fn client(&self) -> &LabClient {
        &self.layout.client
    }

    /// The external client's address.
    pub fn client_ip(&self) -> Ipv4Addr {
        self.layout.client.ip
    }

    /// The backend processes, one per pod with ports.
    pub fn servers(&self) -> &[ChildHandle] {
        &self.servers
    }

    /// The namespace name of a place.
    pub fn netns(&self, place: &Place) -> Result<&str> {
        Ok(match place {
            Place::Node(name) => &self.layout.node(name)?.netns,
            Place::Pod(name) => &self.layout.pod(name)?.netns,
            Place::Client => &self.layout.client.netns,
            Place::Balancer => match &self.layout.balancer {
                Some(balancer) => &balancer.netns,
                None => {
                    return Err(LabError::UnknownPlace {
                        kind: "balancer",
                        name: "balancer".into(),
                        lab: self.id().to_owned(),
                    });
                }
            },
            Place::Fabric => &self.layout.fabric_netns,
        })
    }

    /// One probe from `from` to `dst`.
    pub fn probe(
        &self,
        from: &Place,
        proto: Proto,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<ProbeResult> {
        Ok(probe::probe(self.netns(from)?, proto, dst, timeout))
    }

    /// `n` probes in a row from `from` to `dst` (one thread, one connection each), counted.
    pub fn probe_many(
        &self,
        from: &Place,
        proto: Proto,
        dst: SocketAddr,
        n: usize,
        timeout: Duration,
    ) -> Result<ProbeTally> {
        Ok(probe::probe_many(self.netns(from)?, proto, dst, n, timeout))
    }

    /// Probes until one is answered or `timeout` passes (for waiting on rules being applied);
    /// returns the answer, or the last result seen.
    pub fn await_answer(
        &self,
        from: &Place,
        proto: Proto,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<ProbeResult> {
        let netns = self.netns(from)?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let result = probe::probe(netns, proto, dst, left.min(Duration::from_millis(500)));
            if result.is_answered() || Instant::now() + RETRY_PAUSE >= deadline {
                return Ok(result);
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Routes the client's traffic for `dst` through `node` (replacing any route for `dst`).
    pub fn client_route_via(&self, dst: Ipv4Net, node: &str) -> Result<()> {
        let via = self.layout.node(node)?.ip.to_string();
        let dst = dst.trunc().to_string();
        command::ip(
            &[
                "-n",
                &self.layout.client.netns,
                "route",
                "replace",
                &dst,
                "via",
                &via,
                "dev",
                UPLINK,
            ],
            None,
        )
        .map(drop)
    }

    /// Starts `argv` inside `at`'s namespace, logging to the lab's state directory; stopped at teardown.
    pub fn spawn_in(&self, at: &Place, argv: &[String]) -> Result<ChildHandle> {
        let program = argv.first().ok_or_else(|| LabError::Spawn {
            command: format!("an empty command in {at}"),
            source: std::io::ErrorKind::InvalidInput.into(),
        })?;
        let base = Path::new(program)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        let label = format!("{at}-{}", base.unwrap_or_default());
        self.supervisor
            .spawn(self.netns(at)?, &label, argv, Stdout::Log)
            .map(|(handle, _)| handle)
    }

    /// Runs `argv` to completion inside `at`'s namespace (e.g. `iptables-save`); any exit status is Ok.
    pub fn exec_in(&self, at: &Place, argv: &[String]) -> Result<Output> {
        let netns = self.netns(at)?;
        command::output(Command::new(IP).args(["netns", "exec", netns]).args(argv), None)
    }

    /// The options the lab was brought up with.
    pub fn options(&self) -> &LabOptions {
        &self.options
    }

    /// Where plans for this lab's agents are written (under the state directory).
    pub fn plans_dir(&self) -> Result<PathBuf> {
        self.state.plans_dir()
    }

    /// Runs the offline planner (the same code path as `switchyard-controller plan`) on `description`
    /// and writes `<dir>/<node>.yaml` for every lab node: the node's live NodeForwardingPlan and the
    /// ForwardingSlices of its views, exactly the objects the controller would write
    /// (`plan --objects --node`), so each agent composes them as it does from the API server. Call it
    /// again with a changed description to change what the agents apply.
    pub fn write_plans(
        &self,
        dir: &Path,
        description: &ClusterDescription,
        config: &switchyard_controller::Config,
    ) -> Result<Vec<PathBuf>> {
        use switchyard_controller::{
            output::{Format, Written, plan_object, serialize, slice_object},
            planner::{Planner, Snapshot},
        };
        let snapshot = Snapshot {
            services: description.services.clone(),
            slices: description.endpoint_slices.clone(),
            nodes: description.nodes.clone(),
        };
        let planner = Planner::build(&snapshot, config).map_err(|e| LabError::Planner {
            node: "*".into(),
            reason: e.to_string(),
        })?;
        self.write_plans_with(dir, |_, node| {
            let plan = planner
                .node_plan(&node.name)
                .ok_or_else(|| "node is not in the description".to_string())?;
            let mut objects: Vec<Written> = planner
                .slices(None)
                .into_iter()
                .filter(|(_, slice)| plan.views.contains(&slice.view))
                .map(|(name, slice)| Written::Slice(slice_object(&name, slice)))
                .collect();
            let uid = planner.node_info(&node.name).and_then(|n| n.uid.clone());
            objects.push(Written::Plan(plan_object(&node.name, uid.as_deref(), plan)));
            serialize(&objects, Format::Yaml).map_err(|e| e.to_string())
        })
    }

    /// Writes `<dir>/<node>.yaml` for every lab node with the text `plan(description, node)` returns
    /// (any planner, until [`Lab::write_plans`] is wired); returns the paths in node order.
    pub fn write_plans_with<F>(&self, dir: &Path, mut plan: F) -> Result<Vec<PathBuf>>
    where
        F: FnMut(&ClusterDescription, &LabNode) -> std::result::Result<String, String>,
    {
        let mut paths = Vec::with_capacity(self.layout.nodes.len());
        for node in &self.layout.nodes {
            let text = plan(&self.description, node).map_err(|reason| LabError::Planner {
                node: node.name.clone(),
                reason,
            })?;
            let path = dir.join(format!("{}.yaml", node.name));
            std::fs::write(&path, text).map_err(|source| LabError::File {
                action: "writing plan",
                path: path.clone(),
                source,
            })?;
            paths.push(path);
        }
        Ok(paths)
    }

    /// A human-readable topology summary.
    pub fn summary(&self) -> String {
        format!(
            "lab {} (state in {})\n{}",
            self.id(),
            self.state_dir().display(),
            self.layout.summary()
        )
    }

    /// Leaves the lab up after this value is gone (marked `kept` in its manifest); returns its id.
    /// Remove it later with `switchyard-lab down ID`.
    pub fn keep(mut self) -> Result<String> {
        let mut manifest = self.state.read_manifest()?.unwrap_or_default();
        manifest.kept = true;
        // NB: no owner: gc leaves it alone while its processes run (see teardown::gc_decision).
        manifest.owner = None;
        self.state.write_manifest(&manifest)?;
        self.supervisor.detach_all();
        registry::lock().remove(self.id());
        self.up = false;
        Ok(self.id().to_owned())
    }

    /// Tears the lab down now, reporting what could not be removed.
    pub fn down(mut self) -> Result<()> {
        self.shutdown(false)
    }

    fn shutdown(&mut self, keep_logs: bool) -> Result<()> {
        if !self.up {
            return Ok(());
        }
        self.up = false;
        self.supervisor.stop_all(STOP_GRACE);
        // NB: tear down with the registry locked, so an interrupt waits for this teardown to finish.
        let mut live = registry::lock();
        live.remove(self.id());
        teardown::teardown(&self.state, keep_logs)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let was_up = self.up;
        if let Err(error) = self.shutdown(panicking) {
            eprintln!("switchyard-lab: {error}");
        }
        if panicking && was_up {
            eprintln!(
                "switchyard-lab: lab {} torn down; logs kept in {}",
                self.id(),
                self.state_dir().display()
            );
        }
    }
}
