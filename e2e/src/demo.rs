//! `make demo`: Switchyard on the example cluster in the lab, shown the way an operator would see it.
//!
//! ```text
//! examples/cluster.yaml ─► lab (3 nodes, pods, client) ─► plans ─► one agent per node
//!   ─► a table in `kubectl get nfp` columns from the plan and status files (no API server runs here)
//!   ─► traffic checks on real packets ─► report ─► teardown (or --keep)
//! ```

use std::path::Path;

use ipnet::Ipv4Net;

use crate::{
    ClusterDescription, Deployed, LabOptions, Place,
    checks::{self, Check, Expect, answered, answered_from, spread, sticky},
    error::Result,
};

/// The checks for `examples/cluster.yaml` (pod names and addresses are that file's).
pub fn example_checks() -> Vec<Check> {
    let client = "192.168.10.200";
    let pod_a = Place::pod("apache-6d4cf56db6-a1"); // on node-a
    let pod_c = Place::pod("nginx-pod-3"); // on node-c
    vec![
        Check::tcp(
            "ClusterIP from a pod, spread over both backends",
            pod_c.clone(),
            "10.96.0.80:80",
            30,
            spread(&["apache-6d4cf56db6-a1", "apache-6d4cf56db6-b2"]),
        ),
        Check::tcp(
            "ClusterIP keeps the pod's source address",
            pod_c.clone(),
            "10.96.0.80:80",
            5,
            answered_from(&["apache"], "10.244.3.30"),
        ),
        Check::tcp(
            "ClusterIP from a node (masqueraded)",
            Place::node("node-c"),
            "10.96.0.80:80",
            5,
            answered_from(&["apache"], "192.168.10.13"),
        ),
        Check::tcp(
            "NodePort 32701 -> 8008 via node-a (seed: nginx-gateway-svc)",
            Place::Client,
            "192.168.10.11:32701",
            5,
            answered(&["nginx-gateway"]),
        ),
        Check::tcp(
            "NodePort 32701 -> 8008 via node-b",
            Place::Client,
            "192.168.10.12:32701",
            5,
            answered(&["nginx-gateway"]),
        ),
        Check::tcp(
            "NodePort 32701 -> 8008 via node-c",
            Place::Client,
            "192.168.10.13:32701",
            5,
            answered(&["nginx-gateway"]),
        ),
        Check::tcp(
            "NodePort 31131 -> 10.254.20.8:8080 (seed: heketi)",
            Place::Client,
            "192.168.10.13:31131",
            3,
            answered(&["heketi"]),
        ),
        Check::tcp(
            "ClusterIP 10.96.125.27:8080 -> heketi",
            pod_a.clone(),
            "10.96.125.27:8080",
            3,
            answered(&["heketi"]),
        ),
        Check::tcp(
            "ClientIP affinity: 10.96.97.97 sticks to one pod",
            pod_c.clone(),
            "10.96.97.97:80",
            20,
            sticky(&["nginx-pod"]),
        ),
        Check::tcp(
            "eTP=Local NodePort: local endpoint, client IP kept",
            Place::Client,
            "192.168.10.11:30080",
            5,
            answered_from(&["web-1"], client),
        ),
        Check::tcp(
            "eTP=Local NodePort on a node without endpoints drops",
            Place::Client,
            "192.168.10.13:30080",
            2,
            Expect::Dropped,
        ),
        Check::tcp(
            "LoadBalancer IP 203.0.113.10 via node-a (source range allows the client)",
            Place::Client,
            "203.0.113.10:80",
            5,
            answered_from(&["web-1"], client),
        ),
        Check::udp(
            "iTP=Local DNS over UDP: the node's own pod",
            pod_a.clone(),
            "10.96.0.53:53",
            5,
            answered(&["node-local-dns-a"]),
        ),
        Check::tcp(
            "iTP=Local DNS over TCP: the node's own pod",
            pod_a.clone(),
            "10.96.0.53:53",
            5,
            answered(&["node-local-dns-a"]),
        ),
        Check::udp(
            "iTP=Local on a node without a local pod drops",
            pod_c.clone(),
            "10.96.0.53:53",
            2,
            Expect::Dropped,
        ),
        Check::tcp(
            "Zone hints: zone-b's node uses zone-b's endpoint",
            pod_c.clone(),
            "10.96.0.60:80",
            10,
            answered(&["catalog-c"]),
        ),
        Check::tcp(
            "Zone hints: zone-a's node uses zone-a's endpoint",
            pod_a.clone(),
            "10.96.0.60:80",
            10,
            answered(&["catalog-a"]),
        ),
        Check::tcp(
            "Terminating fallback: only the serving terminating pod",
            pod_c.clone(),
            "10.96.0.70:80",
            5,
            answered(&["checkout-old-1"]),
        ),
        Check::tcp(
            "externalIP 203.0.113.20:8080",
            Place::Client,
            "203.0.113.20:8080",
            3,
            answered(&["legacy-api"]),
        ),
        Check::tcp(
            "No endpoints: refused at once, not a timeout",
            pod_a,
            "10.96.0.99:80",
            3,
            Expect::Refused,
        ),
    ]
}

