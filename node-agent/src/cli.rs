//! The command line: `render`, `apply`, `run`, `cleanup`.
//!
//! ```text
//! args ─► clap ─► Command ─┬─ render  ─► plan file ─► validate ─► render() per family ─► stdout (payloads, jump rules)
//!                          ├─ apply   ─► plan file ─► Syncer (real iptables) one full sync ─► status YAML on stdout
//!                          ├─ run     ─► --node-name: own plan from the API server (cache first, status
//!                          │              written back) | --plan-file: a plan file ─► run::run loop until
//!                          │              SIGTERM/SIGINT (rules stay); /healthz /readyz /metrics on :10263
//!                          ├─ cleanup ─► every SWYD-* chain and jump rule removed (both families), IPVS
//!                          │              objects, the nftables tables ip/ip6 switchyard
//!                          └─ set-sysctls ─► conntrack's timeouts as run/apply keep them (conntrack::settings),
//!                                            what was found and done on stdout (an init container's job)
//! exit: the table both binaries share (switchyard_process::exit), printed by every `--help`
//! ```
//!
//! [`run_cli`] is the whole program, so another binary can embed the agent; `main.rs` only calls it.
//! Logs go to stderr (text or JSON, filtered by `RUST_LOG`; by default `info` for `run`, `warn` for the
//! one-shot commands, whose output is their answer); stdout carries only the command's output.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use switchyard_api::validate::validate;
use switchyard_api::{Backend, NodeForwardingPlanSpec};
use switchyard_process::exit::{self, FAILED, NO, USAGE, fail, print_stdout};
use switchyard_process::http::parse_bind;
use switchyard_process::{LogFormat, init_logging_at};

use crate::conntrack::{CliConntrack, ConntrackSettings};
use crate::error::Error;
use crate::planfile::{read_plan_file, status_yaml};
use crate::probe::{LocalAddrs, NetlinkAddrs};
use crate::run::RunConfig;
use crate::run::grace::GracePeriod;
use crate::source::cache::cache_path;
use crate::start::{PlanFrom, run_agent};
use crate::sync::{
    Composition, LastGood, SyncConfig, SyncMetrics, SyncResult, Syncer, SystemClock, compose_plan,
};
use crate::sysctl::{ProcSysctls, Sysctls};
use crate::xtables::exec::ExecIptables;
use crate::xtables::mode::IptablesMode;

#[derive(Parser, Debug)]
#[command(
    name = "switchyard-agent",
    version,
    about = "Programs this node's NodeForwardingPlan into the kernel and reports what it applied",
    after_help = exit::TABLE,
    // Colour only on a terminal: never escape codes in a file or a pod's log.
    color = clap::ColorChoice::Auto
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print exactly what would be programmed for a plan, touching nothing.
    #[command(after_help = exit::TABLE)]
    Render(RenderArgs),
    /// Apply a plan once (a full sync) and print the resulting status. Needs root (CAP_NET_ADMIN and
    /// CAP_NET_RAW): it programs this host's kernel. One try: a failure is reported, not retried.
    #[command(after_help = exit::TABLE)]
    Apply(ApplyArgs),
    /// Apply a plan file, re-apply it when it changes, repair drift; until SIGTERM/SIGINT.
    // Boxed: its flags are many times the size of every other command's.
    #[command(after_help = exit::TABLE)]
    Run(Box<RunArgs>),
    /// Remove everything the agent owns, in both families: iptables jump rules and SWYD-* chains
    /// (iptables-nft and iptables-legacy), the nftables tables, IPVS virtual servers, ipsets and the dummy
    /// interface.
    #[command(after_help = exit::TABLE)]
    Cleanup(CleanupArgs),
    /// Explain the path a new connection takes on this node, in words: frontend, policy, endpoints,
    /// masquerade, REJECT/DROP. Exit 0 forwarded, 3 rejected/dropped/not a Service, 2 bad input.
    #[command(after_help = exit::TABLE)]
    Explain(ExplainArgs),
    /// The busiest Service ports on this node: new connections per Service port as the kernel counted
    /// them (iptables, nftables and IPVS alike; root), by frontend, with refusals and the busiest
    /// endpoint. Exit 3 when the plan's rules are not on this host (nothing counted them).
    #[command(after_help = exit::TABLE)]
    Top(TopArgs),
    /// Set conntrack's sysctls as `run` and `apply` keep them (the same flags), print what was found and
    /// done, and exit (1 when one could not be set, unless --never-fail). For a privileged init
    /// container: /proc/sys is read-only in the agent's own.
    #[command(after_help = exit::TABLE)]
    SetSysctls(SetSysctlsArgs),
    /// Give a hand-written or hand-edited plan file (a plan without slices) the summary and revision
    /// its content hashes to, so the agent accepts it: every plan file must match its revision, which
    /// refuses a file cut short or edited by accident. Rewrites FILE (atomically) and prints the
    /// revision. Everything else is checked as when the file is read.
    #[command(after_help = exit::TABLE)]
    Seal(SealArgs),
}

/// `seal`: the plan file to rewrite.
#[derive(Args, Debug)]
struct SealArgs {
    /// The plan file (YAML or JSON; written back as YAML).
    file: PathBuf,
}

