//! `switchyard-agent explain`: the path a new connection takes on this node, in words.
//!
//! ```text
//! plan (file) ─► entry whose frontend is the destination ─► words: frontend, source, source ranges,
//!   │                                                        policy and topology, affinity
//!   └► render (iptables rules of the plan) ─► Tracer ─► trace(packet) ─► endpoints + probabilities,
//!                                                                         masquerade, REJECT/DROP
//! --kernel: iptables-save (our chains and jumps) ─► Tracer ─► trace(packet) ─► agree with the plan? or
//!           drift: the first rule where the kernel's chains differ from the plan's
//! ```
//!
//! The verdict comes from the same render the agent programs and the same packet model the tests use
//! (kube-proxy semantics whatever the backend; IPVS spreads by weight, which the words add), so the
//! explanation cannot disagree with what the plan makes the node do. Everything but reading the kernel
//! is pure: [`explain`] takes the plan and the question and returns an [`Explanation`].

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::Serialize;
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, Protocol, ServicePlan, TrafficPolicy};

use crate::backend::HostFacts;
use crate::error::Error;
use crate::iptables::render;
use crate::xtables::{Packet, Table, Trace, Tracer, Verdict};

/// Exit status: the connection is forwarded to an endpoint.
pub const EXIT_FORWARDED: u8 = 0;
/// Exit status: rejected, dropped, or not a frontend of any Service.
pub const EXIT_NOT_FORWARDED: u8 = 3;

/// Where the connection goes: an address, or a Service by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `IP:PORT[/tcp|udp|sctp]` (tcp when not given).
    Address(SocketAddr, Protocol),
    /// `namespace/service[:port]`: the Service's ClusterIP (the named or only port).
    Service {
        /// `namespace/name`.
        service: String,
        /// The port's name, if given.
        port: Option<String>,
    },
}

impl std::str::FromStr for Destination {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, protocol) = match text.rsplit_once('/') {
            Some((address, proto))
                if ["tcp", "udp", "sctp"].contains(&proto.to_ascii_lowercase().as_str()) =>
            {
                let protocol = match proto.to_ascii_lowercase().as_str() {
                    "udp" => Protocol::UDP,
                    "sctp" => Protocol::SCTP,
                    _ => Protocol::TCP,
                };
                (address, protocol)
            }
            _ => (text, Protocol::TCP),
        };
        if let Ok(addr) = address.parse::<SocketAddr>() {
            return Ok(Self::Address(addr, protocol));
        }
        // An address with a protocol the proxy does not handle, or a port out of range: say which.
        if let Some((address, proto)) = text.rsplit_once('/')
            && address.parse::<SocketAddr>().is_ok()
        {
            return Err(format!(
                "unknown protocol {proto:?} in {text:?}: a Service port is tcp, udp or sctp"
            ));
        }
        if let Some((ip, port)) = address.rsplit_once(':')
            && ip.trim_matches(['[', ']']).parse::<IpAddr>().is_ok()
        {
            return Err(format!("port {port:?} in {text:?} is not a port (1-65535)"));
        }
        match text.split_once('/') {
            Some((namespace, rest)) if !namespace.is_empty() && !rest.is_empty() && !rest.contains('/') => {
                let (name, port) = match rest.split_once(':') {
                    Some((name, port)) => (name, Some(port.to_string())),
                    None => (rest, None),
                };
                Ok(Self::Service {
                    service: format!("{namespace}/{name}"),
                    port,
                })
            }
            _ => Err(format!(
                "{text:?} is neither IP:PORT[/tcp|udp|sctp] ([IPv6]:PORT for IPv6) nor namespace/service[:port]"
            )),
        }
    }
}

/// Where the connection comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The node itself (a host-network process).
    Node,
    /// An address: a pod when it is inside the cluster's pod CIDR, an external client otherwise.
    Address(IpAddr),
}

impl std::str::FromStr for Source {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "node" {
            return Ok(Self::Node);
        }
        text.parse()
            .map(Self::Address)
            .map_err(|_| format!("{text:?} is neither `node` nor an IP address"))
    }
}

/// What happens to the connection.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum Outcome {
    /// DNATed to one of these endpoints.
    Forwarded {
        /// Each endpoint with its share of new connections.
        endpoints: Vec<Candidate>,
    },
    /// Refused at once (ICMP port unreachable), as kube-proxy does for a Service without endpoints.
    Rejected,
    /// Dropped silently.
    Dropped,
    /// No Service of this plan has this frontend: Switchyard leaves the packet alone.
    NotAService,
}

/// One endpoint a new connection may go to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// `ip:port`.
    pub endpoint: String,
    /// Share of new connections (iptables/nftables: uniform; IPVS: by weight with a weighted scheduler).
    pub probability: f64,
    /// IPVS weight, with the IPVS backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u16>,
    /// The source is rewritten to the node's address on the way to this endpoint.
    pub masquerade: bool,
}

/// The answer: the steps in words, and the outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The node whose plan was asked.
    pub node: String,
    /// The backend the plan asks for.
    pub backend: String,
    /// The Service entry (`namespace/name:port`), if a frontend matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// What happens, step by step, in plain words.
    pub steps: Vec<String>,
    /// The outcome.
    pub outcome: Outcome,
    /// With `--kernel`: where the installed rules differ from the plan on this path (empty: they agree).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<Vec<String>>,
}

