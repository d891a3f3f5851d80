//! The kube suite's checks of kube-proxy's health contract (issue 42) and of what the upstream
//! `KubeProxy` and `Conntrack` specs look at (issue 51), on the real cluster:
//!
//! ```text
//! install while kube-proxy runs ─► ports_held_by_kube_proxy: every agent reports PortUnavailable
//! kube-proxy removed ─► ports_taken: Degraded clears (the ports are the agent's within seconds)
//! kube_proxy_urls: from a host-network pod, localhost:10256/healthz, /livez, localhost:10249/proxyMode;
//!   every node's namespace holds conntrack's CLOSE_WAIT timeout as kube-proxy sets it
//! a_tainted_node_leaves: Karpenter's taint ─► /healthz 503 (livez 200), LEAVING in kubectl get nfp, the
//!   drain in status, the agent never restarted ─► taint removed ─► 200
//! a_deleted_node_leaves: a Node held by a finalizer and deleted ─► /healthz 503, reason deletionTimestamp
//! ```

use std::time::{Duration, Instant};

use switchyard_e2e::kube::KubeCluster;

use super::{json, wait_until};

/// The pod (host network, on node-a) the URLs are read from, as the upstream spec does.
const HOSTNET_POD: &str = "hostnet-client";

/// `(status code, body)` of `url` from the host-network pod.
fn curl(cluster: &KubeCluster, url: &str) -> (u16, String) {
    let out = cluster
        .kubectl(&[
            "-n",
            "flows",
            "exec",
            HOSTNET_POD,
            "--",
            "curl",
            "-s",
            "-m",
            "3",
            "-w",
            "\n%{http_code}",
            url,
        ])
        .unwrap_or_default();
    let (body, code) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn degraded(cluster: &KubeCluster, node: &str) -> (String, String, String) {
    let plan = json(cluster, &["get", "nfp", node]);
    let condition = plan["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded").cloned())
        .unwrap_or_default();
    let text = |key: &str| condition[key].as_str().unwrap_or_default().to_owned();
    (text("status"), text("reason"), text("message"))
}

/// While kube-proxy still runs, it holds 10256 and 10249: every agent says so and forwards anyway.
pub fn ports_held_by_kube_proxy(cluster: &KubeCluster) {
    for node in ["node-a", "node-b"] {
        let (_, _, message) = wait_until(Duration::from_secs(30), "PortUnavailable in status", || {
            let degraded = degraded(cluster, node);
            (degraded.1 == "PortUnavailable").then_some(degraded)
        });
        assert!(message.contains("10256"), "{node}: {message}");
        eprintln!("kube: {node} while kube-proxy runs: Degraded PortUnavailable: {message}");
    }
}

/// Once kube-proxy is gone each agent takes its ports: Degraded clears.
pub fn ports_taken(cluster: &KubeCluster, kube_proxy_gone: Instant) {
    for node in ["node-a", "node-b"] {
        wait_until(Duration::from_secs(30), "Degraded to clear", || {
            (degraded(cluster, node).1 == "Healthy").then_some(())
        });
        eprintln!(
            "kube: number: {node}: kube-proxy's ports served, status healthy {:.1} s after kube-proxy stopped",
            kube_proxy_gone.elapsed().as_secs_f64()
        );
    }
}

/// What the upstream "should check kube-proxy urls" spec reads, and the conntrack settings the
/// "should set TCP CLOSE_WAIT timeout" spec checks, on every node.
pub fn kube_proxy_urls(cluster: &KubeCluster) {
    cluster
        .kubectl(&[
            "-n",
            "flows",
            "wait",
            "--for=condition=Ready",
            &format!("pod/{HOSTNET_POD}"),
            "--timeout=60s",
        ])
        .unwrap();
    let (code, body) = curl(cluster, "http://localhost:10256/healthz");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("\"lastUpdated\"") && body.contains("\"nodeEligible\":true"),
        "{body}"
    );
    let (code, body) = curl(cluster, "http://localhost:10256/livez");
    assert_eq!(code, 200, "{body}");
    let (code, mode) = curl(cluster, "http://localhost:10249/proxyMode");
    assert_eq!((code, mode.as_str()), (200, "iptables"));
    let (code, metrics) = curl(cluster, "http://localhost:10249/metrics");
    assert!(
        code == 200 && metrics.contains("switchyard_agent_syncs_total"),
        "{code}"
    );
    eprintln!("kube: from a host-network pod: :10256/healthz 200, /livez 200, :10249/proxyMode {mode}");
    for node in ["node-a", "node-b"] {
        let read = |sysctl: &str| {
            cluster
                .node(node)
                .unwrap()
                .run_in(&["cat".to_owned(), format!("/proc/sys/net/netfilter/{sysctl}")])
                .unwrap()
                .trim()
                .to_owned()
        };
        let close_wait = read("nf_conntrack_tcp_timeout_close_wait");
        let established = read("nf_conntrack_tcp_timeout_established");
        assert_eq!(close_wait, "3600", "{node}");
        assert!(
            established.parse::<u64>().unwrap() >= 86_400,
            "{node}: {established}"
        );
        eprintln!("kube: {node}: conntrack CLOSE_WAIT {close_wait} s, ESTABLISHED {established} s");
    }
}

