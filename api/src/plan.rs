//! The `NodeForwardingPlan` spec: what one node must forward, already resolved for that node.
//!
//! One entry per (Service, port name, protocol, IP family) — kube-proxy's "ServicePort", split by family
//! because kube-proxy runs one proxier per family and decides "has endpoints" per family. Endpoints are
//! listed once per entry with flags saying which set each belongs to, exactly as kube-proxy's
//! `CategorizeEndpoints` left them for this node. The agent makes no policy decisions.
//!
//! ```text
//! live plan (controller):  header + views [all, zone-a] + endpointsOnNode + localEndpoints + overrides
//!                                    │            ▲ ForwardingSlices of those views (crate::slice)
//!                                    ▼            │
//! crate::compose ─────────► self-contained plan: header + services (every entry, onNode resolved)
//!                                    ▲
//! plan file / `plan --node`: the same self-contained form (no views)
//! ```

use std::sync::Arc;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::backend::Backend;
use crate::status::NodeForwardingPlanStatus;

/// The desired forwarding state of one node. Written only by the controller.
// kube-derive's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "switchyard.io",
    version = "v1alpha2",
    kind = "NodeForwardingPlan",
    plural = "nodeforwardingplans",
    singular = "nodeforwardingplan",
    shortname = "nfp",
    category = "switchyard",
    status = "NodeForwardingPlanStatus",
    derive = "PartialEq",
    doc = "What one node forwards: the shared ForwardingSlice views it composes plus the entries where this \
           node differs from them (traffic policy, session affinity and topology already resolved), and, in \
           status, what the node's agent actually applied.",
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backend",
        description = "Backend the plan asks for"
    ),
    printcolumn(
        name = "Services",
        type_ = "integer",
        json_path = ".status.services",
        description = "Service entries the agent programmed (views and overrides composed)"
    ),
    printcolumn(
        name = "Endpoints",
        type_ = "integer",
        json_path = ".status.endpoints",
        description = "Endpoints the agent programmed"
    ),
    printcolumn(
        name = "Desired",
        type_ = "string",
        json_path = ".spec.revision",
        description = "Revision of this plan the controller wrote"
    ),
    printcolumn(
        name = "Observed",
        type_ = "string",
        json_path = ".status.observedRevision",
        description = "Plan revision the agent last applied"
    ),
    printcolumn(
        name = "Slices",
        type_ = "string",
        json_path = ".status.observedSlices.digest",
        description = "Digest of the ForwardingSlice revisions the agent last applied: equal on every current node of a zone; `switchyard-controller audit` compares it with the slices"
    ),
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Applied\")].status",
        description = "Whether the observed revision is programmed in the kernel"
    ),
    printcolumn(
        name = "Rules",
        type_ = "integer",
        json_path = ".status.rules",
        description = "Rules (or IPVS virtual+real servers) programmed"
    ),
    printcolumn(
        name = "Last Sync",
        type_ = "date",
        json_path = ".status.lastSyncTime",
        description = "When the agent last synced"
    ),
    printcolumn(
        name = "Leaving",
        type_ = "string",
        json_path = ".spec.leaving.reason",
        description = "Why the node is leaving (its agent fails kube-proxy's /healthz so load balancers drain it); empty while it serves"
    ),
    printcolumn(
        name = "Drained",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drained\")].status",
        priority = 1,
        description = "While leaving: whether the connections forwarded through the node have ended (or the grace period has)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName", priority = 1),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone", priority = 1),
    printcolumn(
        name = "Overrides",
        type_ = "integer",
        json_path = ".spec.summary.entries",
        priority = 1,
        description = "Entries where this node differs from its views"
    ),
    printcolumn(
        name = "Slice Count",
        type_ = "integer",
        json_path = ".status.observedSlices.count",
        priority = 1,
        description = "ForwardingSlices composed into the applied state"
    ),
    printcolumn(
        name = "In Use",
        type_ = "string",
        json_path = ".status.backend",
        priority = 1,
        description = "Backend actually in use"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".status.lastSyncMode",
        priority = 1,
        description = "Whether the last sync was full or partial"
    ),
    printcolumn(
        name = "Drift Repairs",
        type_ = "integer",
        json_path = ".status.driftRepairs",
        priority = 1
    ),
    selectable = ".spec.nodeName"
)]
#[serde(rename_all = "camelCase")]
// Atomic: a forced server-side apply by the controller replaces the whole spec, so fields a hand edit
// added (which the controller never sets) cannot survive next to a restored revision.
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct NodeForwardingPlanSpec {
    /// The Node this plan is for.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// The node's `topology.kubernetes.io/zone` label as planned (topology hints use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The node's primary IPs (at most one per family), as planned.
    #[serde(default, rename = "nodeIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub node_ips: Vec<String>,
    /// The node's pod CIDRs, as planned.
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub pod_cidrs: Vec<String>,
    /// The backend the agent should program.
    pub backend: Backend,
    /// Cluster-wide settings the agent needs, copied here so one object shows everything.
    pub cluster: ClusterSettings,
    /// Set while the node is leaving the cluster (a signal of the controller's `leavingSignals`
    /// matched its Node): its agent answers 503 on kube-proxy's `/healthz`, so load balancers send it
    /// no new connections, and reports the connections still forwarded through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaving: Option<Leaving>,
    /// Content hash of this object's spec (all fields but `revision`). It does not cover the views'
    /// slices: those carry their own revisions, so one endpoint change rewrites one slice, not every plan.
    #[schemars(length(min = 1, max = 64))]
    pub revision: String,
    /// The ForwardingSlice views this node composes, most general first (`all`, then its zone's view,
    /// then — only when its overrides outgrow this object — its own node view). Later views and then
    /// `overrides` replace entries with the same key. Empty: the plan is self-contained and `services`
    /// holds every entry (plan files, `switchyard-controller plan --node`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub views: Vec<String>,
    /// IPs of the endpoints that run on this node, sorted (with views only): entries taken from a view
    /// get `onNode` from this list, so a Service whose rules do not depend on locality needs no override.
    #[serde(
        default,
        rename = "endpointsOnNode",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::bounded::addresses"
    )]
    pub endpoints_on_node: Vec<String>,
    /// Counts, for `kubectl get` (of the entries this object carries itself; informational).
    // Required, though often zeros (a live plan carries no entries itself): the controller always
    // writes it, and a plan file without it was cut short.
    pub summary: PlanSummary,
    /// With views: which endpoints of a view entry this node's Local policy uses (they run on this node),
    /// by entry key, sorted. The view entry is kept and these endpoints get `local`; so a Local-policy
    /// Service's endpoint changes elsewhere rewrite its slice, not the plans of every node hosting one of
    /// its endpoints.
    #[serde(
        default,
        rename = "localEndpoints",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::bounded::entries"
    )]
    pub local_endpoints: Vec<LocalEndpoints>,
    /// With views: the entries where this node's answer differs from its views in more than its Local
    /// endpoints (a topology hint names it, or an endpoint IP it hosts is listed elsewhere on another
    /// node), sorted. Each replaces the view entry with the same key.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::bounded::entries"
    )]
    pub overrides: Vec<Arc<ServicePlan>>,
    /// Without views: every entry this node forwards, sorted. Empty in the controller's live plans.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::bounded::entries"
    )]
    pub services: Vec<Arc<ServicePlan>>,
}

