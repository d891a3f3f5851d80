//! The fixed iptables rules of IPVS mode (pure): a few chains whose rules match ipsets, so their size
//! does not grow with the number of services, as in kube-proxy's IPVS mode (`writeIptablesRules`).
//!
//! ```text
//! nat    PREROUTING, OUTPUT ─► SWYD-SERVICES ─┬─ LOAD-BALANCER dst,dst ─► SWYD-LOAD-BALANCER ─ LB-LOCAL? RETURN : MARK-MASQ
//!                                             ├─ CLUSTER-IP dst,dst from off-cluster sources ─► SWYD-MARK-MASQ
//!                                             ├─ EXTERNAL-IP dst,dst ─► SWYD-MARK-MASQ, ACCEPT; EXTERNAL-IP-LOCAL ─► ACCEPT
//!                                             └─ NODE-PORT dst,dst ─► SWYD-MARK-MASQ   (NODE-PORT-LOCAL: client IP kept)
//!        POSTROUTING ─► SWYD-POSTROUTING: LOOP-BACK dst,dst,src ─► MASQUERADE (hairpin); marked ─► MASQUERADE
//! filter INPUT ─► SWYD-IPVS-FILTER: NO-ENDPOINTS ─► REJECT, NO-LOCAL-EP ─► DROP (new connections);
//!                                   service ports ─► RETURN; other ports of IPVS-IPS ─► REJECT
//!        INPUT, FORWARD ─► SWYD-PROXY-FIREWALL: LB-FW dst,dst ─► SWYD-SOURCE-RANGES-FIREWALL
//!                            (LB-SRC-CIDR / LB-SRC-IP dst,dst,src ─► RETURN, else DROP)
//!        INPUT ─► SWYD-NODEPORTS: HEALTH-CHECK dst ─► ACCEPT;  FORWARD ─► SWYD-FORWARD (marked, established)
//! ```
//!
//! IPVS receives service traffic in LOCAL_IN (the service IPs are local: they sit on the dummy
//! interface), after the filter table's INPUT chain: that is where the no-endpoint verdicts and the
//! filter act, before IPVS picks a real server. The masquerade mark set in nat PREROUTING/OUTPUT
//! survives IPVS's rewrite and is acted on in POSTROUTING (this needs `net.ipv4.vs.conntrack=1`).
//!
//! Chain names share the iptables backend's `SWYD-` prefix and, where the role is the same, its
//! names and jump-rule comments; so switching backends finds, and removes, the other's leftovers.

use std::collections::BTreeSet;

use switchyard_api::IpFamily;

use super::sets::SetId;
use crate::xtables::chains;
use crate::xtables::jumps::JumpRow;
use crate::xtables::jumps::JumpRule;
use crate::xtables::payload::{Chain, Table};
use crate::xtables::tokens::quote_args;

/// nat: LoadBalancer traffic, masqueraded unless its policy is Local.
pub const LOAD_BALANCER: &str = "SWYD-LOAD-BALANCER";
/// filter: drops LoadBalancer traffic from sources outside its ranges.
pub const SOURCE_RANGES_FIREWALL: &str = "SWYD-SOURCE-RANGES-FIREWALL";
/// filter: no-endpoint verdicts, and REJECT of ports no service uses on service IPs.
pub const IPVS_FILTER: &str = "SWYD-IPVS-FILTER";

/// The glue chains the iptables backend has no chain of the same name for: what a switch to iptables
/// removes once iptables' sync rewrote the shared ones.
pub const GLUE_ONLY: [&str; 3] = [LOAD_BALANCER, SOURCE_RANGES_FIREWALL, IPVS_FILTER];

/// What shapes the glue besides the family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlueSettings {
    /// The masquerade mark (`1 << masqueradeBit`).
    pub mark: u32,
    /// The local-traffic detector's match for traffic that is not a pod's (`! -s CIDR`, `! -i BRIDGE`,
    /// `! -i PREFIX+`); `None` means no detector.
    pub not_local: Option<String>,
    /// Masquerade every ClusterIP connection.
    pub masquerade_all: bool,
    /// `MASQUERADE --random-fully` is available.
    pub random_fully: bool,
    /// Conntrack is liberal: no INVALID-drop rule.
    pub tcp_be_liberal: bool,
    /// The cluster's Service ranges of this family (ServiceCIDR objects).
    pub service_cidrs: Vec<String>,
}

/// The glue chains of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glue {
    /// filter chains.
    pub filter: Vec<Chain>,
    /// nat chains.
    pub nat: Vec<Chain>,
}

impl Glue {
    /// The chains of `table`.
    pub fn chains(&self, table: Table) -> &[Chain] {
        match table {
            Table::Filter => &self.filter,
            Table::Nat => &self.nat,
        }
    }

