//! Service → entry semantics (kube-proxy `newBaseServiceInfo` and the EndpointSlice join).

use switchyard_api::{IpFamily, Protocol, TrafficPolicy};

use super::{config, entry_of, ips, plan, spec_of};
use crate::planner::{
    SkipReason, Snapshot,
    fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, slice_named, snapshot, three_nodes},
};

#[test]
fn cluster_ip_service_with_named_target_port_joins_slice_ports_by_name() {
    // The Service says targetPort "http"; the slice carries the resolved number per pod.
    let svc = service("ns1", "web", "10.96.0.10", |s| {
        s.port("http", 80, "TCP").port("metrics", 9090, "TCP");
    });
    let eps = slice(
        "ns1",
        "web",
        &[("http", 8080, "TCP"), ("metrics", 9100, "TCP")],
        vec![endpoint("10.244.1.5", "node-a"), endpoint("10.244.2.5", "node-b")],
    );
    let planner = plan(&snapshot(vec![svc], vec![eps]));
    let http = entry_of(&planner, "node-c", "ns1/web:http");
    assert_eq!((http.port, http.cluster_ip.as_str()), (80, "10.96.0.10"));
    assert_eq!(
        http.endpoints.iter().map(|e| e.port).collect::<Vec<_>>(),
        vec![8080, 8080]
    );
    let metrics = entry_of(&planner, "node-c", "ns1/web:metrics");
    assert_eq!(
        metrics.endpoints.iter().map(|e| e.port).collect::<Vec<_>>(),
        vec![9100, 9100]
    );
    assert!(http.has_endpoints);
    // on node-a the endpoint is flagged as on-node; elsewhere not.
    let on_a = entry_of(&planner, "node-a", "ns1/web:http");
    assert_eq!(ips(&on_a, |e| e.on_node), vec!["10.244.1.5"]);
    assert!(ips(&http, |e| e.on_node).is_empty());
}

#[test]
fn protocols_are_independent_service_ports() {
    let svc = service("ns1", "dns", "10.96.0.53", |s| {
        s.port("dns", 53, "UDP")
            .port("dns-tcp", 53, "TCP")
            .port("sctp", 9999, "SCTP");
    });
    let eps = slice(
        "ns1",
        "dns",
        &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP"), ("sctp", 9999, "SCTP")],
        vec![endpoint("10.244.1.53", "node-a")],
    );
    let spec = spec_of(&plan(&snapshot(vec![svc], vec![eps])), "node-b");
    let protocols: Vec<Protocol> = spec.services.iter().map(|s| s.protocol).collect();
    assert_eq!(protocols.len(), 3);
    for p in [Protocol::TCP, Protocol::UDP, Protocol::SCTP] {
        assert!(protocols.contains(&p));
    }
    assert!(spec.services.iter().all(|s| s.has_endpoints));
}

#[test]
fn a_port_without_a_matching_slice_port_has_no_endpoints() {
    let svc = service("ns1", "web", "10.96.0.10", |s| {
        s.port("http", 80, "TCP");
    });
    // Slice port name differs, and a same-named port with another protocol does not match either.
    let eps = slice(
        "ns1",
        "web",
        &[("https", 8443, "TCP"), ("http", 8080, "UDP")],
        vec![endpoint("10.244.1.5", "node-a")],
    );
    let entry = entry_of(&plan(&snapshot(vec![svc], vec![eps])), "node-a", "ns1/web:http");
    assert!(!entry.has_endpoints);
    assert!(entry.endpoints.is_empty());
}

