//! The IPVS backend (work in progress).

pub mod codec;
pub mod fake;
pub mod glue;
pub mod ipset;
pub mod kernel;
pub mod netlink;
pub mod render;
pub mod sets;
pub mod dummy;
pub mod sysctl;
