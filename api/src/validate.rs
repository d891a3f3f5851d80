//! Plan and slice validation: every problem with its path, split into problems that poison the whole
//! object and problems confined to one entry.
//!
//! ```text
//! plan spec  ─► validate()       ─► Report { plan: [Problem], entries: [(index, [Problem])] }
//!                                     │ plan non-empty  → agent rejects the plan whole, last good rules stay
//!                                     └ entry problems → agent skips those entries, reports them, applies the rest
//! slice spec ─► validate_slice() ─► Report: plan problems → the agent keeps the slice's last good copy;
//!                                     entry problems surface again when the composed plan is validated
//!              (the agent calls validate_slice_header(): entries are validated once, composed)
//! ```
//!
//! Validation runs on every sync (10,000 entries on a large node), so the happy path allocates nothing
//! per field: a problem's path is formatted only when there is a problem.
//!
//! Every list and string has a bound, so a hostile object (200,000 entries, a 10 MB name) is refused
//! with a message naming the limit rather than programmed; values are quoted in messages cut to
//! [`MAX_SHOWN`] bytes. Lists of entries are also bounded while they are read ([`crate::bounded`]).

use std::{collections::HashSet, net::IpAddr, sync::Arc};

use crate::{
    ip::{parse_cidr_strict, parse_ip_strict},
    names::{IPVS_SCHEDULERS, check_interface_name},
    plan::{DetectLocalMode, IpFamily, NodeForwardingPlanSpec, ServicePlan, TrafficPolicy},
    slice::{ForwardingSliceSpec, MAX_SLICES_PER_VIEW, View},
};

pub use crate::bounded::MAX_ENTRIES;
/// Most endpoints one entry may carry (the CRD's `maxItems`).
pub const MAX_ENDPOINTS_PER_ENTRY: usize = 10_000;
/// Most externalIPs, LoadBalancer IPs or source ranges one entry may carry (each list).
pub const MAX_ADDRESSES_PER_LIST: usize = 1_000;
/// Longest namespace, Service name or port name (each a DNS label in Kubernetes).
pub const MAX_NAME_PART: usize = 63;
/// Longest node name (a DNS subdomain in Kubernetes).
pub const MAX_NODE_NAME: usize = 253;
/// Longest zone (a label value in Kubernetes).
pub const MAX_ZONE: usize = 63;
/// Longest revision (the CRD's `maxLength`).
pub const MAX_REVISION: usize = 64;
/// Longest `namespace/name` of a Service slice (a 253-character namespace is refused by the API
/// server long before; 63 + 1 + 253 keeps this generous).
pub const MAX_SERVICE_KEY: usize = 317;
/// Longest value quoted whole in a problem's message; longer ones are cut and their length given.
pub const MAX_SHOWN: usize = 64;
/// Longest ClientIP affinity timeout the API allows (one day).
pub const MAX_AFFINITY_SECONDS: u32 = 86_400;

/// One problem, with the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// e.g. `spec.services[3].endpoints[0].ip`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The result of validating a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Problems that make the whole plan unusable.
    pub plan: Vec<Problem>,
    /// Problems per entry index; such entries are skipped, the rest applied.
    pub entries: Vec<(usize, Vec<Problem>)>,
}

impl Report {
    /// No problems at all.
    pub fn is_clean(&self) -> bool {
        self.plan.is_empty() && self.entries.is_empty()
    }

    /// Indexes of the entries that must be skipped.
    pub fn bad_entries(&self) -> HashSet<usize> {
        self.entries.iter().map(|(i, _)| *i).collect()
    }

    /// Every problem, plan-level first.
    pub fn all(&self) -> impl Iterator<Item = &Problem> {
        self.plan
            .iter()
            .chain(self.entries.iter().flat_map(|(_, p)| p.iter()))
    }
}

/// A value as a message quotes it: whole when short, else its start, `…` and its length.
pub struct Shown<'a>(pub &'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Start(self.0))?;
        if self.0.len() > MAX_SHOWN {
            write!(f, " ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

/// A value as is when short (names and addresses in messages that always had them bare), else as
/// [`Shown`].
struct Bare<'a>(&'a str);

impl std::fmt::Display for Bare<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.len() <= MAX_SHOWN {
            f.write_str(self.0)
        } else {
            Shown(self.0).fmt(f)
        }
    }
}

/// A value quoted whole when short, else its start and `…` (the message gives the length itself).
struct Start<'a>(&'a str);

impl std::fmt::Display for Start<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0;
        if text.len() <= MAX_SHOWN {
            return write!(f, "{text:?}");
        }
        let mut end = MAX_SHOWN / 2;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "\"{}…\"", text[..end].escape_debug())
    }
}

/// A problem when `text` is longer than `max` bytes.
fn too_long(what: &str, text: &str, max: usize) -> Option<String> {
    (text.len() > max).then(|| {
        format!(
            "{what} {} is {} bytes, longer than the {max} allowed",
            Start(text),
            text.len()
        )
    })
}

