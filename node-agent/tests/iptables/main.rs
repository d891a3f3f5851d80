//! Tests of the iptables render through its public API: goldens of the restore payload, packet-flow
//! tables through the tracer, partial syncs against the tracer's kernel model, and properties over
//! random plans.
//!
//! One test binary with modules, so the crate is linked once. The modules are `cfg(test)` so clippy
//! treats their helpers as test code (unwrap allowed by clippy.toml), like the rest of the tests.

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod golden;
#[cfg(test)]
#[path = "../common/lab.rs"]
mod lab;
#[cfg(test)]
mod packet_flow;
#[cfg(test)]
mod partial;
#[cfg(test)]
mod props;
#[cfg(test)]
mod real_kernel;
