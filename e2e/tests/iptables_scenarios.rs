//! The iptables backend on real packets: the shared lab scenario suite (`scenarios/mod.rs`) with the
//! controller's `defaultBackend: iptables`. Needs root (see `common::lab_allowed`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[macro_use]
mod scenarios;

scenario_suite!(switchyard_api::Backend::Iptables);

/// `explain --kernel` reads iptables rules, so this one is for the iptables suite only.
#[test]
fn explain_kernel_follows_the_installed_rules_and_names_a_hand_edit() {
    scenarios::explain_kernel_follows_the_installed_rules_and_names_a_hand_edit(SUITE);
}
