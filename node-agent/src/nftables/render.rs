//! The pure nftables render: plan entries of one family → [`TableState`].
//!
//! ```text
//! ServicePlan ─► render_entry(entry, env) ─► Contribution { elements, chains, affinity sets }
//!                      │                         (plain: class-map elements only; complex: its own chains)
//!                      ▼
//!     claims::claim_all (first claim of a map key wins) ─► TableState ─► global::render_global (fixed
//!                                                           sets, the classes in use, base and top-level chains)
//! ```
//!
//! The packet behaviour is kube-proxy v1.36's (the same as [`crate::iptables::render()`]: DNAT sets,
//! REJECT vs DROP, masquerade decisions, eTP=Local short-circuits, hairpin, source ranges with the node-IP
//! allowance, NodePorts on the planned addresses, ClientIP affinity); the layout is not. An entry is
//! - **plain** (Cluster policies, no affinity, has endpoints): its frontends go into the class set
//!   `fast-N` (N = its endpoint count) and its endpoints into `fast-N-eps` (`frontend . slot → ep . port`);
//!   one rule per class in use DNATs with `numgen random mod N`. External frontends are also in
//!   `fast-masq` (always masqueraded); NodePorts use `fast-np-N`. No chain per service: a packet costs at
//!   most one lookup per class, and a sync changes only elements.
//! - **complex** (iTP/eTP Local, or affinity): kube-proxy-like `service-`/`local-`/`external-` chains
//!   (and `endpoint-` chains with `affinity-` sets for ClientIP), dispatched through the `service-ips`
//!   and `service-nodeports` verdict maps.
//! - **without endpoints**: its frontends map to `goto reject-chain` in the filter-hook maps.
//!
//! Source ranges apply to either kind: `firewall-ips` sends LoadBalancer traffic to a `firewall-…` chain
//! before DNAT, which drops sources outside the ranges.
//!
//! Input contract as for iptables: entries have passed [`switchyard_api::validate::validate`]. The render
//! still never panics and never refers to a chain it does not produce, whatever the input.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, PlanEndpoint, ServicePlan, TrafficPolicy};

use super::claims::{self, Contribution};
use super::global::render_global;
use super::model::{ChainDef, Key, SetDecl, SetId, TableState, Value, family_keyword};
use super::names;
use crate::backend::{FamilyEnv, HostFacts};

/// The spellings of the environment nftables rules use.
impl FamilyEnv {
    pub(super) fn ip(&self) -> &'static str {
        family_keyword(self.family)
    }

    pub(super) fn mark(&self) -> String {
        format!("{:#x}", self.mark)
    }
}

/// Renders the entries of `family` from `spec`, skipping the entry indexes in `skip` (those
/// [`switchyard_api::validate::Report::bad_entries`] returned), NodePorts resolved against the host's
/// addresses in `facts`.
pub fn render(
    spec: &NodeForwardingPlanSpec,
    facts: &HostFacts,
    family: IpFamily,
    skip: &HashSet<usize>,
) -> TableState {
    render_in(spec, &FamilyEnv::new(spec, family, &facts.local_addrs), skip)
}

/// [`render`] in an environment already resolved (the dataplane keeps it to compare syncs).
pub fn render_in(spec: &NodeForwardingPlanSpec, env: &FamilyEnv, skip: &HashSet<usize>) -> TableState {
    let family = env.family;
    let mut state = TableState::new(family);
    for (index, entry) in spec.services.iter().enumerate() {
        if entry.family != family || skip.contains(&index) {
            continue;
        }
        claims::claim_all(&mut state, render_entry(entry, env));
    }
    render_global(env, &mut state);
    state
}

fn parse_ip(text: &str, family: IpFamily) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .filter(|ip| IpFamily::of(ip) == family)
}

fn parse_ips(list: &[String], family: IpFamily) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in list.iter().filter_map(|t| parse_ip(t, family)) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

fn endpoints<'a>(list: impl Iterator<Item = &'a PlanEndpoint>, family: IpFamily) -> Vec<(IpAddr, u16)> {
    list.filter_map(|ep| parse_ip(&ep.ip, family).map(|ip| (ip, ep.port)))
        .collect()
}

