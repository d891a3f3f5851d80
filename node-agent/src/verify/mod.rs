//! The agent's side of a `ForwardingRollout`'s gates: a backend switch is judged before it happens, and
//! the backend in use is verified after it.
//!
//! ```text
//! before a switch:  spec ─► gate::SwitchGate: every frontend's verdict under the old backend's render
//!                   and the new one's (model: iptables traced, nftables maps and chains, IPVS sets and
//!                   virtual servers) ─► equal: switch │ different: refused (Degraded BackendSwitchRefused)
//! after it (and at start, and whenever the backend in use is not the one verified last):
//!   Syncer ─► verifier::Verifier (schedule) ─► worker thread:
//!     kernel: Dataplane::kernel_view ─► kernel::check (explain --kernel's comparison, per frontend)
//!     probes: probes::sample ─► TCP connects from the node (Connector) ─► probes::probe
//!     refused: counters at the verification ─► every few seconds for a while ─► refused::RefusalCount
//!   ─► status.verification (what a ForwardingRollout's gates read)
//! ```
//!
//! [`frontends`] lists each entry's frontends with the client a verdict is asked for, [`verdict`] is
//! the verdict as compared, [`model`] reads it from each backend's render, [`gate`] judges a switch;
//! [`kernel`], [`probes`] and [`refused`] are the verification's three checks, [`schedule`] says when,
//! [`worker`] runs them off the sync loop and [`verifier`] is what the syncer holds. All but the worker
//! and the connector's edge is pure.

pub mod frontends;
pub mod gate;
pub mod kernel;
pub mod model;
pub mod probes;
pub mod refused;
pub mod schedule;
pub mod verdict;
pub mod verifier;
pub mod worker;

pub use gate::{Refused, SwitchGate};
pub use schedule::VerifyConfig;
pub use verdict::Verdict;
pub use verifier::Verifier;
