//! Where plans come from: a plan file, or the API server (with the on-disk cache at start). Every source
//! feeds the same sync loop ([`crate::run`]) through one channel holding only the latest state.
//!
//! ```text
//! file::FileSource (poll, parse)            ─┐
//! api::ApiSource (watch own plan + shards,  ─┼─► watch::Sender<Option<Arc<PlanUpdate>>> ─► run loop
//!    store: assemble, settle, confirm 404)   │      (latest wins: intermediate plans are never needed)
//! cache::read (<state-dir>/plan.yaml, start) ┘      applied before any source starts
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
use switchyard_api::NodeForwardingPlanSpec;
use tokio::sync::watch;

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

/// One node's plan objects (the primary and its shards) and what the primary's metadata says.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSet {
    /// The objects' specs, primary first when known.
    pub objects: Vec<Arc<NodeForwardingPlanSpec>>,
    /// Their metadata, in the same order (API and cache; empty for a plan file): what the cache keeps.
    pub metadata: Vec<ObjectMeta>,
    /// Where they came from.
    pub origin: Origin,
    /// The primary's uid (API and cache only): status is written to this object.
    pub uid: Option<String>,
    /// The primary's `switchyard.io/last-change-trigger-time`: the earliest EndpointSlice change this
    /// plan write carries (for network programming latency).
    pub trigger_time: Option<SystemTime>,
    /// When the controller last wrote the primary's spec (see [`store::written_at`]).
    pub written_at: Option<SystemTime>,
}

impl PlanSet {
    /// A set from a plan file (no metadata).
    pub fn from_file(objects: Vec<Arc<NodeForwardingPlanSpec>>) -> Self {
        Self {
            objects,
            metadata: Vec::new(),
            origin: Origin::File,
            uid: None,
            trigger_time: None,
            written_at: None,
        }
    }

    /// The revision of the primary (index 0 or unsharded), which covers every shard.
    pub fn revision(&self) -> Option<&str> {
        self.objects
            .iter()
            .find(|o| o.shard.as_ref().is_none_or(|s| s.index == 0))
            .map(|o| o.revision.as_str())
    }
}

/// The latest state of a node's plan, as a source sees it.
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
