//! The pure iptables render: plan entries of one family → [`Ruleset`].
//!
//! ```text
//! NodeForwardingPlanSpec ─┐
//! HostFacts (edge) ───────┼─► render() ─► Ruleset ─► payload (iptables-restore text)
//! family, skipped entries ┘      │
//!                                └─ per entry, kube-proxy's syncProxyRules: frontends in the top-level
//!                                   chains, SVC/SVL/EXT/FW[/SEP] chains in the entry's own group
//! ```
//!
//! This is a port of kube-proxy v1.36 `pkg/proxy/iptables/proxier.go` (`syncProxyRules`,
//! `writeServiceToEndpointRules`) with `SWYD-` instead of `KUBE-`. The planner already ran
//! `CategorizeEndpoints` for this node, so an entry's endpoint flags are kube-proxy's
//! `clusterEndpoints`/`localEndpoints` and `hasEndpoints` is its `hasEndpoints`; nothing here decides policy.
//!
//! Where the layout differs from kube-proxy's, it is to give the kernel less to validate: with
//! iptables-nft every commit re-validates every rule reachable from the built-in chains (once per
//! built-in chain that reaches them), so a commit costs in proportion to the whole table, and loading
//! one costs far more than in proportion to its chains (docs/benchmarks.md §3).
//! - The policy chains DNAT inline: `-m statistic … -j DNAT` instead of a jump to a per-endpoint SEP
//!   chain. An endpoint keeps a SEP chain only where one rule cannot do its job: ClientIP affinity
//!   (`recent` names the endpoint's chain) and endpoints on this node, whose SEP chain holds the hairpin
//!   mark (set only when this endpoint is picked). kube-proxy writes that mark for every endpoint, but a
//!   connection can come back to its own source only from a pod on this node, as kube-proxy's IPVS mode
//!   also assumes (KUBE-LOOP-BACK holds local endpoints only). At 10,000 Services × 5 endpoints: 10,008
//!   nat chains and 70,008 rules instead of 60,008 and 170,008.
//! - Past [`LARGE_CLUSTER_ENDPOINTS`] per-endpoint rules carry no comment (kube-proxy's large-cluster
//!   mode); frontend rules always do, and chain names are kube-proxy's hashes of the Service port, so a
//!   dump stays readable and comparable with kube-proxy's.
//!
//! Input contract: the entries rendered must have passed [`switchyard_api::validate::validate`] (the edge
//! passes the indexes of the entries that failed as `skip`, and rejects the plan whole on plan-level
//! problems). Validation guarantees every chain a rule jumps to is rendered; the render itself never
//! panics whatever the input.
//!
//! No I/O, no clock, no async: [`HostFacts`] carries everything the edge discovered about the host.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use ipnet::IpNet;
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, PlanEndpoint, ServicePlan, TrafficPolicy};

use super::names;
use super::ruleset::{Ruleset, ServiceChains};
use crate::backend::{FamilyEnv, HostFacts};
use crate::xtables::jumps::{JumpRow, JumpRule, NEW_CONNECTIONS, jump_comments};
use crate::xtables::payload::{Chain, Table};

/// The jump rules from built-in chains into ours, in kube-proxy's order and with kube-proxy's matches.
/// Our comments say "switchyard" where kube-proxy's say "kubernetes", so the two proxies' rules are told
/// apart in a dump (during a migration both may be present). They are the same for both families.
pub fn jump_rules(family: IpFamily) -> Vec<JumpRule> {
    use Table::{Filter, Nat};
    use jump_comments::{EXTERNAL, FIREWALL, FORWARDING, HEALTH, PORTALS, POSTROUTING};
    const NEW: &[&str] = NEW_CONNECTIONS;
    const ROWS: [JumpRow; 12] = [
        (Filter, "INPUT", names::EXTERNAL_SERVICES, NEW, EXTERNAL),
        (Filter, "FORWARD", names::EXTERNAL_SERVICES, NEW, EXTERNAL),
        (Filter, "INPUT", names::NODEPORTS, &[], HEALTH),
        (Filter, "FORWARD", names::SERVICES, NEW, PORTALS),
        (Filter, "OUTPUT", names::SERVICES, NEW, PORTALS),
        (Filter, "FORWARD", names::FORWARD, &[], FORWARDING),
        (Filter, "INPUT", names::PROXY_FIREWALL, NEW, FIREWALL),
        (Filter, "OUTPUT", names::PROXY_FIREWALL, NEW, FIREWALL),
        (Filter, "FORWARD", names::PROXY_FIREWALL, NEW, FIREWALL),
        (Nat, "OUTPUT", names::SERVICES, &[], PORTALS),
        (Nat, "PREROUTING", names::SERVICES, &[], PORTALS),
        (Nat, "POSTROUTING", names::POSTROUTING, &[], POSTROUTING),
    ];
    JumpRule::from_rows(family, &ROWS)
}

/// Renders the entries of `family` from `spec`, skipping the entry indexes in `skip` (those
/// [`switchyard_api::validate::Report::bad_entries`] returned). Entries keep their plan order.
pub fn render(
    spec: &NodeForwardingPlanSpec,
    facts: &HostFacts,
    family: IpFamily,
    skip: &HashSet<usize>,
) -> Ruleset {
    let mut services = Vec::new();
    let mut ruleset = render_each(spec, facts, family, skip, &mut |group| services.push(group));
    ruleset.services = services;
    ruleset
}

