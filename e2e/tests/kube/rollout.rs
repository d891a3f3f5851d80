//! The kube suite's rollouts (issue 43), on the real cluster with the steady prober running (the caller
//! counts its connections):
//!
//! ```text
//! to_nftables_everywhere: explain verdicts of two Services on every node ─► ForwardingRollout to
//!   nftables over every node ─► Complete; every plan asks for and uses nftables; the verdicts unchanged
//! leader_deleted_mid_rollout: a rollout back to iptables, its first node baking ─► the controller leader
//!   deleted ─► another leads ─► the node bakes on (never switched again) ─► Complete
//! first_node_lacks_nftables: node-a's agent image without nft ─► a rollout to nftables ─► node-a fails
//!   its `backend` gate, back on iptables (label, plan, agent) within 30 s ─► Halted, a GateFailed
//!   Event naming node-a and the gate; node-b untouched (label, plan revision)
//! controller_changes_only_the_backend_label: the admission policy, as the controller's service account
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::kube::{KubeCluster, install};

use super::{
    AGENT_IMAGE, agent_image_now, agent_pod, delete_agent_pod, json, tag, wait_agent_ready, wait_until,
};

const NODES: [&str; 2] = ["node-a", "node-b"];
const LABEL: &str = "switchyard.io/backend";
const CONTROLLER_ACCOUNT: &str = "system:serviceaccount:switchyard-system:switchyard-controller";
/// Frontends whose verdicts are compared before and after: the web and steady Services' ClusterIPs.
const FRONTENDS: [&str; 2] = ["10.96.100.10:80", "10.96.100.18:80"];

fn rollout(name: &str, backend: &str, bake_seconds: u32) -> String {
    format!(
        "apiVersion: switchyard.io/v1alpha2\n\
         kind: ForwardingRollout\n\
         metadata:\n  name: {name}\n\
         spec:\n  target:\n    backend: {backend}\n  maxParallel: 1\n  bakeSeconds: {bake_seconds}\n"
    )
}

fn create(cluster: &KubeCluster, name: &str, backend: &str, bake_seconds: u32) -> Instant {
    cluster
        .kubectl_stdin(&["apply", "-f", "-"], &rollout(name, backend, bake_seconds))
        .unwrap();
    Instant::now()
}

fn status(cluster: &KubeCluster, name: &str) -> Value {
    json(cluster, &["get", "fwr", name])["status"].clone()
}

fn node_phase(status: &Value, node: &str) -> String {
    status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == node)
        .and_then(|n| n["phase"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Waits for the rollout's phase to be `want`; any other end (Complete or Halted) fails at once.
fn wait_phase(cluster: &KubeCluster, name: &str, want: &str, timeout: Duration) -> Value {
    wait_until(timeout, &format!("fwr/{name} to be {want}"), || {
        let status = status(cluster, name);
        let phase = status["phase"].as_str().unwrap_or_default().to_owned();
        if phase == want {
            return Some(status);
        }
        assert!(
            !matches!(phase.as_str(), "Complete" | "Halted"),
            "fwr/{name} is {phase}, not {want}: {}\n{status:#}",
            status["message"]
        );
        None
    })
}

fn show(cluster: &KubeCluster, name: &str) {
    eprintln!(
        "{}",
        cluster.kubectl(&["get", "fwr", name, "-o", "wide"]).unwrap()
    );
    eprintln!(
        "{}",
        cluster
            .kubectl(&["get", "nodes", "-L", LABEL])
            .unwrap_or_default()
    );
}

/// The rollout's Events (core/v1 view): (reason, the related node or "", message).
fn events(cluster: &KubeCluster, name: &str) -> Vec<(String, String, String)> {
    let all = json(cluster, &["get", "events", "-A"]);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    all["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["kind"] == "ForwardingRollout" && e["involvedObject"]["name"] == name)
        .map(|e| {
            (
                text(&e["reason"]),
                text(&e["related"]["name"]),
                text(&e["message"]),
            )
        })
        .collect()
}

fn label(cluster: &KubeCluster, node: &str) -> Option<String> {
    json(cluster, &["get", "node", node])["metadata"]["labels"][LABEL]
        .as_str()
        .map(str::to_owned)
}

/// What `node` does with a new connection from itself to `frontend`, through its agent's
/// `explain --kernel`: the outcome and each endpoint with its masquerade (not the counters).
fn verdict(cluster: &KubeCluster, node: &str, frontend: &str) -> String {
    let (pod, _) = agent_pod(cluster, node).expect("an agent on the node");
    let out = cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "exec",
            &pod,
            "-c",
            "agent",
            "--",
            "switchyard-agent",
            "explain",
            "--node",
            node,
            "--to",
            frontend,
            "--from",
            "node",
            "--kernel",
            "-o",
            "json",
        ])
        .unwrap_or_else(|error| panic!("explain on {node} for {frontend}: {error}"));
    let explained: Value = serde_json::from_str(&out).unwrap();
    let drift = explained["drift"].as_array().cloned().unwrap_or_default();
    assert!(
        drift.is_empty(),
        "{node}: the kernel differs from the plan for {frontend}: {drift:?}"
    );
    let outcome = &explained["outcome"];
    let mut endpoints: Vec<String> = outcome["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{} masquerade={}",
                e["endpoint"].as_str().unwrap_or_default(),
                e["masquerade"]
            )
        })
        .collect();
    endpoints.sort();
    format!(
        "{}: {}",
        outcome["outcome"].as_str().unwrap_or_default(),
        endpoints.join(", ")
    )
}

