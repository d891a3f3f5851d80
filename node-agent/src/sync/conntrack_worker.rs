//! Conntrack hygiene off the sync loop: the syncer decides *what* to clear (pure, right after an apply)
//! and hands it to one worker thread that owns the conntrack table and does the slow part.
//!
//! ```text
//! Syncer::apply ─► Ok ─► udp_targets / removed_endpoints (pure) ─► Job::{Stale, Removed} ─► channel
//!                                                                                              │
//!   worker thread (owns Box<dyn Conntrack>) ◄───────────────────────────────────────────────────┘
//!     Stale: list UDP per family once ─► stale_filters ─► delete_matching each (one per frontend and
//!            stale endpoint address:port, however many clients hold a flow there)
//!     Removed: clear_removed (one filter each, or list first past 16) ─► counts
//!     ─► SyncMetrics (cleared by reason, failures) and the shared total that status reports
//!     CountDrain (a leaving node, every few seconds): list the open entries (not TIME_WAIT or CLOSE)
//!            of each protocol and family of its external entrances ─► conntrack::drain::count ─► the
//!            latest count, taken by the syncer
//! ```
//!
//! Jobs run in the order the syncs applied them, each after its rules are in place. Listing and
//! deleting 100,000 flows takes about half a second (benchmarks §9) and a mass change longer; on the
//! worker that time no longer delays the next sync of other Services. The status' count can trail the
//! sync that caused it by that much: the next status write carries it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use switchyard_api::{IpFamily, Protocol};

use super::metrics::{CLEARED_ENDPOINT_REMOVED, CLEARED_UDP_STALE, ReasonLabel, SyncMetrics};
use crate::conntrack::drain::{DrainCount, Entrances, count};
use crate::conntrack::{Conntrack, EndpointFlows, Targets, clear_removed, stale_filters};

/// One piece of hygiene after an applied sync.
#[derive(Debug)]
pub enum Job {
    /// kube-proxy's stale UDP cleanup: per family, the UDP frontends and who may answer them.
    Stale(Vec<(IpFamily, Targets)>),
    /// The flows of endpoints that left their Service.
    Removed(Vec<EndpointFlows>),
    /// How many connections entered a leaving node through these entrances, in these families.
    CountDrain(Entrances),
    /// Replies once every job before it has run (tests, and a clean shutdown).
    Settle(Sender<()>),
}

/// The handle the syncer keeps: a queue into the worker and the total it has cleared.
#[derive(Debug)]
pub struct ConntrackWorker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    cleared: Arc<AtomicU64>,
    drain: Arc<Mutex<Option<DrainCount>>>,
}