/// [`render`] for edges that stream: each entry's chain group is handed to `each` as soon as it is
/// rendered, in plan order, and not kept; the returned [`Ruleset`] holds only the top-level chains
/// (complete, since they need every entry). A 10,000-service ruleset is never held whole this way.
pub fn render_each(
    spec: &NodeForwardingPlanSpec,
    facts: &HostFacts,
    family: IpFamily,
    skip: &HashSet<usize>,
    each: &mut dyn FnMut(ServiceChains),
) -> Ruleset {
    render_selected(spec, facts, family, skip, &|_, _| true, &mut |_, group| {
        each(group)
    })
}

/// [`render_each`] that renders the chain group only of the entries `wanted(index, entry)` selects;
/// the others contribute their top-level rules alone (frontends, verdicts), which is all a partial
/// sync needs from an entry the edge knows is unchanged. `each` gets the plan index with each group.
/// At 10,000 services this is what keeps a one-service partial sync in milliseconds: building the
/// 160,000 per-service rules is most of a full render's time.
pub fn render_selected(
    spec: &NodeForwardingPlanSpec,
    facts: &HostFacts,
    family: IpFamily,
    skip: &HashSet<usize>,
    wanted: &dyn Fn(usize, &ServicePlan) -> bool,
    each: &mut dyn FnMut(usize, ServiceChains),
) -> Ruleset {
    let env = Env::new(spec, facts, family, skip);
    let mut top = TopLevel::default();
    for (index, entry) in spec.services.iter().enumerate() {
        if entry.family != family || skip.contains(&index) {
            continue;
        }
        let want = wanted(index, entry);
        let before = top.lens();
        if let Some(mut group) = render_entry(entry, &env, &mut top, want) {
            group.frontends = top.fingerprint_since(before);
            each(index, group);
        }
    }
    top.finish(&env);
    let TopLevel {
        filter_services,
        filter_external,
        filter_nodeports,
        filter_firewall,
        filter_forward,
        nat,
    } = top;
    let chain = |name: &str, rules: Vec<String>| Chain {
        name: name.to_string(),
        rules,
    };
    let filter = vec![
        chain(names::SERVICES, filter_services),
        chain(names::EXTERNAL_SERVICES, filter_external),
        chain(names::FORWARD, filter_forward),
        chain(names::NODEPORTS, filter_nodeports),
        chain(names::PROXY_FIREWALL, filter_firewall),
        Chain::new(names::CANARY),
    ];
    let nat = vec![
        chain(names::SERVICES, nat.services),
        chain(names::NODEPORTS, nat.nodeports),
        chain(names::POSTROUTING, nat.postrouting),
        chain(names::MARK_MASQ, nat.mark_masq),
        Chain::new(names::CANARY),
    ];
    Ruleset {
        family,
        filter,
        nat,
        services: Vec::new(),
    }
}

/// The chain groups of the entries `wanted(index, entry)` selects, and nothing else: no other entry is
/// rendered and no top-level chain is built. Each group carries the fingerprint of the rules its entry
/// adds to the top-level chains, as [`render_selected`] computes it, so a partial sync can tell that
/// the top-level chains did not change without rendering every entry's frontends (at 10,000 Services
/// that render costs ~50 ms, most of a one-Service change's own time).
pub fn render_groups(
    spec: &NodeForwardingPlanSpec,
    facts: &HostFacts,
    family: IpFamily,
    skip: &HashSet<usize>,
    wanted: &dyn Fn(usize, &ServicePlan) -> bool,
    each: &mut dyn FnMut(usize, ServiceChains),
) {
    let env = Env::new(spec, facts, family, skip);
    for (index, entry) in spec.services.iter().enumerate() {
        if entry.family != family || skip.contains(&index) || !wanted(index, entry) {
            continue;
        }
        let mut top = TopLevel::default();
        if let Some(mut group) = render_entry(entry, &env, &mut top, true) {
            group.frontends = top.fingerprint_since(TopLevel::default().lens());
            each(index, group);
        }
    }
}

/// Above this many endpoints (of one family, over every rendered entry) per-endpoint rules carry no
/// comment: kube-proxy's `largeClusterEndpointsThreshold`. Comments are stored with every rule and
/// parsed by every restore; at 10,000 Services × 5 endpoints they are most of the payload's bytes.
/// Frontend rules keep theirs, so a dump still names every Service.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// Whether `spec`'s entries of `family` (less the `skip`ped ones) render in large-cluster mode: no
/// comments on per-endpoint rules. A change of mode changes every Service's chains, so the edge
/// treats it like a change of the render environment (a full sync).
pub fn large_cluster(spec: &NodeForwardingPlanSpec, family: IpFamily, skip: &HashSet<usize>) -> bool {
    let endpoints: usize = spec
        .services
        .iter()
        .enumerate()
        .filter(|(index, entry)| entry.family == family && !skip.contains(index))
        .map(|(_, entry)| entry.endpoints.len())
        .sum();
    endpoints > LARGE_CLUSTER_ENDPOINTS
}

// === Environment ===

