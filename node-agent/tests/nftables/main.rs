//! Tests of the nftables backend through its public API: goldens of the `nft -f` text, the dataplane
//! against the fake kernel (full, partial, restart, drift, failures), the partial sync checked against a
//! full render after every change, and the real `nft` in throwaway network namespaces (root).
//!
//! One test binary with modules, so the crate is linked once. The plan is the iptables tests' fixture,
//! so both backends are tested on the same input.

#[cfg(test)]
#[path = "../iptables/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod incremental;
#[cfg(test)]
#[path = "../common/lab.rs"]
mod lab;
#[cfg(test)]
mod listing;
#[cfg(test)]
mod real_kernel;
#[cfg(test)]
mod sync;