#[test]
fn dual_stack_services_get_one_entry_per_family_with_family_filtered_frontends() {
    let svc = service("ns1", "dual", "10.96.0.20", |s| {
        s.spec_mut().cluster_ips = Some(vec!["10.96.0.20".into(), "fd00:10:96::20".into()]);
        s.spec_mut().external_ips = Some(vec!["203.0.113.5".into(), "2001:db8:113::5".into()]);
        s.spec_mut().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into(), "::/0".into()]);
        s.type_("LoadBalancer")
            .node_port("http", 80, 30020)
            .lb_ingress("203.0.113.6", None)
            .lb_ingress("2001:db8:113::6", None);
    });
    let v4 = slice_named(
        "ns1",
        "dual",
        "dual-v4",
        "IPv4",
        &[("http", 8080, "TCP")],
        vec![endpoint("10.244.1.5", "node-a")],
    );
    let v6 = slice_named("ns1", "dual", "dual-v6", "IPv6", &[("http", 8080, "TCP")], vec![]);
    let spec = spec_of(&plan(&snapshot(vec![svc], vec![v4, v6])), "node-b");
    assert_eq!(spec.services.len(), 2);
    let (a, b) = (&spec.services[0], &spec.services[1]);
    assert_eq!((a.family, a.cluster_ip.as_str()), (IpFamily::IPv4, "10.96.0.20"));
    assert_eq!(
        (b.family, b.cluster_ip.as_str()),
        (IpFamily::IPv6, "fd00:10:96::20")
    );
    assert_eq!(a.external_ips, vec!["203.0.113.5"]);
    assert_eq!(b.external_ips, vec!["2001:db8:113::5"]);
    assert_eq!(a.load_balancer_ips, vec!["203.0.113.6"]);
    assert_eq!(a.source_ranges, vec!["198.51.100.0/24"]);
    assert!(b.source_ranges.is_empty(), "::/0 disables filtering for IPv6");
    // "Has endpoints" is decided per family: IPv6 has none, so it REJECTs while IPv4 forwards.
    assert!(a.has_endpoints);
    assert!(!b.has_endpoints);
}

#[test]
fn load_balancer_ingress_in_proxy_mode_or_hostname_only_gets_no_vip() {
    let svc = service("ns1", "lb", "10.96.0.30", |s| {
        s.type_("LoadBalancer")
            .node_port("", 80, 30030)
            .lb_ingress("203.0.113.7", Some("Proxy"))
            .lb_ingress("203.0.113.8", Some("VIP"));
        let lb = s.status.as_mut().unwrap().load_balancer.as_mut().unwrap();
        lb.ingress
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::core::v1::LoadBalancerIngress {
                hostname: Some("lb.example.com".into()),
                ..Default::default()
            });
    });
    let entry = entry_of(&plan(&snapshot(vec![svc], vec![])), "node-a", "ns1/lb");
    assert_eq!(entry.load_balancer_ips, vec!["203.0.113.8"]);
}

#[test]
fn any_zero_source_range_disables_filtering() {
    let svc = service("ns1", "lb", "10.96.0.30", |s| {
        s.spec_mut().load_balancer_source_ranges = Some(vec![" 198.51.100.0/24 ".into(), "0.0.0.0/0".into()]);
        s.type_("LoadBalancer")
            .node_port("", 80, 30030)
            .lb_ingress("203.0.113.8", None);
    });
    let entry = entry_of(&plan(&snapshot(vec![svc], vec![])), "node-a", "ns1/lb");
    assert!(entry.source_ranges.is_empty());
}

#[test]
fn session_affinity_timeout_defaults_to_three_hours() {
    let with_default = service("ns1", "a", "10.96.0.1", |s| {
        s.port("", 80, "TCP").affinity(None);
    });
    let with_value = service("ns1", "b", "10.96.0.2", |s| {
        s.port("", 80, "TCP").affinity(Some(60));
    });
    let planner = plan(&snapshot(vec![with_default, with_value], vec![]));
    assert_eq!(
        entry_of(&planner, "node-a", "ns1/a").affinity_timeout_seconds,
        Some(10800)
    );
    assert_eq!(
        entry_of(&planner, "node-a", "ns1/b").affinity_timeout_seconds,
        Some(60)
    );
}

#[test]
fn external_traffic_policy_counts_only_for_externally_accessible_services() {
    let cases = [
        ("ClusterIP", false, TrafficPolicy::Cluster),
        ("ClusterIP", true, TrafficPolicy::Local),
        ("NodePort", false, TrafficPolicy::Local),
        ("LoadBalancer", false, TrafficPolicy::Local),
    ];
    for (service_type, external_ip, want) in cases {
        let svc = service("ns1", "s", "10.96.0.40", |s| {
            s.type_(service_type).spec_mut().external_traffic_policy = Some("Local".into());
            if service_type == "ClusterIP" {
                s.port("", 80, "TCP");
            } else {
                s.node_port("", 80, 30040);
            }
            if external_ip {
                s.spec_mut().external_ips = Some(vec!["203.0.113.40".into()]);
            }
        });
        let entry = entry_of(&plan(&snapshot(vec![svc], vec![])), "node-a", "ns1/s");
        assert_eq!(
            entry.external_policy, want,
            "{service_type} externalIP={external_ip}"
        );
    }
}

