//! Slices and plans: entries alike in every zone live once in view `all`, zone-hinted ones per zone;
//! above the byte budget a view splits into power-of-two slices by Service hash, each fitting the budget;
//! a node's overrides move into its own view when they outgrow its plan; a change to one Service rewrites
//! one slice; an entry moving between views is written where it arrives first.

use switchyard_api::{ForwardingSliceSpec, View, revision};

use super::{all_objects, assert_same_as_rebuild, spec_of};
use crate::{
    config::Config,
    planner::{
        Planner, Snapshot,
        fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, three_nodes},
    },
};

fn services(count: usize, local: bool, hinted: bool) -> Snapshot {
    let mut svcs = Vec::new();
    let mut slices = Vec::new();
    for i in 0..count {
        let name = format!("svc-{i:04}");
        svcs.push(service(
            "ns1",
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
            |s| {
                s.port("http", 80, "TCP");
                if local {
                    s.spec_mut().internal_traffic_policy = Some("Local".into());
                }
            },
        ));
        let eps = (1..=5u8)
            .map(|j| {
                let node = ["node-a", "node-b", "node-c"][usize::from(j % 3)];
                let ep = endpoint(
                    &format!("10.244.{}.{}", j % 3 + 1, (i % 50) * 5 + usize::from(j)),
                    node,
                );
                if hinted {
                    ep.zone_hints(&[if j % 3 == 2 { "zone-b" } else { "zone-a" }])
                } else {
                    ep
                }
            })
            .collect();
        slices.push(slice("ns1", &name, &[("http", 8080, "TCP")], eps));
    }
    Snapshot {
        services: svcs,
        slices,
        nodes: three_nodes(),
    }
}

fn build(snapshot: &Snapshot, budget: usize) -> Planner {
    let config = Config {
        max_object_bytes: budget,
        ..super::config()
    };
    Planner::build(snapshot, &config).unwrap()
}

fn view_of<'a>(slices: &'a [(String, ForwardingSliceSpec)], view: &str) -> Vec<&'a ForwardingSliceSpec> {
    slices
        .iter()
        .filter(|(_, s)| s.view == view)
        .map(|(_, s)| s)
        .collect()
}

#[test]
fn entries_alike_in_every_zone_live_once_in_view_all_and_hinted_ones_per_zone() {
    let mut snapshot = services(4, false, false);
    let hinted = services(2, false, true);
    for (svc, eps) in hinted.services.into_iter().zip(hinted.slices) {
        let mut svc = svc;
        let mut eps = eps;
        let name = format!("hinted-{}", svc.metadata.name.as_deref().unwrap());
        svc.metadata.name = Some(name.clone());
        eps.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubernetes.io/service-name".into(), name);
        snapshot.services.push(svc);
        snapshot.slices.push(eps);
    }
    let planner = build(&snapshot, 48 * 1024);
    let (slices, plans) = all_objects(&planner);
    let names: Vec<&str> = slices.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["all-0000", "zone-a-0000", "zone-b-0000"]);
    assert_eq!(view_of(&slices, "all")[0].entries.len(), 4);
    for zone in ["zone-a", "zone-b"] {
        let entries = &view_of(&slices, zone)[0].entries;
        assert_eq!(entries.len(), 2, "{zone}");
        assert!(entries.iter().all(|e| e.name.starts_with("ns1/hinted-")));
    }
    assert_eq!(plans[0].views, ["all", "zone-a"]);
    assert_eq!(plans[2].views, ["all", "zone-b"]);
    for node in ["node-a", "node-b", "node-c"] {
        assert_eq!(spec_of(&planner, node).services.len(), 6);
    }
}