impl Explanation {
    /// [`EXIT_FORWARDED`] or [`EXIT_NOT_FORWARDED`].
    pub fn exit_code(&self) -> u8 {
        match self.outcome {
            Outcome::Forwarded { .. } => EXIT_FORWARDED,
            _ => EXIT_NOT_FORWARDED,
        }
    }

    /// The steps as numbered lines, then the outcome and any drift.
    pub fn text(&self) -> String {
        let mut out = format!(
            "node {} (backend {}): a new connection\n",
            self.node, self.backend
        );
        for (i, step) in self.steps.iter().enumerate() {
            out.push_str(&format!("{:>2}. {step}\n", i + 1));
        }
        out.push_str(&match &self.outcome {
            Outcome::Forwarded { endpoints } => {
                let list: Vec<String> = endpoints
                    .iter()
                    .map(|c| {
                        let weight = c.weight.map(|w| format!(", weight {w}")).unwrap_or_default();
                        let masquerade = if c.masquerade { ", masqueraded" } else { "" };
                        format!(
                            "{} ({:.0}%{weight}{masquerade})",
                            c.endpoint,
                            c.probability * 100.0
                        )
                    })
                    .collect();
                format!("=> FORWARDED to {}\n", list.join(", "))
            }
            Outcome::Rejected => "=> REJECTED (connection refused at once)\n".to_string(),
            Outcome::Dropped => "=> DROPPED (the client sees a timeout)\n".to_string(),
            Outcome::NotAService => "=> NOT A SERVICE: Switchyard leaves this packet alone\n".to_string(),
        });
        match &self.drift {
            Some(drift) if drift.is_empty() => {
                out.push_str("kernel: the installed rules take the same path as the plan\n");
            }
            Some(drift) => {
                out.push_str("kernel: DRIFT — the installed rules differ from the plan on this path:\n");
                for line in drift {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            None => {}
        }
        out
    }
}

/// Which frontend of an entry the destination is.
fn frontend(entry: &ServicePlan, dest: IpAddr, port: u16, node_ips: &[IpAddr]) -> Option<String> {
    let is = |text: &str| text.parse::<IpAddr>().ok() == Some(dest);
    if port == entry.port && is(&entry.cluster_ip) {
        return Some(format!("the ClusterIP {} of {}", entry.cluster_ip, entry.name));
    }
    if port == entry.port && entry.external_ips.iter().any(|ip| is(ip)) {
        return Some(format!("externalIP {dest} of {}", entry.name));
    }
    if port == entry.port && entry.load_balancer_ips.iter().any(|ip| is(ip)) {
        return Some(format!("the LoadBalancer IP {dest} of {}", entry.name));
    }
    if entry.node_port == Some(port) && (node_ips.contains(&dest) || dest.is_loopback()) {
        return Some(format!(
            "NodePort {port} of {} on this node's address {dest}",
            entry.name
        ));
    }
    None
}

/// A destination resolved: its address and protocol, and the entry with the frontend in words.
type Resolved<'a> = (SocketAddr, Protocol, Option<(&'a ServicePlan, String)>);

/// The destination address and the entry it names.
fn resolve<'a>(
    spec: &'a NodeForwardingPlanSpec,
    dest: &Destination,
    node_ips: &[IpAddr],
) -> Result<Resolved<'a>, Error> {
    match dest {
        Destination::Address(addr, protocol) => {
            let found = spec
                .services
                .iter()
                .filter(|e| e.protocol == *protocol)
                .find_map(|e| frontend(e, addr.ip(), addr.port(), node_ips).map(|f| (e.as_ref(), f)));
            Ok((*addr, *protocol, found))
        }
        Destination::Service { service, port } => {
            let candidates: Vec<&ServicePlan> = spec
                .services
                .iter()
                .map(AsRef::as_ref)
                .filter(|e| e.name.split(':').next() == Some(service.as_str()))
                .filter(|e| match port {
                    Some(port) => e.name.split_once(':').map(|(_, p)| p) == Some(port.as_str()),
                    None => true,
                })
                .collect();
            let entry = match candidates.as_slice() {
                [entry] => *entry,
                [] => {
                    return Err(Error::ExplainDestination(format!(
                        "no Service port {service}{} in node {}'s plan",
                        port.as_deref().map(|p| format!(":{p}")).unwrap_or_default(),
                        spec.node_name
                    )));
                }
                several => {
                    let names: Vec<&str> = several.iter().map(|e| e.name.as_str()).collect();
                    return Err(Error::ExplainDestination(format!(
                        "{service} has several ports or families ({}): name one as namespace/service:port, \
                         or give IP:PORT",
                        names.join(", ")
                    )));
                }
            };
            let ip: IpAddr = entry
                .cluster_ip
                .parse()
                .map_err(|_| Error::ExplainDestination(format!("{} has no usable ClusterIP", entry.name)))?;
            let addr = SocketAddr::new(ip, entry.port);
            let what = format!("the ClusterIP {} of {}", entry.cluster_ip, entry.name);
            Ok((addr, entry.protocol, Some((entry, what))))
        }
    }
}

