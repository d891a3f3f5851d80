//! `switchyard-controller`: the live controller (`run`), offline planning (`plan`) and the cluster-wide
//! lag check (`audit`).
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad flags, unreadable or unparseable input, or invalid
//! configuration (nothing is printed on stdout then); 3 (`audit`) some node lags behind.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use switchyard_api::{ForwardingSlice, NodeForwardingPlan};
use switchyard_controller::{
    Config, audit,
    input::load_files,
    live::run::{Options, run},
    output::{Format, Written, composed_object, composed_table, objects_table, serialize, written_objects},
    planner::{Planner, SkipReason, problems, service_cidrs, snapshot_problems},
};
use switchyard_process::http::parse_bind;
use switchyard_process::{LogFormat, init_logging, shutdown_signal};

#[derive(Parser)]
#[command(
    name = "switchyard-controller",
    version,
    about = "Plans what every node forwards"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the controller against the API server (in cluster, or with --kubeconfig / KUBECONFIG).
    Run {
        /// Kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then the in-cluster config).
        // NB: not `env = "KUBECONFIG"`: kube reads it itself, as a list (`a:b`) and empty as unset,
        // as kubectl does; clap would take it as one path and refuse an empty one.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Controller configuration file (YAML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Elect a leader through a coordination.k8s.io Lease (run two replicas).
        #[arg(long)]
        leader_elect: bool,
        /// Namespace of the Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "switchyard-system")]
        lease_namespace: String,
        /// Where to serve /metrics, /healthz and /readyz: `HOST:PORT`, or `:PORT` for every address of
        /// both families (e.g. :10262).
        #[arg(long, value_parser = parse_bind)]
        metrics_bind: Option<SocketAddr>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Computes offline, from a cluster dump (`kubectl get services,endpointslices,nodes -A -o yaml`),
    /// what every node forwards: one self-contained NodeForwardingPlan per node (its views' slices and
    /// its overrides composed, exactly as its agent composes them), or with --objects the
    /// ForwardingSlices and NodeForwardingPlans the controller would write.
    Plan {
        /// Input files (`-`: standard input): a v1 List, multi-document YAML, or JSON. Repeatable.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Controller configuration file (YAML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Only this node's plan (with --objects: its plan and its views' slices).
        #[arg(long)]
        node: Option<String>,
        /// Print the objects the controller would write (ForwardingSlices, then live plans) instead of
        /// what each node forwards.
        #[arg(long)]
        objects: bool,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
        output: Format,
    },
    /// Which nodes lag behind their plan or the current ForwardingSlices, and what each one misses.
    /// Reads the API server (--kubeconfig / KUBECONFIG / in-cluster) or, with -f, a dump of
    /// `kubectl get nodeforwardingplans,forwardingslices -o yaml`. Exit 0 when every node is current,
    /// 3 when some node lags.
    Audit {
        /// Kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then the in-cluster config).
        // NB: not `env = "KUBECONFIG"`: kube reads it itself, as a list (`a:b`) and empty as unset,
        // as kubectl does; clap would take it as one path and refuse an empty one.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Read these dump files (`-`: standard input) instead of the API server. Repeatable.
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Plan {
            files,
            config,
            node,
            objects,
            output,
        } => plan(&files, config, node.as_deref(), objects, output),
        Command::Audit { kubeconfig, files } => audit_command(kubeconfig, &files),
        Command::Run {
            kubeconfig,
            config,
            leader_elect,
            lease_namespace,
            metrics_bind,
            log_format,
        } => {
            init_logging(log_format);
            let config = match config.as_deref().map(Config::load).transpose() {
                Ok(config) => config.unwrap_or_default(),
                Err(error) => {
                    eprintln!("error: {error}");
                    return ExitCode::from(2);
                }
            };
            let mut options = Options::new(config);
            options.leader_elect = leader_elect;
            options.lease_namespace = lease_namespace;
            options.metrics_bind = metrics_bind;
            match live(kubeconfig, options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!("{error:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    Ok(switchyard_process::client(kubeconfig.as_deref()).await?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn live(kubeconfig: Option<PathBuf>, options: Options) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let shutdown = shutdown_signal()?;
        let client = client(kubeconfig).await?;
        run(client, options, shutdown, None)
            .await
            .context("running the controller")
    })
}

/// Lists every plan and slice from the API server.
fn list_objects(
    kubeconfig: Option<PathBuf>,
) -> anyhow::Result<(Vec<NodeForwardingPlan>, Vec<ForwardingSlice>)> {
    runtime()?.block_on(async move {
        let client = client(kubeconfig).await?;
        let params = kube::api::ListParams::default();
        let plans = kube::Api::<NodeForwardingPlan>::all(client.clone())
            .list(&params)
            .await
            .context("listing nodeforwardingplans")?;
        let slices = kube::Api::<ForwardingSlice>::all(client)
            .list(&params)
            .await
            .context("listing forwardingslices")?;
        Ok((plans.items, slices.items))
    })
}

fn audit_command(kubeconfig: Option<PathBuf>, files: &[PathBuf]) -> ExitCode {
    let (plans, slices, now) = if files.is_empty() {
        match list_objects(kubeconfig) {
            Ok((plans, slices)) => (plans, slices, Some(k8s_openapi::jiff::Timestamp::now())),
            Err(error) => {
                eprintln!("error: {error:#}");
                return ExitCode::from(1);
            }
        }
    } else {
        match load_files(files) {
            Ok(loaded) if loaded.plans.is_empty() && !loaded.snapshot.nodes.is_empty() => {
                eprintln!(
                    "error: the input is a cluster dump (Services, EndpointSlices, Nodes): audit reads what \
                     the controller wrote, `kubectl get nodeforwardingplans,forwardingslices -o yaml`"
                );
                return ExitCode::from(2);
            }
            Ok(loaded) if loaded.plans.is_empty() => {
                eprintln!("error: the input holds no NodeForwardingPlan: nothing to audit");
                return ExitCode::from(2);
            }
            Ok(loaded) => {
                // A dump is at least as recent as its newest write.
                let now = audit::newest_write(&loaded.plans, &loaded.forwarding_slices);
                (loaded.plans, loaded.forwarding_slices, now)
            }
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::from(2);
            }
        }
    };
    if plans.is_empty() {
        eprintln!("note: no NodeForwardingPlans found; nothing to audit");
    }
    let audits = audit::audit(&plans, &slices, now);
    if let Err(code) = print_stdout(&audit::table(&audits)) {
        return code;
    }
    if audits.iter().all(|a| a.current || a.reporting) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    }
}