/// A DNAT target as nft writes it: `10.0.0.1:80`, `[fd00::1]:80`.
fn host_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// kube-proxy's per-ServicePort block, as elements and chains.
pub fn render_entry(entry: &ServicePlan, env: &FamilyEnv) -> Contribution {
    let mut out = Contribution::default();
    let family = env.family;
    let Some(cluster_ip) = parse_ip(&entry.cluster_ip, family) else {
        return out;
    };
    let proto = entry.protocol;
    let port = entry.port;
    let name = entry.name.as_str();
    let p = proto.lower();

    let externally_accessible = entry.externally_accessible();
    let internal_local = entry.internal_policy == TrafficPolicy::Local;
    let external_local = entry.external_policy == TrafficPolicy::Local && externally_accessible;
    let uses_cluster_endpoints = !internal_local || externally_accessible;
    let uses_local_endpoints = internal_local || external_local;
    // CategorizeEndpoints returns no cluster (local) endpoints when the policy does not use them.
    let cluster_eps = if uses_cluster_endpoints {
        endpoints(entry.cluster_endpoints(), family)
    } else {
        Vec::new()
    };
    let local_eps = if uses_local_endpoints {
        endpoints(entry.local_endpoints(), family)
    } else {
        Vec::new()
    };
    let has_endpoints = entry.has_endpoints;
    let has_internal = if internal_local {
        has_endpoints && !local_eps.is_empty()
    } else {
        has_endpoints
    };
    let has_external = if external_local {
        has_endpoints && !local_eps.is_empty()
    } else {
        has_endpoints
    };
    let external_ips = parse_ips(&entry.external_ips, family);
    let lb_ips = parse_ips(&entry.load_balancer_ips, family);
    let node_port = entry.node_port;

    out.push(SetId::ClusterIps, Key::Addr(cluster_ip), Value::None);
    let frontend = |ip: IpAddr| Key::Frontend(ip, proto, port);
    // The ClusterIP first: an externalIP equal to it is the same frontend, and iptables' ClusterIP rule
    // would have matched first.
    let mut external: Vec<IpAddr> = Vec::new();
    for ip in external_ips.iter().chain(&lb_ips) {
        if *ip != cluster_ip && !external.contains(ip) {
            external.push(*ip);
        }
    }

    if !has_endpoints {
        // REJECT: the client fails fast with "connection refused".
        let reject = Value::Goto(names::REJECT_CHAIN.into());
        for ip in std::iter::once(cluster_ip).chain(external.iter().copied()) {
            out.push(SetId::NoEndpointServices, frontend(ip), reject.clone());
        }
        if let Some(node_port) = node_port {
            out.push(SetId::NoEndpointNodeports, Key::Port(proto, node_port), reject);
        }
        return out;
    }

    // Hairpin: a pod reaching itself through the service must be masqueraded, or the reply would
    // bypass conntrack's reverse DNAT. Only endpoints on this node can be their own client here.
    for ep in &entry.endpoints {
        let reachable = (ep.cluster && uses_cluster_endpoints) || (ep.local && uses_local_endpoints);
        if ep.on_node
            && reachable
            && let Some(ip) = parse_ip(&ep.ip, family)
        {
            out.push(SetId::Hairpin, Key::Hairpin(ip, proto, ep.port), Value::None);
        }
    }

    if !lb_ips.is_empty() && !entry.source_ranges.is_empty() {
        firewall(entry, env, &lb_ips, &mut out);
    }

    let plain = !internal_local && !external_local && entry.affinity_timeout_seconds.is_none();
    if plain {
        // Validation guarantees endpoints here; without any the frontends are simply not dispatched.
        let n = cluster_eps.len() as u32;
        if n == 0 {
            return out;
        }
        let dispatch = |out: &mut Contribution, ip: IpAddr| {
            out.push(SetId::Fast(n), frontend(ip), Value::None);
            for (slot, (ep, ep_port)) in cluster_eps.iter().enumerate() {
                out.push(
                    SetId::FastEps(n),
                    Key::FrontendSlot(ip, proto, port, slot as u32),
                    Value::Endpoint(*ep, *ep_port),
                );
            }
        };
        dispatch(&mut out, cluster_ip);
        for ip in &external {
            // External traffic under the Cluster policy may go to another node: always masqueraded.
            out.push(SetId::FastMasq, frontend(*ip), Value::None);
            dispatch(&mut out, *ip);
        }
        if let Some(node_port) = node_port {
            out.push(SetId::FastNp(n), Key::Port(proto, node_port), Value::None);
            for (slot, (ep, ep_port)) in cluster_eps.iter().enumerate() {
                out.push(
                    SetId::FastNpEps(n),
                    Key::PortSlot(proto, node_port, slot as u32),
                    Value::Endpoint(*ep, *ep_port),
                );
            }
        }
        return out;
    }

    // --- Complex: kube-proxy-like chains ---
    let svc_chain = names::service_chain(name, p);
    let svl_chain = names::local_chain(name, p);
    let ext_chain = names::external_chain(name, p);
    let has_svc = !cluster_eps.is_empty();
    let has_svl = !local_eps.is_empty();
    let goto = |chain: &str| Value::Goto(chain.into());
    // Validation guarantees the policy chains exist when used; DROP stands in for a missing one.
    let policy_target = |local: bool| match (local, has_svc, has_svl) {
        (false, true, _) => goto(&svc_chain),
        (true, _, true) => goto(&svl_chain),
        _ => Value::Drop,
    };

    if has_internal {
        out.push(
            SetId::ServiceIps,
            frontend(cluster_ip),
            policy_target(internal_local),
        );
    } else {
        // DROP: the service has endpoints, just none local for iTP=Local.
        out.push(SetId::NoEndpointServices, frontend(cluster_ip), Value::Drop);
    }
    if externally_accessible {
        for ip in &external {
            out.push(SetId::ServiceIps, frontend(*ip), goto(&ext_chain));
            if !has_external {
                // What the external chain did not short-circuit (pod and host sources) is dropped.
                out.push(SetId::NoEndpointServices, frontend(*ip), Value::Drop);
            }
        }
        if let Some(node_port) = node_port {
            out.push(
                SetId::ServiceNodeports,
                Key::Port(proto, node_port),
                goto(&ext_chain),
            );
            if !has_external {
                out.push(
                    SetId::NoEndpointNodeports,
                    Key::Port(proto, node_port),
                    Value::Drop,
                );
            }
        }
        out.chains.push((
            ext_chain.clone(),
            ChainDef::regular(external_rules(
                env,
                external_local,
                has_external,
                &policy_target(false),
                &policy_target(true),
            )),
        ));
    }

    let affinity = entry.affinity_timeout_seconds;
    let mut endpoint_targets = Vec::new();
    if has_svc {
        let rules = dispatch_rules(entry, env, &cluster_eps, affinity, &mut endpoint_targets);
        out.chains.push((svc_chain, ChainDef::regular(rules)));
    }
    if has_svl {
        let rules = dispatch_rules(entry, env, &local_eps, affinity, &mut endpoint_targets);
        out.chains.push((svl_chain, ChainDef::regular(rules)));
    }
    // With affinity, one endpoint chain and affinity set per endpoint reachable through either chain.
    if let Some(seconds) = affinity {
        let mut seen = HashSet::new();
        for (ip, ep_port) in endpoint_targets {
            if !seen.insert((ip, ep_port)) {
                continue;
            }
            let ip_text = ip.to_string();
            let chain = names::endpoint_chain(name, p, &ip_text, ep_port);
            let set = names::affinity_set(name, p, &ip_text, ep_port, seconds);
            let ip_kw = env.ip();
            out.chains.push((
                chain,
                ChainDef::regular(vec![
                    format!("update @{set} {{ {ip_kw} saddr }}"),
                    format!("meta l4proto {p} dnat {ip_kw} to {}", host_port(ip, ep_port)),
                ]),
            ));
            out.sets.push((set, SetDecl::affinity(family, seconds)));
        }
    }
    out
}

