//! The live side of rollouts: their watches, the leader's tick over the pure state machine
//! ([`crate::rollout`]), and its writes — a rollout's status and the Nodes' backend label.
//!
//! ```text
//! watch ForwardingRollouts ─┐ (trim: a Node's metadata, a plan's header and status, a rollout whole;
//! watch Nodes ──────────────┼─  an object that does not decode keeps its last good version)
//! watch plans (managed-by) ─┘─► observed::Observed ◄─ what this leader wrote, until the watches show it
//!     leader only, every second and soon after a change, once every watch has listed:
//!     driver::Driver::tick ─► for each rollout still able to change, oldest first:
//!         World (labels, plans, nodes other rollouts hold, failed label writes) ─► rollout::step
//!         ─► status (server-side apply on /status, switchyard-controller) ─► then the labels
//!            (server-side apply of one label on the Node, switchyard-rollout) ─► then its Events
//!     ─► EventQueue (rate limit) ─► the controller's Event publisher;  metrics (live::metrics)
//! ```
//!
//! Nothing a leader needs lives only in memory: a new leader starts from the statuses (each node's
//! phase, the label it had, when its step began) and the cluster, so it resumes at the same step.
//! The pure parts (`trim`, `observed`, `driver`) are tested here with a fake [`driver::Writes`];
//! `edge` is the only module that talks to the API server.

pub mod driver;
pub mod edge;
pub mod observed;
pub mod trim;

#[cfg(test)]
mod tests;

pub use driver::{Driver, EventQueue, Writes};
pub use edge::{Context, KubeWrites, run};
pub use observed::{Input, Observed, Rollout};