/// The endpoints of one view entry that this node's Local policy uses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalEndpoints {
    /// The entry's ServicePortName.
    #[schemars(length(min = 3, max = 400))]
    pub name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its family.
    pub family: IpFamily,
    /// The endpoints (as listed in the view entry) that get `local`, sorted.
    #[schemars(length(max = 10000))]
    pub endpoints: Vec<EndpointRef>,
}

impl LocalEndpoints {
    /// The key of the entry it amends.
    pub fn key(&self) -> (&str, Protocol, IpFamily) {
        (&self.name, self.protocol, self.family)
    }
}

/// Identity of a plan entry, owned: kube-proxy's ServicePortName (`namespace/name:port`) plus protocol,
/// and the family. [`ServicePlan::key`] borrows the same three.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey {
    /// `namespace/name:port`.
    pub name: String,
    /// Transport protocol.
    pub protocol: Protocol,
    /// IP family.
    pub family: IpFamily,
}

impl From<&ServicePlan> for EntryKey {
    fn from(entry: &ServicePlan) -> Self {
        entry.entry_key()
    }
}

/// An endpoint of an entry, by address and port.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub struct EndpointRef {
    /// Endpoint IP.
    #[schemars(length(max = 45))]
    pub ip: String,
    /// Endpoint port.
    #[schemars(range(min = 1))]
    pub port: u16,
}

