//! When to verify and when to count refusals (pure: the caller passes the time).
//!
//! ```text
//! applied sync with backend B ─► B verified last? ─ yes ─► nothing
//!                                   └ no (a switch, the first sync, after a cleanup) ─► verify now;
//!                                      count refusals every `every` until `for` has passed
//!                                      probe only after a switch from a verified backend
//! ```
//!
//! Probes are real connections to the cluster's Services: their backends see them and the per-Service
//! counters count them. A start (every agent restart, every DaemonSet rollout) checks the kernel only;
//! a switch, what a rollout's gates judge, is also probed.

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

/// What an applied sync calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The backend was verified already.
    Nothing,
    /// The first sync since start or a cleanup: the kernel is checked, nothing probed.
    Check,
    /// A switch from another verified backend: checked and probed.
    CheckAndProbe,
}

/// The schedule's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    verified: Option<Backend>,
    next_count: Option<Instant>,
    count_until: Option<Instant>,
}

impl Schedule {
    /// A sync with `backend` in use was applied at `now`: whether it must be verified now (it is not
    /// the backend verified last), which also starts counting refusals.
    pub fn applied(&mut self, backend: Backend, now: Instant, config: &VerifyConfig) -> Due {
        let due = match self.verified {
            Some(verified) if verified == backend => return Due::Nothing,
            Some(_) => Due::CheckAndProbe,
            None => Due::Check,
        };
        self.verified = Some(backend);
        let counting = !config.refusals_for.is_zero() && !config.refusals_every.is_zero();
        self.next_count = counting.then(|| now + config.refusals_every);
        self.count_until = counting.then(|| now + config.refusals_for);
        due
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

    /// The last verification failed: the next applied sync checks the kernel again (without probes),
    /// whatever its backend.
    pub fn retry(&mut self) {
        self.verified = None;
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
        // (what, second, backend applied (None: a tick), verification due, count?)
        type Step = (&'static str, u64, Option<Backend>, Due, bool);
        let steps: [Step; 12] = [
            (
                "the first sync: no probes",
                0,
                Some(Backend::Iptables),
                Due::Check,
                false,
            ),
            (
                "the same backend again",
                1,
                Some(Backend::Iptables),
                Due::Nothing,
                false,
            ),
            ("before the first count", 4, None, Due::Nothing, false),
            ("the first count", 5, None, Due::Nothing, true),
            ("not twice", 6, None, Due::Nothing, false),
            ("the next", 10, None, Due::Nothing, true),
            ("a late tick counts once", 17, None, Due::Nothing, true),
            ("the last, at the end", 22, None, Due::Nothing, true),
            ("then none", 40, None, Due::Nothing, false),
            (
                "a switch: probed",
                41,
                Some(Backend::Nftables),
                Due::CheckAndProbe,
                false,
            ),
            ("counting again", 46, None, Due::Nothing, true),
            ("and back", 47, Some(Backend::Iptables), Due::CheckAndProbe, false),
        ];
        for (what, second, backend, verify, count) in steps {
            let verified = backend.map_or(Due::Nothing, |b| schedule.applied(b, at(second), &config));
            assert_eq!(verified, verify, "{what}");
            assert_eq!(schedule.count_due(at(second), &config), count, "{what}");
        }
        schedule.forget();
        assert_eq!(
            schedule.applied(Backend::Iptables, at(50), &config),
            Due::Check,
            "after a cleanup"
        );
    }

    #[test]
    fn a_failed_verification_is_checked_again_at_the_next_applied_sync() {
        let config = VerifyConfig::default();
        let start = Instant::now();
        let mut schedule = Schedule::default();
        assert_eq!(schedule.applied(Backend::Ipvs, start, &config), Due::Check);
        assert_eq!(schedule.applied(Backend::Ipvs, start, &config), Due::Nothing);
        schedule.retry();
        assert_eq!(
            schedule.applied(Backend::Ipvs, start, &config),
            Due::Check,
            "checked again, not probed"
        );
        assert_eq!(schedule.applied(Backend::Ipvs, start, &config), Due::Nothing);
    }

    #[test]
    fn counting_can_be_off() {
        let config = VerifyConfig {
            refusals_for: Duration::ZERO,
            ..VerifyConfig::default()
        };
        let start = Instant::now();
        let mut schedule = Schedule::default();
        assert_eq!(schedule.applied(Backend::Ipvs, start, &config), Due::Check);
        assert!(!schedule.count_due(start + Duration::from_secs(3600), &config));
    }
}
