//! The fixed part of our nftables table: the base chains with their hooks and priorities, the fixed
//! sets, the sets and chains of the classes the entries use, and the top-level dispatch chains. Entries'
//! own elements and chains come from [`super::render::render_entry`].
//!
//! ```text
//! TableState (entries' contributions claimed) ─► render_global(env) ─► + fixed sets, class sets in use,
//!                                                                       nodeport-ips, base chains (hooks),
//!                                                                       services / nodeports / masquerading /
//!                                                                       firewall and endpoint checks
//! is_global_chain(name): owned here (rewritten with every change) vs an entry's chain
//! ```

use switchyard_api::IpFamily;

use super::model::{ChainBody, ChainDef, ChainType, Claim, Hook, Key, SetId, SetState, TableState, Value};
use super::names;
use crate::backend::FamilyEnv;

/// Base chains, with kube-proxy's nftables priorities (see the module docs of [`super`]).
pub fn base_chains() -> [(&'static str, Hook, &'static [&'static str]); 8] {
    use ChainType::{Filter, Nat};
    let hook = |kind, hook, priority| Hook { kind, hook, priority };
    [
        (
            names::FILTER_PREROUTING_PRE_DNAT,
            hook(Filter, "prerouting", -110),
            &[names::FIREWALL_CHECK],
        ),
        (
            names::FILTER_OUTPUT_PRE_DNAT,
            hook(Filter, "output", -110),
            &[names::FIREWALL_CHECK],
        ),
        (
            names::FILTER_INPUT,
            hook(Filter, "input", 0),
            &[names::NODEPORT_ENDPOINTS_CHECK, names::SERVICE_ENDPOINTS_CHECK],
        ),
        (
            names::FILTER_FORWARD,
            hook(Filter, "forward", 0),
            &[names::SERVICE_ENDPOINTS_CHECK, names::CLUSTER_IPS_CHECK],
        ),
        (
            names::FILTER_OUTPUT,
            hook(Filter, "output", 0),
            &[names::SERVICE_ENDPOINTS_CHECK, names::CLUSTER_IPS_CHECK],
        ),
        (
            names::NAT_PREROUTING,
            hook(Nat, "prerouting", -100),
            &[names::SERVICES],
        ),
        (names::NAT_OUTPUT, hook(Nat, "output", -100), &[names::SERVICES]),
        (
            names::NAT_POSTROUTING,
            hook(Nat, "postrouting", 100),
            &[names::MASQUERADING],
        ),
    ]
}

/// Adds the fixed sets, the sets of the classes in use, `nodeport-ips`, and the base and top-level chains
/// to `state` (whose entries' contributions are already in), replacing what was there.
pub fn render_global(env: &FamilyEnv, state: &mut TableState) {
    let family = env.family;
    let ip = env.ip();
    state.elements.retain(|_, elements| !elements.is_empty());
    state.sets.retain(|name, _| SetId::parse(name).is_none());
    for id in SetId::FIXED.into_iter().chain(state.elements.keys().copied()) {
        state.sets.insert(id.name(), SetState::declared(id.decl(family)));
    }
    if let Some(ips) = &env.node_port_ips {
        let elements = ips
            .iter()
            .map(|ip| {
                (
                    Key::Addr(*ip),
                    Claim {
                        value: Value::None,
                        count: 1,
                    },
                )
            })
            .collect();
        state.elements.insert(SetId::NodeportIps, elements);
    } else {
        state.elements.remove(&SetId::NodeportIps);
    }

    for (name, hook, targets) in base_chains() {
        let rules = targets
            .iter()
            .map(|target| {
                let new = if hook.kind == ChainType::Filter {
                    "ct state new "
                } else {
                    ""
                };
                format!("{new}jump {target}")
            })
            .collect();
        state.chains.insert(
            name.to_string(),
            ChainDef {
                base: Some(hook),
                body: ChainBody::Rules(rules),
            },
        );
    }

    let frontend = format!("{ip} daddr . meta l4proto . th dport");
    let mark = env.mark();
    let node_port_match = match &env.node_port_ips {
        // kube-proxy's nftables mode never serves NodePorts on localhost (that needs route_localnet,
        // CVE-2020-8558).
        None => match family {
            IpFamily::IPv4 => "fib daddr type local ip daddr != 127.0.0.0/8".to_string(),
            IpFamily::IPv6 => "fib daddr type local ip6 daddr != ::1".to_string(),
        },
        Some(_) => format!("{ip} daddr @{}", SetId::NodeportIps.name()),
    };
    let masq = names::MARK_FOR_MASQUERADE;
    let mut chains: Vec<(&str, Vec<String>)> = Vec::new();

    let mut services = Vec::new();
    if env.masquerade_all {
        services.push(format!("{ip} daddr @{} jump {masq}", SetId::ClusterIps.name()));
    } else if let Some(not_local) = env.local.nft_not_local(ip) {
        // Off-cluster traffic to a ClusterIP may have been routed here by a static route for the service
        // range and could otherwise bounce off-node asymmetrically.
        services.push(format!(
            "{ip} daddr @{} {not_local} jump {masq}",
            SetId::ClusterIps.name()
        ));
    }
    services.push(format!("{frontend} vmap @{}", SetId::ServiceIps.name()));
    services.push(format!("{frontend} @{} jump {masq}", SetId::FastMasq.name()));
    let mut nodeports = vec![format!(
        "meta l4proto . th dport vmap @{}",
        SetId::ServiceNodeports.name()
    )];
    // One chain per class holds its DNAT rule. It is created with the class's map and never rewritten
    // while the map lives: nft 1.0.6 cannot add a rule naming an existing map declared with `th dport`.
    state
        .chains
        .retain(|name, _| SetId::of_dnat_chain(name).is_none());
    let mut class_chains = Vec::new();
    for id in state.elements.keys() {
        let (Some(chain), Some(eps)) = (id.dnat_chain(), id.endpoints_map()) else {
            continue;
        };
        match id {
            SetId::Fast(n) => {
                services.push(format!("{frontend} @{} goto {chain}", id.name()));
                class_chains.push((
                    chain,
                    format!(
                        "dnat {ip} to {frontend} . numgen random mod {n} map @{}",
                        eps.name()
                    ),
                ));
            }
            SetId::FastNp(n) => {
                nodeports.push(format!("meta l4proto . th dport @{} goto {chain}", id.name()));
                class_chains.push((
                    chain,
                    format!(
                        "meta mark set meta mark | {mark} dnat {ip} to meta l4proto . th dport . numgen random mod {n} map @{}",
                        eps.name()
                    ),
                ));
            }
            _ => {}
        }
    }
    for (chain, rule) in class_chains {
        state.chains.insert(chain, ChainDef::regular(vec![rule]));
    }
    // Last: a NodePort must not shadow a service IP's port of the same number.
    services.push(format!("{node_port_match} jump {}", names::NODEPORTS));
    chains.push((names::SERVICES, services));
    chains.push((names::NODEPORTS, nodeports));
    chains.push((masq, vec![format!("meta mark set meta mark | {mark}")]));
    chains.push((
        names::MASQUERADING,
        vec![
            format!(
                "ct status dnat {ip} saddr . {ip} daddr . meta l4proto . th dport @{} jump {masq}",
                SetId::Hairpin.name()
            ),
            format!("meta mark & {mark} == 0 return"),
            // Clear the bit so a packet that traverses the stack again is not masqueraded twice.
            format!("meta mark set meta mark ^ {mark}"),
            "masquerade fully-random".to_string(),
        ],
    ));
    chains.push((
        names::FIREWALL_CHECK,
        vec![format!("{frontend} vmap @{}", SetId::FirewallIps.name())],
    ));
    chains.push((
        names::SERVICE_ENDPOINTS_CHECK,
        vec![format!("{frontend} vmap @{}", SetId::NoEndpointServices.name())],
    ));
    chains.push((
        names::NODEPORT_ENDPOINTS_CHECK,
        vec![format!(
            "{node_port_match} meta l4proto . th dport vmap @{}",
            SetId::NoEndpointNodeports.name()
        )],
    ));
    // Still addressed to a ClusterIP after DNAT: a port the service does not define.
    let mut cluster_ips_check = vec![format!("{ip} daddr @{} reject", SetId::ClusterIps.name())];
    if !env.service_cidrs.is_empty() {
        // Still inside a Service range after DNAT and no ClusterIP: an unallocated address. Dropped
        // here instead of leaving by the default route (kube-proxy's nftables mode; one element per
        // ServiceCIDR, whatever the number of addresses in it).
        let cidrs: Vec<String> = env.service_cidrs.iter().map(ToString::to_string).collect();
        cluster_ips_check.push(format!("{ip} daddr {{ {} }} drop", cidrs.join(", ")));
    }
    chains.push((names::CLUSTER_IPS_CHECK, cluster_ips_check));
    chains.push((names::REJECT_CHAIN, vec!["reject".to_string()]));
    for (name, rules) in chains {
        state.chains.insert(name.to_string(), ChainDef::regular(rules));
    }
}

/// True for the chains [`render_global`] owns (base, top-level and class chains), as opposed to entries'
/// chains.
pub fn is_global_chain(name: &str) -> bool {
    SetId::of_dnat_chain(name).is_some()
        || base_chains().iter().any(|(n, _, _)| *n == name)
        || [
            names::SERVICES,
            names::NODEPORTS,
            names::MARK_FOR_MASQUERADE,
            names::MASQUERADING,
            names::FIREWALL_CHECK,
            names::SERVICE_ENDPOINTS_CHECK,
            names::NODEPORT_ENDPOINTS_CHECK,
            names::CLUSTER_IPS_CHECK,
            names::REJECT_CHAIN,
        ]
        .contains(&name)
}