/// Per-family settings every entry needs, resolved once, in the forms the rules spell them.
struct Env<'a> {
    facts: &'a HostFacts,
    base: FamilyEnv,
    /// `0x4000` for bit 14.
    mark: String,
    /// The local-traffic detector's match for pod traffic (`-s CIDR`, `-i BRIDGE`, `-i PREFIX+`);
    /// `None` means no detector.
    local: Option<String>,
    /// Its negation.
    not_local: Option<String>,
    /// Per-endpoint rules carry comments (false in a large cluster, see [`large_cluster`]).
    endpoint_comments: bool,
}

impl<'a> Env<'a> {
    fn new(
        spec: &NodeForwardingPlanSpec,
        facts: &'a HostFacts,
        family: IpFamily,
        skip: &HashSet<usize>,
    ) -> Self {
        let base = FamilyEnv::new(spec, family, &facts.local_addrs);
        Self {
            facts,
            mark: format!("{:#x}", base.mark),
            local: base.local.iptables_local(),
            not_local: base.local.iptables_not_local(),
            endpoint_comments: !large_cluster(spec, family, skip),
            base,
        }
    }
}

// === Top-level chains ===

#[derive(Default)]
struct NatTop {
    services: Vec<String>,
    nodeports: Vec<String>,
    postrouting: Vec<String>,
    mark_masq: Vec<String>,
}

/// Rules of the top-level chains, filled entry by entry, then finished with the fixed rules.
#[derive(Default)]
struct TopLevel {
    filter_services: Vec<String>,
    filter_external: Vec<String>,
    filter_nodeports: Vec<String>,
    filter_firewall: Vec<String>,
    filter_forward: Vec<String>,
    nat: NatTop,
}

impl TopLevel {
    /// How many rules each chain holds so far.
    fn lens(&self) -> [usize; 9] {
        self.chains().map(Vec::len)
    }

    /// A fingerprint of the rules added since `before` (from [`lens`](Self::lens)), chain by chain.
    fn fingerprint_since(&self, before: [usize; 9]) -> u64 {
        let mut hasher = DefaultHasher::new();
        for (chain, from) in self.chains().into_iter().zip(before) {
            chain.get(from..).unwrap_or_default().hash(&mut hasher);
        }
        hasher.finish()
    }

    fn chains(&self) -> [&Vec<String>; 9] {
        [
            &self.filter_services,
            &self.filter_external,
            &self.filter_nodeports,
            &self.filter_firewall,
            &self.filter_forward,
            &self.nat.services,
            &self.nat.nodeports,
            &self.nat.postrouting,
            &self.nat.mark_masq,
        ]
    }

    fn finish(&mut self, env: &Env<'_>) {
        // The NodePort jump must be the last rule of SWYD-SERVICES: the service rules above it match
        // exact destination IPs, and a NodePort on the same port number must not shadow them.
        let last = comment("switchyard service nodeports; NOTE: this must be the last rule in this chain");
        match &env.base.node_port_ips {
            None if env.base.localhost_node_ports => {
                // Localhost NodePorts (opt-in, IPv4): loopback is a local address like any other.
                self.nat.services.push(format!(
                    "{last} -m addrtype --dst-type LOCAL -j {}",
                    names::NODEPORTS
                ));
            }
            None => {
                // kube-proxy with localhost NodePorts disabled excludes loopback explicitly (serving
                // them needs route_localnet, CVE-2020-8558); IPv6 never supports them.
                let loopback = match env.base.family {
                    IpFamily::IPv4 => "127.0.0.0/8",
                    IpFamily::IPv6 => "::1/128",
                };
                self.nat.services.push(format!(
                    "{last} -m addrtype --dst-type LOCAL ! -d {loopback} -j {}",
                    names::NODEPORTS
                ));
            }
            Some(ips) => {
                for ip in ips
                    .iter()
                    .filter(|ip| IpFamily::of(ip) == env.base.family && !ip.is_loopback())
                {
                    self.nat
                        .services
                        .push(format!("{last} -d {ip} -j {}", names::NODEPORTS));
                }
            }
        }

        if env.base.localhost_node_ports && env.base.node_port_ips.is_none() {
            // With route_localnet=1 the kernel routes 127.0.0.0/8 off loopback; a packet from
            // elsewhere addressed there is a martian and must not reach local services (kube-proxy's
            // KUBE-FIREWALL rule, CVE-2020-8558). DNATed localhost NodePort traffic is let through.
            self.filter_nodeports.push(format!(
                "{} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment(names::LOCALNET_COMMENT)
            ));
        }
        for cidr in &env.base.service_cidrs {
            // Still inside a Service range after DNAT (the nat table DNATs every allocated ClusterIP
            // port, and the rules above reject or drop those without endpoints): an unallocated
            // address, or a port no Service defines. Dropped here rather than sent out by the
            // default route; one rule per ServiceCIDR, whatever its size.
            self.filter_services.push(format!(
                "{} -d {cidr} -j DROP",
                comment(names::UNALLOCATED_COMMENT)
            ));
        }

        // Forwarded packets in state INVALID escape DNAT and are answered with RST (kubernetes#74839);
        // dropping them is unnecessary when the conntrack is liberal.
        if !env.facts.tcp_be_liberal {
            self.filter_forward
                .push("-m conntrack --ctstate INVALID -j DROP".into());
        }
        let mark = &env.mark;
        // Accept what we marked, so NodePorts work when the FORWARD policy is DROP.
        self.filter_forward.push(format!(
            "{} -m mark --mark {mark}/{mark} -j ACCEPT",
            comment("switchyard forwarding rules")
        ));
        self.filter_forward.push(format!(
            "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("switchyard forwarding conntrack rule")
        ));

        self.nat
            .postrouting
            .push(format!("-m mark ! --mark {mark}/{mark} -j RETURN"));
        // Clear the mark so a packet that traverses the stack again is not masqueraded twice.
        self.nat.postrouting.push(format!("-j MARK --xor-mark {mark}"));
        let random_fully = if env.facts.random_fully {
            " --random-fully"
        } else {
            ""
        };
        self.nat.postrouting.push(format!(
            "{} -j MASQUERADE{random_fully}",
            comment("switchyard service traffic requiring SNAT")
        ));
        self.nat.mark_masq.push(format!("-j MARK --or-mark {mark}"));
    }
}

