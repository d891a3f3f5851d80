//! The real `nft` in throwaway network namespaces (root): rendered tables load, the read-back parses
//! back into the model exactly, partial transactions apply, the netlink look agrees, the agent's CLI
//! renders, applies and cleans up.

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_agent::backend::HostFacts;
use switchyard_agent::nftables::dataplane::NftablesDataplane;
use switchyard_agent::nftables::diff::diff;
use switchyard_agent::nftables::exec::ExecNft;
use switchyard_agent::nftables::kernel::{Nft, summary_differences};
use switchyard_agent::nftables::render;
use switchyard_agent::probe::FixedAddrs;
use switchyard_agent::sync::{Dataplane, SyncRequest};
use switchyard_api::testing::finish;
use switchyard_api::{Backend, IpFamily, SyncMode};

use crate::fixtures::everything;
use crate::lab::{Netns, lab_allowed};

/// Runs `work` on a thread that has entered `netns` (so `nft` and netlink act there).
fn inside<T: Send + 'static>(netns: &Netns, work: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{}", netns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        work()
    })
    .join()
    .unwrap()
}

#[test]
fn rendered_tables_load_and_read_back_into_the_same_model() {
    if !lab_allowed("rendered_tables_load_and_read_back_into_the_same_model") {
        return;
    }
    let netns = Netns::new("nft-roundtrip");
    inside(&netns, || {
        let mut nft = ExecNft::detect().unwrap();
        let spec = everything();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let desired = render(&spec, &HostFacts::default(), family, &HashSet::new());
            assert!(nft.read(family).unwrap().is_none());
            nft.apply(&diff(None, &desired)).unwrap();
            let back = nft.read(family).unwrap().unwrap();
            let again = diff(Some(&back), &desired);
            assert!(
                again.is_empty(),
                "{family:?}: the read-back differs:\n{}",
                again.text()
            );
            let summary = nft.summary(family).unwrap().unwrap();
            let differences = summary_differences(&desired, &summary);
            assert!(differences.is_empty(), "{family:?}: {differences:?}");
        }
    });
}

#[test]
fn the_dataplane_syncs_partially_restarts_without_changes_and_cleans_up() {
    if !lab_allowed("the_dataplane_syncs_partially_restarts_without_changes_and_cleans_up") {
        return;
    }
    let netns = Netns::new("nft-dataplane");
    inside(&netns, || {
        let new = || NftablesDataplane::new(ExecNft::detect().unwrap(), FixedAddrs::default());
        let mut spec = everything();
        spec.backend = Backend::Nftables;
        let skip = HashSet::new();
        let mut dataplane = new();
        let sync = |dataplane: &mut NftablesDataplane<ExecNft, FixedAddrs>,
                    spec: &switchyard_api::NodeForwardingPlanSpec,
                    full| {
            let spec = Arc::new(spec.clone());
            dataplane
                .sync(SyncRequest {
                    spec: &spec,
                    skip: &skip,
                    full,
                })
                .unwrap()
        };
        let first = sync(&mut dataplane, &spec, true);
        assert_eq!(first.mode, SyncMode::Full);
        assert!(first.rules > 50, "{first:?}");

        // One endpoint replaced, one service added with affinity, one removed: a partial transaction.
        std::sync::Arc::make_mut(&mut spec.services[0]).endpoints[0].ip = "10.244.2.250".into();
        let mut added = switchyard_api::ServicePlan::clone(&spec.services[2]);
        added.name = "ns3/lb2:p80".into();
        added.cluster_ip = "10.96.0.99".into();
        added.load_balancer_ips = vec!["203.0.113.99".into()];
        added.node_port = Some(30099);
        spec.services.push(added.into());
        spec.services.retain(|s| s.name != "ns8/none:p80");
        finish(&mut spec);
        let partial = sync(&mut dataplane, &spec, false);
        assert_eq!(partial.mode, SyncMode::Partial);
        assert_eq!(dataplane.check_drift().unwrap(), None);

        // Classes come and go in partial syncs: the only 3-endpoint service gets a fourth endpoint.
        let multi = spec
            .services
            .iter()
            .position(|e| e.name == "ns1/multi:p80" && e.family == IpFamily::IPv4)
            .unwrap();
        let mut extra = spec.services[multi].endpoints[1].clone();
        extra.ip = "10.244.2.44".into();
        std::sync::Arc::make_mut(&mut spec.services[multi])
            .endpoints
            .push(extra);
        finish(&mut spec);
        assert_eq!(sync(&mut dataplane, &spec, false).mode, SyncMode::Partial);
        assert_eq!(dataplane.check_drift().unwrap(), None);
        let sets = dataplane.nft_mut().read(IpFamily::IPv4).unwrap().unwrap().sets;
        assert!(
            sets.contains_key("fast-4-eps") && !sets.contains_key("fast-3-eps"),
            "{:?}",
            sets.keys()
        );

        // A restarted agent reads the table back and changes nothing.
        let mut restarted = new();
        let before = restarted.nft_mut().read(IpFamily::IPv4).unwrap().unwrap();
        let again = sync(&mut restarted, &spec, true);
        assert_eq!((again.mode, again.written), (SyncMode::Full, 0), "{again:?}");
        assert_eq!(restarted.nft_mut().read(IpFamily::IPv4).unwrap().unwrap(), before);

        // Drift: a flushed chain is seen by the cheap check and repaired by a full sync.
        let out = std::process::Command::new("nft")
            .args(["flush", "chain", "ip", "switchyard", "services"])
            .status()
            .unwrap();
        assert!(out.success());
        let drift = restarted.check_drift().unwrap().expect("drift");
        assert!(drift.to_string().contains("services"), "{drift}");
        sync(&mut restarted, &spec, true);
        assert_eq!(restarted.check_drift().unwrap(), None);
        // A class's DNAT chain can only be rewritten with its map: the repair recreates the table.
        let out = std::process::Command::new("nft")
            .args(["flush", "chain", "ip", "switchyard", "fast-2-dnat"])
            .status()
            .unwrap();
        assert!(out.success());
        assert!(restarted.check_drift().unwrap().is_some());
        sync(&mut restarted, &spec, true);
        assert_eq!(restarted.check_drift().unwrap(), None);

        let cleanup = restarted.cleanup().unwrap();
        assert!(cleanup.objects > 20, "{cleanup:?}");
        assert!(restarted.nft_mut().read(IpFamily::IPv4).unwrap().is_none());
        assert!(restarted.nft_mut().read(IpFamily::IPv6).unwrap().is_none());
    });
}

