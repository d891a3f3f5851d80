//! `switchyard-agent run`: the long-running loop, whatever the plan source.
//!
//! ```text
//! start: /healthz /livez /readyz /metrics served; kube-proxy's ports (:10256 /healthz /livez, 127.0.0.1:10249
//!        /proxyMode /metrics) served or retried while taken ─► cached plan and slices applied, if any
//!        ─► the source starts: FileSource (--plan-file) | ApiSource (--node-name: own plan + its views' slices)
//! source ─► watch channel (latest PlanUpdate wins) ─┐
//!   Objects (at most every min-sync-interval) ──────┼─► Syncer::sync ─► after every sync:
//!   Invalid ─► Syncer::reject_input (rules stay)    │     health-check servers, /healthz state,
//!   Deleted ─► grace period (rules stay) ───────────┤     status file, StatusSink (API status writer),
//!   retry due after a failed sync ──────────────────┤     cache written (API plans), latency observed
//!   Syncer::resync_if_due (full-sync period) ───────┤
//!   every resync period: Syncer::check_drift ───────┘
//!   grace period over ─► Syncer::cleanup (rules removed, cache removed) unless the grace is `never`
//! a plan arrives ─► AgentHealth::plan_seen(leaving): kube-proxy's /healthz follows at once, before the sync
//! every tick: kube-proxy ports taken? ─► status Degraded PortUnavailable; leaving ─► Syncer::tick_drain
//!   (connections counted every 5 s ─► status.draining, Drained); Syncer::tick_verification (the
//!   backend verified after a switch, refusals counted for a while ─► status.verification)
//!   ─► status written; gauges
//! SIGTERM / SIGINT ─► stop serving and exit; the rules stay in the kernel.
//! ```
//!
//! Syncs are blocking (they run iptables); they run on the runtime's blocking-capable worker through
//! `block_in_place`, so the health-check servers and the HTTP endpoints keep answering meanwhile.

pub mod grace;
pub mod health;
pub mod http;
pub mod kube_proxy_ports;

use crate::counters::{Applied, AppliedPlan, CountersConfig, TrafficCollector};
use crate::wiring::counters::HostCounters;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use switchyard_api::{Backend, ServiceFailure};

use crate::error::Error;
use crate::healthcheck::{self, HealthServers};
use crate::metrics::{self, LiveMetrics};
use crate::planfile::write_status_file;
use crate::source::{Origin, PlanSet, PlanSource, PlanUpdate, cache};
use crate::status_writer::{StatusReport, StatusSink};
use crate::sync::{SyncResult, Syncer, SystemClock};
use grace::{Deletion, Grace, GracePeriod};
use health::AgentHealth;
use kube_proxy_ports::KubeProxyPorts;

/// The families a plan forwards (kube-proxy's per-family health).
fn families(spec: &switchyard_api::NodeForwardingPlanSpec) -> Vec<switchyard_api::IpFamily> {
    let mut families: Vec<switchyard_api::IpFamily> = spec.services.iter().map(|e| e.family).collect();
    families.sort();
    families.dedup();
    families
}

/// How often the loop looks at its timers (retries, resyncs, drift checks, the grace period).
const TICK: Duration = Duration::from_millis(100);
/// After a failed cleanup at the end of a grace period, try again this much later.
const CLEANUP_RETRY: Duration = Duration::from_secs(30);

