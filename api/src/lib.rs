//! The `switchyard.io/v1alpha2` API shared by the controller and the agent.
//!
//! ```text
//! Service ───────┐                                  ┌► ForwardingSlices (per view) ───┐
//! EndpointSlice ─┼─► controller: Planner::build() ──┤                                 ├► agent: compose() ─► validate() ─► render() ─► kernel
//! Node ──────────┘                                  └► NodeForwardingPlan (per node) ─┘                                              │
//!                                                        ▲                                                                           │
//!                                                        └──────────────── NodeForwardingPlanStatus ◄────────────────────────────────┘
//! ```
//!
//! This crate holds only data and pure functions over it: the CRD types ([`plan`], [`slice`](mod@slice), [`status`],
//! [`rollout`], [`verification`]),
//! the generated CRDs ([`crd`]), composing a node's state from its plan and slices ([`compose`]), object
//! names and labels ([`names`]), the content-hash revisions ([`revision`]), lenient IP parsing shared with
//! kube-proxy ([`ip`]), validation ([`validate`]) and, with the `runtime` feature, mapping watch events
//! ([`watch`]). No client, no async, no kernel.

pub mod backend;
pub mod bounded;
pub mod compose;
pub mod conditions;
pub mod crd;
pub mod duration;
pub mod error;
pub mod ip;
pub mod known;
pub mod meta;
pub mod names;
pub mod plan;
pub mod revision;
pub mod rollout;
pub mod slice;
pub mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tolerant;
pub mod validate;
pub mod verification;
#[cfg(feature = "runtime")]
pub mod watch;
pub mod words;
pub mod yaml;

pub use error::Error;
pub use plan::{
    Backend, ClusterSettings, DetectLocalMode, EndpointRef, EntryKey, IpFamily, Leaving, LocalEndpoints,
    NodeForwardingPlan, NodeForwardingPlanSpec, PlanEndpoint, PlanSummary, Protocol, ServicePlan,
    TrafficPolicy,
};
pub use rollout::{
    ForwardingRollout, ForwardingRolloutSpec, ForwardingRolloutStatus, NodePhase, OnFailure, RolloutNode,
    RolloutPhase,
};
pub use slice::{ForwardingSlice, ForwardingSliceSpec, View};
pub use status::{
    DrainStatus, NodeForwardingPlanStatus, ObservedSlices, PlanCondition, ServiceConnections, ServiceFailure,
    SyncMode,
};
