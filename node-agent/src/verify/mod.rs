//! The agent's side of a `ForwardingRollout`'s gates: a backend switch is judged before it happens, and
//! the backend in use is verified after it.
//!
//! ```text
//! before a switch:  spec ─► gate::SwitchGate: every frontend's verdict under the old backend's render
//!                   and the new one's (model: iptables traced, nftables maps and chains, IPVS sets and
//!                   virtual servers) ─► equal: switch │ different: refused (Degraded BackendSwitchRefused)
//! ```
//!
//! [`frontends`] lists each entry's frontends with the client a verdict is asked for, [`verdict`] is
//! the verdict as compared, [`model`] reads it from each backend's render, [`gate`] judges a switch.
//! Everything here is pure.

pub mod frontends;
pub mod gate;
pub mod model;
pub mod verdict;

pub use gate::{Refused, SwitchGate};
pub use verdict::Verdict;
