//! The iptables backend on real packets: the shared lab scenario suite (`scenarios/mod.rs`) with the
//! controller's `defaultBackend: iptables`. Needs root (see `common::lab_allowed`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[macro_use]
mod scenarios;

scenario_suite!(switchyard_api::Backend::Iptables);
