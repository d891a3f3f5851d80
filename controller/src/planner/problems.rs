//! "Why doesn't my Service answer?" from the proxy's side: problems of valid Services that leave them
//! without working forwarding, found from the Service and its EndpointSlices alone.
//!
//! ```text
//! Service + its EndpointSlices + Config ─► service_problems() ─► [ServiceProblem { reason, message }]
//!   offline `plan`: one `warning:` line each      live controller: Warning Events on the Service
//! ```
//!
//! Invalid input (a bad IP, a NodePort outside the range) is the planner's [`Warning`](super::Warning);
//! these are Services the planner plans correctly and that still cannot work: no endpoints, none ready,
//! a named targetPort no Pod defines, a Local policy no node can serve. Skipped Services (headless,
//! ExternalName, another proxy's) have none.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{
    core::v1::Service,
    discovery::v1::{Endpoint, EndpointSlice},
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use switchyard_api::names::k8s::LABEL_SERVICE_NAME;

use super::{Diagnostics, Snapshot, services};
use crate::Config;

/// The Event reasons (`PascalCase`, as `kubectl describe` shows them).
pub mod reasons {
    /// The Service's EndpointSlices hold no endpoint at all (its selector matches no Pod, or nobody
    /// wrote EndpointSlices for a Service without a selector).
    pub const NO_ENDPOINTS: &str = "NoEndpoints";
    /// Endpoints exist, none is ready.
    pub const NO_READY_ENDPOINTS: &str = "NoReadyEndpoints";
    /// A port's named targetPort is defined by no endpoint.
    pub const TARGET_PORT_NOT_FOUND: &str = "TargetPortNotFound";
    /// A NodePort outside the configured range: that port is not served.
    pub const NODE_PORT_OUT_OF_RANGE: &str = "NodePortOutOfRange";
    /// externalTrafficPolicy Local, and no ready endpoint is on a known node: every node drops
    /// external traffic.
    pub const NO_NODE_FOR_LOCAL_POLICY: &str = "NoNodeForLocalPolicy";
    /// externalIPs the controller's `externalIPs` policy refuses: they get no rules on any node.
    pub const EXTERNAL_IP_NOT_ALLOWED: &str = "ExternalIPNotAllowed";
}

/// One problem of one Service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceProblem {
    /// `namespace/name`.
    pub service: String,
    /// One of [`reasons`].
    pub reason: &'static str,
    /// What is wrong, in words, with the counts that show it.
    pub message: String,
}

/// The `namespace/name` of the Service an EndpointSlice belongs to (its `kubernetes.io/service-name`).
pub fn service_of(slice: &EndpointSlice) -> Option<String> {
    let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    Some(format!(
        "{}/{service}",
        slice.metadata.namespace.as_deref().unwrap_or("default")
    ))
}

/// The problems of every Service of `snapshot`, sorted.
pub fn snapshot_problems(snapshot: &Snapshot, config: &Config) -> Vec<ServiceProblem> {
    problems_by_service(&snapshot.services, &snapshot.slices, config)
        .into_values()
        .flatten()
        .collect()
}

/// The problems of each of `services` (by `namespace/name`; Services without one are left out), given
/// every EndpointSlice.
pub fn problems_by_service<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    config: &Config,
) -> BTreeMap<String, Vec<ServiceProblem>> {
    let mut by_service: BTreeMap<String, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if let Some(key) = service_of(slice) {
            by_service.entry(key).or_default().push(slice);
        }
    }
    services
        .into_iter()
        .filter_map(|service| {
            let key = services::key(service)?;
            let slices = by_service.get(&key).map_or(&[][..], Vec::as_slice);
            let problems = service_problems(service, slices, config);
            (!problems.is_empty()).then_some((key, problems))
        })
        .collect()
}

