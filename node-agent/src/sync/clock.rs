//! Time for the sync logic, passed in rather than read, so decisions and status stay testable.
//!
//! ```text
//! SystemClock | FakeClock ─► now() (monotonic: periods, backoff) ─► Syncer
//!                          └► wall() (status timestamps) ─► rfc3339()
//! ```

#[cfg(any(test, feature = "testing"))]
use std::sync::{Mutex, PoisonError};
#[cfg(any(test, feature = "testing"))]
use std::time::Duration;
use std::time::{Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;

/// A source of time.
pub trait Clock: Send + Sync {
    /// Monotonic time, for periods and backoff.
    fn now(&self) -> Instant;
    /// Wall-clock time, for timestamps in the status.
    fn wall(&self) -> SystemTime;
}

/// The real clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct FakeClock {
    start: Instant,
    wall: SystemTime,
    offset: Mutex<Duration>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeClock {
    /// Starts at `wall` (and an arbitrary monotonic instant).
    pub fn new(wall: SystemTime) -> Self {
        Self {
            start: Instant::now(),
            wall,
            offset: Mutex::new(Duration::ZERO),
        }
    }

    /// Starts at 2026-01-01T00:00:00Z.
    pub fn at_2026() -> Self {
        Self::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
    }

    /// Moves both clocks forward.
    pub fn advance(&self, by: Duration) {
        *self.offset.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }

    fn offset(&self) -> Duration {
        *self.offset.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(any(test, feature = "testing"))]
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.start + self.offset()
    }
    fn wall(&self) -> SystemTime {
        self.wall + self.offset()
    }
}

/// RFC 3339 in UTC with second precision (`2026-01-01T00:00:00Z`), as Kubernetes writes timestamps.
pub fn rfc3339(time: SystemTime) -> String {
    Timestamp::try_from(time)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_seconds() {
        let clock = FakeClock::at_2026();
        assert_eq!(rfc3339(clock.wall()), "2026-01-01T00:00:00Z");
        let before = clock.now();
        clock.advance(Duration::from_millis(61_500));
        assert_eq!(rfc3339(clock.wall()), "2026-01-01T00:01:01Z");
        assert_eq!(clock.now() - before, Duration::from_millis(61_500));
    }
}