impl NodeForwardingPlanSpec {
    /// Releases the spare capacity a parser leaves in its entry lists (see [`shrink_entries`]).
    pub fn shrink_to_fit(&mut self) {
        shrink_entries(&mut self.services);
        shrink_entries(&mut self.overrides);
        self.endpoints_on_node.shrink_to_fit();
        self.local_endpoints.shrink_to_fit();
    }

    /// Reads a `/0` source range as kube-proxy does, in every entry this object carries (see
    /// [`open_zero_source_ranges`]). Returns how many entries were opened.
    pub fn open_zero_source_ranges(&mut self) -> usize {
        open_zero_source_ranges(&mut self.services) + open_zero_source_ranges(&mut self.overrides)
    }

    /// True when the plan needs no ForwardingSlices (no views).
    pub fn is_self_contained(&self) -> bool {
        self.views.is_empty()
    }
}

/// Why and since when a node is leaving, as the controller read it from the Node.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Leaving {
    /// The signal that matched, as configured: `deletionTimestamp`, `unschedulable`, `taint:<key>` or
    /// `label:<key>[=<value>]`.
    #[schemars(length(min = 1, max = 330))]
    pub reason: String,
    /// When the Node says it began (its `deletionTimestamp`, or the taint's `timeAdded`), RFC 3339;
    /// absent when the Node does not say (the agent's status has when it saw the plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub since: Option<String>,
    /// How long the agent waits for the connections through the node to end before it reports the
    /// node drained anyway, seconds.
    pub drain_grace_seconds: u32,
}

/// How pod traffic is told apart from other traffic (kube-proxy's `--detect-local-mode`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema, Default)]
pub enum DetectLocalMode {
    /// Sources inside the cluster CIDR of the family are pods (kube-proxy's default).
    #[default]
    ClusterCIDR,
    /// Sources inside this node's pod CIDRs are pods.
    NodeCIDR,
    /// Packets that arrive on the bridge named by `localTrafficInterface` come from pods (kube-proxy's
    /// `-i <bridge>` / `iifname "<bridge>"`), whatever their address: for CNIs whose pod IPs lie in no
    /// cluster CIDR. Matched by name, so rules stay valid while the bridge does not exist yet.
    BridgeInterface,
    /// Packets that arrive on an interface whose name starts with `localTrafficInterface` come from
    /// pods (kube-proxy's `-i <prefix>+` / `iifname "<prefix>*"`), e.g. the veths of a routed CNI.
    InterfaceNamePrefix,
    /// No detector: no off-cluster ClusterIP masquerade and no pod short-circuit for eTP=Local.
    None,
}