struct Collector<'a> {
    problems: &'a mut Vec<Problem>,
    /// `spec.` followed by this, e.g. `services`.
    field: &'static str,
    /// The entry index within `field`, when collecting an entry's problems.
    index: Option<usize>,
}

impl Collector<'_> {
    fn push(&mut self, field: impl std::fmt::Display, message: impl Into<String>) {
        let path = match self.index {
            Some(index) => format!("spec.{}[{index}].{field}", self.field),
            None => format!("spec.{field}"),
        };
        self.problems.push(Problem {
            path,
            message: message.into(),
        });
    }

    fn ip(&mut self, field: impl std::fmt::Display, text: &str, family: Option<IpFamily>) -> Option<IpAddr> {
        match parse_ip_strict(text) {
            None => {
                self.push(field, format!("{} is not a canonical IP address", Shown(text)));
                None
            }
            Some(ip) if family.is_some_and(|f| f != IpFamily::of(&ip)) => {
                self.push(
                    field,
                    format!("{text} is not {:?}", family.unwrap_or(IpFamily::IPv4)),
                );
                None
            }
            Some(ip) => Some(ip),
        }
    }

    fn cidr(&mut self, field: impl std::fmt::Display, text: &str, family: Option<IpFamily>) {
        match parse_cidr_strict(text) {
            None => self.push(field, format!("{} is not a canonical CIDR", Shown(text))),
            Some(net) if family.is_some_and(|f| f != IpFamily::of(&net.addr())) => self.push(
                field,
                format!("{text} is not {:?}", family.unwrap_or(IpFamily::IPv4)),
            ),
            Some(_) => {}
        }
    }

    /// A problem when `text` is longer than `max` bytes.
    fn length(&mut self, field: impl std::fmt::Display, what: &str, text: &str, max: usize) {
        if let Some(message) = too_long(what, text, max) {
            self.push(field, message);
        }
    }

    /// A problem when `list` holds more than `max` items; true when it does (skip its items then).
    fn count(&mut self, field: impl std::fmt::Display, what: &str, len: usize, max: usize) -> bool {
        if len > max {
            self.push(field, format!("{len} {what} exceed the limit of {max}"));
        }
        len > max
    }
}

/// Validates a plan spec: the header, and the entries of `services` or (live plans) `overrides`, whose
/// indexes the report gives. Never panics, whatever the input.
pub fn validate(spec: &NodeForwardingPlanSpec) -> Report {
    let mut report = Report::default();
    validate_header(spec, &mut report.plan);
    let (field, entries) = if spec.views.is_empty() {
        ("services", &spec.services)
    } else {
        ("overrides", &spec.overrides)
    };
    report.entries = validate_entries(field, entries);
    report
}

/// Validates a ForwardingSlice spec: its header and every entry. Never panics, whatever the input.
pub fn validate_slice(spec: &ForwardingSliceSpec) -> Report {
    let mut report = validate_slice_header(spec);
    if report.plan.is_empty() {
        report.entries = validate_entries("entries", &spec.entries);
    }
    report
}

/// Validates what makes a whole ForwardingSlice unusable (view, index, count, revision, entry count),
/// not its entries: the agent validates those once, in the composed plan. Never panics.
pub fn validate_slice_header(spec: &ForwardingSliceSpec) -> Report {
    let mut report = Report::default();
    let mut c = Collector {
        problems: &mut report.plan,
        field: "",
        index: None,
    };
    c.length("view", "view", &spec.view, 63);
    if let Some(zone) = &spec.zone {
        c.length("zone", "zone", zone, MAX_ZONE);
    }
    if let Some(node) = &spec.node {
        c.length("node", "node", node, MAX_NODE_NAME);
    }
    if View::of_slice(spec).is_none() {
        let shown = |value: &Option<String>| {
            value
                .as_deref()
                .map_or("none".to_string(), |v| Shown(v).to_string())
        };
        c.push(
            "view",
            format!(
                "{} does not match zone {} and node {}",
                Shown(&spec.view),
                shown(&spec.zone),
                shown(&spec.node)
            ),
        );
    }
    if spec.count == 0 || spec.count > MAX_SLICES_PER_VIEW {
        c.push(
            "count",
            format!("{} is not in 1..{MAX_SLICES_PER_VIEW}", spec.count),
        );
    }
    if spec.index >= spec.count {
        c.push(
            "index",
            format!("{} is not below count {}", spec.index, spec.count),
        );
    }
    if let Some(service) = &spec.service {
        c.length("service", "service", service, MAX_SERVICE_KEY);
        if service
            .split_once('/')
            .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty())
        {
            c.push("service", format!("{} is not namespace/name", Shown(service)));
        } else if let Some((index, entry)) = spec
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.service_key() != service)
        {
            // A Service slice replaces its Service's entries and nothing else.
            c.push(
                "entries",
                format!(
                    "entries[{index}] {} is not of the slice's Service {}",
                    Shown(&entry.name),
                    Shown(service)
                ),
            );
        }
    }
    if spec.revision.is_empty() {
        c.push("revision", "must not be empty");
    }
    c.length("revision", "revision", &spec.revision, MAX_REVISION);
    c.count("entries", "entries", spec.entries.len(), MAX_ENTRIES);
    report
}

