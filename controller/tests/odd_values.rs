//! Every kind the controller watches, with an odd value in one field at a time (null, a scalar of another
//! type, an unknown member: `switchyard_test_support::odd_values`), decoded as its watches decode them
//! (`live::trim::Delivered`):
//!
//! ```text
//! sample object ─► odd_values ─► Delivered<K> ─► decoded                          (fields planning never
//!                                             └► undecodable: named field, key kept   reads: always decoded)
//! ```
//!
//! A watch never fails for an object's sake: the worst an odd value does is make its own object
//! undecodable, naming the field, with the object's name still known (so its last good version stays).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_api::testing::{EntryExt, entry, ep, live_plan, slice};
use switchyard_api::tolerant::Prune;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, NodeForwardingPlanStatus};
use switchyard_controller::live::trim::{Delivered, Unread};
use switchyard_test_support::odd_values::{self, odd_values, related};

/// What the controller never reads of each kind (the oracle: `live::trim` drops these before decoding).
fn never_read(kind: &str, path: &str) -> bool {
    let under = |prefix: &str| related(prefix, path) && path.len() >= prefix.len();
    if under("metadata.managedFields") {
        return true;
    }
    match kind {
        "Service" => under("status.conditions"),
        "Node" => path.starts_with("status.") && !under("status.addresses"),
        "EndpointSlice" => {
            let Some(rest) = path.strip_prefix("endpoints[").and_then(|r| r.split_once("].")) else {
                return false;
            };
            let field = rest.1;
            field.starts_with("deprecatedTopology")
                || (field.starts_with("targetRef.") && field != "targetRef.name")
        }
        "NodeForwardingPlan" => under("status"),
        _ => false,
    }
}

struct Summary {
    kind: String,
    odd: usize,
    undecodable: Vec<String>,
}

fn check<K>(sample: Value) -> Summary
where
    K: Resource + DeserializeOwned,
    K::DynamicType: Default,
    Unread: Prune<K>,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let name = sample["metadata"]["name"].clone();
    let decoded: Delivered<K> = serde_json::from_value(sample.clone()).unwrap();
    assert!(
        decoded.undecodable().is_none(),
        "the {kind} sample itself: {:?}",
        decoded.undecodable()
    );
    let mut summary = Summary {
        kind: kind.clone(),
        odd: 0,
        undecodable: Vec::new(),
    };
    for odd in odd_values(&sample) {
        summary.odd += 1;
        let what = format!("{kind} with {} = {}", odd.path, odd.value);
        // Through serde, as a watch event's object or a list item is read: never an error.
        let delivered: Delivered<K> = match serde_json::from_value(odd.object) {
            Ok(delivered) => delivered,
            Err(error) => panic!("{what}: the watch would fail: {error}"),
        };
        let Some(undecodable) = delivered.undecodable() else {
            continue;
        };
        assert!(
            !never_read(&kind, &odd.path),
            "{what}: a field the controller never reads failed its object: {undecodable}"
        );
        assert!(
            related(&undecodable.path, &odd.path),
            "{what}: the error names another field: {undecodable}"
        );
        if !odd.path.starts_with("metadata") {
            assert_eq!(
                undecodable
                    .metadata
                    .name
                    .as_ref()
                    .map(|n| Value::from(n.as_str())),
                Some(name.clone()),
                "{what}: its key is lost"
            );
        }
        summary.undecodable.push(format!("{} = {}", odd.path, odd.value));
    }
    summary
}

#[test]
fn an_odd_value_fails_at_most_its_own_object_and_never_where_planning_does_not_read() {
    let mut plan = NodeForwardingPlan::new("node-a", live_plan("node-a", &["all"], vec![]));
    plan.status = Some(NodeForwardingPlanStatus {
        observed_revision: Some("r1".into()),
        ..NodeForwardingPlanStatus::default()
    });
    let (name, spec) = slice(
        "all",
        0,
        1,
        vec![entry("ns/web:http", "10.96.0.10", 80).with(ep("10.244.1.5", 8080))],
    );
    let summaries = [
        check::<Service>(odd_values::service("shop", "web")),
        check::<EndpointSlice>(odd_values::endpoint_slice("shop", "web-1", "web", "node-a")),
        check::<Node>(odd_values::node("node-a")),
        check::<NodeForwardingPlan>(serde_json::to_value(plan).unwrap()),
        check::<ForwardingSlice>(serde_json::to_value(ForwardingSlice::new(&name, spec)).unwrap()),
    ];
    for summary in &summaries {
        eprintln!(
            "{}: {} odd values, {} leave the object undecodable (its last good version stays): {}",
            summary.kind,
            summary.odd,
            summary.undecodable.len(),
            summary.undecodable.join("; ")
        );
        assert!(
            summary.odd > 20,
            "{}: too few fields to mean anything",
            summary.kind
        );
    }
    // The case that started it (the upstream conformance suite writes it): decoded.
    let service = &summaries[0];
    assert!(
        !service
            .undecodable
            .iter()
            .any(|u| u.starts_with("status.conditions[0].lastTransitionTime")),
        "{:?}",
        service.undecodable
    );
}
