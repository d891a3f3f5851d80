//! What the controller knows about the objects it writes (plans or slices), and whether a watch event
//! shows a change someone else made or only an echo of our own writes.
//!
//! ```text
//! before a write: intend(name, revision)        ─► history: the revisions we wrote (or are writing)
//! after a write:  written(name, revision, rv)   ─► history: the resourceVersions our writes produced
//! watch event ─► observe(): rv of one of our older writes, or an older revision of ours ─► Stale (ignored)
//!                           revision hashes right and is one of ours                     ─► Ours
//!                           anything else                                                ─► Foreign
//! ```
//!
//! Why: under a burst of changes the watch delivers the echo of write N (or an agent's status write on
//! top of it) after write N+1 was sent; taking that for an outside edit logged "restoring" and counted
//! `plans_restored` for nothing. Only content we never wrote, or a hash that no longer matches its
//! content, is someone else's doing.

use std::collections::{BTreeMap, VecDeque};

/// How many of our own revisions and resourceVersions per object are remembered.
const HISTORY: usize = 8;

/// What the controller last saw of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The revision in its spec.
    pub revision: String,
    /// The spec hashes to its revision (false after a hand edit that kept the revision).
    pub consistent: bool,
    /// For plans: the node (label, else spec).
    pub node: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct History {
    revisions: VecDeque<String>,
    resource_versions: VecDeque<String>,
    /// The watch delivered our latest revision: anything older arriving after it is not an echo.
    echoed_latest: bool,
}

impl History {
    fn push(list: &mut VecDeque<String>, value: &str) {
        if list.back().map(String::as_str) != Some(value) {
            list.push_back(value.to_string());
        }
        while list.len() > HISTORY {
            list.pop_front();
        }
    }
}

/// How to read one watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// An echo of one of our older writes, delivered late: it says nothing about the object now.
    Stale,
    /// Content we wrote.
    Ours,
    /// Content we never wrote, or a spec that no longer matches its revision.
    Foreign,
}

/// The objects of one kind.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    observed: BTreeMap<String, Observed>,
    history: BTreeMap<String, History>,
}

impl Tracker {
    /// Records a revision about to be written.
    pub fn intend(&mut self, name: &str, revision: &str) {
        History::push(
            &mut self.history.entry(name.to_string()).or_default().revisions,
            revision,
        );
    }

    /// Records a completed write and what the object now is.
    pub fn written(
        &mut self,
        name: &str,
        revision: &str,
        resource_version: Option<&str>,
        node: Option<&str>,
    ) {
        let history = self.history.entry(name.to_string()).or_default();
        if history.revisions.back().map(String::as_str) != Some(revision) {
            history.echoed_latest = false;
        }
        History::push(&mut history.revisions, revision);
        if let Some(rv) = resource_version {
            History::push(&mut history.resource_versions, rv);
        }
        self.observed.insert(
            name.to_string(),
            Observed {
                revision: revision.to_string(),
                consistent: true,
                node: node.map(str::to_string),
            },
        );
    }

    /// Takes an object seen by a watch. `relisted`: from a relist, which shows the state as of the list
    /// and is never taken for a late echo.
    pub fn observe(
        &mut self,
        name: &str,
        observed: Observed,
        resource_version: Option<&str>,
        relisted: bool,
    ) -> Echo {
        let echo = self.classify(name, &observed, resource_version, relisted);
        if let Some(history) = self.history.get_mut(name)
            && history.revisions.back() == Some(&observed.revision)
        {
            history.echoed_latest = true;
        }
        if echo != Echo::Stale {
            self.observed.insert(name.to_string(), observed);
        }
        echo
    }

    fn classify(
        &self,
        name: &str,
        observed: &Observed,
        resource_version: Option<&str>,
        relisted: bool,
    ) -> Echo {
        let Some(history) = self.history.get(name) else {
            return if observed.consistent {
                Echo::Ours
            } else {
                Echo::Foreign
            };
        };
        let latest = history.revisions.back();
        // Late echoes come before the echo of the latest write; after it, older content is someone
        // else's doing (a revert to a saved copy, a GitOps sync).
        if !relisted && !history.echoed_latest {
            let older_write = resource_version.is_some_and(|rv| {
                history.resource_versions.iter().any(|r| r == rv)
                    && history.resource_versions.back().map(String::as_str) != Some(rv)
            });
            let older_revision = latest.is_some_and(|l| *l != observed.revision)
                && history.revisions.iter().any(|r| *r == observed.revision);
            if older_write || (observed.consistent && older_revision) {
                return Echo::Stale;
            }
        }
        let ours = latest == Some(&observed.revision)
            || (!history.echoed_latest && history.revisions.iter().any(|r| *r == observed.revision));
        if observed.consistent && ours {
            Echo::Ours
        } else {
            Echo::Foreign
        }
    }

