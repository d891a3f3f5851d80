//! The sync loop's logic, independent of the kernel backend and of where plans come from.
//!
//! ```text
//! plan + slices ─► composition (api::compose) ─► Syncer ─► validate ─► Dataplane (iptables, nftables, IPVS)
//!                                         │                         │
//!   Clock (now, wall) ───────────────────►│◄──── SyncOutcome / Drift ┘
//!                                         ├─► status (conditions, counts, failures)
//!                                         ├─► SyncMetrics
//!                                         ├─► conntrack_worker (its own thread): stale UDP entries,
//!                                         │   flows of removed endpoints
//!                                         └─► conntrack_sysctls (after full syncs): conntrack's timeouts
//! ```
//!
//! Pure pieces (composition, backoff, status_fields: the status' conditions and failures) are separate
//! modules with their own tests; [`Syncer`] strings them together and is tested against the fake
//! iptables edge.

pub mod backoff;
pub mod clock;
pub mod composition;
pub mod conntrack_sysctls;
pub mod conntrack_worker;
pub mod dataplane;
pub mod drain;
pub mod metrics;
pub mod status_fields;
pub mod syncer;

#[cfg(any(test, feature = "testing"))]
pub use clock::FakeClock;
pub use clock::{Clock, SystemClock, rfc3339};
pub use composition::{Composition, LastGood, SliceObject, compose_plan};
pub use dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};
pub use metrics::{KindLabel, SyncMetrics};
pub use syncer::{SyncConfig, SyncResult, Syncer};
