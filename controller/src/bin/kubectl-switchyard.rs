//! `kubectl switchyard`: a kubectl plugin (an executable named `kubectl-switchyard` on the PATH) for the
//! questions an operator asks of Switchyard: every node's state, which nodes lag, what one node
//! forwards, why a packet goes where it goes on a node, and its busiest Services. See
//! `controller::plugin` for the data flow; this file parses flags and prints.
//!
//! Exit codes: the table every Switchyard binary shares (`switchyard_process::exit`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use switchyard_controller::{
    Error, audit,
    plugin::{
        DEFAULT_NAMESPACE,
        agent_pod::AGENT_BINARY,
        cluster::{self, Ran},
        node_plan::composed_plan,
        status,
    },
};
use switchyard_process::exit::{self, FAILED, NO, USAGE, fail, print_stdout};

#[derive(Parser)]
#[command(
    name = "kubectl switchyard",
    bin_name = "kubectl switchyard",
    version,
    about = "Switchyard, the Service proxy, from kubectl: node status, lag audit, a node's plan, explain and top through the node's agent",
    after_help = exit::TABLE,
    color = clap::ColorChoice::Auto
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// The flags kubectl users expect on every command.
#[derive(Args)]
struct Global {
    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then the pod's service
    /// account).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace the Switchyard agents run in.
    #[arg(short = 'n', long, global = true, default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// How long to wait for the API server (and for a command in an agent pod) before giving up, in
    /// seconds.
    #[arg(long = "request-timeout", global = true, default_value_t = 60)]
    request_timeout: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Every node's plan as `kubectl get nfp -o wide` shows it, with the audit's verdict (current,
    /// reporting, lagging); then what each lagging node misses, the leaving nodes and Nodes without a
    /// plan. Exit 3 when a node lags.
    Status {
        /// Output: table, or wide (also the backend in use, both revisions and the drain).
        #[arg(short, long, value_enum, default_value_t = TableOutput::Table)]
        output: TableOutput,
    },
    /// Which nodes lag behind their plan or the current ForwardingSlices, and what each one misses (as
    /// `switchyard-controller audit`). Exit 3 when a node lags.
    Audit,
    /// What one node forwards: its plan composed with its views' slices exactly as its agent composes
    /// them, as one self-contained plan file (`switchyard-agent render|explain --plan FILE` reads it).
    Plan {
        /// The node.
        #[arg(long)]
        node: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = PlanOutput::Yaml)]
        output: PlanOutput,
    },
    /// The path a new connection takes on a node, in words, answered by that node's agent pod (its
    /// plan from the API server; with --kernel also the kernel's rules). Exit 0 forwarded, 3
    /// rejected/dropped/not a Service.
    Explain {
        /// The node.
        #[arg(long)]
        node: String,
        /// Destination: IP:PORT[/tcp|udp|sctp], or namespace/service[:PORT].
        #[arg(long)]
        to: String,
        /// Source: a pod's IP, an outside client's IP, or `node`.
        #[arg(long)]
        from: String,
        /// Also trace the packet through the rules installed on the node.
        #[arg(long)]
        kernel: bool,
        /// Output: text or json.
        #[arg(short, long, value_enum, default_value_t = AgentOutput::Text)]
        output: AgentOutput,
    },
    /// The busiest Service ports on a node as its kernel counted them, answered by its agent pod.
    Top {
        /// The node.
        #[arg(long)]
        node: String,
        /// How many Service ports to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Output: text or json.
        #[arg(short, long, value_enum, default_value_t = AgentOutput::Text)]
        output: AgentOutput,
    },
}

#[derive(ValueEnum, Clone, Copy)]
enum TableOutput {
    Table,
    Wide,
}

#[derive(ValueEnum, Clone, Copy)]
enum PlanOutput {
    Yaml,
    Json,
}

#[derive(ValueEnum, Clone, Copy)]
enum AgentOutput {
    Text,
    Json,
}

