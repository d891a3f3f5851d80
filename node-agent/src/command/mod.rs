//! Running the host's command-line tools (iptables, conntrack): one place that turns spawn failures and
//! exit statuses into [`Error`]s with the command line in them.
//!
//! ```text
//! Command ─► output() ─► Ok(Output) (any exit status) ─► expect_success() ─► Ok(stdout) | Error::CommandFailed
//!                    └─► Error::RunCommand (not found, not executable, I/O)
//! ```
//!
//! Tools that read a long text on stdin (`iptables-restore`, `nft -f`) take a [`RestoreInput`], and
//! their failures show the lines around the failing one ([`context_lines`]).

mod input;

pub use input::{CONTEXT_LINES, RestoreInput, context_lines};

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::error::Error;

/// The command line, for messages.
pub fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` to completion (stdin closed) and returns its output whatever its exit status.
pub fn output(command: &mut Command) -> Result<Output, Error> {
    command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| Error::RunCommand {
            command: describe(command),
            source,
        })
}

/// Runs `command` and fails unless it exits 0; returns its stdout.
pub fn stdout_of(command: &mut Command) -> Result<String, Error> {
    let out = output(command)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(failed(command, &out))
    }
}

/// The error for a command that exited with an unexpected status.
pub fn failed(command: &Command, out: &Output) -> Error {
    Error::CommandFailed {
        command: describe(command),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}

/// The path of executable `name` in `$PATH`, if any.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_command() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo oops >&2; exit 3"]);
        let err = stdout_of(&mut command).unwrap_err().to_string();
        assert!(err.contains("sh -c echo oops >&2; exit 3"), "{err}");
        assert!(err.contains("oops") && err.contains('3'), "{err}");
        let err = output(&mut Command::new("/nonexistent/switchyard-test")).unwrap_err();
        assert_eq!(err.metric_label(), "run_command");
        assert!(find_in_path("sh").is_some());
        assert!(find_in_path("switchyard-no-such-tool").is_none());
    }
}
