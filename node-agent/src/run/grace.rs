//! A deleted plan's grace period: the rules stay in place for a while (a plan deleted by mistake, or
//! recreated by the controller, must not interrupt forwarding), then go, unless the grace is `never`.
//!
//! ```text
//! PlanUpdate::Deleted ─► deleted(now) ─► Kept { since }  ─ grace over ─► due() ─► cleanup, removed()
//!                                           │                                       └► Removed
//! PlanUpdate::Objects ─► restored() ────────┴─ back to normal: the plan is applied as usual
//! ```
//!
//! The time of the deletion is also written next to the plan cache (`<cache>.deleted-at`, Unix seconds),
//! so an agent restarted inside the grace period resumes it instead of starting it again: a restart
//! loop must not keep a deleted plan's rules forever.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a deleted plan's rules stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GracePeriod {
    /// This long, then the rules are removed.
    For(Duration),
    /// For good.
    Never,
}

impl GracePeriod {
    /// Parses `never` or a duration (`15m`, `30s`, `1h30m`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim() == "never" {
            return Ok(Self::Never);
        }
        switchyard_api::duration::parse(text)
            .map(Self::For)
            .map_err(|e| format!("{e}, or never"))
    }
}

impl std::fmt::Display for GracePeriod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::For(d) => write!(f, "{d:?}"),
            Self::Never => f.write_str("never"),
        }
    }
}

/// Where a deleted plan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The plan exists (or never did).
    None,
    /// Deleted at `since`; the rules stay.
    Kept {
        /// When the deletion was confirmed.
        since: Instant,
    },
    /// Deleted at `since`; the rules were removed after the grace period.
    Removed {
        /// When the deletion was confirmed.
        since: Instant,
    },
}

/// The grace-period state machine.
#[derive(Debug, Clone)]
pub struct Grace {
    period: GracePeriod,
    state: Deletion,
}

impl Grace {
    /// Nothing deleted yet.
    pub fn new(period: GracePeriod) -> Self {
        Self {
            period,
            state: Deletion::None,
        }
    }

    /// The plan is gone (found at `now`, deleted at `since`: earlier when a previous run of the agent
    /// recorded it). False when it already was.
    pub fn deleted(&mut self, now: Instant, since: Option<Instant>) -> bool {
        if self.state != Deletion::None {
            return false;
        }
        self.state = Deletion::Kept {
            since: since.filter(|s| *s <= now).unwrap_or(now),
        };
        true
    }

    /// The plan is back. True when it had been deleted.
    pub fn restored(&mut self) -> bool {
        std::mem::replace(&mut self.state, Deletion::None) != Deletion::None
    }

    /// The grace period is over and the rules are still there.
    pub fn due(&self, now: Instant) -> bool {
        match (self.state, self.period) {
            (Deletion::Kept { since }, GracePeriod::For(period)) => now >= since + period,
            _ => false,
        }
    }

    /// The rules were removed.
    pub fn removed(&mut self) {
        if let Deletion::Kept { since } = self.state {
            self.state = Deletion::Removed { since };
        }
    }

    /// How long ago the plan was found deleted.
    pub fn since(&self, now: Instant) -> Option<Duration> {
        match self.state {
            Deletion::None => None,
            Deletion::Kept { since } | Deletion::Removed { since } => {
                Some(now.saturating_duration_since(since))
            }
        }
    }

    /// The current state.
    pub fn state(&self) -> Deletion {
        self.state
    }

    /// The configured period.
    pub fn period(&self) -> GracePeriod {
        self.period
    }
}

/// Where the time of a deletion is recorded for `cache` (the plan cache file).
pub fn marker_path(cache: &Path) -> PathBuf {
    let mut name = cache.as_os_str().to_owned();
    name.push(".deleted-at");
    PathBuf::from(name)
}

/// The recorded deletion as an [`Instant`] of this run (`now` is [`Instant::now`], `wall` the wall
/// clock at the same moment): `None` without a readable record, or for one in the future.
pub fn recorded_since(text: &str, now: Instant, wall: SystemTime) -> Option<Instant> {
    let seconds: u64 = text.trim().parse().ok()?;
    let at = UNIX_EPOCH.checked_add(Duration::from_secs(seconds))?;
    let ago = wall.duration_since(at).ok()?;
    now.checked_sub(ago)
}

/// The record of a deletion at `wall`.
pub fn record(wall: SystemTime) -> String {
    let seconds = wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{seconds}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_stay_for_the_grace_period_then_go_unless_never() {
        let start = Instant::now();
        let mut grace = Grace::new(GracePeriod::For(Duration::from_secs(60)));
        assert!(!grace.due(start));
        assert!(grace.deleted(start, None));
        assert!(
            !grace.deleted(start + Duration::from_secs(1), None),
            "already deleted"
        );
        assert!(!grace.due(start + Duration::from_secs(59)));
        assert!(grace.due(start + Duration::from_secs(60)));
        grace.removed();
        assert!(!grace.due(start + Duration::from_secs(61)));
        assert_eq!(
            grace.since(start + Duration::from_secs(61)),
            Some(Duration::from_secs(61))
        );
        assert!(grace.restored());
        assert!(!grace.restored());
        assert_eq!(grace.since(start), None);

        let mut never = Grace::new(GracePeriod::Never);
        never.deleted(start, None);
        assert!(!never.due(start + Duration::from_secs(1 << 30)));
    }

    #[test]
    fn a_recorded_deletion_resumes_the_grace_period_of_an_earlier_run() {
        let now = Instant::now() + Duration::from_secs(3600);
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let text = record(wall - Duration::from_secs(50));
        assert_eq!(text, "1799999950\n");
        let since = recorded_since(&text, now, wall);
        assert_eq!(since, Some(now - Duration::from_secs(50)));
        let mut grace = Grace::new(GracePeriod::For(Duration::from_secs(60)));
        assert!(grace.deleted(now, since));
        assert!(!grace.due(now + Duration::from_secs(9)));
        assert!(
            grace.due(now + Duration::from_secs(10)),
            "60 s from the recorded deletion, not from now"
        );
        // Unreadable or future records start the period now.
        assert_eq!(recorded_since("soon", now, wall), None);
        assert_eq!(
            recorded_since(&record(wall + Duration::from_secs(5)), now, wall),
            None
        );
        assert_eq!(
            marker_path(Path::new("/var/lib/switchyard/plan.yaml")),
            PathBuf::from("/var/lib/switchyard/plan.yaml.deleted-at")
        );
    }

    #[test]
    fn grace_periods_parse() {
        assert_eq!(GracePeriod::parse("never"), Ok(GracePeriod::Never));
        assert_eq!(
            GracePeriod::parse("15m"),
            Ok(GracePeriod::For(Duration::from_secs(900)))
        );
        assert!(GracePeriod::parse("soon").unwrap_err().contains("never"));
    }
}
