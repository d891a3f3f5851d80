//! Switchyard running in the lab: plans from the offline planner, one agent per node in its namespace.
//!
//! ```text
//! ClusterDescription ─► Lab::up ─► Lab::write_plans (planner) ─► <state>/plans/<node>.yaml
//!      one agent per node: `switchyard-lab agent run --plan-file … --status-file …` inside <id>-node-*
//!      ─► <state>/status/<node>.yaml (the CRD's status struct) ─► wait_applied / table
//! replan(new description) ─► plan files rewritten ─► agents re-apply (partial syncs) ─► wait_applied
//! reconfigure(config) ─► the same description planned with another controller configuration
//! change_node(name, edit) ─► the Node edited in the description (a taint, a deletionTimestamp) ─► replan
//!                          ─► when the plan files were written, for "within N s of its plan" bounds
//! ```

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::Node;
use switchyard_api::{NodeForwardingPlan, NodeForwardingPlanStatus, conditions};
use switchyard_controller::Config;

use crate::{
    ClusterDescription, Lab, LabOptions, Place,
    error::{LabError, Result},
    supervisor::ChildHandle,
};

/// How long agents get to apply a plan before a wait fails.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The lab with plans and agents.
pub struct Deployed {
    /// The lab.
    pub lab: Lab,
    config: Config,
    description: ClusterDescription,
    plans: PathBuf,
    statuses: PathBuf,
    agents: BTreeMap<String, ChildHandle>,
    agent_args: Vec<String>,
}

