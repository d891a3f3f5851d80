//! A real Prometheus (Debian's `prometheus`) beside a lab cluster, scraping what the monitoring
//! component's PodMonitors select and evaluating its plain rules file, so the suite can ask it what an
//! operator's Prometheus would show.
//!
//! ```text
//! config/components/monitoring/podmonitors.yaml ─► scrape_configs (pure): per PodMonitor one job named
//!   <namespace>/<name> (the Operator's default), its matchLabels and port kept, its relabelings copied
//! pods of those namespaces (kubectl, every 2 s) ─► pod_targets (pure): one target per container port
//!   with the labels Kubernetes discovery gives (__meta_kubernetes_pod_…) ─► file_sd (pods.json)
//! prometheus-rules.yaml ─► rule_files
//! prometheus in <id>-cp (it reaches node and pod addresses over the fabric) ─► a relay on the host's
//!   loopback ─► query (instant), alerts, targets
//! ```
//!
//! Debian builds Prometheus without Kubernetes discovery, and the Prometheus Operator is not in the lab
//! (no container registry): the two pure steps above are what they do with a PodMonitor, except the
//! interval, which the caller sets short.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::KubeCluster;
use crate::error::{LabError, Result};
use crate::relay::Relay;
use crate::supervisor::ChildHandle;

/// The port Prometheus listens on inside the control plane's namespace.
pub const PORT: u16 = 9090;

/// The scrape jobs equivalent to the PodMonitors in `podmonitors` (YAML, one or more documents), each
/// reading its pods' targets from `targets` (file discovery, [`pod_targets`]), scraped every
/// `interval`; and the namespaces whose pods they select.
pub fn scrape_configs(
    podmonitors: &str,
    targets: &Path,
    interval: Duration,
) -> Result<(Vec<Value>, Vec<String>)> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(podmonitors)
        .map_err(|e| LabError::Refused(format!("podmonitors: {e}")))?;
    let mut jobs = Vec::new();
    let mut namespaces: Vec<String> = Vec::new();
    for monitor in documents.iter().filter(|d| d["kind"] == "PodMonitor") {
        let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = monitor["metadata"]["namespace"].as_str().unwrap_or("default");
        if !namespaces.iter().any(|n| n == namespace) {
            namespaces.push(namespace.to_owned());
        }
        let mut keep: Vec<Value> = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, value)| {
                json!({
                    "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(key))],
                    "regex": value,
                    "action": "keep",
                })
            })
            .collect();
        for endpoint in monitor["spec"]["podMetricsEndpoints"]
            .as_array()
            .into_iter()
            .flatten()
        {
            // Kubernetes discovery's namespace restriction, then the PodMonitor's selector and port.
            let mut relabel = vec![json!({
                "source_labels": ["__meta_kubernetes_namespace"],
                "regex": namespace,
                "action": "keep",
            })];
            relabel.extend(keep.iter().cloned());
            if let Some(port) = endpoint["port"].as_str() {
                relabel.push(json!({
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": port,
                    "action": "keep",
                }));
            }
            // The Operator's target labels (`endpoint`: the port's name).
            for (from, to) in [
                ("__meta_kubernetes_namespace", "namespace"),
                ("__meta_kubernetes_pod_name", "pod"),
                ("__meta_kubernetes_pod_container_name", "container"),
                ("__meta_kubernetes_pod_container_port_name", "endpoint"),
            ] {
                relabel.push(json!({"source_labels": [from], "target_label": to}));
            }
            for r in endpoint["relabelings"].as_array().into_iter().flatten() {
                relabel.push(json!({
                    "source_labels": r["sourceLabels"],
                    "target_label": r["targetLabel"],
                }));
            }
            jobs.push(json!({
                "job_name": format!("{namespace}/{name}"),
                "scrape_interval": format!("{}s", interval.as_secs().max(1)),
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "file_sd_configs": [{
                    "files": [targets.display().to_string()],
                    "refresh_interval": "5s",
                }],
                "relabel_configs": relabel,
                "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
            }));
        }
        keep.clear();
    }
    if jobs.is_empty() {
        return Err(LabError::Refused(
            "podmonitors: no PodMonitor with an endpoint".into(),
        ));
    }
    Ok((jobs, namespaces))
}

