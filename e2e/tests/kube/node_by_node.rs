//! The kube suite's node-by-node migration between kube-proxy and Switchyard (issue 43, docs/migration.md
//! §1), on the real cluster with the steady prober running (the caller counts its connections):
//!
//! ```text
//! beside: both nodes labelled switchyard.io/proxy=switchyard ─► the beside-kube-proxy overlay applied
//!   (the agents restart with its nodeSelector, every plan Applied again)
//! node-b back to kube-proxy: kube-proxy started there, its Services programmed ─► label removed ─► the
//!   agent's pod leaves node-b ─► switchyard-agent cleanup there (no SWYD rule left; kube-proxy's stay)
//!   ─► every flow between node-a (Switchyard) and node-b (kube-proxy) answers
//! node-b to Switchyard again: labelled ─► its agent Ready, its plan Applied ─► kube-proxy --cleanup there
//!   only then (no KUBE- rule left; Switchyard's stay) ─► every flow answers
//! config/default again (the agents everywhere, without the nodeSelector), every plan Applied
//! ```
//!
//! kube-proxy runs as a process on each lab node, not as a DaemonSet, so "the opposite node affinity"
//! of docs/migration.md is the test starting and stopping it; everything on Switchyard's side is the
//! overlay and the label as the guide says.

use std::path::Path;
use std::time::Duration;

use switchyard_e2e::kube::{
    KubeCluster,
    flows::Flow,
    install::{self, Overlay},
};

use super::{agent_pods, check_flows, rollout_status, swyd_rules, wait_agent_ready, wait_until};

const LABEL: &str = "switchyard.io/proxy";
const NODES: [&str; 2] = ["node-a", "node-b"];

/// Rules kube-proxy wrote in the node's nat table (either iptables variant: it picks one).
fn kube_proxy_rules(cluster: &KubeCluster, node: &str) -> usize {
    ["iptables-nft-save", "iptables-legacy-save"]
        .iter()
        .map(|save| {
            cluster
                .node(node)
                .unwrap()
                .run_in(&[(*save).to_owned(), "-t".to_owned(), "nat".to_owned()])
                .unwrap_or_default()
                .lines()
                .filter(|line| line.starts_with("-A KUBE-SVC-") || line.starts_with("-A KUBE-SEP-"))
                .count()
        })
        .sum()
}

fn apply_overlay(cluster: &KubeCluster, dir: &Path) {
    cluster
        .kubectl(&["apply", "-k", &dir.display().to_string()])
        .unwrap();
    rollout_status(cluster, "switchyard-system", "daemonset/switchyard-agent", 180);
    install::wait_all_applied(cluster, Duration::from_secs(120)).unwrap();
}

/// Installs the beside-kube-proxy overlay with every node labelled (nothing moves yet).
pub fn beside_kube_proxy(cluster: &KubeCluster, repo: &Path, overlay: &Overlay) {
    for node in NODES {
        cluster
            .kubectl(&[
                "label",
                "node",
                node,
                &format!("{LABEL}=switchyard"),
                "--overwrite",
            ])
            .unwrap();
    }
    let dir = install::write_overlay_of(
        cluster,
        repo,
        overlay,
        "config/overlays/beside-kube-proxy",
        "install-beside-kube-proxy",
    )
    .unwrap();
    apply_overlay(cluster, &dir);
    let selector = cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "get",
            "daemonset",
            "switchyard-agent",
            "-o",
            "jsonpath={.spec.template.spec.nodeSelector}",
        ])
        .unwrap();
    assert!(
        selector.contains(LABEL),
        "the agent DaemonSet has no {LABEL} nodeSelector: {selector}"
    );
}

/// `node` moves back to kube-proxy while the other node stays on Switchyard.
pub fn back_to_kube_proxy(cluster: &mut KubeCluster, node: &str, flows: &[Flow]) {
    cluster.start_kube_proxy_on(node).unwrap();
    wait_until(
        Duration::from_secs(60),
        &format!("kube-proxy to program {node}"),
        || (kube_proxy_rules(cluster, node) > 0).then_some(()),
    );
    cluster
        .kubectl(&["label", "node", node, &format!("{LABEL}-")])
        .unwrap();
    // Gone, not only terminating: a terminating agent still repairs drift, and would put back what
    // cleanup removes.
    wait_until(
        Duration::from_secs(90),
        &format!("the agent's pod to leave {node}"),
        || {
            let pods = agent_pods(cluster);
            let on_node = pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|pod| pod["spec"]["nodeName"] == node);
            (!on_node).then_some(())
        },
    );
    assert!(
        swyd_rules(cluster, node) > 0,
        "the agent took its rules with it (they must stay until cleanup)"
    );
    let argv = vec![
        env!("CARGO_BIN_EXE_switchyard-lab").to_owned(),
        "agent".to_owned(),
        "cleanup".to_owned(),
    ];
    let out = cluster.node(node).unwrap().run_in(&argv).unwrap();
    eprintln!("kube: switchyard-agent cleanup on {node}: {}", out.trim());
    assert_eq!(
        swyd_rules(cluster, node),
        0,
        "SWYD rules left on {node} after cleanup"
    );
    assert!(
        kube_proxy_rules(cluster, node) > 0,
        "switchyard-agent cleanup removed kube-proxy's rules on {node}"
    );
    check_flows(cluster, &format!("node-a Switchyard, {node} kube-proxy"), flows);
}

/// `node` moves to Switchyard again: its agent's rules first, kube-proxy's leftovers removed after.
pub fn to_switchyard(cluster: &mut KubeCluster, node: &str, flows: &[Flow]) {
    cluster
        .kubectl(&["label", "node", node, &format!("{LABEL}=switchyard")])
        .unwrap();
    wait_agent_ready(cluster, node);
    install::wait_all_applied(cluster, Duration::from_secs(120)).unwrap();
    assert!(
        swyd_rules(cluster, node) > 0,
        "{node}'s plan is Applied, yet it holds no SWYD rule"
    );
    cluster.remove_kube_proxy_on(node).unwrap();
    assert_eq!(
        kube_proxy_rules(cluster, node),
        0,
        "kube-proxy --cleanup left rules on {node}"
    );
    assert!(
        swyd_rules(cluster, node) > 0,
        "kube-proxy --cleanup removed Switchyard's rules on {node}"
    );
    check_flows(cluster, "switchyard", flows);
}

/// Back to the installed overlay (config/default: the agent on every node, no nodeSelector).
pub fn default_again(cluster: &KubeCluster, installed: &Path) {
    apply_overlay(cluster, installed);
    for node in NODES {
        cluster
            .kubectl(&["label", "node", node, &format!("{LABEL}-")])
            .unwrap();
    }
    for node in NODES {
        wait_agent_ready(cluster, node);
    }
}
