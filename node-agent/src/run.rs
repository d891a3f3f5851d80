//! `switchyard-agent run --plan-file`: the long-running loop over a plan file.
//!
//! ```text
//! every poll interval:
//!   plan file ─► content hash changed? ─► parse ─► objects ─┐   (unparseable: InvalidPlan, rules stay)
//!   new objects (at most every min-sync-interval) ──────────┼─► Syncer::sync ─┐
//!   retry due after a failure ──────────────────────────────┘                 │
//!   Syncer::resync_if_due (full-sync period) ─────────────────────────────────┤
//!   every resync period: Syncer::check_drift (repairs) ───────────────────────┤
//!                                                                             ▼
//!                  health-check servers updated ─► status file rewritten (tmp + rename)
//! SIGTERM / SIGINT ─► stop the health-check servers and exit; the rules stay in the kernel.
//! ```
//!
//! Syncs are blocking (they run iptables); they run on the runtime's blocking-capable worker through
//! `block_in_place`, so the health-check servers keep answering meanwhile.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use switchyard_api::{NodeForwardingPlanSpec, ServiceFailure};

use crate::error::Error;
use crate::healthcheck::{self, HealthServers};
use crate::planfile::{read_plan_file, write_status};
use crate::sync::{SyncResult, Syncer};

/// The loop's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// The plan file to apply and watch.
    pub plan_file: PathBuf,
    /// Where to write the status after every sync.
    pub status_file: Option<PathBuf>,
    /// How often the kernel is compared with the model (drift checks).
    pub resync_period: Duration,
    /// Plan changes closer together than this are coalesced.
    pub min_sync_interval: Duration,
    /// How often the plan file is looked at.
    pub poll_interval: Duration,
}

/// The plan file's last content and what it parsed to.
#[derive(Debug, Default)]
struct PlanFile {
    hash: Option<u64>,
    objects: Option<Vec<Arc<NodeForwardingPlanSpec>>>,
    error: Option<String>,
}

enum Poll {
    Unchanged,
    Changed,
    Failed(String),
}

impl PlanFile {
    fn poll(&mut self, path: &std::path::Path) -> Poll {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(source) => {
                let e = Error::ReadPlan {
                    path: path.to_path_buf(),
                    source,
                };
                // Whatever comes back later, even the same content, must be parsed and applied again.
                self.hash = None;
                return self.failed(e.to_string());
            }
        };
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        let hash = hasher.finish();
        if self.hash == Some(hash) {
            return Poll::Unchanged;
        }
        self.hash = Some(hash);
        drop(bytes);
        // Parse from the file again rather than keeping its bytes: one copy of a large plan at a time.
        match read_plan_file(path) {
            Ok(objects) => {
                self.objects = Some(objects);
                self.error = None;
                Poll::Changed
            }
            Err(e) => self.failed(e.to_string()),
        }
    }

    fn failed(&mut self, message: String) -> Poll {
        // Until the file is fixed nothing is applied; the last good rules stay.
        self.objects = None;
        if self.error.as_ref() == Some(&message) {
            return Poll::Unchanged;
        }
        self.error = Some(message.clone());
        Poll::Failed(message)
    }
}

/// Everything after a sync: health-check servers, the healthy flag, the status file.
struct AfterSync {
    servers: HealthServers,
    healthy: Arc<AtomicBool>,
    status_file: Option<PathBuf>,
}

impl AfterSync {
    fn run(&mut self, syncer: &mut Syncer) {
        if let Some((spec, skip)) = syncer.applied() {
            let (desired, mut failures) = healthcheck::desired(spec, skip);
            for error in self.servers.update(&desired) {
                let service = match &error {
                    Error::BindHealthCheck { port, .. } => desired
                        .get(port)
                        .map(|s| format!("{}/{}", s.namespace, s.name))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                failures.push(ServiceFailure {
                    service,
                    reason: error.to_string(),
                });
            }
            syncer.set_extra_failures(failures);
        }
        self.healthy.store(syncer.healthy(), Ordering::Relaxed);
        self.write_status(syncer);
    }

    fn write_status(&self, syncer: &Syncer) {
        if let Some(path) = &self.status_file
            && let Err(e) = write_status(path, &syncer.status())
        {
            tracing::warn!(error = %e, "cannot write the status file");
        }
    }
}

/// Runs until `shutdown` completes. The rules stay in the kernel when it returns.
pub async fn run(
    config: RunConfig,
    mut syncer: Syncer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let healthy = Arc::new(AtomicBool::new(false));
    let mut after = AfterSync {
        servers: HealthServers::new(tokio::runtime::Handle::current(), Arc::clone(&healthy)),
        healthy,
        status_file: config.status_file.clone(),
    };
    let mut plan = PlanFile::default();
    let mut pending = false;
    let mut last_sync: Option<Instant> = None;
    let mut next_drift_check = Instant::now() + config.resync_period;
    let mut ticker = tokio::time::interval(config.poll_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    tracing::info!(plan_file = %config.plan_file.display(), "watching the plan file");
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        match plan.poll(&config.plan_file) {
            Poll::Unchanged => {}
            Poll::Changed => pending = true,
            Poll::Failed(message) => {
                pending = false;
                syncer.reject_input(message);
                after.run(&mut syncer);
            }
        }
        let coalesced = last_sync.is_some_and(|at| at.elapsed() < config.min_sync_interval);
        let result = match &plan.objects {
            Some(objects) if (pending && !coalesced) || syncer.retry_due() => {
                pending = false;
                last_sync = Some(Instant::now());
                Some(tokio::task::block_in_place(|| syncer.sync(objects)))
            }
            _ => tokio::task::block_in_place(|| syncer.resync_if_due()),
        };
        if result.is_some() {
            after.run(&mut syncer);
        }
        if Instant::now() >= next_drift_check {
            next_drift_check = Instant::now() + config.resync_period;
            if let Some(result) = tokio::task::block_in_place(|| syncer.check_drift()) {
                if let SyncResult::Failed { message } = &result {
                    tracing::error!(%message, "drift repair failed");
                }
                after.run(&mut syncer);
            }
        }
        after.healthy.store(syncer.healthy(), Ordering::Relaxed);
    }
    after.servers.stop_all();
    after.write_status(&syncer);
    tracing::info!("stopping; the programmed rules stay in place");
    Ok(())
}