#[test]
fn the_cli_renders_applies_and_cleans_up_with_nftables() {
    if !lab_allowed("the_cli_renders_applies_and_cleans_up_with_nftables") {
        return;
    }
    let netns = Netns::new("nft-cli");
    let mut spec = everything();
    spec.backend = Backend::Nftables;
    finish(&mut spec);
    let plan = netns.path("plan.json");
    let object = switchyard_api::NodeForwardingPlan::new("node-a", spec);
    std::fs::write(&plan, serde_json::to_vec(&object).unwrap()).unwrap();
    let plan = plan.display().to_string();

    // `render` prints what `nft -f` accepts, and touches nothing.
    let render = netns.agent(&["render", "--plan", &plan, "--backend", "nftables"]);
    assert!(
        render.status.success(),
        "{}",
        String::from_utf8_lossy(&render.stderr)
    );
    let text = String::from_utf8_lossy(&render.stdout).into_owned();
    assert!(
        text.contains("# === IPv4: nft -f -") && text.contains("# === IPv6: nft -f -"),
        "{text}"
    );
    assert!(netns.sh("nft list tables").is_empty());
    std::fs::write(netns.path("render.nft"), &text).unwrap();
    netns.sh(&format!("nft -c -f {}", netns.path("render.nft").display()));

    // `apply` picks nftables from the plan and reports it.
    let apply = netns.agent(&["apply", "--plan", &plan]);
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    let status = String::from_utf8_lossy(&apply.stdout).into_owned();
    assert!(status.contains("backend: nftables"), "{status}");
    let tables = netns.sh("nft list tables");
    assert!(
        tables.contains("table ip switchyard") && tables.contains("table ip6 switchyard"),
        "{tables}"
    );
    assert!(
        !netns.save().contains("SWYD-"),
        "no iptables rules for an nftables plan"
    );

    let cleanup = netns.agent(&["cleanup"]);
    assert!(
        cleanup.status.success(),
        "{}",
        String::from_utf8_lossy(&cleanup.stderr)
    );
    assert!(netns.sh("nft list tables").is_empty());
}

