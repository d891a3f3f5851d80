//! Running helper commands: `Command` (+ optional stdin text) ─► captured output or a [`LabError`].
//!
//! Used for `ip` (topology, namespaces) and for one-shot commands inside lab namespaces; failures carry
//! the command line and its stderr, so a broken topology step says which line of which batch failed.

use std::{
    io::Write,
    process::{Command, Output, Stdio},
};

use crate::error::{LabError, Result};

/// The iproute2 binary.
pub const IP: &str = "ip";

/// Runs `command` to completion, feeding it `stdin`, and returns its output whatever its exit status.
pub fn output(command: &mut Command, stdin: Option<&str>) -> Result<Output> {
    let line = describe(command);
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| LabError::Spawn {
        command: line.clone(),
        source,
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // NB: a child that exits early closes the pipe; its exit status then explains the failure.
        let _ = pipe.write_all(text.as_bytes());
    }
    child.wait_with_output().map_err(|source| LabError::Spawn {
        command: line,
        source,
    })
}

/// Runs `command` and fails unless it exits successfully; returns its stdout.
pub fn run(command: &mut Command, stdin: Option<&str>) -> Result<String> {
    let out = output(command, stdin)?;
    if !out.status.success() {
        return Err(LabError::CommandFailed {
            command: describe(command),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip <args>`, feeding `stdin` (for `-batch -`).
pub fn ip(args: &[&str], stdin: Option<&str>) -> Result<String> {
    run(Command::new(IP).args(args), stdin)
}

/// The command line, for messages.
pub fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}