#[test]
fn a_view_above_the_budget_splits_into_fitting_slices_by_service() {
    let snapshot = services(600, false, false);
    let planner = build(&snapshot, 32 * 1024);
    let (slices, _) = all_objects(&planner);
    let all = view_of(&slices, "all");
    assert!(
        all.len() >= 4 && all.len().is_power_of_two(),
        "{} slices",
        all.len()
    );
    let mut seen = 0;
    for (i, spec) in all.iter().enumerate() {
        let bytes = serde_json::to_vec(spec).unwrap().len();
        assert!(bytes + 4096 <= 32 * 1024, "slice {i}: {bytes} bytes");
        assert_eq!((spec.index as usize, spec.count as usize), (i, all.len()));
        assert_eq!(spec.revision, revision::compute_slice(spec).unwrap());
        assert_eq!(spec.summary.entries as usize, spec.entries.len());
        seen += spec.entries.len();
    }
    assert_eq!(seen, 600, "every entry in exactly one slice");
    for node in ["node-a", "node-b", "node-c"] {
        assert_eq!(spec_of(&planner, node).services.len(), 600);
    }
}

#[test]
fn a_change_to_one_service_writes_its_own_small_slice_and_folding_writes_the_packed_one() {
    let mut snapshot = services(600, false, false);
    let config = Config {
        max_object_bytes: 32 * 1024,
        ..super::config()
    };
    let mut planner = Planner::build(&snapshot, &config).unwrap();
    let before = all_objects(&planner);
    assert!(before.0.len() > 4, "{} packed slices", before.0.len());
    let mut eps = snapshot.slices[17].clone();
    eps.endpoints.as_mut().unwrap()[0]
        .conditions
        .as_mut()
        .unwrap()
        .ready = Some(false);
    let changes = planner
        .replan_service("ns1/svc-0017", Some(&snapshot.services[17]), &[&eps])
        .unwrap();
    snapshot.slices[17] = eps.clone();
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all.ns1.svc-0017"], "{changes:?}");
    assert!(
        !changes.slices[0].first,
        "same view: the packed copy covers it meanwhile, so nothing has to wait for it"
    );
    assert!(
        changes.plans.is_empty() && changes.retired.is_empty(),
        "{changes:?}"
    );
    let after = all_objects(&planner);
    let packed: Vec<_> = after
        .0
        .iter()
        .filter(|(n, _)| !n.contains('.'))
        .cloned()
        .collect();
    assert_eq!(packed, before.0, "every packed slice stays as written");
    let (_, own) = after.0.iter().find(|(n, _)| n == "all.ns1.svc-0017").unwrap();
    assert_eq!(own.service.as_deref(), Some("ns1/svc-0017"));
    assert_eq!(own.entries.len(), 1);
    assert_eq!(own.revision, revision::compute_slice(own).unwrap());
    let bytes = serde_json::to_vec(own).unwrap().len();
    assert!(bytes < 1024, "one Service's entries: {bytes} bytes");
    assert_same_as_rebuild(&planner, &snapshot, &config);

    // A second change rewrites the same small slice; the packed copy still waits.
    eps.endpoints.as_mut().unwrap()[1].addresses = vec!["10.244.9.9".into()];
    let changes = planner
        .replan_service("ns1/svc-0017", Some(&snapshot.services[17]), &[&eps])
        .unwrap();
    snapshot.slices[17] = eps.clone();
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all.ns1.svc-0017"]);
    assert_same_as_rebuild(&planner, &snapshot, &config);

    // Folding writes the packed slice with the current entries; the Service slice is retired.
    let shadowed = planner.shadowed();
    assert_eq!(shadowed.len(), 1);
    assert_eq!(
        shadowed[0].1.iter().copied().collect::<Vec<_>>(),
        ["ns1/svc-0017"]
    );
    let packed_name = shadowed[0].0.clone();
    let changes = super::fold_all(&mut planner);
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [packed_name.as_str()]);
    assert_eq!(changes.retired, ["all.ns1.svc-0017"]);
    assert_eq!(
        all_objects(&planner),
        all_objects(&Planner::build(&snapshot, &config).unwrap())
    );
}

