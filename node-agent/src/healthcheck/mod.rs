//! Health-check node ports for `externalTrafficPolicy: Local` load balancers (kube-proxy's
//! `healthcheck/service_health.go`).
//!
//! ```text
//! applied plan ─► desired() ─► { port → HcService { ns, name, local ready endpoint IPs } }, port conflicts
//!                                 │
//!                                 ▼
//!                  HealthServers::update() ─► one HTTP listener per port (started, updated in place, stopped)
//!                                 │
//!   GET <any path> ─► respond(service, proxy healthy) ─► 200 if ≥ 1 local ready endpoint and healthy, else 503
//! ```
//!
//! A cloud load balancer probes every node on the service's `healthCheckNodePort` and sends traffic only
//! to nodes answering 200, so traffic is never sent to a node whose Local policy would drop it. The
//! count is of distinct local ready (not terminating) endpoint IPs over every entry of the Service
//! (every port and family), as kube-proxy counts them.

pub mod server;

pub use server::HealthServers;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;
use switchyard_api::{NodeForwardingPlanSpec, ServiceFailure};

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcService {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Distinct local ready endpoint IPs.
    pub local_endpoints: usize,
}

/// The health-check ports the plan asks for, and the entries whose port another Service already has.
pub fn desired(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> (BTreeMap<u16, HcService>, Vec<ServiceFailure>) {
    let entries = || {
        spec.services
            .iter()
            .enumerate()
            .filter(|(index, _)| !skip.contains(index))
            .map(|(_, entry)| entry)
    };
    let mut local: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for entry in entries() {
        let ips = local.entry(entry.service_key()).or_default();
        ips.extend(entry.ready_ips_on_node());
    }
    let mut ports: BTreeMap<u16, HcService> = BTreeMap::new();
    let mut conflicts = Vec::new();
    for entry in entries() {
        let Some(port) = entry.health_check_node_port else {
            continue;
        };
        let key = entry.service_key();
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let service = HcService {
            namespace: namespace.to_string(),
            name: name.to_string(),
            local_endpoints: local.get(key).map_or(0, BTreeSet::len),
        };
        match ports.get(&port) {
            None => {
                ports.insert(port, service);
            }
            Some(owner) if owner.namespace == service.namespace && owner.name == service.name => {}
            Some(owner) => conflicts.push(ServiceFailure {
                service: key.to_string(),
                reason: format!(
                    "health check node port {port} is already served for {}/{}",
                    owner.namespace, owner.name
                ),
            }),
        }
    }
    (ports, conflicts)
}

/// An HTTP answer, independent of the server library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcResponse {
    /// 200 or 503.
    pub status: u16,
    /// Headers in order.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body.
    pub body: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    service: ServiceRef<'a>,
    local_endpoints: usize,
    service_proxy_healthy: bool,
}

#[derive(Serialize)]
struct ServiceRef<'a> {
    namespace: &'a str,
    name: &'a str,
}

/// kube-proxy's answer: 200 iff the Service has a local ready endpoint and the proxy is healthy.
pub fn respond(service: &HcService, proxy_healthy: bool) -> HcResponse {
    let status = if service.local_endpoints > 0 && proxy_healthy {
        200
    } else {
        503
    };
    let body = serde_json::to_string(&Body {
        service: ServiceRef {
            namespace: &service.namespace,
            name: &service.name,
        },
        local_endpoints: service.local_endpoints,
        service_proxy_healthy: proxy_healthy,
    })
    .unwrap_or_default();
    HcResponse {
        status,
        headers: vec![
            ("Content-Type", "application/json".to_string()),
            ("X-Content-Type-Options", "nosniff".to_string()),
            (
                "X-Load-Balancing-Endpoint-Weight",
                service.local_endpoints.to_string(),
            ),
        ],
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    fn spec() -> NodeForwardingPlanSpec {
        plan(
            "node-a",
            vec![
                // Two ports of one Service: endpoints counted once per IP across both.
                entry("ns/web:http", "10.96.0.1", 80)
                    .lb_ip("203.0.113.1")
                    .node_port(30080)
                    .etp_local()
                    .hc_node_port(32000)
                    .with(ep("10.244.1.5", 8080).local())
                    .with(ep("10.244.1.6", 8080).local().terminating())
                    .with(ep("10.244.2.5", 8080)),
                entry("ns/web:https", "10.96.0.1", 443)
                    .lb_ip("203.0.113.1")
                    .node_port(30443)
                    .etp_local()
                    .hc_node_port(32000)
                    .with(ep("10.244.1.5", 8443).local())
                    .with(ep("10.244.1.7", 8443).local()),
                // The IPv6 side of the same Service, not externally accessible (no LB IP of its
                // family, no NodePort): its endpoints are only in the Cluster set, yet they are this
                // node's ready endpoints and count, as in kube-proxy.
                entry("ns/web:http", "fd00:96::1", 80).with(ep("fd00:244:1::5", 8080).on_node()),
                // No local endpoint.
                entry("ns/far:p", "10.96.0.2", 80)
                    .lb_ip("203.0.113.2")
                    .node_port(30081)
                    .etp_local()
                    .hc_node_port(32001)
                    .with(ep("10.244.2.9", 80)),
                // Claims a port another Service has.
                entry("other/clash:p", "10.96.0.3", 80)
                    .lb_ip("203.0.113.3")
                    .node_port(30082)
                    .etp_local()
                    .hc_node_port(32001)
                    .with(ep("10.244.2.10", 80)),
            ],
        )
    }

    #[test]
    fn local_ready_endpoints_are_distinct_ips_over_the_whole_service() {
        let (ports, conflicts) = desired(&spec(), &HashSet::new());
        let web = &ports[&32000];
        assert_eq!(
            (web.namespace.as_str(), web.name.as_str(), web.local_endpoints),
            ("ns", "web", 3)
        );
        assert_eq!(ports[&32001].name, "far");
        assert_eq!(ports[&32001].local_endpoints, 0);
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].service, "other/clash");
        let spec = spec();
        let web: HashSet<usize> = (0..spec.services.len())
            .filter(|i| spec.services[*i].service_key() == "ns/web")
            .collect();
        let (ports, _) = desired(&spec, &web);
        assert!(!ports.contains_key(&32000), "skipped entries serve nothing");
    }

    #[test]
    fn answers_follow_kube_proxy() {
        let service = HcService {
            namespace: "ns".into(),
            name: "web".into(),
            local_endpoints: 2,
        };
        let ok = respond(&service, true);
        assert_eq!(ok.status, 200);
        assert_eq!(
            ok.body,
            r#"{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}"#
        );
        assert_eq!(
            ok.headers,
            vec![
                ("Content-Type", "application/json".to_string()),
                ("X-Content-Type-Options", "nosniff".to_string()),
                ("X-Load-Balancing-Endpoint-Weight", "2".to_string()),
            ]
        );
        let unhealthy = respond(&service, false);
        assert_eq!(unhealthy.status, 503);
        assert!(unhealthy.body.ends_with(r#""serviceProxyHealthy":false}"#));
        let none = respond(
            &HcService {
                local_endpoints: 0,
                ..service
            },
            true,
        );
        assert_eq!(none.status, 503);
        assert_eq!(none.headers[2].1, "0");
    }
}
