//! `explain --kernel`: what the kernel holds on the connection's path, compared with the plan, one
//! file per backend. Each reads its backend's own model (the tracer, the nftables table state, the IPVS
//! virtual servers); the backends know nothing of `explain`.
//!
//! ```text
//! wiring::explain (reads the kernel) ─► iptables::compare_kernel  (iptables-save ─► Tracer ─► trace)
//!                                    ├► nftables::compare_kernel  (elements and chains on the path)
//!                                    └► ipvs::compare_kernel      (virtual server, real servers, weights)
//!                                         ─► Explanation.drift, and the kernel's outcome where it has one
//! ```

pub mod iptables;
pub mod ipvs;
pub mod nftables;
