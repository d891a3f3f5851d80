//! Traffic that keeps flowing while a fault happens, counted per phase: what the fault suite asserts on.
//!
//! ```text
//! Traffic::start(lab, flows) ─► one thread per flow, inside the flow's namespace:
//!     new connections: loop until stopped: probe ─► answered by an allowed pod? ─► ok / failed
//!     held:            one connection, a byte written every PACE ─► reset? ─► killed (failed), reopen
//!                          └─ counted under the phase set last (Traffic::phase("during") …)
//! Traffic::stop() ─► TrafficReport { per phase: connections, failed; held: opened, killed; failures }
//!                 ─► line("api-outage") = "fault: api-outage: 812 connections, 0 failed (before 80, …);
//!                                          held 2, 0 killed"
//! ```
//!
//! A connection fails when it is not answered within the probe timeout, or answered by a pod the flow
//! does not allow (traffic to a Service whose endpoints did not change must reach those endpoints). A
//! held connection to such a Service must never be reset: the agent clears the conntrack entries of
//! endpoints that leave a Service, and a kill here is that clearing hitting the wrong connection (a
//! false kill). It counts as a failure of its phase and as killed in `held`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{LabError, Result};
use crate::probe::{ProbeResult, Proto, probe_here, probe_tcp_keeping};
use crate::{Lab, Place, checks, netns};

/// How long one probe waits for its answer before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two probes of one flow.
pub const PACE: Duration = Duration::from_millis(20);
/// How many failures a report keeps verbatim.
const KEPT_FAILURES: usize = 10;

/// One stream of connections: from a place to a Service address, answered by one of `pods`.
#[derive(Clone, Debug)]
pub struct Flow {
    /// Where the connections start.
    pub from: Place,
    /// The transport.
    pub proto: Proto,
    /// The Service address.
    pub to: SocketAddr,
    /// The pods allowed to answer (by name prefix, as in [`crate::checks`]).
    pub pods: Vec<String>,
    /// One long-lived TCP connection instead of a new connection per probe.
    pub held: bool,
}

impl Flow {
    /// TCP connections from `from` to `to`, answered by one of `pods`.
    pub fn tcp(from: Place, to: &str, pods: &[&str]) -> Result<Self> {
        Self::new(from, Proto::Tcp, to, pods)
    }

    /// UDP exchanges from `from` to `to`, answered by one of `pods`.
    pub fn udp(from: Place, to: &str, pods: &[&str]) -> Result<Self> {
        Self::new(from, Proto::Udp, to, pods)
    }

    /// One TCP connection from `from` to `to`, answered by one of `pods`, then held open with a byte
    /// written every [`PACE`]; reopened when it is reset.
    pub fn held_tcp(from: Place, to: &str, pods: &[&str]) -> Result<Self> {
        Ok(Flow {
            held: true,
            ..Self::new(from, Proto::Tcp, to, pods)?
        })
    }

    fn new(from: Place, proto: Proto, to: &str, pods: &[&str]) -> Result<Self> {
        let to = to
            .parse()
            .map_err(|_| LabError::FlowDestination(to.to_string()))?;
        Ok(Flow {
            from,
            proto,
            to,
            pods: pods.iter().map(|pod| pod.to_string()).collect(),
            held: false,
        })
    }

    fn judge(&self, result: &ProbeResult) -> Option<String> {
        match result {
            ProbeResult::Answered { pod, .. } if checks::matches(pod, &self.pods) => None,
            ProbeResult::Answered { pod, .. } => Some(format!("answered by {pod}")),
            other => Some(format!("{other:?}")),
        }
    }
}

impl std::fmt::Display for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = if self.held { " (held)" } else { "" };
        write!(f, "{} {} {}{held}", self.from, self.proto, self.to)
    }
}

/// Connections and failures of one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Connections attempted.
    pub connections: usize,
    /// Connections that failed.
    pub failed: usize,
}

#[derive(Debug, Default)]
struct Tally {
    phases: Vec<(String, Count)>,
    failures: Vec<String>,
    held: Count,
}

impl Tally {
    /// A held connection was reset: a failure of `phase`, not a new connection.
    fn killed(&mut self, phase: &str, why: String) {
        self.count(phase, Some(why));
        if let Some((_, count)) = self.phases.iter_mut().find(|(name, _)| name == phase) {
            count.connections -= 1;
        }
        self.held.failed += 1;
    }

