//! The `plan` command as a user runs it: output on stdout, warnings on stderr, exit codes scripts rely on.
// Test helpers outside #[test] functions may unwrap too.
#![allow(clippy::unwrap_used)]

use std::{path::PathBuf, process::Command};

fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-controller"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn table_of_the_example_cluster() {
    let cluster = repo("examples/cluster.yaml");
    let config = repo("examples/controller-config.yaml");
    let (code, stdout, stderr) = run(&[
        "plan",
        "-f",
        cluster.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "-o",
        "table",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("NODE"), "{stdout}");
    for column in ["SERVICES", "ENDPOINTS", "OVERRIDES", "REVISION"] {
        assert!(lines[0].contains(column), "{column}: {stdout}");
    }
    assert_eq!(lines.len(), 4);
    assert!(lines[1].starts_with("node-a") && lines[1].contains("iptables") && lines[1].contains(" 11 "));
    // The example's deliberately broken Services are diagnosed, one `warning:` line each.
    let problems: Vec<&str> = stderr.lines().filter(|l| l.ends_with(')')).collect();
    assert_eq!(
        problems,
        [
            "warning: Service default/checkout: none of its 3 endpoints is ready: 2 terminating, 1 not ready; \
             1 still serving, used as a fallback while they terminate (NoReadyEndpoints)",
            "warning: Service default/maintenance: no endpoints: the Service has no selector and its 0 \
             EndpointSlice(s) list none; connections are rejected (NoEndpoints)",
        ],
        "{stderr}"
    );
}

#[test]
fn objects_are_the_slices_then_the_plans_the_controller_writes() {
    let cluster = repo("examples/cluster.yaml");
    let config = repo("examples/controller-config.yaml");
    let args = |output: &'static str| {
        vec![
            "plan".to_string(),
            "-f".into(),
            cluster.to_str().unwrap().into(),
            "--config".into(),
            config.to_str().unwrap().into(),
            "--objects".into(),
            "-o".into(),
            output.into(),
        ]
    };
    let table = args("table");
    let (code, stdout, stderr) = run(&table.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("NAME") && stdout.contains("VIEW") && stdout.contains("all-0000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("DESIRED") && stdout.contains("OBSERVED") && stdout.contains("SLICES"),
        "{stdout}"
    );
    let json = args("json");
    let (code, stdout, _) = run(&json.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "ForwardingSlice",
            "ForwardingSlice",
            "ForwardingSlice",
            "NodeForwardingPlan",
            "NodeForwardingPlan",
            "NodeForwardingPlan"
        ]
    );
    // One node's objects: its plan and the slices of its two views, composable by its agent.
    let mut one = args("yaml");
    one.extend(["--node".to_string(), "node-c".to_string()]);
    let (code, stdout, _) = run(&one.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["all-0000", "zone-b-0000", "node-c"]);
}

#[test]
fn yaml_for_one_node_is_a_valid_plan_object() {
    let cluster = repo("examples/cluster.yaml");
    let (code, stdout, _) = run(&[
        "plan",
        "-f",
        cluster.to_str().unwrap(),
        "--node",
        "node-b",
        "-o",
        "yaml",
    ]);
    assert_eq!(code, 0);
    let docs: Vec<switchyard_api::NodeForwardingPlan> = serde_saphyr::from_multiple(&stdout).unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0].metadata.name.as_deref(), Some("node-b"));
    assert!(switchyard_api::validate::validate(&docs[0].spec).is_clean());
}

#[test]
fn json_is_a_v1_list() {
    let cluster = repo("examples/cluster.yaml");
    let (code, stdout, _) = run(&["plan", "-f", cluster.to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_files_exit_2_with_nothing_on_stdout() {
    let scratch = switchyard_test_support::scratch::dir("plan-test").unwrap();
    let dir = scratch.path();
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, "kind: List\nitems:\n  - {unclosed\n").unwrap();
    let bad_config = dir.join("config.yaml");
    std::fs::write(&bad_config, "masqueradeBit: 99\n").unwrap();
    let cluster = repo("examples/cluster.yaml");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["plan", "-f", broken.to_str().unwrap()], "broken.yaml"),
        (
            vec!["plan", "-f", "/nonexistent/cluster.yaml"],
            "/nonexistent/cluster.yaml",
        ),
        (
            vec![
                "plan",
                "-f",
                cluster.to_str().unwrap(),
                "--config",
                bad_config.to_str().unwrap(),
            ],
            "masqueradeBit",
        ),
        (
            vec!["plan", "-f", cluster.to_str().unwrap(), "--node", "node-x"],
            "node-x",
        ),
        (vec!["plan", "-f", cluster.to_str().unwrap(), "-o", "xml"], "xml"),
    ];
    for (args, mention) in cases {
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?} printed {stdout}");
        assert!(stderr.contains(mention), "{args:?}: {stderr}");
    }
}