/// Where `explain` and `top` read the node's plan.
#[derive(Args, Debug)]
// One of the two is needed, and clap's message names both.
#[command(group(clap::ArgGroup::new("the_plan").required(true).args(["plan", "node"])))]
struct PlanArgs {
    /// The node's plan (as for render; `switchyard-controller plan -f DUMP --node NAME` writes one; on a
    /// node, `<state-dir>/plan.yaml` is what its agent applied).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Read this node's plan and its slices from the API server instead of a file.
    #[arg(long)]
    node: Option<String>,
    /// With --node: kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, requires = "node")]
    kubeconfig: Option<PathBuf>,
    /// The backend whose kernel state to read (iptables, nftables or ipvs). Default: the one the plan's
    /// status says is in use (with --node; a node that fell back reads its fallback), else `spec.backend`.
    #[arg(long, value_parser = parse_backend)]
    backend: Option<Backend>,
}

impl PlanArgs {
    /// The composed plan, from the file or the API server, and the backend whose kernel holds it.
    fn load(&self, command: &str) -> Result<(Arc<NodeForwardingPlanSpec>, Backend), ExitCode> {
        let in_use = |spec: Arc<NodeForwardingPlanSpec>, status: Option<Backend>| {
            let backend = backend_in_use(self.backend, status, spec.backend);
            (spec, backend)
        };
        match (&self.plan, &self.node) {
            (Some(path), _) => load_plan(path).map(|(_, spec)| in_use(spec, None)),
            (None, Some(node)) => {
                plan_from_api(node, self.kubeconfig.as_deref()).map(|(spec, status)| in_use(spec, status))
            }
            (None, None) => Err(fail(
                USAGE,
                &format!(
                    "{command} needs the plan: --plan FILE (- for standard input), or --node NAME to read it from the API server"
                ),
            )),
        }
    }
}

#[derive(Args, Debug)]
struct TopArgs {
    #[command(flatten)]
    plan: PlanArgs,
    /// How many Service ports to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Which iptables to read when the plan's backend is iptables.
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    iptables_mode: IptablesMode,
    /// Output: text (a table) or json.
    #[arg(short, long, value_enum, default_value_t = ExplainOutput::Text)]
    output: ExplainOutput,
}

#[derive(Args, Debug)]
struct ExplainArgs {
    #[command(flatten)]
    plan: PlanArgs,
    /// Destination: IP:PORT[/tcp|udp|sctp] ([IPv6]:PORT), or namespace/service[:PORT] (its ClusterIP;
    /// PORT is the Service port's name or number, and may be left out when it has one port).
    #[arg(long)]
    to: String,
    /// Source: a pod's IP, an outside client's IP, or `node` (a process on the node itself).
    #[arg(long)]
    from: String,
    /// Also look at the rules installed on this host (root) and report where they differ from the plan:
    /// iptables (the packet is traced through them), nftables (the frontend's elements and chains) or
    /// IPVS (the frontend's virtual server and real servers).
    #[arg(long)]
    kernel: bool,
    /// With --kernel: which iptables to read.
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    iptables_mode: IptablesMode,
    /// Output: text (numbered steps) or json.
    #[arg(short, long, value_enum, default_value_t = ExplainOutput::Text)]
    output: ExplainOutput,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ExplainOutput {
    Text,
    Json,
}

#[derive(Args, Debug)]
struct RenderArgs {
    /// Plan file (`-`: standard input): a NodeForwardingPlan object (YAML/JSON), a live plan with its
    /// views' ForwardingSlices (multi-document YAML or a List), or a bare spec.
    #[arg(long)]
    plan: PathBuf,
    /// Backend to render for (iptables, nftables or ipvs); the plan's own `spec.backend` when not given.
    #[arg(long, value_parser = parse_backend)]
    backend: Option<Backend>,
}

#[derive(Args, Debug)]
struct IptablesArgs {
    /// Which iptables to use: `auto` (detect what the host uses), `nft` (iptables-nft, the nf_tables
    /// kernel API) or `legacy` (iptables-legacy, x_tables).
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    iptables_mode: IptablesMode,
    /// Refuse a switch to the backend the plan asks for when that backend's rules would forward some
    /// frontend differently than the backend in use (another endpoint set, share, REJECT or DROP): the
    /// backend in use stays and the status says Degraded/BackendSwitchRefused, naming the Services.
    /// `false` switches anyway (moving off IPVS with switchyard.io/ipvs-weights, say).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    backend_switch_gate: bool,
    #[command(flatten)]
    ipvs: IpvsArgs,
}

/// Settings of the IPVS backend (used when the plan asks for it).
#[derive(Args, Debug)]
struct IpvsArgs {
    /// How long a TCP real server that left the plan keeps its connections (weight 0) before it is
    /// deleted anyway; it goes earlier once it has no active connection.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ipvs_graceful_period: Duration,
    /// After a switch away from IPVS (to nftables or iptables), how long its virtual servers that still
    /// carry connections stay, so those connections keep flowing (new ones take the new backend); each
    /// goes as soon as it carries none.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    ipvs_switch_drain_period: Duration,
}

/// Conntrack's sysctls, as kube-proxy sets them (every backend; the node's network namespace). A value
/// is only raised unless --conntrack-lower-host-values; 0 leaves it as the host has it.
#[derive(Args, Debug)]
struct ConntrackArgs {
    /// Idle timeout of established TCP connections (net.netfilter.nf_conntrack_tcp_timeout_established;
    /// the kernel's is 5 days, so by default a stock kernel keeps its own).
    #[arg(long, default_value = "24h", value_parser = parse_seconds)]
    conntrack_tcp_timeout_established: u64,
    /// Timeout of TCP connections in CLOSE_WAIT (net.netfilter.nf_conntrack_tcp_timeout_close_wait; the
    /// kernel's is 60 s).
    #[arg(long, default_value = "1h", value_parser = parse_seconds)]
    conntrack_tcp_timeout_close_wait: u64,
    /// The conntrack table's size (net.netfilter.nf_conntrack_max; settable only in the host's initial
    /// network namespace). 0 leaves the kernel's, which it sizes from the node's memory; kube-proxy's
    /// per-core sizing is not copied (docs/design.md §4).
    #[arg(long, default_value_t = 0)]
    conntrack_max: u64,
    /// Set each value exactly, lowering one the host has set higher (kube-proxy's behaviour).
    #[arg(long)]
    conntrack_lower_host_values: bool,
}

/// `set-sysctls`: conntrack's flags, and how an init container wants failures handled.
#[derive(Args, Debug)]
struct SetSysctlsArgs {
    #[command(flatten)]
    conntrack: ConntrackArgs,
    /// Load nf_conntrack first (`modprobe`) when its sysctls are missing: they exist only once the
    /// module is loaded, and the agent's rules would load it only later. The image has no shell, so
    /// the init container cannot run modprobe itself.
    #[arg(long)]
    load_module: bool,
    /// Exit 0 even when a value could not be set (what was not set is printed; the running agent
    /// reports it in the plan's status): an init container must never keep the proxy from starting.
    #[arg(long)]
    never_fail: bool,
    /// Also load IPVS's modules and set the sysctls kube-proxy's IPVS mode sets (the IPVS overlay's
    /// init container; the unprivileged agent cannot write /proc/sys).
    #[arg(long)]
    ipvs: bool,
    /// Also set `net.ipv4.conf.all.route_localnet=1`, which localhost NodePorts need (iptables nodes
    /// whose plan has `localhostNodePorts`; the unprivileged agent cannot write /proc/sys).
    #[arg(long)]
    route_localnet: bool,
}

/// The modules IPVS mode loads up front: the core and every scheduler a Service may name.
const IPVS_MODULES: [&str; 10] = [
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_mh",
];

/// A sysctl `set-sysctls` writes, whose absence means nf_conntrack is not loaded.
const CONNTRACK_PROBE_SYSCTL: &str = "net/netfilter/nf_conntrack_tcp_timeout_close_wait";

impl ConntrackArgs {
    fn settings(&self) -> ConntrackSettings {
        ConntrackSettings {
            tcp_timeout_established: self.conntrack_tcp_timeout_established,
            tcp_timeout_close_wait: self.conntrack_tcp_timeout_close_wait,
            max: self.conntrack_max,
            lower: self.conntrack_lower_host_values,
            route_localnet: false,
        }
    }
}

/// A duration flag in whole seconds (the kernel's unit for conntrack timeouts).
fn parse_seconds(text: &str) -> Result<u64, String> {
    let duration = parse_duration(text)?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{text:?} is not a whole number of seconds"));
    }
    Ok(duration.as_secs())
}

