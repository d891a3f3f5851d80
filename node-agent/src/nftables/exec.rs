//! The real [`Nft`]: the `nft` CLI for transactions and the full read-back, netlink dumps for the cheap
//! look.
//!
//! ```text
//! apply(tx) ─► only element changes, small? ─► netlink batch (batch::encode; no nft process)
//!           ─► nft -f -  (stdin ◄─ tx.write, streamed) ─► exit 0 | stderr "/dev/stdin:LINE:COL: Error: …"
//!                                                                    └► Error::NftTransaction + context lines
//! read(f)   ─► nft -j list table <f> switchyard ─► listing::parse (streamed from stdout) | "No such file" → None
//! exists / summary ─► netlink (NftNetlink, opened once, in the agent's network namespace)
//! ```
//!
//! Blocking `std::process`, like the iptables edge: the sync path is blocking code run off the async
//! workers.

use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use switchyard_api::IpFamily;

use super::batch;
use super::kernel::{Nft, Summary};
use super::listing;
use super::model::{TableState, family_keyword};
use super::names::TABLE;
use super::netlink::NftNetlink;
use super::transaction::{Op, Transaction};
use crate::command;
use crate::command::context_lines;
use crate::error::Error;

/// The `nft` CLI plus a netlink socket.
#[derive(Debug)]
pub struct ExecNft {
    binary: PathBuf,
    netlink: Option<NftNetlink>,
}

impl ExecNft {
    /// Finds `nft` in `$PATH` and checks that it runs.
    pub fn detect() -> Result<Self, Error> {
        let binary = command::find_in_path("nft").ok_or_else(|| {
            Error::FindNft(
                "nft is not in $PATH: the switchyard-agent image has it; a custom image or a host needs \
                 Debian's nftables package"
                    .into(),
            )
        })?;
        let nft = Self {
            binary,
            netlink: None,
        };
        nft.version()?;
        Ok(nft)
    }

    /// `nft --version`, e.g. `nftables v1.0.6 (Lester Gooch #5)`.
    pub fn version(&self) -> Result<String, Error> {
        command::stdout_of(Command::new(&self.binary).arg("--version"))
            .map(|v| v.trim().to_string())
            .map_err(|e| Error::FindNft(e.to_string()))
    }

    fn netlink(&mut self) -> Result<&mut NftNetlink, Error> {
        if self.netlink.is_none() {
            self.netlink = Some(NftNetlink::open()?);
        }
        // Set just above.
        self.netlink
            .as_mut()
            .ok_or_else(|| Error::FindNft("the netlink socket could not be kept".into()))
    }
}

impl ExecNft {
    /// One `nft -f -` transaction.
    fn apply_with_nft(&mut self, transaction: &Transaction<'_>) -> Result<(), Error> {
        let mut command = Command::new(&self.binary);
        command
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let spawn_error = |source| Error::RunCommand {
            command: "nft -f -".into(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        let written = match child.stdin.take() {
            Some(stdin) => {
                let mut writer = BufWriter::with_capacity(256 * 1024, stdin);
                transaction.write(&mut writer).and_then(|()| writer.flush())
            }
            None => Err(std::io::Error::other("no stdin")),
        };
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            // nft only succeeds after reading all of its input.
            return written.map_err(spawn_error);
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        let line = failing_line(&stderr);
        let context = line
            .map(|line| context_lines(&mut transaction.text(), line))
            .unwrap_or_default();
        Err(Error::NftTransaction {
            family: family_keyword(transaction.family).to_string(),
            line,
            // nft repeats the offending line with a caret marker; the first line says what failed.
            stderr: stderr.lines().next().unwrap_or_default().to_string(),
            context,
        })
    }
}

/// The failing line in nft's stderr: `/dev/stdin:12:68-139: Error: …`.
pub fn failing_line(stderr: &str) -> Option<usize> {
    stderr.lines().find_map(|line| {
        let rest = line
            .strip_prefix("/dev/stdin:")
            .or_else(|| line.strip_prefix("-:"))?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

impl Nft for ExecNft {
    fn apply(&mut self, transaction: &Transaction<'_>) -> Result<(), Error> {
        let ops = transaction.ops.len();
        let elements_only = transaction
            .ops
            .iter()
            .all(|op| matches!(op, Op::AddElements { .. } | Op::DeleteElements { .. }));
        if elements_only && ops > 0 {
            let netlink = self.netlink()?;
            let first = netlink.reserve_sequences(transaction.element_changes());
            if let Some(batch) = batch::encode(transaction, first) {
                let result = self.netlink()?.apply_batch(&batch);
                return result.map_err(|e| match e {
                    Error::NftTransaction { stderr, .. } => Error::NftTransaction {
                        family: family_keyword(transaction.family).to_string(),
                        line: None,
                        stderr,
                        context: String::new(),
                    },
                    other => other,
                });
            }
        }
        self.apply_with_nft(transaction)
    }

    fn read(&mut self, family: IpFamily) -> Result<Option<TableState>, Error> {
        let keyword = family_keyword(family);
        let listing_error = |reason: String| Error::NftListing {
            family: keyword.to_string(),
            reason,
        };
        let mut child = Command::new(&self.binary)
            .args(["-j", "list", "table", keyword, TABLE])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::RunCommand {
                command: format!("nft -j list table {keyword} {TABLE}"),
                source,
            })?;
        let parsed = match child.stdout.take() {
            Some(stdout) => listing::parse(stdout, family),
            None => Err("no stdout".to_string()),
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let status = child.wait().map_err(|source| Error::RunCommand {
            command: format!("nft -j list table {keyword} {TABLE}"),
            source,
        })?;
        if !status.success() && stderr.contains("No such file or directory") {
            return Ok(None);
        }
        let failure = if status.success() {
            match parsed {
                Ok(state) => return Ok(Some(state)),
                Err(reason) => reason,
            }
        } else {
            format!(
                "nft exited with {status}: {}",
                stderr.lines().next().unwrap_or_default()
            )
        };
        // kubernetes#136786: an `nft` older than the one that wrote something on the host can crash
        // (or print what it cannot parse) while listing. The sync goes on from the netlink summary:
        // the sets it cannot read are flushed and refilled, chains compared by digest.
        tracing::warn!(family = keyword, reason = %failure, "nft -j list failed; reading the table over netlink");
        match self.summary(family) {
            Ok(summary) => Ok(summary.map(|summary| listing::from_summary(summary, family))),
            Err(_) => Err(listing_error(failure)),
        }
    }

    fn exists(&mut self, family: IpFamily) -> Result<bool, Error> {
        let result = self.netlink()?.table_exists(family);
        if result.is_err() {
            self.netlink = None;
        }
        result
    }

    fn summary(&mut self, family: IpFamily) -> Result<Option<Summary>, Error> {
        let result = self.netlink()?.summary(family);
        if result.is_err() {
            // A fresh socket next time, in case this one is in a bad state.
            self.netlink = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_line_is_read_from_nfts_message() {
        let stderr = "/dev/stdin:20:60-74: Error: invalid priority expression value in this context.\nadd chain …\n   ^^^^";
        assert_eq!(failing_line(stderr), Some(20));
        assert_eq!(
            failing_line("Error: Could not process rule: No such file or directory"),
            None
        );
    }
}
