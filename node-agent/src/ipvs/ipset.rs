//! The ipset edge: [`Ipsets`], implemented by [`ExecIpsets`] (the `ipset` binary, one `ipset restore`
//! per batch) and `FakeIpsets` (an in-memory table that applies batches as ipset would).
//!
//! ```text
//! IpvsDataplane ─► list()    ◄─ ipset save            ─► sets::parse_save (ours only)
//!               └► restore() ─► ipset restore -exist  ◄─ stdin: a batch from sets::batches
//! ```
//!
//! `-exist` makes creating an existing set, adding a present member and deleting an absent one no-ops,
//! so a batch computed from a slightly stale listing still applies.

#[cfg(any(test, feature = "testing"))]
use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

#[cfg(any(test, feature = "testing"))]
use switchyard_api::IpFamily;

#[cfg(any(test, feature = "testing"))]
use super::sets::{PREFIX, SavedSet};
use super::sets::{SavedSets, parse_save};
use crate::command::{self, describe};
use crate::error::Error;

/// The ipset operations IPVS mode needs.
pub trait Ipsets: Send {
    /// Our sets (named with [`PREFIX`](super::sets::PREFIX)) and their members.
    fn list(&mut self) -> Result<SavedSets, Error>;
    /// Applies one batch of `create`/`add`/`del`/`destroy` lines.
    fn restore(&mut self, batch: &str) -> Result<(), Error>;
}

/// The host's `ipset` binary.
#[derive(Debug, Clone, Default)]
pub struct ExecIpsets;

impl Ipsets for ExecIpsets {
    fn list(&mut self) -> Result<SavedSets, Error> {
        parse_save(&command::stdout_of(Command::new("ipset").arg("save"))?)
    }

    fn restore(&mut self, batch: &str) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut command = Command::new("ipset");
        command.args(["restore", "-exist"]);
        let run_error = |command: &Command, source| Error::RunCommand {
            command: describe(command),
            source,
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| run_error(&command, e))?;
        // Batches are small (one line per changed member); the child cannot fill its stderr pipe
        // before it has read them.
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(batch.as_bytes())
                .map_err(|e| run_error(&command, e))?;
        }
        let out = child.wait_with_output().map_err(|e| run_error(&command, e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(command::failed(&command, &out))
        }
    }
}

/// An in-memory ipset table; clones share it.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Default)]
pub struct FakeIpsets {
    state: Arc<Mutex<FakeState>>,
}