/// The pod CIDR of the family, if the plan has one.
fn pod_cidr(spec: &NodeForwardingPlanSpec, family: IpFamily) -> Option<IpNet> {
    spec.cluster
        .local_traffic_cidrs
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .find(|net| IpFamily::of(&net.addr()) == family)
}

/// The node's own addresses of the plan.
fn node_ips(spec: &NodeForwardingPlanSpec) -> Vec<IpAddr> {
    spec.node_ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}

/// The packet a connection from `source` to `dest` starts with (a node source uses the node's address
/// of the family).
fn packet(
    spec: &NodeForwardingPlanSpec,
    source: Source,
    dest: SocketAddr,
    protocol: Protocol,
) -> Result<Packet, Error> {
    let family = IpFamily::of(&dest.ip());
    let from = match source {
        Source::Address(ip) if IpFamily::of(&ip) != family => {
            return Err(Error::ExplainFamilies {
                from: ip,
                to: dest.ip(),
            });
        }
        Source::Address(ip) => ip,
        Source::Node => node_ips(spec)
            .into_iter()
            .find(|ip| IpFamily::of(ip) == family)
            .unwrap_or(match family {
                IpFamily::IPv4 => IpAddr::from([127, 0, 0, 1]),
                IpFamily::IPv6 => IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
            }),
    };
    Ok(Packet::new(from, protocol, dest.ip(), dest.port()))
}

/// The rules the plan makes the agent program for one family, as the packet model; `local` are the
/// host's addresses (the plan's node IPs when `None`).
pub fn plan_tracer(
    spec: &NodeForwardingPlanSpec,
    family: IpFamily,
    local: Option<&[IpAddr]>,
) -> Result<Tracer, Error> {
    let report = switchyard_api::validate::validate(spec);
    let local = local.map_or_else(|| node_ips(spec), <[IpAddr]>::to_vec);
    let facts = HostFacts {
        random_fully: true,
        tcp_be_liberal: false,
        // NodePorts resolved as the agent resolves them on this host.
        local_addrs: local.clone(),
    };
    let ruleset = render(spec, &facts, family, &report.bad_entries());
    Tracer::from_ruleset(&ruleset, &local)
}

