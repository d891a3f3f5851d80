//! switchyard-controller: turns Services, EndpointSlices and Nodes into one `NodeForwardingPlan` per node.
//!
//! ```text
//! Service ─┐
//! EndpointSlice ─┼─► Snapshot ─► planner::Planner (pure) ─► per-node NodeForwardingPlanSpec (+ shards)
//! Node ────┘          ▲                                         │
//!   input::load_files (offline `plan`)                          ├─► output (yaml | json | table)
//!                                                               └─► live controller: server-side apply
//! ```

pub mod config;
pub mod error;
pub mod input;
pub mod live;
pub mod output;
pub mod planner;
pub mod synthetic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use config::Config;
pub use error::Error;
