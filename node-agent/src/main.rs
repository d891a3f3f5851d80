//! The `switchyard-agent` binary: everything is in [`switchyard_agent::cli::run_cli`].

fn main() -> std::process::ExitCode {
    switchyard_agent::cli::run_cli(std::env::args_os())
}