#[test]
fn a_new_service_gets_its_own_slice_and_a_deleted_one_an_empty_one_until_folded() {
    let mut snapshot = services(40, false, false);
    let config = super::config();
    let mut planner = Planner::build(&snapshot, &config).unwrap();
    let extra = services(41, false, false);
    let (svc, eps) = (extra.services[40].clone(), extra.slices[40].clone());
    let changes = planner
        .replan_service("ns1/svc-0040", Some(&svc), &[&eps])
        .unwrap();
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all.ns1.svc-0040"]);
    snapshot.services.push(svc);
    snapshot.slices.push(eps);
    assert_same_as_rebuild(&planner, &snapshot, &config);

    let changes = planner.replan_service("ns1/svc-0003", None, &[]).unwrap();
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all.ns1.svc-0003"]);
    let gone = planner.slice("all.ns1.svc-0003").unwrap();
    assert!(gone.entries.is_empty(), "empty: the packed copy no longer counts");
    snapshot.services.remove(3);
    snapshot.slices.remove(3);
    assert_same_as_rebuild(&planner, &snapshot, &config);

    // The new Service deleted before it was ever packed: its slice empties (deleted only by a fold,
    // when the packed slice matches it, so agents never take the delete for someone else's).
    let changes = planner.replan_service("ns1/svc-0040", None, &[]).unwrap();
    let names: Vec<&str> = changes.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["all.ns1.svc-0040"]);
    assert!(changes.retired.is_empty(), "{changes:?}");
    assert!(planner.slice("all.ns1.svc-0040").unwrap().entries.is_empty());
    snapshot.services.pop();
    snapshot.slices.pop();
    assert_same_as_rebuild(&planner, &snapshot, &config);
    let changes = super::fold_all(&mut planner);
    assert!(
        changes.retired.contains(&"all.ns1.svc-0040".to_string()),
        "{changes:?}"
    );
}

#[test]
fn overrides_that_outgrow_the_plan_move_into_the_nodes_own_view() {
    // Every Service is iTP=Local with endpoints on every node: every node overrides every entry.
    let snapshot = services(300, true, false);
    let planner = build(&snapshot, 32 * 1024);
    let plan = planner.node_plan("node-a").unwrap();
    assert_eq!(plan.views, ["all", "zone-a", "node-node-a"]);
    assert!(plan.overrides.is_empty());
    assert!(serde_json::to_vec(&plan).unwrap().len() + 4096 <= 32 * 1024);
    let slices = planner.slices(Some(&[View::Node("node-a".into())]));
    assert!(slices.len() >= 2, "{} node-view slices", slices.len());
    for (name, spec) in &slices {
        assert!(
            serde_json::to_vec(spec).unwrap().len() + 4096 <= 32 * 1024,
            "{name}"
        );
    }
    assert_eq!(planner.overflowing_nodes().count(), 3);
    spec_of(&planner, "node-a");
    // Small budgets aside, the same overrides fit a plan of 1 MiB.
    let roomy = build(&snapshot, 1 << 20);
    let plan = roomy.node_plan("node-a").unwrap();
    assert_eq!(
        plan.local_endpoints.len(),
        300,
        "Local-only differences: the endpoints, not the entries"
    );
    assert!(plan.overrides.is_empty());
    assert_eq!(roomy.overflowing_nodes().count(), 0);
}