    fn count(&mut self, phase: &str, failure: Option<String>) {
        let index = match self.phases.iter().position(|(name, _)| name == phase) {
            Some(index) => index,
            None => {
                self.phases.push((phase.to_string(), Count::default()));
                self.phases.len() - 1
            }
        };
        let count = &mut self.phases[index].1;
        count.connections += 1;
        if let Some(failure) = failure {
            count.failed += 1;
            if self.failures.len() < KEPT_FAILURES {
                self.failures.push(format!("{phase}: {failure}"));
            }
        }
    }
}

struct Shared {
    stop: AtomicBool,
    /// The current phase and when it began.
    phase: Mutex<(String, Instant)>,
    tally: Mutex<Tally>,
}

impl Shared {
    fn phase(&self) -> String {
        self.phase_and_age().0
    }

    /// The current phase and how long it had been running.
    fn phase_and_age(&self) -> (String, Duration) {
        let phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        (phase.0.clone(), phase.1.elapsed())
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Traffic running in the background; [`Traffic::stop`] ends it and reports.
pub struct Traffic {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Traffic {
    /// Starts one prober per flow, in phase `before`.
    pub fn start(lab: &Lab, flows: &[Flow]) -> Result<Traffic> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            phase: Mutex::new(("before".into(), Instant::now())),
            tally: Mutex::new(Tally::default()),
        });
        let mut threads = Vec::new();
        for flow in flows {
            let netns = lab.netns(&flow.from)?.to_string();
            let (flow, shared) = (flow.clone(), Arc::clone(&shared));
            threads.push(std::thread::spawn(move || {
                let outcome = netns::in_netns(&netns, || {
                    if flow.held {
                        return hold(&flow, &shared);
                    }
                    while !shared.stop.load(Ordering::Relaxed) {
                        let (phase, age) = shared.phase_and_age();
                        let started = Instant::now();
                        // When it began and how long it took tell a refusal from a timeout, and a
                        // probe that raced the phase change from one that did not.
                        let failure =
                            flow.judge(&probe_here(flow.proto, flow.to, PROBE_TIMEOUT))
                                .map(|why| {
                                    format!(
                                        "{flow}: {why} (began {} ms into the phase, took {} ms)",
                                        age.as_millis(),
                                        started.elapsed().as_millis()
                                    )
                                });
                        shared.tally().count(&phase, failure);
                        std::thread::sleep(PACE);
                    }
                });
                if let Err(error) = outcome {
                    let phase = shared.phase();
                    shared.tally().count(&phase, Some(error.to_string()));
                }
            }));
        }
        Ok(Traffic { shared, threads })
    }

    /// Counts what follows under `phase` (e.g. "during", "after").
    pub fn phase(&self, phase: &str) {
        *self.shared.phase.lock().unwrap_or_else(PoisonError::into_inner) =
            (phase.to_string(), Instant::now());
    }

    /// Connections counted so far in every phase together.
    pub fn connections(&self) -> usize {
        self.shared
            .tally()
            .phases
            .iter()
            .map(|(_, count)| count.connections)
            .sum()
    }

    /// Stops every prober and reports.
    pub fn stop(self) -> TrafficReport {
        self.shared.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            // A prober that panicked has counted what it saw; the report says what was counted.
            let _ = thread.join();
        }
        let tally = std::mem::take(&mut *self.shared.tally());
        TrafficReport {
            phases: tally.phases,
            failures: tally.failures,
            held: tally.held,
        }
    }
}

/// The loop of a held flow: keeps one connection, writes a byte every [`PACE`]; a write that fails is
/// a reset (a kill), and the connection is reopened. The last write happens after `stop`.
fn hold(flow: &Flow, shared: &Shared) {
    let mut stream: Option<TcpStream> = None;
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        let phase = shared.phase();
        match stream.as_mut() {
            Some(open) => {
                // The first write after a reset may still be accepted locally; the reset shows on the
                // next one, PACE later.
                if let Err(error) = open.write_all(b".") {
                    shared
                        .tally()
                        .killed(&phase, format!("{flow}: held connection killed: {error}"));
                    stream = None;
                }
            }
            None if stopping => {}
            None => {
                let (result, opened) = probe_tcp_keeping(flow.to, PROBE_TIMEOUT);
                let failure = flow.judge(&result).map(|why| format!("{flow}: {why}"));
                if failure.is_none() {
                    stream = opened;
                }
                let mut tally = shared.tally();
                tally.count(&phase, failure);
                tally.held.connections += 1;
            }
        }
        if stopping {
            return;
        }
        std::thread::sleep(PACE);
    }
}