    /// Rules in all chains.
    pub fn rule_count(&self) -> usize {
        self.filter.iter().chain(&self.nat).map(|c| c.rules.len()).sum()
    }
}

/// The chains IPVS mode owns in `table`.
pub fn owned_chains(table: Table) -> BTreeSet<&'static str> {
    match table {
        Table::Filter => BTreeSet::from([
            chains::FORWARD,
            chains::NODEPORTS,
            chains::PROXY_FIREWALL,
            SOURCE_RANGES_FIREWALL,
            IPVS_FILTER,
        ]),
        Table::Nat => BTreeSet::from([
            chains::SERVICES,
            chains::POSTROUTING,
            LOAD_BALANCER,
            chains::MARK_MASQ,
        ]),
    }
}

fn comment(text: &str) -> String {
    format!("-m comment --comment \"{text}\"")
}

fn set_match(id: SetId, family: IpFamily, dims: &str) -> String {
    format!("-m set --match-set {} {dims}", id.name(family))
}

fn chain(name: &str, rules: Vec<String>) -> Chain {
    Chain {
        name: name.to_string(),
        rules,
    }
}

/// The glue of one family.
pub fn glue(family: IpFamily, settings: &GlueSettings) -> Glue {
    let set = |id: SetId, dims: &str| set_match(id, family, dims);
    let mark = format!("{:#x}", settings.mark);
    let masq = chains::MARK_MASQ;

    let mut services = vec![format!(
        "{} {} -j {LOAD_BALANCER}",
        comment("switchyard load balancer IPs"),
        set(SetId::LoadBalancer, "dst,dst")
    )];
    let cluster_ips = comment("switchyard cluster IPs needing SNAT");
    services.push(if settings.masquerade_all {
        format!("{cluster_ips} {} -j {masq}", set(SetId::ClusterIp, "dst,dst"))
    } else if let Some(not_local) = &settings.not_local {
        // Off-cluster traffic to a ClusterIP may have been routed here by a static route for the
        // service range; without SNAT its replies could leave by another path.
        format!(
            "{cluster_ips} {not_local} {} -j {masq}",
            set(SetId::ClusterIp, "dst,dst")
        )
    } else {
        // No detector: at least the node's own connections, whose source the kernel picks from the
        // dummy interface (the service IP itself), must be masqueraded.
        format!("{cluster_ips} {} -j {masq}", set(SetId::ClusterIp, "src,dst"))
    });
    let external = comment("switchyard external IPs");
    services.push(format!(
        "{external} {} -j {masq}",
        set(SetId::ExternalIp, "dst,dst")
    ));
    // ACCEPT ends the nat chain: an external IP that is also a node address must not fall through to
    // the NodePort rule below.
    services.push(format!(
        "{external} {} -j ACCEPT",
        set(SetId::ExternalIp, "dst,dst")
    ));
    services.push(format!(
        "{} {} -j ACCEPT",
        comment("switchyard external IPs with local traffic policy"),
        set(SetId::ExternalIpLocal, "dst,dst")
    ));
    services.push(format!(
        "{} {} -j {masq}",
        comment("switchyard node ports needing SNAT"),
        set(SetId::NodePort, "dst,dst")
    ));

    let load_balancer = vec![
        format!(
            "{} {} -j RETURN",
            comment("switchyard load balancer IPs with local traffic policy"),
            set(SetId::LoadBalancerLocal, "dst,dst")
        ),
        format!("-j {masq}"),
    ];

    let random_fully = if settings.random_fully {
        " --random-fully"
    } else {
        ""
    };
    let postrouting = vec![
        format!(
            "{} {} -j MASQUERADE{random_fully}",
            comment("switchyard hairpin traffic"),
            set(SetId::LoopBack, "dst,dst,src")
        ),
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
        // Clear the mark so a packet that traverses the stack again is not masqueraded twice.
        format!("-j MARK --xor-mark {mark}"),
        format!(
            "{} -j MASQUERADE{random_fully}",
            comment("switchyard service traffic requiring SNAT")
        ),
    ];

    let mut forward = Vec::new();
    for cidr in &settings.service_cidrs {
        // Allocated service IPs sit on the dummy interface, so their packets go to INPUT, never here:
        // a forwarded new connection into a Service range is for an unallocated address. Dropped
        // rather than sent out by the default route (kube-proxy's nftables `cluster-ips-check`; its
        // IPVS mode has none). The node's own packets take OUTPUT and are not covered.
        forward.push(format!(
            "{} -m conntrack --ctstate NEW -d {cidr} -j DROP",
            comment("switchyard drop traffic to unallocated ClusterIPs")
        ));
    }
    if !settings.tcp_be_liberal {
        forward.push("-m conntrack --ctstate INVALID -j DROP".to_string());
    }
    forward.push(format!(
        "{} -m mark --mark {mark}/{mark} -j ACCEPT",
        comment("switchyard forwarding rules")
    ));
    forward.push(format!(
        "{} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("switchyard forwarding conntrack rule")
    ));

    let nodeports = vec![format!(
        "{} {} -j ACCEPT",
        comment("switchyard health check node ports"),
        set(SetId::HealthCheckNodePort, "dst")
    )];
    let firewall = vec![format!(
        "{} {} -j {SOURCE_RANGES_FIREWALL}",
        comment("switchyard load balancer source ranges"),
        set(SetId::LoadBalancerFirewall, "dst,dst")
    )];
    let source_ranges = vec![
        format!("{} -j RETURN", set(SetId::LoadBalancerSourceCidr, "dst,dst,src")),
        format!("{} -j RETURN", set(SetId::LoadBalancerSourceIp, "dst,dst,src")),
        "-j DROP".to_string(),
    ];
    let new = "-m conntrack --ctstate NEW";
    let filter_rules = vec![
        format!(
            "{} {new} {} -j REJECT",
            comment("switchyard services without endpoints"),
            set(SetId::NoEndpoints, "dst,dst")
        ),
        format!(
            "{} {new} {} -j DROP",
            comment("switchyard services without local endpoints"),
            set(SetId::NoLocalEndpoints, "dst,dst")
        ),
        format!("{} -j RETURN", set(SetId::LoadBalancer, "dst,dst")),
        format!("{} -j RETURN", set(SetId::ClusterIp, "dst,dst")),
        format!("{} -j RETURN", set(SetId::ExternalIp, "dst,dst")),
        format!("{} -j RETURN", set(SetId::ExternalIpLocal, "dst,dst")),
        format!("{} -j RETURN", set(SetId::HealthCheckNodePort, "dst")),
        format!(
            "{} {new} {} -j REJECT",
            comment("switchyard other ports of service IPs"),
            set(SetId::ServiceIps, "dst")
        ),
    ];

    Glue {
        filter: vec![
            chain(chains::FORWARD, forward),
            chain(chains::NODEPORTS, nodeports),
            chain(chains::PROXY_FIREWALL, firewall),
            chain(SOURCE_RANGES_FIREWALL, source_ranges),
            chain(IPVS_FILTER, filter_rules),
        ],
        nat: vec![
            chain(chains::SERVICES, services),
            chain(LOAD_BALANCER, load_balancer),
            chain(chains::POSTROUTING, postrouting),
            chain(chains::MARK_MASQ, vec![format!("-j MARK --or-mark {mark}")]),
        ],
    }
}

