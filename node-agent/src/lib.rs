//! switchyard-agent: programs its node's `NodeForwardingPlan` into the kernel and reports status.
//!
//! ```text
//! plan source ─► source::PlanUpdate (latest wins) ─► run loop ─► sync::Syncer ─► compose slices ─► validate()
//!   run --node-name: source::api (watch own plan + its views' slices; │    (plan problems: rejected whole;
//!     deletion confirmed by GET 404) + source::cache at start         │     entry problems: skipped, reported)
//!   run --plan-file / apply: planfile                                 ▼
//!                                   sync::Dataplane = backend::Selector, chosen per plan by spec.backend:
//!                                     iptables: render (pure) ─► stream ─► iptables-restore --noflush
//!                                     nftables: render (pure) ─► diff ─► one `nft -f` transaction
//!                                     ipvs: render (pure) ─► netlink virtual servers + ipset/iptables glue
//!                                       (IPVS and nftables fall back to iptables where the host lacks them)
//!                                                          ├─► conntrack: stale UDP flows deleted
//!                                                          ▼
//!   status (observedRevision, conditions, counts) ─► status_writer (SSA of plans/<node>/status) │ status file (planfile)
//!   run::http: /healthz /readyz /metrics · healthcheck servers · source::cache (<state-dir>/plan.yaml)
//! ```
//!
//! [`backend`] holds what the three backends share: the render context ([`backend::HostFacts`],
//! [`backend::FamilyEnv`]), the sync scope and the selector; each backend module holds only its own
//! render, kernel edge and dataplane; [`xtables`] is the iptables toolkit (kernel edge, save reader,
//! restore text, tracer) that the iptables backend and the IPVS glue share, and nftables does not use;
//! [`wiring`] puts the real edges of this host together (and what `render` prints). Dependencies point
//! one way: backend, xtables ← iptables, nftables, ipvs ← wiring ← cli.
//!
//! Pure logic ([`iptables::render()`], [`iptables::stream`], [`sync::composition`],
//! [`sync::status_fields`], [`source::store`], [`run::grace`], [`conntrack::select`],
//! [`healthcheck::desired`]) is separate from the edges, each a small trait with an in-memory fake
//! (built only for tests: `cfg(test)` or the `testing` feature, which this crate's own tests turn on;
//! the shipped binary has none): [`xtables::kernel::Iptables`] ([`xtables::exec`], `xtables::fake`),
//! [`conntrack::Conntrack`], [`sysctl::Sysctls`], [`probe::LocalAddrs`], [`sync::Clock`]; the API
//! server is faked at the HTTP level in the tests. [`cli::run_cli`] is the whole program; [`run`] is the long-running loop and
//! [`start`] starts it on its plan source; [`explain`] answers, for one connection,
//! what the plan (and with `--kernel` the installed rules) make the node do.

pub mod backend;
pub mod bootstrap;
pub mod capabilities;
pub mod cli;
pub mod command;
pub mod conntrack;
pub mod counters;
pub mod error;
pub mod explain;
pub mod healthcheck;
pub mod iptables;
pub mod ipvs;
pub mod metrics;
pub mod nftables;
pub mod planfile;
pub mod probe;
pub mod run;
pub mod source;
pub mod start;
pub mod status_writer;
pub mod sync;
pub mod sysctl;
pub mod verify;
pub mod wiring;
pub mod xtables;

pub use error::{Error, Result};