/// Writes `text` to standard output. A closed pipe (`… | head`) ends the command quietly, as kubectl
/// does, instead of the panic `print!` gives; other write errors are reported.
fn print_stdout(text: &str) -> Result<(), ExitCode> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: writing to standard output: {e}");
            Err(ExitCode::from(1))
        }
    }
}

fn plan(
    files: &[PathBuf],
    config: Option<PathBuf>,
    node: Option<&str>,
    objects: bool,
    format: Format,
) -> ExitCode {
    let config = match config.as_deref().map(Config::load).transpose() {
        Ok(config) => config.unwrap_or_default(),
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let loaded = match load_files(files) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let dump = &loaded.snapshot;
    let no_cluster_objects = dump.services.is_empty() && dump.slices.is_empty() && dump.nodes.is_empty();
    if no_cluster_objects && !(loaded.plans.is_empty() && loaded.forwarding_slices.is_empty()) {
        eprintln!(
            "error: the input holds NodeForwardingPlans or ForwardingSlices, which are plan's output: plan \
             reads a cluster dump (`kubectl get services,endpointslices,nodes -A -o yaml`); to apply, render \
             or explain a plan use switchyard-agent, to check plans `switchyard-controller audit -f`"
        );
        return ExitCode::from(2);
    }
    if no_cluster_objects {
        eprintln!(
            "error: the input holds no Service, EndpointSlice or Node (only {} object(s) of other kinds): \
             plan reads `kubectl get services,endpointslices,nodes -A -o yaml`",
            loaded.ignored_kinds.len()
        );
        return ExitCode::from(2);
    }
    // The Service ranges come from the dump's ServiceCIDR objects (`kubectl get servicecidrs -o yaml`).
    let mut config = config;
    let pod_cidrs = service_cidrs::pod_cidrs(&loaded.snapshot.nodes, &config);
    let (ranges, refused) = service_cidrs::accept(&loaded.service_cidrs, &pod_cidrs);
    config.service_cidrs = ranges;
    for problem in &refused {
        eprintln!(
            "warning: ServiceCIDR {}: {} ({})",
            problem.name, problem.message, problem.reason
        );
    }
    let planner = match Planner::build(&loaded.snapshot, &config) {
        Ok(planner) => planner,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(1);
        }
    };
    let diagnostics = planner.diagnostics();
    for warning in &diagnostics.warnings {
        eprintln!("warning: {warning}");
    }
    for (object, reason) in &diagnostics.skipped {
        let kind = match reason {
            SkipReason::SliceHeadlessLabel => "EndpointSlice",
            _ => "Service",
        };
        eprintln!("note: {kind} {object}: {reason}");
    }
    for problem in snapshot_problems(&loaded.snapshot, &config) {
        // The planner's warning above already names a NodePort outside the range.
        if problem.reason != problems::reasons::NODE_PORT_OUT_OF_RANGE {
            eprintln!(
                "warning: Service {}: {} ({})",
                problem.service, problem.message, problem.reason
            );
        }
    }
    if !loaded.ignored_kinds.is_empty() {
        eprintln!(
            "note: ignored {} object(s) of other kinds",
            loaded.ignored_kinds.len()
        );
    }
    if let Some(name) = node
        && planner.node_info(name).is_none()
    {
        eprintln!("error: node {name:?} is not in the input");
        return ExitCode::from(2);
    }
    if planner.node_names().next().is_none() {
        eprintln!("note: the input has no nodes, so there is nothing to plan");
    }
    let text = if objects {
        objects_output(&planner, node, format)
    } else {
        composed_output(&planner, node, format)
    };
    match text {
        Ok(text) => match print_stdout(&text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(code) => code,
        },
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(1)
        }
    }
}

