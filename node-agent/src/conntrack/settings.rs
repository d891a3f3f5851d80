//! Conntrack's sysctls as kube-proxy sets them, on every backend: the idle timeouts of ESTABLISHED and
//! CLOSE_WAIT TCP connections and, only when asked, the table size.
//!
//! ```text
//! ConntrackSettings (flags) ─► wanted() ─► [(sysctl, value)] ─┐
//! Sysctls::get(sysctl) ─► found ───────────────────────────────┴─► decide(found, wanted, lower) ─► Decision
//!   Raise | Lower ─► Sysctls::set ─► [Outcome] (found, what was done, or why not) ─► the caller logs,
//!   counts and reports it (the syncer: Degraded, ConntrackSysctlFailed, while one fails)
//! ```
//!
//! - `nf_conntrack_tcp_timeout_close_wait` 3600 (the kernel's 60 s ends a half-closed connection's
//!   entry while the server still writes; kube-proxy's value, which the upstream e2e spec checks).
//! - `nf_conntrack_tcp_timeout_established` 86400 (kube-proxy's 24 h; the kernel's is 5 days).
//! - `nf_conntrack_max` is left alone unless a value is given. kube-proxy sizes it `max(128Ki,
//!   32Ki × cores)` (and the hash table to a quarter of that): on a 512-core node that is 16 M entries
//!   and a 32 MB hash table that thrashes caches (kubernetes#136228), while the kernel already sizes
//!   the table from the node's memory.
//!
//! A value is only ever **raised**: a host that has a higher one keeps it, unless `lower` asks to set
//! each value exactly, as kube-proxy does. Lowering a timeout silently cuts idle connections someone
//! meant to keep (their entry expires; the next packet is INVALID), so it takes an explicit request;
//! raising one only keeps entries longer. On a stock kernel the ESTABLISHED timeout (5 days) therefore
//! stays, and the CLOSE_WAIT one goes from 60 s to 1 h. Zero leaves a value alone altogether.
//!
//! The timeouts are per network namespace; `nf_conntrack_max` is global, and read-only outside the
//! host's initial namespace.

use std::fmt;

use crate::error::Error;
use crate::sysctl::{Sysctls, dotted};

/// `nf_conntrack_tcp_timeout_established`, under `/proc/sys`.
pub const TCP_TIMEOUT_ESTABLISHED: &str = "net/netfilter/nf_conntrack_tcp_timeout_established";
/// `nf_conntrack_tcp_timeout_close_wait`, under `/proc/sys`.
pub const TCP_TIMEOUT_CLOSE_WAIT: &str = "net/netfilter/nf_conntrack_tcp_timeout_close_wait";
/// `nf_conntrack_max`, under `/proc/sys`.
pub const MAX: &str = "net/netfilter/nf_conntrack_max";
/// `route_localnet` of every interface, under `/proc/sys`: lets packets to `127.0.0.0/8` be routed
/// after DNAT (localhost NodePorts; not a conntrack value, but kept by the same machinery).
pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

/// kube-proxy's `conntrack.tcpEstablishedTimeout` (24 h), in seconds.
pub const DEFAULT_TCP_TIMEOUT_ESTABLISHED: u64 = 86_400;
/// kube-proxy's `conntrack.tcpCloseWaitTimeout` (1 h), in seconds.
pub const DEFAULT_TCP_TIMEOUT_CLOSE_WAIT: u64 = 3_600;

/// What the agent asks of conntrack; 0 leaves a value as the host has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Idle timeout of established TCP connections, seconds.
    pub tcp_timeout_established: u64,
    /// Timeout of TCP connections in CLOSE_WAIT, seconds.
    pub tcp_timeout_close_wait: u64,
    /// The table's size, entries.
    pub max: u64,
    /// Set each value exactly, lowering a higher one the host has.
    pub lower: bool,
    /// Set `route_localnet=1` (the plan asks for localhost NodePorts; never unset once set, as
    /// kube-proxy).
    pub route_localnet: bool,
}

impl Default for ConntrackSettings {
    fn default() -> Self {
        Self {
            tcp_timeout_established: DEFAULT_TCP_TIMEOUT_ESTABLISHED,
            tcp_timeout_close_wait: DEFAULT_TCP_TIMEOUT_CLOSE_WAIT,
            max: 0,
            lower: false,
            route_localnet: false,
        }
    }
}

