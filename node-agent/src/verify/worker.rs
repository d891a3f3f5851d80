//! Verifications off the sync loop: probes wait on the network (up to their timeout each), a kernel
//! comparison traces every frontend, and refusal counts read the kernel's counters; one worker thread
//! does all of it, in the order the syncer asked.
//!
//! ```text
//! Verifier ─► Job::Verify { plan, kernel view (read by the syncer), probe targets } ─► channel
//!          ─► Job::Count { plan } (every few seconds for a while)                  ─┘
//!   worker thread (owns the Connector and a CounterSource with its own Accumulator):
//!     Verify: kernel::check, probes::probe, refusal baseline ─► Done::Verified(Verification)
//!     Count:  counters ─► RefusalCount::update ─► Done::Counted(RefusedCheck)
//!   ─► done list, taken by the Verifier on the loop's tick
//! ```

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use switchyard_api::verification::{KernelCheck, RefusedCheck, Verification};
use switchyard_api::{Backend, NodeForwardingPlanSpec};

use super::kernel::{KernelView, check};
use super::probes::{Connector, Target, probe};
use super::refused::RefusalCount;
use crate::counters::{Accumulator, Applied, AppliedPlan, CounterSource, Series};

/// What the worker is given: its edges.
pub struct VerifyEdges {
    /// Opens the probes' connections.
    pub connector: Box<dyn Connector>,
    /// The kernel's traffic counters of the plan in `plan`.
    pub counters: Box<dyn CounterSource>,
    /// The plan `counters` reads for (the worker sets it before each read).
    pub plan: AppliedPlan,
}

/// The plan a job is about.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The applied plan.
    pub spec: Arc<NodeForwardingPlanSpec>,
    /// Its entries left out.
    pub skip: Arc<HashSet<usize>>,
    /// The backend that applied it.
    pub backend: Backend,
}

/// A verification to run.
#[derive(Debug)]
pub struct Request {
    /// What it verifies.
    pub subject: Subject,
    /// When it was asked for (RFC 3339).
    pub at: String,
    /// What the kernel holds, as the syncer read it (`Err`: why it could not).
    pub view: Result<Option<KernelView>, String>,
    /// Frontends to probe.
    pub probes: Vec<Target>,
    /// Each probe's timeout.
    pub probe_timeout: Duration,
}

/// One piece of work.
#[derive(Debug)]
pub enum Job {
    /// Verify the backend in use; the refusal count starts afresh.
    Verify(Box<Request>),
    /// Count the refusals since the verification, at this time (RFC 3339).
    Count(Subject, String),
    /// Replies once every job before it has run (tests).
    Settle(Sender<()>),
}

/// What the worker finished.
#[derive(Debug, Clone, PartialEq)]
pub enum Done {
    /// A verification, without refusals yet.
    Verified(Verification),
    /// The refusals counted since the last verification.
    Counted(RefusedCheck),
}

/// The handle the verifier keeps.
#[derive(Debug)]
pub struct VerifyWorker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    done: Arc<Mutex<Vec<Done>>>,
}

impl VerifyWorker {
    /// Starts the worker thread over `edges`.
    pub fn start(edges: VerifyEdges) -> Self {
        let (jobs, queue) = mpsc::channel();
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut worker = Worker {
            edges,
            accumulator: Accumulator::default(),
            count: RefusalCount::default(),
            done: Arc::clone(&done),
        };
        match std::thread::Builder::new()
            .name("verify".into())
            .spawn(move || worker.serve(queue))
        {
            Ok(thread) => Self {
                jobs: Some(jobs),
                thread: Some(thread),
                done,
            },
            Err(e) => {
                // Without a thread nothing is verified: a rollout's gate waits, then times out.
                tracing::error!(error = %e, "could not start the verification worker: backends will not be verified");
                Self {
                    jobs: None,
                    thread: None,
                    done,
                }
            }
        }
    }

    /// Queues `job`; never blocks.
    pub fn submit(&self, job: Job) {
        if let Some(jobs) = &self.jobs
            && jobs.send(job).is_err()
        {
            tracing::error!("the verification worker has stopped: a verification was dropped");
        }
    }

    /// What finished since the last call, in order.
    pub fn take(&self) -> Vec<Done> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits until every job queued so far has run.
    pub fn settle(&self) {
        let (done, wait) = mpsc::channel();
        self.submit(Job::Settle(done));
        let _ = wait.recv();
    }
}

impl Drop for VerifyWorker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Worker {
    edges: VerifyEdges,
    accumulator: Accumulator,
    count: RefusalCount,
    done: Arc<Mutex<Vec<Done>>>,
}

impl Worker {
    fn serve(&mut self, queue: Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            let done = match job {
                Job::Verify(request) => Done::Verified(self.verify(*request)),
                Job::Count(subject, at) => {
                    let series = self.read(&subject);
                    if self.count.update(&series, &subject.spec, &subject.skip) {
                        tracing::warn!(
                            unexpected = self.count.check(String::new()).unexpected,
                            "connections refused that the plan does not refuse"
                        );
                    }
                    Done::Counted(self.count.check(at))
                }
                Job::Settle(reply) => {
                    let _ = reply.send(());
                    continue;
                }
            };
            self.done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(done);
        }
    }

    /// The refusal series of `subject`'s backend now (none when the counters cannot be read: logged).
    fn read(&mut self, subject: &Subject) -> Vec<Series> {
        self.edges.plan.set(Some(Applied {
            spec: Arc::clone(&subject.spec),
            backend: subject.backend,
            skip: Arc::clone(&subject.skip),
        }));
        match self.edges.counters.read() {
            Ok(samples) => self.accumulator.update(samples),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the refusal counters for the verification");
                Vec::new()
            }
        }
    }

    fn verify(&mut self, request: Request) -> Verification {
        let Request {
            subject,
            at,
            view,
            probes,
            probe_timeout,
        } = request;
        let kernel = match view {
            Ok(Some(view)) => check(&subject.spec, &subject.skip, &view),
            Ok(None) => KernelCheck {
                error: Some(format!(
                    "the {} backend cannot read back its kernel",
                    subject.backend
                )),
                ..KernelCheck::default()
            },
            Err(error) => KernelCheck {
                error: Some(error),
                ..KernelCheck::default()
            },
        };
        let probes = probe(&probes, self.edges.connector.as_mut(), probe_timeout);
        let series = self.read(&subject);
        self.count = RefusalCount::baseline(&series);
        let verification = Verification {
            backend: subject.backend,
            revision: subject.spec.revision.clone(),
            at,
            kernel,
            probes,
            refused: None,
        };
        if verification.passed() {
            tracing::info!(backend = %subject.backend, frontends = verification.kernel.frontends,
                probes = verification.probes.as_ref().map_or(0, |p| p.sampled), "verified the backend in use");
        } else {
            tracing::warn!(backend = %subject.backend, kernel = ?verification.kernel, probes = ?verification.probes,
                "the backend in use failed its verification");
        }
        verification
    }
}
