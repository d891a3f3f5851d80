//! The nftables backend on real packets: the same lab scenario suite as iptables (`scenarios/mod.rs`),
//! with the controller's `defaultBackend: nftables`, so the planner writes `backend: nftables` into
//! every plan and each node's agent programs its `ip switchyard` table. Needs root (see
//! `common::lab_allowed`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[macro_use]
mod scenarios;

scenario_suite!(switchyard_api::Backend::Nftables);
