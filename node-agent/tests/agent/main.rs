//! Tests of the agent's sync loop through its public API: the syncer's decisions against the fake
//! iptables edge (state-based: the fake holds what the kernel would), the live loop against the fake
//! API server at the HTTP level (`live_*`: watch, views and slices, status writes, cache and restarts, deleted
//! plans, HTTP endpoints), and the agent binary against the real kernel inside throwaway network
//! namespaces (root; see `lab`).
//!
//! One test binary with modules, so the crate is linked once. The modules are `cfg(test)` so clippy
//! treats their helpers as test code (unwrap allowed by clippy.toml).

#[cfg(test)]
mod explain_cli;
#[cfg(test)]
mod fixtures;
#[cfg(test)]
#[path = "../common/lab.rs"]
mod lab;
#[cfg(test)]
mod live_api;
#[cfg(test)]
mod live_leaving;
#[cfg(test)]
mod live_restart;
#[cfg(test)]
mod live_support;
#[cfg(test)]
mod real_kernel;
#[cfg(test)]
mod syncer;
