//! Shared helpers of the lab tests: root check (or skip), the example cluster, a lab with the right
//! `switchyard-lab` binary, and host-namespace snapshots.

#![allow(dead_code)]

use std::{
    net::{IpAddr, SocketAddr},
    process::Command,
    time::Duration,
};

use switchyard_e2e::{ClusterDescription, Lab, LabOptions, install_teardown_on_signal, preflight};

/// Per-probe timeout in the lab (no loss there: answers take microseconds).
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The example cluster of the lab's own tests.
pub const EXAMPLE: &str = include_str!("../../testdata/cluster.yaml");

/// True when lab tests can run; false (after printing a skip line) when not root and
/// `SWITCHYARD_SKIP_LAB=1`; panics when not root otherwise.
pub fn lab_allowed(test: &str) -> bool {
    if preflight::is_root() {
        install_teardown_on_signal().expect("signal handler");
        return true;
    }
    if std::env::var("SWITCHYARD_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skip {test}: the lab needs root (SWITCHYARD_SKIP_LAB=1)");
        return false;
    }
    panic!(
        "{test}: the lab tests need root and iproute2 (network namespaces); run them as root, \
         or set SWITCHYARD_SKIP_LAB=1 to skip them"
    );
}

/// Options that serve backends with this package's `switchyard-lab` binary.
pub fn options() -> LabOptions {
    LabOptions::with_binary(env!("CARGO_BIN_EXE_switchyard-lab"))
}

/// A lab of `yaml`, or `None` when skipped.
pub fn lab_of(test: &str, yaml: &str) -> Option<Lab> {
    if !lab_allowed(test) {
        return None;
    }
    let description = ClusterDescription::from_yaml(yaml).expect("description");
    Some(Lab::up_with(description, options()).expect("lab up"))
}

/// The example lab, or `None` when skipped.
pub fn example_lab(test: &str) -> Option<Lab> {
    lab_of(test, EXAMPLE)
}

/// `"ip:port"` as a socket address.
pub fn sa(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// `"ip"` as an address.
pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("IP address")
}

/// Namespaces whose name starts with `<id>-`.
pub fn namespaces_of(id: &str) -> Vec<String> {
    switchyard_e2e::netns::list()
        .expect("list namespaces")
        .into_iter()
        .filter(|name| name.starts_with(&format!("{id}-")))
        .collect()
}

/// The host namespace's links, addresses, routes and the sysctls the lab sets in its namespaces.
pub fn host_snapshot() -> String {
    let mut snapshot = String::new();
    for args in [
        &["-o", "link"][..],
        &["-o", "addr"][..],
        &["route"][..],
        &["-6", "route"][..],
    ] {
        let out = Command::new("ip").args(args).output().expect("ip");
        snapshot.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    for key in [
        "net/ipv4/ip_forward",
        "net/ipv4/conf/all/rp_filter",
        "net/ipv4/conf/all/send_redirects",
        "net/ipv6/conf/all/disable_ipv6",
    ] {
        let value = std::fs::read_to_string(format!("/proc/sys/{key}")).unwrap_or_default();
        snapshot.push_str(&format!("{key}={value}"));
    }
    snapshot
}
