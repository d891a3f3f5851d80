//! What every backend shares, and the choice between them.
//!
//! ```text
//! spec ─► scope (families, NodePort addresses) ─┐
//! host ─► facts::HostFacts ─────────────────────┴─► facts::FamilyEnv ─► iptables::render / nftables::render /
//!                                                                         ipvs::render (each pure)
//! spec.backend ─► select::Selector ─► the chosen backend's sync::Dataplane (iptables when the
//!                                     chosen one cannot run here; leftovers of the others removed)
//! host ─► host: the real edges of all three wired together (apply/run, render, cleanup)
//! render_text: what `render` prints, per backend
//! ```
//!
//! A new backend is a module with its render and its `Dataplane`, plus one [`select::Candidate`] in
//! [`host::host_dataplane`] and one arm in [`render_text::render_text`].

pub mod facts;
pub mod host;
pub mod render_text;
pub mod scope;
pub mod select;

pub use facts::{FamilyEnv, HostFacts};
pub use scope::{families_of, node_port_ips, sync_scope};
pub use select::{Candidate, Selector};
