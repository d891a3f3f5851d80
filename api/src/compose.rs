//! Composing what a node forwards from its plan and its views' ForwardingSlices. Pure: the agent runs it
//! before every sync, the controller's offline `plan --node` prints its result, and the planner's tests
//! hold it against the per-node oracle.
//!
//! ```text
//! plan.views [all, zone-a] ─► per view: packed slices <view>-0000 … <view>-<count-1>, all agreeing on count
//!                                 │        (missing / disagreeing ─► Incomplete: apply nothing)
//!                                 │      + Service slices <view>.<namespace>.<name>: each replaces every
//!                                 │        packed entry of its Service in that view (none: the packed copy)
//!                                 ▼
//! entries: view `all`, replaced by the zone view's, replaced by the plan's overrides (same key)
//!          onNode of view entries ◄─ plan.endpointsOnNode;  local ◄─ plan.localEndpoints
//!                                 ▼
//! self-contained spec (services = every entry, sorted) + the slices used (count, digest) + conflicts
//! ```
//!
//! Conflicts: one key in two slices of the same view is a conflict; the slice whose name sorts first
//! wins and the conflict is reported. One key in two views is not: the more specific view wins (an entry
//! moving between `all` and a zone view is briefly in both). Entries of a node's own view (`node-…`:
//! its overrides, moved out of a plan that outgrew its budget) keep their `onNode` flags, as overrides
//! in the plan do.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::{
    plan::{IpFamily, NodeForwardingPlanSpec, PlanEndpoint, PlanSummary, Protocol, ServicePlan},
    revision::REVISION_LEN,
    slice::{ForwardingSliceSpec, MAX_SLICES_PER_VIEW, service_slice_name, slice_name},
    status::{ObservedSlices, ServiceFailure},
};

/// One slice as the agent holds it: its object name and spec.
#[derive(Debug, Clone, Copy)]
pub struct SliceRef<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// The spec.
    pub spec: &'a ForwardingSliceSpec,
}

/// A node's composed forwarding state.
#[derive(Debug, Clone, PartialEq)]
pub struct Composed {
    /// Self-contained: the plan's header and revision, no views, every entry in `services`.
    pub spec: NodeForwardingPlanSpec,
    /// The slices used (absent when the plan has no views).
    pub slices: Option<ObservedSlices>,
    /// Entries found twice in one view; the first slice's copy is used.
    pub conflicts: Vec<ServiceFailure>,
}

type Key<'a> = (&'a str, Protocol, IpFamily);

