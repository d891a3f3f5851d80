//! The monitoring component (config/components/monitoring): its rules are valid and unit-tested with
//! the real `promtool`, every alert has a runbook, and every metric the rules name is one the
//! binaries register.
//!
//! ```text
//! node-agent/src, controller/src ─► registered names (`.register("x"` under each crate's prefix, and
//!   the collectors' full `"switchyard_…"` names)
//! prometheus-rules.yaml ─► promtool check rules, promtool test rules (rules-test.yaml: every alert)
//!                       ─► every switchyard_* name in an expression is registered (suffixes stripped)
//!                       ─► every alert has a `## Name` section in docs/monitoring.md
//! prometheusrule.yaml (the PrometheusRule) ─► the same groups as prometheus-rules.yaml
//! dashboard.json ─► its datasource a variable; every query promtool-valid (as a recording rule) and
//!                   naming registered metrics only; the panels the issue lists
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn component(file: &str) -> PathBuf {
    repo().join("config/components/monitoring").join(file)
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Metrics the rules may use that other exporters provide.
const EXTERNAL: [&str; 2] = [
    "kube_pod_info", // kube-state-metrics
    "up",            // Prometheus, per scrape target
];

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The metric names a crate's source registers: `.register("name"` under `prefix`, and full
/// `"switchyard_…"` names (the traffic collector's families and constant counters).
fn registered(crate_src: &str, prefix: &str, into: &mut BTreeSet<String>) {
    let mut files = Vec::new();
    rust_files(&repo().join(crate_src), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices(".register(") {
            let rest = text[at + ".register(".len()..].trim_start();
            if let Some(rest) = rest.strip_prefix('"')
                && let Some(end) = rest.find('"')
            {
                into.insert(format!("{prefix}_{}", &rest[..end]));
            }
        }
        for (at, _) in text.match_indices("\"switchyard_") {
            let rest = &text[at + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            if rest[end..].starts_with('"') {
                into.insert(rest[..end].to_owned());
            }
        }
    }
}

/// The base name of a sample name (what a counter or histogram was registered as).
fn base(name: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count", "_created"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// `switchyard_*`, `kube_*` and `up` names in a PromQL expression (label names and values are in
/// braces and quotes, which are skipped).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let (mut in_braces, mut in_quotes) = (false, false);
    let mut word = String::new();
    let flush = |word: &mut String, names: &mut Vec<String>| {
        if word.starts_with("switchyard_") || word.starts_with("kube_") || word == "up" {
            names.push(std::mem::take(word));
        }
        word.clear();
    };
    for c in expr.chars() {
        match c {
            '"' => in_quotes = !in_quotes,
            '{' if !in_quotes => in_braces = true,
            '}' if !in_quotes => in_braces = false,
            _ => {}
        }
        if !in_braces && !in_quotes && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
        } else {
            flush(&mut word, &mut names);
        }
    }
    flush(&mut word, &mut names);
    names
}

fn alerts(rules: &Value) -> Vec<(String, String)> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().iter())
        .map(|rule| {
            (
                rule["alert"].as_str().unwrap().to_owned(),
                rule["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// promtool, installed with apt (Debian's `prometheus`) when it is missing and this runs as root, as
/// `make test` installs what its other suites need.
fn ensure_promtool() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let found = Command::new("promtool").arg("--version").output().is_ok();
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
        if found || !root || std::env::var("SWITCHYARD_VM_OFFLINE").as_deref() == Ok("1") {
            return;
        }
        println!("installing promtool (apt-get install prometheus)");
        for args in [
            &["update", "-qq"][..],
            &["install", "-y", "-qq", "--no-install-recommends", "prometheus"][..],
        ] {
            let status = Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
            if !status.is_ok_and(|s| s.success()) {
                println!("apt-get {args:?} failed");
                return;
            }
        }
    });
}

fn promtool(args: &[&str]) {
    ensure_promtool();
    let output = match Command::new("promtool")
        .args(args)
        .current_dir(component(""))
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!(
            "promtool {args:?}: {e}: install Prometheus's promtool (Debian: apt-get install prometheus; \
             .ci/run does)"
        ),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("promtool {}:\n{text}", args.join(" "));
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
}

#[test]
fn the_rules_are_valid_and_each_alert_fires_and_stays_quiet_in_promtool_tests() {
    promtool(&["check", "rules", "prometheus-rules.yaml"]);
    promtool(&["test", "rules", "rules-test.yaml"]);
    // Every alert has a test that expects it (and each test file case has series that must not fire).
    let tests = std::fs::read_to_string(component("rules-test.yaml")).unwrap();
    for (alert, _) in alerts(&yaml(&component("prometheus-rules.yaml"))) {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "rules-test.yaml has no case for {alert}"
        );
    }
}