#[derive(Args, Debug)]
struct ApplyArgs {
    /// Plan file (see `render --plan`).
    #[arg(long)]
    plan: PathBuf,
    /// Also write the status (YAML) to this file.
    #[arg(long)]
    status_file: Option<PathBuf>,
    #[command(flatten)]
    iptables: IptablesArgs,
    #[command(flatten)]
    conntrack: ConntrackArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// This node: its NodeForwardingPlan and the ForwardingSlices of its views are watched on the API
    /// server and its status is written there (default: $NODE_NAME, which the DaemonSet sets from the
    /// downward API).
    #[arg(long)]
    node_name: Option<String>,
    /// Apply this plan file and watch it instead of the API server.
    #[arg(long, conflicts_with = "kubeconfig")]
    plan_file: Option<PathBuf>,
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Directory for the plan cache (plan.yaml): re-applied at start before the API server is
    /// reachable. Without it a restarted agent waits for the API server before programming anything.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Where to serve /healthz, /livez, /readyz and /metrics (`:PORT` for every address).
    #[arg(long, default_value = ":10263", value_parser = parse_bind)]
    metrics_bind: std::net::SocketAddr,
    /// Where to serve kube-proxy's /healthz and /livez, which cloud load balancers probe (its
    /// healthzBindAddress); `off` serves neither. While another program (kube-proxy during a migration)
    /// holds the port, the agent keeps forwarding and takes it as soon as it is free.
    #[arg(long, default_value = ":10256", value_parser = parse_optional_bind)]
    healthz_bind_address: OptionalBind,
    /// Where to serve kube-proxy's /proxyMode and /metrics (its metricsBindAddress); `off` serves
    /// neither. Taken ports are retried as for --healthz-bind-address.
    #[arg(long, default_value = "127.0.0.1:10249", value_parser = parse_optional_bind)]
    status_bind_address: OptionalBind,
    /// How long the rules of a deleted plan stay before they are removed, or `never`.
    #[arg(long, default_value = "15m", value_parser = GracePeriod::parse)]
    plan_deletion_grace: GracePeriod,
    /// Where to write the status (YAML, replaced atomically) after every sync.
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// How often to compare the kernel with what was applied and repair drift (twice this is the
    /// /healthz timeout).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    resync_period: Duration,
    /// Rewrite everything at least this often.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    full_sync_period: Duration,
    /// Coalesce plan changes closer together than this.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    min_sync_interval: Duration,
    /// How often to look at the plan file (--plan-file only).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    poll_interval: Duration,
    /// A status that changes only in progress (the slices applied, sync time, counts) is written at
    /// most this often; a new plan revision, a condition or a failure is written at once. Every node of
    /// a view syncs on every slice change, so this bounds status writes to nodes / interval (5,000
    /// nodes: at most 83 writes/s under any churn); `switchyard-controller audit` shows a node behind
    /// only by slices written within it as "reporting".
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    status_progress_interval: Duration,
    /// On a node with no plan cached, whose only API server address is the kubelet's (the
    /// `kubernetes` Service's ClusterIP: no switchyard-apiserver ConfigMap), exit with what to
    /// configure if the API server does not answer within this time (0s: wait forever). Well below
    /// the DaemonSet's liveness budget (first probe at 10 s, killed after the third failure at ~30 s),
    /// so the pod status shows this message rather than a probe failure.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    api_bootstrap_timeout: Duration,
    /// Export per-Service traffic counters on /metrics (new connections per frontend and endpoint,
    /// refused connections), read from the kernel at each scrape. Every backend.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    traffic_counters: bool,
    /// Export the per-endpoint series too (one per Service port and endpoint).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    traffic_endpoint_series: bool,
    /// At most this many traffic series per scrape; the rest are counted in
    /// switchyard_agent_traffic_series_omitted (Service and refusal series go first).
    #[arg(long, default_value_t = 100_000)]
    traffic_max_series: usize,
    #[command(flatten)]
    verify: VerifyArgs,
    #[command(flatten)]
    iptables: IptablesArgs,
    #[command(flatten)]
    conntrack: ConntrackArgs,
}

