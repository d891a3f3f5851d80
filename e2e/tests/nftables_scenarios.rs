//! The nftables backend on real packets: the same lab scenario suite as iptables (`scenarios/mod.rs`),
//! with the controller's `defaultBackend: nftables`, so the planner writes `backend: nftables` into
//! every plan and each node's agent programs its `ip switchyard` table. Needs root (see
//! `common::lab_allowed`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod scenarios;

use scenarios::Suite;
use switchyard_api::Backend;

const SUITE: Suite = Suite {
    backend: Backend::Nftables,
};

#[test]
fn example_cluster_forwards_like_kube_proxy() {
    scenarios::example_cluster_forwards_like_kube_proxy(SUITE);
}

#[test]
fn node_ports_hairpin_and_snat() {
    scenarios::node_ports_hairpin_and_snat(SUITE);
}

#[test]
fn source_ranges_filter_load_balancer_traffic_but_not_node_ports() {
    scenarios::source_ranges_filter_load_balancer_traffic_but_not_node_ports(SUITE);
}

#[test]
fn an_endpoint_change_is_a_partial_sync() {
    scenarios::an_endpoint_change_is_a_partial_sync(SUITE);
}

#[test]
fn stale_udp_conntrack_entries_are_removed_after_an_endpoint_change() {
    scenarios::stale_udp_conntrack_entries_are_removed_after_an_endpoint_change(SUITE);
}

#[test]
fn a_killed_agent_leaves_rules_working_and_a_restart_reuses_them() {
    scenarios::a_killed_agent_leaves_rules_working_and_a_restart_reuses_them(SUITE);
}

#[test]
fn drift_is_repaired_within_a_resync_period() {
    scenarios::drift_is_repaired_within_a_resync_period(SUITE);
}

#[test]
fn bad_plans_keep_the_last_good_rules() {
    scenarios::bad_plans_keep_the_last_good_rules(SUITE);
}

#[test]
fn cleanup_removes_exactly_what_the_agent_made() {
    scenarios::cleanup_removes_exactly_what_the_agent_made(SUITE);
}

#[test]
fn a_cluster_policy_udp_service_spreads_over_every_endpoint() {
    scenarios::a_cluster_policy_udp_service_spreads_over_every_endpoint(SUITE);
}
