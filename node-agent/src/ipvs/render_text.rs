//! What `switchyard-agent render --backend ipvs` prints (pure): the desired state in the formats of the
//! tools that would show it on the node.
//!
//! ```text
//! Desired ─► ipvsadm-restore lines (-A virtual server, -a real server)
//!        ─► the addresses of swyd-ipvs0
//!        ─► ipset restore lines (create, add)
//!        ─► per family: the glue as iptables-restore --noflush input, then the jump rules
//! ```

use std::fmt::Write as _;
use std::net::IpAddr;

use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

use super::dummy::INTERFACE;
use super::glue::{jump_rules, payload};
use super::kernel::VirtualKey;
use super::render::Desired;
use super::sets::SetKind;
use crate::xtables::tokens::shell_quote;

fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(ip) => format!("{ip}:{port}"),
        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
    }
}

fn service_flag(key: &VirtualKey) -> String {
    let flag = match key.protocol {
        Protocol::TCP => "-t",
        Protocol::UDP => "-u",
        Protocol::SCTP => "--sctp-service",
    };
    format!("{flag} {}", endpoint(key.addr, key.port))
}

/// The render output for `spec`; `node_ports` says where NodePorts were resolved to, per family.
pub fn render_text(
    spec: &NodeForwardingPlanSpec,
    desired: &Desired,
    node_ports: &[(IpFamily, Vec<IpAddr>)],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# switchyard-agent render: node {}, revision {}, backend ipvs",
        spec.node_name, spec.revision
    );
    for (family, ips) in node_ports {
        let _ = writeln!(out, "# {family:?} NodePorts on {ips:?}");
    }
    let reals: usize = desired.virtuals.values().map(|v| v.reals.len()).sum();
    let _ = writeln!(
        out,
        "\n# === IPVS (ipvsadm-restore): {} virtual servers, {reals} real servers ===",
        desired.virtuals.len()
    );
    for (key, vs) in &desired.virtuals {
        let entry = spec
            .services
            .get(vs.entry)
            .map_or(String::new(), |e| format!("  # {}", e.name));
        let persistence = vs.persistence.map_or(String::new(), |t| format!(" -p {t}"));
        let _ = writeln!(
            out,
            "-A {} -s {}{persistence}{entry}",
            service_flag(key),
            vs.scheduler
        );
        for (real, weight) in &vs.reals {
            let _ = writeln!(
                out,
                "-a {} -r {} -m -w {weight}",
                service_flag(key),
                endpoint(real.addr, real.port)
            );
        }
    }
    let _ = writeln!(out, "\n# === addresses on {INTERFACE} ===");
    for ip in &desired.addresses {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(out, "{ip}/{prefix}");
    }
    let _ = writeln!(out, "\n# === ipsets (ipset restore -exist) ===");
    for (name, set) in &desired.sets {
        let _ = match set.kind {
            SetKind::BitmapPort => writeln!(out, "create {name} bitmap:port range 0-65535"),
            kind => writeln!(
                out,
                "create {name} {} family {}",
                kind.type_name(),
                if set.family == IpFamily::IPv4 {
                    "inet"
                } else {
                    "inet6"
                }
            ),
        };
        for member in &set.members {
            let _ = writeln!(out, "add {name} {member}");
        }
    }
    for (family, glue) in &desired.glue {
        let (restore, iptables) = match family {
            IpFamily::IPv4 => ("iptables-restore", "iptables"),
            IpFamily::IPv6 => ("ip6tables-restore", "ip6tables"),
        };
        let _ = writeln!(
            out,
            "\n# === {family:?}: {restore} --noflush (glue, {} rules) ===",
            glue.rule_count()
        );
        out.push_str(&payload(glue, &[], &[]));
        let _ = writeln!(
            out,
            "# === {family:?}: jump rules, each ensured, else inserted at position 1 in this order ==="
        );
        for jump in jump_rules(*family) {
            let args: Vec<String> = jump.args.iter().map(|a| shell_quote(a)).collect();
            let _ = writeln!(
                out,
                "{iptables} -t {} -I {} 1 {}",
                jump.table,
                jump.chain,
                args.join(" ")
            );
        }
    }
    if !desired.conflicts.is_empty() {
        let _ = writeln!(out, "\n# === conflicts ===");
        for (entry, why) in &desired.conflicts {
            let _ = writeln!(out, "# spec.services[{entry}]: {why}");
        }
    }
    out
}