fn validate_entries(field: &'static str, entries: &[Arc<ServicePlan>]) -> Vec<(usize, Vec<Problem>)> {
    let mut out = Vec::new();
    if entries.len() > MAX_ENTRIES {
        return out;
    }
    let mut seen = HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let mut problems = Vec::new();
        let mut c = Collector {
            problems: &mut problems,
            field,
            index: Some(index),
        };
        if !seen.insert(entry.key()) {
            c.push(
                "name",
                format!(
                    "duplicate entry {} {:?} {:?}",
                    Bare(&entry.name),
                    entry.protocol,
                    entry.family
                ),
            );
        }
        validate_entry(entry, &mut c);
        if !problems.is_empty() {
            out.push((index, problems));
        }
    }
    out
}

fn validate_header(spec: &NodeForwardingPlanSpec, problems: &mut Vec<Problem>) {
    let mut c = Collector {
        problems,
        field: "",
        index: None,
    };
    if spec.node_name.is_empty() || spec.node_name.len() > MAX_NODE_NAME {
        c.push(
            "nodeName",
            format!(
                "must be 1..{MAX_NODE_NAME} characters, not {} ({})",
                spec.node_name.len(),
                Start(&spec.node_name)
            ),
        );
    }
    if spec.revision.is_empty() {
        c.push("revision", "must not be empty");
    }
    c.length("revision", "revision", &spec.revision, MAX_REVISION);
    if let Some(zone) = &spec.zone {
        c.length("zone", "zone", zone, MAX_ZONE);
    }
    // At most one per family, 16 NodePort address values (the CRD's maxItems): the items of a longer
    // list are not looked at.
    let node_ips = !c.count("nodeIPs", "addresses", spec.node_ips.len(), 2);
    let pod_cidrs = !c.count("podCIDRs", "CIDRs", spec.pod_cidrs.len(), 2);
    let local_cidrs = !c.count(
        "cluster.localTrafficCIDRs",
        "CIDRs",
        spec.cluster.local_traffic_cidrs.len(),
        2,
    );
    let node_port_addresses = !c.count(
        "cluster.nodePortAddresses",
        "values",
        spec.cluster.node_port_addresses.len(),
        16,
    );
    for (i, ip) in spec.node_ips.iter().enumerate().filter(|_| node_ips) {
        c.ip(format_args!("nodeIPs[{i}]"), ip, None);
    }
    for (i, cidr) in spec.pod_cidrs.iter().enumerate().filter(|_| pod_cidrs) {
        c.cidr(format_args!("podCIDRs[{i}]"), cidr, None);
    }
    for (i, cidr) in spec
        .cluster
        .local_traffic_cidrs
        .iter()
        .enumerate()
        .filter(|_| local_cidrs)
    {
        c.cidr(format_args!("cluster.localTrafficCIDRs[{i}]"), cidr, None);
    }
    match (spec.cluster.detect_local, &spec.cluster.local_traffic_interface) {
        (DetectLocalMode::BridgeInterface | DetectLocalMode::InterfaceNamePrefix, None) => c.push(
            "cluster.localTrafficInterface",
            format!(
                "detectLocal {:?} needs an interface name",
                spec.cluster.detect_local
            ),
        ),
        (DetectLocalMode::BridgeInterface | DetectLocalMode::InterfaceNamePrefix, Some(name)) => {
            if let Err(why) = check_interface_name(name) {
                c.push("cluster.localTrafficInterface", format!("{} {why}", Start(name)));
            }
        }
        (_, Some(_)) => c.push(
            "cluster.localTrafficInterface",
            format!("detectLocal {:?} reads no interface", spec.cluster.detect_local),
        ),
        (_, None) => {}
    }
    if !c.count(
        "cluster.serviceCIDRs",
        "CIDRs",
        spec.cluster.service_cidrs.len(),
        64,
    ) {
        for (i, cidr) in spec.cluster.service_cidrs.iter().enumerate() {
            c.cidr(format_args!("cluster.serviceCIDRs[{i}]"), cidr, None);
        }
    }
    if spec.cluster.masquerade_bit > 31 {
        c.push(
            "cluster.masqueradeBit",
            format!("{} is not in 0..31", spec.cluster.masquerade_bit),
        );
    }
    for (i, value) in spec
        .cluster
        .node_port_addresses
        .iter()
        .enumerate()
        .filter(|_| node_port_addresses)
    {
        if value != "primary" {
            c.cidr(format_args!("cluster.nodePortAddresses[{i}]"), value, None);
        }
    }
    if let Some(s) = &spec.cluster.ipvs_scheduler
        && !IPVS_SCHEDULERS.contains(&s.as_str())
    {
        c.push(
            "cluster.ipvsScheduler",
            format!("unknown IPVS scheduler {}", Shown(s)),
        );
    }
    if !spec.views.is_empty() && !spec.services.is_empty() {
        c.push("services", "a plan with views carries overrides, not services");
    }
    if spec.views.is_empty() && !spec.overrides.is_empty() {
        c.push("overrides", "overrides without views override nothing");
    }
    if spec.views.is_empty() && !spec.local_endpoints.is_empty() {
        c.push("localEndpoints", "local endpoints without views amend nothing");
    }
    let mut locals = HashSet::new();
    for (i, local) in spec.local_endpoints.iter().take(MAX_ENTRIES).enumerate() {
        if !locals.insert(local.key()) {
            c.push(
                format_args!("localEndpoints[{i}]"),
                format!("duplicate entry {}", Bare(&local.name)),
            );
        }
        if local.endpoints.len() > MAX_ENDPOINTS_PER_ENTRY {
            c.push(
                format_args!("localEndpoints[{i}].endpoints"),
                format!(
                    "{} endpoints exceed the limit of {MAX_ENDPOINTS_PER_ENTRY}",
                    local.endpoints.len()
                ),
            );
            continue;
        }
        for (j, ep) in local.endpoints.iter().enumerate() {
            c.ip(
                format_args!("localEndpoints[{i}].endpoints[{j}].ip"),
                &ep.ip,
                Some(local.family),
            );
            if ep.port == 0 {
                c.push(
                    format_args!("localEndpoints[{i}].endpoints[{j}].port"),
                    "must be 1..65535",
                );
            }
        }
    }
    if spec.views.len() > 8 {
        c.push(
            "views",
            format!("{} views exceed the limit of 8", spec.views.len()),
        );
    }
    let mut views = HashSet::new();
    for (i, view) in spec.views.iter().take(8).enumerate() {
        if !views.insert(view) {
            c.push(
                format_args!("views[{i}]"),
                format!("duplicate view {}", Shown(view)),
            );
        }
        if !valid_view_id(view) {
            c.push(
                format_args!("views[{i}]"),
                format!("{} is not a view id", Shown(view)),
            );
        }
    }
    if spec.endpoints_on_node.len() > MAX_ENTRIES {
        c.push(
            "endpointsOnNode",
            format!(
                "{} addresses exceed the limit of {MAX_ENTRIES}",
                spec.endpoints_on_node.len()
            ),
        );
    } else {
        for (i, ip) in spec.endpoints_on_node.iter().enumerate() {
            c.ip(format_args!("endpointsOnNode[{i}]"), ip, None);
        }
    }
    if spec.local_endpoints.len() > MAX_ENTRIES {
        c.push(
            "localEndpoints",
            format!(
                "{} entries exceed the limit of {MAX_ENTRIES}",
                spec.local_endpoints.len()
            ),
        );
    }
    for (field, entries) in [("services", &spec.services), ("overrides", &spec.overrides)] {
        if entries.len() > MAX_ENTRIES {
            c.push(
                field,
                format!("{} entries exceed the limit of {MAX_ENTRIES}", entries.len()),
            );
        }
    }
}