/// The targets Kubernetes pod discovery would give for `pods` (a `kubectl get pods -o json` List): one
/// per declared container port of every pod with an address, labelled as that discovery labels them.
pub fn pod_targets(pods: &Value) -> Vec<Value> {
    let mut targets = Vec::new();
    for pod in pods["items"].as_array().into_iter().flatten() {
        let Some(ip) = pod["status"]["podIP"].as_str() else {
            continue;
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let mut common = serde_json::Map::new();
        common.insert(
            "__meta_kubernetes_namespace".into(),
            json!(text(&pod["metadata"]["namespace"])),
        );
        common.insert(
            "__meta_kubernetes_pod_name".into(),
            json!(text(&pod["metadata"]["name"])),
        );
        common.insert(
            "__meta_kubernetes_pod_node_name".into(),
            json!(text(&pod["spec"]["nodeName"])),
        );
        common.insert("__meta_kubernetes_pod_ip".into(), json!(ip));
        for (key, value) in pod["metadata"]["labels"].as_object().into_iter().flatten() {
            let key = sanitize(key);
            common.insert(format!("__meta_kubernetes_pod_label_{key}"), json!(text(value)));
            common.insert(format!("__meta_kubernetes_pod_labelpresent_{key}"), json!("true"));
        }
        for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
            for port in container["ports"].as_array().into_iter().flatten() {
                let Some(number) = port["containerPort"].as_u64() else {
                    continue;
                };
                let mut labels = common.clone();
                labels.insert(
                    "__meta_kubernetes_pod_container_name".into(),
                    json!(text(&container["name"])),
                );
                labels.insert(
                    "__meta_kubernetes_pod_container_port_name".into(),
                    json!(text(&port["name"])),
                );
                labels.insert(
                    "__meta_kubernetes_pod_container_port_number".into(),
                    json!(number.to_string()),
                );
                targets.push(json!({"targets": [format!("{ip}:{number}")], "labels": labels}));
            }
        }
    }
    targets
}

/// A label name as Prometheus' Kubernetes discovery spells it (`app.kubernetes.io/name` ─►
/// `app_kubernetes_io_name`).
fn sanitize(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// One series of an instant query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its labels.
    pub labels: serde_json::Map<String, Value>,
    /// Its value (NaN when Prometheus says so).
    pub value: f64,
}

/// An alert as Prometheus lists it: its name, state (`pending`, `firing`) and labels.
pub type Alert = (String, String, serde_json::Map<String, Value>);

/// A running Prometheus, the host's way to it, and the thread that keeps its pod targets current.
pub struct Prometheus {
    _process: ChildHandle,
    _relay: Relay,
    address: SocketAddr,
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    discovery: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.discovery.take() {
            let _ = thread.join();
        }
    }
}

