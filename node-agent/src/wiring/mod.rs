//! The three backends put together on this host: the real edges wired into one [`crate::backend::Selector`]
//! for `apply` and `run`, what `render` prints for each backend, what `cleanup` removes, and what
//! `explain --kernel` reads.
//!
//! ```text
//! cli ─► dataplane::host_dataplane ─► Selector(iptables, candidates: IPVS, nftables)   (real edges)
//!     ─► dataplane::render_for_host ─► render_text::render_text(backend)               (pure text)
//!     ─► dataplane::cleanup ─► every backend's rules and objects removed
//!     ─► explain::compare_with_kernel ─► the plan's backend's kernel read, compared on the path
//! run ─► counters::HostCounters ─► the plan's backend's traffic counters (nftables, IPVS)
//!     ─► verify::host_verifier ─► the backend in use verified after a switch (probes, refusals)
//! ```

pub mod counters;
pub mod dataplane;
pub mod explain;
pub mod render_text;
pub mod verify;