/// Cluster settings the agent needs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSettings {
    /// How the local-traffic detector was configured.
    pub detect_local: DetectLocalMode,
    /// The CIDRs (at most one per family) whose sources the detector treats as pods; resolved from
    /// `detectLocal`. Empty means no detector.
    #[serde(default, rename = "localTrafficCIDRs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub local_traffic_cidrs: Vec<String>,
    /// With `detectLocal: BridgeInterface` the bridge's name, with `InterfaceNamePrefix` the prefix
    /// (without a wildcard); absent otherwise. An interface name as Linux allows one (1–15 bytes, no
    /// `/`, `:`, whitespace or quotes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub local_traffic_interface: Option<String>,
    /// The cluster's Service ranges (every `ServiceCIDR` object's `spec.cidrs` the controller accepted),
    /// sorted. Traffic still addressed inside them after service DNAT is for an unallocated address and
    /// is dropped on the node (kube-proxy's nftables `cluster-ips-check`). Empty: nothing is dropped.
    #[serde(default, rename = "serviceCIDRs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub service_cidrs: Vec<String>,
    /// Serve NodePorts on `127.0.0.0/8` too (iptables backend only; kube-proxy's
    /// `--iptables-localhost-nodeports`): the agent sets `route_localnet=1` and drops martian packets
    /// to `127.0.0.0/8` from elsewhere. Off by default (CVE-2020-8558).
    #[serde(default, skip_serializing_if = "is_false")]
    pub localhost_node_ports: bool,
    /// Masquerade all ClusterIP traffic, not only traffic from outside the cluster.
    // Required, though `false` is its usual value: the controller always writes it, and a plan file
    // without it was cut or edited (the revision, over what was read, cannot see a default gone missing).
    pub masquerade_all: bool,
    /// The bit of the packet mark that asks for masquerade (kube-proxy default 14 → 0x4000).
    #[schemars(range(max = 31))]
    pub masquerade_bit: u8,
    /// Where NodePorts are served, as kube-proxy's `nodePortAddresses`: empty means every local address,
    /// `primary` means the node's primary IPs, otherwise CIDRs matched against local addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub node_port_addresses: Vec<String>,
    /// Default IPVS scheduler (ipvs backend only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipvs_scheduler: Option<String>,
}

/// Counts of the entries one object carries, for `kubectl get`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanSummary {
    /// Service entries.
    pub entries: u32,
    /// Endpoints across those entries.
    pub endpoints: u32,
}

impl PlanSummary {
    /// The counts of `entries`.
    pub fn of<'a>(entries: impl IntoIterator<Item = &'a Arc<ServicePlan>>) -> Self {
        let mut summary = Self::default();
        for entry in entries {
            summary.entries += 1;
            summary.endpoints += entry.endpoints.len() as u32;
        }
        summary
    }
}

/// Transport protocol of a service port.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum Protocol {
    /// TCP.
    TCP,
    /// UDP.
    UDP,
    /// SCTP.
    SCTP,
}

impl Protocol {
    /// The lowercase name iptables and nft use.
    pub fn lower(self) -> &'static str {
        match self {
            Self::TCP => "tcp",
            Self::UDP => "udp",
            Self::SCTP => "sctp",
        }
    }

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "TCP" => Some(Self::TCP),
            "UDP" => Some(Self::UDP),
            "SCTP" => Some(Self::SCTP),
            _ => None,
        }
    }
}

/// IP family of an entry; every address in the entry belongs to it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum IpFamily {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: &std::net::IpAddr) -> Self {
        if ip.is_ipv4() { Self::IPv4 } else { Self::IPv6 }
    }
}

/// `Cluster` or `Local`, as in the Service API.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum TrafficPolicy {
    /// Any endpoint in the cluster.
    #[default]
    Cluster,
    /// Only endpoints on this node.
    Local,
}

impl TrafficPolicy {
    /// True for `Cluster` (the default, omitted when serialising).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster)
    }
}