/// Explains a new connection from `source` to `dest` on the node of `spec` (with the host's `local`
/// addresses when it runs there, for `--kernel`). Returns the packet and the plan's trace too.
pub fn explain(
    spec: &NodeForwardingPlanSpec,
    dest: &Destination,
    source: Source,
    local: Option<&[IpAddr]>,
) -> Result<(Explanation, Packet, Trace), Error> {
    let ips = node_ips(spec);
    let (addr, protocol, found) = resolve(spec, dest, &ips)?;
    let packet = packet(spec, source, addr, protocol)?;
    let family = IpFamily::of(&addr.ip());
    let trace = plan_tracer(spec, family, local)?.trace(&packet)?;
    let mut steps = Vec::new();
    let Some((entry, what)) = found else {
        steps.push(format!(
            "{}/{} matches no frontend (ClusterIP, externalIP, LoadBalancer IP or NodePort) in the plan",
            addr,
            protocol.lower()
        ));
        // NB: the plan holds only what is forwarded; why a Service is not is the controller's to say.
        steps.push(
            "a Service the controller does not forward is in no plan: headless (clusterIP None, or \
             labelled service.kubernetes.io/headless), type ExternalName, or another proxy's \
             (service.kubernetes.io/service-proxy-name); `switchyard-controller plan` notes each one \
             with its reason"
                .to_owned(),
        );
        return Ok((
            Explanation {
                node: spec.node_name.clone(),
                backend: spec.backend.to_string(),
                service: None,
                steps,
                outcome: Outcome::NotAService,
                drift: None,
            },
            packet,
            trace,
        ));
    };
    steps.push(format!("{addr}/{} is {what}", protocol.lower()));

    let pods = pod_cidr(spec, family);
    let from_pod = pods.is_some_and(|net| net.contains(&packet.source));
    let from_node = matches!(source, Source::Node) || ips.contains(&packet.source);
    steps.push(match (from_node, from_pod, pods) {
        (true, _, _) => format!("from the node itself ({})", packet.source),
        (false, true, Some(net)) => format!("from pod {} (inside the pod CIDR {net})", packet.source),
        (false, _, Some(net)) => format!(
            "from {} outside the cluster (not in the pod CIDR {net})",
            packet.source
        ),
        (false, _, None) => format!(
            "from {} (the plan has no pod CIDR: pods and outside clients are not told apart)",
            packet.source
        ),
    });

    let cluster_ip = entry.cluster_ip.parse::<IpAddr>().ok() == Some(addr.ip());
    let lb = entry
        .load_balancer_ips
        .iter()
        .any(|ip| ip.parse::<IpAddr>().ok() == Some(addr.ip()));
    let mut denied = false;
    if lb && !entry.source_ranges.is_empty() {
        let allowed = entry
            .source_ranges
            .iter()
            .filter_map(|r| r.parse::<IpNet>().ok())
            .find(|net| net.contains(&packet.source));
        denied = allowed.is_none();
        steps.push(match allowed {
            Some(net) => format!("loadBalancerSourceRanges: {net} allows {}", packet.source),
            None => format!(
                "loadBalancerSourceRanges ({}) do not include {}: DROP (pods and the node are filtered \
                 too; NodePorts never are)",
                entry.source_ranges.join(", "),
                packet.source
            ),
        });
    }

    let used_cluster = entry.cluster_endpoints().count();
    let used_local = entry.local_endpoints().count();
    let terminating_only = entry
        .endpoints
        .iter()
        .filter(|e| e.cluster || e.local)
        .all(|e| e.terminating)
        && entry.endpoints.iter().any(|e| e.cluster || e.local);
    if denied {
        // Nothing after the source-range verdict applies.
    } else if !entry.has_endpoints {
        steps.push(format!(
            "{} has no usable endpoint: kube-proxy rejects such connections",
            entry.name
        ));
    } else if cluster_ip {
        steps.push(match entry.internal_policy {
            TrafficPolicy::Local if used_local == 0 => format!(
                "internalTrafficPolicy Local, and this node hosts no ready endpoint of {}: DROP",
                entry.name
            ),
            TrafficPolicy::Local => {
                format!("internalTrafficPolicy Local: only the {used_local} endpoint(s) on this node")
            }
            TrafficPolicy::Cluster => format!(
                "internalTrafficPolicy Cluster: {used_cluster} of the Service's {} endpoint(s){}",
                entry.endpoints.len(),
                if used_cluster < entry.endpoints.len() {
                    " (the others are not ready, terminating, or routed elsewhere by topology hints)"
                } else {
                    ""
                }
            ),
        });
    } else if entry.external_policy == TrafficPolicy::Local && !from_pod && !from_node {
        steps.push(if used_local == 0 {
            format!(
                "externalTrafficPolicy Local, and this node hosts no ready endpoint of {}: DROP (the load \
                 balancer's health check on this node fails, so it sends no traffic here)",
                entry.name
            )
        } else {
            format!(
                "externalTrafficPolicy Local: only the {used_local} endpoint(s) on this node; client IP kept"
            )
        });
    } else if entry.external_policy == TrafficPolicy::Local {
        steps.push(
            "externalTrafficPolicy Local does not apply to pods and the node itself: they reach every \
             endpoint, as if through the load balancer"
                .to_string(),
        );
    } else {
        steps.push(format!(
            "externalTrafficPolicy Cluster: any of {used_cluster} endpoint(s), on any node"
        ));
    }
    if terminating_only && entry.has_endpoints && !denied {
        steps.push("no endpoint is ready: the serving terminating ones are used as a fallback".to_string());
    }
    if let Some(seconds) = entry.affinity_timeout_seconds {
        steps.push(format!(
            "ClientIP session affinity ({seconds} s): later connections from {} go to the endpoint chosen \
             first",
            packet.source
        ));
    }
    if spec.backend == Backend::Ipvs {
        steps.push(format!(
            "IPVS scheduler {}: endpoints weighted by their node (switchyard.io/ipvs-weights)",
            entry.scheduler.as_deref().unwrap_or("rr")
        ));
    }

    let outcome = outcome(&trace, spec.backend, Some(entry));
    if let Outcome::Forwarded { endpoints } = &outcome {
        let origin = Origin {
            cluster_ip,
            from_pod,
            from_node,
            source: packet.source,
        };
        steps.push(masquerade_reason(endpoints, spec, entry, origin));
    }
    Ok((
        Explanation {
            node: spec.node_name.clone(),
            backend: spec.backend.to_string(),
            service: Some(entry.name.clone()),
            steps,
            outcome,
            drift: None,
        },
        packet,
        trace,
    ))
}

/// Where a connection comes from and which kind of frontend it meets.
#[derive(Debug, Clone, Copy)]
struct Origin {
    cluster_ip: bool,
    from_pod: bool,
    from_node: bool,
    source: IpAddr,
}

/// Why the source is (or is not) masqueraded, as kube-proxy decides it.
fn masquerade_reason(
    endpoints: &[Candidate],
    spec: &NodeForwardingPlanSpec,
    entry: &ServicePlan,
    origin: Origin,
) -> String {
    let masqueraded: Vec<&Candidate> = endpoints.iter().filter(|c| c.masquerade).collect();
    if masqueraded.is_empty() {
        return "no masquerade: the endpoint sees the client's own address".to_string();
    }
    if masqueraded.len() < endpoints.len() {
        let hairpin = masqueraded.iter().all(|c| {
            c.endpoint
                .parse::<SocketAddr>()
                .is_ok_and(|e| e.ip() == origin.source)
        });
        return if hairpin {
            "masquerade only when the connection comes back to the client itself (hairpin): otherwise the \
             reply would skip the reverse DNAT"
                .to_string()
        } else {
            "masquerade on some paths only".to_string()
        };
    }
    let why = if spec.cluster.masquerade_all {
        "masqueradeAll is set"
    } else if origin.from_node {
        "the connection starts on the node"
    } else if origin.cluster_ip && !origin.from_pod {
        "the client is outside the pod CIDR: replies must come back through this node"
    } else if !origin.cluster_ip && entry.external_policy == TrafficPolicy::Cluster {
        "externalTrafficPolicy Cluster: the endpoint may be on another node, replies must come back here"
    } else {
        "the only endpoint is the client itself (hairpin): otherwise the reply would skip the reverse DNAT"
    };
    format!("masquerade: {why}")
}

