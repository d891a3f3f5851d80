//! `switchyard-controller`: offline planning today (`plan`), the live controller later (`run`).
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad flags, unreadable or unparseable input, or invalid
//! configuration (nothing is printed on stdout then).

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use switchyard_controller::{
    Config,
    input::load_files,
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

#[derive(Subcommand)]
enum Command {
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