#[test]
fn element_changes_go_over_netlink_and_read_back_exactly() {
    if !lab_allowed("element_changes_go_over_netlink_and_read_back_exactly") {
        return;
    }
    let netns = Netns::new("nft-batch");
    inside(&netns, || {
        use switchyard_agent::nftables::transaction::Op;
        let mut nft = ExecNft::detect().unwrap();
        let before = everything();
        let family = IpFamily::IPv4;
        nft.apply(&diff(
            None,
            &render(&before, &HostFacts::default(), family, &HashSet::new()),
        ))
        .unwrap();
        // Changes that touch only elements, of every key and value layout.
        let mut after = before.clone();
        let find = |spec: &mut switchyard_api::NodeForwardingPlanSpec, name: &str| {
            spec.services
                .iter()
                .position(|e| e.name == name && e.family == family)
                .unwrap()
        };
        let multi = find(&mut after, "ns1/multi:p80");
        std::sync::Arc::make_mut(&mut after.services[multi]).endpoints[0].ip = "10.244.1.66".into(); // fast-3-eps, hairpin
        let nodeport = find(&mut after, "ns2/nodeport:p80");
        std::sync::Arc::make_mut(&mut after.services[nodeport]).endpoints[1].ip = "10.244.3.66".into(); // fast-2-eps, fast-np-2-eps
        std::sync::Arc::make_mut(&mut after.services[nodeport]).node_port = Some(30066); // fast-np-2
        std::sync::Arc::make_mut(&mut after.services[nodeport])
            .external_ips
            .push("203.0.113.66".into()); // fast-masq
        let none = find(&mut after, "ns8/none:p80");
        std::sync::Arc::make_mut(&mut after.services[none]).node_port = Some(30067); // no-endpoint-nodeports (goto reject-chain)
        let nolocal = find(&mut after, "ns5/nolocal:p80");
        std::sync::Arc::make_mut(&mut after.services[nolocal])
            .external_ips
            .push("203.0.113.67".into()); // service-ips goto, no-endpoint drop
        let mut copy = switchyard_api::ServicePlan::clone(&after.services[multi]);
        copy.name = "ns1/copy:p80".into();
        copy.cluster_ip = "10.96.0.66".into(); // cluster-ips, fast-3
        after.services.push(copy.into());
        finish(&mut after);
        let desired = render(&after, &HostFacts::default(), family, &HashSet::new());
        let read = nft.read(family).unwrap().unwrap();
        let transaction = diff(Some(&read), &desired);
        assert!(
            transaction
                .ops
                .iter()
                .all(|op| matches!(op, Op::AddElements { .. } | Op::DeleteElements { .. })),
            "{}",
            transaction.text()
        );
        assert!(transaction.element_changes() > 10, "{}", transaction.text());
        nft.apply(&transaction).unwrap();
        let back = nft.read(family).unwrap().unwrap();
        let again = diff(Some(&back), &desired);
        assert!(
            again.is_empty(),
            "the netlink batch wrote something else:\n{}",
            again.text()
        );

        // A refused batch changes nothing: deleting an element that is not there.
        let previous = render(&before, &HostFacts::default(), family, &HashSet::new());
        let mut bad = diff(Some(&back), &previous);
        bad.ops.push(Op::DeleteElements {
            set: "cluster-ips".into(),
            keys: vec![switchyard_agent::nftables::Key::Addr(
                "10.96.9.9".parse().unwrap(),
            )],
        });
        let err = nft.apply(&bad).unwrap_err().to_string();
        assert!(
            err.contains("netlink batch refused") && err.contains("No such file"),
            "{err}"
        );
        assert!(diff(Some(&nft.read(family).unwrap().unwrap()), &desired).is_empty());
    });
}

/// The counted sets' elements come back over netlink with their counters, decoded into the keys the
/// render wrote, and named after the plan's Services.
#[test]
fn element_counters_read_back_over_netlink_and_name_their_services() {
    if !lab_allowed("element_counters_read_back_over_netlink_and_name_their_services") {
        return;
    }
    let netns = Netns::new("nft-counters");
    inside(&netns, || {
        use switchyard_agent::counters::What;
        use switchyard_agent::nftables::counters::samples;
        use switchyard_agent::nftables::netlink::NftNetlink;
        let mut nft = ExecNft::detect().unwrap();
        let spec = everything();
        let desired = render(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
        nft.apply(&diff(None, &desired)).unwrap();
        let raw = NftNetlink::open().unwrap().counters(IpFamily::IPv4).unwrap();
        let counted: usize = desired
            .elements
            .iter()
            .filter(|(id, _)| id.counted())
            .map(|(_, elements)| elements.len())
            .sum();
        assert_eq!(raw.elements.len(), counted, "{raw:?}");
        assert!(raw.elements.iter().all(|(.., packets)| *packets == 0));
        let named = samples(&raw, &spec, &HashSet::new(), IpFamily::IPv4);
        assert!(
            named.iter().any(|s| matches!(s.what, What::Endpoint(_))),
            "{named:?}"
        );
        assert!(
            named.iter().any(|s| matches!(s.what, What::Frontend(_))),
            "{named:?}"
        );
        assert!(
            named.iter().any(|s| matches!(s.what, What::Refused(_))),
            "{named:?}"
        );
        assert!(!raw.firewall_rules.is_empty(), "{raw:?}");
    });
}
