//! Services → one entry template per (port, family), kube-proxy's `newBaseServiceInfo` semantics.
//!
//! ```text
//! Service ─► skip? (headless: clusterIP None or labelled service.kubernetes.io/headless; ExternalName;
//!                  another proxy's service-proxy-name) ─► clusterIPs per family
//!         └► ports (protocol, port, nodePort) × families ─► frontends filtered by family
//!            (externalIPs, LoadBalancer VIPs, source ranges), affinity, policies, health-check port
//! ```
//!
//! Invalid parts are dropped with a warning naming the Service; only an unusable ClusterIP or name drops
//! the whole Service.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use switchyard_api::{
    IpFamily, Protocol, ServicePlan, TrafficPolicy,
    ip::{is_zero_cidr, parse_cidr_sloppy, parse_ip_sloppy},
    names::{
        ANNOTATION_IPVS_SCHEDULER, ANNOTATION_IPVS_WEIGHTS, ANNOTATION_KEEP_CONNECTIONS, IPVS_SCHEDULERS,
        k8s::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME},
        service_port_name,
    },
    validate::MAX_AFFINITY_SECONDS,
};

use super::{
    diagnostics::{Diagnostics, SkipReason},
    topology::Policies,
};
use crate::config::Config;

/// kube-proxy's default ClientIP affinity timeout (the API default).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10_800;

/// One (Service port, family) with everything but its endpoints.
#[derive(Debug, Clone)]
pub struct PortTemplate {
    /// `namespace/name`.
    pub service_key: String,
    /// The port's name (joins EndpointSlice ports).
    pub port_name: String,
    /// Policies deciding which endpoint sets apply.
    pub policies: Policies,
    /// The entry with `hasEndpoints: false` and no endpoints.
    pub entry: ServicePlan,
    /// IPVS weights by node name (`switchyard.io/ipvs-weights`), shared by the Service's ports.
    pub weights: Option<Arc<IpvsWeights>>,
}

/// IPVS real-server weights by the endpoint's node.
pub type IpvsWeights = BTreeMap<String, u16>;

/// Parses `node-a=3, node-b=1`; every problem is reported, and any problem voids the annotation.
pub fn parse_ipvs_weights(text: &str) -> Result<IpvsWeights, String> {
    let mut weights = IpvsWeights::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((node, weight)) = item.split_once('=') else {
            return Err(format!("{item:?} is not node=weight"));
        };
        let (node, weight) = (node.trim(), weight.trim());
        let weight = match weight.parse::<u16>() {
            Ok(w) if w >= 1 => w,
            _ => return Err(format!("weight {weight:?} of {node:?} is not 1..65535")),
        };
        if node.is_empty() || weights.insert(node.to_string(), weight).is_some() {
            return Err(format!("node {node:?} is empty or listed twice"));
        }
    }
    Ok(weights)
}

/// `namespace/name` of a Service (the namespace defaults like the API server's); `None` without a name.
pub fn key(service: &Service) -> Option<String> {
    let name = service.metadata.name.as_deref()?;
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    Some(format!("{namespace}/{name}"))
}

