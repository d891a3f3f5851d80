//! `switchyard-controller`: the live controller (`run`) and offline planning (`plan`).
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad flags, unreadable or unparseable input, or invalid
//! configuration (nothing is printed on stdout then).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use switchyard_controller::{
    Config,
    input::load_files,
    live::run::{Options, run},
    output::{Format, render},
    planner::Planner,
};

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

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the controller against the API server (in cluster, or with --kubeconfig / KUBECONFIG).
    Run {
        /// Kubeconfig file (default: in-cluster config, then KUBECONFIG, then ~/.kube/config).
        #[arg(long, env = "KUBECONFIG")]
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
        /// Where to serve /metrics, /healthz and /readyz (e.g. 0.0.0.0:10262).
        #[arg(long, value_parser = parse_bind)]
        metrics_bind: Option<SocketAddr>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Computes NodeForwardingPlans offline from a cluster dump
    /// (`kubectl get services,endpointslices,nodes -A -o yaml`).
    Plan {
        /// Input files: a v1 List, multi-document YAML, or JSON. Repeatable.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Controller configuration file (YAML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Only this node's plan.
        #[arg(long)]
        node: Option<String>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
        output: Format,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Plan {
            files,
            config,
            node,
            output,
        } => plan(&files, config, node.as_deref(), output),
        Command::Run {
            kubeconfig,
            config,
            leader_elect,
            lease_namespace,
            metrics_bind,
            log_format,
        } => {
            init_logs(log_format);
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

/// `:10262` means every address.
fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    let text = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    text.parse().map_err(|e| format!("{text}: {e}"))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn live(kubeconfig: Option<PathBuf>, options: Options) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let config = match kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                    .await
                    .with_context(|| format!("using {}", path.display()))?
            }
            None => kube::Config::infer()
                .await
                .context("finding a kubeconfig or in-cluster config")?,
        };
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        run(client, options, shutdown_signal(), None)
            .await
            .context("running the controller")
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn plan(files: &[PathBuf], config: Option<PathBuf>, node: Option<&str>, format: Format) -> ExitCode {
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
    if !loaded.ignored_kinds.is_empty() {
        eprintln!(
            "note: ignored {} object(s) of other kinds",
            loaded.ignored_kinds.len()
        );
    }
    let plans = match node {
        Some(name) => match planner.node_plan(name) {
            Some(plan) => vec![plan],
            None => {
                eprintln!("error: node {name:?} is not in the input");
                return ExitCode::from(2);
            }
        },
        None => planner.all_plans(),
    };
    if plans.is_empty() {
        eprintln!("note: the input has no nodes, so there is nothing to plan");
    }
    match render(&plans, format) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(1)
        }
    }
}
