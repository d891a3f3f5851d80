//! EndpointSlices → endpoints per (Service, port name, protocol, family), kube-proxy's
//! `EndpointSliceCache` semantics.
//!
//! ```text
//! EndpointSlice ─► headless label? skipped (as kube-proxy's informer selector)
//!               ─► service label ─► address type (FQDN skipped) ─► ports (name, port, protocol)
//!               └► endpoints: addresses[0], conditions, nodeName, hints ─► deduplicated per ip:port
//! ```
//!
//! Conditions: ready = Ready unset or true; serving = Serving unset or true; terminating = Terminating
//! true. Endpoints neither ready nor serving are set aside before duplicates are merged: no policy
//! forwards to them, and only their addresses are kept ([`Collected::unready`]), so that the agent can
//! tell an endpoint that left the Service from one that is merely not ready. When the same ip:port appears twice, in one slice or in overlapping slices,
//! a non-terminating copy wins, then a ready one, then a serving one, then one with a nodeName; other
//! ties break on content.

use std::{collections::HashMap, net::IpAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use switchyard_api::{
    IpFamily, Protocol,
    ip::parse_ip_sloppy,
    names::k8s::{LABEL_HEADLESS, LABEL_SERVICE_NAME},
};

use super::diagnostics::{Diagnostics, SkipReason};

/// One endpoint as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `addresses[0]`, normalised.
    pub ip: IpAddr,
    /// The slice port for this ServicePort.
    pub port: u16,
    /// Ready (unset counts as ready).
    pub ready: bool,
    /// Serving (unset counts as serving).
    pub serving: bool,
    /// Terminating.
    pub terminating: bool,
    /// `nodeName`.
    pub node: Option<String>,
    /// `hints.forZones[].name`.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name`.
    pub node_hints: Vec<String>,
    /// Pod name from `targetRef` (for reports only).
    pub pod: Option<String>,
}

/// (`namespace/service`, port name, protocol, family).
pub type PortKey = (String, String, Protocol, IpFamily);

/// What the slices list, per port key.
#[derive(Debug, Default)]
pub struct Collected {
    /// Ready or serving endpoints, one per ip:port, sorted by (ip, port).
    pub endpoints: HashMap<PortKey, Vec<EndpointInfo>>,
    /// Addresses listed neither ready nor serving, sorted, each once, none of them also an endpoint.
    pub unready: HashMap<PortKey, Vec<IpAddr>>,
}

/// Collects every slice's endpoints, sorted by (ip, port) within each key.
pub fn collect(slices: &[&EndpointSlice], diag: &mut Diagnostics) -> Collected {
    let mut ordered: Vec<&EndpointSlice> = slices.to_vec();
    ordered.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut out = Collected::default();
    for slice in ordered {
        add_slice(slice, diag, &mut out);
    }
    for endpoints in out.endpoints.values_mut() {
        endpoints.sort_by_key(|a| (a.ip, a.port));
    }
    for (key, unready) in &mut out.unready {
        let usable = out.endpoints.get(key);
        unready.retain(|ip| !usable.is_some_and(|eps| eps.iter().any(|e| e.ip == *ip)));
        unready.sort_unstable();
        unready.dedup();
    }
    out.unready.retain(|_, unready| !unready.is_empty());
    out
}