/// The loop's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// This node (for `/healthz` and the cache; empty with a plan file and no `--node-name`).
    pub node_name: String,
    /// Where to write the status after every sync.
    pub status_file: Option<PathBuf>,
    /// How often the kernel is compared with the model (drift checks); twice this is the health
    /// timeout.
    pub resync_period: Duration,
    /// Plan changes closer together than this are coalesced.
    pub min_sync_interval: Duration,
    /// How long a deleted plan's rules stay.
    pub deletion_grace: GracePeriod,
    /// The plan cache: applied at start, rewritten after every newly applied plan from the API.
    pub cache_file: Option<PathBuf>,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`.
    pub metrics_bind: Option<SocketAddr>,
    /// Where to serve kube-proxy's `/healthz` and `/livez` (its `healthzBindAddress`, `:10256`).
    pub healthz_bind: Option<SocketAddr>,
    /// Where to serve kube-proxy's `/proxyMode` and `/metrics` (its `metricsBindAddress`,
    /// `127.0.0.1:10249`).
    pub status_bind: Option<SocketAddr>,
    /// The per-Service traffic series on `/metrics` (read from the kernel at each scrape); `None`: off.
    pub traffic: Option<CountersConfig>,
}

/// What the loop is fed and feeds: its plan source, status sink and metrics.
pub struct RunIo {
    /// Where plans come from.
    pub source: Box<dyn PlanSource>,
    /// The API status writer, if any.
    pub status: Option<StatusSink>,
    /// Metrics shared with the status writer.
    pub metrics: LiveMetrics,
}

/// Handles of a running loop (tests, embedding).
#[derive(Debug, Clone)]
pub struct Running {
    /// Health and readiness.
    pub health: Arc<AgentHealth>,
    /// The live metrics.
    pub metrics: LiveMetrics,
    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub metrics_addr: Option<SocketAddr>,
    /// kube-proxy's ports and whether each is served.
    pub kube_proxy_ports: Vec<kube_proxy_ports::PortStatus>,
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
        self.write_status_file(syncer);
    }

    fn write_status_file(&self, syncer: &Syncer) {
        if let Some(path) = &self.status_file
            && let Err(e) = write_status_file(path, &syncer.status())
        {
            tracing::warn!(error = %e, "cannot write the status file");
        }
    }
}

/// The loop's state.
struct Loop {
    config: RunConfig,
    syncer: Syncer,
    after: AfterSync,
    health: Arc<AgentHealth>,
    metrics: LiveMetrics,
    status: Option<StatusSink>,
    grace: Grace,
    /// The newest update not handled yet.
    pending: Option<Arc<PlanUpdate>>,
    /// The plan set last handed to the syncer (retries use it).
    current: Option<PlanSet>,
    /// The last sync of `current` failed: retry it when the syncer says so.
    retry_current: bool,
    last_sync: Option<Instant>,
    next_drift_check: Instant,
    cleanup_not_before: Option<Instant>,
    /// A deletion time may be recorded on disk (true at start: an earlier run may have left one).
    deletion_recorded: bool,
    /// (uid, fingerprint, backend in use) of the plan set in the cache file.
    cached: Option<(Option<String>, String, Backend)>,
    /// The fingerprint (plan revision and slices) last programmed from a new plan set, and when its
    /// newest object was written.
    programmed: Option<String>,
    /// The plan the kernel holds, for the traffic counters.
    applied_plan: AppliedPlan,
    /// The conntrack worker's cleared count, read just before the last status was written: the worker
    /// finishes after the sync's status went out, so a change is published from the tick.
    published_cleared: u64,
    /// kube-proxy's ports.
    ports: KubeProxyPorts,
    written_at: Option<SystemTime>,
}

impl Loop {
    fn on_update(&mut self, update: Arc<PlanUpdate>) {
        self.metrics.plan_updates.inc();
        self.health.queued();
        if let PlanUpdate::Objects(set) = update.as_ref() {
            self.plan_seen(set);
        }
        self.pending = Some(update);
    }

    /// A plan arrived: kube-proxy's `/healthz` says at once whether the node is leaving.
    fn plan_seen(&self, set: &PlanSet) {
        if self.health.plan_seen(set.plan.leaving.as_ref()) {
            match &set.plan.leaving {
                Some(leaving) => tracing::warn!(reason = %leaving.reason,
                    "the plan says this node is leaving: kube-proxy's /healthz answers 503 from now on"),
                None => tracing::info!("the plan says this node serves: kube-proxy's /healthz answers 200"),
            }
        }
    }

    fn step(&mut self) {
        let now = Instant::now();
        self.handle_pending(now);
        if self.retry_current && self.syncer.retry_due() {
            self.sync_current();
        } else if let Some(result) = tokio::task::block_in_place(|| self.syncer.retry_reapply_if_due()) {
            self.after(result);
        } else if let Some(result) = tokio::task::block_in_place(|| self.syncer.resync_if_due()) {
            self.after(result);
        }
        if now >= self.next_drift_check {
            self.next_drift_check = now + self.config.resync_period;
            if let Some(result) = tokio::task::block_in_place(|| self.syncer.check_drift()) {
                if let SyncResult::Failed { message } = &result {
                    tracing::error!(%message, "drift repair failed");
                }
                self.after(result);
            }
        }
        if self.grace.due(now) && self.cleanup_not_before.is_none_or(|at| now >= at) {
            self.remove_rules(now);
        }
        self.after.healthy.store(self.syncer.healthy(), Ordering::Relaxed);
        // Read once, before anything is written: a count that moves while the status is being written
        // differs from the one recorded here, so the next tick writes it again.
        let cleared = self.syncer.conntrack_cleared();
        let mut changed = cleared != self.published_cleared;
        self.published_cleared = cleared;
        changed |= self.syncer.set_port_problem(self.ports.problem());
        changed |= self.syncer.tick_drain();
        changed |= self.syncer.tick_verification();
        if changed {
            self.publish_status();
            self.after.write_status_file(&self.syncer);
        }
        self.update_gauges(now);
    }

    fn handle_pending(&mut self, now: Instant) {
        let Some(update) = self.pending.clone() else {
            return;
        };
        match update.as_ref() {
            PlanUpdate::Invalid(message) => {
                self.pending = None;
                self.restored();
                // Until the input is usable again nothing is retried; the last good rules stay.
                self.current = None;
                self.retry_current = false;
                let result = self.syncer.reject_input(message.clone());
                self.after(result);
            }
            PlanUpdate::Deleted => {
                self.pending = None;
                if self.health.plan_deleted() {
                    tracing::warn!("this node's plan was deleted: kube-proxy's /healthz answers 503");
                }
                self.deleted(now);
            }
            PlanUpdate::Objects(set) => {
                let coalesced = self
                    .last_sync
                    .is_some_and(|at| now.saturating_duration_since(at) < self.config.min_sync_interval);
                if !coalesced {
                    self.pending = None;
                    self.restored();
                    self.current = Some(set.clone());
                    self.sync_current();
                }
            }
        }
    }

    fn sync_current(&mut self) {
        let Some(set) = self.current.clone() else {
            return;
        };
        self.last_sync = Some(Instant::now());
        let result =
            tokio::task::block_in_place(|| self.syncer.sync_with(&set.plan, &set.slices, &set.unreadable));
        self.retry_current = matches!(result, SyncResult::Failed { .. });
        self.after(result);
    }

    /// Everything that follows a sync, whatever started it.
    fn after(&mut self, result: SyncResult) {
        // Before the status file and the API status are written (see `step`).
        self.published_cleared = self.syncer.conntrack_cleared();
        self.after.run(&mut self.syncer);
        match &result {
            SyncResult::Applied { .. } => {
                let revision = self.syncer.applied().map(|(spec, _)| spec.revision.clone());
                let families = self
                    .syncer
                    .applied()
                    .map(|(spec, _)| families(spec))
                    .unwrap_or_default();
                self.applied_plan
                    .set(self.syncer.applied().map(|(spec, skip)| Applied {
                        spec: Arc::clone(spec),
                        skip: Arc::new(skip.clone()),
                        backend: self.syncer.backend(),
                    }));
                self.health.synced(revision, &families);
                // Only a set the kernel now holds exactly (its plan and every one of its slices; not a
                // rejected slice's stand-in) counts for latency and goes into the cache.
                if let Some(set) = self.current.clone()
                    && self.syncer.applied_fingerprint() == Some(set.fingerprint())
                {
                    self.newly_applied(&set);
                }
            }
            SyncResult::Rejected { .. } => self.health.handled(),
            SyncResult::Failed { .. } => self.health.failed(),
        }
        self.publish_status();
    }

    /// `set` is what the kernel now holds: latency, plan age, cache.
    fn newly_applied(&mut self, set: &PlanSet) {
        let fingerprint = Some(set.fingerprint());
        if self.programmed != fingerprint {
            self.programmed = fingerprint.clone();
            self.written_at = set.written_at;
            if set.origin == Origin::Api
                && let Some(trigger) = set.trigger_time
            {
                let latency = SystemTime::now().duration_since(trigger).unwrap_or_default();
                self.metrics.network_programming.observe(latency.as_secs_f64());
            }
        }
        let in_use = self.syncer.backend();
        let key = fingerprint.map(|f| (set.uid.clone(), f, in_use));
        if set.origin == Origin::Api
            && key.is_some()
            && self.cached != key
            && let Some(path) = self.config.cache_file.clone()
        {
            match tokio::task::block_in_place(|| cache::write(&path, set, in_use)) {
                Ok(()) => {
                    self.metrics.cache_writes.inc();
                    self.cached = key;
                    self.syncer.set_cache_problem(None);
                }
                Err(error) => {
                    self.metrics.cache_write_failures.inc();
                    self.syncer.set_cache_problem(Some(error.to_string()));
                    tracing::warn!(%error, "cannot cache the applied plan; a restart without the API server would start without rules");
                }
            }
        }
    }

    fn publish_status(&mut self) {
        let Some(sink) = &self.status else {
            return;
        };
        if self.grace.state() != Deletion::None {
            return;
        }
        let report = StatusReport {
            uid: self.current.as_ref().and_then(|s| s.uid.clone()),
            status: self.syncer.status(),
        };
        sink.send_if_modified(|current| {
            if current.as_ref() == Some(&report) {
                false
            } else {
                *current = Some(report);
                true
            }
        });
    }

    fn deleted(&mut self, now: Instant) {
        self.health.handled();
        let Some((spec, _)) = self.syncer.applied() else {
            tracing::info!(node = %self.config.node_name, "no plan for this node yet; nothing is programmed");
            return;
        };
        let revision = spec.revision.clone();
        // A deletion an earlier run of the agent recorded keeps its time; a new one is recorded.
        let marker = self.config.cache_file.as_deref().map(grace::marker_path);
        let since = marker.as_deref().and_then(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            grace::recorded_since(&text, now, SystemTime::now())
        });
        if since.is_none()
            && let Some(path) = &marker
        {
            match switchyard_process::write_atomic_bytes(path, grace::record(SystemTime::now()).as_bytes()) {
                Ok(()) => self.deletion_recorded = true,
                Err(error) => {
                    tracing::warn!(%error, path = %path.display(), "cannot record the deletion time; a restart would start the grace period again")
                }
            }
        }
        if self.grace.deleted(now, since) {
            self.metrics.plan_deleted.set(1);
            match self.grace.period() {
                GracePeriod::For(period) => tracing::warn!(
                    %revision,
                    grace = ?period,
                    "this node's plan was deleted; its rules stay for the grace period, then they are removed unless the plan comes back"
                ),
                GracePeriod::Never => tracing::warn!(
                    %revision,
                    "this node's plan was deleted; its rules stay (deletion grace: never)"
                ),
            }
        }
    }

    fn restored(&mut self) {
        self.forget_deletion();
        if self.grace.restored() {
            self.metrics.plan_deleted.set(0);
            self.metrics.plan_deleted_seconds.set(0.0);
            self.cleanup_not_before = None;
            tracing::info!("this node's plan is back; applying it");
        }
    }

    /// Removes the recorded deletion time (the plan is back, or its rules are gone).
    fn forget_deletion(&mut self) {
        if !self.deletion_recorded {
            return;
        }
        let Some(path) = self.config.cache_file.as_deref().map(grace::marker_path) else {
            self.deletion_recorded = false;
            return;
        };
        match std::fs::remove_file(&path) {
            Ok(()) => self.deletion_recorded = false,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => self.deletion_recorded = false,
            Err(error) => {
                tracing::warn!(%error, path = %path.display(), "cannot remove the recorded deletion time")
            }
        }
    }

    fn remove_rules(&mut self, now: Instant) {
        tracing::warn!("the deleted plan's grace period is over; removing its rules");
        match tokio::task::block_in_place(|| self.syncer.cleanup()) {
            Ok(done) => {
                tracing::info!(
                    jumps = done.jumps,
                    objects = done.objects,
                    "removed the rules of the deleted plan"
                );
                self.grace.removed();
                self.forget_deletion();
                self.after.servers.stop_all();
                self.health.cleared();
                self.programmed = None;
                self.written_at = None;
                self.current = None;
                self.retry_current = false;
                if let Some(path) = &self.config.cache_file {
                    match cache::remove(path) {
                        Ok(()) => self.cached = None,
                        Err(error) => tracing::warn!(%error, "cannot remove the plan cache"),
                    }
                }
            }
            Err(error) => {
                tracing::error!(%error, retry_in_s = CLEANUP_RETRY.as_secs(), "removing the deleted plan's rules failed");
                self.cleanup_not_before = Some(now + CLEANUP_RETRY);
            }
        }
    }

    fn update_gauges(&self, now: Instant) {
        let age = self
            .written_at
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.metrics.plan_age_seconds.set(age);
        let deleted = self.grace.since(now).map_or(0.0, |d| d.as_secs_f64());
        self.metrics.plan_deleted_seconds.set(deleted);
        let queued = self
            .health
            .queued_since()
            .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.metrics.last_queued_timestamp_seconds.set(queued);
        let drain = self.syncer.drain();
        self.metrics.leaving.set(i64::from(drain.is_some()));
        let counted = drain.and_then(|d| d.connections());
        self.metrics
            .drain_connections
            .set(counted.map_or(0, |c| i64::try_from(c.total).unwrap_or(i64::MAX)));
        // Only the busiest Services of the last count have a series (a bounded set).
        self.metrics.drain_connections_by_service.clear();
        for (service, connections) in counted.iter().flat_map(|c| &c.busiest) {
            let (namespace, name) = service.split_once('/').unwrap_or(("", service));
            self.metrics
                .drain_connections_by_service
                .get_or_create(&crate::metrics::ServiceLabel {
                    namespace: namespace.to_string(),
                    service: name.to_string(),
                })
                .set(i64::try_from(*connections).unwrap_or(i64::MAX));
        }
    }

    fn apply_cache(&mut self, path: &Path) {
        let node = self.config.node_name.clone();
        match tokio::task::block_in_place(|| cache::read(path, &node)) {
            Ok(Some(set)) => {
                tracing::info!(
                    path = %path.display(),
                    revision = set.revision(),
                    slices = set.slices.len(),
                    "applying the cached plan before contacting the API server"
                );
                // The cached plan is applied from the backend that programmed it, so a switch the
                // gate refused before the restart is judged again rather than taken.
                let in_use = cache::in_use(&set);
                if let Some(backend) = in_use {
                    self.syncer.resume_backend(backend);
                }
                self.cached = in_use.map(|backend| (set.uid.clone(), set.fingerprint(), backend));
                self.health.queued();
                self.plan_seen(&set);
                self.current = Some(set);
                self.sync_current();
            }
            Ok(None) => tracing::info!(path = %path.display(), "no cached plan; waiting for the API server"),
            Err(error) => tracing::warn!(%error, "ignoring the plan cache"),
        }
    }
}

/// Runs until `shutdown` completes. The rules stay in the kernel when it returns.
pub async fn run(
    config: RunConfig,
    syncer: Syncer,
    io: RunIo,
    shutdown: impl Future<Output = ()>,
    started: Option<tokio::sync::oneshot::Sender<Running>>,
) -> Result<(), Error> {
    let health = Arc::new(AgentHealth::new(
        &config.node_name,
        config.resync_period * 2,
        Arc::new(SystemClock),
    ));
    let applied_plan = AppliedPlan::default();
    let traffic = config.traffic.map(|traffic| {
        TrafficCollector::new(
            Box::new(HostCounters::new(applied_plan.clone(), traffic.iptables_mode)),
            traffic,
        )
    });
    let registry = Arc::new(metrics::registry(syncer.metrics(), &io.metrics, traffic));
    let ports = KubeProxyPorts::start(
        config.healthz_bind,
        config.status_bind,
        Arc::clone(&health),
        applied_plan.clone(),
        Arc::clone(&registry),
        io.metrics.clone(),
    );
    let (metrics_addr, server) = match config.metrics_bind {
        Some(addr) => {
            let (bound, task) = http::serve(addr, Arc::clone(&health), registry).await?;
            (Some(bound), Some(task))
        }
        None => (None, None),
    };
    if let Some(started) = started {
        let _ = started.send(Running {
            health: Arc::clone(&health),
            metrics: io.metrics.clone(),
            metrics_addr,
            kube_proxy_ports: ports.ports.clone(),
        });
    }
    let healthy = Arc::new(AtomicBool::new(false));
    let mut state = Loop {
        after: AfterSync {
            servers: HealthServers::new(tokio::runtime::Handle::current(), Arc::clone(&healthy)),
            healthy,
            status_file: config.status_file.clone(),
        },
        syncer,
        health,
        metrics: io.metrics,
        status: io.status,
        grace: Grace::new(config.deletion_grace),
        pending: None,
        current: None,
        retry_current: false,
        last_sync: None,
        next_drift_check: Instant::now() + config.resync_period,
        cleanup_not_before: None,
        deletion_recorded: true,
        cached: None,
        programmed: None,
        published_cleared: 0,
        ports,
        applied_plan,
        written_at: None,
        config,
    };
    // The cached plan goes in before the source may reach the API server.
    if let Some(path) = state.config.cache_file.clone() {
        state.apply_cache(&path);
    }
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    tracing::info!(source = %io.source.describe(), "watching");
    let source = io.source.spawn(tx);
    let mut source_open = true;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            changed = rx.changed(), if source_open => match changed {
                Ok(()) => {
                    if let Some(update) = rx.borrow_and_update().clone() {
                        state.on_update(update);
                    }
                }
                Err(_) => {
                    tracing::error!("the plan source stopped; the current rules stay");
                    source_open = false;
                }
            },
            _ = ticker.tick() => {}
        }
        state.step();
    }
    source.abort();
    if let Some(server) = server {
        server.abort();
    }
    state.ports.stop();
    state.after.servers.stop_all();
    state.after.write_status_file(&state.syncer);
    tracing::info!("stopping; the programmed rules stay in place");
    Ok(())
}
