//! Bad input: every object the planner cannot use is skipped with one warning naming it and the reason,
//! and everything else is still planned.

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{entry_of, plan, spec_of};
use crate::{
    config::Config,
    planner::{
        Planner, Snapshot,
        fixtures::{EndpointExt, ServiceExt, endpoint, node, service, slice, slice_named, snapshot},
    },
};

/// The Service that must survive every bad neighbour.
fn good() -> (Service, EndpointSlice) {
    let svc = service("ns1", "good", "10.96.0.1", |s| {
        s.port("http", 80, "TCP");
    });
    let eps = slice(
        "ns1",
        "good",
        &[("http", 8080, "TCP")],
        vec![endpoint("10.244.1.5", "node-a")],
    );
    (svc, eps)
}

struct Case {
    name: &'static str,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    /// (kind, object, part of the reason)
    warning: (&'static str, &'static str, &'static str),
    /// Entries of the bad Service that must still be planned (after dropping the bad part).
    planned: &'static [&'static str],
}

#[test]
fn bad_objects_are_skipped_with_one_warning_each() {
    let web = |mutate: fn(&mut Service)| service("ns1", "bad", "10.96.0.2", mutate);
    let web_slice = |endpoints| slice("ns1", "bad", &[("", 80, "TCP")], endpoints);
    let cases = vec![
        Case {
            name: "unparseable clusterIP",
            services: vec![service("ns1", "bad", "10.96.0.300", |s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![],
            warning: (
                "Service",
                "ns1/bad",
                "clusterIP \"10.96.0.300\" is not an IP address; service skipped",
            ),
            planned: &[],
        },
        Case {
            name: "unparseable clusterIP, with slices (one warning, not two)",
            services: vec![service("ns1", "bad", "10.96.0.300", |s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![web_slice(vec![endpoint("10.244.1.9", "node-a")])],
            warning: (
                "Service",
                "ns1/bad",
                "clusterIP \"10.96.0.300\" is not an IP address; service skipped",
            ),
            planned: &[],
        },
        Case {
            name: "unknown service port protocol",
            services: vec![web(|s| {
                s.port("a", 80, "ICMP").port("b", 81, "TCP");
            })],
            slices: vec![],
            warning: ("Service", "ns1/bad", "unknown protocol \"ICMP\"; port skipped"),
            planned: &["ns1/bad:b"],
        },
        Case {
            name: "nodePort out of range",
            services: vec![web(|s| {
                s.type_("NodePort")
                    .node_port("a", 80, 70000)
                    .node_port("b", 81, 30081);
            })],
            slices: vec![],
            warning: (
                "Service",
                "ns1/bad",
                "nodePort 70000 is outside 1-65535; port skipped",
            ),
            planned: &["ns1/bad:b"],
        },
        Case {
            name: "service port out of range",
            services: vec![web(|s| {
                s.port("a", 0, "TCP").port("b", 81, "TCP");
            })],
            slices: vec![],
            warning: ("Service", "ns1/bad", "port 0 is not 1-65535; port skipped"),
            planned: &["ns1/bad:b"],
        },
        Case {
            name: "duplicate service port",
            services: vec![web(|s| {
                s.port("a", 80, "TCP").port("a", 81, "TCP");
            })],
            slices: vec![],
            warning: ("Service", "ns1/bad", "duplicate port \"a\"/TCP; port skipped"),
            planned: &["ns1/bad:a"],
        },
        Case {
            name: "bad externalIP",
            services: vec![web(|s| {
                s.port("", 80, "TCP").spec_mut().external_ips =
                    Some(vec!["nope".into(), "203.0.113.9".into()]);
            })],
            slices: vec![],
            warning: ("Service", "ns1/bad", "externalIP \"nope\" is not valid; ignored"),
            planned: &["ns1/bad"],
        },
        Case {
            name: "bad source range",
            services: vec![web(|s| {
                s.type_("LoadBalancer")
                    .node_port("", 80, 30080)
                    .lb_ingress("203.0.113.9", None);
                s.spec_mut().load_balancer_source_ranges = Some(vec!["10.0.0.0/40".into()]);
            })],
            slices: vec![],
            warning: (
                "Service",
                "ns1/bad",
                "loadBalancerSourceRange \"10.0.0.0/40\" is not valid; ignored",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "slice without its service label",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![{
                let mut sl = web_slice(vec![endpoint("10.244.1.9", "node-a")]);
                sl.metadata.labels = None;
                sl
            }],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "no kubernetes.io/service-name label; slice skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "FQDN slice",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![slice_named(
                "ns1",
                "bad",
                "bad-fqdn",
                "FQDN",
                &[("", 80, "TCP")],
                vec![endpoint("db.example.com", "")],
            )],
            warning: (
                "EndpointSlice",
                "ns1/bad-fqdn",
                "addressType FQDN is not proxied; slice skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "unknown slice port protocol",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![slice(
                "ns1",
                "bad",
                &[("", 80, "QUIC")],
                vec![endpoint("10.244.1.9", "node-a")],
            )],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "unknown protocol \"QUIC\"; port skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "slice port without a number",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![slice(
                "ns1",
                "bad",
                &[("", 0, "TCP")],
                vec![endpoint("10.244.1.9", "node-a")],
            )],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "port 0 is not 1-65535; port skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "duplicate endpoint in a slice",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![web_slice(vec![
                endpoint("10.244.1.9", "node-a"),
                endpoint("10.244.1.9", "node-b"),
            ])],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "duplicate endpoint 10.244.1.9; one copy kept",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "unparseable endpoint address",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![web_slice(vec![
                endpoint("10.244.1", "node-a"),
                endpoint("10.244.1.9", "node-a"),
            ])],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "\"10.244.1\" is not an IP address; endpoint skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "endpoint of the wrong family",
            services: vec![web(|s| {
                s.port("", 80, "TCP");
            })],
            slices: vec![web_slice(vec![endpoint("fd00::9", "node-a")])],
            warning: (
                "EndpointSlice",
                "ns1/bad-abc",
                "fd00::9 is not IPv4 like the slice; endpoint skipped",
            ),
            planned: &["ns1/bad"],
        },
        Case {
            name: "slice for a missing service",
            services: vec![],
            slices: vec![slice(
                "ns1",
                "ghost",
                &[("", 80, "TCP")],
                vec![endpoint("10.244.1.9", "node-a")],
            )],
            warning: (
                "EndpointSlice",
                "ns1/ghost",
                "slices for a Service that is not in the input; ignored",
            ),
            planned: &[],
        },
    ];
    for case in cases {
        let (good_svc, good_slice) = good();
        let mut services = case.services;
        services.push(good_svc);
        let mut slices = case.slices;
        slices.push(good_slice);
        let planner = plan(&snapshot(services, slices));
        let warnings = &planner.diagnostics().warnings;
        let (kind, object, reason) = case.warning;
        let matching: Vec<_> = warnings
            .iter()
            .filter(|w| w.kind == kind && w.object == object && w.reason.contains(reason))
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{}: want one {kind} {object} warning containing {reason:?}, got {warnings:?}",
            case.name
        );
        assert_eq!(
            warnings.len(),
            1,
            "{}: exactly one warning expected, got {warnings:?}",
            case.name
        );
        let good = entry_of(&planner, "node-b", "ns1/good:http");
        assert!(
            good.has_endpoints,
            "{}: the good service lost its endpoints",
            case.name
        );
        let names: Vec<String> = spec_of(&planner, "node-b")
            .services
            .into_iter()
            .map(|s| s.name.clone())
            .collect();
        let bad: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| n.starts_with("ns1/bad"))
            .collect();
        assert_eq!(
            bad, case.planned,
            "{}: planned entries of the bad service",
            case.name
        );
    }
}

