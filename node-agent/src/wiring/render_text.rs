//! What `switchyard-agent render` prints, for each backend: exactly what `apply` would program, as the
//! tools of that backend would take it (pure: the host's facts come in as data).
//!
//! ```text
//! spec, skipped entries, HostFacts ─► render_text(backend) ─┬─ iptables: per family a header, the full
//!                                                            │    iptables-restore payload, the jump rules
//!                                                            ├─ nftables: per family the `nft -f` text
//!                                                            │    that creates the table from nothing
//!                                                            └─ ipvs: virtual servers (ipvsadm-restore),
//!                                                                 dummy addresses, ipsets, glue, jumps
//! ```

use std::collections::HashSet;

use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use crate::backend::{HostFacts, families_of, node_port_ips};
use crate::iptables::{jump_rules, render};
use crate::xtables::tokens::shell_quote;

/// The `iptables`/`ip6tables` binary and its restore for `family`.
pub fn iptables_binaries(family: IpFamily) -> (&'static str, &'static str) {
    match family {
        IpFamily::IPv4 => ("iptables", "iptables-restore"),
        IpFamily::IPv6 => ("ip6tables", "ip6tables-restore"),
    }
}

/// What `render --backend <backend>` prints for `spec`, less the entries in `skip`. `iptables_version`
/// is what `iptables --version` said, for the header.
pub fn render_text(
    backend: Backend,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    facts: &HostFacts,
    iptables_version: Option<&str>,
) -> String {
    match backend {
        Backend::Iptables => iptables_text(spec, skip, facts, iptables_version),
        Backend::Nftables => nftables_text(spec, skip, facts),
        Backend::Ipvs => ipvs_text(spec, skip, facts),
    }
}

fn iptables_text(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    facts: &HostFacts,
    iptables_version: Option<&str>,
) -> String {
    let mut out = format!(
        "# switchyard-agent render: node {}, revision {}, backend iptables\n# host: {}, random-fully={}, tcp-be-liberal={}\n",
        spec.node_name,
        spec.revision,
        iptables_version.map_or("iptables version unknown", str::trim),
        facts.random_fully,
        facts.tcp_be_liberal,
    );
    for family in families_of(spec) {
        let ruleset = render(spec, facts, family, skip);
        let (iptables, restore) = iptables_binaries(family);
        let nodeports = match node_port_ips(spec, family, &facts.local_addrs) {
            None => "every local address".to_string(),
            Some(ips) => format!("{ips:?}"),
        };
        out.push_str(&format!(
            "\n# === {family:?}: {restore} --noflush ({} entries, {} rules; NodePorts on {nodeports}) ===\n",
            ruleset.services().len(),
            ruleset.rule_count()
        ));
        out.push_str(&ruleset.full_payload());
        out.push_str(&format!(
            "# === {family:?}: jump rules: `apply` looks for each in {iptables}-save output and inserts the missing ones at the top inside the same restore; by hand: ===\n"
        ));
        for jump in jump_rules(family) {
            let args: Vec<String> = jump.args.iter().map(|a| shell_quote(a)).collect();
            out.push_str(&format!(
                "{iptables} -t {} -I {} 1 {}\n",
                jump.table,
                jump.chain,
                args.join(" ")
            ));
        }
    }
    out
}

fn nftables_text(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, facts: &HostFacts) -> String {
    let mut out = format!(
        "# switchyard-agent render: node {}, revision {}, backend nftables\n",
        spec.node_name, spec.revision
    );
    for family in families_of(spec) {
        let nodeports = match node_port_ips(spec, family, &facts.local_addrs) {
            None => "every local address but loopback".to_string(),
            Some(ips) => format!("{ips:?}"),
        };
        let state = crate::nftables::render(spec, facts, family, skip);
        let entries = spec
            .services
            .iter()
            .enumerate()
            .filter(|(i, e)| e.family == family && !skip.contains(i))
            .count();
        out.push_str(&format!(
            "\n# === {family:?}: nft -f - ({entries} entries, {} rules, {} set elements; NodePorts on {nodeports}) ===\n",
            state.rule_count(),
            state.element_count()
        ));
        out.push_str(&crate::nftables::diff::diff(None, &state).text());
    }
    out
}

fn ipvs_text(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, facts: &HostFacts) -> String {
    let desired = crate::ipvs::render(spec, facts, skip);
    let node_ports: Vec<_> = desired
        .glue
        .keys()
        .map(|family| {
            (
                *family,
                crate::ipvs::node_port_addresses(spec, *family, &facts.local_addrs, &desired.addresses),
            )
        })
        .collect();
    crate::ipvs::render_text::render_text(spec, &desired, &node_ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn iptables_render_prints_payloads_and_jump_rules_per_family() {
        let mut spec = plan(
            "node-a",
            vec![
                entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80)),
                entry("ns/a:p", "fd00:10:96::1", 80).with(ep("fd00:10:244:2::1", 80)),
            ],
        );
        spec.node_ips.push("fd00::11".into());
        let facts = HostFacts {
            random_fully: true,
            ..HostFacts::default()
        };
        let text = render_text(
            Backend::Iptables,
            &spec,
            &HashSet::new(),
            &facts,
            Some("iptables v1.8.9 (nf_tables)"),
        );
        assert!(
            text.contains("# === IPv4: iptables-restore --noflush (1 entries"),
            "{text}"
        );
        assert!(
            text.contains("# === IPv6: ip6tables-restore --noflush (1 entries"),
            "{text}"
        );
        assert!(text.contains("--to-destination [fd00:10:244:2::1]:80"));
        assert!(text.contains("MASQUERADE --random-fully"));
        assert!(text.contains(
            "iptables -t nat -I PREROUTING 1 -m comment --comment 'switchyard service portals' -j SWYD-SERVICES"
        ), "{text}");
        assert_eq!(text.matches("*nat").count(), 2);
    }

    #[test]
    fn every_backend_renders_under_its_own_header() {
        let spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        for backend in [Backend::Iptables, Backend::Nftables, Backend::Ipvs] {
            let text = render_text(backend, &spec, &HashSet::new(), &HostFacts::default(), None);
            assert!(
                text.starts_with(&format!(
                    "# switchyard-agent render: node node-a, revision {}, backend {backend}\n",
                    spec.revision
                )),
                "{text}"
            );
            assert!(text.contains("10.244.2.1"), "{backend}: {text}");
        }
    }
}
