//! The real [`Iptables`]: the host's binaries of one variant (nft or legacy), run with
//! `std::process::Command`.
//!
//! ```text
//! restore ─► iptables-<v>-restore --noflush --wait=5  ◄─ stdin: RestoreInput streamed (stderr read on a thread)
//! save    ─► iptables-<v>-save -t <table>             ─► stdout read line by line
//! rules   ─► iptables-<v> -w 5 -t <table> -C/-I/-D/-S
//! ```
//!
//! The lock wait is bounded (5 s, as kube-proxy) so a stuck lock holder turns into a failed sync that is
//! retried with backoff instead of a hung agent. Calls block; the sync loop runs them off its async
//! tasks.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use switchyard_api::IpFamily;

use super::kernel::{Iptables, failing_line};
use super::mode::{IptablesMode, Variant, choose};
use super::payload::Table;
use crate::command::{self, describe, find_in_path};
use crate::command::{RestoreInput, context_lines};
use crate::error::Error;

/// Seconds to wait for the xtables lock.
const LOCK_WAIT_SECONDS: &str = "5";

/// The binaries of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// `iptables-nft` / `ip6tables-legacy` / ...
    pub iptables: String,
    /// `iptables-nft-save` / ...
    pub save: String,
    /// `iptables-nft-restore` / ...
    pub restore: String,
}

impl Binaries {
    fn named(base: &str, suffix: Option<&str>) -> Self {
        let name = |tool: &str| match suffix {
            Some(s) => format!("{base}-{s}{tool}"),
            None => format!("{base}{tool}"),
        };
        Self {
            iptables: name(""),
            save: name("-save"),
            restore: name("-restore"),
        }
    }
}

/// The host's iptables of one variant, both families.
#[derive(Debug, Clone)]
pub struct ExecIptables {
    variant: Variant,
    v4: Binaries,
    v6: Binaries,
}

impl ExecIptables {
    /// Resolves `mode` (detecting the variant for `auto`, see [`super::mode`]) and its binaries.
    pub fn detect(mode: IptablesMode) -> Result<Self, Error> {
        let variant = match mode {
            IptablesMode::Nft => Variant::Nft,
            IptablesMode::Legacy => Variant::Legacy,
            IptablesMode::Auto => {
                let legacy = count_saved_rules(Variant::Legacy);
                let nft = count_saved_rules(Variant::Nft);
                let variant = choose(legacy, nft);
                // NB: debug: `run` logs the variant it uses at INFO; render and explain need not say it.
                tracing::debug!(?legacy, ?nft, %variant, "detected the iptables variant the host uses");
                variant
            }
        };
        Self::with_variant(variant)
    }

    /// The binaries of `variant`: `iptables-<variant>` and friends, or plain `iptables` when only that
    /// exists and `iptables --version` says it is this variant.
    pub fn with_variant(variant: Variant) -> Result<Self, Error> {
        let suffix = variant.suffix();
        if find_in_path(&format!("iptables-{suffix}")).is_some() {
            return Ok(Self {
                variant,
                v4: Binaries::named("iptables", Some(suffix)),
                v6: Binaries::named("ip6tables", Some(suffix)),
            });
        }
        let tag = match variant {
            Variant::Nft => "(nf_tables)",
            Variant::Legacy => "(legacy)",
        };
        let plain = command::stdout_of(Command::new("iptables").arg("--version")).unwrap_or_default();
        if plain.contains(tag) {
            return Ok(Self {
                variant,
                v4: Binaries::named("iptables", None),
                v6: Binaries::named("ip6tables", None),
            });
        }
        Err(Error::FindIptables(format!(
            "neither iptables-{suffix} nor an iptables {tag} is in PATH"
        )))
    }

    /// The variant in use.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The binaries of `family`.
    pub fn binaries(&self, family: IpFamily) -> &Binaries {
        match family {
            IpFamily::IPv4 => &self.v4,
            IpFamily::IPv6 => &self.v6,
        }
    }

    /// `iptables-save -c -t <table>`: the table with every rule's `[packets:bytes]` (the traffic
    /// counters read it; the trait's saves leave counters out, as the syncs need).
    pub fn save_counted(&self, family: IpFamily, table: Table) -> Result<String, Error> {
        let mut command = Command::new(&self.binaries(family).save);
        command.args(["-c", "-t", table.as_str()]);
        command::stdout_of(&mut command)
    }

    /// `iptables --version` (e.g. `iptables v1.8.9 (nf_tables)`).
    pub fn version(&self) -> Result<String, Error> {
        command::stdout_of(Command::new(&self.v4.iptables).arg("--version")).map(|s| s.trim().to_string())
    }

    fn iptables(&self, family: IpFamily, table: Table) -> Command {
        let mut command = Command::new(&self.binaries(family).iptables);
        command.args(["-w", LOCK_WAIT_SECONDS, "-t", table.as_str()]);
        command
    }

    /// Runs an `iptables` rule command whose exit status 1 means "no such rule/chain".
    fn probe(&self, mut command: Command) -> Result<bool, Error> {
        command.stdout(Stdio::null());
        let out = command::output(&mut command)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(command::failed(&command, &out)),
        }
    }
}