/// Options of the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The cluster description.
    pub cluster: std::path::PathBuf,
    /// The controller configuration.
    pub config: Option<std::path::PathBuf>,
    /// Leave the lab up at the end.
    pub keep: bool,
}

/// Runs the demo; returns how many checks failed.
pub fn run(options: &DemoOptions, lab_options: LabOptions) -> Result<usize> {
    let description = ClusterDescription::from_file(&options.cluster)?;
    let config = load_config(options.config.as_deref())?;
    println!(
        "== Bringing up the lab: {} nodes, their pods and an external client (network namespaces)",
        description.nodes.len()
    );
    let deployed = Deployed::up(description, config, lab_options)?;
    println!("{}", deployed.lab.summary());
    // The client reaches service IPs through node-a, as through a router or a BGP-announced VIP.
    for cidr in ["203.0.113.0/24", "10.96.0.0/16"] {
        if let Ok(net) = cidr.parse::<Ipv4Net>() {
            deployed.lab.client_route_via(net, "node-a")?;
        }
    }
    // No API server runs in the lab: the plans are files and each agent writes its status to a file. The
    // table has `kubectl get nfp`'s columns, built from those files; it is not kubectl's output.
    println!(
        "\n== The plans and the status each node's agent wrote, in `kubectl get nfp` columns \
         (plan and status files: no API server in the lab)\n"
    );
    print!("{}", deployed.table(false)?);
    println!("\n== Traffic checks (real packets through each node's iptables rules)\n");
    let failed = run_checks(&deployed.lab, &example_checks())?;
    println!("{}", rules_line(&deployed)?);
    if options.keep {
        let id = deployed.keep()?;
        println!(
            "\nThe lab stays up: `ip netns list | grep {id}`; remove it with `switchyard-lab down {id}`."
        );
    }
    Ok(failed)
}

/// What node-a's kernel holds against the RULES column above: RULES counts the rules in the agent's own
/// chains of both tables (nat and filter), so the nat table alone shows fewer.
fn rules_line(deployed: &Deployed) -> Result<String> {
    let count = |table: &str| -> Result<usize> {
        let save = deployed.exec_in_node("node-a", &["iptables-save", "-t", table])?;
        Ok(String::from_utf8_lossy(&save.stdout)
            .lines()
            .filter(|l| l.starts_with("-A SWYD-"))
            .count())
    };
    let (nat, filter) = (count("nat")?, count("filter")?);
    let reported = deployed.status("node-a")?.and_then(|s| s.rules);
    Ok(rules_sentence(nat, filter, reported))
}

/// The sentence under the checks: the kernel's count in both tables, and how it meets RULES.
pub fn rules_sentence(nat: usize, filter: usize, reported: Option<u64>) -> String {
    let total = nat + filter;
    let held = format!(
        "node-a's kernel holds {total} rules in the agent's SWYD-* chains (`iptables-save` inside its \
         namespace): {nat} in the nat table (DNAT, masquerade) and {filter} in the filter table (REJECT, \
         DROP, firewall)"
    );
    match reported {
        Some(rules) if rules == total as u64 => {
            format!(
                "{held}; RULES above ({rules}) counts both tables, the jump rules from the built-in chains aside"
            )
        }
        Some(rules) => format!("{held}; RULES above says {rules}: the kernel and the status disagree"),
        None => format!("{held}; its status reports no RULES"),
    }
}

/// Runs `checks`, printing each outcome and a summary line; returns how many failed.
pub fn run_checks(lab: &crate::Lab, checks: &[Check]) -> Result<usize> {
    let mut failed = 0;
    for check in checks {
        let outcome = checks::run(lab, check)?;
        if !outcome.passed() {
            failed += 1;
        }
        println!("{outcome}");
    }
    println!("\n{} passed, {failed} failed", checks.len() - failed);
    Ok(failed)
}

fn load_config(path: Option<&Path>) -> Result<switchyard_controller::Config> {
    match path {
        None => Ok(switchyard_controller::Config::default()),
        Some(path) => switchyard_controller::Config::load(path)
            .map_err(|e| crate::LabError::ParseDescription(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_line_says_how_the_kernel_meets_rules() {
        let line = rules_sentence(79, 6, Some(85));
        assert!(line.contains("holds 85 rules"), "{line}");
        assert!(
            line.contains("79 in the nat table") && line.contains("6 in the filter table"),
            "{line}"
        );
        assert!(line.contains("RULES above (85) counts both tables"), "{line}");
        let line = rules_sentence(79, 6, Some(82));
        assert!(
            line.contains("RULES above says 82: the kernel and the status disagree"),
            "{line}"
        );
    }
}
