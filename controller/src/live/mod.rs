//! The live controller: keeps every node's plan current against the API server.
//!
//! ```text
//! watch Services, EndpointSlices, Nodes, plans ─► Engine::observe (caches, dirty set)
//!    every minPlanInterval while dirty ─► Engine::plan (incremental planner) ─► pending nodes
//!    leader only: pending node ─► reconcile(node, ctx) ─► write budget ─► server-side apply (spec only)
//!                                                     └► error_policy ─► requeue with backoff
//!    orphan sweep: plan whose Node is gone (GET 404) ─► delete
//! ```

pub mod budget;
pub mod cache;
pub mod engine;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod run;
pub mod watch;