fn verdicts(cluster: &KubeCluster) -> BTreeMap<(String, String), String> {
    let mut all = BTreeMap::new();
    for node in NODES {
        for frontend in FRONTENDS {
            all.insert(
                (node.to_owned(), frontend.to_owned()),
                verdict(cluster, node, frontend),
            );
        }
    }
    all
}

/// `(spec.backend, status.backend, applied: status.observedRevision == spec.revision)` of a plan.
fn plan_backend(cluster: &KubeCluster, node: &str) -> (String, String, bool) {
    let plan = json(cluster, &["get", "nfp", node]);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&plan["spec"]["backend"]),
        text(&plan["status"]["backend"]),
        plan["status"]["observedRevision"] == plan["spec"]["revision"],
    )
}

/// A rollout iptables → nftables over every node: Complete, each node on nftables, each verdict as before.
pub fn to_nftables_everywhere(cluster: &KubeCluster) {
    let before = verdicts(cluster);
    for ((node, frontend), verdict) in &before {
        eprintln!("kube: rollout: {node} {frontend} before: {verdict}");
    }
    let created = create(cluster, "to-nftables", "nftables", 10);
    let status = wait_phase(cluster, "to-nftables", "Complete", Duration::from_secs(300));
    eprintln!(
        "kube: number: rollout iptables → nftables over {} nodes (bake 10 s each): Complete in {:.1} s",
        NODES.len(),
        created.elapsed().as_secs_f64()
    );
    show(cluster, "to-nftables");
    assert_eq!(status["progress"], "2/2", "{status:#}");
    for node in NODES {
        assert_eq!(node_phase(&status, node), "Done");
        assert_eq!(label(cluster, node).as_deref(), Some("nftables"));
        let plan = wait_until(Duration::from_secs(30), "the plan applied", || {
            let plan = plan_backend(cluster, node);
            plan.2.then_some(plan)
        });
        assert_eq!(
            plan,
            ("nftables".to_owned(), "nftables".to_owned(), true),
            "{node}"
        );
    }
    let after = verdicts(cluster);
    assert_eq!(before, after, "every verdict is the same on nftables");
    let events = events(cluster, "to-nftables");
    for (reason, node, message) in &events {
        eprintln!("kube: rollout to-nftables: Event {reason} {node}: {message}");
    }
    for node in NODES {
        assert!(
            events.iter().any(|(r, n, _)| r == "NodeDone" && n == node),
            "a NodeDone Event for {node}: {events:?}"
        );
    }
    assert!(events.iter().any(|(r, ..)| r == "Complete"));
}