/// The verification of the backend in use, at start and after every backend switch (status.verification,
/// which a ForwardingRollout's gates read): the kernel compared with the plan per frontend, TCP probes
/// from the node, then refused connections the plan does not explain, counted for a while.
#[derive(Args, Debug)]
struct VerifyArgs {
    /// Verify at all.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    verify: bool,
    /// Probe at most this many ClusterIP frontends with endpoints (TCP connects from the node); 0: no
    /// probes.
    #[arg(long, default_value_t = 10)]
    verify_probes: usize,
    /// Each probe's timeout.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    verify_probe_timeout: Duration,
    /// How long after a verification refused connections are counted (0s: not at all).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    verify_refusals_for: Duration,
    /// How often they are counted meanwhile.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    verify_refusals_every: Duration,
}

impl VerifyArgs {
    fn config(&self) -> Option<crate::verify::VerifyConfig> {
        self.verify.then_some(crate::verify::VerifyConfig {
            probes: self.verify_probes,
            probe_timeout: self.verify_probe_timeout,
            refusals_for: self.verify_refusals_for,
            refusals_every: self.verify_refusals_every,
        })
    }
}

#[derive(Args, Debug)]
struct CleanupArgs {
    /// Which iptables to clean: `nft` (iptables-nft), `legacy` (iptables-legacy), or `auto`: both, each
    /// only where the host already has its tables.
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    iptables_mode: IptablesMode,
}

fn parse_mode(value: &str) -> Result<IptablesMode, String> {
    value.parse()
}

/// The backend whose kernel `top` and `explain --kernel` read: the flag, else the one the plan's status
/// says was applied (it differs from the plan's after a fallback), else the plan's.
fn backend_in_use(flag: Option<Backend>, status: Option<Backend>, planned: Backend) -> Backend {
    flag.or(status).unwrap_or(planned)
}

fn parse_backend(value: &str) -> Result<Backend, String> {
    Backend::parse(value).ok_or_else(|| format!("unknown backend {value:?} (iptables, nftables or ipvs)"))
}

/// An address to serve on, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OptionalBind(Option<std::net::SocketAddr>);

fn parse_optional_bind(value: &str) -> Result<OptionalBind, String> {
    if value == "off" {
        return Ok(OptionalBind(None));
    }
    parse_bind(value).map(|addr| OptionalBind(Some(addr)))
}

/// The project's one duration grammar ([`switchyard_api::duration`]), for flags.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    switchyard_api::duration::parse(text)
}

/// The agent's whole command line. Returns the process exit status.
pub fn run_cli<I>(args: I) -> ExitCode
where
    I: IntoIterator<Item = OsString>,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // eprint!, not clap's own print: a test's harness captures it (passing tests log nothing).
            // Colour only on a terminal: never escape codes in a file or a pod's log.
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                eprint!("{}", e.render().ansi());
            } else {
                eprint!("{}", e.render());
            }
            return exit::code(USAGE);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    // `run` says what it does as it goes; a one-shot command's output is its answer.
    let level = match cli.command {
        Command::Run(_) => "info",
        _ => "warn",
    };
    init_logging_at(cli.log_format, level);
    match cli.command {
        Command::Render(args) => render_command(&args),
        Command::Apply(args) => apply_command(&args),
        Command::Run(args) => run_command(&args),
        Command::Cleanup(args) => cleanup_command(&args),
        Command::Explain(args) => explain_command(&args),
        Command::Top(args) => top_command(&args),
        Command::SetSysctls(args) => set_sysctls_command(&args),
        Command::Seal(args) => seal_command(&args),
    }
}