#[test]
fn an_entry_moving_from_all_to_zone_views_is_written_in_its_zones_first() {
    let snapshot = services(3, false, false);
    let mut planner = build(&snapshot, 48 * 1024);
    let hinted = services(3, false, true);
    let changes = planner
        .replan_service("ns1/svc-0001", Some(&hinted.services[1]), &[&hinted.slices[1]])
        .unwrap();
    let first: Vec<&str> = changes
        .slices
        .iter()
        .filter(|c| c.first)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(first, ["zone-a.ns1.svc-0001", "zone-b.ns1.svc-0001"]);
    assert!(
        changes
            .slices
            .iter()
            .any(|c| c.name == "all.ns1.svc-0001" && !c.first),
        "view all says it has no entries there, after the zones have them: {changes:?}"
    );
    assert!(
        changes.slices.iter().all(|c| !c.name.ends_with("-0000")),
        "no packed slice written"
    );
    // And back: view `all` gains it first.
    let changes = planner
        .replan_service(
            "ns1/svc-0001",
            Some(&snapshot.services[1]),
            &[&snapshot.slices[1]],
        )
        .unwrap();
    let first: Vec<&str> = changes
        .slices
        .iter()
        .filter(|c| c.first)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(first, ["all.ns1.svc-0001"]);
    let emptied: Vec<&str> = changes
        .slices
        .iter()
        .filter(|c| !c.first)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        emptied,
        ["zone-a.ns1.svc-0001", "zone-b.ns1.svc-0001"],
        "the zones' Service slices empty after view all has it, and go at the next fold"
    );
    assert!(changes.retired.is_empty(), "{changes:?}");
    for zone in ["zone-a", "zone-b"] {
        assert!(
            planner
                .slice(&format!("{zone}.ns1.svc-0001"))
                .unwrap()
                .entries
                .is_empty()
        );
    }
    assert_same_as_rebuild(&planner, &snapshot, &super::config());
}

#[test]
fn a_view_that_shrinks_retires_its_surplus_slices() {
    let snapshot = services(600, false, false);
    let mut planner = build(&snapshot, 32 * 1024);
    let count = planner.slices(Some(&[View::All])).len();
    assert!(count > 1);
    let mut retired = Vec::new();
    for i in 0..600 {
        let changes = planner
            .replan_service(&format!("ns1/svc-{i:04}"), None, &[])
            .unwrap();
        retired.extend(changes.retired);
    }
    assert_eq!(
        planner.slices(Some(&[View::All])).len(),
        1 + planner.service_slice_count()
    );
    // Deleted Services leave empty Service slices until the view's count changes; then every slice
    // is packed again.
    retired.retain(|name| !name.contains('.'));
    retired.sort();
    let want: Vec<String> = (1..count as u32)
        .map(|i| switchyard_api::slice::slice_name("all", i))
        .collect();
    assert_eq!(retired, want, "every slice but the first retired once");
}

#[test]
fn service_slices_survive_a_new_slice_count_and_a_restart_until_folded() {
    let config = Config {
        max_object_bytes: 32 * 1024,
        ..super::config()
    };
    let mut snapshot = services(300, false, false);
    let mut planner = Planner::build(&snapshot, &config).unwrap();
    let count = |p: &Planner| {
        p.slices(Some(&[View::All]))
            .iter()
            .filter(|(n, _)| !n.contains('.'))
            .count()
    };
    let before = count(&planner);
    let mut eps = snapshot.slices[17].clone();
    eps.endpoints.as_mut().unwrap()[0].addresses = vec!["10.244.9.17".into()];
    planner
        .replan_service("ns1/svc-0017", Some(&snapshot.services[17]), &[&eps])
        .unwrap();
    snapshot.slices[17] = eps;
    // New Services until the view needs more packed slices.
    let more = services(1200, false, false);
    let mut i = 300;
    while count(&planner) == before {
        planner
            .replan_service(
                &format!("ns1/svc-{i:04}"),
                Some(&more.services[i]),
                &[&more.slices[i]],
            )
            .unwrap();
        snapshot.services.push(more.services[i].clone());
        snapshot.slices.push(more.slices[i].clone());
        i += 1;
    }
    // Everything is packed anew, and the Service slices that existed stay, with the packed entries,
    // so deleting them later (a fold) never shows an agent anything else.
    let own = planner
        .slice("all.ns1.svc-0017")
        .expect("kept across the new count");
    let packed: Vec<_> = planner
        .slices(Some(&[View::All]))
        .into_iter()
        .filter(|(n, _)| !n.contains('.'))
        .flat_map(|(_, s)| s.entries)
        .filter(|e| e.service_key() == "ns1/svc-0017")
        .collect();
    assert_eq!(own.entries, packed);
    assert_eq!(own.count as usize, count(&planner));
    assert_same_as_rebuild(&planner, &snapshot, &config);
    let folded = super::fold_all(&mut planner);
    assert!(
        folded.slices.is_empty(),
        "the packed slices already hold them: {folded:?}"
    );
    assert!(folded.retired.contains(&"all.ns1.svc-0017".to_string()));

    // A restarted controller adopts the Service slices it finds instead of deleting them unmatched.
    let svcs: Vec<_> = snapshot.services.iter().collect();
    let eps: Vec<_> = snapshot.slices.iter().collect();
    let existing = std::collections::BTreeMap::from([(
        "all".to_string(),
        std::collections::BTreeSet::from(["ns1/svc-0017".to_string(), "ns1/gone".to_string()]),
    )]);
    let adopted = Planner::build_after(&svcs, &eps, snapshot.nodes.iter(), &config, None, &existing).unwrap();
    assert_eq!(adopted.slice("all.ns1.svc-0017").unwrap().entries, packed);
    assert!(
        adopted.slice("all.ns1.gone").unwrap().entries.is_empty(),
        "a Service that is gone: empty"
    );
    for node in adopted.node_names() {
        spec_of(&adopted, node);
    }
}