/// Composes `plan` with `slices` (any order; slices of other views, or named unlike their view and
/// index, are ignored). `Err` says why a view is incomplete.
pub fn compose(plan: &NodeForwardingPlanSpec, slices: &[SliceRef<'_>]) -> Result<Composed, String> {
    if plan.is_self_contained() {
        return Ok(Composed {
            spec: plan.clone(),
            slices: None,
            conflicts: Vec::new(),
        });
    }
    let mut used: Vec<SliceRef<'_>> = Vec::new();
    // key → (view position, slice name, entry); a later (more specific) view replaces an earlier one.
    let mut chosen: HashMap<Key<'_>, (usize, &str, &Arc<ServicePlan>)> = HashMap::new();
    let mut conflicts = Vec::new();
    for (rank, view) in plan.views.iter().enumerate() {
        let packed = complete_view(view, slices)?;
        let own = service_slices(view, slices);
        let replaced: HashSet<&str> = own.iter().filter_map(|s| s.spec.service.as_deref()).collect();
        for slice in &packed {
            for entry in &slice.spec.entries {
                if !replaced.contains(entry.service_key()) {
                    choose(&mut chosen, &mut conflicts, rank, entry, slice);
                }
            }
        }
        for slice in &own {
            let service = slice.spec.service.as_deref().unwrap_or_default();
            for entry in &slice.spec.entries {
                if entry.service_key() == service {
                    choose(&mut chosen, &mut conflicts, rank, entry, slice);
                } else {
                    conflicts.push(ServiceFailure {
                        service: format!("{} {:?} {:?}", entry.name, entry.protocol, entry.family),
                        reason: format!("in Service slice {} of another Service; ignored", slice.name),
                    });
                }
            }
        }
        used.extend(packed);
        used.extend(own);
    }
    let on_node: HashSet<&str> = plan.endpoints_on_node.iter().map(String::as_str).collect();
    let overrides: HashSet<Key<'_>> = plan.overrides.iter().map(|e| e.key()).collect();
    let locals: HashMap<Key<'_>, HashSet<(&str, u16)>> = plan
        .local_endpoints
        .iter()
        .map(|l| {
            (
                l.key(),
                l.endpoints.iter().map(|e| (e.ip.as_str(), e.port)).collect(),
            )
        })
        .collect();
    let mut services: Vec<Arc<ServicePlan>> = Vec::with_capacity(chosen.len() + overrides.len());
    for (key, (rank, _, entry)) in &chosen {
        if overrides.contains(key) {
            continue;
        }
        let own_view = plan.views.get(*rank).is_some_and(|v| v.starts_with("node-"));
        let local = locals.get(key);
        let on_node = |ip: &str| !own_view && on_node.contains(ip);
        let is_local = |ep: &PlanEndpoint| local.is_some_and(|l| l.contains(&(ep.ip.as_str(), ep.port)));
        // Most entries come out as the view has them: share the slice's copy (one copy of 10,000
        // entries, not two) and copy only those whose flags this node changes.
        let changes = entry
            .endpoints
            .iter()
            .any(|ep| (!own_view && ep.on_node != on_node(&ep.ip)) || (!ep.local && is_local(ep)));
        if !changes {
            services.push(Arc::clone(entry));
            continue;
        }
        let mut copy = ServicePlan::clone(entry);
        for ep in &mut copy.endpoints {
            if !own_view {
                ep.on_node = on_node(&ep.ip);
            }
            ep.local |= is_local(ep);
        }
        services.push(Arc::new(copy));
    }
    services.extend(plan.overrides.iter().cloned());
    services.sort_by(|a, b| a.key().cmp(&b.key()));
    let mut spec = plan.clone();
    spec.views = Vec::new();
    spec.endpoints_on_node = Vec::new();
    spec.local_endpoints = Vec::new();
    spec.overrides = Vec::new();
    spec.summary = PlanSummary::of(&services);
    spec.services = services;
    conflicts.sort_by(|a, b| a.service.cmp(&b.service));
    Ok(Composed {
        spec,
        slices: Some(ObservedSlices {
            count: used.len() as u32,
            digest: slices_digest(used.iter().map(|s| (s.name, s.spec.revision.as_str()))),
        }),
        conflicts,
    })
}

/// Chooses `entry` for its key at `rank`: a key chosen at this rank already is a conflict (the first
/// copy stays); one from an earlier, more general view is replaced.
fn choose<'a>(
    chosen: &mut HashMap<Key<'a>, (usize, &'a str, &'a Arc<ServicePlan>)>,
    conflicts: &mut Vec<ServiceFailure>,
    rank: usize,
    entry: &'a Arc<ServicePlan>,
    slice: &SliceRef<'a>,
) {
    match chosen.get(&entry.key()) {
        Some((have_rank, have_slice, _)) if *have_rank == rank => {
            conflicts.push(twice(entry, have_slice, slice));
        }
        _ => {
            chosen.insert(entry.key(), (rank, slice.name, entry));
        }
    }
}

fn twice(entry: &ServicePlan, have_slice: &str, slice: &SliceRef<'_>) -> ServiceFailure {
    ServiceFailure {
        service: format!("{} {:?} {:?}", entry.name, entry.protocol, entry.family),
        reason: format!(
            "in slices {have_slice} and {} of view {}; {have_slice}'s entry is used",
            slice.name, slice.spec.view
        ),
    }
}

/// The Service slices of one view: named for their view and Service, in name order.
fn service_slices<'a>(view: &str, slices: &[SliceRef<'a>]) -> Vec<SliceRef<'a>> {
    let mut out: Vec<SliceRef<'a>> = slices
        .iter()
        .filter(|s| {
            s.spec.view == view
                && s.spec
                    .service
                    .as_deref()
                    .is_some_and(|service| s.name == service_slice_name(view, service))
        })
        .copied()
        .collect();
    out.sort_by(|a, b| a.name.cmp(b.name));
    out
}

