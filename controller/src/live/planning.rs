//! Planning state: the planner (once a planning run succeeded) and what the engine keeps beside it
//! between runs.
//!
//! ```text
//! Engine::plan ─► planner (incremental; rebuilt on relists and Node changes) ─► problems by Service
//!   a failed rebuild ─► planner None, previous revisions kept (nothing is judged, nothing written)
//!   Service slices ─► changed_at (when each last changed) ─► fold quiet ones, one per next_fold
//! ```

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use crate::planner::{Planner, Previous, ServiceProblem};

/// The planner and what it found.
#[derive(Default)]
pub(super) struct Planning {
    pub(super) planner: Option<Planner>,
    /// The last planner's revisions while a failed rebuild left no planner.
    pub(super) previous: Option<Previous>,
    /// Problems of the Services that have any, by `namespace/name`, as of the last planning run.
    pub(super) problems: BTreeMap<String, Vec<ServiceProblem>>,
    /// When each recently re-planned Service last changed (kept for those with a Service slice).
    pub(super) changed_at: HashMap<String, Instant>,
    /// No fold before this (one packed slice per [`super::engine::FOLD_EVERY`]).
    pub(super) next_fold: Option<Instant>,
    /// ServiceCIDRs ignored at the last rebuild, and why.
    pub(super) cidr_problems: Vec<crate::planner::service_cidrs::CidrProblem>,
}
