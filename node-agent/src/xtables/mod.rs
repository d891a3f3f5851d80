//! The iptables toolkit: everything about iptables the tool, nothing about Services. The iptables
//! backend ([`crate::iptables`]) and the IPVS glue ([`crate::ipvs`]) both build on it, as kube-proxy's
//! proxiers build on `pkg/util/iptables`.
//!
//! ```text
//! backend's chains ─► payload::{Chain, Table} + write_* ─► restore text ─► kernel::Iptables::restore
//! backend's jumps ──► jumps::JumpRule (from rows) ─────────────────────────► ensure_jump / in the restore
//!                                                     kernel::Iptables ─┬─ exec::ExecIptables (mode: nft | legacy)
//! iptables-save ─► save::SavedTable (our chains, our jumps)             └─ fake::FakeIptables (on tracer::Tracer)
//!     └─► cleanup::remove_owned (every SWYD- chain and jump)
//! tokens: the tokenizer and quoter every reader and writer of rules shares;  chains: the fixed chain names
//! ```

pub mod chains;
pub mod cleanup;
pub mod exec;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod jumps;
pub mod kernel;
pub mod mode;
pub mod payload;
pub mod save;
pub mod tokens;
pub mod tracer;

pub use payload::{Chain, Table};
pub use tracer::{Branch, Packet, Trace, Tracer, Verdict};