fn add_slice(slice: &EndpointSlice, diag: &mut Diagnostics, out: &mut Collected) {
    let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
    let name = slice.metadata.name.as_deref().unwrap_or("<unnamed>");
    let object = format!("{namespace}/{name}");
    if slice
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_HEADLESS))
    {
        diag.skipped.push((object, SkipReason::SliceHeadlessLabel));
        return;
    }
    let Some(service) = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|s| !s.is_empty())
    else {
        diag.warn(
            "EndpointSlice",
            &object,
            format!("no {LABEL_SERVICE_NAME} label; slice skipped"),
        );
        return;
    };
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::IPv4,
        "IPv6" => IpFamily::IPv6,
        "FQDN" => {
            diag.warn(
                "EndpointSlice",
                &object,
                "addressType FQDN is not proxied; slice skipped",
            );
            return;
        }
        other => {
            diag.warn(
                "EndpointSlice",
                &object,
                format!("unknown addressType {other:?}; slice skipped"),
            );
            return;
        }
    };
    let service_key = format!("{namespace}/{service}");

    let mut ports: Vec<(String, u16, Protocol)> = Vec::new();
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        // The API server defaults a missing name to "" and a missing protocol to TCP.
        let port_name = port.name.clone().unwrap_or_default();
        let number = match port.port {
            Some(p) if (1..=65535).contains(&p) => p as u16,
            other => {
                let shown = other.map_or_else(|| "missing".to_string(), |p| p.to_string());
                diag.warn(
                    "EndpointSlice",
                    &object,
                    format!("ports[{i}] ({port_name:?}): port {shown} is not 1-65535; port skipped"),
                );
                continue;
            }
        };
        let protocol = match port.protocol.as_deref() {
            None => Protocol::TCP,
            Some(p) => match Protocol::parse(p) {
                Some(protocol) => protocol,
                None => {
                    diag.warn(
                        "EndpointSlice",
                        &object,
                        format!("ports[{i}]: unknown protocol {p:?}; port skipped"),
                    );
                    continue;
                }
            },
        };
        ports.push((port_name, number, protocol));
    }

    let mut endpoints: Vec<EndpointInfo> = Vec::new();
    let mut unready: Vec<IpAddr> = Vec::new();
    for (i, endpoint) in slice.endpoints.iter().flatten().enumerate() {
        let Some(text) = endpoint.addresses.first() else {
            diag.warn(
                "EndpointSlice",
                &object,
                format!("endpoints[{i}] has no address; endpoint skipped"),
            );
            continue;
        };
        let Some(ip) = parse_ip_sloppy(text) else {
            diag.warn(
                "EndpointSlice",
                &object,
                format!("endpoints[{i}]: {text:?} is not an IP address; endpoint skipped"),
            );
            continue;
        };
        if IpFamily::of(&ip) != family {
            diag.warn(
                "EndpointSlice",
                &object,
                format!("endpoints[{i}]: {ip} is not {family:?} like the slice; endpoint skipped"),
            );
            continue;
        }
        let conditions = endpoint.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        if !ready && !serving {
            // Not forwarded to, but still the Service's: connection hygiene leaves its flows alone.
            unready.push(ip);
            continue;
        }
        let hints = endpoint.hints.as_ref();
        let info = EndpointInfo {
            ip,
            port: 0,
            ready,
            serving,
            terminating,
            node: endpoint.node_name.clone().filter(|n| !n.is_empty()),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect(),
            pod: endpoint.target_ref.as_ref().and_then(|r| r.name.clone()),
        };
        match endpoints.iter_mut().find(|e| e.ip == ip) {
            Some(existing) => {
                diag.warn(
                    "EndpointSlice",
                    &object,
                    format!("endpoints[{i}]: duplicate endpoint {ip}; one copy kept"),
                );
                if preferred(&info, existing) {
                    *existing = info;
                }
            }
            None => endpoints.push(info),
        }
    }

    for (port_name, number, protocol) in ports {
        let key = (service_key.clone(), port_name, protocol, family);
        if !unready.is_empty() {
            out.unready.entry(key.clone()).or_default().extend(&unready);
        }
        let list = out.endpoints.entry(key).or_default();
        for endpoint in &endpoints {
            let endpoint = EndpointInfo {
                port: number,
                ..endpoint.clone()
            };
            match list
                .iter_mut()
                .find(|e| e.ip == endpoint.ip && e.port == endpoint.port)
            {
                // Overlapping slices (during a slice split or merge).
                Some(existing) if preferred(&endpoint, existing) => *existing = endpoint,
                Some(_) => {}
                None => list.push(endpoint),
            }
        }
    }
}

/// Whether `candidate` should replace `existing`, a copy of the same ip:port: a non-terminating copy
/// wins, then a ready one, then a serving one, then one with a nodeName; the remaining ties break on
/// the copies' content, so the result never depends on the order of endpoints or slices.
fn preferred(candidate: &EndpointInfo, existing: &EndpointInfo) -> bool {
    let rank = |e: &EndpointInfo| {
        (
            !e.terminating,
            e.ready,
            e.serving,
            // A copy that says where it runs keeps locality (and node-keyed IPVS weights).
            e.node.is_some(),
            std::cmp::Reverse((
                e.node.clone(),
                e.zone_hints.clone(),
                e.node_hints.clone(),
                e.pod.clone(),
            )),
        )
    };
    rank(candidate) > rank(existing)
}
