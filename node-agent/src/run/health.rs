//! The agent's health and readiness, with kube-proxy's `/healthz` and `/livez` rules.
//!
//! ```text
//! run loop: plan update arrived ─► queued()        sync applied ─► synced(revision, families)  (also: ready)
//!           update handled without a sync (rejected, deleted) ─► handled()
//!           sync failed ─► failed() (counts as a queued update if none was)
//!           a plan seen (file, cache, API) ─► plan_seen(leaving): the node is eligible unless it leaves
//! proxy_health(Eligibility::Included) ─► kube-proxy's /healthz (:10256): healthy, and the node eligible
//! proxy_health(Eligibility::Ignored)  ─► kube-proxy's /livez: healthy
//!   healthy unless an update has been queued longer than the timeout (2 × resync period) with no
//!   successful sync since — kube-proxy's healthTimeout
//! report() ─► the agent's own /healthz on --metrics-bind (liveness: the node's eligibility never counts)
//! /readyz ─► ready(): a sync succeeded once (from the cache or the API)
//! ```
//!
//! A node that is leaving (the plan's `leaving` header: its Node is being deleted, or carries a leaving
//! taint) is not *eligible*: kube-proxy's `/healthz` answers 503 so a cloud load balancer stops sending
//! it new connections, while `/livez` stays 200 so the liveness probe never restarts a draining agent.
//! Until a plan is known the node counts as not eligible, as kube-proxy v1.36 does while it does not
//! know its Node: nothing is programmed yet, so a load balancer should not send anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use switchyard_api::{IpFamily, Leaving};

use crate::sync::{Clock, rfc3339};

/// How Go's zero `time.Time` reads in kube-proxy's body (no sync yet).
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[derive(Debug, Default)]
struct State {
    last_updated: Option<SystemTime>,
    queued_at: Option<Instant>,
    queued_wall: Option<SystemTime>,
    observed_revision: Option<String>,
    families: Vec<IpFamily>,
    ready: bool,
    node: NodeState,
}

/// What the agent knows of its node, for kube-proxy's `nodeEligible`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum NodeState {
    /// No plan yet.
    #[default]
    Unknown,
    /// The plan says the node serves.
    Serving,
    /// The plan says the node is leaving, or the plan is gone.
    Leaving(String),
}

/// Shared between the loop and the HTTP servers.
pub struct AgentHealth {
    node_name: String,
    timeout: Duration,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl std::fmt::Debug for AgentHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHealth")
            .field("node_name", &self.node_name)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The body of the agent's own `/healthz` on `--metrics-bind` (kube-proxy's fields, plus the node and
/// the revision in the kernel).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthReport {
    /// When the last successful sync finished (RFC 3339), if any.
    pub last_updated: Option<String>,
    /// Now (RFC 3339).
    pub current_time: String,
    /// This node.
    pub node_name: String,
    /// The verdict.
    pub healthy: bool,
    /// The plan revision in the kernel.
    pub observed_revision: Option<String>,
}

/// Whether the node's eligibility counts (kube-proxy's `/healthz`) or not (`/livez`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligibility {
    /// `/healthz`: unhealthy while the node is leaving; the body says `nodeEligible`.
    Included,
    /// `/livez`: the proxy's own health only.
    Ignored,
}

/// kube-proxy v1.36's `/healthz` and `/livez` body (`ProxyHealth`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyHealth {
    /// The newest successful sync of any family; now while healthy (kube-proxy's compatibility rule).
    pub last_updated: String,
    /// Now.
    pub current_time: String,
    /// `/healthz` only: the node is not leaving.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    /// The verdict (for `/healthz`: the proxy healthy and the node eligible).
    pub healthy: bool,
    /// Per IP family: its last successful sync and whether it is healthy.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<String, ProxierHealth>,
}

/// One family's health in [`ProxyHealth`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxierHealth {
    /// Its last successful sync.
    pub last_updated: String,
    /// Whether it is healthy.
    pub healthy: bool,
}