/// The leader is deleted while the first node of a rollout (back to iptables) bakes: the next leader
/// resumes there — the node is never switched again — and the rollout completes.
pub fn leader_deleted_mid_rollout(cluster: &KubeCluster) {
    create(cluster, "to-iptables", "iptables", 40);
    let baking = wait_until(Duration::from_secs(120), "node-a to bake", || {
        let status = status(cluster, "to-iptables");
        (node_phase(&status, "node-a") == "Baking").then_some(status)
    });
    let since = baking["nodes"][0]["since"].clone();
    let lease = json(
        cluster,
        &["-n", "switchyard-system", "get", "lease", "switchyard-controller"],
    );
    let leader = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
    let deleted = Instant::now();
    cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "delete",
            "pod",
            &leader,
            "--wait=false",
        ])
        .unwrap();
    let mut seen = Vec::new();
    let next = wait_until(Duration::from_secs(60), "another leader", || {
        let status = status(cluster, "to-iptables");
        seen.push(node_phase(&status, "node-a"));
        let lease = json(
            cluster,
            &["-n", "switchyard-system", "get", "lease", "switchyard-controller"],
        );
        let holder = lease["spec"]["holderIdentity"].as_str()?.to_owned();
        (holder != leader).then_some(holder)
    });
    eprintln!(
        "kube: number: controller leader deleted mid-rollout: {leader} → {next} in {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
    // The next leader resumes at the same step: node-a bakes on from the same start, or is done.
    let resumed = status(cluster, "to-iptables");
    let phase = node_phase(&resumed, "node-a");
    assert!(
        phase == "Done" || phase == "Baking" && resumed["nodes"][0]["since"] == since,
        "node-a after the failover: {phase}, since {} (was {since}): {resumed:#}",
        resumed["nodes"][0]["since"]
    );
    let status = wait_phase(cluster, "to-iptables", "Complete", Duration::from_secs(300));
    show(cluster, "to-iptables");
    assert_eq!(status["progress"], "2/2", "{status:#}");
    assert!(
        seen.iter().all(|p| p == "Baking" || p == "Done"),
        "node-a went back a step during the failover: {seen:?}"
    );
    let events = events(cluster, "to-iptables");
    let switched: Vec<&(String, String, String)> = events
        .iter()
        .filter(|(r, n, _)| r == "NodeSwitching" && n == "node-a")
        .collect();
    assert_eq!(switched.len(), 1, "node-a switched once: {events:?}");
    for node in NODES {
        assert_eq!(label(cluster, node).as_deref(), Some("iptables"));
        assert_eq!(
            plan_backend(cluster, node).0,
            "iptables",
            "{node}'s plan asks for iptables"
        );
    }
}

