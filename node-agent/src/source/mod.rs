//! Where plans come from: a plan file, or the API server (with the on-disk cache at start). Every source
//! feeds the same sync loop ([`crate::run`]) through one channel holding only the latest state.
//!
//! ```text
//! file::FileSource (poll, parse: a plan, or a plan and its slices) ─┐
//! api::ApiSource (watch own plan; watch the slices of its views;    ├─► watch::Sender<Option<Arc<PlanUpdate>>> ─► run loop
//!    store: completeness, settle, confirm 404)                      │      (latest wins: intermediate states are never needed)
//! cache::read (<state-dir>/plan.yaml: plan + slices, at start) ─────┘      applied before any source starts
//! ```
//!
//! A [`PlanUpdate`] is a state, not an event: `Objects` (apply these), `Invalid` (the input cannot be
//! used; keep the rules), `Deleted` (the plan is gone, confirmed; keep the rules for the grace period).

pub mod api;
pub mod cache;
pub mod file;
pub mod store;

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use switchyard_api::compose::slices_digest;
use switchyard_api::{NodeForwardingPlanSpec, ServiceFailure};
use tokio::sync::watch;

use crate::sync::SliceObject;

/// Where a plan set came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--plan-file`.
    File,
    /// The API server (watch).
    Api,
    /// The on-disk cache, at start.
    Cache,
}

/// A node's plan and the slices of its views, and what their metadata says.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSet {
    /// The plan's spec.
    pub plan: Arc<NodeForwardingPlanSpec>,
    /// The slices of its views (name, spec), sorted by name.
    pub slices: Vec<SliceObject>,
    /// The plan's metadata (API and cache; default for a plan file): what the cache keeps.
    pub plan_meta: ObjectMeta,
    /// The slices' metadata, in the order of `slices`.
    pub slice_meta: Vec<ObjectMeta>,
    /// Where they came from.
    pub origin: Origin,
    /// The plan's uid (API and cache only): status is written to this object.
    pub uid: Option<String>,
    /// The newest `switchyard.io/last-change-trigger-time` among the plan and its slices: the
    /// EndpointSlice change this state carries last (for network programming latency).
    pub trigger_time: Option<SystemTime>,
    /// When the controller last wrote any of them (see [`store::written_at`]).
    pub written_at: Option<SystemTime>,
    /// Slices of its views whose latest version cannot be read (their last good copy, if any, is in
    /// `slices`), as status failures: `InvalidSlice`.
    pub unreadable: Vec<ServiceFailure>,
}

impl PlanSet {
    /// A set from a plan file (no metadata).
    pub fn from_file(plan: Arc<NodeForwardingPlanSpec>, slices: Vec<SliceObject>) -> Self {
        let slice_meta = vec![ObjectMeta::default(); slices.len()];
        Self {
            plan,
            slices,
            plan_meta: ObjectMeta::default(),
            slice_meta,
            origin: Origin::File,
            uid: None,
            trigger_time: None,
            written_at: None,
            unreadable: Vec::new(),
        }
    }

    /// The plan's revision.
    pub fn revision(&self) -> &str {
        &self.plan.revision
    }

    /// Identifies what applying this set programs: the plan's revision and the slices' digest (equal to
    /// [`crate::sync::Syncer::applied_fingerprint`] once this set is what the kernel holds; not while a
    /// rejected slice's last good copy stands in for it).
    pub fn fingerprint(&self) -> String {
        if self.slices.is_empty() {
            return self.plan.revision.clone();
        }
        let digest = slices_digest(self.slices.iter().map(|(n, s)| (n.as_str(), s.revision.as_str())));
        format!("{}/{digest}", self.plan.revision)
    }
}

/// The latest state of a node's plan, as a source sees it.
// Sent once behind an Arc; boxing the set would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum PlanUpdate {
    /// Apply these objects (a complete set, or an incomplete one the syncer will report).
    Objects(PlanSet),
    /// The input cannot be used (unreadable or unparseable file, a plan for another node); the rules
    /// stay.
    Invalid(String),
    /// The plan was deleted (confirmed by a GET answering 404); the rules stay for the grace period.
    Deleted,
}

/// The channel from a source to the loop.
pub type UpdateSender = watch::Sender<Option<Arc<PlanUpdate>>>;

/// The receiving end.
pub type UpdateReceiver = watch::Receiver<Option<Arc<PlanUpdate>>>;

/// A plan source: started once by the loop (after the cached plan, if any, was applied).
pub trait PlanSource: Send {
    /// Starts the source; it publishes into `tx` until the loop drops the receiver or aborts it.
    fn spawn(self: Box<Self>, tx: UpdateSender) -> tokio::task::JoinHandle<()>;
    /// A line for the logs: what this source watches.
    fn describe(&self) -> String;
}
