//! The one error type of this crate.
//!
//! Variants are named after what failed. Add variants here as the edges grow (netlink, status writes,
//! the API server); keep `metric_label` in step so failures can be counted by kind.

use std::path::PathBuf;

/// What failed in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tracer's model of `iptables-restore` rejected a payload, as the kernel would have.
    #[error("simulated iptables-restore failed at line {line}: {reason}")]
    SimulatedRestore {
        /// 1-based line of the payload (0 for the built-in jump rules).
        line: usize,
        /// Why.
        reason: String,
    },
    /// The tracer could not follow a packet through the modelled rules.
    #[error("tracing a packet: {0}")]
    TracePacket(String),
    /// `iptables-restore` (or `ip6tables-restore`) refused a payload; the kernel kept its old rules.
    #[error("{binary} failed{}: {stderr}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    IptablesRestore {
        /// The binary that ran.
        binary: String,
        /// The failing payload line, when its stderr names one.
        line: Option<usize>,
        /// Its stderr, trimmed.
        stderr: String,
        /// The payload lines around the failing one, numbered (empty when no line is known).
        context: String,
    },
    /// A command could not be started, or its output could not be read.
    #[error("running {command}: {source}")]
    RunCommand {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command exited with an unexpected status.
    #[error("{command} exited with {status}: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// The exit status, as the OS reports it.
        status: String,
        /// Its stderr, trimmed.
        stderr: String,
    },
    /// No usable iptables binaries were found.
    #[error("no usable iptables: {0}")]
    FindIptables(String),
    /// The node's local addresses could not be listed over rtnetlink.
    #[error("listing local addresses over rtnetlink: {0}")]
    ListAddresses(String),
    /// Output of `conntrack -L` could not be understood.
    #[error("parsing conntrack output line {line:?}: {reason}")]
    ParseConntrack {
        /// The line.
        line: String,
        /// Why.
        reason: String,
    },
    /// A plan file could not be read.
    #[error("reading plan file {path}: {source}")]
    ReadPlan {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A plan file could not be parsed as a NodeForwardingPlan object, a list or multi-document
    /// YAML of them, or a bare spec.
    #[error("parsing plan file {path}: {message}")]
    ParsePlan {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The status could not be serialised.
    #[error("serialising the status: {0}")]
    SerializeStatus(String),
    /// The status file could not be written.
    #[error("writing status file {path}: {source}")]
    WriteStatus {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A health-check node port could not be bound.
    #[error("health check node port {port}: {source}")]
    BindHealthCheck {
        /// The port.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime or a signal handler could not be set up.
    #[error("starting the runtime: {0}")]
    StartRuntime(#[source] std::io::Error),
    /// The plan asks for a backend this agent cannot program yet.
    #[error("backend {0} is not implemented by this agent yet")]
    UnsupportedBackend(switchyard_api::Backend),
}

impl Error {
    /// A short, stable label for failure metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SimulatedRestore { .. } => "simulated_restore",
            Self::TracePacket(_) => "trace_packet",
            Self::IptablesRestore { .. } => "iptables_restore",
            Self::RunCommand { .. } => "run_command",
            Self::CommandFailed { .. } => "command_failed",
            Self::FindIptables(_) => "find_iptables",
            Self::ListAddresses(_) => "list_addresses",
            Self::ParseConntrack { .. } => "parse_conntrack",
            Self::ReadPlan { .. } => "read_plan",
            Self::ParsePlan { .. } => "parse_plan",
            Self::SerializeStatus(_) => "serialize_status",
            Self::WriteStatus { .. } => "write_status",
            Self::BindHealthCheck { .. } => "bind_health_check",
            Self::StartRuntime(_) => "start_runtime",
            Self::UnsupportedBackend(_) => "unsupported_backend",
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