/// The `external-…` chain of a complex entry (iptables' EXT chain).
fn external_rules(
    env: &FamilyEnv,
    external_local: bool,
    has_external: bool,
    cluster: &Value,
    local: &Value,
) -> Vec<String> {
    let mut rules = Vec::new();
    let to = |value: &Value| match value {
        Value::Goto(chain) => format!("goto {chain}"),
        _ => "drop".to_string(),
    };
    if !external_local {
        // Endpoints may be on other nodes: masquerade so replies come back through this node.
        rules.push(format!("jump {}", names::MARK_FOR_MASQUERADE));
        rules.push(to(cluster));
        return rules;
    }
    if let Some(local) = env.local.nft_local(env.ip()) {
        // Pod → external destination behaves as if it went out to the load balancer and came back:
        // neither traffic policy applies.
        rules.push(format!("{local} {}", to(cluster)));
    }
    // The host itself: the LB IP may be local, so it would be the source; masquerade and use every
    // endpoint.
    rules.push(format!(
        "fib saddr type local jump {}",
        names::MARK_FOR_MASQUERADE
    ));
    rules.push(format!("fib saddr type local {}", to(cluster)));
    if has_external {
        rules.push(to(local));
    }
    rules
}

/// A policy chain: affinity checks first, then a uniform random pick (`numgen random mod N`, kube-proxy's
/// nftables form of the iptables 1/(n−i) probabilities). Records the endpoints that need endpoint chains.
fn dispatch_rules(
    entry: &ServicePlan,
    env: &FamilyEnv,
    eps: &[(IpAddr, u16)],
    affinity: Option<u32>,
    endpoint_targets: &mut Vec<(IpAddr, u16)>,
) -> Vec<String> {
    let p = entry.protocol.lower();
    let ip_kw = env.ip();
    let n = eps.len();
    let mut rules = Vec::new();
    if let Some(seconds) = affinity {
        let chain = |ip: &IpAddr, port: u16| names::endpoint_chain(&entry.name, p, &ip.to_string(), port);
        for (ip, port) in eps {
            let set = names::affinity_set(&entry.name, p, &ip.to_string(), *port, seconds);
            rules.push(format!("{ip_kw} saddr @{set} goto {}", chain(ip, *port)));
            endpoint_targets.push((*ip, *port));
        }
        if n == 1 {
            rules.push(format!("goto {}", chain(&eps[0].0, eps[0].1)));
        } else {
            let arms: Vec<String> = eps
                .iter()
                .enumerate()
                .map(|(i, (ip, port))| format!("{i} : goto {}", chain(ip, *port)))
                .collect();
            rules.push(format!("numgen random mod {n} vmap {{ {} }}", arms.join(", ")));
        }
        return rules;
    }
    if n == 1 {
        rules.push(format!(
            "meta l4proto {p} dnat {ip_kw} to {}",
            host_port(eps[0].0, eps[0].1)
        ));
    } else {
        let arms: Vec<String> = eps
            .iter()
            .enumerate()
            .map(|(i, (ip, port))| format!("{i} : {ip} . {port}"))
            .collect();
        rules.push(format!(
            "meta l4proto {p} dnat {ip_kw} to numgen random mod {n} map {{ {} }}",
            arms.join(", ")
        ));
    }
    rules
}