// === One entry ===

/// What kube-proxy's per-ServicePort block of `syncProxyRules` decides about one entry before it
/// writes a rule: its chain names, which endpoints each policy uses, which chains exist, and what the
/// filter table does with traffic nothing can serve.
struct Shape<'e> {
    name: &'e str,
    proto: &'static str,
    /// `-m tcp -p tcp`.
    m_proto: String,
    svc_chain: String,
    svl_chain: String,
    ext_chain: String,
    fw_chain: String,
    internal_local: bool,
    external_local: bool,
    uses_cluster_endpoints: bool,
    uses_local_endpoints: bool,
    cluster_endpoints: Vec<&'e PlanEndpoint>,
    local_endpoints: Vec<&'e PlanEndpoint>,
    has_internal_endpoints: bool,
    has_external_endpoints: bool,
    uses_external_chain: bool,
    uses_fw_chain: bool,
    /// `REJECT` (no usable endpoint at all) or `DROP` (only the policy's local set is empty).
    verdict: &'static str,
    verdict_comment: String,
    /// The ClusterIP frontend's match, shared by its DNAT jump and its masquerade rule.
    cluster_ip_match: String,
    lb_comment: String,
}

impl<'e> Shape<'e> {
    fn new(entry: &'e ServicePlan) -> Self {
        let name = entry.name.as_str();
        let proto = entry.protocol.lower();
        let externally_accessible = entry.externally_accessible();
        let internal_local = entry.internal_policy == TrafficPolicy::Local;
        let external_local = entry.external_policy == TrafficPolicy::Local && externally_accessible;
        let uses_cluster_endpoints = !internal_local || externally_accessible;
        let uses_local_endpoints = internal_local || external_local;
        // CategorizeEndpoints returns no cluster (local) endpoints when the policy does not use them.
        let cluster_endpoints: Vec<&PlanEndpoint> = if uses_cluster_endpoints {
            entry.cluster_endpoints().collect()
        } else {
            Vec::new()
        };
        let local_endpoints: Vec<&PlanEndpoint> = if uses_local_endpoints {
            entry.local_endpoints().collect()
        } else {
            Vec::new()
        };
        let has_endpoints = entry.has_endpoints;
        let has_local = has_endpoints && !local_endpoints.is_empty();
        let (verdict, verdict_comment) = if !has_endpoints {
            ("REJECT", comment(&format!("{name} has no endpoints")))
        } else {
            ("DROP", comment(&format!("{name} has no local endpoints")))
        };
        let m_proto = format!("-m {proto} -p {proto}");
        let cluster_ip_match = format!(
            "{} {m_proto} -d {} --dport {}",
            comment(&format!("{name} cluster IP")),
            entry.cluster_ip,
            entry.port
        );
        Self {
            name,
            proto,
            svc_chain: names::cluster_policy_chain(name, proto),
            svl_chain: names::local_policy_chain(name, proto),
            ext_chain: names::external_chain(name, proto),
            fw_chain: names::firewall_chain(name, proto),
            internal_local,
            external_local,
            uses_cluster_endpoints,
            uses_local_endpoints,
            has_internal_endpoints: if internal_local { has_local } else { has_endpoints },
            has_external_endpoints: if external_local { has_local } else { has_endpoints },
            // Based on hasEndpoints, not hasExternalEndpoints: the short-circuit rules for pod and host
            // traffic are needed even when no endpoint serves external traffic.
            uses_external_chain: has_endpoints && externally_accessible,
            uses_fw_chain: has_endpoints
                && !entry.load_balancer_ips.is_empty()
                && !entry.source_ranges.is_empty(),
            cluster_endpoints,
            local_endpoints,
            verdict,
            verdict_comment,
            m_proto,
            cluster_ip_match,
            lb_comment: comment(&format!("{name} loadbalancer IP")),
        }
    }

    /// The chain internal (ClusterIP) traffic goes to.
    fn internal_chain(&self) -> &str {
        if self.internal_local {
            &self.svl_chain
        } else {
            &self.svc_chain
        }
    }

    /// The chain external traffic goes to once the EXT chain let it through.
    fn external_policy_chain(&self) -> &str {
        if self.external_local {
            &self.svl_chain
        } else {
            &self.svc_chain
        }
    }

    /// Where LoadBalancer traffic goes first: the FW chain when source ranges apply.
    fn load_balancer_chain(&self) -> &str {
        if self.uses_fw_chain {
            &self.fw_chain
        } else {
            &self.ext_chain
        }
    }
}

