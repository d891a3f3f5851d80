//! Switchyard as its users run it, on a real two-node Kubernetes v1.36 cluster in the lab
//! (`make e2e-kube`; runs in `make test` whenever `SWITCHYARD_K8S_BIN` is set, and is reported as
//! ignored otherwise).
//!
//! ```text
//! images (scripts/image/build.sh: agent, controller, pause, agnhost) ─► KubeCluster::up (2 nodes)
//! the real kube-proxy on every node ─► workloads (testdata/kube-workloads.yaml) ─► flows: reference
//! steady prober on ─► install as docs/install.md says (crds/, ConfigMap, apply -k overlay) ─► all Applied
//!   (kube-proxy still holds 10256 and 10249: every agent reports PortUnavailable and forwards anyway)
//!   ─► kube-proxy removed (--cleanup) ─► the agents take its ports ─► flows again, now through
//!   Switchyard; kubectl exec/logs/port-forward; pods reach the API server through the kubernetes
//!   Service; kube-proxy's URLs from a host-network pod; conntrack's CLOSE_WAIT timeout on every node
//! a real Prometheus (kube/monitoring.rs) from the install on: every dashboard query answers; an agent
//!   without NET_ADMIN fires its alerts, which clear when it is undone
//! kubectl switchyard (kube/plugin.rs): status, audit, plan, explain and top through the agent pods; a
//!   wrong context and an unknown node said plainly; an agent pod that cannot start, said at once
//! a leaving node: Karpenter's taint ─► its /healthz 503, /livez 200, never restarted ─► untainted
//! rollouts (kube/rollout.rs), connections counted throughout: iptables → nftables over every node,
//!   verdicts unchanged; back to iptables with the controller leader deleted mid-rollout; a first node
//!   without nft halts a rollout and is reverted; the controller may change only the backend label
//! life cycle, connections counted throughout: workload rolling update, agent DaemonSet rolling
//!   update to a new tag, agent pod deleted (cache, no rule ever flushed), controller leader deleted
//! bad input: unpullable image, NET_ADMIN dropped, an image without nft, no API-server ConfigMap
//! a node deleted (held by a finalizer: /healthz 503), its kubelet stopped, the Node gone ─► its plan
//!   goes, the other node untouched
//! back to kube-proxy: started, Switchyard deleted (kubectl delete -k), switchyard-agent cleanup
//! ```
//!
//! Every step prints `kube: <step>: …` with what it measured (run with --nocapture to see them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "kube/health.rs"]
mod health;
#[path = "kube/monitoring.rs"]
mod monitoring;
#[path = "kube/node_by_node.rs"]
mod node_by_node;
#[path = "kube/plugin.rs"]
mod plugin;
#[path = "kube/rollout.rs"]
mod rollout;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use switchyard_e2e::kube::{
    K8sBinaries, KubeCluster, KubeOptions,
    flows::{self, Flow},
    install::{self, Overlay},
    traffic::{self, Prober, ProberTally},
};

const AGENT_IMAGE: &str = "ghcr.io/switchyard/switchyard-agent";
const CONTROLLER_IMAGE: &str = "ghcr.io/switchyard/switchyard-controller";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tag() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// Prints a step's line and returns the elapsed time of `f`.
fn step<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    eprintln!("kube: {name} ... [{}]", traffic::clock());
    let value = f();
    eprintln!(
        "kube: {name}: done in {:.1} s [{}]",
        started.elapsed().as_secs_f64(),
        traffic::clock()
    );
    value
}

fn wait_until<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn json(cluster: &KubeCluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&cluster.kubectl(&all).unwrap()).unwrap()
}

fn build_images(bin: &K8sBinaries) -> Vec<PathBuf> {
    let out = repo().join("target/images");
    let status = std::process::Command::new(repo().join("scripts/image/build.sh"))
        .args([
            "--out",
            &out.display().to_string(),
            "agent",
            "agent-no-nft",
            "controller",
            "pause",
            "agnhost",
        ])
        .env("SWITCHYARD_K8S_BIN", bin.dir())
        .status()
        .expect("scripts/image/build.sh runs");
    assert!(status.success(), "scripts/image/build.sh failed");
    eprintln!(
        "kube: images:\n{}",
        std::fs::read_to_string(out.join("images.txt")).unwrap_or_default()
    );
    switchyard_e2e::kube::cluster::image_archives(&out)
}

fn check_flows(cluster: &KubeCluster, proxy: &str, flows: &[Flow]) {
    let results = flows::check(cluster, flows);
    let mut failed = Vec::new();
    for (line, ok) in &results {
        eprintln!(
            "kube: flow [{proxy}] {}: {line}",
            if *ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failed.push(line.clone());
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} flows failed with {proxy}:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
}

fn assert_no_failures(what: &str, tally: &ProberTally) {
    eprintln!(
        "kube: {what}: {} connections, {} failed",
        tally.total(),
        tally.failures.len()
    );
    assert!(tally.total() > 0, "{what}: no connection was made");
    if tally.failures.is_empty() {
        return;
    }
    // The agents replaced since are gone with their logs: what they last logged was kept.
    for (pod, log) in REPLACED_AGENT_LOGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        eprintln!("kube: {what}: the last log lines of the replaced agent {pod}:\n{log}");
    }
    let failures: Vec<String> = tally.failures.iter().take(10).map(ToString::to_string).collect();
    panic!("{what}: failed connections:\n{}", failures.join("\n"));
}