#[test]
fn health_check_node_port_only_for_local_load_balancers() {
    let mk = |service_type: &str, policy: &str| {
        service("ns1", "s", "10.96.0.41", |s| {
            s.type_(service_type).node_port("", 80, 30041);
            s.spec_mut().external_traffic_policy = Some(policy.into());
            s.spec_mut().health_check_node_port = Some(32041);
        })
    };
    let cases = [
        ("LoadBalancer", "Local", Some(32041)),
        ("LoadBalancer", "Cluster", None),
        ("NodePort", "Local", None),
    ];
    for (t, p, want) in cases {
        let entry = entry_of(&plan(&snapshot(vec![mk(t, p)], vec![])), "node-a", "ns1/s");
        assert_eq!(entry.health_check_node_port, want, "{t} {p}");
    }
}

#[test]
fn services_skipped_by_design_are_noted_not_warned() {
    let headless = service("ns1", "headless", "None", |s| {
        s.port("", 80, "TCP");
    });
    let external_name = service("ns1", "ext", "", |s| {
        s.type_("ExternalName");
    });
    let other_proxy = service("ns1", "other", "10.96.0.50", |s| {
        s.port("", 80, "TCP")
            .label("service.kubernetes.io/service-proxy-name", "kube-router");
    });
    let ours = service("ns1", "ours", "10.96.0.51", |s| {
        s.port("", 80, "TCP")
            .label("service.kubernetes.io/service-proxy-name", "switchyard");
    });
    let planner = plan(&snapshot(
        vec![headless, external_name, other_proxy, ours],
        vec![],
    ));
    let names: Vec<String> = spec_of(&planner, "node-a")
        .services
        .into_iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, vec!["ns1/ours"]);
    let diag = planner.diagnostics();
    assert!(diag.warnings.is_empty(), "{:?}", diag.warnings);
    assert_eq!(
        diag.skipped,
        vec![
            ("ns1/ext".to_string(), SkipReason::ExternalName),
            ("ns1/headless".to_string(), SkipReason::Headless),
            ("ns1/other".to_string(), SkipReason::OtherProxy),
        ]
    );
}

#[test]
fn leading_zero_ips_are_normalised() {
    let svc = service("ns1", "old", "010.096.000.001", |s| {
        s.port("", 80, "TCP");
        s.spec_mut().cluster_ips = None;
        s.spec_mut().external_ips = Some(vec!["203.0.113.010".into()]);
    });
    let eps = slice(
        "ns1",
        "old",
        &[("", 80, "TCP")],
        vec![endpoint("010.244.001.005", "node-a")],
    );
    let entry = entry_of(&plan(&snapshot(vec![svc], vec![eps])), "node-a", "ns1/old");
    assert_eq!(entry.cluster_ip, "10.96.0.1");
    assert_eq!(entry.external_ips, vec!["203.0.113.10"]);
    assert_eq!(entry.endpoints[0].ip, "10.244.1.5");
}

#[test]
fn overlapping_slices_prefer_the_non_terminating_copy() {
    let svc = service("ns1", "web", "10.96.0.10", |s| {
        s.port("", 80, "TCP");
    });
    let old = slice_named(
        "ns1",
        "web",
        "web-a",
        "IPv4",
        &[("", 80, "TCP")],
        vec![endpoint("10.244.1.5", "node-a").conditions(false, true, true)],
    );
    let new = slice_named(
        "ns1",
        "web",
        "web-b",
        "IPv4",
        &[("", 80, "TCP")],
        vec![endpoint("10.244.1.5", "node-a")],
    );
    for slices in [vec![old.clone(), new.clone()], vec![new, old]] {
        let entry = entry_of(&plan(&snapshot(vec![svc.clone()], slices)), "node-b", "ns1/web");
        assert_eq!(entry.endpoints.len(), 1);
        assert!(!entry.endpoints[0].terminating);
        assert!(entry.endpoints[0].cluster);
    }
}

#[test]
fn local_policies_differ_per_node() {
    let svc = service("ns1", "dns", "10.96.0.53", |s| {
        s.port("", 53, "UDP").spec_mut().internal_traffic_policy = Some("Local".into());
    });
    let eps = slice(
        "ns1",
        "dns",
        &[("", 53, "UDP")],
        vec![endpoint("10.244.1.53", "node-a")],
    );
    let planner = plan(&snapshot(vec![svc], vec![eps]));
    let a = entry_of(&planner, "node-a", "ns1/dns");
    assert_eq!(ips(&a, |e| e.local), vec!["10.244.1.53"]);
    let b = entry_of(&planner, "node-b", "ns1/dns");
    assert!(ips(&b, |e| e.local).is_empty());
    assert!(
        b.has_endpoints,
        "the service has endpoints, just none here: DROP, not REJECT"
    );
}

