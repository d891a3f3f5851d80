//! `switchyard-controller`: the live controller (`run`), offline planning (`plan`) and the cluster-wide
//! lag check (`audit`).
//!
//! Exit codes: the table both binaries share (`switchyard_process::exit`), printed by every `--help`.

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
    plugin,
};
use switchyard_process::exit::{self, FAILED, NO, USAGE, fail, print_stdout};
use switchyard_process::http::parse_bind;
use switchyard_process::{LogFormat, init_logging, shutdown_signal};

#[derive(Parser)]
#[command(
    name = "switchyard-controller",
    version,
    about = "Plans what every node forwards",
    after_help = exit::TABLE,
    // Colour only on a terminal: never escape codes in a file or a pod's log.
    color = clap::ColorChoice::Auto
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the controller against the API server (in cluster, or with --kubeconfig / KUBECONFIG).
    #[command(after_help = exit::TABLE)]
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
    /// ForwardingSlices and NodeForwardingPlans the controller would write. Read as kubectl's strict
    /// validation reads: a field a kind does not have is a warning naming the object and the field
    /// (an error with --strict), an object of another kind is named, and so is every Service not
    /// forwarded, with the reason.
    #[command(after_help = exit::TABLE)]
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
        /// Refuse the input (exit 2) when an object has a field its kind does not have, or a kind is a
        /// near miss of one plan reads (`Servce`), instead of warning.
        #[arg(long)]
        strict: bool,
    },
    /// Which nodes lag behind their plan or the current ForwardingSlices, and what each one misses.
    /// Reads the API server (--kubeconfig / KUBECONFIG / in-cluster) or, with -f, a dump of
    /// `kubectl get nodeforwardingplans,forwardingslices -o yaml`. Exit 0 when every node is current
    /// or reporting, 3 when some node lags.
    #[command(after_help = exit::TABLE)]
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
            strict,
        } => plan(&files, config, node.as_deref(), objects, output, strict),
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
                Err(error) => return fail(USAGE, &error),
            };
            let mut options = Options::new(config);
            options.leader_elect = leader_elect;
            options.lease_namespace = lease_namespace;
            options.metrics_bind = metrics_bind;
            match live(kubeconfig, options) {
                Ok(()) => ExitCode::SUCCESS,
                // Said once, on stderr, as every command says its last word.
                Err(error) => fail(code_of(&error), &format_args!("{error:#}")),
            }
        }
    }
}

/// The exit code of a failure: wrong input when the shared process edges say so (an unusable
/// kubeconfig), else a failure while running.
fn code_of(error: &anyhow::Error) -> u8 {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<switchyard_process::Error>())
        .map_or(FAILED, switchyard_process::Error::exit_code)
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

/// Lists every plan and slice from the API server (as `kubectl switchyard audit` does).
fn list_objects(
    kubeconfig: Option<PathBuf>,
) -> anyhow::Result<(Vec<NodeForwardingPlan>, Vec<ForwardingSlice>)> {
    runtime()?.block_on(async move {
        let client = client(kubeconfig).await?;
        Ok(plugin::cluster::plans_and_slices(&client).await?)
    })
}