/// The outcome the trace shows, with IPVS weights where the backend uses them.
/// `entry` gives IPVS weights; without one (rules the plan does not have) every endpoint weighs 1.
fn outcome(trace: &Trace, backend: Backend, entry: Option<&ServicePlan>) -> Outcome {
    let verdicts = trace.verdicts();
    let dnat: Vec<SocketAddr> = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Dnat(to) => Some(*to),
            _ => None,
        })
        .collect();
    if dnat.is_empty() {
        return if verdicts.contains(&Verdict::Reject) {
            Outcome::Rejected
        } else if verdicts.contains(&Verdict::Drop) {
            Outcome::Dropped
        } else {
            Outcome::NotAService
        };
    }
    let weight_of = |to: &SocketAddr| {
        entry
            .into_iter()
            .flat_map(|e| &e.endpoints)
            .find(|e| e.ip.parse::<IpAddr>().ok() == Some(to.ip()) && e.port == to.port())
            .map(|e| e.weight.unwrap_or(1))
            .unwrap_or(1)
    };
    let total: u32 = dnat.iter().map(|to| u32::from(weight_of(to))).sum();
    let endpoints = dnat
        .iter()
        .map(|to| {
            let verdict = Verdict::Dnat(*to);
            let masquerade = trace.branches_to(&verdict).any(|b| b.masquerade);
            let (probability, weight) = if backend == Backend::Ipvs {
                let weight = weight_of(to);
                (f64::from(weight) / f64::from(total.max(1)), Some(weight))
            } else {
                (trace.probability(&verdict), None)
            };
            Candidate {
                endpoint: to.to_string(),
                probability,
                weight,
                masquerade,
            }
        })
        .collect();
    Outcome::Forwarded { endpoints }
}

/// `--kernel`: traces the packet through the rules the kernel holds (`saves`: iptables-save of nat and
/// filter), makes that the outcome, and records where they differ from the plan's on this path.
pub fn kernel(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    packet: &Packet,
    plan_trace: &Trace,
    local: &[IpAddr],
    saves: &[String],
) -> Result<(), Error> {
    let family = IpFamily::of(&packet.dest);
    // No chain of ours at all: the node is not programmed (never, or cleaned up); a rule-by-rule
    // comparison would list every rule of the plan as drift.
    if !saves
        .iter()
        .any(|save| save.lines().any(|line| line.starts_with(":SWYD-")))
    {
        explanation.drift = Some(vec![
            "no Switchyard rules on this host (no SWYD-* chain in iptables-save): its agent has not \
             programmed it, or `switchyard-agent cleanup` ran"
                .to_owned(),
        ]);
        explanation.outcome = Outcome::NotAService;
        return Ok(());
    }
    let installed = kernel_tracer(family, local, saves)?;
    let kernel_trace = installed.trace(packet)?;
    let plan = plan_tracer(spec, family, Some(local))?;
    explanation.drift = Some(drift(&plan, plan_trace, &installed, &kernel_trace));
    let entry = explanation
        .service
        .as_deref()
        .and_then(|name| spec.services.iter().find(|e| e.name == name));
    // What the node does is what its rules do, even where the plan has no such frontend (rules left
    // behind by someone).
    explanation.outcome = outcome(&kernel_trace, spec.backend, entry.map(AsRef::as_ref));
    Ok(())
}

/// `--kernel` with the nftables backend: compares what the plan renders with what our table holds, for
/// the elements keyed by this packet's frontend (ClusterIP, external or LB address and port, or its
/// NodePort) and the chains they jump to. The outcome stays the plan's (there is no nftables packet
/// model yet); `found` is `None` when the table is missing, and then nothing of ours touches the packet.
pub fn nft_kernel(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    packet: &Packet,
    facts: &HostFacts,
    found: Option<&crate::nftables::model::TableState>,
) {
    use crate::nftables::model::{Key, TableState};
    let family = IpFamily::of(&packet.dest);
    let Some(found) = found else {
        explanation.drift = Some(vec![format!(
            "table {} switchyard is missing: no rule of ours sees this packet",
            crate::nftables::model::family_keyword(family)
        )]);
        explanation.outcome = Outcome::NotAService;
        return;
    };
    let expected = crate::nftables::render(
        spec,
        facts,
        family,
        &switchyard_api::validate::validate(spec).bad_entries(),
    );
    let local = node_ips(spec).contains(&packet.dest);
    let on_path = |key: &Key| match *key {
        Key::Frontend(ip, proto, port) | Key::FrontendSlot(ip, proto, port, _) => {
            ip == packet.dest && proto == packet.protocol && port == packet.dest_port
        }
        Key::Port(proto, port) | Key::PortSlot(proto, port, _) => {
            local && proto == packet.protocol && port == packet.dest_port
        }
        Key::Addr(_) | Key::Hairpin(..) => false,
    };
    let elements = |state: &TableState| {
        let mut list: Vec<(String, Key, String)> = state
            .elements
            .iter()
            .flat_map(|(id, elements)| {
                elements
                    .iter()
                    .filter(|(key, _)| on_path(key))
                    .map(move |(key, claim)| (id.name(), *key, claim.value.to_string()))
            })
            .collect();
        list.sort();
        list
    };
    let (want, have) = (elements(&expected), elements(found));
    let mut drift = Vec::new();
    let mut chains: Vec<String> = Vec::new();
    for (set, key, value) in &want {
        if let Some(chain) = value.strip_prefix("goto ") {
            chains.push(chain.to_string());
        }
        match have.iter().find(|(s, k, _)| s == set && k == key) {
            None => drift.push(format!("{set}: the kernel lacks the element {key} : {value}")),
            Some((_, _, kernel)) if kernel != value => {
                drift.push(format!("{set} element {key}: kernel `{kernel}`, plan `{value}`"))
            }
            Some(_) => {}
        }
    }
    for (set, key, value) in &have {
        if !want.iter().any(|(s, k, _)| s == set && k == key) {
            drift.push(format!("{set}: the kernel has an extra element {key} : {value}"));
        }
    }
    for chain in chains {
        let summary = |state: &TableState| state.chains.get(&chain).map(|c| c.summary());
        match (summary(&expected), summary(found)) {
            (Some(_), None) => drift.push(format!("chain {chain} is missing from the kernel")),
            (Some(want), Some(have)) if want != have => drift.push(format!(
                "chain {chain}: the kernel holds {} rules (digest {}), the plan {} (digest {})",
                have.0,
                have.1.unwrap_or_default(),
                want.0,
                want.1.unwrap_or_default()
            )),
            _ => {}
        }
    }
    explanation.steps.push(
        "kernel (nftables): the elements for this frontend and the chains they lead to were read back and \
         compared with the plan; the outcome shown is the plan's"
            .to_string(),
    );
    explanation.drift = Some(drift);
}