/// Rules both families of `variant` show, or `None` when its IPv4 save is missing or fails.
fn count_saved_rules(variant: Variant) -> Option<usize> {
    let mut total = 0;
    for (index, base) in ["iptables", "ip6tables"].into_iter().enumerate() {
        let save = format!("{base}-{}-save", variant.suffix());
        if find_in_path(&save).is_none() {
            if index == 0 {
                return None;
            }
            continue;
        }
        let mut rules = 0;
        match stream_lines(&mut Command::new(&save), &mut |line| {
            rules += usize::from(line.starts_with('-'));
        }) {
            Ok(()) => total += rules,
            Err(e) if index == 0 => {
                tracing::debug!(error = %e, "{save} failed");
                return None;
            }
            Err(_) => {}
        }
    }
    Some(total)
}

/// Reads stderr on a thread so a chatty child can never block on a full pipe while we write its stdin
/// or read its stdout.
fn collect_stderr(child: &mut Child) -> Option<JoinHandle<String>> {
    let mut stderr = child.stderr.take()?;
    Some(std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    }))
}

fn join_stderr(handle: Option<JoinHandle<String>>) -> String {
    handle
        .and_then(|h| h.join().ok())
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Runs `command`, handing each stdout line (without its newline) to `each`; fails unless it exits 0.
fn stream_lines(command: &mut Command, each: &mut dyn FnMut(&str)) -> Result<(), Error> {
    let run_error = |command: &Command, source| Error::RunCommand {
        command: describe(command),
        source,
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| run_error(command, e))?;
    let stderr = collect_stderr(&mut child);
    let mut read_error = None;
    if let Some(stdout) = child.stdout.take() {
        let mut reader = BufReader::with_capacity(1 << 16, stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => each(line.trim_end_matches('\n')),
                Err(e) => {
                    read_error = Some(e);
                    break;
                }
            }
        }
    }
    let status = child.wait().map_err(|e| run_error(command, e))?;
    let stderr = join_stderr(stderr);
    if let Some(e) = read_error {
        return Err(run_error(command, e));
    }
    if !status.success() {
        return Err(Error::CommandFailed {
            command: describe(command),
            status: status.to_string(),
            stderr,
        });
    }
    Ok(())
}

impl Iptables for ExecIptables {
    fn restore(&mut self, family: IpFamily, input: &mut dyn RestoreInput) -> Result<(), Error> {
        let binary = self.binaries(family).restore.clone();
        let mut command = Command::new(&binary);
        command.args(["--noflush", &format!("--wait={LOCK_WAIT_SECONDS}")]);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::RunCommand {
                command: describe(&command),
                source,
            })?;
        let stderr = collect_stderr(&mut child);
        let written = match child.stdin.take() {
            Some(stdin) => {
                let mut writer = BufWriter::with_capacity(1 << 18, stdin);
                input.write_to(&mut writer).and_then(|()| writer.flush())
            }
            None => Ok(()),
        };
        // stdin is closed here (the writer was dropped), so the child sees the end of its input.
        let status = child.wait().map_err(|source| Error::RunCommand {
            command: describe(&command),
            source,
        })?;
        let stderr = join_stderr(stderr);
        if status.success() {
            // A write error with a successful exit cannot really happen (the child read everything), but
            // never report success for a payload that was not fully delivered.
            return written.map_err(|source| Error::RunCommand {
                command: describe(&command),
                source,
            });
        }
        // A broken pipe while writing just means the child stopped reading at the failing line.
        let line = failing_line(&stderr);
        let context = line.map(|l| context_lines(input, l)).unwrap_or_default();
        Err(Error::IptablesRestore {
            binary,
            line,
            stderr,
            context,
        })
    }

    fn save_lines(
        &mut self,
        family: IpFamily,
        table: Table,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), Error> {
        let mut command = Command::new(&self.binaries(family).save);
        command.args(["-t", table.as_str()]);
        stream_lines(&mut command, each)
    }

    fn ensure_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let mut check = self.iptables(family, table);
        check.arg("-C").arg(chain).args(args);
        if self.probe(check)? {
            return Ok(false);
        }
        let mut insert = self.iptables(family, table);
        insert.args(["-I", chain, "1"]).args(args);
        command::stdout_of(&mut insert)?;
        Ok(true)
    }

    fn delete_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let mut delete = self.iptables(family, table);
        delete.arg("-D").arg(chain).args(args);
        self.probe(delete)
    }

    fn chain_exists(&mut self, family: IpFamily, table: Table, chain: &str) -> Result<bool, Error> {
        let mut list = self.iptables(family, table);
        list.args(["-S", chain]);
        self.probe(list)
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<bool, Error> {
        let mut list = self.iptables(family, table);
        list.args(["-S", chain]);
        match stream_lines(&mut list, each) {
            Ok(()) => Ok(true),
            // `-S` of a missing chain exits 1; anything else is a real failure.
            Err(error) => match self.chain_exists(family, table, chain) {
                Ok(false) => Ok(false),
                _ => Err(error),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_named_per_variant_and_family() {
        let nft = Binaries::named("ip6tables", Some("nft"));
        assert_eq!(nft.restore, "ip6tables-nft-restore");
        assert_eq!(nft.save, "ip6tables-nft-save");
        assert_eq!(Binaries::named("iptables", None).iptables, "iptables");
    }

    #[test]
    fn lines_are_streamed_and_failures_carry_stderr() {
        let mut lines = Vec::new();
        stream_lines(Command::new("printf").arg("a\\nb\\n"), &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(lines, ["a", "b"]);
        let err = stream_lines(
            Command::new("sh").args(["-c", "echo bad >&2; exit 2"]),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(err.to_string().contains("bad"), "{err}");
    }
}