/// The last log lines of each agent pod the test deleted, for a failed steady prober to show.
static REPLACED_AGENT_LOGS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// The prober of the Service nothing changes: from a pod on each node (ClusterIP) and from outside
/// (NodePort on node-a).
fn steady_prober(cluster: &KubeCluster, pods: &[&str]) -> Prober {
    let mut sources = Vec::new();
    for pod in pods {
        let (netns, _) = flows::pod_source(cluster, "flows", pod).unwrap();
        sources.push((format!("pod {pod}"), netns, "10.96.100.18:80".parse().unwrap()));
    }
    let (outside, _) = flows::resolve(cluster, &flows::From::Outside).unwrap();
    sources.push((
        "outside".to_owned(),
        outside,
        "192.168.30.11:30083".parse().unwrap(),
    ));
    Prober::start(&sources, Duration::from_millis(100)).unwrap()
}

fn agent_pod(cluster: &KubeCluster, node: &str) -> Option<(String, bool)> {
    let pods = agent_pods(cluster);
    pods["items"].as_array()?.iter().find_map(|pod| {
        (pod["spec"]["nodeName"] == node && pod["metadata"]["deletionTimestamp"].is_null()).then(|| {
            let ready = pod["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            (
                pod["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                ready,
            )
        })
    })
}

/// Whether the `web` Service's ClusterIP answers one HTTP probe from `pod`.
fn web_answers(cluster: &KubeCluster, pod: &'static str) -> bool {
    flows::resolve(cluster, &flows::From::Pod(pod)).is_ok_and(|(netns, _)| {
        traffic::http_probe(&netns, "10.96.100.10:80".parse().unwrap(), Duration::from_secs(1)).is_answered()
    })
}

/// `kubectl rollout status` of `what` in `namespace`, waiting at most `timeout_s`.
fn rollout_status(cluster: &KubeCluster, namespace: &str, what: &str, timeout_s: u32) {
    cluster
        .kubectl(&[
            "-n",
            namespace,
            "rollout",
            "status",
            what,
            &format!("--timeout={timeout_s}s"),
        ])
        .unwrap();
}

/// The agent DaemonSet's pods, as JSON.
fn agent_pods(cluster: &KubeCluster) -> Value {
    json(
        cluster,
        &[
            "-n",
            "switchyard-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=agent",
        ],
    )
}

fn swyd_rules(cluster: &KubeCluster, node: &str) -> usize {
    let out = cluster
        .node(node)
        .unwrap()
        .run_in(&["iptables-nft-save".to_owned(), "-t".to_owned(), "nat".to_owned()])
        .unwrap_or_default();
    out.lines().filter(|line| line.starts_with("-A SWYD-")).count()
}

#[test]
#[cfg_attr(
    not(k8s_bin),
    ignore = "needs SWITCHYARD_K8S_BIN (a folder of Kubernetes v1.36 binaries: ../shared/k8s/unpack.sh; .ci/run sets it)"
)]
fn switchyard_runs_on_a_real_cluster_as_users_install_it() {
    if !common::lab_allowed("kube_cluster") {
        return;
    }
    let suite = Instant::now();
    let bin = K8sBinaries::from_env()
        .expect("SWITCHYARD_K8S_BIN is set (this test is ignored without it)")
        .expect("SWITCHYARD_K8S_BIN names a folder of Kubernetes binaries");
    let images = step("images", || build_images(&bin));
    let mut cluster = step("cluster up", || {
        KubeCluster::up(KubeOptions {
            nodes: 2,
            binaries: bin.clone(),
            images,
            lab_binary: PathBuf::from(env!("CARGO_BIN_EXE_switchyard-lab")),
            state_dir: switchyard_e2e::options::default_state_dir(),
            ready_timeout: Duration::from_secs(120),
        })
        .expect("the lab cluster comes up")
    });
    eprintln!(
        "kube: cluster {} (KUBECONFIG={})",
        cluster.id(),
        cluster.admin_kubeconfig().display()
    );

    // --- the reference: the real kube-proxy ---
    step("kube-proxy on every node", || cluster.start_kube_proxy().unwrap());
    step("workloads", || {
        let workloads = repo()
            .join("e2e/testdata/kube-workloads.yaml")
            .display()
            .to_string();
        cluster.kubectl(&["apply", "-f", &workloads]).unwrap();
        cluster
            .kubectl(&[
                "-n",
                "flows",
                "patch",
                "service",
                "web-lb",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.20","ipMode":"VIP"}]}}}"#,
            ])
            .unwrap();
        for deployment in ["web", "local", "steady"] {
            rollout_status(&cluster, "flows", &format!("deployment/{deployment}"), 120);
        }
        cluster
            .kubectl(&[
                "-n",
                "flows",
                "wait",
                "--for=condition=Ready",
                "pod/client-a",
                "pod/client-b",
                "--timeout=120s",
            ])
            .unwrap();
    });
    let standard = flows::standard();
    // kube-proxy programs what it has seen; give it its first sync.
    wait_until(
        Duration::from_secs(60),
        "kube-proxy to forward the web Service",
        || web_answers(&cluster, "client-a").then_some(()),
    );
    step("flows through kube-proxy (the reference)", || {
        check_flows(&cluster, "kube-proxy", &standard)
    });

    // --- install exactly as docs/install.md says, while kube-proxy still runs ---
    let steady = steady_prober(&cluster, &["client-a", "client-b"]);
    let overlay = Overlay {
        agent_image: format!("{AGENT_IMAGE}:{}", tag()),
        controller_image: format!("{CONTROLLER_IMAGE}:{}", tag()),
        pull_policy: "IfNotPresent".into(),
        cluster_cidrs: vec![switchyard_e2e::kube::spec::CLUSTER_CIDR.into()],
    };
    let installed = step("install (crds/, ConfigMap, kubectl apply -k)", || {
        install::install(&cluster, &repo(), &overlay, Duration::from_secs(120)).unwrap()
    });
    eprintln!(
        "kube: number: kubectl apply -k to every node Applied: {:.1} s",
        installed.applied_after.as_secs_f64()
    );
    step("controller: two replicas, one leader", || {
        rollout_status(
            &cluster,
            "switchyard-system",
            "deployment/switchyard-controller",
            120,
        );
        let lease = json(
            &cluster,
            &["-n", "switchyard-system", "get", "lease", "switchyard-controller"],
        );
        let holder = lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            holder.starts_with("switchyard-controller-"),
            "lease holder {holder:?}"
        );
    });
    let prometheus = step(
        "a real Prometheus scraping the agents and the controller (config/components/monitoring)",
        || monitoring::start(&cluster),
    );
    step(
        "kube-proxy holds its ports: every agent says so and forwards",
        || health::ports_held_by_kube_proxy(&cluster),
    );
    step("kube-proxy removed (kube-proxy --cleanup on every node)", || {
        cluster.remove_kube_proxy().unwrap()
    });
    let kube_proxy_gone = Instant::now();
    step("the agents take kube-proxy's ports", || {
        health::ports_taken(&cluster, kube_proxy_gone)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_no_failures(
        "steady Service during the migration to Switchyard",
        &steady.tally(),
    );
    step("flows through Switchyard", || {
        check_flows(&cluster, "switchyard", &standard)
    });

    // --- node by node (docs/migration.md §1): node-b back to kube-proxy and to Switchyard again ---
    step("beside kube-proxy: nodes labelled, the overlay applied", || {
        node_by_node::beside_kube_proxy(&cluster, &repo(), &overlay)
    });
    step("node-b back to kube-proxy, node-a on Switchyard", || {
        node_by_node::back_to_kube_proxy(&mut cluster, "node-b", &standard)
    });
    step(
        "node-b to Switchyard again, kube-proxy's rules removed after",
        || node_by_node::to_switchyard(&mut cluster, "node-b", &standard),
    );
    step("config/default again", || {
        node_by_node::default_again(&cluster, &installed.overlay)
    });
    assert_no_failures(
        "steady Service while node-b moved to kube-proxy and back",
        &steady.tally(),
    );
    step(
        "standard tooling: exec, logs, port-forward; the kubernetes Service from a pod",
        || {
            let version = cluster
                .kubectl(&[
                    "-n",
                    "flows",
                    "exec",
                    "client-a",
                    "--",
                    "curl",
                    "-sk",
                    "-m",
                    "3",
                    "https://10.96.0.1/version",
                ])
                .unwrap();
            assert!(
                version.contains("\"minor\": \"36\""),
                "the API server through its ClusterIP said: {version}"
            );
            let logs = cluster
                .kubectl(&["-n", "switchyard-system", "logs", "daemonset/switchyard-agent"])
                .unwrap();
            assert!(logs.contains("synced"), "agent logs: {logs}");
            check_port_forward(&cluster);
        },
    );
    step(
        "service.kubernetes.io/headless: the ClusterIP goes down, and back without the label",
        || {
            let answered = || web_answers(&cluster, "client-a");
            cluster
                .kubectl(&[
                    "-n",
                    "flows",
                    "label",
                    "service",
                    "web",
                    "service.kubernetes.io/headless=",
                ])
                .unwrap();
            let labelled = Instant::now();
            wait_until(
                Duration::from_secs(20),
                "the labelled Service to stop answering",
                || (!answered()).then_some(()),
            );
            eprintln!(
                "kube: number: headless label → ClusterIP no longer forwarded within {:.1} s",
                labelled.elapsed().as_secs_f64()
            );
            cluster
                .kubectl(&[
                    "-n",
                    "flows",
                    "label",
                    "service",
                    "web",
                    "service.kubernetes.io/headless-",
                ])
                .unwrap();
            wait_until(Duration::from_secs(20), "the Service to answer again", || {
                answered().then_some(())
            });
        },
    );
    step("kubectl get nfp", || {
        eprintln!("{}", cluster.kubectl(&["get", "nfp", "-o", "wide"]).unwrap())
    });
    step("kubectl switchyard: status, audit, plan, explain, top", || {
        plugin::answers(&cluster)
    });
    step("kubectl switchyard: a wrong context, an unknown node", || {
        plugin::says_plainly(&cluster)
    });
    step("monitoring: every dashboard query returns data", || {
        monitoring::dashboard_answers(&cluster, &prometheus)
    });
    step(
        "kube-proxy's URLs from a host-network pod; conntrack's timeouts on every node",
        || health::kube_proxy_urls(&cluster),
    );
    step("a leaving node: Karpenter's taint, then removed", || {
        health::a_tainted_node_leaves(&cluster)
    });

    // --- rollouts between backends, under the steady prober ---
    step("rollout iptables → nftables over every node", || {
        rollout::to_nftables_everywhere(&cluster)
    });
    step(
        "rollout back to iptables, the controller leader deleted mid-rollout",
        || rollout::leader_deleted_mid_rollout(&cluster),
    );
    step(
        "rollout to nftables whose first node lacks nft: reverted, Halted",
        || rollout::first_node_lacks_nftables(&cluster),
    );
    step("the controller may change only a Node's backend label", || {
        rollout::controller_changes_only_the_backend_label(&cluster)
    });
    step("rollouts deleted, labels removed", || rollout::clean_up(&cluster));
    assert_no_failures("steady Service through the rollouts", &steady.tally());

    // --- life cycle under traffic ---
    let web_prober = {
        let (netns, _) = flows::pod_source(&cluster, "flows", "client-b").unwrap();
        Prober::start(
            &[(
                "pod client-b".to_owned(),
                netns,
                "10.96.100.10:80".parse().unwrap(),
            )],
            Duration::from_millis(100),
        )
        .unwrap()
    };
    step("rolling update of the workload (terminating endpoints)", || {
        cluster
            .kubectl(&["-n", "flows", "rollout", "restart", "deployment/web"])
            .unwrap();
        rollout_status(&cluster, "flows", "deployment/web", 180);
        std::thread::sleep(Duration::from_secs(6));
    });
    assert_no_failures("web Service during its own rolling update", &web_prober.stop());

    step("rolling update of the agent DaemonSet to a new tag", || {
        let new = format!("{AGENT_IMAGE}:{}-rollout", tag());
        for node in cluster.nodes() {
            node.tag(&format!("{AGENT_IMAGE}:{}", tag()), &new).unwrap();
        }
        cluster
            .kubectl(&[
                "-n",
                "switchyard-system",
                "set",
                "image",
                "daemonset/switchyard-agent",
                &format!("agent={new}"),
            ])
            .unwrap();
        rollout_status(&cluster, "switchyard-system", "daemonset/switchyard-agent", 180);
        install::wait_all_applied(&cluster, Duration::from_secs(60)).unwrap();
    });

    step(
        "agent pod deleted: restarted, reprogrammed from its cache, no rule flushed",
        || {
            agent_restart(&cluster, "node-a");
        },
    );

    step(
        "controller leader deleted: the standby takes over and plans the next change",
        || {
            let lease = json(
                &cluster,
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
            let next = wait_until(Duration::from_secs(60), "another leader", || {
                let lease = json(
                    &cluster,
                    &["-n", "switchyard-system", "get", "lease", "switchyard-controller"],
                );
                let holder = lease["spec"]["holderIdentity"].as_str()?.to_owned();
                (holder != leader).then_some(holder)
            });
            eprintln!(
                "kube: number: controller failover {leader} → {next} in {:.1} s",
                deleted.elapsed().as_secs_f64()
            );
            cluster
                .kubectl(&["-n", "flows", "scale", "deployment/web", "--replicas=5"])
                .unwrap();
            rollout_status(&cluster, "flows", "deployment/web", 120);
            let pods = json(&cluster, &["-n", "flows", "get", "pods", "-l", "app=web"]);
            let names: Vec<String> = pods["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|pod| pod["metadata"]["name"].as_str().unwrap().to_owned())
                .collect();
            let (netns, _) = flows::pod_source(&cluster, "flows", "client-a").unwrap();
            wait_until(Duration::from_secs(30), "all 5 web pods to answer", || {
                let seen: std::collections::BTreeSet<String> = traffic::http_probe_many(
                    &netns,
                    "10.96.100.10:80".parse().unwrap(),
                    30,
                    Duration::from_secs(2),
                )
                .iter()
                .filter_map(|r| r.pod().map(str::to_owned))
                .collect();
                names.iter().all(|name| seen.contains(name)).then_some(())
            });
        },
    );
    assert_no_failures("steady Service through the life-cycle steps", &steady.tally());

    // --- bad input: each ends in a clear message; the other node keeps forwarding ---
    step("bad input: an image that cannot be pulled", || {
        bad_image(&cluster)
    });
    step(
        "bad input: an overlay without NET_ADMIN (its alerts fire, then clear)",
        || without_net_admin(&cluster, &prometheus),
    );
    step("bad input: a node whose agent image lacks nft", || {
        image_without_nft(&cluster, "node-b")
    });
    assert_no_failures("steady Service through the bad inputs", &steady.stop());

    // node-b forwards nothing for a while here: only node-a's client and the outside are counted.
    let steady_a = steady_prober(&cluster, &["client-a"]);
    step(
        "bad input: a new node, no kube-proxy, no API-server ConfigMap",
        || new_node_without_configmap(&cluster, "node-b"),
    );

    // --- a node goes away ---
    step(
        "node-b deleted while a finalizer holds it: a leaving node",
        || health::a_deleted_node_leaves(&cluster),
    );
    step("node-b's kubelet stopped and its Node gone", || {
        let before = json(&cluster, &["get", "nfp", "node-a"]);
        cluster.stop_kubelet("node-b").unwrap();
        health::release_deleted_node(&cluster);
        wait_until(Duration::from_secs(60), "nfp/node-b to be deleted", || {
            cluster.kubectl(&["get", "nfp", "node-b"]).is_err().then_some(())
        });
        let after = json(&cluster, &["get", "nfp", "node-a"]);
        assert_eq!(
            before["spec"]["revision"], after["spec"]["revision"],
            "node-a's plan was rewritten"
        );
        assert_eq!(before["metadata"]["uid"], after["metadata"]["uid"]);
    });

    // --- and back to kube-proxy ---
    step(
        "back to kube-proxy: started, Switchyard deleted, switchyard-agent cleanup",
        || {
            cluster.start_kube_proxy().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            let overlay_dir = installed.overlay.display().to_string();
            cluster
                .kubectl(&["delete", "-k", &overlay_dir, "--wait=true", "--timeout=120s"])
                .unwrap();
            // What a user runs on each node (the lab binary carries the agent's command line).
            let argv = vec![
                env!("CARGO_BIN_EXE_switchyard-lab").to_owned(),
                "agent".to_owned(),
                "cleanup".to_owned(),
            ];
            let out = cluster.node("node-a").unwrap().run_in(&argv).unwrap();
            eprintln!("kube: switchyard-agent cleanup on node-a: {}", out.trim());
            assert_eq!(swyd_rules(&cluster, "node-a"), 0, "SWYD rules left after cleanup");
            std::thread::sleep(Duration::from_secs(2));
        },
    );
    assert_no_failures(
        "steady Service through node-b's removal and the way back to kube-proxy",
        &steady_a.stop(),
    );

    eprintln!(
        "kube: number: whole cluster suite {:.0} s",
        suite.elapsed().as_secs_f64()
    );
    // Prometheus and its pod discovery (kubectl every 2 s) stop before the API server goes.
    drop(prometheus);
    step("cluster down", || cluster.down().unwrap());
}

fn check_port_forward(cluster: &KubeCluster) {
    let mut child = cluster
        .kubectl_command()
        .args(["-n", "flows", "port-forward", "deployment/steady", "18083:8080"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let answer = wait_until(Duration::from_secs(20), "port-forward to answer", || {
        let result = traffic::http_probe_here(
            "127.0.0.1:18083".parse::<SocketAddr>().unwrap(),
            Duration::from_secs(2),
        );
        result.pod().map(str::to_owned)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("steady-"), "port-forward answered by {answer}");
}

/// Deletes node's agent pod while sampling its SWYD rules; the new pod reprograms from its cache.
fn agent_restart(cluster: &KubeCluster, node: &str) {
    let (old, _) = agent_pod(cluster, node).unwrap();
    let before = swyd_rules(cluster, node);
    assert!(before > 0, "no SWYD rules on {node}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = std::sync::Arc::clone(&stop);
        let netns = cluster.spec().node(node).unwrap().netns.clone();
        std::thread::spawn(move || {
            let mut least = usize::MAX;
            let mut samples = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let out = std::process::Command::new("ip")
                    .args(["netns", "exec", &netns, "iptables-nft-save", "-t", "nat"])
                    .output()
                    .unwrap();
                let count = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.starts_with("-A SWYD-"))
                    .count();
                least = least.min(count);
                samples += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (least, samples)
        })
    };
    let deleted = Instant::now();
    cluster
        .kubectl(&["-n", "switchyard-system", "delete", "pod", &old, "--wait=false"])
        .unwrap();
    let new = wait_until(Duration::from_secs(90), "a new Ready agent pod", || {
        agent_pod(cluster, node)
            .filter(|(name, ready)| *name != old && *ready)
            .map(|(name, _)| name)
    });
    let ready_after = deleted.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (least, samples) = sampler.join().unwrap();
    let logs = cluster
        .kubectl(&["-n", "switchyard-system", "logs", &new, "--timestamps=false"])
        .unwrap();
    let first = logs.lines().next().and_then(log_time).unwrap();
    let cached = logs
        .lines()
        .find(|line| line.contains("applying the cached plan"))
        .unwrap_or_else(|| panic!("the new agent did not apply its cache:\n{logs}"));
    let synced = logs
        .lines()
        .find(|line| line.contains("synced"))
        .and_then(log_time)
        .unwrap();
    let pod = json(cluster, &["-n", "switchyard-system", "get", "pod", &new]);
    let started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ready_at = pod["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or_default()
        .to_owned();
    eprintln!(
        "kube: number: agent restart on {node}: process start → cached plan synced {:.3} s; container \
         started {started}, Ready {ready_at}; delete → new pod Ready {:.1} s; SWYD nat rules {before} \
         before, at least {least} in {samples} samples (20 ms apart)",
        (synced - first).as_secs_f64(),
        ready_after.as_secs_f64()
    );
    assert!(cached.contains("applying the cached plan"));
    assert!(
        least >= before,
        "rules were flushed during the restart: {least} < {before}"
    );
}

/// A log line's leading RFC 3339 timestamp as a duration since the epoch.
fn log_time(line: &str) -> Option<Duration> {
    let stamp = line.split_whitespace().next()?;
    let (date, time) = stamp.trim_end_matches('Z').split_once('T')?;
    let (h, rest) = time.split_once(':')?;
    let (m, s) = rest.split_once(':')?;
    let seconds: f64 = s.parse().ok()?;
    let _ = date;
    Some(Duration::from_secs_f64(
        h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + seconds,
    ))
}

/// A DaemonSet update to an image no registry has: the first node's new pod says why it cannot start,
/// the rollout stops there, every node keeps forwarding; `rollout undo` brings it back.
fn bad_image(cluster: &KubeCluster) {
    let image = format!("{AGENT_IMAGE}:does-not-exist");
    cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "set",
            "image",
            "daemonset/switchyard-agent",
            &format!("agent={image}"),
        ])
        .unwrap();
    let (message, node) = wait_until(
        Duration::from_secs(90),
        "an agent pod to report the failed pull",
        || {
            let pods = agent_pods(cluster);
            pods["items"].as_array()?.iter().find_map(|pod| {
                let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
                let reason = waiting["reason"].as_str()?;
                let node = pod["spec"]["nodeName"].as_str().unwrap_or_default().to_owned();
                matches!(reason, "ErrImagePull" | "ImagePullBackOff").then(|| {
                    (
                        format!("{reason}: {}", waiting["message"].as_str().unwrap_or_default()),
                        node,
                    )
                })
            })
        },
    );
    eprintln!("kube: bad image: pod status says {message}");
    assert!(message.contains("does-not-exist"), "{message}");
    plugin::not_running(cluster, &node);
    check_flows(
        cluster,
        "switchyard, agent image unpullable on one node",
        &flows::standard()[..4],
    );
    undo_agent_rollout(cluster);
}

/// An overlay whose agent lacks NET_ADMIN: the agent says what is missing (log, status, not Ready),
/// the rules stay; `rollout undo` brings it back.
fn without_net_admin(cluster: &KubeCluster, prometheus: &switchyard_e2e::kube::prometheus::Prometheus) {
    cluster
        .kubectl(&[
            "-n", "switchyard-system", "patch", "daemonset/switchyard-agent", "--type=json", "-p",
            r#"[{"op":"replace","path":"/spec/template/spec/containers/0/securityContext/capabilities/add","value":["NET_RAW"]}]"#,
        ])
        .unwrap();
    let (pod, node) = wait_until(
        Duration::from_secs(90),
        "an agent pod without NET_ADMIN to start",
        || {
            let pods = agent_pods(cluster);
            pods["items"].as_array()?.iter().find_map(|pod| {
                let caps = &pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"];
                let running = !pod["status"]["containerStatuses"][0]["state"]["running"].is_null();
                (caps.as_array()?.len() == 1 && running).then(|| {
                    (
                        pod["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                        pod["spec"]["nodeName"].as_str().unwrap_or_default().to_owned(),
                    )
                })
            })
        },
    );
    let logs = wait_until(
        Duration::from_secs(60),
        "the agent to say NET_ADMIN is missing",
        || {
            let logs = cluster.kubectl(&["-n", "switchyard-system", "logs", &pod]).ok()?;
            logs.contains("NET_ADMIN").then_some(logs)
        },
    );
    let line = logs
        .lines()
        .find(|line| line.contains("NET_ADMIN"))
        .unwrap_or_default();
    eprintln!("kube: without NET_ADMIN on {node}: the agent logs: {line}");
    let status = wait_until(
        Duration::from_secs(60),
        "nfp status to name the missing capability",
        || {
            let plan = json(cluster, &["get", "nfp", &node]);
            let conditions = plan["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .find(|c| c["message"].as_str().is_some_and(|m| m.contains("NET_ADMIN")))
                .map(|c| format!("{}={} {}: {}", c["type"], c["status"], c["reason"], c["message"]))
        },
    );
    eprintln!("kube: without NET_ADMIN on {node}: kubectl get nfp {node} says {status}");
    let (_, ready) = agent_pod(cluster, &node).unwrap();
    assert!(!ready, "an agent that cannot program its node must not be Ready");
    assert!(swyd_rules(cluster, &node) > 0, "the last good rules must stay");
    check_flows(
        cluster,
        "switchyard, one agent without NET_ADMIN",
        &flows::standard()[..4],
    );
    monitoring::alerts_fire(prometheus, &node);
    undo_agent_rollout(cluster);
    monitoring::alert_clears(prometheus, &node);
}

fn agent_image_now(cluster: &KubeCluster) -> String {
    let ds = json(
        cluster,
        &["-n", "switchyard-system", "get", "daemonset", "switchyard-agent"],
    );
    ds["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn delete_agent_pod(cluster: &KubeCluster, node: &str) {
    let (pod, _) = agent_pod(cluster, node).expect("an agent pod on the node");
    let log = cluster
        .kubectl(&["-n", "switchyard-system", "logs", &pod, "--tail=40"])
        .unwrap_or_else(|error| format!("(no log: {error})"));
    REPLACED_AGENT_LOGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((format!("{pod} on {node}, deleted {}", traffic::clock()), log));
    cluster
        .kubectl(&["-n", "switchyard-system", "delete", "pod", &pod, "--wait=true"])
        .unwrap();
}

fn wait_agent_ready(cluster: &KubeCluster, node: &str) -> String {
    wait_until(
        Duration::from_secs(90),
        &format!("{node}'s new agent pod to be Ready"),
        || match agent_pod(cluster, node) {
            Some((pod, true)) => Some(pod),
            _ => None,
        },
    )
}

/// A node labelled for nftables whose image has no `nft` (a custom image, a stale node-local copy):
/// the agent keeps forwarding with iptables and says so in `kubectl get nfp` (Degraded,
/// BackendFallback) and its log; the right image and label bring it back.
fn image_without_nft(cluster: &KubeCluster, node: &str) {
    let image = agent_image_now(cluster);
    let lacking = format!("{AGENT_IMAGE}:{}-no-nft", tag());
    // The node's copy of the DaemonSet's image is replaced by one without nft.
    cluster.node(node).unwrap().tag(&lacking, &image).unwrap();
    delete_agent_pod(cluster, node);
    let pod = wait_agent_ready(cluster, node);
    cluster
        .kubectl(&[
            "label",
            "node",
            node,
            "switchyard.io/backend=nftables",
            "--overwrite",
        ])
        .unwrap();
    let status = wait_until(
        Duration::from_secs(60),
        "nfp status to say nft is missing",
        || {
            let plan = json(cluster, &["get", "nfp", node]);
            let conditions = plan["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .find(|c| c["type"] == "Degraded" && c["reason"] == "BackendFallback")
                .filter(|c| c["message"].as_str().is_some_and(|m| m.contains("nft is not in")))
                .map(|c| c["message"].as_str().unwrap_or_default().to_owned())
        },
    );
    eprintln!(
        "kube: image without nft on {node}: kubectl get nfp {node} says Degraded BackendFallback: {status}"
    );
    eprintln!(
        "{}",
        cluster.kubectl(&["get", "nfp", node, "-o", "wide"]).unwrap()
    );
    let logs = cluster
        .kubectl(&["-n", "switchyard-system", "logs", &pod])
        .unwrap();
    let line = logs
        .lines()
        .find(|line| line.contains("nft is not in"))
        .unwrap_or_else(|| panic!("the agent's log names the missing nft:\n{logs}"));
    eprintln!("kube: image without nft on {node}: the agent logs: {line}");
    assert!(swyd_rules(cluster, node) > 0, "forwarding goes on with iptables");
    check_flows(
        cluster,
        "switchyard, one node's image without nft",
        &flows::standard()[..4],
    );
    // Back: the label off, the right image, a new pod.
    cluster
        .kubectl(&["label", "node", node, "switchyard.io/backend-"])
        .unwrap();
    cluster
        .node(node)
        .unwrap()
        .tag(&format!("{AGENT_IMAGE}:{}", tag()), &image)
        .unwrap();
    delete_agent_pod(cluster, node);
    wait_agent_ready(cluster, node);
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
}

/// A node that joins a cluster without kube-proxy while the switchyard-apiserver ConfigMap is
/// missing: its agent has only the `kubernetes` ClusterIP, which nothing programs there yet. It exits
/// with what to configure, which the pod's status shows; the other node keeps forwarding; the
/// ConfigMap, once created, is picked up at the next restart and the node is programmed.
fn new_node_without_configmap(cluster: &KubeCluster, node: &str) {
    const HOLD: &str = "lab.switchyard.io/hold-agent";
    cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "delete",
            "configmap",
            "switchyard-apiserver",
        ])
        .unwrap();
    // An affinity that lets the test take the agent off one node (the pods restart once for it,
    // from their caches).
    let affinity = format!(
        r#"{{"spec":{{"template":{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"{HOLD}","operator":"DoesNotExist"}}]}}]}}}}}}}}}}}}}}"#
    );
    cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "patch",
            "daemonset/switchyard-agent",
            "--type=merge",
            "-p",
            &affinity,
        ])
        .unwrap();
    rollout_status(cluster, "switchyard-system", "daemonset/switchyard-agent", 180);
    cluster
        .kubectl(&["label", "node", node, &format!("{HOLD}=yes")])
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        &format!("the agent pod to leave {node}"),
        || agent_pod(cluster, node).is_none().then_some(()),
    );
    // What a new node is: no rules, no cache.
    let lab = env!("CARGO_BIN_EXE_switchyard-lab").to_owned();
    let machine = cluster.node(node).unwrap();
    machine
        .run_in(&[lab, "agent".to_owned(), "cleanup".to_owned()])
        .unwrap();
    machine
        .run_in(&[
            "find".to_owned(),
            "/var/lib/switchyard".to_owned(),
            "-mindepth".to_owned(),
            "1".to_owned(),
            "-delete".to_owned(),
        ])
        .unwrap();
    assert_eq!(swyd_rules(cluster, node), 0, "{node} starts without rules");
    cluster
        .kubectl(&["label", "node", node, &format!("{HOLD}-")])
        .unwrap();
    // Twice under the load of a full `make test` (2026-12-03, 2026-12-05) the new pod came up Ready,
    // restartCount 0: it had been given an API server address that answers, which only the deleted
    // ConfigMap holds (the kubelet's own address is unprogrammed here: no rules, no cache). The kubelet
    // resolves `envFrom` through its object cache, which can still hold a ConfigMap deleted since;
    // the agent then rightly uses it. So a pod that comes up Ready has its log printed (the agent logs
    // the server it took) and is deleted, at most twice: the next lookup is fresh. Every new state of
    // the pod is printed.
    let mut seen = String::new();
    let mut stale_retries = 0;
    let message = wait_until(
        Duration::from_secs(180),
        "the agent pod's status to say what is missing",
        || {
            let (name, ready) = agent_pod(cluster, node)?;
            let pod = json(cluster, &["-n", "switchyard-system", "get", "pod", &name]);
            let state = pod["status"]["containerStatuses"][0].to_string();
            if state != seen {
                eprintln!("kube: no ConfigMap on a new {node}: the agent container is now {state}");
                seen = state;
            }
            if ready && stale_retries < 2 {
                stale_retries += 1;
                let log = cluster
                    .kubectl(&["-n", "switchyard-system", "logs", &name, "--tail=30"])
                    .unwrap_or_default();
                eprintln!(
                    "kube: no ConfigMap on a new {node}: {name} is Ready (a cached ConfigMap?); its log:\n{log}\nkube: deleting it (retry {stale_retries} of 2)"
                );
                delete_agent_pod(cluster, node);
                return None;
            }
            let terminated = &pod["status"]["containerStatuses"][0]["lastState"]["terminated"];
            terminated["message"]
                .as_str()
                .filter(|m| m.contains("switchyard-apiserver"))
                .map(|m| format!("{}: {m}", terminated["reason"].as_str().unwrap_or_default()))
        },
    );
    eprintln!("kube: no ConfigMap on a new {node}: the pod's last state says {message}");
    assert!(message.contains("10.96.0.1:443"), "{message}");
    check_flows(
        cluster,
        "switchyard, a new node that cannot reach the API server",
        &flows::standard()[..1],
    );
    // The fix the message names; the next restart picks it up.
    let created = Instant::now();
    install::apiserver_configmap(cluster).unwrap();
    // Ready only after a sync of the plan it fetched (its status was the old agent's until then).
    wait_until(
        Duration::from_secs(120),
        &format!("{node}'s agent to start with the ConfigMap and be Ready"),
        || match agent_pod(cluster, node) {
            Some((_, true)) => Some(()),
            _ => None,
        },
    );
    assert!(swyd_rules(cluster, node) > 0, "{node} is programmed");
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
    eprintln!(
        "kube: number: ConfigMap created → new {node} Applied {:.1} s (includes the kubelet's restart back-off)",
        created.elapsed().as_secs_f64()
    );
    check_flows(
        cluster,
        "switchyard, the new node programmed",
        &flows::standard()[..2],
    );
}

fn undo_agent_rollout(cluster: &KubeCluster) {
    cluster
        .kubectl(&[
            "-n",
            "switchyard-system",
            "rollout",
            "undo",
            "daemonset/switchyard-agent",
        ])
        .unwrap();
    rollout_status(cluster, "switchyard-system", "daemonset/switchyard-agent", 180);
    install::wait_all_applied(cluster, Duration::from_secs(60)).unwrap();
}