/// `--kernel` with the IPVS backend: the virtual server for this packet's frontend as the kernel holds
/// it (`kernel`: the service and its real servers) against the one the plan renders (`planned`). The
/// outcome becomes the kernel's real servers with their weights; without a virtual server nothing of
/// IPVS takes the packet.
pub fn ipvs_kernel(
    explanation: &mut Explanation,
    planned: Option<&crate::ipvs::render::VirtualServer>,
    kernel: Option<(&crate::ipvs::kernel::Service, &[crate::ipvs::kernel::Destination])>,
) {
    let mut drift = Vec::new();
    match (planned, kernel) {
        (None, None) => {}
        (Some(_), None) => {
            drift.push("the kernel has no virtual server for this frontend".to_string());
            explanation.outcome = Outcome::NotAService;
        }
        (None, Some(_)) => drift.push("the kernel has a virtual server the plan does not".to_string()),
        (Some(plan), Some((service, _))) => {
            if plan.scheduler != service.scheduler {
                drift.push(format!(
                    "scheduler: kernel {}, plan {}",
                    service.scheduler, plan.scheduler
                ));
            }
            if plan.persistence != service.persistence() {
                drift.push(format!(
                    "persistence: kernel {:?}, plan {:?}",
                    service.persistence(),
                    plan.persistence
                ));
            }
        }
    }
    if let (Some(plan), Some((_, reals))) = (planned, kernel) {
        for (real, weight) in &plan.reals {
            match reals.iter().find(|d| d.real == *real) {
                None => drift.push(format!(
                    "the kernel lacks the real server {real} (weight {weight})"
                )),
                Some(d) if d.weight != *weight => drift.push(format!(
                    "real server {real}: kernel weight {}, plan {weight}",
                    d.weight
                )),
                Some(_) => {}
            }
        }
        for d in reals
            .iter()
            .filter(|d| !plan.reals.contains_key(&d.real) && d.weight > 0)
        {
            drift.push(format!(
                "the kernel has an extra real server {} (weight {})",
                d.real, d.weight
            ));
        }
    }
    if let Some((_, reals)) = kernel {
        let total: u32 = reals.iter().map(|d| d.weight).sum();
        let endpoints: Vec<Candidate> = reals
            .iter()
            .filter(|d| d.weight > 0)
            .map(|d| Candidate {
                endpoint: d.real.to_string(),
                probability: f64::from(d.weight) / f64::from(total.max(1)),
                weight: u16::try_from(d.weight).ok(),
                masquerade: matches!(&explanation.outcome, Outcome::Forwarded { endpoints }
                    if endpoints.iter().all(|c| c.masquerade)),
            })
            .collect();
        if !endpoints.is_empty() {
            explanation.outcome = Outcome::Forwarded { endpoints };
        }
    }
    explanation.drift = Some(drift);
}