/// One ServicePort of one IP family, with its frontends and its endpoints as chosen for this node.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlan {
    /// kube-proxy's ServicePortName: `namespace/name:portName` (`namespace/name` when the port is unnamed).
    #[schemars(length(min = 3, max = 400))]
    pub name: String,
    /// Transport protocol.
    pub protocol: Protocol,
    /// IP family of every address in this entry.
    pub family: IpFamily,
    /// The ClusterIP of this family.
    #[serde(rename = "clusterIP")]
    #[schemars(length(max = 45))]
    pub cluster_ip: String,
    /// The service port.
    #[schemars(range(min = 1))]
    pub port: u16,
    /// The NodePort, when the service has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    #[serde(default, rename = "externalIPs", skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<String>,
    /// LoadBalancer ingress IPs of this family in VIP mode (`ipMode: Proxy` is excluded).
    #[serde(default, rename = "loadBalancerIPs", skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ips: Vec<String>,
    /// `loadBalancerSourceRanges` of this family; empty means unfiltered (also when a range is `/0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<String>,
    /// ClientIP session affinity timeout; absent means no affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub affinity_timeout_seconds: Option<u32>,
    /// `externalTrafficPolicy` (Local only when the service is externally accessible).
    #[serde(default, skip_serializing_if = "TrafficPolicy::is_cluster")]
    pub external_policy: TrafficPolicy,
    /// `internalTrafficPolicy`.
    #[serde(default, skip_serializing_if = "TrafficPolicy::is_cluster")]
    pub internal_policy: TrafficPolicy,
    /// The health-check NodePort (LoadBalancer with externalTrafficPolicy Local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub health_check_node_port: Option<u16>,
    /// IPVS scheduler override from the `switchyard.io/ipvs-scheduler` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    /// True when the service has a usable (ready, or serving and terminating) endpoint of this family
    /// anywhere. False means traffic is REJECTed; true with an empty policy set means DROP.
    pub has_endpoints: bool,
    /// Every ready or serving endpoint of this family, sorted; flags say how this node uses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10000))]
    pub endpoints: Vec<PlanEndpoint>,
    /// Addresses the Service's EndpointSlices still list for this port but that take no new
    /// connection (neither ready nor serving: starting, failing readiness, or terminating past
    /// serving), sorted. Nothing forwards to them; the agent's connection hygiene leaves their
    /// established TCP and SCTP connections alone (their UDP flows are stale: nothing serves there),
    /// where an address absent from both lists has left the Service.
    #[serde(default, rename = "unreadyIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10000))]
    pub unready_ips: Vec<String>,
    /// The Service's `switchyard.io/keep-connections: "true"`: connections to an endpoint that leaves
    /// it are not cleared from conntrack (UDP's stale-entry cleanup, kube-proxy's, still runs).
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_connections: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// One endpoint (`addresses[0]` of an EndpointSlice endpoint, with the slice's port for this entry).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanEndpoint {
    /// Endpoint IP.
    #[schemars(length(max = 45))]
    pub ip: String,
    /// Endpoint port (the resolved targetPort).
    #[schemars(range(min = 1))]
    pub port: u16,
    /// Used by traffic under the Cluster policy.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster: bool,
    /// Used by traffic under the Local policy.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local: bool,
    /// Runs on this node.
    #[serde(default, skip_serializing_if = "is_false")]
    pub on_node: bool,
    /// Terminating (used only as a fallback when nothing is ready).
    #[serde(default, skip_serializing_if = "is_false")]
    pub terminating: bool,
    /// IPVS real-server weight from the Service's `switchyard.io/ipvs-weights` annotation, by the
    /// endpoint's node; absent means 1. The iptables and nftables backends spread evenly and ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub weight: Option<u16>,
}

/// Releases the spare capacity of an entry list and of each entry held only here. Deserialisers grow
/// lists by doubling: five endpoints get room for eight, about a fifth of an agent's entry memory at
/// 10,000 Services for nothing, for as long as the agent holds the plan.
pub fn shrink_entries(entries: &mut Vec<Arc<ServicePlan>>) {
    entries.shrink_to_fit();
    for entry in entries.iter_mut().filter_map(Arc::get_mut) {
        entry.endpoints.shrink_to_fit();
        entry.external_ips.shrink_to_fit();
        entry.load_balancer_ips.shrink_to_fit();
        entry.source_ranges.shrink_to_fit();
    }
}

/// kube-proxy reads `loadBalancerSourceRanges` holding `0.0.0.0/0` (or `::/0`) as "every source is
/// allowed": no firewall at all (`newBaseServiceInfo`). The controller plans such a Service with no source
/// ranges; the agent gives every plan and slice it reads the same reading, so a hand-written `/0` costs no
/// firewall rules, and IPVS (whose `hash:ip,port,net` sets cannot hold a zero prefix) programs it at all.
/// Only a `/0` of the entry's own family opens it; one of the other family is left for validation to
/// report. Returns how many entries were opened.
pub fn open_zero_source_ranges(entries: &mut [Arc<ServicePlan>]) -> usize {
    let mut opened = 0;
    for entry in entries.iter_mut().filter(|e| e.allows_every_source()) {
        Arc::make_mut(entry).source_ranges = Vec::new();
        opened += 1;
    }
    opened
}

