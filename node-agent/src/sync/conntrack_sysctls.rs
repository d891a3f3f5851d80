//! Conntrack's sysctls kept as the settings ask, after full syncs: the syncer's side of
//! [`crate::conntrack::settings`] (which decides what to write).
//!
//! ```text
//! Syncer::apply ─► Ok, full ─► ConntrackSysctls::reconcile ─► settings::apply(Sysctls) ─► [Outcome]
//!   ─► logged: every value found and what was done, the first time; later only a write or a failure
//!   ─► SyncMetrics::conntrack_sysctl_failures
//!   ─► the problem (None when every value is as asked) ─► the syncer's Degraded (ConntrackSysctlFailed)
//! ```
//!
//! Full syncs only: the first sync at start (its rules have loaded the conntrack module by then, so the
//! files exist), one after a failure or drift, and one every full-sync period, which puts back a value
//! someone lowered and retries a write that failed. Never fatal: forwarding does not depend on these.

use super::metrics::SyncMetrics;
use crate::conntrack::settings::{self, ConntrackSettings};
use crate::sysctl::Sysctls;

/// The sysctl edge and what to keep there.
pub struct ConntrackSysctls {
    sysctls: Box<dyn Sysctls>,
    settings: ConntrackSettings,
    reported: bool,
}

impl ConntrackSysctls {
    /// Keeps `settings` through `sysctls`.
    pub fn new(sysctls: Box<dyn Sysctls>, settings: ConntrackSettings) -> Self {
        Self {
            sysctls,
            settings,
            reported: false,
        }
    }

    /// Reads, writes what [`settings::apply`] decides, logs and counts; returns what failed, if anything.
    /// `route_localnet`: the applied plan serves localhost NodePorts.
    pub fn reconcile(&mut self, metrics: &SyncMetrics, route_localnet: bool) -> Option<String> {
        let settings = ConntrackSettings {
            route_localnet: route_localnet || self.settings.route_localnet,
            ..self.settings
        };
        let outcomes = settings::apply(self.sysctls.as_mut(), &settings);
        let first = !self.reported;
        self.reported = true;
        let mut failed = Vec::new();
        for outcome in &outcomes {
            let sysctl = crate::sysctl::dotted(outcome.sysctl);
            match &outcome.done {
                // A value as asked is worth a line once; a write every time.
                Ok(decision) if decision.writes() || first => tracing::info!(
                    %sysctl,
                    found = outcome.found,
                    wanted = outcome.wanted,
                    set = decision.writes().then_some(outcome.wanted),
                    "{outcome}"
                ),
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(%sysctl, found = outcome.found, wanted = outcome.wanted, "{outcome}");
                    metrics.conntrack_sysctl_failures.inc();
                    failed.push(outcome.to_string());
                }
            }
        }
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

impl std::fmt::Debug for ConntrackSysctls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConntrackSysctls")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::settings::{TCP_TIMEOUT_CLOSE_WAIT, TCP_TIMEOUT_ESTABLISHED};
    use crate::sysctl::FakeSysctls;

    #[test]
    fn a_failure_is_counted_and_returned_until_a_write_works() {
        let sysctls = FakeSysctls::new();
        sysctls.put(TCP_TIMEOUT_ESTABLISHED, "432000");
        sysctls.put(TCP_TIMEOUT_CLOSE_WAIT, "60");
        sysctls.set_read_only(true);
        let metrics = SyncMetrics::default();
        let mut keeper = ConntrackSysctls::new(Box::new(sysctls.clone()), ConntrackSettings::default());
        let problem = keeper.reconcile(&metrics, false).unwrap_or_default();
        assert!(
            problem
                .starts_with("net.netfilter.nf_conntrack_tcp_timeout_close_wait: cannot set 3600 (found 60)"),
            "{problem}"
        );
        assert_eq!(metrics.conntrack_sysctl_failures.get(), 1);
        sysctls.set_read_only(false);
        assert_eq!(keeper.reconcile(&metrics, false), None);
        assert_eq!(sysctls.values()[TCP_TIMEOUT_CLOSE_WAIT], "3600");
        assert_eq!(metrics.conntrack_sysctl_failures.get(), 1);
    }
}
