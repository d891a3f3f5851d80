//! `switchyard-agent explain` as a user runs it: a plan on standard input (piped from
//! `switchyard-controller plan --node N -o yaml`), words on stdout, the exit status scripts test.

use std::io::Write;
use std::process::{Command, Stdio};

use switchyard_api::NodeForwardingPlan;
use switchyard_api::testing::{EntryExt, entry, ep, plan};

fn explain(plan_yaml: &str, to: &str, from: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(["explain", "--plan", "-", "--to", to, "--from", from])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan_yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_piped_plan_is_explained_with_the_documented_exit_status() {
    let spec = plan(
        "node-a",
        vec![
            entry("ns1/web:http", "10.96.0.1", 80).with(ep("10.244.2.5", 8080)),
            entry("ns1/none:http", "10.96.0.2", 80),
        ],
    );
    let yaml = serde_saphyr::to_string(&NodeForwardingPlan::new("node-a", spec)).unwrap();
    let (code, stdout) = explain(&yaml, "10.96.0.1:80", "10.244.1.7");
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("=> FORWARDED to 10.244.2.5:8080 (100%)"),
        "{stdout}"
    );
    let (code, stdout) = explain(&yaml, "ns1/none", "node");
    assert_eq!(code, Some(3), "{stdout}");
    assert!(stdout.contains("=> REJECTED"), "{stdout}");
    let (code, _) = explain("not a plan", "10.96.0.1:80", "node");
    assert_eq!(code, Some(2));
}

/// `render … | head` and `explain … | head`: the reader goes away, the command ends quietly.
#[test]
fn a_closed_pipe_ends_render_and_explain_quietly() {
    let spec = plan(
        "node-a",
        vec![entry("ns1/web:http", "10.96.0.1", 80).with(ep("10.244.2.5", 8080))],
    );
    let yaml = serde_saphyr::to_string(&NodeForwardingPlan::new("node-a", spec)).unwrap();
    for args in [
        &["render", "--plan", "-"][..],
        &["explain", "--plan", "-", "--to", "10.96.0.1:80", "--from", "node"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

#[test]
fn a_missing_kubeconfig_is_said_once_in_plain_words() {
    // The client edge is the controller's too (switchyard-process): same words, cause once.
    for kubeconfig in [None, Some(""), Some("/nonexistent/kubeconfig")] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"));
        command
            .args([
                "explain",
                "--node",
                "node-a",
                "--to",
                "10.96.0.1:80",
                "--from",
                "node",
            ])
            .env("HOME", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        match kubeconfig {
            Some(value) => command.env("KUBECONFIG", value),
            None => command.env_remove("KUBECONFIG"),
        };
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Wrong input (the shared table, as the controller's `audit` says it too).
        assert_eq!(out.status.code(), Some(2), "{kubeconfig:?}: {stderr}");
        assert!(
            stderr.starts_with("error: no Kubernetes client configuration: not running in a pod; "),
            "{kubeconfig:?}: {stderr}"
        );
        assert!(
            stderr.contains("Pass --kubeconfig FILE or set KUBECONFIG"),
            "{stderr}"
        );
        assert!(!stderr.contains("in-cluster: ("), "kube's nesting: {stderr}");
        assert!(!stderr.contains("'\""), "doubled quotes: {stderr}");
        assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args([
            "explain",
            "--node",
            "node-a",
            "--to",
            "10.96.0.1:80",
            "--from",
            "node",
        ])
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: the kubeconfig /nonexistent/kubeconfig could not be used"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
}

/// `run` without a kubeconfig ends as `explain --node` and the controller do: exit 2, said once.
#[test]
fn run_without_a_kubeconfig_exits_2_saying_so_once() {
    // `run` sets up the real iptables first, which takes root.
    if !crate::lab::is_root() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(["run", "--node-name", "node-a", "--metrics-bind", "127.0.0.1:0"])
        .args(["--healthz-bind-address", "off", "--status-bind-address", "off"])
        .env("HOME", "/nonexistent")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.matches("no Kubernetes client configuration").count(),
        1,
        "{stderr}"
    );
}

/// Issue 45: colour only on a terminal (a test's pipe is none), and every `--help` carries the exit
/// codes both binaries share.
#[test]
fn usage_errors_carry_no_colour_and_every_help_lists_the_exit_codes() {
    let agent = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
            .args(args)
            .output()
            .unwrap()
    };
    for bad in [
        &["top", "--plan"][..],
        &["frobnicate"][..],
        &["explain", "--to"][..],
    ] {
        let out = agent(bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(!stderr.contains('\u{1b}'), "{bad:?}: escape codes in {stderr:?}");
    }
    for command in [
        "",
        "render",
        "apply",
        "run",
        "cleanup",
        "explain",
        "top",
        "set-sysctls",
    ] {
        let args: Vec<&str> = [command, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = agent(&args);
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{command}");
        assert!(
            help.contains(switchyard_process::exit::TABLE),
            "{command} --help:\n{help}"
        );
        assert!(!help.contains('\u{1b}'), "{command} --help has escape codes");
    }
    let apply = String::from_utf8_lossy(&agent(&["apply", "--help"]).stdout).into_owned();
    assert!(apply.contains("Needs root (CAP_NET_ADMIN"), "{apply}");
}