impl AgentHealth {
    /// `timeout` is kube-proxy's healthTimeout: 2 × the resync period.
    pub fn new(node_name: &str, timeout: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            node_name: node_name.to_string(),
            timeout,
            clock,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A plan update arrived and waits for a sync (the first one not yet handled keeps its time).
    pub fn queued(&self) {
        let now = self.clock.now();
        let wall = self.clock.wall();
        let mut state = self.state();
        if state.queued_at.is_none() {
            state.queued_at = Some(now);
            state.queued_wall = Some(wall);
        }
    }

    /// A sync succeeded: nothing is queued any more.
    pub fn synced(&self, revision: Option<String>, families: &[IpFamily]) {
        let wall = self.clock.wall();
        let mut state = self.state();
        state.last_updated = Some(wall);
        state.queued_at = None;
        state.observed_revision = revision;
        state.families = families.to_vec();
        state.ready = true;
    }

    /// An update was handled without programming anything (rejected plan, deleted plan).
    pub fn handled(&self) {
        self.state().queued_at = None;
    }

    /// A sync failed: the update (or the repair) is still owed.
    pub fn failed(&self) {
        self.queued();
    }

    /// The rules were removed (deleted plan after its grace period): nothing is observed any more.
    pub fn cleared(&self) {
        self.state().observed_revision = None;
    }

    /// A plan arrived (before it is synced: a load balancer must hear at once that the node leaves).
    /// Returns true when the node's eligibility changed.
    pub fn plan_seen(&self, leaving: Option<&Leaving>) -> bool {
        self.set_node(match leaving {
            None => NodeState::Serving,
            Some(leaving) => NodeState::Leaving(leaving.reason.clone()),
        })
    }

    /// The node's plan was deleted (its Node is gone): no load balancer should pick it.
    pub fn plan_deleted(&self) -> bool {
        self.set_node(NodeState::Leaving("the plan was deleted".into()))
    }

    fn set_node(&self, node: NodeState) -> bool {
        let mut state = self.state();
        let was = state.node == NodeState::Serving;
        state.node = node;
        was != (state.node == NodeState::Serving)
    }

    /// The node is eligible for load-balancer traffic: a plan is known and says it is not leaving.
    pub fn node_eligible(&self) -> bool {
        self.state().node == NodeState::Serving
    }

    /// When the oldest update still waiting for a sync arrived (kube-proxy's last-queued timestamp).
    pub fn queued_since(&self) -> Option<SystemTime> {
        let state = self.state();
        state.queued_wall.filter(|_| state.queued_at.is_some())
    }

    /// A sync succeeded once.
    pub fn ready(&self) -> bool {
        self.state().ready
    }

    fn proxy_healthy(&self, state: &State, now: Instant) -> bool {
        state
            .queued_at
            .is_none_or(|queued| now.saturating_duration_since(queued) < self.timeout)
    }

    /// The agent's own `/healthz` verdict and body (liveness: eligibility does not count).
    pub fn report(&self) -> HealthReport {
        let now = self.clock.now();
        let state = self.state();
        HealthReport {
            last_updated: state.last_updated.map(rfc3339),
            current_time: rfc3339(self.clock.wall()),
            node_name: self.node_name.clone(),
            healthy: self.proxy_healthy(&state, now),
            observed_revision: state.observed_revision.clone(),
        }
    }

    /// kube-proxy's `/healthz` (eligibility included) or `/livez` body and verdict.
    pub fn proxy_health(&self, eligibility: Eligibility) -> ProxyHealth {
        let now = self.clock.now();
        let wall = self.clock.wall();
        let state = self.state();
        let proxy_healthy = self.proxy_healthy(&state, now);
        let last = state.last_updated.map_or_else(|| ZERO_TIME.to_string(), rfc3339);
        let status = state
            .families
            .iter()
            .map(|family| {
                let family = match family {
                    IpFamily::IPv4 => "IPv4",
                    IpFamily::IPv6 => "IPv6",
                };
                (
                    family.to_string(),
                    ProxierHealth {
                        last_updated: last.clone(),
                        healthy: proxy_healthy,
                    },
                )
            })
            .collect();
        let node_eligible = state.node == NodeState::Serving;
        let (healthy, node_eligible) = match eligibility {
            Eligibility::Included => (proxy_healthy && node_eligible, Some(node_eligible)),
            Eligibility::Ignored => (proxy_healthy, None),
        };
        ProxyHealth {
            // kube-proxy: "lastUpdated" is recent while healthy, as in older releases.
            last_updated: if healthy { rfc3339(wall) } else { last },
            current_time: rfc3339(wall),
            node_eligible,
            healthy,
            status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::FakeClock;

    fn leaving() -> Leaving {
        Leaving {
            reason: "taint:karpenter.sh/disrupted".into(),
            since: None,
            drain_grace_seconds: 600,
        }
    }

    #[test]
    fn unhealthy_only_when_an_update_waits_longer_than_the_timeout() {
        let clock = Arc::new(FakeClock::at_2026());
        let health = AgentHealth::new("node-a", Duration::from_secs(60), clock.clone());
        let r = health.report();
        assert!(r.healthy && r.last_updated.is_none() && !health.ready());
        assert_eq!(r.current_time, "2026-01-01T00:00:00Z");

        health.queued();
        clock.advance(Duration::from_secs(50));
        health.queued(); // the first queued time counts
        assert!(health.report().healthy);
        assert_eq!(
            health.queued_since().map(rfc3339).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        clock.advance(Duration::from_secs(11));
        assert!(!health.report().healthy, "queued 61 s ago, nothing synced");

        health.synced(Some("rev-1".into()), &[IpFamily::IPv4]);
        let r = health.report();
        assert!(r.healthy && health.ready());
        assert_eq!(r.last_updated.as_deref(), Some("2026-01-01T00:01:01Z"));
        assert_eq!(r.observed_revision.as_deref(), Some("rev-1"));
        assert_eq!(health.queued_since(), None);

        health.failed();
        clock.advance(Duration::from_secs(61));
        assert!(!health.report().healthy, "a failing sync turns unhealthy too");
        health.handled();
        assert!(health.report().healthy);
    }

    #[test]
    fn healthz_follows_the_node_leaving_and_livez_does_not() {
        let clock = Arc::new(FakeClock::at_2026());
        let health = AgentHealth::new("node-a", Duration::from_secs(60), clock.clone());
        use Eligibility::{Ignored, Included};
        let verdicts = |h: &AgentHealth| {
            (
                h.proxy_health(Included).healthy,
                h.proxy_health(Included).node_eligible,
                h.proxy_health(Ignored).healthy,
            )
        };
        // (what, the plan's leaving header (None: no plan yet), /healthz healthy, nodeEligible,
        // /livez healthy, eligibility changed)
        let serving = Some(None);
        let gone = Some(Some(leaving()));
        let steps = [
            ("no plan yet", None, false, false, true, false),
            ("a serving plan", serving.clone(), true, true, true, true),
            ("the same again", serving.clone(), true, true, true, false),
            ("leaving", gone.clone(), false, false, true, true),
            ("still leaving", gone, false, false, true, false),
            ("back", serving, true, true, true, true),
        ];
        for (what, plan, healthz, eligible, livez, changed) in steps {
            let changes = plan.is_some_and(|leaving: Option<Leaving>| health.plan_seen(leaving.as_ref()));
            assert_eq!(changes, changed, "{what}: changed");
            assert_eq!(verdicts(&health), (healthz, Some(eligible), livez), "{what}");
        }
        assert!(health.plan_deleted());
        assert_eq!(verdicts(&health), (false, Some(false), true), "plan deleted");
        health.plan_seen(Some(&leaving()));
        health.queued();
        clock.advance(Duration::from_secs(61));
        assert_eq!(verdicts(&health), (false, Some(false), false), "stale: both fail");
    }

    #[test]
    fn the_body_is_kube_proxys() {
        let clock = Arc::new(FakeClock::at_2026());
        let health = AgentHealth::new("node-a", Duration::from_secs(60), clock.clone());
        let json = |e| serde_json::to_value(health.proxy_health(e)).unwrap();
        assert_eq!(
            json(Eligibility::Included),
            serde_json::json!({"lastUpdated": "0001-01-01T00:00:00Z", "currentTime": "2026-01-01T00:00:00Z",
                               "nodeEligible": false, "healthy": false})
        );
        assert_eq!(
            json(Eligibility::Ignored),
            serde_json::json!({"lastUpdated": "2026-01-01T00:00:00Z", "currentTime": "2026-01-01T00:00:00Z",
                               "healthy": true})
        );
        health.plan_seen(None);
        health.synced(Some("r".into()), &[IpFamily::IPv4, IpFamily::IPv6]);
        clock.advance(Duration::from_secs(5));
        assert_eq!(
            json(Eligibility::Included),
            serde_json::json!({"lastUpdated": "2026-01-01T00:00:05Z", "currentTime": "2026-01-01T00:00:05Z",
                               "nodeEligible": true, "healthy": true,
                               "status": {"IPv4": {"lastUpdated": "2026-01-01T00:00:00Z", "healthy": true},
                                          "IPv6": {"lastUpdated": "2026-01-01T00:00:00Z", "healthy": true}}})
        );
        health.queued();
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            json(Eligibility::Ignored),
            serde_json::json!({"lastUpdated": "2026-01-01T00:00:00Z", "currentTime": "2026-01-01T00:01:05Z",
                               "healthy": false,
                               "status": {"IPv4": {"lastUpdated": "2026-01-01T00:00:00Z", "healthy": false},
                                          "IPv6": {"lastUpdated": "2026-01-01T00:00:00Z", "healthy": false}}})
        );
    }
}