#[test]
fn node_port_range_from_config_is_enforced() {
    let config = Config::parse("nodePortRange: 30000-32767\n").unwrap();
    let svc = service("ns1", "np", "10.96.0.3", |s| {
        s.type_("NodePort")
            .node_port("low", 80, 29999)
            .node_port("ok", 81, 30001);
    });
    let planner = Planner::build(&snapshot(vec![svc], vec![]), &config).unwrap();
    let names: Vec<String> = spec_of(&planner, "node-a")
        .services
        .into_iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, vec!["ns1/np:ok"]);
    assert!(
        planner.diagnostics().warnings[0]
            .reason
            .contains("nodePort 29999 is outside 30000-32767")
    );
}

#[test]
fn a_cluster_without_nodes_plans_nothing() {
    let (svc, eps) = good();
    let planner = plan(&Snapshot {
        services: vec![svc],
        slices: vec![eps],
        nodes: vec![],
    });
    assert_eq!(planner.node_names().count(), 0);
    assert_eq!(super::all_objects(&planner), (vec![], vec![]));
}

#[test]
fn a_service_without_slices_rejects() {
    let (svc, _) = good();
    let entry = entry_of(&plan(&snapshot(vec![svc], vec![])), "node-a", "ns1/good:http");
    assert!(!entry.has_endpoints);
    assert!(entry.endpoints.is_empty());
}

