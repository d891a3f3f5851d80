//! What every backend shares, and the choice between them. A leaf: it depends on no backend (the
//! backends depend on it; [`crate::wiring`] puts them together).
//!
//! ```text
//! spec ─► scope (families, NodePort addresses) ─┐
//! host ─► facts::HostFacts ─────────────────────┴─► facts::FamilyEnv ─► iptables::render / nftables::render /
//!                                                                         ipvs::render (each pure)
//! spec.backend ─► select::Selector ─► the chosen backend's sync::Dataplane (iptables when the
//!                                     chosen one cannot run here; leftovers of the others removed)
//! ```
//!
//! A new backend is a module with its render and its `Dataplane`, plus one [`select::Candidate`] in
//! [`crate::wiring::dataplane::host_dataplane`] and one arm in [`crate::wiring::render_text::render_text`].

pub mod facts;
pub mod scope;
pub mod select;

pub use facts::{FamilyEnv, HostFacts, LocalDetector};
pub use scope::{families_of, node_port_ips, sync_scope};
pub use select::{Candidate, Selector};