/// `firewall-ips` elements and the `firewall-…` chain: LoadBalancer traffic from outside the source
/// ranges is dropped before DNAT. NodePorts and ClusterIPs are never filtered.
fn firewall(entry: &ServicePlan, env: &FamilyEnv, lb_ips: &[IpAddr], out: &mut Contribution) {
    let mut allowed: Vec<IpNet> = entry
        .source_ranges
        .iter()
        .filter_map(|r| r.parse::<IpNet>().ok())
        .filter(|net| IpFamily::of(&net.addr()) == env.family)
        .map(|net| net.trunc())
        .collect();
    if allowed.is_empty() {
        return;
    }
    // A VIP-style LB IP is often local to the node, so node → VIP traffic loops back with the VIP as its
    // source.
    if env
        .node_ips
        .iter()
        .any(|ip| allowed.iter().any(|net| net.contains(ip)))
    {
        allowed.extend(lb_ips.iter().map(|ip| IpNet::from(*ip)));
    }
    let allowed = IpNet::aggregate(&allowed);
    let list: Vec<String> = allowed
        .iter()
        .map(|net| {
            if net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.to_string()
            }
        })
        .collect();
    let chain = names::firewall_chain(&entry.name, entry.protocol.lower());
    out.chains.push((
        chain.clone(),
        ChainDef::regular(vec![format!(
            "{} saddr != {{ {} }} counter drop",
            env.ip(),
            list.join(", ")
        )]),
    ));
    for ip in lb_ips {
        out.push(
            SetId::FirewallIps,
            Key::Frontend(*ip, entry.protocol, entry.port),
            Value::Goto(chain.as_str().into()),
        );
    }
}