#[test]
fn bad_nodes_are_warned_and_the_rest_planned() {
    let (svc, eps) = good();
    let mut nameless = node("x", "192.168.10.20", "10.244.9.0/24", None);
    nameless.metadata.name = None;
    let bad_ip = node("node-z", "192.168.10.300", "10.244.8.0/24", None);
    let planner = plan(&Snapshot {
        services: vec![svc],
        slices: vec![eps],
        nodes: vec![
            nameless,
            bad_ip,
            node("node-a", "192.168.10.11", "10.244.1.0/24", None),
        ],
    });
    let warnings: Vec<String> = planner
        .diagnostics()
        .warnings
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        warnings,
        vec![
            "Node <unnamed>: no metadata.name; node skipped".to_string(),
            "Node node-z: InternalIP \"192.168.10.300\" is not an IP address; ignored".to_string(),
        ]
    );
    assert_eq!(planner.node_names().collect::<Vec<_>>(), vec!["node-a", "node-z"]);
    assert!(spec_of(&planner, "node-z").node_ips.is_empty());
}

#[test]
fn slices_of_services_that_are_not_proxied_are_not_warned_about() {
    let headless = service("ns1", "db", "None", |s| {
        s.port("", 5432, "TCP");
    });
    let db_slice = slice(
        "ns1",
        "db",
        &[("", 5432, "TCP")],
        vec![endpoint("10.244.1.9", "node-a")],
    );
    let (good_svc, good_slice) = good();
    let planner = plan(&snapshot(vec![headless, good_svc], vec![db_slice, good_slice]));
    let warnings = &planner.diagnostics().warnings;
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn duplicate_endpoints_in_a_slice_keep_the_usable_copy_whatever_their_order() {
    let svc = service("ns1", "web", "10.96.0.2", |s| {
        s.port("", 80, "TCP");
    });
    let terminating = endpoint("10.244.1.9", "node-a").conditions(false, true, true);
    let ready = endpoint("10.244.1.9", "node-b");
    let gone = endpoint("10.244.1.9", "node-c").conditions(false, false, true);
    let orders = [
        vec![terminating.clone(), ready.clone(), gone.clone()],
        vec![gone.clone(), ready.clone(), terminating.clone()],
        vec![ready, gone, terminating],
    ];
    let specs: Vec<_> = orders
        .into_iter()
        .map(|endpoints| {
            let eps = slice("ns1", "web", &[("", 80, "TCP")], endpoints);
            let planner = plan(&snapshot(vec![svc.clone()], vec![eps]));
            let entry = entry_of(&planner, "node-b", "ns1/web");
            assert_eq!(entry.endpoints.len(), 1, "{entry:?}");
            let kept = &entry.endpoints[0];
            assert!(
                !kept.terminating && kept.on_node,
                "the ready copy on node-b: {kept:?}"
            );
            spec_of(&planner, "node-b")
        })
        .collect();
    assert_eq!(specs[0], specs[1]);
    assert_eq!(specs[1], specs[2]);
}