/// kube-proxy's per-ServicePort block of `syncProxyRules`: adds the entry's top-level rules to `top`;
/// returns its own chains when `group` asks for them.
fn render_entry(
    entry: &ServicePlan,
    env: &Env<'_>,
    top: &mut TopLevel,
    group: bool,
) -> Option<ServiceChains> {
    let shape = Shape::new(entry);
    // The top-level chains are rewritten by every sync; the entry's own chains only when it changed.
    frontends(entry, &shape, env, top);
    if !group {
        return None;
    }
    let (mut svc_rules, mut svl_rules) = cluster_ip_masquerade(&shape, env);
    let mut chains: Vec<Chain> = Vec::new();
    chains.extend(external_chain(&shape, env));
    chains.extend(firewall_chain(entry, &shape, env));
    let endpoint_rules = EndpointRules {
        name: shape.name,
        proto: shape.proto,
        affinity: entry.affinity_timeout_seconds,
        comments: env.endpoint_comments,
    };
    if !shape.cluster_endpoints.is_empty() {
        endpoint_rules.write(&mut svc_rules, &shape.cluster_endpoints);
        chains.push(Chain {
            name: shape.svc_chain.clone(),
            rules: svc_rules,
        });
    }
    if !shape.local_endpoints.is_empty() {
        endpoint_rules.write(&mut svl_rules, &shape.local_endpoints);
        chains.push(Chain {
            name: shape.svl_chain.clone(),
            rules: svl_rules,
        });
    }
    endpoint_chains(entry, &shape, &endpoint_rules, &mut chains);
    Some(ServiceChains {
        key: entry.entry_key(),
        chains,
        // Set by the caller, which sees the top-level rules this entry added.
        frontends: 0,
    })
}

/// The entry's frontends in the top-level chains: DNAT jumps in nat, and in filter the verdicts for
/// traffic no endpoint can serve, the source-range DROP and the health-check ACCEPT.
fn frontends(entry: &ServicePlan, shape: &Shape<'_>, env: &Env<'_>, top: &mut TopLevel) {
    let Shape {
        name,
        m_proto,
        ext_chain,
        verdict,
        verdict_comment,
        cluster_ip_match,
        lb_comment,
        ..
    } = shape;
    let port = entry.port;
    let has_endpoints = entry.has_endpoints;
    if shape.has_internal_endpoints {
        top.nat
            .services
            .push(format!("{cluster_ip_match} -j {}", shape.internal_chain()));
    } else {
        top.filter_services.push(format!(
            "{verdict_comment} {m_proto} -d {} --dport {port} -j {verdict}",
            entry.cluster_ip
        ));
    }

    let external_ip_comment = comment(&format!("{name} external IP"));
    for ip in &entry.external_ips {
        if has_endpoints {
            top.nat.services.push(format!(
                "{external_ip_comment} {m_proto} -d {ip} --dport {port} -j {ext_chain}"
            ));
        }
        if !shape.has_external_endpoints {
            // REJECT (no endpoints at all) or DROP whatever the EXT chain did not short-circuit.
            top.filter_external.push(format!(
                "{verdict_comment} {m_proto} -d {ip} --dport {port} -j {verdict}"
            ));
        }
    }

    for ip in &entry.load_balancer_ips {
        if has_endpoints {
            top.nat.services.push(format!(
                "{lb_comment} {m_proto} -d {ip} --dport {port} -j {}",
                shape.load_balancer_chain()
            ));
        }
        if shape.uses_fw_chain {
            // Whatever the FW chain did not DNAT still has the LB IP as destination here.
            let why = comment(&format!("{name} traffic not accepted by {}", shape.fw_chain));
            top.filter_firewall
                .push(format!("{why} {m_proto} -d {ip} --dport {port} -j DROP"));
        }
    }
    if !shape.has_external_endpoints {
        for ip in &entry.load_balancer_ips {
            top.filter_external.push(format!(
                "{verdict_comment} {m_proto} -d {ip} --dport {port} -j {verdict}"
            ));
        }
    }

    if let Some(node_port) = entry.node_port {
        if has_endpoints && env.base.localhost_node_ports && env.base.node_port_ips.is_none() {
            // Its own rule, ahead of the general one, so its kernel counter counts the connections
            // that depend on localhost NodePorts (kube-proxy's nfacct counter
            // `localhost_nps_accepted_pkts`; read into
            // switchyard_agent_iptables_localhost_nodeports_accepted_packets_total).
            top.nat.nodeports.push(format!(
                "{} {m_proto} -d 127.0.0.0/8 --dport {node_port} -j {ext_chain}",
                comment(&format!("{name} {}", names::LOCALHOST_NODEPORT_COMMENT))
            ));
        }
        if has_endpoints {
            // NodePorts are deliberately not subject to loadBalancerSourceRanges (kube-proxy cannot change
            // that without breaking users, and we match it).
            top.nat.nodeports.push(format!(
                "{} {m_proto} --dport {node_port} -j {ext_chain}",
                comment(name)
            ));
        }
        if !shape.has_external_endpoints {
            top.filter_external.push(format!(
                "{verdict_comment} -m addrtype --dst-type LOCAL {m_proto} --dport {node_port} -j {verdict}"
            ));
        }
    }

    if let Some(hc_port) = entry.health_check_node_port {
        // Accepted whether or not there are local endpoints: the health-check server answers 503 then,
        // which is what tells the load balancer to skip this node.
        top.filter_nodeports.push(format!(
            "{} -m tcp -p tcp --dport {hc_port} -j ACCEPT",
            comment(&format!("{name} health check node port"))
        ));
    }
}