fn seal_command(args: &SealArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(e) => return fail(USAGE, &format!("reading {}: {e}", args.file.display())),
    };
    let (yaml, revision) = match crate::planfile::seal_plan_text(&text) {
        Ok(sealed) => sealed,
        Err(e) => return fail(USAGE, &format!("{}: {e}", args.file.display())),
    };
    if let Err(e) = switchyard_process::write_atomic_bytes(&args.file, yaml.as_bytes()) {
        return fail(FAILED, &format!("writing {}: {e}", args.file.display()));
    }
    match print_stdout(&format!("{revision}\n")) {
        Ok(()) | Err(_) => ExitCode::SUCCESS,
    }
}

/// Reads the plan file and composes its plan with its slices (if any); usage errors come back as exit
/// status 2.
/// `node`'s plan composed with its slices, read once from the API server.
fn plan_from_api(
    node: &str,
    kubeconfig: Option<&std::path::Path>,
) -> Result<(Arc<NodeForwardingPlanSpec>, Option<Backend>), ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(FAILED, &Error::StartRuntime(e)))?;
    let (plan, slices, in_use) = runtime
        .block_on(async {
            let client = crate::start::client(kubeconfig).await?;
            crate::start::fetch_plan(client, node).await
        })
        .map_err(|e| fail(e.exit_code(), &e))?;
    match compose_plan(&Arc::new(plan), &slices, &mut LastGood::default()) {
        Composition::Ready { spec, failures, .. } => {
            for failure in failures {
                eprintln!("warning: {}: {}", failure.service, failure.reason);
            }
            Ok((spec, in_use))
        }
        Composition::Incomplete(why) => Err(fail(
            FAILED,
            &format!("node {node}'s plan cannot be composed from the API server's slices yet: {why}"),
        )),
    }
}

fn load_plan(
    path: &std::path::Path,
) -> Result<(crate::planfile::LoadedPlan, Arc<NodeForwardingPlanSpec>), ExitCode> {
    let loaded = read_plan_file(path).map_err(|e| fail(USAGE, &e))?;
    match compose_plan(&loaded.plan, &loaded.slices, &mut LastGood::default()) {
        Composition::Ready { spec, failures, .. } => {
            for failure in failures {
                eprintln!("warning: {}: {}", failure.service, failure.reason);
            }
            Ok((loaded, spec))
        }
        Composition::Incomplete(why) => {
            let hint = if loaded.slices.is_empty() {
                format!(
                    "; this plan composes the views {views}: put its slices in the file too (`kubectl get \
                     nodeforwardingplan {node} -o yaml` and `kubectl get forwardingslices -l '{selector}' -o \
                     yaml`), or use what `switchyard-controller plan --node {node}` prints",
                    views = loaded.plan.views.join(", "),
                    node = loaded.plan.node_name,
                    selector =
                        switchyard_api::names::views_selector(loaded.plan.views.iter().map(String::as_str)),
                )
            } else {
                String::new()
            };
            Err(fail(USAGE, &format!("{}: {why}{hint}", path.display())))
        }
    }
}

// === render ===