#[test]
fn warnings_go_to_stderr_and_planning_continues() {
    let scratch = switchyard_test_support::scratch::dir("plan-warn").unwrap();
    let dir = scratch.path();
    let file = dir.join("cluster.yaml");
    std::fs::write(
        &file,
        "kind: Node\nmetadata: {name: n1}\n---\nkind: Service\nmetadata: {name: bad, namespace: ns}\n\
         spec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}\n---\nkind: Service\nmetadata: {name: ok, namespace: ns}\n\
         spec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run(&["plan", "-f", file.to_str().unwrap(), "-o", "yaml"]);
    assert_eq!(code, 0);
    assert!(
        stderr.contains("warning: Service ns/bad: clusterIP \"10.96.0.300\" is not an IP address"),
        "{stderr}"
    );
    assert!(stdout.contains("name: ns/ok"));
    assert!(!stdout.contains("ns/bad"));
}

#[test]
fn services_not_forwarded_by_design_are_noted_with_why() {
    let scratch = switchyard_test_support::scratch::dir("plan-skip").unwrap();
    let dir = scratch.path();
    let file = dir.join("cluster.yaml");
    std::fs::write(
        &file,
        "kind: Node\nmetadata: {name: n1}\n---\nkind: Service\nmetadata: {name: quiet, namespace: ns, \
         labels: {service.kubernetes.io/headless: \"\"}}\nspec: {clusterIP: 10.96.0.4, ports: [{port: 80}]}\n\
         ---\nkind: Service\nmetadata: {name: ok, namespace: ns}\nspec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run(&["plan", "-f", file.to_str().unwrap(), "-o", "yaml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "note: Service ns/quiet: labelled service.kubernetes.io/headless: not forwarded, as kube-proxy does"
        ),
        "{stderr}"
    );
    // Not an input error, so no warning about it (ns/ok's missing endpoints are one).
    assert!(!stderr.contains("warning: Service ns/quiet"), "{stderr}");
    assert!(stdout.contains("name: ns/ok"));
    assert!(!stdout.contains("ns/quiet"));
}

fn run_with_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-controller"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn dash_reads_standard_input_as_kubectl_does() {
    let dump = std::fs::read_to_string(repo("examples/cluster.yaml")).unwrap();
    let (code, stdout, stderr) = run_with_stdin(&["plan", "-f", "-", "-o", "table"], &dump);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("NODE"), "{stdout}");
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
}

