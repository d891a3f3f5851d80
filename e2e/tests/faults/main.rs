//! The fault suite (issue "faults and hostile input"): each test breaks one thing a node agent depends
//! on while real traffic flows through the lab, and asserts what survives.
//!
//! ```text
//! harness::ApiLab: example cluster ─► fake API server (HTTP) ◄─ controller; one agent per lab node via a relay
//! traffic::Traffic: connections to Services whose endpoints do not change, before / during / after
//! fault ─► assertions on the kernel, the status on the API server and the agents' /metrics
//!       ─► one line per fault: `fault: <name>: N connections, 0 failed (before …, during …, after …)`
//! ```
//!
//! docs/reliability.md lists every fault, the promise and the test that shows it. Needs root (the lab).
//! `SWITCHYARD_FAULT_OUTAGE=10s` shortens the API-server outage of fault 1 (default 60 s, as promised).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod api;
mod controller;
mod harness;
mod kernel;

use std::time::Duration;

use switchyard_e2e::Place;
use switchyard_e2e::traffic::Flow;

/// Connections to Services whose endpoints no fault changes: ClusterIP from pods on two nodes, a
/// NodePort from outside through a third node, and DNS over UDP; and two held connections (ClusterIP
/// from a pod, the NodePort from outside) that must never be reset: 0 false kills by the agent's
/// clearing of removed endpoints' connections.
pub fn stable_flows() -> Vec<Flow> {
    vec![
        Flow::tcp(Place::pod("nginx-pod-3"), "10.96.0.80:80", &["apache"]).unwrap(),
        Flow::held_tcp(Place::pod("nginx-pod-3"), "10.96.0.80:80", &["apache"]).unwrap(),
        Flow::held_tcp(Place::Client, "192.168.10.12:32701", &["nginx-gateway"]).unwrap(),
        Flow::tcp(
            Place::pod("apache-6d4cf56db6-a1"),
            "10.96.125.27:8080",
            &["heketi"],
        )
        .unwrap(),
        Flow::tcp(Place::Client, "192.168.10.12:32701", &["nginx-gateway"]).unwrap(),
        Flow::udp(
            Place::pod("apache-6d4cf56db6-a1"),
            "10.96.0.53:53",
            &["node-local-dns-a"],
        )
        .unwrap(),
    ]
}

/// How long the API server stays away in fault 1.
pub fn outage() -> Duration {
    std::env::var("SWITCHYARD_FAULT_OUTAGE")
        .ok()
        .and_then(|text| switchyard_api::duration::parse(&text).ok())
        .unwrap_or(Duration::from_secs(60))
}

/// The relay the faults cut: connections pass while it is up, are refused while it is cut, and pass
/// again once restored.
#[test]
fn the_relay_passes_refuses_when_cut_and_passes_again_when_restored() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use switchyard_e2e::{netns, relay::Relay};
    if !common::lab_allowed("relay") {
        return;
    }
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in server.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.write_all(b"hello");
        }
    });
    let name = format!("swyd-relay-{}", std::process::id());
    netns::add_all(std::slice::from_ref(&name)).unwrap();
    let status = std::process::Command::new("ip")
        .args(["-n", &name, "link", "set", "lo", "up"])
        .status()
        .unwrap();
    assert!(status.success());
    let hello = || {
        netns::in_netns(&name, move || {
            let mut conn = TcpStream::connect(addr).ok()?;
            let mut text = String::new();
            conn.read_to_string(&mut text).ok()?;
            Some(text)
        })
        .unwrap()
    };
    let mut relay = Relay::start(&name, &[addr]).unwrap();
    let up = hello();
    relay.cut();
    let cut = hello();
    relay.restore().unwrap();
    let restored = hello();
    drop(relay);
    netns::delete_all(std::slice::from_ref(&name));
    assert_eq!(up.as_deref(), Some("hello"));
    assert_eq!(cut, None);
    assert_eq!(restored.as_deref(), Some("hello"));
}