impl ConntrackSettings {
    /// The sysctls to manage and their values, in order; those at 0 are left out.
    pub fn wanted(&self) -> Vec<(&'static str, u64)> {
        [
            (MAX, self.max),
            (TCP_TIMEOUT_ESTABLISHED, self.tcp_timeout_established),
            (TCP_TIMEOUT_CLOSE_WAIT, self.tcp_timeout_close_wait),
            (ROUTE_LOCALNET, u64::from(self.route_localnet)),
        ]
        .into_iter()
        .filter(|(_, value)| *value > 0)
        .collect()
    }
}

/// What to do about one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It already has the value asked for.
    Unchanged,
    /// The host's is higher and lowering was not asked for: it stays.
    KeptHigher,
    /// Raise it to the value asked for.
    Raise,
    /// Lower it to the value asked for (asked for).
    Lower,
}

impl Decision {
    /// Whether the value is written.
    pub fn writes(self) -> bool {
        matches!(self, Self::Raise | Self::Lower)
    }
}

/// What to do with a value `found` on the host when `wanted` is asked for.
pub fn decide(found: u64, wanted: u64, lower: bool) -> Decision {
    match found.cmp(&wanted) {
        std::cmp::Ordering::Equal => Decision::Unchanged,
        std::cmp::Ordering::Less => Decision::Raise,
        std::cmp::Ordering::Greater if lower => Decision::Lower,
        std::cmp::Ordering::Greater => Decision::KeptHigher,
    }
}

/// One value after [`apply`]: what was found, and what was done or why it could not be.
#[derive(Debug)]
pub struct Outcome {
    /// The sysctl, under `/proc/sys`.
    pub sysctl: &'static str,
    /// The value asked for.
    pub wanted: u64,
    /// The host's value before; `None` when it could not be read.
    pub found: Option<u64>,
    /// What was done; an error when the value could not be read or written.
    pub done: Result<Decision, Error>,
}

impl Outcome {
    /// Whether the value is not what the settings ask for.
    pub fn failed(&self) -> bool {
        self.done.is_err()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = dotted(self.sysctl);
        let wanted = self.wanted;
        let found = self
            .found
            .map_or_else(|| "unreadable".to_string(), |v| v.to_string());
        match &self.done {
            Ok(Decision::Unchanged) => write!(f, "{name}: {found}, as asked"),
            Ok(Decision::KeptHigher) => write!(
                f,
                "{name}: {found} kept (higher than {wanted}; --conntrack-lower-host-values lowers it)"
            ),
            Ok(Decision::Raise) => write!(f, "{name}: raised from {found} to {wanted}"),
            Ok(Decision::Lower) => write!(f, "{name}: lowered from {found} to {wanted}"),
            Err(e) => write!(f, "{name}: cannot set {wanted} (found {found}): {e}"),
        }
    }
}

