//! switchyard-agent: programs its node's `NodeForwardingPlan` into the kernel and reports status.
//!
//! ```text
//! NodeForwardingPlan ─► validate() ─► render(spec, host facts, family)  (pure) ─► Ruleset
//!   (own node only)         │                                                     │
//!                           │ bad entries skipped, reported                       ▼
//!                           └────────────────────────────────► apply edge: iptables-restore --noflush
//!                                                                                 │
//!                                            status (observedRevision, rules, …) ◄┘
//! ```
//!
//! [`iptables`] holds the pure render for the iptables backend, its restore payloads and a rule-level
//! packet tracer. The kernel and API-server edges live in their own modules.

pub mod command;
pub mod error;
pub mod iptables;

pub use error::{Error, Result};