impl ConntrackWorker {
    /// Starts the worker thread over `conntrack`, counting into `metrics`.
    pub fn start(conntrack: Box<dyn Conntrack>, metrics: SyncMetrics) -> Self {
        let (jobs, queue) = mpsc::channel();
        let cleared = Arc::new(AtomicU64::new(0));
        let drain = Arc::new(Mutex::new(None));
        let mut worker = Worker {
            conntrack,
            metrics,
            cleared: cleared.clone(),
            drain: drain.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(move || worker.serve(queue));
        match thread {
            Ok(thread) => Self {
                jobs: Some(jobs),
                thread: Some(thread),
                cleared,
                drain,
            },
            Err(e) => {
                // Without a thread the hygiene is off; forwarding is unaffected, and the log says so.
                tracing::error!(error = %e, "could not start the conntrack worker: connections of removed endpoints will not be cleared");
                Self {
                    jobs: None,
                    thread: None,
                    cleared,
                    drain,
                }
            }
        }
    }

    /// Queues `job`; never blocks.
    pub fn submit(&self, job: Job) {
        if let Some(jobs) = &self.jobs
            && jobs.send(job).is_err()
        {
            tracing::error!("the conntrack worker has stopped: a cleanup was dropped");
        }
    }

    /// Waits until every job queued so far has run.
    pub fn settle(&self) {
        let (done, wait) = mpsc::channel();
        self.submit(Job::Settle(done));
        // An error means the worker is gone: nothing is left to wait for.
        let _ = wait.recv();
    }

    /// Conntrack entries cleared since the start (both reasons).
    pub fn cleared(&self) -> u64 {
        self.cleared.load(Ordering::Relaxed)
    }

    /// The newest drain count since the last call, if one arrived.
    pub fn take_drain_count(&self) -> Option<DrainCount> {
        self.drain.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl Drop for ConntrackWorker {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the job it is on.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Worker {
    conntrack: Box<dyn Conntrack>,
    metrics: SyncMetrics,
    cleared: Arc<AtomicU64>,
    drain: Arc<Mutex<Option<DrainCount>>>,
}

impl Worker {
    fn serve(&mut self, queue: Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            match job {
                Job::Stale(targets) => self.clear_stale(&targets),
                Job::Removed(filters) => self.clear_left(&filters),
                Job::CountDrain(entrances) => self.count_drain(&entrances),
                Job::Settle(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn clear_stale(&mut self, targets: &[(IpFamily, Targets)]) {
        let started = Instant::now();
        let (mut deleted, mut run) = (0u64, 0usize);
        for (family, targets) in targets {
            let flows = match self.conntrack.list(Protocol::UDP, *family) {
                Ok(flows) => flows,
                Err(e) => {
                    tracing::warn!(error = %e, ?family, "listing conntrack entries failed");
                    self.metrics.conntrack_failures.inc();
                    continue;
                }
            };
            for filter in stale_filters(targets, *family, &flows) {
                match self.conntrack.delete_matching(&filter) {
                    Ok(count) => {
                        deleted += count;
                        run += 1;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, ?filter, "deleting stale UDP conntrack entries failed");
                        self.metrics.conntrack_failures.inc();
                        break;
                    }
                }
            }
        }
        if deleted > 0 {
            tracing::info!(
                deleted,
                filters = run,
                took_ms = started.elapsed().as_millis() as u64,
                "deleted stale UDP conntrack entries"
            );
            self.metrics.conntrack_deleted.inc_by(deleted);
            self.count(CLEARED_UDP_STALE, deleted);
        }
    }

    fn clear_left(&mut self, filters: &[EndpointFlows]) {
        let started = Instant::now();
        let (cleared, run) = match clear_removed(self.conntrack.as_mut(), filters) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %e, filters = filters.len(), "clearing the connections of removed endpoints failed");
                self.metrics.conntrack_failures.inc();
                return;
            }
        };
        tracing::info!(
            cleared,
            filters = filters.len(),
            run,
            took_ms = started.elapsed().as_millis() as u64,
            "cleared the conntrack entries of endpoints that left their Service"
        );
        self.count(CLEARED_ENDPOINT_REMOVED, cleared);
    }

    fn count_drain(&mut self, entrances: &Entrances) {
        let mut listings = Vec::new();
        for protocol in entrances.protocols() {
            for family in entrances.families() {
                // NB: only open connections: a closed one's entry lingers (TIME_WAIT: two minutes), and a
                // node whose load balancer stopped sending it new connections would not look drained
                // until every short connection's entry expired.
                match self.conntrack.list_open(protocol, family) {
                    Ok(flows) => listings.push((protocol, flows)),
                    Err(e) => {
                        // No count is better than a low one: the status keeps the last.
                        tracing::warn!(error = %e, ?protocol, ?family, "listing conntrack entries for the drain failed");
                        self.metrics.conntrack_failures.inc();
                        return;
                    }
                }
            }
        }
        let counted = count(
            entrances,
            listings.iter().map(|(p, flows)| (*p, flows.as_slice())),
        );
        *self.drain.lock().unwrap_or_else(PoisonError::into_inner) = Some(counted);
    }

    fn count(&self, reason: &str, count: u64) {
        self.cleared.fetch_add(count, Ordering::Relaxed);
        self.metrics
            .conntrack_cleared
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc_by(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::{FakeConntrack, Flow, Tuple};

    fn flow(client: &str, frontend: &str, endpoint: &str) -> Flow {
        let ip = |t: &str| t.parse().unwrap();
        Flow {
            original: Tuple {
                src: ip(client),
                dst: ip(frontend),
                sport: 40000,
                dport: 53,
            },
            reply: Tuple {
                src: ip(endpoint),
                dst: ip(client),
                sport: 53,
                dport: 40000,
            },
        }
    }

    #[test]
    fn a_stale_job_deletes_on_the_worker_and_settle_waits_for_it() {
        let table = FakeConntrack::default();
        let keep = flow("10.244.1.2", "10.96.0.10", "10.244.2.53");
        let stale = flow("10.244.1.3", "10.96.0.10", "10.244.9.9");
        table.add(keep);
        table.add(stale);
        let metrics = SyncMetrics::default();
        let worker = ConntrackWorker::start(Box::new(table.clone()), metrics);
        let mut targets = Targets::default();
        targets.by_address.insert(
            ("10.96.0.10".parse().unwrap(), 53),
            [("10.244.2.53".parse().unwrap(), 53)].into(),
        );
        worker.submit(Job::Stale(vec![(IpFamily::IPv4, targets)]));
        worker.settle();
        assert_eq!(table.flows(), vec![keep]);
        assert_eq!(worker.cleared(), 1);
    }

    /// A table whose listing has two entries to a NodePort, of which one is a connection that ended.
    struct OneEnded(Flow, Flow);

    impl Conntrack for OneEnded {
        fn list(&mut self, _: Protocol, _: IpFamily) -> Result<Vec<Flow>, crate::error::Error> {
            Ok(vec![self.0, self.1])
        }
        fn list_open(&mut self, _: Protocol, _: IpFamily) -> Result<Vec<Flow>, crate::error::Error> {
            Ok(vec![self.0])
        }
        fn delete_matching(
            &mut self,
            _: &crate::conntrack::EndpointFlows,
        ) -> Result<u64, crate::error::Error> {
            Ok(0)
        }
    }

    #[test]
    fn a_drain_counts_only_connections_that_have_not_ended() {
        use switchyard_api::testing::{EntryExt, entry, ep, plan};
        let mut open = flow("192.168.10.250", "192.168.10.12", "10.244.1.90");
        open.original.dport = 31080;
        let ended = Flow {
            original: Tuple {
                sport: 40001,
                ..open.original
            },
            ..open
        };
        let spec = plan(
            "node-b",
            vec![
                entry("default/shop:http", "10.96.7.80", 80)
                    .node_port(31080)
                    .with(ep("10.244.1.90", 8080)),
            ],
        );
        let entrances = crate::conntrack::drain::entrances(&spec, &std::collections::HashSet::new());
        let worker = ConntrackWorker::start(Box::new(OneEnded(open, ended)), SyncMetrics::default());
        worker.submit(Job::CountDrain(entrances));
        worker.settle();
        assert_eq!(worker.take_drain_count().map(|c| c.total), Some(1));
    }

    #[test]
    fn a_failing_table_counts_a_failure_and_the_worker_keeps_serving() {
        let table = FakeConntrack::default();
        table.set_failing(true);
        let metrics = SyncMetrics::default();
        let worker = ConntrackWorker::start(Box::new(table.clone()), metrics.clone());
        worker.submit(Job::Stale(vec![(IpFamily::IPv4, Targets::default())]));
        worker.settle();
        assert_eq!(metrics.conntrack_failures.get(), 1);
        table.set_failing(false);
        worker.submit(Job::Stale(vec![(IpFamily::IPv4, Targets::default())]));
        worker.settle();
        assert_eq!(metrics.conntrack_failures.get(), 1);
        assert_eq!(worker.cleared(), 0);
    }
}
