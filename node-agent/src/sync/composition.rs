//! Turning a node's plan and its views' ForwardingSlices into the one self-contained spec to apply.
//!
//! ```text
//! plan (self-contained) ──────────────────────────────────────────────► Ready(plan as it is)
//! plan (views) + slices ─► validate each slice's header ─ bad ─► its last good copy stands in (or nothing), reported
//!                                              └ good ─► remembered as its last good copy
//!                        ─► switchyard_api::compose ─► Ready(spec, slices used, conflicts + bad slices)
//!                                                   └► Incomplete(why): keep the current rules, report it
//! ```
//!
//! A slice that fails validation must not take down the forwarding it carried, nor block every other
//! change: the agent keeps composing with the copy of that slice it last accepted, and says so. Entries
//! are not validated here: the syncer validates the composed spec, skipping and reporting bad entries
//! one by one, so each entry is validated once per sync.

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_api::compose::{SliceRef, compose};
use switchyard_api::validate::validate_slice_header;
use switchyard_api::{ForwardingSliceSpec, NodeForwardingPlanSpec, ObservedSlices, ServiceFailure};

/// One ForwardingSlice as the agent holds it: its name and spec.
pub type SliceObject = (String, Arc<ForwardingSliceSpec>);

/// The result of composing.
#[derive(Debug, Clone, PartialEq)]
pub enum Composition {
    /// The spec to apply (the plan's revision), the slices it was composed from, and what is wrong with
    /// some of them (invalid slices, entries found twice in a view).
    Ready {
        /// The self-contained spec.
        spec: Arc<NodeForwardingPlanSpec>,
        /// The slices used; `None` for a self-contained plan.
        slices: Option<ObservedSlices>,
        /// Problems with slices, one per invalid slice or conflicting entry.
        failures: Vec<ServiceFailure>,
    },
    /// The plan's views are not complete: nothing may be programmed from them.
    Incomplete(String),
}

/// The last copy of each slice that passed validation.
#[derive(Debug, Clone, Default)]
pub struct LastGood(HashMap<String, Arc<ForwardingSliceSpec>>);