/// Why the plan's views are not complete with these slices, without composing anything (`None`: they
/// are complete, or the plan has no views).
pub fn incomplete(plan: &NodeForwardingPlanSpec, slices: &[SliceRef<'_>]) -> Option<String> {
    plan.views
        .iter()
        .find_map(|view| complete_view(view, slices).err())
}

/// The slices of one complete view, in index order; `Err` says what is missing.
fn complete_view<'a>(view: &str, slices: &[SliceRef<'a>]) -> Result<Vec<SliceRef<'a>>, String> {
    let ours = |s: &&SliceRef<'a>| {
        s.spec.view == view && s.spec.service.is_none() && s.name == slice_name(view, s.spec.index)
    };
    let mut by_index: HashMap<u32, SliceRef<'a>> = HashMap::new();
    for slice in slices.iter().filter(ours) {
        by_index.insert(slice.spec.index, *slice);
    }
    let Some(first) = by_index.get(&0) else {
        return Err(if by_index.is_empty() {
            format!("view {view} has no slices yet")
        } else {
            format!("slice {} of view {view} is missing", slice_name(view, 0))
        });
    };
    let count = first.spec.count;
    if count > MAX_SLICES_PER_VIEW {
        return Err(format!(
            "slice {} says view {view} has {count} slices, more than {MAX_SLICES_PER_VIEW}",
            first.name
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count {
        let name = slice_name(view, index);
        match by_index.get(&index) {
            None => return Err(format!("slice {name} of view {view} is missing ({count} slices)")),
            Some(slice) if slice.spec.count != count => {
                return Err(format!(
                    "slice {name} says view {view} has {} slices, slice {} says {count}",
                    slice.spec.count, first.name
                ));
            }
            Some(slice) => out.push(*slice),
        }
    }
    Ok(out)
}

/// Digest of slices by name and revision (order-free): sha256 of the sorted `name=revision` lines, first
/// [`REVISION_LEN`] hex characters.
pub fn slices_digest<'a>(slices: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut lines: Vec<(&str, &str)> = slices.into_iter().collect();
    lines.sort_unstable();
    let mut hasher = Sha256::new();
    for (name, revision) in lines {
        hasher.update(name.as_bytes());
        hasher.update(b"=");
        hasher.update(revision.as_bytes());
        hasher.update(b"\n");
    }
    let mut text = data_encoding::HEXLOWER.encode(&hasher.finalize());
    text.truncate(REVISION_LEN);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{EndpointExt, EntryExt, entry, ep, live_plan, service_slice, slice};

    fn names(spec: &NodeForwardingPlanSpec) -> Vec<&str> {
        spec.services.iter().map(|s| s.name.as_str()).collect()
    }

    fn refs(slices: &[(String, ForwardingSliceSpec)]) -> Vec<SliceRef<'_>> {
        slices
            .iter()
            .map(|(name, spec)| SliceRef { name, spec })
            .collect()
    }

    #[test]
    fn views_then_overrides_replace_by_key_and_on_node_comes_from_the_plan() {
        let all = slice(
            "all",
            0,
            1,
            vec![
                entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.5", 80)),
                entry("ns/b", "10.96.0.2", 80).with(ep("10.244.2.5", 80)),
                entry("ns/c", "10.96.0.3", 80).with(ep("10.244.3.5", 80)),
            ],
        );
        let zone = slice(
            "zone-a",
            0,
            1,
            vec![entry("ns/b", "10.96.0.2", 80).with(ep("10.244.2.6", 80))],
        );
        let mut plan = live_plan(
            "node-a",
            &["all", "zone-a"],
            vec![
                entry("ns/c", "10.96.0.3", 80)
                    .itp_local()
                    .with(ep("10.244.3.5", 80).local()),
            ],
        );
        plan.endpoints_on_node = vec!["10.244.1.5".into()];
        let slices = vec![zone, all];
        let composed = compose(&plan, &refs(&slices)).unwrap();
        assert_eq!(names(&composed.spec), ["ns/a", "ns/b", "ns/c"]);
        let s = &composed.spec.services;
        assert!(s[0].endpoints[0].on_node, "on node through endpointsOnNode");
        assert_eq!(s[1].endpoints[0].ip, "10.244.2.6", "the zone view wins over all");
        assert!(s[2].endpoints[0].local, "the override wins over the views");
        assert!(composed.spec.is_self_contained());
        assert!(composed.spec.overrides.is_empty());
        assert_eq!(composed.spec.summary.entries, 3);
        assert_eq!(composed.spec.revision, plan.revision);
        assert!(composed.conflicts.is_empty());
        let observed = composed.slices.unwrap();
        assert_eq!(observed.count, 2);
        assert_eq!(
            observed.digest,
            slices_digest(slices.iter().map(|(n, s)| (n.as_str(), s.revision.as_str())))
        );
        assert!(crate::validate::validate(&composed.spec).is_clean());
    }

    #[test]
    fn local_endpoints_amend_the_view_entry_they_name() {
        let all = slice(
            "all",
            0,
            1,
            vec![
                entry("ns/web", "10.96.0.1", 80)
                    .itp_local()
                    .with(ep("10.244.1.5", 80).not_cluster())
                    .with(ep("10.244.2.5", 80).not_cluster())
                    .has_endpoints(true),
            ],
        );
        let mut plan = live_plan("node-a", &["all"], vec![]);
        plan.endpoints_on_node = vec!["10.244.1.5".into()];
        plan.local_endpoints = vec![crate::plan::LocalEndpoints {
            name: "ns/web".into(),
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            endpoints: vec![crate::plan::EndpointRef {
                ip: "10.244.1.5".into(),
                port: 80,
            }],
        }];
        let composed = compose(&plan, &refs(&[all])).unwrap();
        let eps = &composed.spec.services[0].endpoints;
        assert!(eps[0].local && eps[0].on_node);
        assert!(!eps[1].local && !eps[1].on_node);
        assert!(composed.spec.local_endpoints.is_empty());
        assert!(crate::validate::validate(&composed.spec).is_clean());
    }

    #[test]
    fn incomplete_views_are_refused_with_the_reason() {
        let plan = live_plan("node-a", &["all", "zone-a"], vec![]);
        let zone = slice("zone-a", 0, 1, vec![]);
        let all0 = slice("all", 0, 2, vec![]);
        let all1 = slice("all", 1, 2, vec![]);
        let all1_of_4 = slice("all", 1, 4, vec![]);
        let mut misnamed = slice("all", 1, 2, vec![]);
        misnamed.0 = "all-x".into();
        type Case = (
            &'static str,
            Vec<(String, ForwardingSliceSpec)>,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            ("complete", vec![zone.clone(), all0.clone(), all1.clone()], None),
            (
                "no zone view",
                vec![all0.clone(), all1.clone()],
                Some("view zone-a has no slices yet"),
            ),
            (
                "missing slice",
                vec![zone.clone(), all0.clone()],
                Some("slice all-0001 of view all is missing"),
            ),
            (
                "no slice 0",
                vec![zone.clone(), all1.clone()],
                Some("slice all-0000 of view all is missing"),
            ),
            (
                "count disagrees",
                vec![zone.clone(), all0.clone(), all1_of_4],
                Some("says view all has 4 slices"),
            ),
            (
                "misnamed slice ignored",
                vec![zone.clone(), all0.clone(), misnamed],
                Some("all-0001 of view all is missing"),
            ),
        ];
        for (name, slices, want) in cases {
            assert_eq!(
                incomplete(&plan, &refs(&slices)).is_none(),
                want.is_none(),
                "{name}"
            );
            match (compose(&plan, &refs(&slices)), want) {
                (Ok(_), None) => {}
                (Err(why), Some(want)) => assert!(why.contains(want), "{name}: {why}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn slices_past_the_count_are_retired_and_ignored() {
        let plan = live_plan("node-a", &["all"], vec![]);
        let slices = vec![
            slice(
                "all",
                0,
                1,
                vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.5", 80))],
            ),
            slice(
                "all",
                1,
                2,
                vec![entry("ns/old", "10.96.0.9", 80).with(ep("10.244.1.9", 80))],
            ),
        ];
        let composed = compose(&plan, &refs(&slices)).unwrap();
        assert_eq!(names(&composed.spec), ["ns/a"]);
        assert_eq!(composed.slices.unwrap().count, 1);
    }

    #[test]
    fn a_key_twice_in_one_view_is_a_conflict_resolved_by_slice_name() {
        let plan = live_plan("node-a", &["all"], vec![]);
        let slices = vec![
            slice(
                "all",
                1,
                2,
                vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.6", 80))],
            ),
            slice(
                "all",
                0,
                2,
                vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.5", 80))],
            ),
        ];
        let composed = compose(&plan, &refs(&slices)).unwrap();
        assert_eq!(composed.spec.services[0].endpoints[0].ip, "10.244.1.5");
        assert_eq!(composed.conflicts.len(), 1);
        assert!(
            composed.conflicts[0].reason.contains("all-0000 and all-0001"),
            "{:?}",
            composed.conflicts
        );
    }

    #[test]
    fn a_service_slice_replaces_every_packed_entry_of_its_service_in_its_view() {
        let plan = live_plan("node-a", &["all", "zone-a"], vec![]);
        let web = |port: u16, ip: &str| {
            let mut e = entry("ns/web", "10.96.0.1", port).with(ep(ip, 8080));
            e.name = format!("ns/web:p{port}");
            e
        };
        let packed = slice(
            "all",
            0,
            1,
            vec![
                web(80, "10.244.1.5"),
                web(443, "10.244.1.5"),
                entry("ns/db", "10.96.0.2", 5432).with(ep("10.244.2.5", 5432)),
            ],
        );
        let zone = slice("zone-a", 0, 1, vec![]);
        type Case = (
            &'static str,
            Vec<(String, ForwardingSliceSpec)>,
            Vec<&'static str>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (
                "packed copy alone",
                vec![],
                vec!["ns/db", "ns/web:p443", "ns/web:p80"],
                "10.244.1.5",
            ),
            (
                "the Service slice's entries, port 443 gone with it",
                vec![service_slice("all", 0, 1, "ns/web", vec![web(80, "10.244.1.6")])],
                vec!["ns/db", "ns/web:p80"],
                "10.244.1.6",
            ),
            (
                "an empty Service slice: the Service has no entries",
                vec![service_slice("all", 0, 1, "ns/web", vec![])],
                vec!["ns/db"],
                "",
            ),
            (
                "a Service slice of another view changes nothing here",
                vec![service_slice("zone-b", 0, 1, "ns/web", vec![])],
                vec!["ns/db", "ns/web:p443", "ns/web:p80"],
                "10.244.1.5",
            ),
        ];
        for (name, extra, want, web_ip) in cases {
            let mut slices = vec![packed.clone(), zone.clone()];
            slices.extend(extra.clone());
            let composed = compose(&plan, &refs(&slices)).unwrap();
            assert_eq!(names(&composed.spec), want, "{name}");
            let ip = composed
                .spec
                .services
                .iter()
                .find(|s| s.name == "ns/web:p80")
                .map_or("", |s| s.endpoints[0].ip.as_str());
            assert_eq!(ip, web_ip, "{name}");
            assert!(composed.conflicts.is_empty(), "{name}: {:?}", composed.conflicts);
            let used: Vec<(String, ForwardingSliceSpec)> = slices
                .into_iter()
                .filter(|(n, _)| n.starts_with("all") || n.starts_with("zone-a"))
                .collect();
            let observed = composed.slices.unwrap();
            assert_eq!(
                observed.count as usize,
                used.len(),
                "{name}: Service slices are reported"
            );
            assert_eq!(
                observed.digest,
                slices_digest(used.iter().map(|(n, s)| (n.as_str(), s.revision.as_str()))),
                "{name}"
            );
        }
        // A Service slice alone does not make a view complete.
        let lone = service_slice("all", 0, 1, "ns/web", vec![web(80, "10.244.1.6")]);
        assert!(compose(&plan, &refs(&[lone, zone.clone()])).is_err());
        // Misnamed: ignored. Another Service's entry inside: ignored and reported.
        let mut misnamed = service_slice("all", 0, 1, "ns/web", vec![]);
        misnamed.0 = "all.ns.other".into();
        let stray = service_slice(
            "all",
            0,
            1,
            "ns/db",
            vec![
                entry("ns/db", "10.96.0.2", 5432).with(ep("10.244.2.6", 5432)),
                web(80, "10.244.9.9"),
            ],
        );
        let composed = compose(&plan, &refs(&[packed, zone, misnamed, stray])).unwrap();
        assert_eq!(names(&composed.spec), ["ns/db", "ns/web:p443", "ns/web:p80"]);
        assert_eq!(composed.spec.services[0].endpoints[0].ip, "10.244.2.6");
        assert_eq!(
            composed.spec.services[2].endpoints[0].ip, "10.244.1.5",
            "the stray copy is ignored"
        );
        assert_eq!(composed.conflicts.len(), 1, "{:?}", composed.conflicts);
        assert!(
            composed.conflicts[0]
                .reason
                .contains("all.ns.db of another Service")
        );
    }

    #[test]
    fn a_self_contained_plan_is_used_as_it_is() {
        let plan = crate::testing::plan(
            "node-a",
            vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.5", 80))],
        );
        let composed = compose(&plan, &[]).unwrap();
        assert_eq!(composed.spec, plan);
        assert_eq!(composed.slices, None);
    }

    #[test]
    fn the_digest_is_order_free_and_content_sensitive() {
        let a = slices_digest([("all-0000", "r1"), ("all-0001", "r2")]);
        assert_eq!(a, slices_digest([("all-0001", "r2"), ("all-0000", "r1")]));
        assert_ne!(a, slices_digest([("all-0000", "r1"), ("all-0001", "r3")]));
        assert_eq!(a.len(), REVISION_LEN);
    }
}