/// Options of the agents (short periods suit tests; the demo uses the same).
pub fn default_agent_args() -> Vec<String> {
    [
        "--min-sync-interval",
        "100ms",
        "--poll-interval",
        "100ms",
        "--resync-period",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Deployed {
    /// Brings up the lab, plans, starts the agents and waits until every node applied its plan.
    pub fn up(description: ClusterDescription, config: Config, options: LabOptions) -> Result<Self> {
        Self::up_with_agent_args(description, config, options, default_agent_args())
    }

    /// As [`Deployed::up`], with extra agent flags.
    pub fn up_with_agent_args(
        description: ClusterDescription,
        config: Config,
        options: LabOptions,
        agent_args: Vec<String>,
    ) -> Result<Self> {
        let lab = Lab::up_with(description.clone(), options)?;
        let plans = lab.plans_dir()?;
        let statuses = plans.with_file_name("status");
        std::fs::create_dir_all(&statuses).map_err(|source| LabError::File {
            action: "creating",
            path: statuses.clone(),
            source,
        })?;
        lab.write_plans(&plans, &description, &config)?;
        let mut deployed = Self {
            lab,
            config,
            description,
            plans,
            statuses,
            agents: BTreeMap::new(),
            agent_args,
        };
        let nodes: Vec<String> = deployed.lab.nodes().iter().map(|n| n.name.clone()).collect();
        for node in nodes {
            deployed.start_agent(&node)?;
        }
        deployed.wait_applied(APPLY_TIMEOUT)?;
        Ok(deployed)
    }

    /// The plan file of a node.
    pub fn plan_path(&self, node: &str) -> PathBuf {
        self.plans.join(format!("{node}.yaml"))
    }

    /// The status file a node's agent writes.
    pub fn status_path(&self, node: &str) -> PathBuf {
        self.statuses.join(format!("{node}.yaml"))
    }

    /// The description currently planned.
    pub fn description(&self) -> &ClusterDescription {
        &self.description
    }

    /// Starts (or restarts) the agent of a node.
    pub fn start_agent(&mut self, node: &str) -> Result<()> {
        if let Some(old) = self.agents.remove(node) {
            old.stop(Duration::from_secs(5));
        }
        let mut argv = vec![
            self.lab.options().lab_binary.display().to_string(),
            "agent".into(),
            "run".into(),
            "--plan-file".into(),
            self.plan_path(node).display().to_string(),
            "--status-file".into(),
            self.status_path(node).display().to_string(),
        ];
        argv.extend(self.agent_args.iter().cloned());
        let handle = self.lab.spawn_in(&Place::node(node), &argv)?;
        self.agents.insert(node.to_string(), handle);
        Ok(())
    }

    /// Stops a node's agent (its rules stay in the kernel).
    pub fn stop_agent(&mut self, node: &str) {
        if let Some(agent) = self.agents.remove(node) {
            agent.stop(Duration::from_secs(5));
        }
    }

    /// The agent of a node (logs, liveness).
    pub fn agent(&self, node: &str) -> Option<&ChildHandle> {
        self.agents.get(node)
    }

    /// Plans `description` and waits until every agent applied it.
    pub fn replan(&mut self, description: ClusterDescription) -> Result<()> {
        self.replan_at(description).map(drop)
    }

    /// Plans the same description with another controller configuration (a detector mode, the
    /// Service ranges, an exposure policy) and waits until every agent applied it.
    pub fn reconfigure(&mut self, config: Config) -> Result<()> {
        self.config = config;
        self.replan_at(self.description.clone()).map(drop)
    }

    /// The controller configuration the plans come from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Edits the Node `name` of the planned description (as the API server would change it: a taint,
    /// a label, a deletionTimestamp), re-plans, and waits until every agent applied the result.
    /// Returns when the new plan files began to be written: what a node does "within N s of its plan"
    /// is measured from there.
    pub fn change_node(&mut self, name: &str, edit: impl FnOnce(&mut Node)) -> Result<SystemTime> {
        let mut description = self.description.clone();
        let node = description
            .nodes
            .iter_mut()
            .find(|node| node.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| LabError::UnknownPlace {
                kind: "node",
                name: name.to_string(),
                lab: self.lab.id().to_string(),
            })?;
        edit(node);
        self.replan_at(description)
    }

    /// Plans and writes `description`, waits until it is applied; returns when writing began.
    fn replan_at(&mut self, description: ClusterDescription) -> Result<SystemTime> {
        let written = SystemTime::now();
        self.lab.write_plans(&self.plans, &description, &self.config)?;
        self.description = description;
        self.wait_applied(APPLY_TIMEOUT)?;
        Ok(written)
    }

    /// Writes a plan file as given (for bad-input tests) without waiting.
    pub fn write_raw_plan(&self, node: &str, text: &str) -> Result<()> {
        let path = self.plan_path(node);
        std::fs::write(&path, text).map_err(|source| LabError::File {
            action: "writing plan",
            path,
            source,
        })
    }

    /// The plan objects in a node's plan file.
    pub fn plan(&self, node: &str) -> Result<Vec<NodeForwardingPlan>> {
        let (plan, _) = self.composed(node)?;
        Ok(vec![plan])
    }

    /// What a node's plan file makes its agent forward: the plan composed with the file's slices (as
    /// the agent composes them), self-contained, with the digest of the slices used (`None` for a
    /// self-contained plan file).
    pub fn composed(&self, node: &str) -> Result<(NodeForwardingPlan, Option<String>)> {
        use switchyard_agent::sync::{Composition, LastGood, compose_plan};
        let path = self.plan_path(node);
        let loaded = switchyard_agent::planfile::read_plan_file(&path)
            .map_err(|e| LabError::ParseDescription(e.to_string()))?;
        match compose_plan(&loaded.plan, &loaded.slices, &mut LastGood::default()) {
            Composition::Ready { spec, slices, .. } => Ok((
                NodeForwardingPlan::new(node, (*spec).clone()),
                slices.map(|s| s.digest),
            )),
            Composition::Incomplete(why) => {
                Err(LabError::ParseDescription(format!("{}: {why}", path.display())))
            }
        }
    }

    /// The status a node's agent last wrote.
    pub fn status(&self, node: &str) -> Result<Option<NodeForwardingPlanStatus>> {
        let path = self.status_path(node);
        if !path.exists() {
            return Ok(None);
        }
        let text = read(&path)?;
        serde_saphyr::from_str(&text)
            .map(Some)
            .map_err(|e| LabError::ParseDescription(format!("{}: {e}", path.display())))
    }

    /// Waits until every node reports its plan's revision applied.
    pub fn wait_applied(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for node in self.agents.keys() {
            loop {
                let (plan, digest) = self.composed(node)?;
                let want = Some(plan.spec.revision.clone());
                let status = self.status(node).ok().flatten();
                let applied = status
                    .as_ref()
                    .is_some_and(|s| reports_applied(s, &plan.spec.revision, digest.as_deref()));
                if applied {
                    break;
                }
                if let Some(agent) = self.agents.get(node)
                    && !agent.is_running()
                {
                    return Err(LabError::Agent {
                        node: node.clone(),
                        detail: format!("exited; stderr:\n{}", agent.stderr()),
                    });
                }
                if Instant::now() > deadline {
                    let detail = format!(
                        "plan {want:?} not applied; status: {status:?}; agent stderr (tail):\n{}",
                        tail(
                            &self.agents.get(node).map(ChildHandle::stderr).unwrap_or_default(),
                            30
                        )
                    );
                    return Err(LabError::Agent {
                        node: node.clone(),
                        detail,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// `kubectl get nfp` for the lab: each node's plan objects with the status its agent wrote.
    pub fn table(&self, wide: bool) -> Result<String> {
        let mut objects = Vec::new();
        for node in self.agents.keys() {
            for (index, mut plan) in self.plan(node)?.into_iter().enumerate() {
                if index == 0 {
                    plan.status = self.status(node)?;
                }
                if let Ok(value) = serde_json::to_value(&plan) {
                    objects.push(value);
                }
            }
        }
        Ok(switchyard_controller::output::table(&objects, wide))
    }

    /// Leaves the lab and its agents running after this process; returns the lab id.
    pub fn keep(self) -> Result<String> {
        self.lab.keep()
    }

    /// Runs a command in a node's namespace (e.g. `iptables-save`).
    pub fn exec_in_node(&self, node: &str, argv: &[&str]) -> Result<std::process::Output> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        self.lab.exec_in(&Place::node(node), &argv)
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| LabError::File {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// True when an agent's status says it applied plan `revision` with the slices of `digest` (`None`: a
/// self-contained plan), and the Applied condition holds.
pub fn reports_applied(status: &NodeForwardingPlanStatus, revision: &str, digest: Option<&str>) -> bool {
    status.observed_revision.as_deref() == Some(revision)
        && status.observed_slices.as_ref().map(|o| o.digest.as_str()) == digest
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::APPLIED && c.status == conditions::status::TRUE)
}
