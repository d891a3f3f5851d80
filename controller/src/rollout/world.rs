//! What a rollout step sees of the cluster: the Nodes (name and labels), each node's plan (the backend
//! it asks for, its revision, its agent's status), which nodes other rollouts hold, and the time. Plain
//! data, filled by the live edge from its watches and by the tests from tables.

use std::collections::BTreeMap;
use std::str::FromStr;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use switchyard_api::{Backend, NodeForwardingPlanStatus};

/// One Node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// One node's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanView {
    /// `spec.backend`: what the controller planned for the node.
    pub backend: Backend,
    /// `spec.revision`.
    pub revision: String,
    /// What its agent reports.
    pub status: Option<NodeForwardingPlanStatus>,
}

/// The cluster as one step sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    /// Now.
    pub now: Timestamp,
    /// The node label that decides a node's backend (`backendNodeLabel`).
    pub label_key: String,
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeView>,
    /// Plans by node name.
    pub plans: BTreeMap<String, PlanView>,
    /// Nodes held by another rollout that is still active, and which one.
    pub held: BTreeMap<String, String>,
    /// Nodes whose last label write of this rollout failed, and why.
    pub write_errors: BTreeMap<String, String>,
}

impl World {
    /// The backend label of `node` (absent when the node has none, or is gone).
    pub fn label(&self, node: &str) -> Option<&str> {
        self.nodes
            .get(node)
            .and_then(|n| n.labels.get(&self.label_key))
            .map(String::as_str)
    }

    /// `now` as status timestamps are written (RFC 3339, whole seconds).
    pub fn stamp(&self) -> String {
        stamp(self.now)
    }

    /// How long ago `since` was (zero when it is unreadable or in the future).
    pub fn elapsed(&self, since: Option<&str>) -> SignedDuration {
        since
            .and_then(|text| Timestamp::from_str(text).ok())
            .map_or(SignedDuration::ZERO, |at| {
                self.now.duration_since(at).max(SignedDuration::ZERO)
            })
    }

    /// Whether `at` is not before `since` (both RFC 3339; an unreadable one is not).
    pub fn not_before(at: &str, since: Option<&str>) -> bool {
        let (Ok(at), Some(Ok(since))) = (Timestamp::from_str(at), since.map(Timestamp::from_str)) else {
            return false;
        };
        // Status times are whole seconds: a verification in the same second as the switch counts.
        at.as_second() >= since.as_second()
    }
}

/// A time as status timestamps are written (RFC 3339, whole seconds, UTC).
pub fn stamp(at: Timestamp) -> String {
    format!("{at:.0}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_whole_seconds_and_compare_by_the_second() {
        let now = Timestamp::from_second(1_796_000_000).unwrap();
        assert_eq!(stamp(now), "2026-11-30T00:53:20Z");
        let world = World {
            now,
            label_key: "switchyard.io/backend".into(),
            nodes: BTreeMap::new(),
            plans: BTreeMap::new(),
            held: BTreeMap::new(),
            write_errors: BTreeMap::new(),
        };
        assert_eq!(
            world.elapsed(Some("2026-11-30T00:52:20Z")),
            SignedDuration::from_secs(60)
        );
        assert_eq!(world.elapsed(Some("not a time")), SignedDuration::ZERO);
        assert_eq!(world.elapsed(Some("2026-12-30T00:00:00Z")), SignedDuration::ZERO);
        assert!(World::not_before(
            "2026-11-30T00:53:20.5Z",
            Some("2026-11-30T00:53:20Z")
        ));
        assert!(!World::not_before(
            "2026-11-30T00:53:19Z",
            Some("2026-11-30T00:53:20Z")
        ));
        assert!(!World::not_before("2026-11-30T00:53:20Z", None));
    }
}