/// The first rules of the SVC and SVL chains: the ClusterIP masquerade, in whichever chain internal
/// traffic uses (SVL for iTP=Local), as kube-proxy writes it.
fn cluster_ip_masquerade(shape: &Shape<'_>, env: &Env<'_>) -> (Vec<String>, Vec<String>) {
    let (mut svc_rules, mut svl_rules) = (Vec::new(), Vec::new());
    if !shape.has_internal_endpoints {
        return (svc_rules, svl_rules);
    }
    let cluster_ip_match = &shape.cluster_ip_match;
    let masq = if env.base.masquerade_all {
        Some(format!("{cluster_ip_match} -j {}", names::MARK_MASQ))
    } else {
        // Masquerade off-cluster traffic to the ClusterIP: it may have been routed here by a static
        // route for the service range and could otherwise bounce off-node asymmetrically.
        env.not_local
            .as_ref()
            .map(|not_local| format!("{cluster_ip_match} {not_local} -j {}", names::MARK_MASQ))
    };
    if let Some(rule) = masq {
        if shape.internal_local {
            svl_rules.push(rule)
        } else {
            svc_rules.push(rule)
        }
    }
    (svc_rules, svl_rules)
}

/// The EXT chain: external traffic's masquerade (eTP=Cluster) or the short-circuits of pod and host
/// traffic (eTP=Local), then the external policy chain.
fn external_chain(shape: &Shape<'_>, env: &Env<'_>) -> Option<Chain> {
    if !shape.uses_external_chain {
        return None;
    }
    let Shape { name, svc_chain, .. } = shape;
    let mut ext = Chain::new(shape.ext_chain.clone());
    if !shape.external_local {
        // Endpoints may be on other nodes: masquerade so replies come back through this node.
        ext.rules.push(format!(
            "{} -j {}",
            comment(&format!("masquerade traffic for {name} external destinations")),
            names::MARK_MASQ
        ));
    } else {
        if let Some(local) = &env.local {
            // Pod → external destination behaves as if it went out to the load balancer and came
            // back: neither traffic policy applies.
            ext.rules.push(format!(
                "{} {local} -j {svc_chain}",
                comment(&format!("pod traffic for {name} external destinations"))
            ));
        }
        // The host itself: the LB IP may be local, so it would be the source; masquerade and use
        // every endpoint.
        ext.rules.push(format!(
            "{} -m addrtype --src-type LOCAL -j {}",
            comment(&format!(
                "masquerade LOCAL traffic for {name} external destinations"
            )),
            names::MARK_MASQ
        ));
        ext.rules.push(format!(
            "{} -m addrtype --src-type LOCAL -j {svc_chain}",
            comment(&format!("route LOCAL traffic for {name} external destinations"))
        ));
    }
    if shape.has_external_endpoints {
        ext.rules.push(format!("-j {}", shape.external_policy_chain()));
    }
    Some(ext)
}

/// The FW chain: LoadBalancer traffic from the allowed source ranges goes on to the EXT chain.
fn firewall_chain(entry: &ServicePlan, shape: &Shape<'_>, env: &Env<'_>) -> Option<Chain> {
    if !shape.uses_fw_chain {
        return None;
    }
    let Shape {
        name,
        ext_chain,
        lb_comment,
        ..
    } = shape;
    let mut fw = Chain::new(shape.fw_chain.clone());
    let mut allow_from_node = false;
    for range in &entry.source_ranges {
        let Ok(net) = range.parse::<IpNet>() else { continue };
        fw.rules
            .push(format!("{lb_comment} -s {} -j {ext_chain}", net.trunc()));
        allow_from_node |= env.base.node_ips.iter().any(|ip| net.contains(ip));
    }
    if allow_from_node {
        // A VIP-style LB IP is often local to the node, so node → VIP traffic loops back with the
        // VIP as its source.
        for ip in &entry.load_balancer_ips {
            fw.rules.push(format!("{lb_comment} -s {ip} -j {ext_chain}"));
        }
    }
    // A no-op marker: what falls off this chain is dropped by the SWYD-PROXY-FIREWALL rule above.
    fw.rules.push(comment(&format!(
        "other traffic to {name} will be dropped by {}",
        names::PROXY_FIREWALL
    )));
    Some(fw)
}

