//! switchyard-agent: programs its node's `NodeForwardingPlan` into the kernel and reports status.
//!
//! ```text
//! plan file (run / apply) ─► planfile ─► [objects] ─► sync::Syncer ─► assemble shards ─► validate()
//!                                                          │            (plan problems: rejected whole;
//!                                                          │             entry problems: skipped, reported)
//!                                                          ▼
//!                                   sync::Dataplane (iptables::dataplane::IptablesDataplane)
//!                                     render (pure) ─► stream ─► Iptables edge: iptables-restore --noflush
//!                                                          │        (exec: real binaries; fake: the tracer)
//!                                                          ├─► conntrack: stale UDP flows deleted
//!                                                          ▼
//!                 status (observedRevision, conditions, counts) ─► status file │ healthcheck servers
//! ```
//!
//! Pure logic ([`iptables::render()`], [`iptables::stream`], [`sync::plan_set`], [`sync::status`],
//! [`conntrack::select`], [`healthcheck::desired`]) is separate from the edges, each a small trait with an
//! in-memory fake: [`iptables::kernel::Iptables`] ([`iptables::exec`], [`iptables::fake`]),
//! [`conntrack::Conntrack`], [`host::LocalAddrs`], [`sync::Clock`]. [`cli::run_cli`] is the whole
//! program; [`run`] is the long-running loop.

pub mod cli;
pub mod command;
pub mod conntrack;
pub mod error;
pub mod healthcheck;
pub mod host;
pub mod iptables;
pub mod planfile;
pub mod run;
pub mod sync;

pub use error::{Error, Result};