#[test]
fn cluster_settings_follow_the_config_and_detector_mode() {
    let mut cfg = config();
    let planner = crate::planner::Planner::build(&snapshot(vec![], vec![]), &cfg).unwrap();
    assert_eq!(
        spec_of(&planner, "node-b").cluster.local_traffic_cidrs,
        vec!["10.244.0.0/16"]
    );
    cfg.detect_local_mode = switchyard_api::DetectLocalMode::NodeCIDR;
    let planner = crate::planner::Planner::build(&snapshot(vec![], vec![]), &cfg).unwrap();
    let spec = spec_of(&planner, "node-b");
    assert_eq!(spec.cluster.local_traffic_cidrs, vec!["10.244.2.0/24"]);
    assert_eq!(spec.node_ips, vec!["192.168.10.12"]);
    assert_eq!(spec.zone.as_deref(), Some("zone-a"));
}

#[test]
fn backend_node_label_overrides_the_default() {
    let mut nodes = three_nodes();
    nodes[1]
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("switchyard.io/backend".into(), "ipvs".into());
    let planner = plan(&Snapshot {
        services: vec![],
        slices: vec![],
        nodes,
    });
    assert_eq!(
        spec_of(&planner, "node-a").backend,
        switchyard_api::Backend::Iptables
    );
    let b = spec_of(&planner, "node-b");
    assert_eq!(b.backend, switchyard_api::Backend::Ipvs);
    assert_eq!(b.cluster.ipvs_scheduler.as_deref(), Some("rr"));
}

#[test]
fn ipvs_weights_annotation_weighs_endpoints_by_their_node() {
    let weighted = service("ns1", "a", "10.96.0.1", |s| {
        s.port("", 80, "TCP")
            .annotate("switchyard.io/ipvs-weights", "node-a=3, node-b=1");
    });
    let eps = slice(
        "ns1",
        "a",
        &[("", 8080, "TCP")],
        vec![
            endpoint("10.244.1.5", "node-a"),
            endpoint("10.244.2.5", "node-b"),
            endpoint("10.244.3.5", "node-c"),
        ],
    );
    let planner = plan(&snapshot(vec![weighted], vec![eps]));
    for node in ["node-a", "node-b", "node-c"] {
        let weights: Vec<(String, Option<u16>)> = entry_of(&planner, node, "ns1/a")
            .endpoints
            .iter()
            .map(|e| (e.ip.clone(), e.weight))
            .collect();
        assert_eq!(
            weights,
            [
                ("10.244.1.5".to_string(), Some(3)),
                ("10.244.2.5".to_string(), None),
                ("10.244.3.5".to_string(), None),
            ],
            "the same weights on every node ({node})"
        );
    }
    assert!(planner.diagnostics().warnings.is_empty());
}

#[test]
fn invalid_ipvs_weights_warn_and_weigh_every_endpoint_1() {
    for bad in [
        "node-a=0",
        "node-a=70000",
        "node-a",
        "node-a=2,node-a=3",
        "=2",
        "node-a=x",
    ] {
        let svc = service("ns1", "a", "10.96.0.1", |s| {
            s.port("", 80, "TCP").annotate("switchyard.io/ipvs-weights", bad);
        });
        let eps = slice(
            "ns1",
            "a",
            &[("", 8080, "TCP")],
            vec![endpoint("10.244.1.5", "node-a")],
        );
        let planner = plan(&snapshot(vec![svc], vec![eps]));
        assert_eq!(
            entry_of(&planner, "node-a", "ns1/a").endpoints[0].weight,
            None,
            "{bad}"
        );
        let warnings = &planner.diagnostics().warnings;
        assert_eq!(warnings.len(), 1, "{bad}: {warnings:?}");
        assert!(
            warnings[0].reason.contains("switchyard.io/ipvs-weights"),
            "{bad}: {warnings:?}"
        );
    }
}

#[test]
fn ipvs_scheduler_annotation_is_carried_and_validated() {
    let good = service("ns1", "a", "10.96.0.1", |s| {
        s.port("", 80, "TCP")
            .annotate("switchyard.io/ipvs-scheduler", "sh");
    });
    let bad = service("ns1", "b", "10.96.0.2", |s| {
        s.port("", 80, "TCP")
            .annotate("switchyard.io/ipvs-scheduler", "fastest");
    });
    let planner = plan(&snapshot(vec![good, bad], vec![]));
    assert_eq!(
        entry_of(&planner, "node-a", "ns1/a").scheduler.as_deref(),
        Some("sh")
    );
    assert_eq!(entry_of(&planner, "node-a", "ns1/b").scheduler, None);
    assert!(
        planner
            .diagnostics()
            .warnings
            .iter()
            .any(|w| w.object == "ns1/b" && w.reason.contains("fastest"))
    );
}