/// Empty input (a failed `kubectl get … > FILE`) and input of the wrong kind exit 2 with what to do,
/// never 0 with an empty table.
#[test]
fn empty_input_and_the_wrong_kind_of_input_exit_2_saying_what_is_expected() {
    let cluster = repo("examples/cluster.yaml");
    let (_, plans, _) = run(&["plan", "-f", cluster.to_str().unwrap(), "--objects", "-o", "yaml"]);
    let cases: [(&[&str], &str, &str); 6] = [
        (&["plan", "-f", "-"], "", "the input is empty"),
        (&["plan", "-f", "-"], "\n  \n", "the input is empty"),
        (&["audit", "-f", "-"], "", "the input is empty"),
        (&["plan", "-f", "-"], &plans, "which are plan's output"),
        (
            &["plan", "-f", "-"],
            "kind: ConfigMap\nmetadata: {name: x}\n",
            "holds no Service, EndpointSlice or Node",
        ),
        (
            &["audit", "-f", "-"],
            "kind: Node\nmetadata: {name: n1}\n",
            "the input is a cluster dump",
        ),
    ];
    for (args, stdin, want) in cases {
        let (code, stdout, stderr) = run_with_stdin(args, stdin);
        assert_eq!(code, 2, "{args:?} {stdin:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}

/// `plan … | head` closes the pipe early: the command ends quietly, exit 0, no panic.
#[test]
fn a_closed_pipe_ends_printing_quietly() {
    let cluster = repo("examples/cluster.yaml");
    for format in ["yaml", "json", "table"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-controller"))
            .args(["plan", "-f", cluster.to_str().unwrap(), "-o", format])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the command has written anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{format}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{format}: {stderr}");
    }
}

/// No kubeconfig anywhere, or an empty `KUBECONFIG`: one sentence saying what was tried and what to
/// do, not clap's "a value is required for --kubeconfig" nor kube's nested, repeated causes.
#[test]
fn a_missing_kubeconfig_is_said_once_in_plain_words() {
    for kubeconfig in [None, Some(""), Some("/nonexistent/kubeconfig")] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard-controller"));
        command
            .arg("audit")
            .env("HOME", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        match kubeconfig {
            Some(value) => command.env("KUBECONFIG", value),
            None => command.env_remove("KUBECONFIG"),
        };
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Wrong input, as the agent says it too (switchyard_process::exit).
        assert_eq!(out.status.code(), Some(2), "{kubeconfig:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "said once: {stderr}");
        assert!(
            stderr.starts_with("error: no Kubernetes client configuration"),
            "{kubeconfig:?}: {stderr}"
        );
        assert!(
            stderr.contains("Pass --kubeconfig FILE or set KUBECONFIG"),
            "{stderr}"
        );
        assert!(!stderr.contains("a value is required"), "{stderr}");
        assert!(!stderr.contains("'\""), "doubled quotes: {stderr}");
        assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    }
}

#[test]
fn a_leaving_node_is_planned_as_leaving_offline_too() {
    let scratch = switchyard_test_support::scratch::dir("plan-leaving").unwrap();
    let file = scratch.path().join("cluster.yaml");
    std::fs::write(
        &file,
        "kind: Node\nmetadata: {name: n1}\nspec: {taints: [{key: karpenter.sh/disrupted, effect: NoSchedule, \
         timeAdded: \"2026-12-07T10:00:00Z\"}]}\n---\nkind: Node\nmetadata: {name: n2}\n---\n\
         kind: Service\nmetadata: {name: ok, namespace: ns}\nspec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run(&["plan", "-f", file.to_str().unwrap(), "--node", "n1", "-o", "yaml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("leaving:\n    reason: taint:karpenter.sh/disrupted\n    since: \"2026-12-07T10:00:00Z\"\n    drainGraceSeconds: 600"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(&["plan", "-f", file.to_str().unwrap(), "--node", "n2", "-o", "yaml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("leaving"), "{stdout}");
    let config = scratch.path().join("config.yaml");
    std::fs::write(&config, "leavingSignals: [cordoned]\n").unwrap();
    let (code, _, stderr) = run(&[
        "plan",
        "-f",
        file.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown signal \"cordoned\""), "{stderr}");
}

/// A dump with the typos of issue 45: `prots:` for `ports:`, `kind: Servce`, plus a Pod (another kind).
const TYPOS: &str = "kind: Node\nmetadata: {name: n1}\n---\nkind: Service\nmetadata: {name: web, namespace: ns}\n\
spec: {clusterIP: 10.96.0.3, prots: [{port: 80}]}\n---\nkind: Servce\nmetadata: {name: api, namespace: ns}\n\
spec: {clusterIP: 10.96.0.4, ports: [{port: 80}]}\n---\nkind: Pod\nmetadata: {name: p1, namespace: ns}\n---\n\
kind: Service\nmetadata: {name: ok, namespace: ns}\nspec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}\n";

/// Read as kubectl's strict validation reads: the unknown field by object and path, the unknown kind by
/// object (with the kind meant), and the Service that drops out named with why; `--strict` refuses.
#[test]
fn typos_are_named_as_kubectl_strict_validation_names_them() {
    let (code, stdout, stderr) = run_with_stdin(&["plan", "-f", "-", "-o", "yaml"], TYPOS);
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "warning: Service ns/web: unknown field \"spec.prots\" (standard input: document 2)",
        "warning: Servce ns/api (standard input: document 3): unknown kind \"Servce\", not read (did you \
         mean Service?)",
        "note: not read: 1 Pod (ns/p1): plan reads Services, EndpointSlices and Nodes",
        "warning: Service ns/web: no ports (spec.ports is missing or empty): not forwarded",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
    assert!(
        stdout.contains("name: ns/ok") && !stdout.contains("ns/web"),
        "{stdout}"
    );

    let (code, stdout, stderr) = run_with_stdin(&["plan", "-f", "-", "--strict"], TYPOS);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("--strict: 1 unknown field(s) and 1 object(s) of a mistyped kind"),
        "{stderr}"
    );
    // The example cluster is what kubectl prints: nothing unknown in it.
    let cluster = repo("examples/cluster.yaml");
    let (code, _, stderr) = run(&["plan", "-f", cluster.to_str().unwrap(), "--strict", "-o", "table"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("unknown"), "{stderr}");
}

/// `plan --node X` for a node the input lacks says only that, before any warning about the cluster.
#[test]
fn a_node_not_in_the_input_is_said_first_and_alone() {
    let (code, stdout, stderr) = run_with_stdin(&["plan", "-f", "-", "--node", "node-z"], TYPOS);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(
        stderr.trim(),
        "error: node \"node-z\" is not in the input (its nodes: n1)"
    );
}

/// Every `--help` carries the exit codes both binaries share; no colour where no terminal is.
#[test]
fn every_help_lists_the_shared_exit_codes_without_colour() {
    for command in ["", "run", "plan", "audit"] {
        let args: Vec<&str> = [command, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let (code, stdout, _) = run(&args);
        assert_eq!(code, 0, "{command}");
        assert!(
            stdout.contains(switchyard_process::exit::TABLE),
            "{command} --help:\n{stdout}"
        );
        assert!(!stdout.contains('\u{1b}'), "{command} --help has escape codes");
    }
    let (code, _, stderr) = run(&["plan", "--frobnicate"]);
    assert_eq!(code, 2);
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}
