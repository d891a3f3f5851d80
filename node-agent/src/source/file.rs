//! `run --plan-file`: the plan file polled for changes ([`FileSource`], the plan source, keeps a
//! [`PlanFilePoller`]).
//!
//! ```text
//! every poll interval: stat ─► (inode, size, mtime, ctime) changed? ─► read file (over 64 MiB: refused
//!                      by its size, unread) ─► content hash
//!                      changed? ─► parse (a plan, or a plan and its slices) ─► PlanUpdate::Objects
//!                                                               └──► PlanUpdate::Invalid (rules stay)
//!                      unreadable ─► PlanUpdate::Invalid (and the next readable content is applied
//!                                    again, even if it is the same as before)
//! ```

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{PlanSet, PlanSource, PlanUpdate, UpdateSender};
use crate::planfile::{parse_plan_bytes, read_plan_bytes};

/// Polls a plan file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSource {
    /// The plan file.
    pub path: PathBuf,
    /// How often it is looked at.
    pub poll_interval: Duration,
}

/// The polling state of a plan file: its last content (stat and hash) and what came of it.
#[derive(Debug, Default)]
pub struct PlanFilePoller {
    hash: Option<u64>,
    /// The file's metadata when `hash` was taken: an unchanged stat skips reading a large plan.
    stamp: Option<Stamp>,
    error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    inode: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            inode: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl PlanFilePoller {
    /// Looks at the file; `Some` when there is something new to say.
    pub fn poll(&mut self, path: &Path) -> Option<PlanUpdate> {
        let stamp = Stamp::of(path);
        if stamp.is_some() && stamp == self.stamp && self.hash.is_some() {
            return None;
        }
        self.stamp = stamp;
        let bytes = match read_plan_bytes(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                // Whatever comes back later, even the same content, must be parsed and applied again.
                self.hash = None;
                self.stamp = None;
                return self.failed(e.to_string());
            }
        };
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        let hash = hasher.finish();
        if self.hash == Some(hash) {
            return None;
        }
        self.hash = Some(hash);
        // The bytes become the text parsed (no second read, no copy): one copy of a large plan at a time.
        match parse_plan_bytes(path, bytes) {
            Ok(loaded) => {
                self.error = None;
                Some(PlanUpdate::Objects(PlanSet::from_file(
                    loaded.plan,
                    loaded.slices,
                )))
            }
            Err(e) => self.failed(e.to_string()),
        }
    }

    fn failed(&mut self, message: String) -> Option<PlanUpdate> {
        if self.error.as_ref() == Some(&message) {
            return None;
        }
        self.error = Some(message.clone());
        Some(PlanUpdate::Invalid(message))
    }
}

impl PlanSource for FileSource {
    fn spawn(self: Box<Self>, tx: UpdateSender) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut poller = PlanFilePoller::default();
            let mut ticker = tokio::time::interval(self.poll_interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticker.tick().await;
                // Reading and parsing a large plan is blocking work.
                let update = tokio::task::block_in_place(|| poller.poll(&self.path));
                if let Some(update) = update
                    && tx.send(Some(Arc::new(update))).is_err()
                {
                    return;
                }
            }
        })
    }

    fn describe(&self) -> String {
        format!("plan file {}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::NodeForwardingPlan;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn changes_are_reported_once_and_errors_once() {
        let scratch = switchyard_test_support::scratch::dir("filesource").unwrap();
        let dir = scratch.path();
        let path = dir.join("plan.yaml");
        let mut poller = PlanFilePoller::default();
        assert!(
            matches!(poller.poll(&path), Some(PlanUpdate::Invalid(m)) if m.contains("reading plan file"))
        );
        assert_eq!(poller.poll(&path), None, "the same error is said once");
        let spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        let object = NodeForwardingPlan::new("node-a", spec.clone());
        std::fs::write(&path, serde_saphyr::to_string(&object).unwrap()).unwrap();
        match poller.poll(&path) {
            Some(PlanUpdate::Objects(set)) => {
                assert_eq!(set.plan, Arc::new(spec.clone()));
                assert!(set.slices.is_empty());
                assert_eq!(set.origin, super::super::Origin::File);
                assert_eq!(set.revision(), spec.revision.as_str());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(poller.poll(&path), None, "unchanged");
        std::fs::write(&path, "spec: [").unwrap();
        assert!(matches!(poller.poll(&path), Some(PlanUpdate::Invalid(_))));
    }

    #[test]
    fn a_file_over_the_limit_is_refused_by_its_size_and_the_good_plan_comes_back() {
        let scratch = switchyard_test_support::scratch::dir("filesource-big").unwrap();
        let dir = scratch.path();
        let path = dir.join("plan.yaml");
        let spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        let good = serde_saphyr::to_string(&NodeForwardingPlan::new("node-a", spec)).unwrap();
        std::fs::write(&path, &good).unwrap();
        let mut poller = PlanFilePoller::default();
        assert!(matches!(poller.poll(&path), Some(PlanUpdate::Objects(_))));
        // Sparse: the size says it all, and nothing of it is read.
        let big = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        big.set_len(switchyard_api::yaml::MAX_PLAN_BYTES as u64 + 1)
            .unwrap();
        drop(big);
        match poller.poll(&path) {
            Some(PlanUpdate::Invalid(message)) => assert!(
                message.contains(
                    "the file is 67108865 bytes, more than the 67108864 (64 MiB) a plan file may hold"
                ),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(poller.poll(&path), None, "said once");
        std::fs::write(&path, &good).unwrap();
        assert!(
            matches!(poller.poll(&path), Some(PlanUpdate::Objects(_))),
            "the same good content as before is applied again"
        );
    }
}
