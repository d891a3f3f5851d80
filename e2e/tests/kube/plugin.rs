//! `kubectl switchyard` (issue 49) on the real cluster, run through the real kubectl's plugin lookup (the
//! executable `kubectl-switchyard` on the PATH), with the admin kubeconfig in KUBECONFIG as a user has it:
//!
//! ```text
//! answers: status (-o wide), audit, plan --node, explain --node (through the node's agent pod: its exit
//!   code relayed, 0 forwarded, 3 rejected; --kernel reads that node's rules), top --node
//! says_plainly: a wrong --context, an unknown node (plan, explain) ─► the words, a non-zero exit, no hang
//! not_running: the agent pod of a node cannot start (an unpullable image) ─► explain says so at once
//! ```

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use switchyard_e2e::kube::KubeCluster;

use super::{json, repo};

/// The plugin, built by `cargo test` beside the controller (`make build` leaves it there too).
fn plugin_dir() -> PathBuf {
    let built = repo().join("target/debug/kubectl-switchyard");
    assert!(
        built.exists(),
        "{} is missing: run `make build` (or the whole `make test`) first",
        built.display()
    );
    // A folder holding only the plugin: kubectl warns about every kubectl-* file on the PATH it cannot
    // run (target/debug has kubectl-switchyard.d).
    let dir = std::env::temp_dir().join(format!("switchyard-kubectl-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("kubectl-switchyard");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&built, &link).unwrap();
    dir
}

/// `kubectl switchyard ARGS` as a user runs it.
fn plugin(cluster: &KubeCluster, args: &[&str]) -> Output {
    let dir = plugin_dir();
    let kubectl = cluster.kubectl_command().get_program().to_owned();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let started = Instant::now();
    let out = Command::new(kubectl)
        .arg("switchyard")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "kube: plugin: kubectl switchyard {} → exit {:?} in {:.1} s",
        args.join(" "),
        out.status.code(),
        started.elapsed().as_secs_f64()
    );
    out
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn succeeds(cluster: &KubeCluster, args: &[&str]) -> String {
    let out = plugin(cluster, args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "kubectl switchyard {args:?}: exit {:?}\n{stdout}\n{stderr}",
        out.status.code()
    );
    stdout
}

/// Every subcommand answers on a healthy cluster.
pub fn answers(cluster: &KubeCluster) {
    let status = succeeds(cluster, &["status"]);
    eprintln!("{status}");
    for node in ["node-a", "node-b"] {
        assert!(status.contains(node), "status names {node}:\n{status}");
    }
    // Right after a change a node may be "reporting" (its agent reports progress once a minute); the
    // exit code says none lags.
    assert!(status.contains(", 0 lagging, 0 leaving"), "{status}");
    let wide = succeeds(cluster, &["status", "-o", "wide"]);
    assert!(wide.contains("IN USE") && wide.contains("OBSERVED"), "{wide}");

    let audit = succeeds(cluster, &["audit"]);
    assert!(audit.contains(" of 2 nodes current"), "{audit}");

    // The node's plan, composed as its agent composes it: the same revision its agent reports having
    // applied is not expected (that is the live plan's), but the same Services.
    let plan = succeeds(cluster, &["plan", "--node", "node-a"]);
    assert!(plan.contains("kind: NodeForwardingPlan"), "{plan}");
    assert!(plan.contains("nodeName: node-a"), "{plan}");
    assert!(
        plan.contains("name: flows/web:http"),
        "the web Service's entry:\n{plan}"
    );
    assert!(
        !plan.contains("views:"),
        "a self-contained plan has no views:\n{plan}"
    );
    let live = json(cluster, &["get", "nfp", "node-a"]);
    let services = live["status"]["services"].as_u64().unwrap_or_default();
    let entries = plan.matches("\n  - name: ").count() as u64;
    assert!(
        services > 0 && entries >= services,
        "plan entries {entries} < services applied {services}:\n{plan}"
    );
    let plan_json = succeeds(cluster, &["plan", "--node", "node-a", "-o", "json"]);
    let parsed: serde_json::Value = serde_json::from_str(&plan_json).unwrap();
    assert_eq!(parsed["spec"]["nodeName"], "node-a");

    // explain runs in node-b's agent pod (its kernel): forwarded, through its rules.
    let client = json(cluster, &["-n", "flows", "get", "pod", "client-a"]);
    let client_ip = client["status"]["podIP"].as_str().unwrap().to_owned();
    let explained = succeeds(
        cluster,
        &[
            "explain",
            "--node",
            "node-b",
            "--to",
            "flows/web:http",
            "--from",
            &client_ip,
            "--kernel",
        ],
    );
    eprintln!("{explained}");
    assert!(explained.contains("flows/web"), "{explained}");
    assert!(
        explained.contains("kernel: the installed rules take the same path as the plan"),
        "--kernel reads the node's rules:\n{explained}"
    );
    // The agent's own exit code comes back: a Service without endpoints is rejected (3).
    let rejected = plugin(
        cluster,
        &[
            "explain",
            "--node",
            "node-a",
            "--to",
            "flows/nothing:http",
            "--from",
            &client_ip,
        ],
    );
    let (stdout, stderr) = text(&rejected);
    assert_eq!(rejected.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stdout.to_lowercase().contains("reject"), "{stdout}");

    let top = succeeds(cluster, &["top", "--node", "node-a"]);
    eprintln!("{top}");
    assert!(top.contains("flows/"), "top lists the node's Services:\n{top}");
}

/// A wrong context and an unknown node are said plainly, with a non-zero exit, at once.
pub fn says_plainly(cluster: &KubeCluster) {
    let cases: [(&[&str], &str); 4] = [
        (
            &["status", "--context", "nope"],
            "context \"nope\" does not exist",
        ),
        (
            &["plan", "--node", "no-such-node"],
            "nodes \"no-such-node\" not found",
        ),
        (
            &[
                "explain",
                "--node",
                "no-such-node",
                "--to",
                "flows/web:http",
                "--from",
                "node",
            ],
            "nodes \"no-such-node\" not found",
        ),
        (
            &["top", "--node", "node-a", "-n", "elsewhere"],
            "no switchyard agent pod on node node-a in namespace elsewhere",
        ),
    ];
    for (args, words) in cases {
        let started = Instant::now();
        let out = plugin(cluster, args);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} succeeded:\n{stdout}");
        assert!(
            stderr.contains(words),
            "{args:?}: expected {words:?} in:\n{stderr}"
        );
        assert!(
            stderr.starts_with("error: "),
            "{args:?}: one plain line, as kubectl says it:\n{stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// `node`'s agent pod cannot start (waiting on an image): explain says so, naming the pod's reason.
pub fn not_running(cluster: &KubeCluster, node: &str) {
    let out = plugin(
        cluster,
        &[
            "explain",
            "--node",
            node,
            "--to",
            "flows/web:http",
            "--from",
            "node",
            "--request-timeout",
            "20",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "explain on {node} without a running agent succeeded:\n{stdout}"
    );
    assert!(
        stderr.contains("is not running")
            && (stderr.contains("ImagePullBackOff") || stderr.contains("ErrImagePull")),
        "the pod's own reason:\n{stderr}"
    );
}
