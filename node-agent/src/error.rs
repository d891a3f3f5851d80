//! The one error type of this crate.
//!
//! Variants are named after what failed. Add variants here as the edges grow (netlink, status writes,
//! the API server); keep `metric_label` in step so failures can be counted by kind.

use std::path::PathBuf;

/// What failed in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rule model behind `explain` (and the tests' iptables fake) refused a payload or a saved
    /// table, as the kernel would have, or because it holds a rule the model does not understand.
    #[error("the iptables rule model refused line {line}: {reason}")]
    ModelRestore {
        /// 1-based line of the payload (0 for the built-in jump rules).
        line: usize,
        /// Why.
        reason: String,
    },
    /// `explain` could not follow a packet through the modelled rules.
    #[error("tracing a packet: {0}")]
    ModelTrace(String),
    /// `explain` was asked about a Service the plan does not have (or names ambiguously).
    #[error("{0}")]
    ExplainDestination(String),
    /// `explain` was asked about a connection between two IP families.
    #[error("the source {from} and the destination {to} are of different IP families")]
    ExplainFamilies {
        /// The source.
        from: std::net::IpAddr,
        /// The destination.
        to: std::net::IpAddr,
    },
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
    #[error("listing local addresses over rtnetlink: {source}")]
    ListAddresses {
        /// Why (the I/O, netlink or thread failure).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
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
    SerializeStatus(#[source] serde_saphyr::SerializeError),
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
    /// The async runtime could not be set up.
    #[error("starting the runtime: {0}")]
    StartRuntime(#[source] std::io::Error),
    /// The kernel has no usable IPVS (module missing and not loadable).
    #[error("IPVS is unavailable: {0}")]
    IpvsUnavailable(String),
    /// An IPVS generic-netlink request failed.
    #[error("IPVS {operation}: {reason}")]
    IpvsRequest {
        /// What was asked (`add service tcp 10.96.0.10:80`, ...).
        operation: String,
        /// The errno the kernel answered with, if it answered.
        errno: Option<i32>,
        /// Why.
        reason: String,
    },
    /// Output of `ipset save` could not be understood.
    #[error("parsing ipset output line {line:?}: {reason}")]
    ParseIpset {
        /// The line.
        line: String,
        /// Why.
        reason: String,
    },
    /// A sysctl could not be read or written.
    #[error("sysctl {path}: {source}")]
    Sysctl {
        /// The file under /proc/sys.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A sysctl holds something that is not the number it should be.
    #[error("sysctl {sysctl} holds {value:?}, not a number")]
    SysctlValue {
        /// The sysctl (`net.netfilter.nf_conntrack_max`).
        sysctl: String,
        /// What it holds.
        value: String,
    },
    /// The dummy interface holding the service IPs could not be read or changed over rtnetlink.
    #[error("service address interface {interface}: {reason}")]
    ServiceInterface {
        /// The interface name.
        interface: String,
        /// Why.
        reason: String,
    },
    /// The plan cache could not be written (or removed).
    #[error("writing the plan cache {path}: {source}")]
    WriteCache {
        /// The cache file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The plan cache could not be read or used.
    #[error("reading the plan cache {path}: {message}")]
    ReadCache {
        /// The cache file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The status could not be written to the plan through the API server.
    #[error("writing the status of plan {name}: {source}")]
    WriteStatusToApi {
        /// The plan object.
        name: String,
        /// Why.
        #[source]
        source: Box<kube::Error>,
    },
    /// The metrics and health address could not be bound; the shared edge words it.
    #[error(transparent)]
    BindMetrics(switchyard_process::Error),
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error(transparent)]
    Signals(switchyard_process::Error),
    /// No Kubernetes client could be made (kubeconfig or in-cluster); the shared edge words it.
    #[error(transparent)]
    KubeConfig(switchyard_process::Error),
    /// The API server did not answer at the address the kubelet gave, on a node with no plan cached
    /// (the message says what to configure).
    #[error("{0}")]
    ReachApiServer(String),
    /// Reading a plan or its slices from the API server failed (`explain --node`).
    #[error("reading {what} from the API server: {source}")]
    FetchPlan {
        /// The object or list.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// `nft -f` refused a transaction; the kernel kept its previous ruleset.
    #[error("nft -f refused the {family} transaction{}: {stderr}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    NftTransaction {
        /// `ip` or `ip6`.
        family: String,
        /// The failing line of the transaction, when nft names one.
        line: Option<usize>,
        /// Its stderr, trimmed.
        stderr: String,
        /// The transaction lines around the failing one, numbered (empty when no line is known).
        context: String,
    },
    /// Our nftables table could not be read back (`nft -j list table`).
    #[error("reading the {family} nftables table back: {reason}")]
    NftListing {
        /// `ip` or `ip6`.
        family: String,
        /// Why.
        reason: String,
    },
    /// An nf_tables netlink dump (the cheap drift check) failed.
    #[error("nftables netlink, {operation}: {reason}")]
    NftNetlink {
        /// What was being listed.
        operation: String,
        /// Why.
        reason: String,
    },
    /// No usable `nft` binary was found.
    #[error("no usable nft: {0}")]
    FindNft(String),
    /// A dual-stack sync failed for one family after the other was applied.
    #[error("{source} ({applied} already has the new rules; the failed family keeps its previous ones)")]
    FamiliesPartlyApplied {
        /// The families already programmed (`IPv4`).
        applied: String,
        /// Why the next family failed.
        source: Box<Error>,
    },
}

impl Error {
    /// The payload line a restore failed on, as the kernel tool saw it (without its number).
    pub fn failing_line(&self) -> Option<&str> {
        let Self::IptablesRestore { context, .. } = self.root() else {
            return None;
        };
        let marked = context.lines().find(|l| l.starts_with('>'))?;
        let numbered = marked.trim_start_matches('>').trim_start();
        Some(numbered.split_once(' ').map_or("", |(_, text)| text))
    }

    /// The underlying failure (for a dual-stack sync that failed after one family applied, the
    /// failing family's error).
    pub fn root(&self) -> &Error {
        match self {
            Self::FamiliesPartlyApplied { source, .. } => source.root(),
            other => other,
        }
    }

    /// The exit code a command ends with on this error (`switchyard_process::exit`): an unusable
    /// kubeconfig or a plan file that cannot be read or is invalid is wrong input; the rest failed
    /// while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::KubeConfig(edge) => edge.exit_code(),
            Self::ReadPlan { .. } | Self::ParsePlan { .. } => switchyard_process::exit::USAGE,
            _ => switchyard_process::exit::FAILED,
        }
    }

    /// A short, stable label for failure metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ModelRestore { .. } => "model_restore",
            Self::ModelTrace(_) => "model_trace",
            Self::ExplainDestination(_) | Self::ExplainFamilies { .. } => "explain",
            Self::IptablesRestore { .. } => "iptables_restore",
            Self::RunCommand { .. } => "run_command",
            Self::CommandFailed { .. } => "command_failed",
            Self::FindIptables(_) => "find_iptables",
            Self::ListAddresses { .. } => "list_addresses",
            Self::ParseConntrack { .. } => "parse_conntrack",
            Self::ReadPlan { .. } => "read_plan",
            Self::ParsePlan { .. } => "parse_plan",
            Self::SerializeStatus(_) => "serialize_status",
            Self::WriteStatus { .. } => "write_status",
            Self::BindHealthCheck { .. } => "bind_health_check",
            Self::StartRuntime(_) => "start_runtime",
            Self::IpvsUnavailable(_) => "ipvs_unavailable",
            Self::IpvsRequest { .. } => "ipvs_request",
            Self::ParseIpset { .. } => "parse_ipset",
            Self::ServiceInterface { .. } => "service_interface",
            Self::Sysctl { .. } | Self::SysctlValue { .. } => "sysctl",
            Self::WriteCache { .. } => "write_cache",
            Self::ReadCache { .. } => "read_cache",
            Self::WriteStatusToApi { .. } => "write_status_to_api",
            Self::BindMetrics(_) => "bind_metrics",
            Self::Signals(_) => "signals",
            Self::KubeConfig(_) => "kube_config",
            Self::ReachApiServer(_) => "reach_api_server",
            Self::FetchPlan { .. } => "fetch_plan",
            Self::NftTransaction { .. } => "nft_transaction",
            Self::NftListing { .. } => "nft_listing",
            Self::NftNetlink { .. } => "nft_netlink",
            Self::FindNft(_) => "find_nft",
            Self::FamiliesPartlyApplied { source, .. } => source.metric_label(),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
