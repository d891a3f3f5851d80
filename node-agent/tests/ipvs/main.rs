//! Tests of the IPVS backend through its public API: goldens of the rendered state, and the dataplane
//! and backend selection against the in-memory kernel (IPVS table, ipsets, dummy interface, iptables
//! text), comparing the resulting kernel state rather than calls.
//!
//! One test binary with modules, so the crate is linked once. The modules are `cfg(test)` so clippy
//! treats their helpers as test code (unwrap allowed by clippy.toml), like the rest of the tests.

#[cfg(test)]
mod dataplane;
#[cfg(test)]
#[path = "../iptables/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod kernel;
#[cfg(test)]
mod make_before_break;
#[cfg(test)]
mod select;
#[cfg(test)]
mod switch_gate;
#[cfg(test)]
mod verification;
