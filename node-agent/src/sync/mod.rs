//! The sync loop's logic, independent of the kernel backend and of where plans come from.
//!
//! ```text
//! plan objects ─► plan_set::assemble ─► Syncer ─► validate ─► Dataplane (iptables today; IPVS, nftables later)
//!                                         │                         │
//!   Clock (now, wall) ───────────────────►│◄──── SyncOutcome / Drift ┘
//!                                         ├─► status (conditions, counts, failures)
//!                                         ├─► SyncMetrics
//!                                         └─► conntrack cleanup (UDP endpoint changes)
//! ```
//!
//! Pure pieces (shard assembly, backoff, status conditions) are separate modules with their own
//! tests; [`Syncer`] strings them together and is tested against the fake iptables edge.

pub mod backoff;
pub mod clock;
pub mod dataplane;
pub mod metrics;
pub mod plan_set;
pub mod status;
pub mod syncer;

pub use clock::{Clock, FakeClock, SystemClock, rfc3339};
pub use dataplane::{Cleanup, Dataplane, Drift, SyncOutcome, SyncRequest};
pub use metrics::{KindLabel, SyncMetrics};
pub use plan_set::{Assembly, assemble};
pub use syncer::{SyncConfig, SyncResult, Syncer};
