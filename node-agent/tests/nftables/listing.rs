//! kubernetes#136786 pinned: what a full sync reads back of our table, from `nft -j list` output and,
//! when `nft` fails to list (an `nft` older than the one that wrote something on the host crashes
//! there), from the netlink summary alone.
//!
//! `fixtures/nft-1.0.6-bookworm.json` is real output of Debian bookworm's nft 1.0.6 (the agent image's)
//! listing the table `full_table_bridge_detector_and_service_cidrs` renders. The other shapes are that
//! output changed the ways libnftables-json(5) allows and nft versions differ in (keys added or
//! reordered, a set's flags as a string or a list, elements with or without the `elem` wrapper of
//! counted sets, a newer metainfo); they are not captures of other nft binaries.

use std::collections::HashSet;

use serde_json::Value;
use switchyard_agent::backend::HostFacts;
use switchyard_agent::nftables::kernel::{ChainSummary, SetSummary, Summary};
use switchyard_agent::nftables::{TableState, diff::diff, listing, render};
use switchyard_api::testing::finish;
use switchyard_api::{DetectLocalMode, IpFamily, NodeForwardingPlanSpec};

use crate::fixtures::everything;

const BOOKWORM: &str = include_str!("fixtures/nft-1.0.6-bookworm.json");

/// The plan the fixture's table was rendered from (as in golden.rs).
fn spec() -> NodeForwardingPlanSpec {
    let mut spec = everything();
    spec.services.retain(|s| {
        ["ns1/multi:p80", "ns4/local:p80", "ns5/nolocal:p80"].contains(&s.name.as_str())
            && s.family == IpFamily::IPv4
    });
    spec.cluster.detect_local = DetectLocalMode::BridgeInterface;
    spec.cluster.local_traffic_cidrs.clear();
    spec.cluster.local_traffic_interface = Some("cbr0".into());
    spec.cluster.service_cidrs = vec![
        "10.96.0.0/16".into(),
        "10.97.0.0/16".into(),
        "fd00:10:96::/112".into(),
    ];
    finish(&mut spec);
    spec
}

fn desired() -> TableState {
    render(&spec(), &HostFacts::default(), IpFamily::IPv4, &HashSet::new())
}

/// `f` applied to every object of the listing.
fn reshaped(f: impl Fn(&mut serde_json::Map<String, Value>)) -> String {
    let mut listing: Value = serde_json::from_str(BOOKWORM).unwrap();
    for object in listing["nftables"].as_array_mut().unwrap() {
        for body in object.as_object_mut().unwrap().values_mut() {
            if let Some(body) = body.as_object_mut() {
                f(body);
            }
        }
    }
    listing.to_string()
}

/// Every shape reads back as exactly the table rendered: a full sync over it changes nothing.
#[test]
fn every_listing_shape_reads_back_as_the_table_written() {
    let shapes: Vec<(&str, String)> = vec![
        ("nft 1.0.6 (bookworm), as printed", BOOKWORM.to_string()),
        (
            "keys nft may add (handles elsewhere, a policy, a newer schema version)",
            reshaped(|body| {
                body.insert("x-unknown".into(), Value::from("ignored"));
                if let Some(v) = body.get_mut("json_schema_version") {
                    *v = Value::from(2);
                }
            }),
        ),
        (
            "a set's flags as a list and as a string",
            reshaped(|body| {
                if body.contains_key("elem") && !body.contains_key("flags") {
                    body.insert("flags".into(), Value::from(vec!["interval"]));
                }
                if let Some(Value::Array(flags)) = body.get("flags").cloned()
                    && flags.len() == 1
                {
                    body.insert("flags".into(), flags[0].clone());
                }
            }),
        ),
        (
            "counted elements printed without their counters",
            reshaped(|body| {
                if let Some(Value::Array(elements)) = body.get_mut("elem") {
                    for element in elements.iter_mut() {
                        unwrap_counted(element);
                    }
                }
            }),
        ),
    ];
    let want = desired();
    for (name, text) in shapes {
        let before =
            listing::parse(text.as_bytes(), IpFamily::IPv4).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(before.unreadable.is_empty(), "{name}: {:?}", before.unreadable);
        let transaction = diff(Some(&before), &want);
        assert!(
            transaction.is_empty(),
            "{name}: a full sync would write\n{}",
            transaction.text()
        );
    }
}

fn unwrap_counted(element: &mut Value) {
    match element {
        Value::Array(pair) => pair.iter_mut().for_each(unwrap_counted),
        Value::Object(map) => {
            if let Some(val) = map.get("elem").and_then(|e| e.get("val")).cloned() {
                *element = val;
            }
        }
        _ => {}
    }
}

/// When `nft` cannot list at all, the netlink summary is enough for a full sync that keeps every
/// chain and rewrites only the sets' elements, in one transaction, without recreating the table.
#[test]
fn a_failed_listing_falls_back_to_the_netlink_summary() {
    let listed = listing::parse(BOOKWORM.as_bytes(), IpFamily::IPv4).unwrap();
    let mut summary = Summary::default();
    for (name, chain) in &listed.chains {
        let (rules, digest) = chain.summary();
        summary.chains.insert(
            name.clone(),
            ChainSummary {
                base: chain.base.is_some(),
                rules,
                digest: digest.map(|d| format!("switchyard:{d}")),
            },
        );
    }
    for (name, set) in &listed.sets {
        let elements = switchyard_agent::nftables::SetId::parse(name)
            .and_then(|id| listed.elements.get(&id))
            .map_or(0, |e| e.len());
        summary.sets.insert(
            name.clone(),
            SetSummary {
                digest: Some(format!("switchyard:{}", set.digest)),
                elements,
            },
        );
    }
    let before = listing::from_summary(summary, IpFamily::IPv4);
    let want = desired();
    let transaction = diff(Some(&before), &want);
    let text = transaction.text();
    assert_eq!(transaction.chain_changes(), 0, "{text}");
    assert!(
        !text.contains("delete table") && !text.contains("add chain"),
        "{text}"
    );
    assert!(text.contains("flush set ip switchyard cluster-ips"), "{text}");
    assert!(text.contains("add element ip switchyard cluster-ips"), "{text}");
}
