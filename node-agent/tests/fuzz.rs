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

/// What a plan file's text comes to: refused (unreadable, or its plan rejected whole: nothing renders),
/// or the plan and slices that would render.
fn renders(text: &str) -> Option<switchyard_agent::planfile::ParsedPlanFile> {
    let file = parse_plan_text(text).ok()?;
    let slices: Vec<_> = file
        .slices
        .iter()
        .map(|(name, spec)| (name.clone(), Arc::new(spec.clone())))
        .collect();
    let Composition::Ready { spec, .. } =
        compose_plan(&Arc::new(file.plan.clone()), &slices, &mut LastGood::default())
    else {
        return None;
    };
    validate(&spec).plan.is_empty().then_some(file)
}

/// The lines inside an object's `spec` (YAML or pretty-printed JSON): the line `spec:` (`"spec": {`)
/// and every line below it indented deeper.
fn spec_lines(lines: &[&str]) -> Vec<bool> {
    let indent = |line: &str| line.len() - line.trim_start_matches([' ', '-']).len();
    let mut inside: Option<usize> = None;
    lines
        .iter()
        .map(|line| {
            let key = line.trim_start_matches([' ', '-']);
            if inside.is_some_and(|at| indent(line) <= at && !line.trim().is_empty()) {
                inside = None;
            }
            if inside.is_none() && (key.starts_with("spec:") || key.starts_with("\"spec\":")) {
                inside = Some(indent(line));
            }
            inside.is_some()
        })
        .collect()
}

/// One character of a line changed: a digit to the next digit, a letter to the next letter.
fn flip(line: &str, at: usize) -> String {
    line.char_indices()
        .map(|(i, c)| match c {
            _ if i != at => c,
            '9' => '0',
            'z' => 'a',
            'Z' => 'A',
            c if c.is_ascii_alphanumeric() => char::from(c as u8 + 1),
            c => c,
        })
        .collect()
}

/// Issue 45: every cut (the file ending before line N), every deleted line and every flipped character
/// (each line's first and last letter or digit) of real plan files — a self-contained plan, a live plan
/// with its slices, YAML and JSON, as `switchyard-controller plan` wrote them in the lab — must leave
/// nothing that renders, but for edits of what the agent never reads (labels, a List's own apiVersion, a
/// leading `---`), which must then read exactly as the original did.
#[test]
fn every_cut_and_flip_of_a_real_plan_is_refused() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/plan_file");
    let mut tried = 0;
    let mut harmless = 0;
    for name in [
        "lab_node_a.yaml",
        "lab_node_b_objects.yaml",
        "lab_node_c.json",
        "dual_stack_node_a.yaml",
        "dual_stack_objects.json",
    ] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let original = renders(&text).unwrap_or_else(|| panic!("{name}: the original must render"));
        let lines: Vec<&str> = text.lines().collect();
        let in_spec = spec_lines(&lines);
        let with = |i: usize, replacement: Option<String>| -> String {
            let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            match replacement {
                Some(line) => out[i] = line,
                None => {
                    out.remove(i);
                }
            }
            out.join("\n") + "\n"
        };
        for (i, line) in lines.iter().enumerate() {
            let alnum: Vec<usize> = line
                .char_indices()
                .filter(|(_, c)| c.is_ascii_alphanumeric())
                .map(|(at, _)| at)
                .collect();
            let mut edits = vec![
                ("cut before", lines[..i].join("\n") + "\n"),
                ("deleted", with(i, None)),
            ];
            for at in [alnum.first(), alnum.last()].into_iter().flatten() {
                edits.push(("flipped", with(i, Some(flip(line, *at)))));
            }
            for (what, edited) in edits {
                tried += 1;
                let Some(read) = renders(&edited) else {
                    continue;
                };
                assert!(
                    !in_spec[i],
                    "{name}: line {} {what} ({line:?}) still renders",
                    i + 1
                );
                assert_eq!(
                    read,
                    original,
                    "{name}: line {} {what} ({line:?}) renders something else",
                    i + 1
                );
                harmless += 1;
            }
        }
    }
    eprintln!("{tried} cuts, deletions and flips: {harmless} left what renders unchanged, the rest refused");
    assert!(harmless * 10 < tried, "{harmless} of {tried} edits went unseen");
}