impl ServicePlan {
    /// One of its source ranges is a `/0` of its family: kube-proxy then filters nothing.
    pub fn allows_every_source(&self) -> bool {
        self.source_ranges.iter().any(|range| {
            crate::ip::parse_cidr_strict(range)
                .is_some_and(|net| net.prefix_len() == 0 && IpFamily::of(&net.addr()) == self.family)
        })
    }

    /// The sort and identity key of an entry within a plan.
    pub fn key(&self) -> (&str, Protocol, IpFamily) {
        (&self.name, self.protocol, self.family)
    }

    /// The same key, owned: what the agent's backends and conntrack cleanup index entries by.
    pub fn entry_key(&self) -> EntryKey {
        EntryKey {
            name: self.name.clone(),
            protocol: self.protocol,
            family: self.family,
        }
    }

    /// `namespace/name` of the Service this entry belongs to.
    pub fn service_key(&self) -> &str {
        self.name
            .split_once(':')
            .map_or(self.name.as_str(), |(service, _)| service)
    }

    /// NodePort, externalIP or LoadBalancer traffic can reach this entry (kube-proxy's per-port
    /// `ExternallyAccessible`).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Endpoints used by traffic under the Cluster policy.
    pub fn cluster_endpoints(&self) -> impl Iterator<Item = &PlanEndpoint> {
        self.endpoints.iter().filter(|ep| ep.cluster)
    }

    /// Endpoints used by traffic under the Local policy.
    pub fn local_endpoints(&self) -> impl Iterator<Item = &PlanEndpoint> {
        self.endpoints.iter().filter(|ep| ep.local)
    }

    /// IPs of this node's ready endpoints, whatever policy uses them: kube-proxy's health-check
    /// server counts `IsLocal && IsReady` endpoints over every port and family of a Service.
    pub fn ready_ips_on_node(&self) -> impl Iterator<Item = &str> {
        self.endpoints
            .iter()
            .filter(|ep| ep.on_node && !ep.terminating)
            .map(|ep| ep.ip.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{EntryExt, entry, ep};

    #[test]
    fn a_zero_source_range_of_the_family_opens_the_entry_as_kube_proxy_does() {
        let cases = [
            (vec!["0.0.0.0/0"], IpFamily::IPv4, true),
            (vec!["198.51.100.0/24", "0.0.0.0/0"], IpFamily::IPv4, true),
            (vec!["::/0"], IpFamily::IPv6, true),
            (vec!["198.51.100.0/24"], IpFamily::IPv4, false),
            // The other family's /0 is a wrong-family range: validation reports it.
            (vec!["::/0"], IpFamily::IPv4, false),
            (vec![], IpFamily::IPv4, false),
        ];
        for (ranges, family, opened) in cases {
            let mut e = entry("ns/a:p", "10.96.0.1", 80);
            e.family = family;
            e.source_ranges = ranges.iter().map(|r| r.to_string()).collect();
            let mut entries = vec![Arc::new(e)];
            assert_eq!(
                open_zero_source_ranges(&mut entries),
                usize::from(opened),
                "{ranges:?}"
            );
            assert_eq!(
                entries[0].source_ranges.is_empty(),
                opened || ranges.is_empty(),
                "{ranges:?}"
            );
        }
    }

    #[test]
    fn shrinking_releases_spare_capacity_of_entries_held_alone() {
        let mut grown = entry("ns/a:p", "10.96.0.1", 80);
        grown.endpoints.reserve(64);
        let shared = Arc::new(grown.clone().with(ep("10.244.1.1", 80)));
        let mut entries = Vec::with_capacity(16);
        entries.push(Arc::new(grown));
        entries.push(Arc::clone(&shared));
        shrink_entries(&mut entries);
        assert_eq!(entries.capacity(), 2);
        assert_eq!(entries[0].endpoints.capacity(), entries[0].endpoints.len());
        assert!(
            Arc::ptr_eq(&entries[1], &shared),
            "an entry shared with someone else is left as it is, not copied"
        );
    }
}