/// A SEP chain for each endpoint reachable through either policy chain that needs one; the others
/// are DNATed inline by the policy chains.
fn endpoint_chains(
    entry: &ServicePlan,
    shape: &Shape<'_>,
    endpoint_rules: &EndpointRules<'_>,
    chains: &mut Vec<Chain>,
) {
    let reachable = entry
        .endpoints
        .iter()
        .filter(|ep| (ep.cluster && shape.uses_cluster_endpoints) || (ep.local && shape.uses_local_endpoints))
        .filter(|ep| endpoint_rules.needs_chain(ep));
    let mut seen = HashSet::new();
    for ep in reachable {
        let endpoint = names::join_host_port(&ep.ip, ep.port);
        if !seen.insert(endpoint.clone()) {
            continue;
        }
        let sep = names::endpoint_chain(shape.name, shape.proto, &endpoint);
        let svc_comment = endpoint_rules.comment(shape.name);
        let mut rules = Vec::with_capacity(2);
        if ep.on_node {
            // Hairpin: a pod reaching itself through the service must be SNATed, or the reply would
            // bypass conntrack's reverse DNAT. Only a pod on this node can be the source of one.
            rules.push(format!("{svc_comment}-s {} -j {}", ep.ip, names::MARK_MASQ));
        }
        let recent = if endpoint_rules.affinity.is_some() {
            format!("-m recent --name {sep} --set ")
        } else {
            String::new()
        };
        rules.push(format!(
            "{svc_comment}{recent}{} -j DNAT --to-destination {endpoint}",
            shape.m_proto
        ));
        chains.push(Chain { name: sep, rules });
    }
}

/// How a policy chain reaches its endpoints: kube-proxy's `writeServiceToEndpointRules`, with the DNAT
/// inline where kube-proxy jumps to a per-endpoint chain that holds nothing else.
struct EndpointRules<'a> {
    name: &'a str,
    proto: &'a str,
    affinity: Option<u32>,
    comments: bool,
}

impl EndpointRules<'_> {
    /// An endpoint keeps its own SEP chain only when one rule cannot do its job: ClientIP affinity
    /// (`recent` remembers the client per endpoint chain name) and an endpoint on this node (the hairpin
    /// mark must be set only when this endpoint is picked). Every other endpoint is one inline DNAT rule:
    /// at 10,000 Services × 5 endpoints that is 50,000 chains and 100,000 rules fewer for the kernel to
    /// validate on every commit.
    fn needs_chain(&self, ep: &PlanEndpoint) -> bool {
        self.affinity.is_some() || ep.on_node
    }

    /// `-m comment --comment <text> ` (with the trailing space), or nothing in a large cluster.
    fn comment(&self, text: &str) -> String {
        if self.comments {
            format!("{} ", comment(text))
        } else {
            String::new()
        }
    }

    /// Affinity checks first, then a uniform random pick where rule i of n matches with probability
    /// 1/(n-i) and the last rule always matches.
    fn write(&self, rules: &mut Vec<String>, endpoints: &[&PlanEndpoint]) {
        let (name, proto) = (self.name, self.proto);
        // (comment, SEP chain if the endpoint has one, the rule's action)
        let picks: Vec<(String, Option<String>, String)> = endpoints
            .iter()
            .map(|ep| {
                let endpoint = names::join_host_port(&ep.ip, ep.port);
                let ep_comment = self.comment(&format!("{name} -> {endpoint}"));
                if self.needs_chain(ep) {
                    let sep = names::endpoint_chain(name, proto, &endpoint);
                    let action = format!("-j {sep}");
                    (ep_comment, Some(sep), action)
                } else {
                    let action = format!("-m {proto} -p {proto} -j DNAT --to-destination {endpoint}");
                    (ep_comment, None, action)
                }
            })
            .collect();
        if let Some(seconds) = self.affinity {
            // needs_chain gives every endpoint its chain under affinity.
            for (ep_comment, sep, action) in &picks {
                if let Some(sep) = sep {
                    rules.push(format!(
                        "{ep_comment}-m recent --name {sep} --rcheck --seconds {seconds} --reap {action}"
                    ));
                }
            }
        }
        let n = picks.len();
        for (i, (ep_comment, _, action)) in picks.iter().enumerate() {
            if i + 1 < n {
                rules.push(format!(
                    "{ep_comment}-m statistic --mode random --probability {} {action}",
                    probability(n - i)
                ));
            } else {
                rules.push(format!("{ep_comment}{action}"));
            }
        }
    }
}

/// kube-proxy's `computeProbability`: `1/n` formatted as Go's `%0.10f`.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// xt_comment keeps at most 255 bytes (XT_MAX_COMMENT_LEN 256 with the NUL).
const MAX_COMMENT_BYTES: usize = 255;

