//! The live controller: keeps every ForwardingSlice and every node's plan current against the API server.
//!
//! ```text
//! watch Services, EndpointSlices, Nodes, plans, slices ─► trim ─► Engine::observe (caches, dirty set)
//!    every minPlanInterval while dirty ─► Engine::plan (incremental planner) ─► pending slices and plans
//!    leader only: Engine::next ─► ticket ─► reconcile(ticket, ctx) ─► write budget ─► server-side apply
//!                 Engine::finish(ticket, done) ◄─ applied | deleted | failed: error_policy, backoff
//!    retired slices ─► delete;  orphan sweep: plan whose Node is gone (GET 404) ─► delete
//! rollouts (their own watches; leader only): ForwardingRollout steps ─► its status, Node labels, Events
//! ```

pub mod budget;
pub mod cache;
pub mod engine;
pub mod events;
pub mod intake;
pub mod leader;
pub mod metrics;
pub mod object;
mod planning;
pub mod queue;
pub mod reconcile;
pub mod rollouts;
pub mod run;
pub mod ticket;
pub mod tracker;
pub mod trim;
pub mod watch;