/// `all`, `unzoned`, or `zone-…` / `node-…` with a label-safe rest (what a label selector can carry).
pub fn valid_view_id(id: &str) -> bool {
    let label_safe = |rest: &str| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && rest.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    id.len() <= 63
        && (id == "all"
            || id == "unzoned"
            || id.strip_prefix("zone-").is_some_and(label_safe)
            || id.strip_prefix("node-").is_some_and(label_safe))
}

fn validate_entry(entry: &ServicePlan, c: &mut Collector<'_>) {
    let family = Some(entry.family);
    if let Err(why) = check_service_port_name(&entry.name) {
        c.push("name", why);
    }
    c.ip("clusterIP", &entry.cluster_ip, family);
    if entry.port == 0 {
        c.push("port", "must be 1..65535");
    }
    if entry.node_port == Some(0) {
        c.push("nodePort", "must be 1..65535");
    }
    if entry.health_check_node_port == Some(0) {
        c.push("healthCheckNodePort", "must be 1..65535");
    }
    let lists = [
        ("externalIPs", "addresses", &entry.external_ips),
        ("loadBalancerIPs", "addresses", &entry.load_balancer_ips),
        ("sourceRanges", "CIDRs", &entry.source_ranges),
    ];
    for (field, what, list) in lists {
        if c.count(field, what, list.len(), MAX_ADDRESSES_PER_LIST) {
            continue;
        }
        for (i, text) in list.iter().enumerate() {
            if what == "CIDRs" {
                c.cidr(format_args!("{field}[{i}]"), text, family);
            } else {
                c.ip(format_args!("{field}[{i}]"), text, family);
            }
        }
    }
    if let Some(t) = entry.affinity_timeout_seconds
        && (t == 0 || t > MAX_AFFINITY_SECONDS)
    {
        c.push(
            "affinityTimeoutSeconds",
            format!("{t} is not in 1..{MAX_AFFINITY_SECONDS}"),
        );
    }
    if let Some(s) = &entry.scheduler
        && !IPVS_SCHEDULERS.contains(&s.as_str())
    {
        c.push("scheduler", format!("unknown IPVS scheduler {}", Shown(s)));
    }
    if !c.count(
        "unreadyIPs",
        "addresses",
        entry.unready_ips.len(),
        MAX_ENDPOINTS_PER_ENTRY,
    ) {
        for (i, text) in entry.unready_ips.iter().enumerate() {
            c.ip(format_args!("unreadyIPs[{i}]"), text, family);
        }
    }
    if entry.endpoints.len() > MAX_ENDPOINTS_PER_ENTRY {
        c.push(
            "endpoints",
            format!(
                "{} endpoints exceed the limit of {MAX_ENDPOINTS_PER_ENTRY}",
                entry.endpoints.len()
            ),
        );
        return;
    }
    // A set only for long lists: most entries have a handful of endpoints, where a scan is cheaper.
    let scan = entry.endpoints.len() <= 16;
    let mut seen = HashSet::new();
    for (i, ep) in entry.endpoints.iter().enumerate() {
        c.ip(format_args!("endpoints[{i}].ip"), &ep.ip, family);
        if ep.port == 0 {
            c.push(format_args!("endpoints[{i}].port"), "must be 1..65535");
        }
        if ep.weight == Some(0) {
            c.push(format_args!("endpoints[{i}].weight"), "must be 1..65535");
        }
        let duplicate = if scan {
            entry.endpoints[..i]
                .iter()
                .any(|o| o.ip == ep.ip && o.port == ep.port)
        } else {
            !seen.insert((&ep.ip, ep.port))
        };
        if duplicate {
            c.push(
                format_args!("endpoints[{i}]"),
                format!("duplicate endpoint {}:{}", Bare(&ep.ip), ep.port),
            );
        }
        if ep.local && !ep.on_node {
            c.push(
                format_args!("endpoints[{i}].local"),
                "a Local-policy endpoint must be on this node",
            );
        }
        if (ep.cluster || ep.local) && !entry.has_endpoints {
            c.push(
                format_args!("endpoints[{i}]"),
                "used by a policy although hasEndpoints is false",
            );
        }
    }
    let uses_cluster = entry.internal_policy == TrafficPolicy::Cluster || entry.externally_accessible();
    if entry.has_endpoints && uses_cluster && entry.cluster_endpoints().next().is_none() {
        c.push(
            "endpoints",
            "hasEndpoints is true but no endpoint is used by the Cluster policy",
        );
    }
}