/// The problems of `service` given its EndpointSlices (those labelled with its name), sorted.
pub fn service_problems(
    service: &Service,
    slices: &[&EndpointSlice],
    config: &Config,
) -> Vec<ServiceProblem> {
    // Only Services the planner proxies: the templates say which (and hold each port's policies).
    let templates = services::templates(service, config, &mut Diagnostics::default());
    let (Some(key), Some(spec)) = (services::key(service), service.spec.as_ref()) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let mut problem = |reason: &'static str, message: String| {
        problems.push(ServiceProblem {
            service: key.clone(),
            reason,
            message,
        });
    };

    for port in spec.ports.iter().flatten() {
        if let Some(node_port) = port.node_port.filter(|p| *p != 0)
            && !u16::try_from(node_port).is_ok_and(|p| services::in_range(p, config.node_port_range))
        {
            let range = config
                .node_port_range
                .map_or("1-65535".to_string(), |(lo, hi)| format!("{lo}-{hi}"));
            problem(
                reasons::NODE_PORT_OUT_OF_RANGE,
                format!(
                    "port {:?}: nodePort {node_port} is outside the NodePort range {range}; it is not served",
                    port.name.as_deref().unwrap_or_default()
                ),
            );
        }
    }
    let refused: Vec<&str> = spec
        .external_ips
        .iter()
        .flatten()
        .filter(|text| {
            switchyard_api::ip::parse_ip_sloppy(text).is_some_and(|ip| !config.external_ips.allows(&ip))
        })
        .map(String::as_str)
        .collect();
    if !refused.is_empty() && !templates.is_empty() {
        problem(
            reasons::EXTERNAL_IP_NOT_ALLOWED,
            format!(
                "externalIPs {} are refused by the controller's externalIPs policy ({}): no node forwards them",
                refused.join(", "),
                config.external_ips.describe()
            ),
        );
    }
    if templates.is_empty() {
        problems.sort();
        return problems;
    }

    let endpoints: Vec<&Endpoint> = slices.iter().flat_map(|s| s.endpoints.iter().flatten()).collect();
    // An absent `ready` means ready (the EndpointSlice API's rule).
    let ready = |e: &&Endpoint| e.conditions.as_ref().and_then(|c| c.ready) != Some(false);
    if endpoints.is_empty() {
        let selector = spec.selector.as_ref().filter(|s| !s.is_empty()).map(|s| {
            s.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        });
        problem(
            reasons::NO_ENDPOINTS,
            match selector {
                Some(selector) => format!(
                    "no endpoints: the selector {selector} matches no Pod ({} EndpointSlice(s), all empty); \
                     connections are rejected",
                    slices.len()
                ),
                None => format!(
                    "no endpoints: the Service has no selector and its {} EndpointSlice(s) list none; \
                     connections are rejected",
                    slices.len()
                ),
            },
        );
    } else if !endpoints.iter().any(ready) {
        let terminating = endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.terminating) == Some(true))
            .count();
        let serving = endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.serving) == Some(true))
            .count();
        let fallback = if serving > 0 {
            format!("; {serving} still serving, used as a fallback while they terminate")
        } else {
            "; connections are rejected".to_string()
        };
        problem(
            reasons::NO_READY_ENDPOINTS,
            format!(
                "none of its {} endpoints is ready: {terminating} terminating, {} not ready{fallback}",
                endpoints.len(),
                endpoints.len() - terminating
            ),
        );
    } else {
        let slice_ports: BTreeSet<&str> = slices
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.name.as_deref().unwrap_or_default())
            .collect();
        for port in spec.ports.iter().flatten() {
            let name = port.name.as_deref().unwrap_or_default();
            if let Some(IntOrString::String(target)) = &port.target_port
                && !slice_ports.contains(name)
            {
                problem(
                    reasons::TARGET_PORT_NOT_FOUND,
                    format!(
                        "port {name:?}: no endpoint defines targetPort {target:?} (no ready Pod declares a \
                         container port of that name); the port has no endpoints"
                    ),
                );
            }
        }
        let local = templates
            .iter()
            .any(|t| t.policies.external_local && t.policies.externally_accessible);
        let on_a_node = endpoints
            .iter()
            .filter(|e| ready(e))
            .any(|e| e.node_name.as_deref().is_some_and(|n| !n.is_empty()));
        if local && !on_a_node {
            problem(
                reasons::NO_NODE_FOR_LOCAL_POLICY,
                "externalTrafficPolicy is Local, but no ready endpoint names its node: every node drops \
                 external traffic to this Service"
                    .to_string(),
            );
        }
    }
    problems.sort();
    problems.dedup();
    problems
}
