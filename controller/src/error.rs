//! The one error type of the controller crate.

/// What failed in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    ReadFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A cluster dump could not be parsed.
    #[error("{path}: {message}")]
    ParseInput {
        /// The file.
        path: String,
        /// What and where (line/column or item index).
        message: String,
    },
    /// The configuration file is invalid.
    #[error("{path}: invalid configuration:\n  {}", problems.join("\n  "))]
    InvalidConfig {
        /// The file.
        path: String,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// A plan could not be serialised.
    #[error("serialising plans: {0}")]
    Serialize(String),
    /// The API crate failed (hashing, CRD generation).
    #[error(transparent)]
    Api(#[from] switchyard_api::Error),
    /// A node's plan and its slices do not compose (a planner bug; never expected).
    #[error("composing a node's plan: {0}")]
    Compose(String),
    /// Server-side apply of a plan or slice failed.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        /// `NodeForwardingPlan` or `ForwardingSlice`.
        kind: &'static str,
        /// The object.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Deleting a plan or slice failed.
    #[error("deleting {kind} {name}: {source}")]
    Delete {
        /// `NodeForwardingPlan` or `ForwardingSlice`.
        kind: &'static str,
        /// The object.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Listing objects for an audit failed.
    #[error("listing {kind}: {source}")]
    List {
        /// What was listed.
        kind: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Reading a Node failed.
    #[error("reading node {name}: {source}")]
    GetNode {
        /// The node.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Server-side apply of a rollout's status failed.
    #[error("writing the status of ForwardingRollout {name}: {source}")]
    RolloutStatus {
        /// The rollout.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Setting or removing a Node's backend label failed.
    #[error("setting the label {key} of node {node}: {source}")]
    NodeLabel {
        /// The node.
        node: String,
        /// The label.
        key: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// This replica lost the leader lease while writing.
    #[error("not the leader")]
    NotLeader,
    /// No Kubernetes client could be built (kubeconfig or in-cluster config).
    #[error("connecting to the API server: {0}")]
    Connect(String),
    /// The metrics and health address could not be bound; the shared edge words it.
    #[error(transparent)]
    Serve(switchyard_process::Error),
    /// `kubectl switchyard`: the kubeconfig has no context of that name.
    #[error("context \"{context}\" does not exist in the kubeconfig (its contexts: {known})")]
    NoSuchContext {
        /// The context asked for.
        context: String,
        /// Those the kubeconfig has.
        known: String,
    },
    /// `kubectl switchyard`: the API server refused a read; its Status message says why, in the
    /// objects' own words (`nodes "x" not found`).
    #[error("reading {what}: {message}")]
    Read {
        /// What was read.
        what: String,
        /// The API server's words, or the client's when no answer came.
        message: String,
        /// The HTTP status code (404: not found), 0 without an answer.
        code: u16,
    },
    /// `kubectl switchyard`: the node has no agent pod.
    #[error(
        "no switchyard agent pod on node {node} in namespace {namespace} (pods labelled {selector}): is \
         the agent DaemonSet installed in that namespace (-n names it), and does it tolerate the node?"
    )]
    NoAgentPod {
        /// The node.
        node: String,
        /// Where the pods were looked for.
        namespace: String,
        /// The label selector.
        selector: String,
    },
    /// `kubectl switchyard`: the node's agent pod cannot run a command.
    #[error("the agent pod {pod} on node {node} is not running: {why}")]
    AgentPodNotRunning {
        /// namespace/name.
        pod: String,
        /// The node.
        node: String,
        /// Its phase and its container's state, in the pod's words.
        why: String,
    },
    /// `kubectl switchyard`: running a command in an agent pod failed (not the command itself).
    #[error("running switchyard-agent in pod {pod}: {cause}")]
    Exec {
        /// namespace/name.
        pod: String,
        /// Why.
        cause: String,
    },
}

impl Error {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ReadFile { .. } => "read_file",
            Self::ParseInput { .. } => "parse_input",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::Serialize(_) => "serialize",
            Self::Api(_) => "api",
            Self::Compose(_) => "compose",
            Self::Apply { .. } => "apply",
            Self::Delete { .. } => "delete",
            Self::List { .. } => "list",
            Self::GetNode { .. } => "get_node",
            Self::RolloutStatus { .. } => "rollout_status",
            Self::NodeLabel { .. } => "node_label",
            Self::NotLeader => "not_leader",
            Self::Connect(_) => "connect",
            Self::Serve(_) => "serve",
            Self::NoSuchContext { .. } => "no_such_context",
            Self::Read { .. } => "read",
            Self::NoAgentPod { .. } => "no_agent_pod",
            Self::AgentPodNotRunning { .. } => "agent_pod_not_running",
            Self::Exec { .. } => "exec",
        }
    }
}