#[test]
fn many_services_of_one_packed_slice_changing_at_once_rewrite_it_instead() {
    let config = Config {
        max_object_bytes: 32 * 1024,
        ..super::config()
    };
    let mut snapshot = services(600, false, false);
    let mut planner = Planner::build(&snapshot, &config).unwrap();
    let (name, first) = planner
        .slices(Some(&[View::All]))
        .into_iter()
        .find(|(_, s)| s.entries.len() >= crate::planner::views::BATCH)
        .unwrap();
    let mut picked: Vec<usize> = first
        .entries
        .iter()
        .map(|e| e.service_key()["ns1/svc-".len()..].parse().unwrap())
        .collect();
    picked.dedup();
    let original = snapshot.slices.clone();
    let moved = |i: usize| {
        let mut eps = original[i].clone();
        eps.endpoints.as_mut().unwrap()[0].addresses = vec![format!("10.244.9.{}", i % 250)];
        eps
    };
    // Fewer than BATCH at once: Service slices.
    let few: Vec<_> = picked[..2].iter().map(|&i| (i, moved(i))).collect();
    let keys: Vec<String> = few.iter().map(|(i, _)| format!("ns1/svc-{i:04}")).collect();
    let changes: Vec<_> = few
        .iter()
        .zip(&keys)
        .map(|((i, eps), key)| (key.as_str(), Some(&snapshot.services[*i]), vec![eps]))
        .collect();
    let out = planner.replan_services(&changes).unwrap();
    assert!(out.slices.iter().all(|c| c.name.contains('.')), "{out:?}");
    for (i, eps) in few {
        snapshot.slices[i] = eps;
    }
    // BATCH more of the same packed slice at once: that packed slice is written instead.
    let many: Vec<_> = picked[2..2 + crate::planner::views::BATCH]
        .iter()
        .map(|&i| (i, moved(i)))
        .collect();
    let keys: Vec<String> = many.iter().map(|(i, _)| format!("ns1/svc-{i:04}")).collect();
    let changes: Vec<_> = many
        .iter()
        .zip(&keys)
        .map(|((i, eps), key)| (key.as_str(), Some(&snapshot.services[*i]), vec![eps]))
        .collect();
    let out = planner.replan_services(&changes).unwrap();
    let names: Vec<&str> = out.slices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [name.as_str()], "one write for the batch");
    assert_eq!(planner.service_slice_count(), 2, "the earlier two keep theirs");
    for (i, eps) in many {
        snapshot.slices[i] = eps;
    }
    assert_same_as_rebuild(&planner, &snapshot, &config);
}