#[test]
fn every_metric_the_rules_name_is_registered_by_a_binary() {
    let mut known = BTreeSet::new();
    registered("node-agent/src", "switchyard_agent", &mut known);
    registered("controller/src", "switchyard_controller", &mut known);
    assert!(
        known.contains("switchyard_agent_sync_failures")
            && known.contains("switchyard_service_refused_connections")
            && known.contains("switchyard_controller_leader"),
        "the scan of registered names found too little: {known:?}"
    );
    let mut unknown = Vec::new();
    for (alert, expr) in alerts(&yaml(&component("prometheus-rules.yaml"))) {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{alert}: no metric found in {expr}");
        for name in names {
            if !known.contains(base(&name)) && !EXTERNAL.contains(&name.as_str()) {
                unknown.push(format!("{alert}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics no binary registers:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_metric_name_scan_sees_through_labels() {
    assert_eq!(
        metric_names(
            r#"sum by (node) (rate(switchyard_x_total{reason="no-endpoints", kube_y="up"}[5m])) > 0 unless up{job="a"}"#
        ),
        ["switchyard_x_total", "up"]
    );
    assert_eq!(
        base("switchyard_agent_sync_duration_seconds_bucket"),
        "switchyard_agent_sync_duration_seconds"
    );
}

#[test]
fn the_prometheus_rule_carries_the_same_groups_and_every_alert_has_a_runbook() {
    let plain = yaml(&component("prometheus-rules.yaml"));
    let rule = yaml(&component("prometheusrule.yaml"));
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["spec"]["groups"], plain["groups"]);
    let runbooks = std::fs::read_to_string(repo().join("docs/monitoring.md")).unwrap();
    for group in plain["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            assert!(
                runbooks.contains(&format!("\n### {alert}\n")),
                "docs/monitoring.md has no `### {alert}` runbook"
            );
            let url = rule["annotations"]["runbook_url"].as_str().unwrap_or_default();
            assert!(
                url.ends_with(&format!("docs/monitoring.md#{}", alert.to_lowercase())),
                "{alert}: runbook_url {url:?}"
            );
            for key in ["summary", "description"] {
                assert!(
                    rule["annotations"][key].as_str().is_some_and(|t| !t.is_empty()),
                    "{alert}: no {key}"
                );
            }
        }
    }
}

fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap().to_owned();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}: datasource");
        for target in panel["targets"].as_array().unwrap() {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "{title}: target datasource"
            );
            queries.push((title.clone(), target["expr"].as_str().unwrap().to_owned()));
        }
    }
    queries
}

#[test]
fn the_dashboard_takes_its_datasource_as_a_variable_and_queries_registered_metrics_only() {
    let text = std::fs::read_to_string(component("dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "no datasource variable"
    );
    let titles: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect();
    for topic in [
        "fleet",
        "network programming latency",
        "sync duration",
        "busiest services",
        "endpoints' shares",
        "refusals by reason",
        "drift repairs",
        "controller writes",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel about {topic}: {titles:?}"
        );
    }
    let mut known = BTreeSet::new();
    registered("node-agent/src", "switchyard_agent", &mut known);
    registered("controller/src", "switchyard_controller", &mut known);
    let queries = dashboard_queries(&dashboard);
    let mut unknown = Vec::new();
    for (title, expr) in &queries {
        for name in metric_names(expr) {
            if !known.contains(base(&name)) && !EXTERNAL.contains(&name.as_str()) {
                unknown.push(format!("{title}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics no binary registers:\n{}",
        unknown.join("\n")
    );
    // Every query is valid PromQL: promtool checks each as a recording rule.
    let dir = switchyard_test_support::scratch::dir("dashboard-queries").unwrap();
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    for (i, (_, expr)) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "  - record: dashboard:query{i}\n    expr: {}\n",
            serde_json::to_string(expr).unwrap()
        ));
    }
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).unwrap();
    promtool(&["check", "rules", &file.display().to_string()]);
}