fn render_command(args: &RenderArgs) -> ExitCode {
    let (_, spec) = match load_plan(&args.plan) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // "Exactly what would be programmed": the plan names its backend, so that is the default.
    let backend = args.backend.unwrap_or(spec.backend);
    let report = validate(&spec);
    if !report.plan.is_empty() {
        for problem in &report.plan {
            eprintln!("invalid plan: {problem}");
        }
        return exit::code(USAGE);
    }
    for problem in report.entries.iter().flat_map(|(_, p)| p) {
        eprintln!("warning: skipping entry: {problem}");
    }
    let skip = report.bad_entries();
    // The host's addresses, read here once so the renders below stay free of I/O: IPVS needs them for
    // NodePorts, the others only when the plan restricts NodePort addresses.
    let local = if backend == Backend::Ipvs || !spec.cluster.node_port_addresses.is_empty() {
        NetlinkAddrs.local_addrs().unwrap_or_else(|e| {
            eprintln!("warning: {e}; NodePort addresses resolved against no local address");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    match print_stdout(&crate::wiring::dataplane::render_for_host(
        backend, &spec, &skip, &local,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

// === apply / run / cleanup ===

fn real_syncer(args: &IptablesArgs, conntrack: &ConntrackArgs, config: SyncConfig) -> Result<Syncer, Error> {
    let iptables = ExecIptables::detect(args.iptables_mode)?;
    let facts = crate::wiring::dataplane::discover_facts(iptables.version().ok().as_deref());
    tracing::info!(variant = %iptables.variant(), random_fully = facts.random_fully, tcp_be_liberal = facts.tcp_be_liberal, "using iptables");
    // The plan's backend decides per sync; IPVS and nftables fall back to iptables where they cannot run.
    let mut dataplane = crate::wiring::dataplane::host_dataplane(
        iptables,
        facts,
        crate::wiring::dataplane::IpvsPeriods {
            grace: args.ipvs.ipvs_graceful_period,
            switch_drain: args.ipvs.ipvs_switch_drain_period,
        },
    );
    if args.backend_switch_gate {
        dataplane = dataplane.with_gate(crate::wiring::dataplane::switch_gate());
    }
    Ok(Syncer::new(
        Box::new(dataplane),
        Arc::new(SystemClock),
        config,
        SyncMetrics::default(),
    )
    .with_conntrack(Box::new(CliConntrack::default()))
    .with_conntrack_sysctls(Box::new(ProcSysctls), conntrack.settings()))
}

fn set_sysctls_command(args: &SetSysctlsArgs) -> ExitCode {
    let mut text = String::new();
    let mut failed = false;
    let mut modules: Vec<&str> = Vec::new();
    if args.ipvs {
        modules.extend(IPVS_MODULES);
    }
    if args.load_module && (args.ipvs || !crate::sysctl::proc_path(CONNTRACK_PROBE_SYSCTL).exists()) {
        modules.push("nf_conntrack");
    }
    for module in modules {
        match crate::command::output(std::process::Command::new("modprobe").arg(module)) {
            Ok(_) => text.push_str(&format!("module {module}: loaded\n")),
            // Built in, or absent: the agent finds out and says so (IPVS falls back to iptables).
            Err(e) => text.push_str(&format!("module {module}: not loaded ({e})\n")),
        }
    }
    if args.ipvs {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        for (path, value) in crate::ipvs::sysctl::wanted(release.trim()) {
            match ProcSysctls.set(path, value) {
                Ok(()) => text.push_str(&format!("{}={value}\n", crate::sysctl::dotted(path))),
                Err(e) => {
                    failed = true;
                    text.push_str(&format!("{}: not set ({e})\n", crate::sysctl::dotted(path)));
                }
            }
        }
    }
    let settings = ConntrackSettings {
        route_localnet: args.route_localnet,
        ..args.conntrack.settings()
    };
    let outcomes = crate::conntrack::settings::apply(&mut ProcSysctls, &settings);
    failed |= outcomes.iter().any(|o| o.failed());
    text.extend(outcomes.iter().map(|o| format!("{o}\n")));
    if let Err(code) = print_stdout(&text) {
        return code;
    }
    if failed && !args.never_fail {
        exit::code(FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Why this process cannot program the kernel, when it cannot: said before anything is read.
fn cannot_program() -> Option<String> {
    let missing = crate::capabilities::missing(crate::capabilities::effective()?);
    (!missing.is_empty()).then(|| {
        format!(
            "apply programs this host's kernel and needs root (CAP_NET_ADMIN and CAP_NET_RAW); this \
             process lacks {}: run it as root (sudo), or use `render --plan` to see the rules without \
             programming them; nothing was applied",
            missing.join(" and ")
        )
    })
}

fn apply_command(args: &ApplyArgs) -> ExitCode {
    if let Some(why) = cannot_program() {
        return fail(FAILED, &why);
    }
    let (loaded, composed) = match load_plan(&args.plan) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    drop(composed);
    // One try: a failure is reported as it is, and nothing says a retry will come.
    let config = SyncConfig {
        retries: false,
        ..SyncConfig::default()
    };
    let mut syncer = match real_syncer(&args.iptables, &args.conntrack, config) {
        Ok(syncer) => syncer,
        Err(e) => return fail(FAILED, &e),
    };
    let result = syncer.sync(&loaded.plan, &loaded.slices);
    drop(loaded);
    // The status reports what the conntrack cleanup cleared: let it finish first.
    syncer.settle_conntrack();
    let status = syncer.status();
    match status_yaml(&status) {
        Ok(yaml) => {
            // The status file and the exit status still follow when nobody reads the output.
            let _ = print_stdout(&yaml);
        }
        Err(e) => eprintln!("error: {e}"),
    }
    if let Some(path) = &args.status_file
        && let Err(e) = crate::planfile::write_status_file(path, &status)
    {
        eprintln!("error: {e}");
    }
    match result {
        SyncResult::Applied { .. } => ExitCode::SUCCESS,
        SyncResult::Rejected { message, .. } => fail(USAGE, &message),
        SyncResult::Failed { message } => fail(FAILED, &message),
    }
}

fn run_command(args: &RunArgs) -> ExitCode {
    let node_name = args
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty());
    let from = match (&args.plan_file, &node_name) {
        (Some(path), _) => PlanFrom::File {
            path: path.clone(),
            poll_interval: args.poll_interval,
        },
        (None, Some(_)) => PlanFrom::Api {
            kubeconfig: args.kubeconfig.clone(),
            status_progress_interval: args.status_progress_interval,
            bootstrap_timeout: args.api_bootstrap_timeout,
        },
        (None, None) => {
            return fail(
                USAGE,
                &"run needs --node-name (or NODE_NAME, set from the downward API) or --plan-file",
            );
        }
    };
    let cache_file = match (&from, &args.state_dir) {
        (PlanFrom::Api { .. }, Some(dir)) => Some(cache_path(dir)),
        (PlanFrom::Api { .. }, None) => {
            tracing::warn!(
                "no --state-dir: the applied plan is not cached, so a restart without the API server starts without rules"
            );
            None
        }
        (PlanFrom::File { .. }, _) => None,
    };
    let missing_capabilities = crate::capabilities::effective()
        .map(crate::capabilities::missing)
        .and_then(|missing| crate::capabilities::explain(&missing));
    if let Some(why) = &missing_capabilities {
        tracing::error!("{why}; no rule can be programmed until it has them (the kernel keeps what it has)");
    }
    let config = SyncConfig {
        full_sync_period: args.full_sync_period,
        health_timeout: args.resync_period * 2,
        missing_capabilities,
        ..SyncConfig::default()
    };
    let mut syncer = match real_syncer(&args.iptables, &args.conntrack, config) {
        Ok(syncer) => syncer,
        Err(e) => return fail(FAILED, &e),
    };
    if let Some(verify) = args.verify.config() {
        let verifier = crate::wiring::verify::host_verifier(verify, args.iptables.iptables_mode);
        syncer = syncer.with_verifier(verifier);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(FAILED, &Error::StartRuntime(e)),
    };
    let run_config = RunConfig {
        node_name: node_name.unwrap_or_default(),
        status_file: args.status_file.clone(),
        resync_period: args.resync_period,
        min_sync_interval: args.min_sync_interval,
        deletion_grace: args.plan_deletion_grace,
        cache_file,
        metrics_bind: Some(args.metrics_bind),
        healthz_bind: args.healthz_bind_address.0,
        status_bind: args.status_bind_address.0,
        traffic: args.traffic_counters.then_some(crate::counters::CountersConfig {
            endpoints: args.traffic_endpoint_series,
            max_series: args.traffic_max_series,
            iptables_mode: args.iptables.iptables_mode,
        }),
    };
    let result = runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        run_agent(run_config, from, syncer, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // In a pod the kubelet shows this as the container's last state (`kubectl describe pod`);
            // on stderr it is said once (the pod's log shows it too).
            crate::bootstrap::write_termination_message(&format!("error: {e}"));
            fail(e.exit_code(), &e)
        }
    }
}

/// Completes on SIGTERM or SIGINT (the handlers are installed when this is called).
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, Error> {
    switchyard_process::shutdown_signal().map_err(Error::Signals)
}

fn top_command(args: &TopArgs) -> ExitCode {
    use crate::counters::top;
    let (spec, backend) = match args.plan.load("top") {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let node = spec.node_name.clone();
    let entries = spec.services.len();
    let series = match crate::wiring::counters::HostCounters::read_once(spec, backend, args.iptables_mode) {
        Ok(series) => series,
        Err(e) => return fail(FAILED, &e),
    };
    // Every Service port the kernel holds rules for has a series, counted or not: none at all means
    // the rules are elsewhere (another host, another backend), and an empty table would say "no
    // traffic" instead.
    if series.is_empty() && entries > 0 {
        return fail(
            NO,
            &format_args!(
                "the rules of node {node}'s plan are not on this host: {backend} holds none of its {entries} \
                 Service ports (run top on node {node}, where its agent applied them; --backend reads \
                 another backend's rules)"
            ),
        );
    }
    let rows = top::busiest(&series, args.limit);
    let text = match args.output {
        ExplainOutput::Text => top::table(&rows),
        ExplainOutput::Json => match serde_json::to_string_pretty(&rows) {
            Ok(json) => json + "\n",
            Err(e) => return fail(FAILED, &e),
        },
    };
    match print_stdout(&text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

fn explain_command(args: &ExplainArgs) -> ExitCode {
    use crate::explain::{self, Destination, Source};
    let destination: Destination = match args.to.parse() {
        Ok(destination) => destination,
        Err(e) => return fail(USAGE, &format!("--to: {e}")),
    };
    let source: Source = match args.from.parse() {
        Ok(source) => source,
        Err(e) => return fail(USAGE, &format!("--from: {e}")),
    };
    let (spec, backend) = match args.plan.load("explain") {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let local = if args.kernel {
        match crate::wiring::explain::local_addrs() {
            Ok(local) => Some(local),
            Err(e) => return fail(FAILED, &e),
        }
    } else {
        None
    };
    let (mut explanation, packet, plan_trace) =
        match explain::explain(&spec, &destination, source, local.as_deref()) {
            Ok(answer) => answer,
            Err(e) => return fail(USAGE, &e),
        };
    if let Some(local) = &local
        && let Err(e) = crate::wiring::explain::compare_with_kernel(
            &spec,
            &mut explanation,
            &packet,
            &plan_trace,
            local,
            backend,
            args.iptables_mode,
        )
    {
        return fail(FAILED, &e);
    }
    let text = match args.output {
        ExplainOutput::Text => explanation.text(),
        ExplainOutput::Json => match serde_json::to_string_pretty(&explanation) {
            Ok(json) => json + "\n",
            Err(e) => return fail(FAILED, &e),
        },
    };
    if let Err(code) = print_stdout(&text) {
        return code;
    }
    exit::code(explanation.exit_code())
}

fn cleanup_command(args: &CleanupArgs) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    for (what, done) in crate::wiring::dataplane::cleanup(args.iptables_mode) {
        match done {
            Ok(done) => {
                let _ = print_stdout(&format!("{what}: {done}\n"));
            }
            Err(e) => {
                eprintln!("error: {what}: {e}");
                code = exit::code(FAILED);
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_mode_help_names_the_values_the_flag_accepts() {
        use clap::CommandFactory;
        for sub in ["run", "apply", "cleanup"] {
            let mut command = Cli::command();
            let help = command
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            for value in ["`auto`", "`nft`", "`legacy`"] {
                assert!(help.contains(value), "{sub} --help lacks {value}:\n{help}");
                assert!(value.trim_matches('`').parse::<IptablesMode>().is_ok());
            }
        }
    }

    #[test]
    fn top_and_explain_read_the_backend_in_use() {
        use Backend::{Iptables, Ipvs, Nftables};
        // (--backend, status.backend, spec.backend) -> read
        for (flag, status, planned, read) in [
            (None, None, Nftables, Nftables),
            (None, Some(Iptables), Ipvs, Iptables), // fell back from IPVS: its iptables rules
            (Some(Nftables), Some(Iptables), Ipvs, Nftables),
            (Some(Ipvs), None, Iptables, Ipvs),
        ] {
            assert_eq!(
                backend_in_use(flag, status, planned),
                read,
                "{flag:?} {status:?} {planned:?}"
            );
        }
        let parsed =
            Cli::try_parse_from(["switchyard-agent", "top", "--plan", "p.yaml", "--backend", "ipvs"]);
        match parsed.map(|cli| cli.command) {
            Ok(Command::Top(args)) => assert_eq!(args.plan.backend, Some(Ipvs)),
            other => panic!("top --backend ipvs: {other:?}"),
        }
        let bad = Cli::try_parse_from(["switchyard-agent", "top", "--plan", "p.yaml", "--backend", "bpf"]);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("iptables, nftables or ipvs")
        );
    }

    #[test]
    fn conntrack_flags_default_to_kube_proxys_timeouts_in_seconds() {
        let settings = |extra: &[&str]| {
            let argv = ["switchyard-agent", "run", "--plan-file", "p.yaml"]
                .iter()
                .chain(extra);
            match Cli::try_parse_from(argv).map(|cli| cli.command) {
                Ok(Command::Run(args)) => Ok(args.conntrack.settings()),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(settings(&[]), Ok(ConntrackSettings::default()));
        assert_eq!(
            settings(&[
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=90m",
                "--conntrack-max=1048576",
                "--conntrack-lower-host-values",
            ]),
            Ok(ConntrackSettings {
                tcp_timeout_established: 0,
                tcp_timeout_close_wait: 5400,
                max: 1_048_576,
                lower: true,
                route_localnet: false,
            })
        );
        let half = settings(&["--conntrack-tcp-timeout-close-wait=1.5s"]).unwrap_err();
        assert!(half.contains("not a whole number of seconds"), "{half}");
        let sysctls = Cli::try_parse_from(["switchyard-agent", "set-sysctls", "--conntrack-max=131072"]);
        match sysctls.map(|cli| cli.command) {
            Ok(Command::SetSysctls(args)) => {
                assert_eq!(args.conntrack.settings().max, 131_072);
                assert!(
                    !args.never_fail && !args.load_module && !args.ipvs,
                    "off unless asked"
                );
            }
            other => panic!("set-sysctls: {other:?}"),
        }
        // What the init containers run (config/agent/daemonset.yaml, the IPVS overlay).
        let init = Cli::try_parse_from([
            "switchyard-agent",
            "set-sysctls",
            "--ipvs",
            "--load-module",
            "--never-fail",
        ]);
        match init.map(|cli| cli.command) {
            Ok(Command::SetSysctls(args)) => {
                assert!(args.never_fail && args.load_module && args.ipvs);
                assert_eq!(args.conntrack.settings(), ConntrackSettings::default());
            }
            other => panic!("set-sysctls: {other:?}"),
        }
    }

    #[test]
    fn duration_flags_use_the_shared_grammar() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("30").is_err());
    }

    #[test]
    fn bad_flags_and_unreadable_plans_exit_2() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            run_cli(args(&["switchyard-agent", "frobnicate"])),
            exit::code(USAGE)
        );
        assert_eq!(
            run_cli(args(&[
                "switchyard-agent",
                "run",
                "--plan-file",
                "x",
                "--resync-period",
                "soon"
            ])),
            exit::code(USAGE)
        );
        assert_eq!(
            run_cli(args(&[
                "switchyard-agent",
                "apply",
                "--plan",
                "x",
                "--iptables-mode",
                "fast"
            ])),
            exit::code(USAGE)
        );
        assert_eq!(
            run_cli(args(&[
                "switchyard-agent",
                "render",
                "--plan",
                "/nonexistent/plan.yaml"
            ])),
            exit::code(USAGE)
        );
        // explain: a bad destination or source, neither or both of --plan and --node.
        for bad in [
            &["explain", "--plan", "p.yaml", "--to", "web", "--from", "node"][..],
            &[
                "explain",
                "--plan",
                "p.yaml",
                "--to",
                "10.96.0.1:80",
                "--from",
                "pod-a",
            ][..],
            &["explain", "--to", "10.96.0.1:80", "--from", "node"][..],
            &[
                "explain",
                "--plan",
                "p.yaml",
                "--node",
                "a",
                "--to",
                "10.96.0.1:80",
                "--from",
                "node",
            ][..],
            &[
                "explain",
                "--plan",
                "/nonexistent/plan.yaml",
                "--to",
                "10.96.0.1:80",
                "--from",
                "node",
            ][..],
        ] {
            let argv: Vec<&str> = std::iter::once("switchyard-agent")
                .chain(bad.iter().copied())
                .collect();
            assert_eq!(run_cli(args(&argv)), exit::code(USAGE), "{bad:?}");
        }
        for bad in [
            &[
                "switchyard-agent",
                "run",
                "--node-name",
                "n",
                "--plan-deletion-grace",
                "soon",
            ][..],
            &[
                "switchyard-agent",
                "run",
                "--node-name",
                "n",
                "--metrics-bind",
                "10263",
            ],
            &["switchyard-agent", "run", "--plan-file", "x", "--kubeconfig", "y"],
        ] {
            assert_eq!(run_cli(args(bad)), exit::code(USAGE), "{bad:?}");
        }
        if std::env::var_os("NODE_NAME").is_none() {
            assert_eq!(
                run_cli(args(&["switchyard-agent", "run"])),
                exit::code(USAGE),
                "neither a node nor a plan file"
            );
        }
    }
}