/// node-a's agent runs an image without nft when a rollout to nftables starts there: the `backend`
/// gate fails, node-a is back on iptables within 30 s, the rollout halts with an Event naming node-a
/// and the gate, and node-b is not touched.
pub fn first_node_lacks_nftables(cluster: &KubeCluster) {
    let image = agent_image_now(cluster);
    let lacking = format!("{AGENT_IMAGE}:{}-no-nft", tag());
    cluster.node("node-a").unwrap().tag(&lacking, &image).unwrap();
    delete_agent_pod(cluster, "node-a");
    wait_agent_ready(cluster, "node-a");
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
    let label_a = label(cluster, "node-a");
    let label_b = label(cluster, "node-b");
    let plan_b = json(cluster, &["get", "nfp", "node-b"])["spec"]["revision"].clone();

    let created = create(cluster, "to-nftables-lacking", "nftables", 10);
    let back = wait_until(
        Duration::from_secs(60),
        "node-a's label, plan and agent back on iptables",
        || {
            let status = status(cluster, "to-nftables-lacking");
            let reverted = node_phase(&status, "node-a") == "Reverted";
            let plan = plan_backend(cluster, "node-a");
            (reverted
                && label(cluster, "node-a") == label_a
                && plan == ("iptables".to_owned(), "iptables".to_owned(), true))
                .then(Instant::now)
        },
    );
    let took = back.duration_since(created);
    eprintln!(
        "kube: number: a node without nft: rollout created → the node back on iptables (reverted, plan applied) in {:.1} s",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    let status = wait_phase(cluster, "to-nftables-lacking", "Halted", Duration::from_secs(30));
    show(cluster, "to-nftables-lacking");
    eprintln!(
        "kube: rollout halted: {}",
        status["message"].as_str().unwrap_or_default()
    );
    let halted = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Halted")
        .cloned()
        .unwrap_or_default();
    assert_eq!(halted["status"], "True", "{status:#}");
    assert_eq!(halted["reason"], "GateFailed", "{status:#}");
    let events = wait_until(Duration::from_secs(30), "the GateFailed Event", || {
        let events = events(cluster, "to-nftables-lacking");
        events
            .iter()
            .any(|(r, n, m)| r == "GateFailed" && n == "node-a" && m.contains("gate backend"))
            .then_some(events)
    });
    for (reason, node, message) in &events {
        eprintln!("kube: rollout to-nftables-lacking: Event {reason} {node}: {message}");
    }
    // No other node changes.
    assert_eq!(node_phase(&status, "node-b"), "Waiting");
    assert_eq!(label(cluster, "node-b"), label_b, "node-b's label");
    assert_eq!(
        json(cluster, &["get", "nfp", "node-b"])["spec"]["revision"],
        plan_b,
        "node-b's plan was rewritten"
    );

    // Back: the right image on node-a.
    cluster
        .node("node-a")
        .unwrap()
        .tag(&format!("{AGENT_IMAGE}:{}", tag()), &image)
        .unwrap();
    delete_agent_pod(cluster, "node-a");
    wait_agent_ready(cluster, "node-a");
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
}

/// The controller's service account may change a Node's backend label and nothing else on it.
pub fn controller_changes_only_the_backend_label(cluster: &KubeCluster) {
    let as_controller = |args: &[&str]| {
        let mut all = vec!["--as", CONTROLLER_ACCOUNT];
        all.extend(args);
        cluster.kubectl(&all)
    };
    for denied in [
        &["label", "node", "node-a", "example.com/pool=web"][..],
        // What `kubectl cordon` sends; cordon itself exits 0 when its patch is refused.
        &[
            "patch",
            "node",
            "node-a",
            "-p",
            r#"{"spec":{"unschedulable":true}}"#,
        ][..],
        &["annotate", "node", "node-a", "example.com/note=x"][..],
    ] {
        let error = as_controller(denied).expect_err("the policy denies it");
        assert!(
            error
                .to_string()
                .contains("may change only the switchyard.io/backend label"),
            "kubectl {denied:?}: {error}"
        );
        eprintln!("kube: as the controller, kubectl {denied:?} is denied: {error}");
    }
    let before = label(cluster, "node-a");
    as_controller(&[
        "label",
        "node",
        "node-a",
        &format!("{LABEL}=iptables"),
        "--overwrite",
    ])
    .unwrap();
    match &before {
        Some(value) => as_controller(&[
            "label",
            "node",
            "node-a",
            &format!("{LABEL}={value}"),
            "--overwrite",
        ]),
        None => as_controller(&["label", "node", "node-a", &format!("{LABEL}-")]),
    }
    .unwrap();
    assert_eq!(label(cluster, "node-a"), before);
}

/// The rollouts go, and the nodes' labels with them (the suite goes on with the default backend).
pub fn clean_up(cluster: &KubeCluster) {
    for name in ["to-nftables", "to-iptables", "to-nftables-lacking"] {
        cluster
            .kubectl(&["delete", "fwr", name, "--ignore-not-found"])
            .unwrap();
    }
    for node in NODES {
        cluster
            .kubectl(&["label", "node", node, &format!("{LABEL}-")])
            .unwrap();
    }
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
}