/// `-m comment --comment <text>`, quoted like kube-proxy when the text has spaces. The text is made
/// safe for the restore format first: quotes, backslashes and control characters (a newline would end
/// the rule and start another) become `_`, and it is cut to what xt_comment accepts, so no plan content
/// can break or inject into the payload.
fn comment(text: &str) -> String {
    let mut clean: String = text
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if clean.len() > MAX_COMMENT_BYTES {
        let mut end = MAX_COMMENT_BYTES;
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean.truncate(end);
    }
    if clean.is_empty() || clean.contains(' ') {
        format!("-m comment --comment \"{clean}\"")
    } else {
        format!("-m comment --comment {clean}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn probabilities_are_formatted_like_go() {
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(4), "0.2500000000");
        assert_eq!(probability(6), "0.1666666667");
        assert_eq!(probability(7), "0.1428571429");
    }

    #[test]
    fn comments_are_quoted_only_with_spaces_and_never_break_the_payload() {
        assert_eq!(comment("ns1/svc1:p80"), "-m comment --comment ns1/svc1:p80");
        assert_eq!(
            comment("ns1/svc1:p80 cluster IP"),
            "-m comment --comment \"ns1/svc1:p80 cluster IP\""
        );
        assert_eq!(comment("a\"b\nc\\d"), "-m comment --comment a_b_c_d");
        let long = comment(&"x".repeat(400));
        assert_eq!(long.len(), "-m comment --comment ".len() + MAX_COMMENT_BYTES);
        let long_utf8 = comment(&"é".repeat(200));
        assert!(long_utf8.len() <= "-m comment --comment ".len() + MAX_COMMENT_BYTES);
    }

    #[test]
    fn masquerade_mark_follows_the_bit() {
        let mut spec = plan("node-a", vec![]);
        spec.cluster.masquerade_bit = 3;
        let ruleset = render(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
        let mark_masq = &ruleset.nat_chains()[3];
        assert_eq!(mark_masq.name, names::MARK_MASQ);
        assert_eq!(mark_masq.rules, vec!["-j MARK --or-mark 0x8".to_string()]);
        spec.cluster.masquerade_bit = 40;
        let ruleset = render(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
        assert_eq!(
            ruleset.nat_chains()[3].rules,
            vec!["-j MARK --or-mark 0x4000".to_string()]
        );
    }

    #[test]
    fn skipped_and_other_family_entries_are_not_rendered() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80)),
                entry("ns1/b:p", "10.96.0.2", 80).with(ep("10.244.2.2", 80)),
                entry("ns1/c:p", "fd00:10:96::3", 80).with(ep("fd00:10:244:2::3", 80)),
            ],
        );
        let ruleset = render(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::from([1]));
        let keys: Vec<&str> = ruleset.services().iter().map(|s| s.key.name.as_str()).collect();
        assert_eq!(keys, ["ns1/a:p"]);
        let v6 = render(&spec, &HostFacts::default(), IpFamily::IPv6, &HashSet::new());
        let keys: Vec<&str> = v6.services().iter().map(|s| s.key.name.as_str()).collect();
        assert_eq!(keys, ["ns1/c:p"]);
        assert!(
            v6.full_payload()
                .contains("--to-destination [fd00:10:244:2::3]:80")
        );
        assert!(v6.full_payload().contains("! -d ::1/128"));
    }

    /// `count` single-endpoint ClusterIP entries, the first endpoint on this node.
    fn many(count: usize) -> NodeForwardingPlanSpec {
        use switchyard_api::testing::EndpointExt;
        let entries = (0..count)
            .map(|i| {
                let (hi, lo) = (i / 250, i % 250 + 1);
                let endpoint = ep(&format!("10.244.{hi}.{lo}"), 80);
                let endpoint = if i == 0 { endpoint.on_node() } else { endpoint };
                entry(&format!("ns1/s{i}:p"), &format!("10.96.{hi}.{lo}"), 80).with(endpoint)
            })
            .collect();
        plan("node-a", entries)
    }

    #[test]
    fn past_the_large_cluster_threshold_only_frontend_rules_keep_comments() {
        let none = HashSet::new();
        for (count, large) in [
            (LARGE_CLUSTER_ENDPOINTS, false),
            (LARGE_CLUSTER_ENDPOINTS + 1, true),
        ] {
            let spec = many(count);
            assert_eq!(large_cluster(&spec, IpFamily::IPv4, &none), large, "{count}");
            let ruleset = render(&spec, &HostFacts::default(), IpFamily::IPv4, &none);
            let services = ruleset.services();
            let first = &services[0].chains;
            let svc = &first[0].rules;
            let sep = &first[1];
            assert!(sep.name.starts_with(names::SEP_PREFIX), "{first:?}");
            // The masquerade rule of the policy chain is a frontend rule ("cluster IP"): always named.
            assert!(svc[0].contains("--comment \"ns1/s0:p cluster IP\""), "{svc:?}");
            let per_endpoint = svc[1..].iter().chain(&sep.rules);
            assert!(
                per_endpoint
                    .clone()
                    .all(|rule| rule.contains("-m comment") != large),
                "{count} endpoints: {svc:?} {sep:?}"
            );
            // Inline DNAT of an endpoint elsewhere, its own chain for the one on this node (hairpin).
            let other = &services[1];
            assert_eq!(other.chains.len(), 1, "{other:?}");
            assert!(other.chains[0].rules[1].contains("-p tcp -j DNAT --to-destination 10.244."));
            assert!(
                sep.rules[0].ends_with("-s 10.244.0.1 -j SWYD-MARK-MASQ"),
                "{sep:?}"
            );
        }
        // Skipped entries do not count.
        let spec = many(LARGE_CLUSTER_ENDPOINTS + 1);
        assert!(!large_cluster(&spec, IpFamily::IPv4, &HashSet::from([5])));
        assert!(!large_cluster(&spec, IpFamily::IPv6, &none));
    }

    #[test]
    fn jump_rules_match_kube_proxy_shape() {
        let rules = jump_rules(IpFamily::IPv4);
        assert_eq!(rules.len(), 12);
        let first = &rules[0];
        assert_eq!(
            (first.table, first.chain, first.target()),
            (Table::Filter, "INPUT", names::EXTERNAL_SERVICES)
        );
        assert_eq!(
            first.args.join(" "),
            "-m conntrack --ctstate NEW -m comment --comment switchyard externally-visible service portals \
             -j SWYD-EXTERNAL-SERVICES"
        );
        assert!(rules.iter().all(|r| r.target().starts_with(names::PREFIX)));
    }
}
