//! Rollouts: moving nodes between backends node by node, each step verified by the node's agent and
//! reverted on its own when a gate fails. The logic is pure; the live controller's edge
//! ([`crate::live::rollouts`]) feeds it from watches and writes what it decides, on the leader only.
//!
//! ```text
//! ForwardingRollout (spec, status) ─┐
//! Nodes (labels) ───────────────────┼─► World ─► step::step ─► Step { status, labels, events }
//! plans (backend, revision, status) ┤              │ gates::switched / gates::baking (per node)
//! other active rollouts (held) ─────┘              ▼
//!                      edge: status (server-side apply) ─► Node labels ─► Events on the rollout
//! ```
//!
//! The node's backend stays decided by its `switchyard.io/backend` label: a rollout only orchestrates
//! that label, so what it did outlives it and `kubectl get nodes -L switchyard.io/backend` tells the
//! truth. Its status records each node's previous value, so a revert restores exactly that (absent
//! included).

pub mod gates;
pub mod step;
pub mod world;

#[cfg(test)]
mod tests;

pub use step::{LabelWrite, RolloutEvent, RolloutView, Step, step};
pub use world::{NodeView, PlanView, World};