impl AgentOutput {
    fn flag(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(FAILED, &format_args!("starting the runtime: {e}")),
    };
    let timeout = Duration::from_secs(cli.global.request_timeout.max(1));
    let outcome = runtime.block_on(async {
        match tokio::time::timeout(timeout, run(&cli)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::TimedOut(timeout)),
        }
    });
    match outcome {
        Ok(code) => code,
        Err(Failure::Error(error)) => fail(code_of(&error), &error),
        Err(Failure::Exit(code)) => code,
        Err(Failure::TimedOut(after)) => fail(
            FAILED,
            &format_args!(
                "no answer within {} s (--request-timeout): is the API server reachable, and the node's agent pod running?",
                after.as_secs()
            ),
        ),
    }
}

enum Failure {
    Error(Error),
    TimedOut(Duration),
    /// Already said (or a closed pipe): end with this.
    Exit(ExitCode),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self::Error(error)
    }
}

fn code_of(error: &Error) -> u8 {
    match error {
        Error::NoSuchContext { .. } => USAGE,
        _ => FAILED,
    }
}

async fn run(cli: &Cli) -> Result<ExitCode, Failure> {
    let global = &cli.global;
    let client = cluster::client(global.kubeconfig.as_deref(), global.context.as_deref()).await?;
    match &cli.command {
        Command::Status { output } => {
            let (plans, slices, nodes) = cluster::everything(&client).await?;
            let now = k8s_openapi::jiff::Timestamp::now();
            let audits = audit::audit(&plans, &slices, Some(now));
            let status = status::status(&plans, &audits, &nodes, now);
            print(&status::table(&status, matches!(output, TableOutput::Wide)))?;
            Ok(verdict(status.rows.iter().all(|r| r.state != "lagging")))
        }
        Command::Audit => {
            let (plans, slices) = cluster::plans_and_slices(&client).await?;
            let audits = audit::audit(&plans, &slices, Some(k8s_openapi::jiff::Timestamp::now()));
            print(&audit::table(&audits))?;
            Ok(verdict(audits.iter().all(|a| a.current || a.reporting)))
        }
        Command::Plan { node, output } => {
            let (plan, slices) = cluster::node_plan(&client, node).await?;
            let plan = composed_plan(&plan, &slices)?;
            let text = match output {
                PlanOutput::Yaml => {
                    serde_saphyr::to_string(&plan).map_err(|e| Error::Serialize(e.to_string()))?
                }
                PlanOutput::Json => {
                    let mut text =
                        serde_json::to_string_pretty(&plan).map_err(|e| Error::Serialize(e.to_string()))?;
                    text.push('\n');
                    text
                }
            };
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            node,
            to,
            from,
            kernel,
            output,
        } => {
            let mut args = vec![
                "explain",
                "--node",
                node,
                "--to",
                to,
                "--from",
                from,
                "-o",
                output.flag(),
            ];
            if *kernel {
                args.push("--kernel");
            }
            in_agent_pod(&client, &global.namespace, node, &args).await
        }
        Command::Top { node, limit, output } => {
            let limit = limit.to_string();
            let args = ["top", "--node", node, "--limit", &limit, "-o", output.flag()];
            in_agent_pod(&client, &global.namespace, node, &args).await
        }
    }
}

/// Runs `switchyard-agent ARGS` in `node`'s agent pod, relays what it printed and ends as it ended.
async fn in_agent_pod(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    args: &[&str],
) -> Result<ExitCode, Failure> {
    let pod = cluster::node_agent_pod(client, namespace, node).await?;
    if let Some(why) = &pod.not_ready {
        eprintln!(
            "warning: the agent pod {namespace}/{} on node {node} is not ready: {why}",
            pod.name
        );
    }
    let command = std::iter::once(AGENT_BINARY)
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    let Ran {
        stdout,
        stderr,
        exit_code,
    } = cluster::exec(client, namespace, &pod.name, command).await?;
    // Relayed as they came: the agent's words are the answer (and its warnings go to stderr).
    let _ = std::io::stderr().write_all(&stderr);
    print(&String::from_utf8_lossy(&stdout))?;
    Ok(exit::code(exit_code))
}

fn verdict(all_current: bool) -> ExitCode {
    if all_current {
        ExitCode::SUCCESS
    } else {
        exit::code(NO)
    }
}

/// Writes `text` to standard output (a closed pipe ends quietly).
fn print(text: &str) -> Result<(), Failure> {
    print_stdout(text).map_err(Failure::Exit)
}