/// Reads each value [`ConntrackSettings::wanted`] names, writes those [`decide`] says to; one outcome
/// per value, in order. Never stops at a failure.
pub fn apply(sysctls: &mut dyn Sysctls, settings: &ConntrackSettings) -> Vec<Outcome> {
    settings
        .wanted()
        .into_iter()
        .map(|(sysctl, wanted)| {
            let found = sysctls.get(sysctl).and_then(|text| {
                text.parse::<u64>().map_err(|_| Error::SysctlValue {
                    sysctl: dotted(sysctl),
                    value: text,
                })
            });
            let (found, done) = match found {
                Ok(found) => {
                    let decision = decide(found, wanted, settings.lower);
                    let written = if decision.writes() {
                        sysctls.set(sysctl, &wanted.to_string())
                    } else {
                        Ok(())
                    };
                    (Some(found), written.map(|()| decision))
                }
                Err(e) => (None, Err(e)),
            };
            Outcome {
                sysctl,
                wanted,
                found,
                done,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysctl::FakeSysctls;

    #[test]
    fn a_value_is_raised_never_lowered_unless_asked() {
        let cases = [
            ("equal", 3600, 3600, false, Decision::Unchanged),
            ("lower on the host", 60, 3600, false, Decision::Raise),
            ("higher on the host", 432_000, 86_400, false, Decision::KeptHigher),
            ("higher, lowering asked", 432_000, 86_400, true, Decision::Lower),
            ("lower, lowering asked", 60, 3600, true, Decision::Raise),
            ("equal, lowering asked", 3600, 3600, true, Decision::Unchanged),
        ];
        for (name, found, wanted, lower, want) in cases {
            assert_eq!(decide(found, wanted, lower), want, "{name}");
        }
    }

    #[test]
    fn kube_proxys_timeouts_by_default_and_zero_leaves_a_value_alone() {
        assert_eq!(
            ConntrackSettings::default().wanted(),
            vec![(TCP_TIMEOUT_ESTABLISHED, 86_400), (TCP_TIMEOUT_CLOSE_WAIT, 3600)]
        );
        let settings = ConntrackSettings {
            tcp_timeout_established: 0,
            max: 1_048_576,
            ..ConntrackSettings::default()
        };
        assert_eq!(
            settings.wanted(),
            vec![(MAX, 1_048_576), (TCP_TIMEOUT_CLOSE_WAIT, 3600)]
        );
    }

    fn stock_kernel() -> FakeSysctls {
        let sysctls = FakeSysctls::new();
        sysctls.put(TCP_TIMEOUT_ESTABLISHED, "432000");
        sysctls.put(TCP_TIMEOUT_CLOSE_WAIT, "60");
        sysctls.put(MAX, "262144");
        sysctls
    }

    #[test]
    fn apply_writes_what_it_decides_and_reports_what_it_found() {
        let mut sysctls = stock_kernel();
        let outcomes = apply(&mut sysctls, &ConntrackSettings::default());
        let lines: Vec<String> = outcomes.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "net.netfilter.nf_conntrack_tcp_timeout_established: 432000 kept (higher than 86400; \
                 --conntrack-lower-host-values lowers it)",
                "net.netfilter.nf_conntrack_tcp_timeout_close_wait: raised from 60 to 3600",
            ]
        );
        assert!(!outcomes.iter().any(Outcome::failed));
        let values = sysctls.values();
        assert_eq!(values[TCP_TIMEOUT_ESTABLISHED], "432000");
        assert_eq!(values[TCP_TIMEOUT_CLOSE_WAIT], "3600");
        assert_eq!(values[MAX], "262144", "not asked for");

        let exactly = ConntrackSettings {
            lower: true,
            max: 131_072,
            ..ConntrackSettings::default()
        };
        let lines: Vec<String> = apply(&mut sysctls, &exactly)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "net.netfilter.nf_conntrack_max: lowered from 262144 to 131072",
                "net.netfilter.nf_conntrack_tcp_timeout_established: lowered from 432000 to 86400",
                "net.netfilter.nf_conntrack_tcp_timeout_close_wait: 3600, as asked",
            ]
        );
    }

    #[test]
    fn a_value_that_cannot_be_read_or_written_fails_alone() {
        let mut sysctls = stock_kernel();
        sysctls.set_read_only(true);
        sysctls.put(TCP_TIMEOUT_ESTABLISHED, "86400");
        let outcomes = apply(&mut sysctls, &ConntrackSettings::default());
        assert_eq!(outcomes[0].done.as_ref().ok(), Some(&Decision::Unchanged));
        assert!(outcomes[1].failed());
        assert_eq!(outcomes[1].found, Some(60));
        assert!(
            outcomes[1].to_string().starts_with(
                "net.netfilter.nf_conntrack_tcp_timeout_close_wait: cannot set 3600 (found 60): "
            ),
            "{}",
            outcomes[1]
        );

        // No conntrack module (no file), or a value that is no number.
        let mut missing = FakeSysctls::new();
        missing.put(TCP_TIMEOUT_CLOSE_WAIT, "sixty");
        let outcomes = apply(&mut missing, &ConntrackSettings::default());
        assert!(outcomes.iter().all(|o| o.failed() && o.found.is_none()));
        assert_eq!(missing.values().len(), 1, "nothing written blind");
    }

    #[test]
    fn route_localnet_is_raised_when_asked_and_never_lowered() {
        let mut sysctls = stock_kernel();
        sysctls.put(ROUTE_LOCALNET, "0");
        let asked = ConntrackSettings {
            route_localnet: true,
            lower: true,
            ..ConntrackSettings::default()
        };
        let lines: Vec<String> = apply(&mut sysctls, &asked)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            lines.contains(&"net.ipv4.conf.all.route_localnet: raised from 0 to 1".to_string()),
            "{lines:?}"
        );
        // Not asked: left as it is (another component may rely on it).
        apply(&mut sysctls, &ConntrackSettings::default());
        assert_eq!(sysctls.values()[ROUTE_LOCALNET], "1");
    }
}
