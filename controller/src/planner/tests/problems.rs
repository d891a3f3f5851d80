//! Service problems, one case per reason and the healthy and skipped cases that must have none.

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config;
use crate::planner::fixtures::{EndpointExt, ServiceExt, endpoint, service, slice};
use crate::planner::problems::{reasons, service_problems};

fn web(mutate: impl FnOnce(&mut Service)) -> Service {
    service("ns1", "web", "10.96.0.10", |s| {
        s.port("http", 80, "TCP");
        s.spec_mut().selector = Some([("app".to_string(), "web".to_string())].into());
        mutate(s);
    })
}

fn slices(endpoints: Vec<k8s_openapi::api::discovery::v1::Endpoint>) -> Vec<EndpointSlice> {
    vec![slice("ns1", "web", &[("http", 8080, "TCP")], endpoints)]
}

#[test]
fn each_problem_is_found_with_its_counts_and_healthy_services_have_none() {
    type Case = (
        &'static str,
        Service,
        Vec<EndpointSlice>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "healthy",
            web(|_| {}),
            slices(vec![endpoint("10.244.1.5", "node-a")]),
            vec![],
        ),
        (
            "selector matches no Pod",
            web(|_| {}),
            slices(vec![]),
            vec![(
                reasons::NO_ENDPOINTS,
                "the selector app=web matches no Pod (1 EndpointSlice(s), all empty)",
            )],
        ),
        (
            "no selector, no slice",
            web(|s| s.spec_mut().selector = None),
            vec![],
            vec![(
                reasons::NO_ENDPOINTS,
                "has no selector and its 0 EndpointSlice(s) list none",
            )],
        ),
        (
            "none ready",
            web(|_| {}),
            slices(vec![
                endpoint("10.244.1.5", "node-a").conditions(false, false, true),
                endpoint("10.244.1.6", "node-a").conditions(false, false, false),
                endpoint("10.244.1.7", "node-a").conditions(false, true, true),
            ]),
            vec![(
                reasons::NO_READY_ENDPOINTS,
                "none of its 3 endpoints is ready: 2 terminating, 1 not ready; 1 still serving",
            )],
        ),
        (
            "named targetPort no Pod defines",
            web(|s| {
                s.spec_mut().ports.as_mut().unwrap()[0].target_port = Some(IntOrString::String("web".into()))
            }),
            vec![slice("ns1", "web", &[], vec![endpoint("10.244.1.5", "node-a")])],
            vec![(
                reasons::TARGET_PORT_NOT_FOUND,
                "port \"http\": no endpoint defines targetPort \"web\"",
            )],
        ),
        (
            "named targetPort resolved",
            web(|s| {
                s.spec_mut().ports.as_mut().unwrap()[0].target_port = Some(IntOrString::String("web".into()))
            }),
            slices(vec![endpoint("10.244.1.5", "node-a")]),
            vec![],
        ),
        (
            "NodePort outside the range",
            web(|s| {
                s.type_("NodePort");
                s.node_port("metrics", 9090, 20000);
            }),
            slices(vec![endpoint("10.244.1.5", "node-a")]),
            vec![(
                reasons::NODE_PORT_OUT_OF_RANGE,
                "port \"metrics\": nodePort 20000 is outside the NodePort range 30000-32767",
            )],
        ),
        (
            "eTP=Local, no endpoint names a node",
            web(|s| {
                s.type_("NodePort");
                s.spec_mut().ports.as_mut().unwrap()[0].node_port = Some(30080);
                s.spec_mut().external_traffic_policy = Some("Local".into());
            }),
            slices(vec![endpoint("10.244.1.5", "")]),
            vec![(
                reasons::NO_NODE_FOR_LOCAL_POLICY,
                "every node drops external traffic",
            )],
        ),
        (
            "eTP=Local with a node",
            web(|s| {
                s.type_("NodePort");
                s.spec_mut().ports.as_mut().unwrap()[0].node_port = Some(30080);
                s.spec_mut().external_traffic_policy = Some("Local".into());
            }),
            slices(vec![endpoint("10.244.1.5", "node-a")]),
            vec![],
        ),
        (
            "headless: skipped, no problem",
            web(|s| {
                s.spec_mut().cluster_ip = Some("None".into());
                s.spec_mut().cluster_ips = Some(vec!["None".into()]);
            }),
            vec![],
            vec![],
        ),
    ];
    let mut config = config();
    config.node_port_range = Some((30000, 32767));
    for (name, service, slices, want) in cases {
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        let got = service_problems(&service, &refs, &config);
        assert_eq!(got.len(), want.len(), "{name}: {got:#?}");
        for (problem, (reason, message)) in got.iter().zip(&want) {
            assert_eq!(problem.service, "ns1/web", "{name}");
            assert_eq!(problem.reason, *reason, "{name}: {problem:?}");
            assert!(problem.message.contains(message), "{name}: {}", problem.message);
        }
    }
}

/// An externalIP the policy refuses gets a problem (a Warning Event live) and no rule; the others of
/// the same Service are still served.
#[test]
fn refused_external_ips_are_a_problem_and_get_no_rules() {
    use crate::config::ExternalIpPolicy;
    use crate::planner::{Planner, fixtures::snapshot};
    let svc = web(|s| s.spec_mut().external_ips = Some(vec!["203.0.113.7".into(), "198.51.100.9".into()]));
    let eps = slices(vec![endpoint("10.244.1.5", "node-a")]);
    let cases = [
        (
            ExternalIpPolicy::AllowAll,
            vec!["203.0.113.7", "198.51.100.9"],
            None,
        ),
        (
            ExternalIpPolicy::AllowCidrs(vec!["203.0.113.0/24".parse().unwrap()]),
            vec!["203.0.113.7"],
            Some(
                "externalIPs 198.51.100.9 are refused by the controller's externalIPs policy (allowCIDRs [203.0.113.0/24])",
            ),
        ),
        (
            ExternalIpPolicy::Deny,
            vec![],
            Some(
                "externalIPs 203.0.113.7, 198.51.100.9 are refused by the controller's externalIPs policy (deny)",
            ),
        ),
    ];
    for (policy, served, message) in cases {
        let mut config = config();
        config.external_ips = policy.clone();
        let refs: Vec<&EndpointSlice> = eps.iter().collect();
        let got = service_problems(&svc, &refs, &config);
        match message {
            None => assert!(got.is_empty(), "{policy:?}: {got:?}"),
            Some(message) => {
                assert_eq!(got.len(), 1, "{policy:?}: {got:?}");
                assert_eq!(got[0].reason, reasons::EXTERNAL_IP_NOT_ALLOWED);
                assert!(got[0].message.contains(message), "{}", got[0].message);
            }
        }
        let planner = Planner::build(&snapshot(vec![svc.clone()], eps.clone()), &config).unwrap();
        let plan = planner.composed("node-a").unwrap().unwrap();
        let entry = plan
            .spec
            .services
            .iter()
            .find(|e| e.name == "ns1/web:http")
            .unwrap();
        assert_eq!(entry.external_ips, served, "{policy:?}");
    }
}