/// `namespace/name[:port]`, each part at most [`MAX_NAME_PART`] bytes (Kubernetes DNS labels): the name
/// goes into rule comments and chain-name hashes, and into status.
fn check_service_port_name(name: &str) -> Result<(), String> {
    let (service, port) = name.split_once(':').unwrap_or((name, ""));
    let Some((ns, n)) = service
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        return Err(format!("{} is not namespace/name[:port]", Shown(name)));
    };
    for (what, part) in [("namespace", ns), ("Service name", n), ("port name", port)] {
        if let Some(why) = too_long(what, part, MAX_NAME_PART) {
            return Err(why);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Backend, ClusterSettings, DetectLocalMode, PlanEndpoint, PlanSummary, Protocol};

    fn ep(ip: &str) -> PlanEndpoint {
        PlanEndpoint {
            ip: ip.into(),
            port: 80,
            cluster: true,
            local: false,
            on_node: false,
            terminating: false,
            weight: None,
        }
    }

    fn entry() -> ServicePlan {
        ServicePlan {
            name: "ns1/svc1:p80".into(),
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            cluster_ip: "172.30.0.41".into(),
            port: 80,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            affinity_timeout_seconds: None,
            external_policy: TrafficPolicy::Cluster,
            internal_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            scheduler: None,
            unready_ips: vec![],
            keep_connections: false,
            has_endpoints: true,
            endpoints: vec![ep("10.180.0.1")],
        }
    }

    fn spec(services: Vec<ServicePlan>) -> NodeForwardingPlanSpec {
        NodeForwardingPlanSpec {
            node_name: "node-a".into(),
            zone: None,
            node_ips: vec!["192.168.0.2".into()],
            pod_cidrs: vec!["10.180.0.0/24".into()],
            backend: Backend::Iptables,
            cluster: ClusterSettings {
                detect_local: DetectLocalMode::ClusterCIDR,
                local_traffic_cidrs: vec!["10.0.0.0/8".into()],
                local_traffic_interface: None,
                service_cidrs: vec![],
                localhost_node_ports: false,
                masquerade_all: false,
                masquerade_bit: 14,
                node_port_addresses: vec![],
                ipvs_scheduler: None,
            },
            leaving: None,
            revision: "abc".into(),
            views: vec![],
            endpoints_on_node: vec![],
            local_endpoints: vec![],
            summary: PlanSummary::default(),
            overrides: vec![],
            services: services.into_iter().map(Arc::new).collect(),
        }
    }

    #[test]
    fn a_good_plan_is_clean() {
        assert_eq!(validate(&spec(vec![entry()])), Report::default());
    }

    #[test]
    fn entry_problems_name_their_path_and_spare_other_entries() {
        type Mutate = fn(&mut ServicePlan);
        let cases: Vec<(&str, Mutate, &str)> = vec![
            (
                "bad cluster IP",
                |e| e.cluster_ip = "10.0.0.300".into(),
                "spec.services[1].clusterIP",
            ),
            (
                "wrong family",
                |e| e.cluster_ip = "fd00::1".into(),
                "spec.services[1].clusterIP",
            ),
            (
                "leading zeros",
                |e| e.cluster_ip = "010.0.0.1".into(),
                "spec.services[1].clusterIP",
            ),
            ("port zero", |e| e.port = 0, "spec.services[1].port"),
            (
                "node port zero",
                |e| e.node_port = Some(0),
                "spec.services[1].nodePort",
            ),
            (
                "bad external IP",
                |e| e.external_ips = vec!["x".into()],
                "spec.services[1].externalIPs[0]",
            ),
            (
                "unready address of the other family",
                |e| e.unready_ips = vec!["10.180.0.9".into(), "fd00::9".into()],
                "spec.services[1].unreadyIPs[1]",
            ),
            (
                "bad LB IP",
                |e| e.load_balancer_ips = vec!["1.2.3".into()],
                "spec.services[1].loadBalancerIPs[0]",
            ),
            (
                "bad range",
                |e| e.source_ranges = vec!["10.0.0.1/8".into()],
                "spec.services[1].sourceRanges[0]",
            ),
            (
                "affinity 0",
                |e| e.affinity_timeout_seconds = Some(0),
                "spec.services[1].affinityTimeoutSeconds",
            ),
            (
                "scheduler",
                |e| e.scheduler = Some("fastest".into()),
                "spec.services[1].scheduler",
            ),
            (
                "bad endpoint",
                |e| e.endpoints[0].ip = "nope".into(),
                "spec.services[1].endpoints[0].ip",
            ),
            (
                "endpoint port",
                |e| e.endpoints[0].port = 0,
                "spec.services[1].endpoints[0].port",
            ),
            (
                "endpoint weight",
                |e| e.endpoints[0].weight = Some(0),
                "spec.services[1].endpoints[0].weight",
            ),
            (
                "dup endpoint",
                |e| e.endpoints.push(ep("10.180.0.1")),
                "spec.services[1].endpoints[1]",
            ),
            (
                "remote local",
                |e| e.endpoints[0].local = true,
                "spec.services[1].endpoints[0].local",
            ),
            ("name", |e| e.name = "svc1".into(), "spec.services[1].name"),
            (
                "too many endpoints",
                |e| e.endpoints = (0..=MAX_ENDPOINTS_PER_ENTRY).map(|_| ep("10.0.0.1")).collect(),
                "spec.services[1].endpoints",
            ),
            (
                "no cluster set",
                |e| e.endpoints[0].cluster = false,
                "spec.services[1].endpoints",
            ),
            (
                "long Service name",
                |e| e.name = format!("ns1/{}:p80", "s".repeat(MAX_NAME_PART + 1)),
                "spec.services[1].name",
            ),
            (
                "long port name",
                |e| e.name = format!("ns1/svc2:{}", "p".repeat(MAX_NAME_PART + 1)),
                "spec.services[1].name",
            ),
            (
                "too many source ranges",
                |e| e.source_ranges = vec!["198.51.100.0/24".into(); MAX_ADDRESSES_PER_LIST + 1],
                "spec.services[1].sourceRanges",
            ),
            (
                "too many externalIPs",
                |e| e.external_ips = vec!["203.0.113.1".into(); MAX_ADDRESSES_PER_LIST + 1],
                "spec.services[1].externalIPs",
            ),
            (
                "IPv6 endpoint in an IPv4 entry",
                |e| e.endpoints[0].ip = "fd00:10:244::1".into(),
                "spec.services[1].endpoints[0].ip",
            ),
            (
                "IPv4 endpoint in an IPv6 entry",
                |e| {
                    e.family = IpFamily::IPv6;
                    e.cluster_ip = "fd00:10:96::1".into();
                },
                "spec.services[1].endpoints[0].ip",
            ),
            (
                "flags without endpoints",
                |e| e.has_endpoints = false,
                "spec.services[1].endpoints[0]",
            ),
        ];
        for (name, mutate, path) in cases {
            let mut bad = entry();
            bad.name = "ns1/svc2:p80".into();
            mutate(&mut bad);
            let mut good = entry();
            good.name = "ns1/svc0:p80".into();
            let report = validate(&spec(vec![good, bad]));
            assert!(report.plan.is_empty(), "{name}: {:?}", report.plan);
            assert_eq!(report.bad_entries(), HashSet::from([1]), "{name}");
            let paths: Vec<&str> = report.all().map(|p| p.path.as_str()).collect();
            assert!(paths.contains(&path), "{name}: {paths:?}");
        }
    }

    #[test]
    fn duplicate_entries_are_reported_once() {
        let report = validate(&spec(vec![entry(), entry()]));
        assert_eq!(report.bad_entries(), HashSet::from([1]));
    }

    #[test]
    fn header_problems_reject_the_plan() {
        type Mutate = fn(&mut NodeForwardingPlanSpec);
        let cases: Vec<(Mutate, &str)> = vec![
            (|s| s.node_name = String::new(), "spec.nodeName"),
            (|s| s.revision = String::new(), "spec.revision"),
            (|s| s.node_ips = vec!["x".into()], "spec.nodeIPs[0]"),
            (|s| s.pod_cidrs = vec!["10.0.0.0/99".into()], "spec.podCIDRs[0]"),
            (
                |s| s.cluster.local_traffic_cidrs = vec!["10.0.0.1/8".into()],
                "spec.cluster.localTrafficCIDRs[0]",
            ),
            (|s| s.cluster.masquerade_bit = 40, "spec.cluster.masqueradeBit"),
            (
                |s| s.cluster.detect_local = DetectLocalMode::BridgeInterface,
                "spec.cluster.localTrafficInterface",
            ),
            (
                |s| {
                    s.cluster.detect_local = DetectLocalMode::InterfaceNamePrefix;
                    s.cluster.local_traffic_interface = Some("veth\"; drop".into());
                },
                "spec.cluster.localTrafficInterface",
            ),
            (
                |s| s.cluster.local_traffic_interface = Some("cbr0".into()),
                "spec.cluster.localTrafficInterface",
            ),
            (
                |s| s.cluster.service_cidrs = vec!["10.96.0.1/12".into()],
                "spec.cluster.serviceCIDRs[0]",
            ),
            (
                |s| s.cluster.service_cidrs = vec!["10.96.0.0/12".into(); 65],
                "spec.cluster.serviceCIDRs",
            ),
            (
                |s| s.cluster.node_port_addresses = vec!["everything".into()],
                "spec.cluster.nodePortAddresses[0]",
            ),
            (|s| s.views = vec!["all".into()], "spec.services"),
            (|s| s.overrides = vec![Arc::new(entry())], "spec.overrides"),
            (
                |s| {
                    s.views = vec!["all".into(), "all".into()];
                    s.overrides = std::mem::take(&mut s.services);
                },
                "spec.views[1]",
            ),
            (
                |s| {
                    s.views = vec!["Zone_A".into()];
                    s.overrides = std::mem::take(&mut s.services);
                },
                "spec.views[0]",
            ),
            (
                |s| s.endpoints_on_node = vec!["10.0.0.300".into()],
                "spec.endpointsOnNode[0]",
            ),
            (|s| s.revision = "r".repeat(MAX_REVISION + 1), "spec.revision"),
            (|s| s.zone = Some("z".repeat(MAX_ZONE + 1)), "spec.zone"),
            (|s| s.node_name = "n".repeat(MAX_NODE_NAME + 1), "spec.nodeName"),
            (|s| s.node_ips = vec!["192.168.0.2".into(); 3], "spec.nodeIPs"),
            (
                |s| s.cluster.node_port_addresses = vec!["primary".into(); 17],
                "spec.cluster.nodePortAddresses",
            ),
        ];
        for (mutate, path) in cases {
            let mut s = spec(vec![entry()]);
            mutate(&mut s);
            let report = validate(&s);
            assert!(
                report.plan.iter().any(|p| p.path == path),
                "{path}: {:?}",
                report.plan
            );
        }
    }

    #[test]
    fn live_plans_validate_their_overrides() {
        let mut s = spec(vec![]);
        s.views = vec!["all".into(), "zone-a".into()];
        let mut bad = entry();
        bad.name = "ns1/svc2:p80".into();
        bad.port = 0;
        s.overrides = vec![Arc::new(entry()), Arc::new(bad)];
        let report = validate(&s);
        assert!(report.plan.is_empty(), "{:?}", report.plan);
        let paths: Vec<&str> = report.all().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["spec.overrides[1].port"]);
    }

    #[test]
    fn slice_problems_reject_the_slice_and_entry_problems_name_the_entry() {
        let good = || ForwardingSliceSpec {
            view: "zone-a".into(),
            zone: Some("a".into()),
            node: None,
            service: None,
            index: 0,
            count: 2,
            revision: "abc".into(),
            summary: PlanSummary::default(),
            entries: vec![Arc::new(entry())],
        };
        assert!(validate_slice(&good()).is_clean());
        type Mutate = fn(&mut ForwardingSliceSpec);
        let cases: Vec<(Mutate, &str)> = vec![
            (|s| s.view = "zone-b".into(), "spec.view"),
            (|s| s.count = 0, "spec.count"),
            (|s| s.count = MAX_SLICES_PER_VIEW + 1, "spec.count"),
            (|s| s.index = 2, "spec.index"),
            (|s| s.revision = String::new(), "spec.revision"),
            (
                |s| s.entries = (0..=MAX_ENTRIES).map(|_| Arc::new(entry())).collect(),
                "spec.entries",
            ),
            (|s| s.revision = "r".repeat(MAX_REVISION + 1), "spec.revision"),
            (|s| s.zone = Some("z".repeat(MAX_ZONE + 1)), "spec.zone"),
            (|s| s.service = Some("no-slash".into()), "spec.service"),
            (|s| s.service = Some("/svc1".into()), "spec.service"),
            (|s| s.service = Some("ns1/".into()), "spec.service"),
            (
                |s| s.service = Some(format!("ns1/{}", "s".repeat(MAX_SERVICE_KEY))),
                "spec.service",
            ),
            // A Service slice carries its own Service's entries only.
            (|s| s.service = Some("ns1/other".into()), "spec.entries"),
        ];
        for (mutate, path) in cases {
            let mut s = good();
            mutate(&mut s);
            let report = validate_slice(&s);
            assert!(report.plan.iter().any(|p| p.path == path), "{path}: {report:?}");
        }
        let mut service_slice = good();
        service_slice.service = Some("ns1/svc1".into());
        assert!(
            validate_slice(&service_slice).is_clean(),
            "its own Service's entries"
        );
        service_slice.entries.clear();
        assert!(
            validate_slice(&service_slice).is_clean(),
            "empty: the Service has no entries"
        );
        let mut s = good();
        Arc::make_mut(&mut s.entries[0]).cluster_ip = "nope".into();
        let report = validate_slice(&s);
        assert!(report.plan.is_empty());
        assert_eq!(report.entries[0].1[0].path, "spec.entries[0].clusterIP");
    }

    #[test]
    fn a_ten_megabyte_value_is_refused_in_a_message_that_stays_short() {
        let huge = "a".repeat(10 << 20);
        type Mutate = fn(&mut ServicePlan, &str);
        let cases: Vec<(Mutate, &str, &str)> = vec![
            (
                |e, h| e.name = format!("ns1/{h}:p80"),
                "spec.services[1].name",
                "Service name \"aaaa",
            ),
            (
                |e, h| e.name = format!("ns1/svc2:{h}"),
                "spec.services[1].name",
                "port name",
            ),
            (
                |e, h| e.name = h.to_string(),
                "spec.services[1].name",
                "is not namespace/name[:port]",
            ),
            (
                |e, h| e.cluster_ip = h.to_string(),
                "spec.services[1].clusterIP",
                "is not a canonical IP address",
            ),
            (
                |e, h| e.scheduler = Some(h.to_string()),
                "spec.services[1].scheduler",
                "unknown IPVS scheduler",
            ),
            (
                |e, h| e.endpoints[0].ip = h.to_string(),
                "spec.services[1].endpoints[0].ip",
                "is not a canonical IP address",
            ),
        ];
        for (mutate, path, want) in cases {
            let mut bad = entry();
            bad.name = "ns1/svc2:p80".into();
            mutate(&mut bad, &huge);
            let report = validate(&spec(vec![entry(), bad]));
            assert!(report.plan.is_empty(), "{path}: {:?}", report.plan);
            let problem = report
                .all()
                .find(|p| p.path == path)
                .unwrap_or_else(|| panic!("{path}"));
            assert!(problem.message.contains(want), "{path}: {}", problem.message);
            assert!(
                problem.message.contains(&format!("{} bytes", 10 << 20))
                    || problem.message.contains("bytes, longer than"),
                "the length is said: {}",
                problem.message
            );
            assert!(
                problem.message.len() < 200,
                "{path}: {} bytes",
                problem.message.len()
            );
        }
        let mut s = spec(vec![entry()]);
        s.revision = huge.clone();
        let report = validate(&s);
        assert_eq!(report.plan.len(), 1, "{:?}", report.plan);
        assert_eq!(report.plan[0].path, "spec.revision");
        assert!(
            report.plan[0]
                .message
                .contains("bytes, longer than the 64 allowed"),
            "{}",
            report.plan[0].message
        );
        assert!(report.plan[0].message.len() < 200);
    }

    #[test]
    fn a_zero_source_range_is_a_valid_cidr() {
        // kube-proxy reads it as "allow every source"; the agent opens such an entry when it reads the
        // plan (plan::open_zero_source_ranges), and validation accepts it either way.
        let mut e = entry();
        e.load_balancer_ips = vec!["203.0.113.1".into()];
        e.source_ranges = vec!["0.0.0.0/0".into()];
        assert!(validate(&spec(vec![e.clone()])).is_clean());
        e.source_ranges = vec!["::/0".into()];
        let report = validate(&spec(vec![e]));
        assert_eq!(report.all().next().unwrap().message, "::/0 is not IPv4");
    }

    #[test]
    fn too_many_entries_are_refused_while_read() {
        let mut s = spec(vec![]);
        s.services = (0..=MAX_ENTRIES)
            .map(|i| {
                let mut e = entry();
                e.name = format!("ns/s{i}");
                Arc::new(e)
            })
            .collect();
        assert!(validate(&s).plan.iter().any(|p| p.path == "spec.services"));
        let json = serde_json::to_string(&s).unwrap();
        let error = serde_json::from_str::<NodeForwardingPlanSpec>(&json)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("more than 100000 entries, the most one object may hold"),
            "{error}"
        );
        s.services.truncate(MAX_ENTRIES);
        let back: NodeForwardingPlanSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.services.len(), MAX_ENTRIES);
    }

    #[test]
    fn local_only_service_without_local_endpoints_is_valid() {
        let mut e = entry();
        e.internal_policy = TrafficPolicy::Local;
        e.endpoints[0].cluster = false;
        assert!(validate(&spec(vec![e])).is_clean());
    }
}
