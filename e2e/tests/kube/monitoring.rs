//! The monitoring component against a real Prometheus (issue 49), on the real cluster:
//!
//! ```text
//! start: Prometheus in the control plane's namespace, its jobs translated from the component's
//!   PodMonitors, its rules the component's plain rules file ─► every agent and controller pod is a
//!   target that is up
//! dashboard_answers: a Service created (plans written, agents sync) and a connection refused ─►
//!   every query of the Grafana dashboard returns a finite value
//! an agent whose plan cannot apply (kube_cluster.rs, without NET_ADMIN): SwitchyardSyncFailing and
//!   SwitchyardPlanNotApplied fire naming its node ─► the DaemonSet undone ─► PlanNotApplied clears
//! ```

use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::kube::{KubeCluster, prometheus::Prometheus};

use super::{json, repo, wait_until};

const COMPONENT: &str = "config/components/monitoring";
/// Scrape and rule evaluation interval: short, so a test waits seconds, not the PodMonitors' 30 s.
const INTERVAL: Duration = Duration::from_secs(5);

/// Prometheus up, every Switchyard pod a healthy target of its job.
pub fn start(cluster: &KubeCluster) -> Prometheus {
    let component = repo().join(COMPONENT);
    let prometheus = Prometheus::start(
        cluster,
        &component.join("podmonitors.yaml"),
        &component.join("prometheus-rules.yaml"),
        INTERVAL,
    )
    .unwrap();
    let up = wait_until(
        Duration::from_secs(120),
        "every agent and controller scraped",
        || {
            let targets = prometheus.targets().ok()?;
            let healthy = |job: &str| {
                targets
                    .iter()
                    .filter(|(j, _, health, _)| j == job && health == "up")
                    .count()
            };
            let (agents, controllers) = (
                healthy("switchyard-system/switchyard-agent"),
                healthy("switchyard-system/switchyard-controller"),
            );
            if agents == 2 && controllers == 2 {
                Some(targets)
            } else {
                eprintln!(
                    "kube: prometheus: {agents} agents, {controllers} controllers up; targets: {targets:?}"
                );
                None
            }
        },
    );
    eprintln!("kube: prometheus: targets up: {up:?}");
    prometheus
}

/// Every query of the dashboard returns data once something happened in its window.
pub fn dashboard_answers(cluster: &KubeCluster, prometheus: &Prometheus) {
    // A change the controller plans and both agents program, and a refusal each agent counts.
    cluster
        .kubectl_stdin(
            &["apply", "-f", "-"],
            "apiVersion: v1\nkind: Service\nmetadata: {name: dashboard-probe, namespace: flows}\n\
             spec:\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: http}]\n",
        )
        .unwrap();
    let nothing = json(cluster, &["-n", "flows", "get", "service", "nothing"]);
    let url = format!("http://{}/", nothing["spec"]["clusterIP"].as_str().unwrap());
    for client in ["client-a", "client-b"] {
        // Refused (no endpoints): the command fails, the refusal is counted.
        let _ = cluster.kubectl(&["-n", "flows", "exec", client, "--", "curl", "-s", "-m", "2", &url]);
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join(COMPONENT).join("dashboard.json")).unwrap(),
    )
    .unwrap();
    let queries: Vec<(String, String)> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((title.clone(), t["expr"].as_str()?.to_owned())))
        })
        .collect();
    assert!(queries.len() >= 10, "the dashboard's queries: {queries:?}");
    let started = Instant::now();
    for (title, expr) in &queries {
        let samples = wait_until(
            Duration::from_secs(120),
            &format!("data for {title}: {expr}"),
            || {
                let samples = prometheus.query(expr).ok()?;
                samples.iter().any(|s| s.value.is_finite()).then_some(samples)
            },
        );
        let shown: Vec<String> = samples
            .iter()
            .take(3)
            .map(|s| format!("{:?}={}", s.labels, s.value))
            .collect();
        eprintln!("kube: dashboard: {title}: {expr} → {}", shown.join(", "));
        // The Services' own labels, not the scrape target's (the pod's namespace, the port's name):
        // the PodMonitors honor the series' labels.
        if expr.contains("switchyard_service_connections_total") {
            let namespaces: Vec<&str> = samples
                .iter()
                .filter_map(|s| s.labels.get("namespace").and_then(Value::as_str))
                .collect();
            assert!(
                namespaces.contains(&"flows") && !namespaces.contains(&"switchyard-system"),
                "{title}: the Services' namespaces, not the agents': {namespaces:?}"
            );
        }
        if expr.contains("switchyard_endpoint_connections_total") {
            for sample in &samples {
                let endpoint = sample
                    .labels
                    .get("endpoint")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                assert!(
                    endpoint != "metrics",
                    "{title}: the endpoint's address, not the port's name: {sample:?}"
                );
            }
        }
    }
    eprintln!(
        "kube: dashboard: {} queries answered within {:.0} s",
        queries.len(),
        started.elapsed().as_secs_f64()
    );
    cluster
        .kubectl(&["-n", "flows", "delete", "service", "dashboard-probe"])
        .unwrap();
}

fn firing(prometheus: &Prometheus, alert: &str, node: &str) -> bool {
    prometheus
        .alerts()
        .unwrap_or_default()
        .iter()
        .any(|(name, state, labels)| {
            name == alert && state == "firing" && labels.get("node").and_then(Value::as_str) == Some(node)
        })
}

/// An agent on `node` cannot apply its plan: both agent alerts fire naming the node.
pub fn alerts_fire(prometheus: &Prometheus, node: &str) {
    let started = Instant::now();
    wait_until(Duration::from_secs(120), "SwitchyardSyncFailing to fire", || {
        firing(prometheus, "SwitchyardSyncFailing", node).then_some(())
    });
    eprintln!(
        "kube: alerts: SwitchyardSyncFailing fired for {node} after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // The rule waits 5 minutes for a plan update to be applied.
    wait_until(
        Duration::from_secs(480),
        "SwitchyardPlanNotApplied to fire",
        || firing(prometheus, "SwitchyardPlanNotApplied", node).then_some(()),
    );
    eprintln!(
        "kube: alerts: SwitchyardPlanNotApplied fired for {node} after {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// The cause is gone (the agent can apply again): the plan alert clears. SwitchyardSyncFailing counts
/// failures over 10 minutes and clears when they age out of its window (docs/monitoring.md).
pub fn alert_clears(prometheus: &Prometheus, node: &str) {
    let started = Instant::now();
    wait_until(
        Duration::from_secs(120),
        "SwitchyardPlanNotApplied to clear",
        || (!firing(prometheus, "SwitchyardPlanNotApplied", node)).then_some(()),
    );
    eprintln!(
        "kube: alerts: SwitchyardPlanNotApplied cleared for {node} after {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
