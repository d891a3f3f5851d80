//! The one error type of the lab crate.
//!
//! Every fallible step of the lab (reading the cluster description, laying out the topology, running
//! `ip`, entering a namespace, supervising processes, tearing down) returns a [`LabError`] naming what
//! failed and, where it helps, the namespace or command involved.

use std::path::PathBuf;

/// What failed in the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The process is not root, or iproute2 is missing: the lab cannot build namespaces.
    #[error("the lab needs root and iproute2: {0}")]
    Preflight(String),
    /// Bringing up lab `lab` failed; what it had created is already removed.
    #[error("bringing up lab {lab}: {source}")]
    BringUp {
        /// The lab id.
        lab: String,
        /// What failed.
        #[source]
        source: Box<LabError>,
    },
    /// The cluster description file could not be read.
    #[error("reading the cluster description {path}: {source}")]
    ReadDescription {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The cluster description is not valid YAML of the expected Kubernetes kinds.
    #[error("parsing the cluster description: {0}")]
    ParseDescription(String),
    /// The description parsed but cannot be turned into a lab (missing node IP, pod on no node, …).
    #[error("the cluster description cannot be built as a lab: {0}")]
    Layout(String),
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Something that would touch what is not the lab's own, refused.
    #[error("refused: {0}")]
    Refused(String),
    /// A traffic flow names a destination that is not `IP:PORT`.
    #[error("traffic flow destination {0:?} is not IP:PORT")]
    FlowDestination(String),
    /// A name used by a lab API (node, pod) is not part of this lab.
    #[error("no {kind} named {name:?} in lab {lab}")]
    UnknownPlace {
        /// `node` or `pod`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The lab id.
        lab: String,
    },
    /// A node's agent did not apply its plan (or exited).
    #[error("agent on {node}: {detail}")]
    Agent {
        /// The node.
        node: String,
        /// What was seen.
        detail: String,
    },
    /// A command could not be started.
    #[error("starting `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// A socket of a lab backend could not be set up.
    #[error("{what}: {source}")]
    Socket {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Entering a network namespace failed.
    #[error("entering network namespace {netns}: {reason}")]
    EnterNetns {
        /// The namespace name.
        netns: String,
        /// Why.
        reason: String,
    },
    /// A file of the lab's own state (manifest, logs, sysctls) could not be read or written.
    #[error("{action} {path}: {source}")]
    File {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Something the lab waits for did not happen in time.
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited_ms: u128,
    },
    /// A supervised process exited before it became ready.
    #[error("{what} exited before it was ready ({status}); stderr: {stderr}")]
    ExitedEarly {
        /// The process.
        what: String,
        /// Its exit status.
        status: String,
        /// The tail of its stderr.
        stderr: String,
    },
    /// No lab with this id exists on this machine.
    #[error("no lab {0} (no manifest under the lab directory)")]
    NoSuchLab(String),
    /// No free lab id could be found.
    #[error("could not allocate a lab id: {0}")]
    AllocateId(String),
    /// The planner given to `Lab::write_plans_with` failed for a node.
    #[error("planning node {node}: {reason}")]
    Planner {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The outside load balancer was asked for something it cannot do (no frontend, no node, …).
    #[error("the balancer's configuration: {0}")]
    BalancerConfig(String),
    /// A line of the balancer's log is not one of its events.
    #[error("reading the balancer's log: line {line}: {reason}")]
    BalancerLog {
        /// The line number.
        line: usize,
        /// Why.
        reason: String,
    },
    /// A worker thread of the lab panicked.
    #[error("a lab worker thread panicked while {0}")]
    ThreadPanicked(String),
    /// The signal-handling thread could not be started.
    #[error("installing the SIGINT/SIGTERM teardown handler: {0}")]
    Signals(String),
    /// A step of bringing up or using a lab cluster (kubelets, containerd, the control plane) failed.
    #[error("lab cluster: {what}: {detail}")]
    Kube {
        /// What was being done.
        what: String,
        /// What was seen.
        detail: String,
    },
    /// Teardown left things behind.
    #[error("teardown of lab {lab} was incomplete: {problems}")]
    Teardown {
        /// The lab id.
        lab: String,
        /// What could not be removed.
        problems: String,
    },
}

/// The lab crate's result type.
pub type Result<T, E = LabError> = std::result::Result<T, E>;