/// node-b's `/healthz` (`(code, body)`), read from node-a's host-network pod as a load balancer would.
fn node_b_health(cluster: &KubeCluster, path: &str) -> (u16, String) {
    curl(cluster, &format!("http://192.168.30.12:10256{path}"))
}

fn agent_restarts(cluster: &KubeCluster, node: &str) -> u64 {
    let pods = super::agent_pods(cluster);
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod["spec"]["nodeName"] == node)
        .flat_map(|pod| {
            pod["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|status| status["restartCount"].as_u64().unwrap_or(0))
        .sum()
}

/// Karpenter's taint on node-b: its `/healthz` fails (a load balancer's probe sees it), `/livez` does
/// not, `kubectl get nfp` shows it leaving, its status counts the drain, and the DaemonSet's liveness
/// probe never restarts it. Without the taint, back to 200.
pub fn a_tainted_node_leaves(cluster: &KubeCluster) {
    assert_eq!(node_b_health(cluster, "/healthz").0, 200);
    let restarts = agent_restarts(cluster, "node-b");
    cluster
        .kubectl(&["taint", "node", "node-b", "karpenter.sh/disrupted:NoSchedule"])
        .unwrap();
    let tainted = Instant::now();
    let planned = wait_until(Duration::from_secs(10), "node-b's plan to say it leaves", || {
        let plan = json(cluster, &["get", "nfp", "node-b"]);
        (plan["spec"]["leaving"]["reason"] == "taint:karpenter.sh/disrupted").then(Instant::now)
    });
    let body = wait_until(Duration::from_secs(10), "node-b's /healthz to fail", || {
        let (code, body) = node_b_health(cluster, "/healthz");
        (code == 503).then_some(body)
    });
    let failed = Instant::now();
    assert!(body.contains("\"nodeEligible\":false"), "{body}");
    assert!(
        failed.saturating_duration_since(planned) < Duration::from_secs(2),
        "503 {:?} after the plan was seen",
        failed.saturating_duration_since(planned)
    );
    eprintln!(
        "kube: number: Karpenter's taint → node-b's /healthz 503 in {:.1} s ({:.1} s after its plan said so)",
        failed.duration_since(tainted).as_secs_f64(),
        failed.saturating_duration_since(planned).as_secs_f64()
    );
    let table = cluster.kubectl(&["get", "nfp", "node-b"]).unwrap();
    assert!(
        table.contains("LEAVING") && table.contains("taint:karpenter.sh/disrupted"),
        "{table}"
    );
    eprintln!("{table}");
    let draining = wait_until(Duration::from_secs(20), "the drain in node-b's status", || {
        let plan = json(cluster, &["get", "nfp", "node-b"]);
        let draining = plan["status"]["draining"].clone();
        draining["connections"].is_u64().then_some(draining)
    });
    eprintln!("kube: node-b draining: {draining}");
    // Longer than the liveness probe's three failures (3 × 10 s): a liveness probe on /healthz
    // would have restarted the agent by now.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(35) {
        assert_eq!(node_b_health(cluster, "/livez").0, 200, "/livez while leaving");
        std::thread::sleep(Duration::from_secs(5));
    }
    assert_eq!(
        agent_restarts(cluster, "node-b"),
        restarts,
        "the leaving node's agent was restarted"
    );

    cluster
        .kubectl(&["taint", "node", "node-b", "karpenter.sh/disrupted:NoSchedule-"])
        .unwrap();
    let cleared = Instant::now();
    wait_until(Duration::from_secs(10), "node-b's /healthz back to 200", || {
        (node_b_health(cluster, "/healthz").0 == 200).then_some(())
    });
    eprintln!(
        "kube: number: taint removed → node-b's /healthz 200 in {:.1} s",
        cleared.elapsed().as_secs_f64()
    );
    wait_until(
        Duration::from_secs(20),
        "the drain gone from node-b's status",
        || {
            json(cluster, &["get", "nfp", "node-b"])["status"]["draining"]
                .is_null()
                .then_some(())
        },
    );
}

/// node-b is deleted while a finalizer holds its Node: the Node has a `deletionTimestamp`, which
/// kube-proxy's rule counts too. The caller removes the finalizer once node-b's kubelet is stopped.
pub fn a_deleted_node_leaves(cluster: &KubeCluster) {
    cluster
        .kubectl(&[
            "patch",
            "node",
            "node-b",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["switchyard.io/e2e-hold"]}}"#,
        ])
        .unwrap();
    cluster
        .kubectl(&["delete", "node", "node-b", "--wait=false"])
        .unwrap();
    let deleted = Instant::now();
    wait_until(Duration::from_secs(10), "node-b's /healthz to fail", || {
        (node_b_health(cluster, "/healthz").0 == 503).then_some(())
    });
    let plan = json(cluster, &["get", "nfp", "node-b"]);
    assert_eq!(plan["spec"]["leaving"]["reason"], "deletionTimestamp", "{plan}");
    assert_eq!(node_b_health(cluster, "/livez").0, 200);
    eprintln!(
        "kube: number: node-b deleted (held by a finalizer) → its /healthz 503 in {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
}

/// Lets the deleted node-b go.
pub fn release_deleted_node(cluster: &KubeCluster) {
    cluster
        .kubectl(&[
            "patch",
            "node",
            "node-b",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ])
        .unwrap();
}