/// Every 2 s until `stop`: the pods of `namespaces` ─► [`pod_targets`] ─► `file`, rewritten (atomically)
/// only when it changes.
fn discover(kubectl: Command, namespaces: Vec<String>, file: PathBuf, stop: Arc<AtomicBool>) {
    let program = kubectl.get_program().to_owned();
    let args: Vec<_> = kubectl.get_args().map(ToOwned::to_owned).collect();
    let mut written = String::new();
    while !stop.load(Ordering::Relaxed) {
        let mut targets = Vec::new();
        for namespace in &namespaces {
            let listed = Command::new(&program)
                .args(&args)
                .args(["-n", namespace, "get", "pods", "-o", "json"])
                .output();
            if let Ok(out) = listed
                && out.status.success()
                && let Ok(pods) = serde_json::from_slice::<Value>(&out.stdout)
            {
                targets.extend(pod_targets(&pods));
            }
        }
        let text = Value::Array(targets).to_string();
        if text != written {
            let next = file.with_extension("json.next");
            if std::fs::write(&next, &text)
                .and_then(|()| std::fs::rename(&next, &file))
                .is_ok()
            {
                written = text;
            }
        }
        for _ in 0..20 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Prometheus {
    /// Starts Prometheus in `cluster`'s control-plane namespace with the jobs of `podmonitors` and
    /// the rules of `rules`, evaluated every `interval`.
    pub fn start(
        cluster: &KubeCluster,
        podmonitors: &Path,
        rules: &Path,
        interval: Duration,
    ) -> Result<Self> {
        let dir = cluster.dir().join("prometheus");
        std::fs::create_dir_all(dir.join("data")).map_err(|source| LabError::File {
            action: "creating",
            path: dir.clone(),
            source,
        })?;
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| LabError::File {
                action: "reading",
                path: path.to_owned(),
                source,
            })
        };
        let targets = dir.join("pods.json");
        let (jobs, namespaces) = scrape_configs(&read(podmonitors)?, &targets, interval)?;
        let seconds = format!("{}s", interval.as_secs().max(1));
        let config = json!({
            "global": {"scrape_interval": seconds, "evaluation_interval": seconds},
            "rule_files": [rules.display().to_string()],
            "scrape_configs": jobs,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let discovery = {
            let (kubectl, stop, file) = (cluster.kubectl_command(), Arc::clone(&stop), targets.clone());
            std::thread::spawn(move || discover(kubectl, namespaces, file, stop))
        };
        let config_path = dir.join("prometheus.yml");
        // JSON is YAML: Prometheus reads it as its configuration.
        std::fs::write(&config_path, config.to_string()).map_err(|source| LabError::File {
            action: "writing",
            path: config_path.clone(),
            source,
        })?;
        let spec = cluster.spec();
        let listen = SocketAddrV4::new(spec.cp_ip, PORT);
        let argv = vec![
            "prometheus".to_owned(),
            format!("--config.file={}", config_path.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={listen}"),
            "--storage.tsdb.retention.time=2h".to_owned(),
        ];
        let process = cluster.spawn_in_control_plane("prometheus", &argv)?;
        let relay = Relay::into_netns(
            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)),
            &spec.cp_netns,
            SocketAddr::V4(listen),
        )?;
        let address = relay
            .listen_addr()
            .ok_or_else(|| LabError::Refused("the Prometheus relay has no listener".into()))?;
        let prometheus = Self {
            _process: process,
            _relay: relay,
            address,
            dir,
            stop,
            discovery: Some(discovery),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while prometheus.get("/-/ready").is_err() {
            if std::time::Instant::now() > deadline {
                return Err(LabError::Refused(format!(
                    "Prometheus did not become ready in 60 s (its log: {})",
                    cluster.logs_dir().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(prometheus)
    }

    /// Where its configuration and data are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The series `expr` returns now (an instant query).
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let answer = self.get_json(&format!("/api/v1/query?query={}", encode(expr)))?;
        if answer["status"] != "success" {
            return Err(LabError::Refused(format!("query {expr:?}: {}", answer["error"])));
        }
        let result = &answer["data"]["result"];
        let one = |item: &Value| Sample {
            labels: item["metric"].as_object().cloned().unwrap_or_default(),
            value: item["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN),
        };
        Ok(match answer["data"]["resultType"].as_str() {
            Some("vector") => result.as_array().into_iter().flatten().map(one).collect(),
            Some("scalar") => vec![Sample {
                labels: serde_json::Map::new(),
                value: result[1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN),
            }],
            _ => Vec::new(),
        })
    }

    /// The alerts pending or firing now: (name, state, labels).
    pub fn alerts(&self) -> Result<Vec<Alert>> {
        let answer = self.get_json("/api/v1/alerts")?;
        Ok(answer["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let labels = a["labels"].as_object().cloned().unwrap_or_default();
                let name = labels
                    .get("alertname")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                (name, a["state"].as_str().unwrap_or_default().to_owned(), labels)
            })
            .collect())
    }

    /// The scrape targets and whether each is up: (job, instance, health, last error).
    pub fn targets(&self) -> Result<Vec<(String, String, String, String)>> {
        let answer = self.get_json("/api/v1/targets?state=active")?;
        Ok(answer["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (
                    text(&t["labels"]["job"]),
                    text(&t["labels"]["instance"]),
                    text(&t["health"]),
                    text(&t["lastError"]),
                )
            })
            .collect())
    }

    /// `GET path`, its body read as JSON.
    fn get_json(&self, path: &str) -> Result<Value> {
        let body = self.get(path)?;
        serde_json::from_str(&body)
            .map_err(|e| LabError::Refused(format!("Prometheus answered {body:?} to {path}: {e}")))
    }

    /// `GET path` over HTTP/1.0: the body of a 200.
    fn get(&self, path: &str) -> Result<String> {
        let failed = |why: String| LabError::Refused(format!("GET {path} from Prometheus: {why}"));
        let mut stream = TcpStream::connect_timeout(&self.address, Duration::from_secs(5))
            .map_err(|e| failed(e.to_string()))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| failed(e.to_string()))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n")
            .map_err(|e| failed(e.to_string()))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| failed(e.to_string()))?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(failed(format!(
                "{} {body}",
                head.lines().next().unwrap_or_default()
            )));
        }
        Ok(body.to_owned())
    }
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_monitor_becomes_the_job_the_operator_would_write() {
        let monitors = "\
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: switchyard-agent, namespace: switchyard-system}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: switchyard, app.kubernetes.io/component: agent}
  podMetricsEndpoints:
  - port: metrics
    path: /metrics
    honorLabels: true
    relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
";
        let (jobs, namespaces) =
            scrape_configs(monitors, Path::new("/t/pods.json"), Duration::from_secs(5)).unwrap();
        assert_eq!(namespaces, ["switchyard-system"]);
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(job["job_name"], "switchyard-system/switchyard-agent");
        assert_eq!(job["file_sd_configs"][0]["files"][0], "/t/pods.json");
        assert_eq!(job["honor_labels"], true);
        let relabel = job["relabel_configs"].as_array().unwrap();
        let keeps: Vec<(&str, &str)> = relabel
            .iter()
            .filter(|r| r["action"] == "keep")
            .map(|r| {
                (
                    r["source_labels"][0].as_str().unwrap(),
                    r["regex"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            keeps,
            [
                ("__meta_kubernetes_namespace", "switchyard-system"),
                ("__meta_kubernetes_pod_label_app_kubernetes_io_component", "agent"),
                ("__meta_kubernetes_pod_label_app_kubernetes_io_name", "switchyard"),
                ("__meta_kubernetes_pod_container_port_name", "metrics"),
            ]
        );
        assert!(relabel.iter().any(
            |r| r["target_label"] == "node" && r["source_labels"][0] == "__meta_kubernetes_pod_node_name"
        ));
        assert!(scrape_configs("kind: Service\n", Path::new("/t"), Duration::from_secs(5)).is_err());
    }

    #[test]
    fn pods_become_targets_labelled_as_kubernetes_discovery_labels_them() {
        let pods = json!({"items": [
            {
                "metadata": {"name": "agent-x", "namespace": "switchyard-system",
                             "labels": {"app.kubernetes.io/component": "agent"}},
                "spec": {"nodeName": "node-a", "containers": [
                    {"name": "agent", "ports": [
                        {"name": "metrics", "containerPort": 10263},
                        {"name": "healthz", "containerPort": 10256}
                    ]}
                ]},
                "status": {"podIP": "192.168.30.11"}
            },
            {"metadata": {"name": "pending"}, "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 1}]}]}, "status": {}}
        ]});
        let targets = pod_targets(&pods);
        assert_eq!(
            targets.len(),
            2,
            "a pod without an address is no target: {targets:?}"
        );
        let metrics = &targets[0];
        assert_eq!(metrics["targets"][0], "192.168.30.11:10263");
        let labels = &metrics["labels"];
        assert_eq!(labels["__meta_kubernetes_pod_container_port_name"], "metrics");
        assert_eq!(labels["__meta_kubernetes_pod_node_name"], "node-a");
        assert_eq!(
            labels["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
            "agent"
        );
        assert_eq!(
            targets[1]["labels"]["__meta_kubernetes_pod_container_port_name"],
            "healthz"
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode("up{job=\"a/b\"} == 1"),
            "up%7Bjob%3D%22a%2Fb%22%7D%20%3D%3D%201"
        );
    }
}
