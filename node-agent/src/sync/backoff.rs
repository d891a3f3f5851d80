//! Exponential backoff between retries of a failed sync: 1 s, doubling, at most 30 s by default.
//!
//! ```text
//! failure ─► next() ─► 1s, 2s, 4s, … 30s, 30s …      success ─► reset()
//! ```

use std::time::Duration;

/// The delay before the next retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `min`, doubles up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.min(max);
        Self { min, max, next: min }
    }

    /// The delay to wait now; the one after it is twice as long (capped).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::default();
        let secs: Vec<u64> = (0..7).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
    }
}