/// Composes `plan` with `slices`, validating each slice first.
pub fn compose_plan(
    plan: &Arc<NodeForwardingPlanSpec>,
    slices: &[SliceObject],
    last_good: &mut LastGood,
) -> Composition {
    if plan.is_self_contained() {
        return Composition::Ready {
            spec: Arc::clone(plan),
            slices: None,
            failures: Vec::new(),
        };
    }
    let mut failures = Vec::new();
    let mut usable: Vec<SliceObject> = Vec::with_capacity(slices.len());
    for (name, spec) in slices {
        let report = validate_slice_header(spec);
        if report.plan.is_empty() {
            last_good.0.insert(name.clone(), Arc::clone(spec));
            usable.push((name.clone(), Arc::clone(spec)));
            continue;
        }
        let problems: Vec<String> = report.plan.iter().take(3).map(ToString::to_string).collect();
        let stand_in = last_good.0.get(name).cloned();
        let reason = match &stand_in {
            Some(good) => format!(
                "rejected: {}; its last good revision {} stays in use",
                problems.join("; "),
                good.revision
            ),
            None => format!("rejected: {}; nothing from it is applied", problems.join("; ")),
        };
        failures.push(ServiceFailure {
            service: format!("ForwardingSlice {name}"),
            reason,
        });
        if let Some(good) = stand_in {
            usable.push((name.clone(), good));
        }
    }
    let present: std::collections::HashSet<&str> = slices.iter().map(|(n, _)| n.as_str()).collect();
    last_good.0.retain(|name, _| present.contains(name.as_str()));
    let refs: Vec<SliceRef<'_>> = usable
        .iter()
        .map(|(name, spec)| SliceRef { name, spec })
        .collect();
    match compose(plan, &refs) {
        Ok(composed) => {
            failures.extend(composed.conflicts);
            Composition::Ready {
                spec: Arc::new(composed.spec),
                slices: composed.slices,
                failures,
            }
        }
        Err(why) => {
            let bad: Vec<String> = failures
                .iter()
                .map(|f| format!("{}: {}", f.service, f.reason))
                .collect();
            if bad.is_empty() {
                Composition::Incomplete(why)
            } else {
                Composition::Incomplete(format!("{why} ({})", bad.join("; ")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, live_plan, plan, slice};

    fn arcs(slices: Vec<(String, ForwardingSliceSpec)>) -> Vec<SliceObject> {
        slices.into_iter().map(|(n, s)| (n, Arc::new(s))).collect()
    }

    fn two_slices(port: u16) -> Vec<SliceObject> {
        arcs(vec![
            slice(
                "all",
                0,
                1,
                vec![entry("ns/a", "10.96.0.1", port).with(ep("10.244.2.1", 80))],
            ),
            slice("zone-a", 0, 1, vec![]),
        ])
    }

    #[test]
    fn a_self_contained_plan_is_used_as_it_is() {
        let spec = Arc::new(plan(
            "node-a",
            vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        ));
        let Composition::Ready {
            spec: got, slices, ..
        } = compose_plan(&spec, &[], &mut LastGood::default())
        else {
            panic!()
        };
        assert!(Arc::ptr_eq(&got, &spec), "no copy of a large plan");
        assert_eq!(slices, None);
    }

    #[test]
    fn views_compose_and_report_the_slices_used() {
        let spec = Arc::new(live_plan("node-a", &["all", "zone-a"], vec![]));
        let Composition::Ready {
            spec: got,
            slices,
            failures,
        } = compose_plan(&spec, &two_slices(80), &mut LastGood::default())
        else {
            panic!()
        };
        assert_eq!(got.services.len(), 1);
        assert_eq!(slices.unwrap().count, 2);
        assert!(failures.is_empty());
        assert!(switchyard_api::validate::validate(&got).is_clean());
    }

    #[test]
    fn an_invalid_slice_is_replaced_by_its_last_good_copy_and_reported() {
        let spec = Arc::new(live_plan("node-a", &["all", "zone-a"], vec![]));
        let mut memory = LastGood::default();
        assert!(matches!(
            compose_plan(&spec, &two_slices(80), &mut memory),
            Composition::Ready { .. }
        ));
        // The next version of all-0000 is broken (count 0).
        let mut broken = two_slices(81);
        let mut bad = (*broken[0].1).clone();
        bad.count = 0;
        bad.revision = "broken".into();
        broken[0].1 = Arc::new(bad);
        let Composition::Ready {
            spec: got, failures, ..
        } = compose_plan(&spec, &broken, &mut memory)
        else {
            panic!()
        };
        assert_eq!(got.services[0].port, 80, "the last good copy stays");
        assert_eq!(failures.len(), 1);
        assert!(failures[0].reason.contains("last good revision"), "{failures:?}");
        // A hand edit that broke the slice but kept its revision: the last good copy stands in too.
        let mut edited = two_slices(80);
        let mut bad = (*edited[0].1).clone();
        bad.index = 5;
        edited[0].1 = Arc::new(bad);
        let Composition::Ready { spec: got, .. } = compose_plan(&spec, &edited, &mut memory) else {
            panic!("the last good copy should stand in")
        };
        assert_eq!(got.services[0].port, 80);
        // Without a last good copy the view is incomplete: nothing is programmed from it.
        match compose_plan(&spec, &broken, &mut LastGood::default()) {
            Composition::Incomplete(why) => assert!(why.contains("nothing from it is applied"), "{why}"),
            ready => panic!("{ready:?}"),
        }
    }

    #[test]
    fn a_missing_slice_makes_the_view_incomplete() {
        let spec = Arc::new(live_plan("node-a", &["all", "zone-a"], vec![]));
        let mut slices = two_slices(80);
        slices.remove(1);
        match compose_plan(&spec, &slices, &mut LastGood::default()) {
            Composition::Incomplete(why) => assert!(why.contains("zone-a"), "{why}"),
            ready => panic!("{ready:?}"),
        }
    }
}
