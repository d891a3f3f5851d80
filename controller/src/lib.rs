//! switchyard-controller: turns Services, EndpointSlices and Nodes into shared ForwardingSlices and one
//! `NodeForwardingPlan` per node.
//!
//! ```text
//! Service ─┐                                                 ┌─► ForwardingSlices (per view)
//! EndpointSlice ─┼─► Snapshot ─► planner::Planner (pure) ────┤
//! Node ────┘          ▲                                       └─► NodeForwardingPlans (per node)
//!   input::load_files (offline `plan`, `audit -f`)                   │
//!                                        output (composed plans, objects) ◄┤
//!                                        live controller: server-side apply ◄┘
//!   audit: plans' status vs the current slices ─► which nodes lag
//!   rollout (pure) + live::rollouts: ForwardingRollouts move nodes between backends via their label
//! ```

pub mod audit;
pub mod config;
pub mod error;
pub mod input;
pub mod live;
pub mod output;
pub mod planner;
pub mod plugin;
pub mod rollout;

pub use config::Config;
pub use error::Error;