/// The jump rules from built-in chains into the glue, in the order they are prepended (the last of a
/// chain ends up first). Those shared with the iptables backend carry its exact comments.
pub fn jump_rules(family: IpFamily) -> Vec<JumpRule> {
    use crate::xtables::jumps::NEW_CONNECTIONS as NEW;
    use crate::xtables::jumps::jump_comments::{FIREWALL, FORWARDING, HEALTH, PORTALS, POSTROUTING};
    use Table::{Filter, Nat};
    const ROWS: [JumpRow; 8] = [
        (Filter, "INPUT", IPVS_FILTER, &[], "switchyard ipvs access filter"),
        (Filter, "INPUT", chains::NODEPORTS, &[], HEALTH),
        (Filter, "FORWARD", chains::FORWARD, &[], FORWARDING),
        (Filter, "INPUT", chains::PROXY_FIREWALL, NEW, FIREWALL),
        (Filter, "FORWARD", chains::PROXY_FIREWALL, NEW, FIREWALL),
        (Nat, "OUTPUT", chains::SERVICES, &[], PORTALS),
        (Nat, "PREROUTING", chains::SERVICES, &[], PORTALS),
        (Nat, "POSTROUTING", chains::POSTROUTING, &[], POSTROUTING),
    ];
    JumpRule::from_rows(family, &ROWS)
}