/// Our part of `iptables-save` output (our chains, and built-in chain rules jumping into them) as a
/// restore payload the packet model reads; everything else in the tables is someone else's.
pub fn ours_of_save(save: &str) -> String {
    let mut out = String::new();
    for line in save.lines() {
        let ours = line.starts_with('*')
            || line == "COMMIT"
            || line.starts_with(":SWYD-")
            || line.starts_with("-A SWYD-")
            || (line.starts_with("-A ") && line.contains(" -j SWYD-"));
        if ours {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The packet model of what the kernel holds, from `iptables-save` of nat and filter.
pub fn kernel_tracer(family: IpFamily, local: &[IpAddr], saves: &[String]) -> Result<Tracer, Error> {
    let mut tracer = Tracer::empty(family, local);
    for save in saves {
        tracer.restore(&ours_of_save(save))?;
    }
    Ok(tracer)
}

/// Where the kernel's rules on the path differ from the plan's: the chains either trace went
/// through, compared rule by rule (first difference of each), and a different outcome.
pub fn drift(plan: &Tracer, plan_trace: &Trace, kernel: &Tracer, kernel_trace: &Trace) -> Vec<String> {
    let mut found = Vec::new();
    if plan_trace.verdicts() != kernel_trace.verdicts()
        || plan_trace.masquerade() != kernel_trace.masquerade()
    {
        found.push(format!(
            "the plan gives {} (masquerade {}), the kernel {} (masquerade {})",
            plan_trace.output(),
            plan_trace.masquerade(),
            kernel_trace.output(),
            kernel_trace.masquerade()
        ));
    }
    let mut chains: Vec<(Table, String)> = Vec::new();
    for branch in plan_trace.branches.iter().chain(&kernel_trace.branches) {
        for rule in &branch.rules {
            if let Some(chain) = rule.strip_prefix("-A ").and_then(|r| r.split(' ').next()) {
                for table in [Table::Nat, Table::Filter] {
                    let key = (table, chain.to_string());
                    if !chains.contains(&key) {
                        chains.push(key);
                    }
                }
            }
        }
    }
    for (table, chain) in chains {
        let (want, have) = (plan.chain_rules(table, &chain), kernel.chain_rules(table, &chain));
        let same = want.len() == have.len() && want.iter().zip(&have).all(|(w, h)| w.1 == h.1);
        if same {
            continue;
        }
        let meanings = |rules: &[(String, String)]| rules.iter().map(|r| r.1.clone()).collect::<Vec<_>>();
        let (want_m, have_m) = (meanings(&want), meanings(&have));
        match want.iter().zip(&have).position(|(w, h)| w.1 != h.1) {
            // One rule missing or one added, the rest the same: say which, not every shifted pair.
            Some(i) if want_m[i + 1..] == have_m[i..] => found.push(format!(
                "{table} {chain}: the kernel lacks rule {} `-A {chain} {}`",
                i + 1,
                want[i].0
            )),
            Some(i) if have_m[i + 1..] == want_m[i..] => found.push(format!(
                "{table} {chain}: the kernel has an extra rule {} `-A {chain} {}`",
                i + 1,
                have[i].0
            )),
            Some(i) => found.push(format!(
                "{table} {chain} rule {}: kernel `-A {chain} {}`, plan `-A {chain} {}`",
                i + 1,
                have[i].0,
                want[i].0
            )),
            None if have.len() > want.len() => found.push(format!(
                "{table} {chain}: the kernel has an extra rule `-A {chain} {}`",
                have[want.len()].0
            )),
            None => found.push(format!(
                "{table} {chain}: the kernel lacks the rule `-A {chain} {}`",
                want[have.len()].0
            )),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn destinations_and_sources_parse_or_say_why_not() {
        let cases: [(&str, Option<Destination>); 6] = [
            (
                "10.96.0.1:80",
                Some(Destination::Address(
                    "10.96.0.1:80".parse().unwrap(),
                    Protocol::TCP,
                )),
            ),
            (
                "10.96.0.1:53/udp",
                Some(Destination::Address(
                    "10.96.0.1:53".parse().unwrap(),
                    Protocol::UDP,
                )),
            ),
            (
                "[fd00::1]:80/SCTP",
                Some(Destination::Address(
                    "[fd00::1]:80".parse().unwrap(),
                    Protocol::SCTP,
                )),
            ),
            (
                "ns1/web",
                Some(Destination::Service {
                    service: "ns1/web".into(),
                    port: None,
                }),
            ),
            (
                "ns1/web:http",
                Some(Destination::Service {
                    service: "ns1/web".into(),
                    port: Some("http".into()),
                }),
            ),
            ("web", None),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Destination>().ok(), want, "{text}");
        }
        for (text, says) in [
            ("10.96.0.1:80/icmp", "unknown protocol \"icmp\""),
            ("[fd00::1]:80/gre", "unknown protocol \"gre\""),
            ("10.96.0.1:70000", "port \"70000\""),
            ("10.96.0.1:http", "port \"http\""),
        ] {
            let error = text.parse::<Destination>().unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert_eq!("node".parse::<Source>(), Ok(Source::Node));
        assert_eq!(
            "10.244.1.5".parse::<Source>(),
            Ok(Source::Address("10.244.1.5".parse().unwrap()))
        );
        assert!(
            "pod-a"
                .parse::<Source>()
                .unwrap_err()
                .contains("neither `node` nor an IP")
        );
    }

    #[test]
    fn a_host_without_our_rules_is_said_to_be_unprogrammed_not_drifted() {
        let spec = plan(
            "node-a",
            vec![entry("ns1/web:http", "10.96.0.1", 80).with(ep("10.244.2.5", 8080))],
        );
        let dest = Destination::Address("10.96.0.1:80".parse().unwrap(), Protocol::TCP);
        let (mut explanation, packet, plan_trace) = explain(&spec, &dest, Source::Node, None).unwrap();
        let someone_elses = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
                             -A PREROUTING -j KUBE-SERVICES\nCOMMIT\n"
            .to_owned();
        kernel(
            &spec,
            &mut explanation,
            &packet,
            &plan_trace,
            &[],
            &[someone_elses],
        )
        .unwrap();
        assert_eq!(explanation.outcome, Outcome::NotAService);
        let drift = explanation.drift.clone().unwrap();
        assert_eq!(drift.len(), 1, "{drift:?}");
        assert!(drift[0].contains("no Switchyard rules on this host"), "{drift:?}");
        assert!(explanation.text().contains("no Switchyard rules on this host"));
    }

    #[test]
    fn the_kernel_model_reads_iptables_save_spelling_and_drift_names_the_changed_rule() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/web:http", "10.96.0.1", 80)
                    .with(ep("10.244.2.5", 8080))
                    .with(ep("10.244.3.5", 8080)),
            ],
        );
        let dest = Destination::Address("10.96.0.1:80".parse().unwrap(), Protocol::TCP);
        let source = Source::Address("10.244.1.9".parse().unwrap());
        let (explanation, packet, plan_trace) = explain(&spec, &dest, source, None).unwrap();
        assert_eq!(explanation.exit_code(), EXIT_FORWARDED);
        let plan = plan_tracer(&spec, IpFamily::IPv4, None).unwrap();
        // What iptables-save prints for those rules: other option order, /32, --set-xmark, more digits,
        // someone else's rule in a built-in chain.
        let svc = crate::iptables::names::cluster_policy_chain("ns1/web:http", "tcp");
        let saved = |last: &str| {
            plan.save(Table::Nat)
                .lines()
                .map(|line| {
                    line.replace("-j MARK --or-mark 0x4000", "-j MARK --set-xmark 0x4000/0x4000")
                        .replace("--probability 0.5000000000", "--probability 0.50000000000")
                        .replace("-d 10.96.0.1 ", "-d 10.96.0.1/32 ")
                        .replace("--to-destination 10.244.3.5:8080", last)
                })
                .chain(["-A PREROUTING -s 192.0.2.1/32 -j DROP".to_string()])
                .collect::<Vec<_>>()
                .join("\n")
        };
        let filter = plan.save(Table::Filter);
        let same = kernel_tracer(
            IpFamily::IPv4,
            &[],
            &[saved("--to-destination 10.244.3.5:8080"), filter.clone()],
        )
        .unwrap();
        let trace = same.trace(&packet).unwrap();
        assert_eq!(drift(&plan, &plan_trace, &same, &trace), Vec::<String>::new());

        let edited = kernel_tracer(
            IpFamily::IPv4,
            &[],
            &[saved("--to-destination 10.244.9.9:8080"), filter],
        )
        .unwrap();
        let trace = edited.trace(&packet).unwrap();
        let found = drift(&plan, &plan_trace, &edited, &trace);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].contains("the kernel 10.244.2.5:8080, 10.244.9.9:8080"),
            "{found:#?}"
        );
        assert!(
            found[1].starts_with(&format!("nat {svc} rule 3: kernel `")),
            "{found:#?}"
        );
        assert!(found[1].contains("10.244.9.9:8080"), "{found:#?}");
    }

    #[test]
    fn ipvs_drift_names_the_scheduler_weights_and_real_servers_and_the_outcome_is_the_kernels() {
        use crate::ipvs::kernel::{Destination as Real, RealKey, Service, VirtualKey};
        use crate::ipvs::render::VirtualServer;
        let real = |ip: &str| RealKey {
            addr: ip.parse().unwrap(),
            port: 8080,
        };
        let key = VirtualKey {
            addr: "10.96.0.11".parse().unwrap(),
            protocol: Protocol::TCP,
            port: 80,
        };
        let planned = VirtualServer {
            entry: 0,
            scheduler: "wrr".into(),
            persistence: None,
            reals: [(real("10.244.0.2"), 3), (real("10.244.0.3"), 1)].into(),
        };
        let fresh = || Explanation {
            node: "n".into(),
            backend: "ipvs".into(),
            service: Some("default/b:http".into()),
            steps: Vec::new(),
            outcome: Outcome::Rejected,
            drift: None,
        };
        let service = Service::new(key, "wrr", None);
        let agreeing = [Real::new(real("10.244.0.2"), 3), Real::new(real("10.244.0.3"), 1)];
        let mut explanation = fresh();
        ipvs_kernel(&mut explanation, Some(&planned), Some((&service, &agreeing)));
        assert_eq!(explanation.drift, Some(vec![]));
        let Outcome::Forwarded { endpoints } = &explanation.outcome else {
            panic!("{explanation:?}")
        };
        assert_eq!(endpoints[0].probability, 0.75);

        let rr = Service::new(key, "rr", None);
        let edited = [Real::new(real("10.244.0.2"), 1), Real::new(real("10.244.0.9"), 1)];
        let mut explanation = fresh();
        ipvs_kernel(&mut explanation, Some(&planned), Some((&rr, &edited)));
        assert_eq!(
            explanation.drift.unwrap(),
            [
                "scheduler: kernel rr, plan wrr",
                "real server 10.244.0.2:8080: kernel weight 1, plan 3",
                "the kernel lacks the real server 10.244.0.3:8080 (weight 1)",
                "the kernel has an extra real server 10.244.0.9:8080 (weight 1)",
            ]
        );
        let mut explanation = fresh();
        ipvs_kernel(&mut explanation, Some(&planned), None);
        assert_eq!(explanation.outcome, Outcome::NotAService);
    }
}
