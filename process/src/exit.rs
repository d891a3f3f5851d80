//! The exit codes of every Switchyard command (the controller, the agent, the kubectl plugin): one
//! table, used by every command and printed in every `--help`; and how a command says its last word.
//!
//! ```text
//! 0 ok · 1 failed while running · 2 wrong input (nothing on stdout) · 3 ran, and the answer is no
//! ```

use std::process::ExitCode;

use crate::Error;

/// The command did what it was asked.
pub const OK: u8 = 0;
/// Something failed while the command ran: the kernel refused rules, the API server did not answer, a
/// file could not be written.
pub const FAILED: u8 = 1;
/// Nothing was done because the input is wrong: bad flags, a file that cannot be read or is invalid (a
/// plan cut or edited), an unusable configuration or kubeconfig. Nothing is printed on stdout.
pub const USAGE: u8 = 2;
/// The command ran and its answer is "no": `audit`, a node lags; `explain`, the connection is rejected,
/// dropped or meets no Service; `top`, the plan's rules are not on this host.
pub const NO: u8 = 3;

/// The table, as `--help` and the README print it.
pub const TABLE: &str = "\
Exit codes (every switchyard-controller, switchyard-agent and kubectl switchyard command):
  0  done
  1  failed while running (the kernel refused rules, the API server did not answer, a write failed)
  2  wrong input, nothing done: bad flags, an unreadable or invalid file (a plan cut or edited), an
     unusable configuration or kubeconfig (nothing on stdout)
  3  ran, and the answer is no: audit (a node lags), explain (rejected, dropped or no such Service),
     top (the plan's rules are not on this host)";

/// `code` as the process's exit status.
pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

/// Says `error` once on stderr, as kubectl does (`error: …`), and ends with `code`.
pub fn fail(code: u8, error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    self::code(code)
}

/// Writes `text` to standard output. A closed pipe (`… | head`) ends the command quietly (`Err` with
/// exit 0), as kubectl does, instead of the panic `print!` gives; other write errors are said and end
/// it with [`FAILED`].
pub fn print_stdout(text: &str) -> Result<(), ExitCode> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => Err(fail(FAILED, &format_args!("writing to standard output: {e}"))),
    }
}

impl Error {
    /// The exit code a command ends with when this edge fails: a kubeconfig or client configuration
    /// that cannot be used is wrong input; the rest failed while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Kubeconfig { .. } | Self::NoClientConfig { .. } | Self::Client { .. } => USAGE,
            Self::Bind { .. } | Self::Signals(_) => FAILED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_code_once() {
        for code in [OK, FAILED, USAGE, NO] {
            assert_eq!(TABLE.matches(&format!("\n  {code}  ")).count(), 1, "{code}");
        }
        let unusable = Error::Kubeconfig {
            path: "/k".into(),
            cause: "gone".into(),
        };
        assert_eq!(unusable.exit_code(), USAGE);
        assert_eq!(Error::Signals(std::io::Error::other("x")).exit_code(), FAILED);
    }
}
