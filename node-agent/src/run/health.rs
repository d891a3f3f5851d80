//! The agent's health and readiness, with kube-proxy's `/healthz` rule.
//!
//! ```text
//! run loop: plan update arrived ─► queued()        sync applied ─► synced(revision)   (also: ready)
//!           update handled without a sync (rejected, deleted) ─► handled()
//!           sync failed ─► failed() (counts as a queued update if none was)
//! /healthz ─► report(): healthy unless an update has been queued longer than the timeout
//!             (2 × resync period) with no successful sync since — kube-proxy's healthTimeout
//! /readyz ─► ready(): a sync succeeded once (from the cache or the API)
//! ```

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::sync::{Clock, rfc3339};

#[derive(Debug, Default)]
struct State {
    last_updated: Option<SystemTime>,
    queued_at: Option<Instant>,
    observed_revision: Option<String>,
    ready: bool,
}

/// Shared between the loop and the HTTP server.
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

/// The `/healthz` body (kube-proxy's fields, plus the node and the revision in the kernel).
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
        self.state().queued_at.get_or_insert(now);
    }

    /// A sync succeeded: nothing is queued any more.
    pub fn synced(&self, revision: Option<String>) {
        let wall = self.clock.wall();
        let mut state = self.state();
        state.last_updated = Some(wall);
        state.queued_at = None;
        state.observed_revision = revision;
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

    /// A sync succeeded once.
    pub fn ready(&self) -> bool {
        self.state().ready
    }

    /// The `/healthz` verdict and body.
    pub fn report(&self) -> HealthReport {
        let now = self.clock.now();
        let state = self.state();
        let healthy = state
            .queued_at
            .is_none_or(|queued| now.saturating_duration_since(queued) <= self.timeout);
        HealthReport {
            last_updated: state.last_updated.map(rfc3339),
            current_time: rfc3339(self.clock.wall()),
            node_name: self.node_name.clone(),
            healthy,
            observed_revision: state.observed_revision.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::FakeClock;

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
        clock.advance(Duration::from_secs(11));
        assert!(!health.report().healthy, "queued 61 s ago, nothing synced");

        health.synced(Some("rev-1".into()));
        let r = health.report();
        assert!(r.healthy && health.ready());
        assert_eq!(r.last_updated.as_deref(), Some("2026-01-01T00:01:01Z"));
        assert_eq!(r.observed_revision.as_deref(), Some("rev-1"));

        health.failed();
        clock.advance(Duration::from_secs(61));
        assert!(!health.report().healthy, "a failing sync turns unhealthy too");
        health.handled();
        assert!(health.report().healthy);
    }
}