/// The `iptables-restore --noflush` input that rewrites the glue of one family: every glue chain
/// declared (created or flushed) and filled, `stale` chains of ours flushed and deleted, and the
/// `missing` jump rules inserted. Stale jump rules must have been deleted before.
pub fn payload(glue: &Glue, stale: &[(Table, String)], missing: &[JumpRule]) -> String {
    let mut out = String::new();
    for table in [Table::Filter, Table::Nat] {
        out.push_str(&format!("*{table}\n"));
        let stale_here: Vec<&String> = stale
            .iter()
            .filter(|(t, _)| *t == table)
            .map(|(_, n)| n)
            .collect();
        for chain in glue.chains(table) {
            out.push_str(&format!(":{} - [0:0]\n", chain.name));
        }
        for name in &stale_here {
            out.push_str(&format!(":{name} - [0:0]\n"));
        }
        for chain in glue.chains(table) {
            for rule in &chain.rules {
                out.push_str(&format!("-A {} {rule}\n", chain.name));
            }
        }
        for name in &stale_here {
            out.push_str(&format!("-X {name}\n"));
        }
        for jump in missing.iter().filter(|j| j.table == table) {
            out.push_str(&format!("-I {} 1 {}\n", jump.chain, quote_args(&jump.args)));
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> GlueSettings {
        GlueSettings {
            mark: 0x4000,
            not_local: Some("! -s 10.244.0.0/16".into()),
            masquerade_all: false,
            random_fully: true,
            tcp_be_liberal: false,
            service_cidrs: Vec::new(),
        }
    }

    #[test]
    fn the_rule_count_does_not_depend_on_services() {
        let glue = glue(IpFamily::IPv4, &settings());
        assert_eq!(glue.rule_count(), 29);
        for table in [Table::Filter, Table::Nat] {
            let names: BTreeSet<&str> = glue.chains(table).iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, owned_chains(table));
        }
    }

    #[test]
    fn cluster_ip_masquerade_follows_the_detector() {
        let rule = |s: &GlueSettings| glue(IpFamily::IPv4, s).nat[0].rules[1].clone();
        assert!(rule(&settings()).contains("! -s 10.244.0.0/16 -m set --match-set SWYD-CLUSTER-IP dst,dst"));
        let all = GlueSettings {
            masquerade_all: true,
            ..settings()
        };
        assert!(rule(&all).ends_with("-m set --match-set SWYD-CLUSTER-IP dst,dst -j SWYD-MARK-MASQ"));
        let none = GlueSettings {
            not_local: None,
            ..settings()
        };
        assert!(rule(&none).contains("SWYD-CLUSTER-IP src,dst"));
        let v6 = glue(IpFamily::IPv6, &settings());
        assert!(v6.nat[0].rules[0].contains("SWYD-6-LOAD-BALANCER"));
        // The interface detectors: IPVS expresses them in its glue, as kube-proxy's IPVS mode does.
        let bridge = GlueSettings {
            not_local: Some("! -i cbr0".into()),
            ..settings()
        };
        assert!(
            rule(&bridge).contains("! -i cbr0 -m set --match-set SWYD-CLUSTER-IP dst,dst -j SWYD-MARK-MASQ")
        );
    }

    /// One DROP per ServiceCIDR in the forward chain, ahead of its ACCEPTs; none without ServiceCIDRs.
    #[test]
    fn unallocated_service_addresses_are_dropped_per_service_cidr() {
        let with = GlueSettings {
            service_cidrs: vec!["10.96.0.0/16".into(), "10.97.0.0/16".into()],
            ..settings()
        };
        let forward = |s: &GlueSettings| glue(IpFamily::IPv4, s).filter[0].rules.clone();
        let rules = forward(&with);
        assert!(
            rules[0].ends_with("-m conntrack --ctstate NEW -d 10.96.0.0/16 -j DROP"),
            "{rules:?}"
        );
        assert!(rules[1].ends_with("-d 10.97.0.0/16 -j DROP"), "{rules:?}");
        assert_eq!(rules.len(), forward(&settings()).len() + 2);
    }

    #[test]
    fn jump_rules_shared_with_the_iptables_backend_match_it() {
        let ours = jump_rules(IpFamily::IPv4);
        let theirs = crate::iptables::jump_rules(IpFamily::IPv4);
        for jump in &ours {
            if let Some(same) = theirs
                .iter()
                .find(|t| t.table == jump.table && t.chain == jump.chain && t.target() == jump.target())
            {
                assert_eq!(same.args, jump.args);
            }
        }
        assert_eq!(ours.iter().filter(|j| j.target() == IPVS_FILTER).count(), 1);
    }

    #[test]
    fn the_payload_declares_fills_drops_and_jumps() {
        let glue = glue(IpFamily::IPv4, &settings());
        let stale = [(Table::Nat, "SWYD-SVC-ABC".to_string())];
        let missing: Vec<JumpRule> = jump_rules(IpFamily::IPv4)
            .into_iter()
            .filter(|j| j.target() == IPVS_FILTER)
            .collect();
        let text = payload(&glue, &stale, &missing);
        assert!(text.starts_with("*filter\n:SWYD-FORWARD - [0:0]\n"), "{text}");
        assert!(text.contains(
            "-I INPUT 1 -m comment --comment \"switchyard ipvs access filter\" -j SWYD-IPVS-FILTER\nCOMMIT\n*nat"
        ));
        assert!(text.contains(":SWYD-SVC-ABC - [0:0]\n"));
        assert!(text.ends_with("-X SWYD-SVC-ABC\nCOMMIT\n"), "{text}");
        assert_eq!(text.matches("COMMIT").count(), 2);
    }
}