/// What each node (or one) forwards: composed, self-contained plans.
fn composed_output(
    planner: &Planner,
    node: Option<&str>,
    format: Format,
) -> Result<String, switchyard_controller::Error> {
    let nodes: Vec<&str> = match node {
        Some(node) => vec![node],
        None => planner.node_names().collect(),
    };
    let mut composed = Vec::with_capacity(nodes.len());
    for node in nodes {
        composed.extend(composed_object(planner, node)?);
    }
    match format {
        Format::Table | Format::Wide => Ok(composed_table(planner, &composed, format == Format::Wide)),
        Format::Yaml | Format::Json => serialize(&composed, format),
    }
}

/// The objects the controller writes (one node's plan and its views' slices with --node).
fn objects_output(
    planner: &Planner,
    node: Option<&str>,
    format: Format,
) -> Result<String, switchyard_controller::Error> {
    let mut objects = written_objects(planner);
    if let Some(node) = node {
        let views = planner.node_plan(node).map(|p| p.views).unwrap_or_default();
        objects.retain(|o| match o {
            Written::Slice(slice) => views.contains(&slice.spec.view),
            Written::Plan(plan) => plan.metadata.name.as_deref() == Some(node),
        });
    }
    match format {
        Format::Table | Format::Wide => Ok(objects_table(&objects, format == Format::Wide)),
        Format::Yaml | Format::Json => serialize(&objects, format),
    }
}
