//! The `NodeForwardingPlan` API shared by the controller and the agent.
//!
//! ```text
//! Service ─┐
//! EndpointSlice ─┼─► controller: plan() ─► NodeForwardingPlanSpec ─► agent: validate() ─► render() ─► kernel
//! Node ────┘                                     ▲                                                 │
//!                                                └──────────── NodeForwardingPlanStatus ◄──────────┘
//! ```
//!
//! This crate holds only data and pure functions over it: the CRD types ([`plan`], [`status`]), the
//! generated CRD ([`crd`]), object names and labels ([`names`]), the content-hash revision ([`revision`]),
//! lenient IP parsing shared with kube-proxy ([`ip`]) and plan validation ([`validate`]). No client, no
//! async, no kernel.

pub mod conditions;
pub mod crd;
pub mod error;
pub mod ip;
pub mod names;
pub mod plan;
pub mod revision;
pub mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validate;
pub mod yaml;

pub use error::Error;
pub use plan::{
    Backend, ClusterSettings, DetectLocalMode, IpFamily, NodeForwardingPlan, NodeForwardingPlanSpec,
    PlanEndpoint, PlanSummary, Protocol, ServicePlan, ShardInfo, TrafficPolicy,
};
pub use status::{NodeForwardingPlanStatus, PlanCondition, ServiceFailure, SyncMode};