/// What the traffic of a fault saw.
#[derive(Clone, Debug, Default)]
pub struct TrafficReport {
    /// Per phase, in the order phases began.
    pub phases: Vec<(String, Count)>,
    /// The first failures, verbatim.
    pub failures: Vec<String>,
    /// Held connections: opened, and killed (each kill is also a failure of its phase).
    pub held: Count,
}

impl TrafficReport {
    /// Every phase together.
    pub fn total(&self) -> Count {
        self.phases
            .iter()
            .fold(Count::default(), |sum, (_, count)| Count {
                connections: sum.connections + count.connections,
                failed: sum.failed + count.failed,
            })
    }

    /// The count of one phase.
    pub fn phase(&self, name: &str) -> Count {
        self.phases
            .iter()
            .find(|(phase, _)| phase == name)
            .map(|(_, count)| *count)
            .unwrap_or_default()
    }

    /// `fault: <name>: N connections, F failed (before n, during n, after n)`.
    pub fn line(&self, fault: &str) -> String {
        let total = self.total();
        let mut line = format!(
            "fault: {fault}: {} connections, {} failed (",
            total.connections, total.failed
        );
        for (index, (phase, count)) in self.phases.iter().enumerate() {
            let sep = if index == 0 { "" } else { ", " };
            let _ = write!(line, "{sep}{phase} {}", count.connections);
        }
        line.push(')');
        if self.held.connections > 0 {
            let _ = write!(
                line,
                "; held {}, {} killed",
                self.held.connections, self.held.failed
            );
        }
        line
    }

    /// Per-phase counts as a map (for assertions and logs).
    pub fn by_phase(&self) -> BTreeMap<&str, Count> {
        self.phases
            .iter()
            .map(|(phase, count)| (phase.as_str(), *count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_phases_in_order_and_keeps_the_first_failures() {
        let mut tally = Tally::default();
        tally.count("before", None);
        tally.count("during", Some("TimedOut".into()));
        tally.count("during", None);
        tally.count("after", None);
        let report = TrafficReport {
            phases: tally.phases,
            failures: tally.failures,
            held: tally.held,
        };
        assert_eq!(
            report.line("api-outage"),
            "fault: api-outage: 4 connections, 1 failed (before 1, during 2, after 1)"
        );
        assert_eq!(
            report.phase("during"),
            Count {
                connections: 2,
                failed: 1
            }
        );
        assert_eq!(report.failures, vec!["during: TimedOut".to_string()]);
    }

    #[test]
    fn a_killed_held_connection_fails_its_phase_without_counting_as_a_new_connection() {
        let mut tally = Tally::default();
        tally.count("before", None);
        tally.held.connections += 1;
        tally.killed(
            "during",
            "c tcp 10.96.0.1:80 (held): held connection killed".into(),
        );
        tally.count("during", None);
        tally.held.connections += 1;
        let report = TrafficReport {
            phases: tally.phases,
            failures: tally.failures,
            held: tally.held,
        };
        assert_eq!(
            report.line("controller-restart"),
            "fault: controller-restart: 2 connections, 1 failed (before 1, during 1); held 2, 1 killed"
        );
        assert_eq!(report.total().failed, 1);
    }

    #[test]
    fn a_flow_fails_on_silence_refusal_or_a_pod_it_does_not_allow() {
        let flow = Flow::tcp(Place::Client, "10.96.0.1:80", &["web-1"]).unwrap();
        let answer = |pod: &str| ProbeResult::Answered {
            pod: pod.into(),
            seen_source: "10.0.0.1:1".parse().unwrap(),
        };
        assert_eq!(flow.judge(&answer("web-1")), None);
        assert_eq!(flow.judge(&answer("web-2")), Some("answered by web-2".into()));
        assert!(flow.judge(&ProbeResult::TimedOut).is_some());
        assert!(flow.judge(&ProbeResult::Refused).is_some());
        assert!(Flow::tcp(Place::Client, "nonsense", &[]).is_err());
    }
}
