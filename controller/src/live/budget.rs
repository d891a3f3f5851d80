//! The global write budget: a token bucket (QPS with a burst) every plan write passes through, so a
//! rollout that touches every node's plan cannot flood the API server.

use std::time::{Duration, Instant};

/// A token bucket. Pure: callers pass the clock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling at `qps` tokens per second, holding at most `burst`.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: qps.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token if one is there; otherwise says how long until one is.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Tokio's clock (so paused-time simulations see the budget refill in virtual time).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The shared budget.
#[derive(Debug)]
pub struct WriteBudget {
    bucket: std::sync::Mutex<TokenBucket>,
}

impl WriteBudget {
    /// A budget of `qps` writes per second with `burst`.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: std::sync::Mutex::new(TokenBucket::new(qps, burst, Instant::now())),
        }
    }

    /// Waits for a token; returns true when the write had to wait (it was throttled).
    pub async fn acquire(&self) -> bool {
        let mut throttled = false;
        loop {
            let wait = match self.bucket.lock() {
                Ok(mut bucket) => bucket.take(now()),
                Err(_) => Ok(()),
            };
            match wait {
                Ok(()) => return throttled,
                Err(wait) => {
                    throttled = true;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, start);
        for _ in 0..3 {
            assert!(bucket.take(start).is_ok());
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert!(bucket.take(start + Duration::from_millis(100)).is_ok());
        assert!(bucket.take(start + Duration::from_millis(100)).is_err());
        // Long idle refills only up to the burst.
        let later = start + Duration::from_secs(60);
        let taken = (0..10).filter(|_| bucket.take(later).is_ok()).count();
        assert_eq!(taken, 3);
    }
}