fn audit_command(kubeconfig: Option<PathBuf>, files: &[PathBuf]) -> ExitCode {
    let (plans, slices, now) = if files.is_empty() {
        match list_objects(kubeconfig) {
            Ok((plans, slices)) => (plans, slices, Some(k8s_openapi::jiff::Timestamp::now())),
            Err(error) => return fail(code_of(&error), &format_args!("{error:#}")),
        }
    } else {
        match load_files(files) {
            Ok(loaded) if loaded.plans.is_empty() && !loaded.snapshot.nodes.is_empty() => {
                return fail(
                    USAGE,
                    &"the input is a cluster dump (Services, EndpointSlices, Nodes): audit reads what the \
                      controller wrote, `kubectl get nodeforwardingplans,forwardingslices -o yaml`",
                );
            }
            Ok(loaded) if loaded.plans.is_empty() => {
                return fail(USAGE, &"the input holds no NodeForwardingPlan: nothing to audit");
            }
            Ok(loaded) => {
                warn_unread(&loaded);
                // A dump is at least as recent as its newest write.
                let now = audit::newest_write(&loaded.plans, &loaded.forwarding_slices);
                (loaded.plans, loaded.forwarding_slices, now)
            }
            Err(error) => return fail(USAGE, &error),
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
        exit::code(NO)
    }
}

/// Says what of the input was not read: fields its kinds do not have (kubectl's strict validation
/// warns of each the same way) and objects of other kinds, each named.
fn warn_unread(loaded: &switchyard_controller::input::Loaded) {
    for field in &loaded.unknown_fields {
        eprintln!("warning: {field}");
    }
    let mut by_kind: std::collections::BTreeMap<&str, Vec<&switchyard_controller::input::Ignored>> =
        std::collections::BTreeMap::new();
    for ignored in &loaded.ignored {
        match ignored.meant() {
            Some(meant) => eprintln!(
                "warning: {} {} ({}): unknown kind {:?}, not read (did you mean {meant}?)",
                ignored.kind, ignored.name, ignored.at, ignored.kind
            ),
            None => by_kind.entry(&ignored.kind).or_default().push(ignored),
        }
    }
    // Other kinds (a `kubectl get all` dump holds Pods, Deployments, …): one line per kind.
    for (kind, objects) in by_kind {
        const SHOWN: usize = 5;
        let names: Vec<&str> = objects.iter().take(SHOWN).map(|o| o.name.as_str()).collect();
        let more = objects.len().saturating_sub(SHOWN);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        eprintln!(
            "note: not read: {} {kind} ({}{more}): plan reads Services, EndpointSlices and Nodes",
            objects.len(),
            names.join(", ")
        );
    }
}

fn plan(
    files: &[PathBuf],
    config: Option<PathBuf>,
    node: Option<&str>,
    objects: bool,
    format: Format,
    strict: bool,
) -> ExitCode {
    let config = match config.as_deref().map(Config::load).transpose() {
        Ok(config) => config.unwrap_or_default(),
        Err(error) => return fail(USAGE, &error),
    };
    let loaded = match load_files(files) {
        Ok(loaded) => loaded,
        Err(error) => return fail(USAGE, &error),
    };
    let dump = &loaded.snapshot;
    let no_cluster_objects = dump.services.is_empty() && dump.slices.is_empty() && dump.nodes.is_empty();
    if no_cluster_objects && !(loaded.plans.is_empty() && loaded.forwarding_slices.is_empty()) {
        return fail(
            USAGE,
            &"the input holds NodeForwardingPlans or ForwardingSlices, which are plan's output: plan reads a \
              cluster dump (`kubectl get services,endpointslices,nodes -A -o yaml`); to apply, render or \
              explain a plan use switchyard-agent, to check plans `switchyard-controller audit -f`",
        );
    }
    if no_cluster_objects {
        warn_unread(&loaded);
        return fail(
            USAGE,
            &format_args!(
                "the input holds no Service, EndpointSlice or Node (only {} object(s) of other kinds): plan \
                 reads `kubectl get services,endpointslices,nodes -A -o yaml`",
                loaded.ignored.len()
            ),
        );
    }
    // The node first: nothing else is worth saying about a node that is not there.
    if let Some(name) = node {
        let known = dump
            .nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(name));
        if !known {
            let mut names: Vec<&str> = dump
                .nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            names.sort_unstable();
            return fail(
                USAGE,
                &format_args!(
                    "node {name:?} is not in the input (its nodes: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            );
        }
    }
    warn_unread(&loaded);
    let near_misses = loaded.ignored.iter().filter(|i| i.meant().is_some()).count();
    if strict && (!loaded.unknown_fields.is_empty() || near_misses > 0) {
        return fail(
            USAGE,
            &format_args!(
                "--strict: {} unknown field(s) and {near_misses} object(s) of a mistyped kind (above); \
                 nothing planned",
                loaded.unknown_fields.len()
            ),
        );
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
        Err(error) => return fail(FAILED, &error),
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
        Err(error) => fail(FAILED, &error),
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