/// Turns one Service into templates; returns nothing for skipped or unusable Services.
pub fn templates(service: &Service, config: &Config, diag: &mut Diagnostics) -> Vec<PortTemplate> {
    let (Some(name), namespace) = (
        service.metadata.name.as_deref(),
        service.metadata.namespace.as_deref(),
    ) else {
        diag.warn("Service", "<unnamed>", "no metadata.name; service skipped");
        return Vec::new();
    };
    let namespace = namespace.unwrap_or("default");
    let object = format!("{namespace}/{name}");
    let Some(spec) = service.spec.as_ref() else {
        diag.warn("Service", &object, "no spec; service skipped");
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        diag.skipped.push((object, SkipReason::ExternalName));
        return Vec::new();
    }
    if let Some(proxy) = service
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
        && (proxy != &config.service_proxy_name || config.service_proxy_name.is_empty())
    {
        diag.skipped.push((object, SkipReason::OtherProxy));
        return Vec::new();
    }
    if service
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_HEADLESS))
    {
        diag.skipped.push((object, SkipReason::HeadlessLabel));
        return Vec::new();
    }
    let cluster_ip_texts: Vec<&str> = match spec.cluster_ips.as_ref().filter(|ips| !ips.is_empty()) {
        Some(ips) => ips.iter().map(String::as_str).collect(),
        None => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if cluster_ip_texts.is_empty() || cluster_ip_texts.iter().any(|ip| ip.is_empty() || *ip == "None") {
        diag.skipped.push((object, SkipReason::Headless));
        return Vec::new();
    }
    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    for text in &cluster_ip_texts {
        match parse_ip_sloppy(text) {
            Some(ip) if cluster_ips.iter().all(|c| IpFamily::of(c) != IpFamily::of(&ip)) => {
                cluster_ips.push(ip)
            }
            Some(ip) => diag.warn(
                "Service",
                &object,
                format!("second clusterIP {ip} of the same family ignored"),
            ),
            None => {
                diag.warn(
                    "Service",
                    &object,
                    format!("clusterIP {text:?} is not an IP address; service skipped"),
                );
                return Vec::new();
            }
        }
    }

    let mut parsed = |texts: Vec<&str>, what: &str, parse: fn(&str) -> Option<IpNet>| -> Vec<IpNet> {
        texts
            .into_iter()
            .filter_map(|text| {
                let value = parse(text);
                if value.is_none() {
                    diag.warn(
                        "Service",
                        &object,
                        format!("{what} {text:?} is not valid; ignored"),
                    );
                }
                value
            })
            .collect()
    };
    let as_host = |text: &str| parse_ip_sloppy(text).map(IpNet::from);
    let external_ips: Vec<IpAddr> = parsed(
        spec.external_ips.iter().flatten().map(String::as_str).collect(),
        "externalIP",
        as_host,
    )
    .iter()
    .map(IpNet::addr)
    // Refused by the externalIPs policy: no rules (the Service's Warning Event comes from problems.rs).
    .filter(|ip| config.external_ips.allows(ip))
    .collect();
    let ingress: Vec<&str> = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        // ipMode Proxy (KEP-1860) means the load balancer proxies: no VIP rules on nodes.
        .filter(|ing| ing.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
        .filter_map(|ing| ing.ip.as_deref().filter(|ip| !ip.is_empty()))
        .collect();
    let lb_ips: Vec<IpAddr> = parsed(ingress, "load balancer ingress IP", as_host)
        .iter()
        .map(IpNet::addr)
        .collect();
    let source_ranges: Vec<IpNet> = parsed(
        spec.load_balancer_source_ranges
            .iter()
            .flatten()
            .map(String::as_str)
            .collect(),
        "loadBalancerSourceRange",
        parse_cidr_sloppy,
    );

    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let configured = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds);
        match configured {
            None => DEFAULT_AFFINITY_SECONDS,
            Some(t) if (1..=MAX_AFFINITY_SECONDS as i32).contains(&t) => t as u32,
            Some(t) => {
                diag.warn(
                    "Service",
                    &object,
                    format!("affinity timeout {t}s is not 1-86400; using {DEFAULT_AFFINITY_SECONDS}s"),
                );
                DEFAULT_AFFINITY_SECONDS
            }
        }
    });
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    let externally_accessible_service = matches!(service_type, "LoadBalancer" | "NodePort")
        || (service_type == "ClusterIP" && !external_ips.is_empty());
    let external_local =
        externally_accessible_service && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = if service_type == "LoadBalancer" && external_local {
        match spec.health_check_node_port {
            Some(p) if (1..=65535).contains(&p) => Some(p as u16),
            Some(p) if p != 0 => {
                diag.warn(
                    "Service",
                    &object,
                    format!("healthCheckNodePort {p} is not 1-65535; ignored"),
                );
                None
            }
            _ => None,
        }
    } else {
        None
    };
    let scheduler = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_IPVS_SCHEDULER))
        .and_then(|s| {
            if IPVS_SCHEDULERS.contains(&s.as_str()) {
                Some(s.clone())
            } else {
                diag.warn(
                    "Service",
                    &object,
                    format!(
                        "{ANNOTATION_IPVS_SCHEDULER} {s:?} is not one of {}; using the default",
                        IPVS_SCHEDULERS.join(", ")
                    ),
                );
                None
            }
        });
    let keep_connections = match service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_KEEP_CONNECTIONS))
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            diag.warn(
                "Service",
                &object,
                format!(
                    "{ANNOTATION_KEEP_CONNECTIONS} {other:?} is neither \"true\" nor \"false\"; connections to removed endpoints are cleared"
                ),
            );
            false
        }
    };
    let weights = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_IPVS_WEIGHTS))
        .and_then(|text| match parse_ipvs_weights(text) {
            Ok(weights) if weights.is_empty() => None,
            Ok(weights) => Some(Arc::new(weights)),
            Err(why) => {
                diag.warn(
                    "Service",
                    &object,
                    format!("{ANNOTATION_IPVS_WEIGHTS}: {why}; every endpoint weighs 1"),
                );
                None
            }
        });

    let mut out = Vec::new();
    let mut seen_ports: Vec<(String, Protocol)> = Vec::new();
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        let port_name = port.name.clone().unwrap_or_default();
        let protocol = match port.protocol.as_deref() {
            None => Protocol::TCP,
            Some(p) => match Protocol::parse(p) {
                Some(protocol) => protocol,
                None => {
                    diag.warn(
                        "Service",
                        &object,
                        format!("ports[{i}] ({port_name:?}): unknown protocol {p:?}; port skipped"),
                    );
                    continue;
                }
            },
        };
        if !(1..=65535).contains(&port.port) {
            diag.warn(
                "Service",
                &object,
                format!(
                    "ports[{i}] ({port_name:?}): port {} is not 1-65535; port skipped",
                    port.port
                ),
            );
            continue;
        }
        let node_port = match port.node_port {
            None | Some(0) => None,
            Some(p) if (1..=65535).contains(&p) && in_range(p as u16, config.node_port_range) => {
                Some(p as u16)
            }
            Some(p) => {
                let range = config
                    .node_port_range
                    .map_or("1-65535".to_string(), |(lo, hi)| format!("{lo}-{hi}"));
                diag.warn(
                    "Service",
                    &object,
                    format!("ports[{i}] ({port_name:?}): nodePort {p} is outside {range}; port skipped"),
                );
                continue;
            }
        };
        if seen_ports.contains(&(port_name.clone(), protocol)) {
            diag.warn(
                "Service",
                &object,
                format!("ports[{i}]: duplicate port {port_name:?}/{protocol:?}; port skipped"),
            );
            continue;
        }
        seen_ports.push((port_name.clone(), protocol));

        for cluster_ip in &cluster_ips {
            let family = IpFamily::of(cluster_ip);
            let of_family = |ips: &[IpAddr]| -> Vec<String> {
                let mut v: Vec<String> = ips
                    .iter()
                    .filter(|ip| IpFamily::of(ip) == family)
                    .map(IpAddr::to_string)
                    .collect();
                v.dedup();
                v
            };
            let family_ranges: Vec<&IpNet> = source_ranges
                .iter()
                .filter(|n| IpFamily::of(&n.addr()) == family)
                .collect();
            // Any /0 in the family means "allow everyone": no filtering, as in kube-proxy.
            let ranges = if family_ranges.iter().any(|n| is_zero_cidr(n)) {
                Vec::new()
            } else {
                let mut v: Vec<String> = family_ranges.iter().map(|n| n.to_string()).collect();
                v.dedup();
                v
            };
            let entry = ServicePlan {
                name: service_port_name(namespace, name, &port_name),
                protocol,
                family,
                cluster_ip: cluster_ip.to_string(),
                port: port.port as u16,
                node_port,
                external_ips: of_family(&external_ips),
                load_balancer_ips: of_family(&lb_ips),
                source_ranges: ranges,
                affinity_timeout_seconds: affinity,
                external_policy: if external_local {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                },
                internal_policy: if internal_local {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                },
                health_check_node_port,
                scheduler: scheduler.clone(),
                unready_ips: vec![],
                keep_connections,
                has_endpoints: false,
                endpoints: Vec::new(),
            };
            let policies = Policies {
                internal_local,
                external_local,
                externally_accessible: entry.externally_accessible(),
            };
            out.push(PortTemplate {
                service_key: object.clone(),
                port_name: port_name.clone(),
                policies,
                entry,
                weights: weights.clone(),
            });
        }
    }
    // A Service with nothing to forward drops out of every plan: said, so it never vanishes unnamed
    // (a `prots:` typo leaves it without ports).
    if out.is_empty() {
        let reason = if spec.ports.as_ref().is_none_or(Vec::is_empty) {
            "no ports (spec.ports is missing or empty): not forwarded"
        } else {
            "none of its ports can be forwarded (each is named above): not forwarded"
        };
        diag.warn("Service", &object, reason);
    }
    out
}

pub(crate) fn in_range(port: u16, range: Option<(u16, u16)>) -> bool {
    range.is_none_or(|(lo, hi)| (lo..=hi).contains(&port))
}