#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
struct FakeState {
    sets: SavedSets,
    batches: Vec<String>,
    fail_next: Option<String>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeIpsets {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every set (ours and others').
    pub fn sets(&self) -> SavedSets {
        self.lock().sets.clone()
    }

    /// The members of one set (empty when missing).
    pub fn members(&self, name: &str) -> BTreeSet<String> {
        self.lock()
            .sets
            .get(name)
            .map(|s| s.members.clone())
            .unwrap_or_default()
    }

    /// Batches applied so far.
    pub fn batches(&self) -> Vec<String> {
        self.lock().batches.clone()
    }

    /// Makes the next restore fail with `reason`, changing nothing.
    pub fn fail_next_restore(&self, reason: &str) {
        self.lock().fail_next = Some(reason.to_string());
    }

    /// Changes a set behind the agent's back (`ipset del`), or removes it when `member` is `None`.
    pub fn tamper(&self, name: &str, member: Option<&str>) {
        let mut state = self.lock();
        match member {
            Some(member) => {
                if let Some(set) = state.sets.get_mut(name) {
                    set.members.remove(member);
                }
            }
            None => {
                state.sets.remove(name);
            }
        }
    }

    fn apply(sets: &mut SavedSets, line: &str) -> Result<(), String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => Ok(()),
            ["create", name, kind, options @ ..] => {
                let family = match options.iter().position(|w| *w == "family") {
                    Some(i) => match options.get(i + 1) {
                        Some(&"inet") => Some(IpFamily::IPv4),
                        Some(&"inet6") => Some(IpFamily::IPv6),
                        other => return Err(format!("bad family {other:?}")),
                    },
                    None if kind.starts_with("hash:") => Some(IpFamily::IPv4),
                    None => None,
                };
                match sets.get(*name) {
                    Some(existing) if existing.kind != *kind || existing.family != family => {
                        Err(format!("set {name} exists with another type"))
                    }
                    Some(_) => Ok(()),
                    None => {
                        sets.insert(
                            name.to_string(),
                            SavedSet {
                                kind: kind.to_string(),
                                family,
                                members: BTreeSet::new(),
                            },
                        );
                        Ok(())
                    }
                }
            }
            ["add", name, member] => sets
                .get_mut(*name)
                .map(|s| {
                    s.members.insert(member.to_string());
                })
                .ok_or_else(|| format!("no set {name}")),
            ["del", name, member] => sets
                .get_mut(*name)
                .map(|s| {
                    s.members.remove(*member);
                })
                .ok_or_else(|| format!("no set {name}")),
            ["destroy", name] => sets
                .remove(*name)
                .map(drop)
                .ok_or_else(|| format!("no set {name}")),
            _ => Err(format!("unsupported line {line:?}")),
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl Ipsets for FakeIpsets {
    fn list(&mut self) -> Result<SavedSets, Error> {
        Ok(self
            .lock()
            .sets
            .iter()
            .filter(|(name, _)| name.starts_with(PREFIX))
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect())
    }

    fn restore(&mut self, batch: &str) -> Result<(), Error> {
        let mut state = self.lock();
        let failed = |stderr: String| Error::CommandFailed {
            command: "ipset restore -exist".into(),
            status: "exit status: 1".into(),
            stderr,
        };
        if let Some(reason) = state.fail_next.take() {
            return Err(failed(reason));
        }
        // ipset restore stops at the first bad line; what came before it stays applied.
        let mut sets = std::mem::take(&mut state.sets);
        let mut result = Ok(());
        for (number, line) in batch.lines().enumerate() {
            if let Err(reason) = Self::apply(&mut sets, line) {
                result = Err(failed(format!("Error in line {}: {reason}", number + 1)));
                break;
            }
        }
        state.sets = sets;
        state.batches.push(batch.to_string());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_applies_batches_like_ipset_restore_exist() {
        let mut ipsets = FakeIpsets::new();
        ipsets
            .restore(
                "create SWYD-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add SWYD-CLUSTER-IP 10.96.0.10,tcp:80
add SWYD-CLUSTER-IP 10.96.0.10,tcp:80
create SWYD-HEALTH-CHECK bitmap:port range 0-65535
create OTHER hash:ip family inet6
",
            )
            .unwrap();
        let listed = ipsets.list().unwrap();
        assert_eq!(listed.len(), 2, "only our sets are listed");
        assert_eq!(listed["SWYD-CLUSTER-IP"].members.len(), 1);
        assert_eq!(listed["SWYD-HEALTH-CHECK"].family, None);
        ipsets
            .restore("del SWYD-CLUSTER-IP 10.96.0.10,tcp:80\ndel SWYD-CLUSTER-IP 10.96.0.11,tcp:80\n")
            .unwrap();
        assert!(ipsets.members("SWYD-CLUSTER-IP").is_empty());
        let err = ipsets
            .restore("destroy SWYD-HEALTH-CHECK\nadd SWYD-MISSING 1.2.3.4\n")
            .unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(
            !ipsets.sets().contains_key("SWYD-HEALTH-CHECK"),
            "line 1 stays applied"
        );
        ipsets.fail_next_restore("boom");
        assert!(ipsets.restore("destroy OTHER\n").is_err());
        assert!(ipsets.sets().contains_key("OTHER"));
        assert_eq!(ipsets.batches().len(), 3);
        assert!(
            ipsets
                .restore("create OTHER hash:ip,port family inet6\n")
                .is_err(),
            "another type under an existing name"
        );
    }

    #[test]
    fn the_real_binary_reports_failures() {
        // Without ipset (or without permission) this must be an error, never a panic; where it works the
        // empty batch is a no-op.
        let mut ipsets = ExecIpsets;
        assert!(ipsets.restore("").is_ok());
        let _ = ipsets.list();
    }
}