#[test]
fn endpoints_neither_ready_nor_serving_are_listed_as_unready_addresses_only() {
    let svc = service("ns1", "web", "10.96.0.2", |s| {
        s.port("", 80, "TCP");
    });
    let eps = slice(
        "ns1",
        "web",
        &[("", 80, "TCP")],
        vec![
            endpoint("10.244.1.9", "node-a"),
            // Serving while it terminates: an endpoint (a fallback), not an unready address.
            endpoint("10.244.1.10", "node-a").conditions(false, true, true),
            // Terminating past serving, and starting: unready.
            endpoint("10.244.2.7", "node-b").conditions(false, false, true),
            endpoint("10.244.3.7", "node-c").conditions(false, false, false),
        ],
    );
    // A second slice lists one unready address again and the ready one as unready: once each, and
    // an address that is an endpoint is not also unready.
    let overlap = slice_named(
        "ns1",
        "web",
        "web-2",
        "IPv4",
        &[("", 80, "TCP")],
        vec![
            endpoint("10.244.2.7", "node-b").conditions(false, false, true),
            endpoint("10.244.1.9", "node-a").conditions(false, false, false),
        ],
    );
    let planner = plan(&snapshot(vec![svc], vec![eps, overlap]));
    for node in ["node-a", "node-b", "node-c"] {
        let entry = entry_of(&planner, node, "ns1/web");
        assert_eq!(ips(&entry, |_| true), vec!["10.244.1.9", "10.244.1.10"], "{node}");
        assert_eq!(entry.unready_ips, vec!["10.244.2.7", "10.244.3.7"], "{node}");
        assert!(!entry.keep_connections);
    }
}

#[test]
fn keep_connections_annotation_is_carried_and_validated() {
    let cases = [
        (Some("true"), true, false),
        (Some("false"), false, false),
        (None, false, false),
        (Some("yes"), false, true),
    ];
    for (value, keep, warned) in cases {
        let svc = service("ns1", "a", "10.96.0.1", |s| {
            s.port("", 80, "TCP");
            if let Some(value) = value {
                s.annotate("switchyard.io/keep-connections", value);
            }
        });
        let planner = plan(&snapshot(vec![svc], vec![]));
        assert_eq!(
            entry_of(&planner, "node-a", "ns1/a").keep_connections,
            keep,
            "{value:?}"
        );
        let warnings = &planner.diagnostics().warnings;
        assert_eq!(
            warnings
                .iter()
                .any(|w| w.reason.contains("switchyard.io/keep-connections")),
            warned,
            "{value:?}: {warnings:?}"
        );
    }
}

#[test]
fn a_leaving_node_says_so_in_its_plan_header_and_only_its_own() {
    use k8s_openapi::api::core::v1::Taint;
    let svc = service("ns1", "web", "10.96.0.10", |s| {
        s.port("http", 80, "TCP");
    });
    let eps = slice(
        "ns1",
        "web",
        &[("http", 8080, "TCP")],
        vec![endpoint("10.244.1.5", "node-a")],
    );
    let mut snap = snapshot(vec![svc], vec![eps]);
    let serving = plan(&snap);
    snap.nodes[1].spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
        key: "ToBeDeletedByClusterAutoscaler".into(),
        value: Some("1798761600".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }]);
    let tainted = plan(&snap);
    let leaving = tainted
        .node_plan("node-b")
        .unwrap()
        .leaving
        .expect("node-b leaves");
    assert_eq!(leaving.reason, "taint:ToBeDeletedByClusterAutoscaler");
    assert_eq!(leaving.drain_grace_seconds, 600);
    assert_ne!(
        tainted.node_plan("node-b").unwrap().revision,
        serving.node_plan("node-b").unwrap().revision,
        "the plan is rewritten"
    );
    for other in ["node-a", "node-c"] {
        let plan = tainted.node_plan(other).unwrap();
        assert!(plan.leaving.is_none(), "{other}");
        assert_eq!(
            plan.revision,
            serving.node_plan(other).unwrap().revision,
            "{other} unchanged"
        );
    }
    // The forwarding itself is the same: a leaving node still forwards what reaches it.
    assert_eq!(
        entry_of(&tainted, "node-b", "ns1/web:http"),
        entry_of(&serving, "node-b", "ns1/web:http")
    );
}