    /// Forgets an object (deleted).
    pub fn remove(&mut self, name: &str) -> Option<Observed> {
        self.observed.remove(name)
    }

    /// What was last seen of an object.
    pub fn get(&self, name: &str) -> Option<&Observed> {
        self.observed.get(name)
    }

    /// Every observed object.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Observed)> {
        self.observed.iter()
    }

    /// Names observed.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.observed.keys()
    }

    /// True when the object is observed with exactly this revision and a consistent spec.
    pub fn is_current(&self, name: &str, revision: &str) -> bool {
        self.observed
            .get(name)
            .is_some_and(|o| o.consistent && o.revision == revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(revision: &str, consistent: bool) -> Observed {
        Observed {
            revision: revision.into(),
            consistent,
            node: None,
        }
    }

    #[test]
    fn late_echoes_of_our_writes_are_stale_and_do_not_regress_what_we_know() {
        let mut t = Tracker::default();
        t.intend("a", "r1");
        t.written("a", "r1", Some("100"), None);
        t.intend("a", "r2");
        t.written("a", "r2", Some("101"), None);
        // The echo of the first write, then an agent's status write on top of it (new rv, old revision).
        assert_eq!(t.observe("a", seen("r1", true), Some("100"), false), Echo::Stale);
        assert_eq!(t.observe("a", seen("r1", true), Some("102"), false), Echo::Stale);
        assert!(t.is_current("a", "r2"));
        // The echo of the latest write, and a status write on top of it.
        assert_eq!(t.observe("a", seen("r2", true), Some("101"), false), Echo::Ours);
        assert_eq!(t.observe("a", seen("r2", true), Some("103"), false), Echo::Ours);
    }

    #[test]
    fn a_revert_to_an_older_revision_after_our_latest_echo_is_foreign() {
        let mut t = Tracker::default();
        t.intend("a", "r1");
        t.written("a", "r1", Some("100"), None);
        t.intend("a", "r2");
        t.written("a", "r2", Some("101"), None);
        assert_eq!(t.observe("a", seen("r2", true), Some("101"), false), Echo::Ours);
        // Someone applies a saved copy of r1 afterwards.
        assert_eq!(
            t.observe("a", seen("r1", true), Some("105"), false),
            Echo::Foreign
        );
        assert!(!t.is_current("a", "r2"), "so it gets rewritten");
    }

    #[test]
    fn content_we_never_wrote_or_a_broken_hash_is_foreign() {
        let mut t = Tracker::default();
        t.written("a", "r1", Some("100"), None);
        assert_eq!(
            t.observe("a", seen("r9", true), Some("104"), false),
            Echo::Foreign
        );
        assert_eq!(
            t.observe("a", seen("r1", false), Some("105"), false),
            Echo::Foreign
        );
        assert!(!t.is_current("a", "r1"));
        // An echo arriving before the write's response was recorded is still ours.
        t.intend("a", "r2");
        assert_eq!(t.observe("a", seen("r2", true), Some("106"), false), Echo::Ours);
    }

    #[test]
    fn a_relist_shows_the_current_state_even_when_it_is_an_older_revision_of_ours() {
        let mut t = Tracker::default();
        t.written("a", "r1", Some("100"), None);
        t.written("a", "r2", Some("101"), None);
        assert_eq!(t.observe("a", seen("r1", true), Some("107"), true), Echo::Ours);
        assert!(t.is_current("a", "r1"));
        // Objects from before this process started: consistent ones are taken as ours.
        assert_eq!(t.observe("b", seen("x", true), Some("1"), true), Echo::Ours);
        assert_eq!(t.observe("c", seen("x", false), Some("1"), false), Echo::Foreign);
    }
}
