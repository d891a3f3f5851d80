//! Fuzzing the agent's readers of untrusted input (harness: `fuzz/harness.rs`, corpus: `fuzz/corpus/`):
//!
//! ```text
//! plan_file    text  ─► planfile::parse_plan_text ─► compose_plan (slice headers validated)
//!                      ─► validate ─► revision, entry failures ─► iptables / nftables / IPVS render
//! plan_cache   text  ─► source::cache::read (the plan and slices cached on disk, read at a restart)
//! ipvs_netlink bytes ─► ipvs::netlink::decode_datagram ─► codec::service_of / destination_of
//!                      (and the bytes as one IPVS generic-netlink payload, straight to the attribute parsers)
//! ```
//!
//! Each must return, Ok or Err, on any input; a panic or a hang fails the test and lands in the corpus.
//! `SWITCHYARD_FUZZ_SECONDS=60 cargo test -p switchyard-agent --test fuzz -- --nocapture
//! --test-threads=1` runs each for a minute.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../fuzz/harness.rs"]
mod harness;

use std::collections::HashSet;
use std::sync::Arc;

use harness::{Entry, Target, fuzz};
use netlink_packet_core::ParseableParametrized;
use netlink_packet_generic::GenlHeader;
use switchyard_agent::backend::HostFacts;
use switchyard_agent::ipvs::codec::{self, IpvsMessage};
use switchyard_agent::ipvs::netlink::decode_datagram;
use switchyard_agent::planfile::parse_plan_text;
use switchyard_agent::sync::composition::{Composition, LastGood, compose_plan};
use switchyard_agent::wiring::render_text::render_text;
use switchyard_api::{Backend, IpFamily, validate::validate};

/// What the agent does with a plan file, up to the rules it would program.
fn plan_file(text: &str) {
    let Ok(file) = parse_plan_text(text) else {
        return;
    };
    let slices: Vec<_> = file
        .slices
        .into_iter()
        .map(|(name, spec)| (name, Arc::new(spec)))
        .collect();
    let Composition::Ready { spec, .. } =
        compose_plan(&Arc::new(file.plan), &slices, &mut LastGood::default())
    else {
        return;
    };
    let _ = switchyard_api::revision::compute(&spec);
    let report = validate(&spec);
    let _ = switchyard_agent::sync::status_fields::entry_failures(&spec, &report);
    if !report.plan.is_empty() {
        return;
    }
    // A plan that passes validation must render on every backend (skipping its bad entries).
    let skip: HashSet<usize> = report.bad_entries();
    let facts = HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        local_addrs: vec!["192.0.2.10".parse().unwrap(), "2001:db8::10".parse().unwrap()],
    };
    for backend in [Backend::Iptables, Backend::Nftables, Backend::Ipvs] {
        let _ = render_text(backend, &spec, &skip, &facts, None);
    }
}

/// The plan cache read at a restart.
fn plan_cache(text: &str) {
    thread_local! {
        static FILE: std::path::PathBuf = {
            // Under target/tmp (cargo's scratch directory for integration tests), one file per thread.
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-plan-cache");
            std::fs::create_dir_all(&dir).unwrap();
            dir.join(format!("{:?}.json", std::thread::current().id()).replace(['(', ')'], ""))
        };
    }
    FILE.with(|path| {
        std::fs::write(path, text).unwrap();
        let _ = switchyard_agent::source::cache::read(path, "node-a");
    });
}

/// A datagram from the kernel, as the IPVS client decodes it.
fn ipvs_netlink(bytes: &[u8]) {
    let mut replies: Vec<IpvsMessage> = Vec::new();
    let _ = decode_datagram(bytes, 1, &mut replies);
    // The same bytes as one generic-netlink payload (genlmsghdr first).
    if let Some((header, attrs)) = bytes.split_at_checked(4) {
        let header = GenlHeader {
            cmd: header[0],
            version: header[1],
        };
        if let Ok(message) = IpvsMessage::parse_with_param(attrs, header) {
            replies.push(message);
        }
    }
    for reply in &replies {
        let _ = codec::service_of(reply);
        let _ = codec::destination_of(reply, IpFamily::IPv4);
        let _ = codec::destination_of(reply, IpFamily::IPv6);
    }
}

#[test]
fn fuzz_plan_file() {
    fuzz(&Target {
        name: "plan_file",
        entry: Entry::Text(plan_file),
    });
}

#[test]
fn fuzz_plan_cache() {
    fuzz(&Target {
        name: "plan_cache",
        entry: Entry::Text(plan_cache),
    });
}

#[test]
fn fuzz_ipvs_netlink() {
    fuzz(&Target {
        name: "ipvs_netlink",
        entry: Entry::Bytes(ipvs_netlink),
    });
}
