//! A leaving node's drain as the status tells it: when it began, the connections counted, and whether
//! it is done. Pure: the counts come from the conntrack worker, the time from the syncer's clock.
//!
//! ```text
//! plan applied with `leaving` ─► Drain::start(reason, grace, now)   (once; a plan without it ends it)
//! conntrack worker ─► DrainCount ─► Drain::counted(count, now)
//! Drain::status() ─► status.draining        Drain::condition(now) ─► Drained: True NoConnections
//!                                                                     | True GracePeriodEnded
//!                                                                     | False ConnectionsRemain (or not counted yet)
//! ```

use std::time::{Duration, SystemTime};

use switchyard_api::conditions::{reasons, status as cond};
use switchyard_api::{DrainStatus, Leaving, ServiceConnections};

use super::rfc3339;
use crate::conntrack::drain::DrainCount;

/// How often a leaving node's connections are counted (the status shows them at least every 10 s).
pub const COUNT_EVERY: Duration = Duration::from_secs(5);

/// One drain, from the first plan that said the node is leaving.
#[derive(Debug, Clone, PartialEq)]
pub struct Drain {
    reason: String,
    since: SystemTime,
    grace: Duration,
    last: Option<(DrainCount, SystemTime)>,
}

impl Drain {
    /// A drain that begins `now` for `leaving`.
    pub fn start(leaving: &Leaving, now: SystemTime) -> Self {
        Self {
            reason: leaving.reason.clone(),
            since: now,
            grace: Duration::from_secs(u64::from(leaving.drain_grace_seconds)),
            last: None,
        }
    }

    /// The plan still says the node is leaving, maybe for another reason or grace: the drain goes on
    /// from when it began.
    pub fn update(&mut self, leaving: &Leaving) {
        self.reason.clone_from(&leaving.reason);
        self.grace = Duration::from_secs(u64::from(leaving.drain_grace_seconds));
    }

    /// A count arrived; returns true when what the status shows changed.
    pub fn counted(&mut self, count: DrainCount, at: SystemTime) -> bool {
        self.last = Some((count, at));
        true
    }

    /// Connections counted last, if any.
    pub fn connections(&self) -> Option<&DrainCount> {
        self.last.as_ref().map(|(count, _)| count)
    }

    /// The status' `draining`.
    pub fn status(&self) -> DrainStatus {
        DrainStatus {
            reason: self.reason.clone(),
            since: rfc3339(self.since),
            connections: self.last.as_ref().map(|(count, _)| count.total),
            services: self
                .last
                .iter()
                .flat_map(|(count, _)| &count.busiest)
                .map(|(service, connections)| ServiceConnections {
                    service: service.clone(),
                    connections: *connections,
                })
                .collect(),
            checked_at: self.last.as_ref().map(|(_, at)| rfc3339(*at)),
        }
    }

    /// The `Drained` condition at `now`: status, reason, message.
    pub fn condition(&self, now: SystemTime) -> (&'static str, &'static str, String) {
        let leaving_for = now.duration_since(self.since).unwrap_or_default();
        let counted = self.last.as_ref().map(|(count, _)| count.total);
        if counted == Some(0) {
            return (
                cond::TRUE,
                reasons::NO_CONNECTIONS,
                "no connection goes through the node any more".to_string(),
            );
        }
        if leaving_for >= self.grace {
            return (
                cond::TRUE,
                reasons::GRACE_PERIOD_ENDED,
                format!(
                    "the drain's grace period ({} s) ended with {} connections still open",
                    self.grace.as_secs(),
                    counted.map_or_else(|| "an unknown number of".to_string(), |n| n.to_string())
                ),
            );
        }
        let remaining = self.grace - leaving_for;
        let message = match counted {
            Some(n) => format!(
                "{n} connections still go through the node; Drained at the latest in {} s (grace period)",
                remaining.as_secs()
            ),
            None => "not counted yet".to_string(),
        };
        (cond::FALSE, reasons::CONNECTIONS_REMAIN, message)
    }

    /// When the condition changes next without a new count (the grace period ending).
    pub fn grace_ends(&self) -> SystemTime {
        self.since + self.grace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaving(grace: u32) -> Leaving {
        Leaving {
            reason: "taint:karpenter.sh/disrupted".into(),
            since: None,
            drain_grace_seconds: grace,
        }
    }

    fn count(total: u64) -> DrainCount {
        DrainCount {
            total,
            busiest: vec![("shop/web".into(), total)],
        }
    }

    #[test]
    fn drained_when_the_connections_end_or_the_grace_period_does() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_798_761_600);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut drain = Drain::start(&leaving(60), t0);
        // (what, a count at that second, seconds, Drained, reason)
        let steps: Vec<(&str, Option<u64>, u64, &str, &str)> = vec![
            ("not counted yet", None, 0, "False", "ConnectionsRemain"),
            ("three open", Some(3), 5, "False", "ConnectionsRemain"),
            ("one open", Some(1), 10, "False", "ConnectionsRemain"),
            ("all ended", Some(0), 15, "True", "NoConnections"),
            ("one again", Some(1), 20, "False", "ConnectionsRemain"),
            ("grace over with one open", None, 60, "True", "GracePeriodEnded"),
            ("and it ends", Some(0), 65, "True", "NoConnections"),
        ];
        for (what, counted, second, status, reason) in steps {
            if let Some(total) = counted {
                drain.counted(count(total), at(second));
            }
            let (got_status, got_reason, message) = drain.condition(at(second));
            assert_eq!((got_status, got_reason), (status, reason), "{what}: {message}");
        }
        let status = drain.status();
        assert_eq!(status.since, rfc3339(t0));
        assert_eq!(status.connections, Some(0));
        assert_eq!(status.checked_at, Some(rfc3339(at(65))));
        assert_eq!(status.reason, "taint:karpenter.sh/disrupted");
        assert_eq!(drain.grace_ends(), at(60));
    }

    #[test]
    fn a_new_reason_keeps_the_drain_going_from_when_it_began() {
        let t0 = SystemTime::UNIX_EPOCH;
        let mut drain = Drain::start(&leaving(600), t0);
        drain.counted(count(2), t0);
        let mut deleted = leaving(30);
        deleted.reason = "deletionTimestamp".into();
        drain.update(&deleted);
        let status = drain.status();
        assert_eq!(
            (status.reason.as_str(), status.connections),
            ("deletionTimestamp", Some(2))
        );
        assert_eq!(
            drain.condition(t0 + Duration::from_secs(31)).1,
            "GracePeriodEnded"
        );
        assert_eq!(
            status.services,
            vec![ServiceConnections {
                service: "shop/web".into(),
                connections: 2
            }]
        );
    }
}
