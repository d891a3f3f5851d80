//! When to verify and when to count refusals (pure: the caller passes the time).
//!
//! ```text
//! applied sync with backend B ─► B verified last? ─ yes ─► nothing
//!                                   └ no (a switch, the first sync, after a cleanup) ─► verify now;
//!                                      count refusals every `every` until `for` has passed
//! ```

use std::time::{Duration, Instant};

use switchyard_api::Backend;

/// How verifications run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyConfig {
    /// At most this many frontends probed (0: no probes).
    pub probes: usize,
    /// Each probe's timeout.
    pub probe_timeout: Duration,
    /// How long after a verification refusals are counted (0: not at all).
    pub refusals_for: Duration,
    /// How often they are counted meanwhile.
    pub refusals_every: Duration,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            probes: 10,
            probe_timeout: Duration::from_secs(1),
            refusals_for: Duration::from_secs(600),
            refusals_every: Duration::from_secs(5),
        }
    }
}

/// The schedule's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    verified: Option<Backend>,
    next_count: Option<Instant>,
    count_until: Option<Instant>,
}

impl Schedule {
    /// A sync with `backend` in use was applied at `now`: true when it must be verified now (it is
    /// not the backend verified last), which also starts counting refusals.
    pub fn applied(&mut self, backend: Backend, now: Instant, config: &VerifyConfig) -> bool {
        if self.verified == Some(backend) {
            return false;
        }
        self.verified = Some(backend);
        let counting = !config.refusals_for.is_zero() && !config.refusals_every.is_zero();
        self.next_count = counting.then(|| now + config.refusals_every);
        self.count_until = counting.then(|| now + config.refusals_for);
        true
    }

    /// True when refusals are to be counted at `now`; the last count is the first one at or after the
    /// end of the counting time.
    pub fn count_due(&mut self, now: Instant, config: &VerifyConfig) -> bool {
        let Some(next) = self.next_count else {
            return false;
        };
        if now < next {
            return false;
        }
        self.next_count = match self.count_until {
            Some(until) if now < until => Some(now + config.refusals_every),
            _ => None,
        };
        true
    }

    /// The rules are gone (cleanup): the next applied sync is verified whatever its backend.
    pub fn forget(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_is_verified_once_and_its_refusals_counted_for_a_while() {
        let config = VerifyConfig {
            refusals_for: Duration::from_secs(20),
            refusals_every: Duration::from_secs(5),
            ..VerifyConfig::default()
        };
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut schedule = Schedule::default();
        // (what, second, backend applied (None: a tick), verify?, count?)
        type Step = (&'static str, u64, Option<Backend>, bool, bool);
        let steps: [Step; 12] = [
            ("the first sync", 0, Some(Backend::Iptables), true, false),
            ("the same backend again", 1, Some(Backend::Iptables), false, false),
            ("before the first count", 4, None, false, false),
            ("the first count", 5, None, false, true),
            ("not twice", 6, None, false, false),
            ("the next", 10, None, false, true),
            ("a late tick counts once", 17, None, false, true),
            ("the last, at the end", 22, None, false, true),
            ("then none", 40, None, false, false),
            ("a switch", 41, Some(Backend::Nftables), true, false),
            ("counting again", 46, None, false, true),
            ("and back", 47, Some(Backend::Iptables), true, false),
        ];
        for (what, second, backend, verify, count) in steps {
            let verified = backend.is_some_and(|b| schedule.applied(b, at(second), &config));
            assert_eq!(verified, verify, "{what}");
            assert_eq!(schedule.count_due(at(second), &config), count, "{what}");
        }
        schedule.forget();
        assert!(
            schedule.applied(Backend::Iptables, at(50), &config),
            "after a cleanup"
        );
    }

    #[test]
    fn counting_can_be_off() {
        let config = VerifyConfig {
            refusals_for: Duration::ZERO,
            ..VerifyConfig::default()
        };
        let start = Instant::now();
        let mut schedule = Schedule::default();
        assert!(schedule.applied(Backend::Ipvs, start, &config));
        assert!(!schedule.count_due(start + Duration::from_secs(3600), &config));
    }
}
