//! The lab scenario suite, shared by the backends: the example cluster (`examples/cluster.yaml`) in the
//! lab, with the planner's plans applied by one `switchyard-agent` per node, and changes applied as the
//! live controller would (new plan files, partial syncs). Each backend's test file runs every scenario
//! with a [`Suite`] whose controller config sets `defaultBackend`; what differs per backend (how to
//! tamper with the rules, how to see that cleanup removed them) is in [`Suite`]. Needs root (see
//! `common::lab_allowed`).

pub mod exposure;
pub mod leaving;
pub mod traffic;
pub mod udp;

use std::{path::PathBuf, time::Duration};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use switchyard_api::{Backend, SyncMode, conditions};
use switchyard_e2e::{
    ClusterDescription, Deployed, Place, Proto,
    checks::{self, Check, Expect, answered, answered_from, spread},
    demo::example_checks,
};

fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

fn example() -> ClusterDescription {
    ClusterDescription::from_file(&repo("examples/cluster.yaml")).unwrap()
}

/// One backend's run of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Suite {
    /// The backend the controller config asks for (`defaultBackend`).
    pub backend: Backend,
}

/// One `#[test]` per scenario for a backend: `scenario_suite!(Backend::Nftables);` in a test crate that
/// declares `#[macro_use] mod scenarios;`.
macro_rules! scenario_suite {
    ($backend:expr) => {
        const SUITE: scenarios::Suite = scenarios::Suite { backend: $backend };

        #[test]
        fn example_cluster_forwards_like_kube_proxy() {
            scenarios::example_cluster_forwards_like_kube_proxy(SUITE);
        }
        #[test]
        fn node_ports_hairpin_and_snat() {
            scenarios::node_ports_hairpin_and_snat(SUITE);
        }
        #[test]
        fn source_ranges_filter_load_balancer_traffic_but_not_node_ports() {
            scenarios::source_ranges_filter_load_balancer_traffic_but_not_node_ports(SUITE);
        }
        #[test]
        fn an_endpoint_change_is_a_partial_sync() {
            scenarios::an_endpoint_change_is_a_partial_sync(SUITE);
        }
        #[test]
        fn stale_udp_conntrack_entries_are_removed_after_an_endpoint_change() {
            scenarios::stale_udp_conntrack_entries_are_removed_after_an_endpoint_change(SUITE);
        }
        #[test]
        fn a_held_udp_flow_reaches_its_endpoints_new_port_keeps_a_terminating_one_and_ends_when_all_are_unready() {
            scenarios::udp::a_held_udp_flow_reaches_its_endpoints_new_port_keeps_a_terminating_one_and_ends_when_all_are_unready(
                SUITE,
            );
        }
        #[test]
        fn a_connection_to_a_removed_endpoint_is_reset_and_one_to_a_terminating_endpoint_drains() {
            scenarios::a_connection_to_a_removed_endpoint_is_reset_and_one_to_a_terminating_endpoint_drains(
                SUITE,
            );
        }
        #[test]
        fn a_killed_agent_leaves_rules_working_and_a_restart_reuses_them() {
            scenarios::a_killed_agent_leaves_rules_working_and_a_restart_reuses_them(SUITE);
        }
        #[test]
        fn drift_is_repaired_within_a_resync_period() {
            scenarios::drift_is_repaired_within_a_resync_period(SUITE);
        }
        #[test]
        fn bad_plans_keep_the_last_good_rules() {
            scenarios::bad_plans_keep_the_last_good_rules(SUITE);
        }
        #[test]
        fn cleanup_removes_exactly_what_the_agent_made() {
            scenarios::cleanup_removes_exactly_what_the_agent_made(SUITE);
        }
        #[test]
        fn a_cluster_policy_udp_service_spreads_over_every_endpoint() {
            scenarios::a_cluster_policy_udp_service_spreads_over_every_endpoint(SUITE);
        }
        #[test]
        fn the_headless_label_takes_a_service_down_and_back() {
            scenarios::the_headless_label_takes_a_service_down_and_back(SUITE);
        }
        #[test]
        fn explain_kernel_follows_the_installed_rules_and_names_a_hand_edit() {
            scenarios::explain_kernel_follows_the_installed_rules_and_names_a_hand_edit(SUITE);
        }
        #[test]
        fn a_leaving_node_is_drained_by_a_load_balancer_with_no_failed_connection() {
            scenarios::leaving::a_leaving_node_is_drained_by_a_load_balancer_with_no_failed_connection(
                SUITE,
            );
        }
        #[test]
        fn pods_outside_the_cluster_cidr_are_told_apart_by_bridge_and_interface_prefix() {
            scenarios::exposure::pods_outside_the_cluster_cidr_are_told_apart_by_bridge_and_interface_prefix(
                SUITE,
            );
        }
        #[test]
        fn unallocated_service_addresses_are_dropped_on_the_node() {
            scenarios::exposure::unallocated_service_addresses_are_dropped_on_the_node(SUITE);
        }
        #[test]
        fn exposure_defaults_close_what_kube_proxy_closes() {
            scenarios::exposure::exposure_defaults_close_what_kube_proxy_closes(SUITE);
        }
        #[test]
        fn a_pod_reaches_an_etp_local_external_ip_without_a_local_endpoint() {
            scenarios::exposure::a_pod_reaches_an_etp_local_external_ip_without_a_local_endpoint(SUITE);
        }
        #[test]
        fn an_agent_started_over_an_older_layout_keeps_nothing_stale() {
            scenarios::exposure::an_agent_started_over_an_older_layout_keeps_nothing_stale(SUITE);
        }
        #[test]
        fn traffic_counters_count_every_connection_by_frontend_endpoint_and_refusal() {
            scenarios::traffic::traffic_counters_count_every_connection_by_frontend_endpoint_and_refusal(
                SUITE,
            );
        }
    };
}

impl Suite {
    fn config(&self) -> switchyard_controller::Config {
        let mut config =
            switchyard_controller::Config::load(&repo("examples/controller-config.yaml")).unwrap();
        config.default_backend = self.backend;
        config
    }

    /// Removes the service dispatch rules behind the agent's back, as an admin or a firewall reload would.
    fn tamper(&self, deployed: &Deployed, node: &str) {
        let argv: &[&str] = match self.backend {
            Backend::Nftables => &["nft", "flush", "chain", "ip", "switchyard", "services"],
            _ => &["iptables", "-t", "nat", "-F", "SWYD-SERVICES"],
        };
        let out = deployed.exec_in_node(node, argv).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Creates someone else's object next to ours, which cleanup must leave alone.
    fn add_foreign_object(&self, deployed: &Deployed, node: &str) {
        let argv: &[&str] = match self.backend {
            Backend::Nftables => &["nft", "add", "table", "ip", "other"],
            _ => &["iptables", "-t", "nat", "-N", "OTHER-CHAIN"],
        };
        let out = deployed.exec_in_node(node, argv).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// After cleanup: nothing of ours is left (in either backend), the foreign object is.
    fn assert_cleaned(&self, deployed: &Deployed, node: &str) {
        for table in ["nat", "filter"] {
            let save = deployed
                .exec_in_node(node, &["iptables-save", "-t", table])
                .unwrap();
            let text = String::from_utf8_lossy(&save.stdout);
            assert!(!text.contains("SWYD"), "{table} still has our rules:\n{text}");
            // No trace either: the lab never used iptables-legacy, so cleanup must not have created
            // its tables (iptables-save would then warn "iptables-legacy tables present").
            let warnings = String::from_utf8_lossy(&save.stderr);
            assert!(!warnings.contains("legacy"), "{table}: {warnings}");
        }
        for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
            let out = deployed.exec_in_node(node, &[save]).unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(!text.contains('*'), "cleanup left {save} tables behind:\n{text}");
        }
        let tables = deployed.exec_in_node(node, &["nft", "list", "tables"]).unwrap();
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert!(
            !tables.contains("switchyard"),
            "our nftables tables remain:\n{tables}"
        );
        match self.backend {
            Backend::Nftables => assert!(tables.contains("table ip other"), "{tables}"),
            _ => {
                let nat = deployed
                    .exec_in_node(node, &["iptables-save", "-t", "nat"])
                    .unwrap();
                assert!(String::from_utf8_lossy(&nat.stdout).contains(":OTHER-CHAIN"));
            }
        }
    }

    /// The node's rules are in this suite's backend, and only there.
    fn assert_programmed(&self, deployed: &Deployed, node: &str) {
        let save = deployed
            .exec_in_node(node, &["iptables-save", "-t", "nat"])
            .unwrap();
        let iptables = String::from_utf8_lossy(&save.stdout).contains(":SWYD-SERVICES");
        let table = deployed
            .exec_in_node(node, &["nft", "list", "table", "ip", "switchyard"])
            .unwrap();
        let nftables = table.status.success();
        let want_nftables = self.backend == Backend::Nftables;
        assert_eq!(
            (iptables, nftables),
            (!want_nftables, want_nftables),
            "{node}: SWYD chains {iptables}, nftables table {nftables}"
        );
    }

    /// The example cluster deployed, or `None` when lab tests are skipped.
    pub fn deployed(&self, test: &str) -> Option<Deployed> {
        self.deployed_with(test, example())
    }

    /// `description` (the example cluster with more objects) deployed, or `None` when lab tests are
    /// skipped.
    pub fn deployed_with(&self, test: &str, description: ClusterDescription) -> Option<Deployed> {
        if !crate::common::lab_allowed(test) {
            return None;
        }
        let deployed = Deployed::up(description, self.config(), crate::common::options()).unwrap();
        for cidr in ["203.0.113.0/24", "10.96.0.0/16"] {
            deployed
                .lab
                .client_route_via(cidr.parse().unwrap(), "node-a")
                .unwrap();
        }
        Some(deployed)
    }
}

fn must_pass(deployed: &Deployed, check: Check) {
    let outcome = checks::run(&deployed.lab, &check).unwrap();
    assert!(outcome.passed(), "{outcome}");
}

fn slice_mut<'a>(description: &'a mut ClusterDescription, name: &str) -> &'a mut EndpointSlice {
    description
        .endpoint_slices
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap()
}

pub fn example_cluster_forwards_like_kube_proxy(suite: Suite) {
    let Some(deployed) = suite.deployed("example_cluster_forwards_like_kube_proxy") else {
        return;
    };
    let mut failures = Vec::new();
    for check in example_checks() {
        let outcome = checks::run(&deployed.lab, &check).unwrap();
        if !outcome.passed() {
            failures.push(outcome.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for node in ["node-a", "node-b", "node-c"] {
        let status = deployed.status(node).unwrap().unwrap();
        assert_eq!(status.backend, Some(suite.backend), "{node}: {status:?}");
        assert_eq!(status.backend_reason, None, "{node}: {status:?}");
        suite.assert_programmed(&deployed, node);
        // Conntrack's timeouts in the node's namespace, as kube-proxy sets them: CLOSE_WAIT raised to
        // 1 h; ESTABLISHED keeps the kernel's 5 days (higher than 24 h: never lowered unless asked).
        let sysctl = |name: &str| {
            let file = format!("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_{name}");
            let out = deployed.exec_in_node(node, &["cat", &file]).unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(
            (sysctl("close_wait"), sysctl("established")),
            ("3600".to_string(), "432000".to_string()),
            "{node}"
        );
    }
}

pub fn node_ports_hairpin_and_snat(suite: Suite) {
    let Some(deployed) = suite.deployed("node_ports_hairpin_and_snat") else {
        return;
    };
    // eTP=Cluster NodePort: reachable through every node, SNATed to the node it entered.
    for (node, ip) in [
        ("node-a", "192.168.10.11"),
        ("node-b", "192.168.10.12"),
        ("node-c", "192.168.10.13"),
    ] {
        let to = format!("{ip}:32701");
        must_pass(
            &deployed,
            Check::tcp(
                &format!("NodePort via {node}"),
                Place::Client,
                &to,
                4,
                answered_from(&["nginx-gateway"], ip),
            ),
        );
        must_pass(
            &deployed,
            Check::tcp(
                &format!("heketi via {node}"),
                Place::Client,
                &format!("{ip}:31131"),
                2,
                answered(&["heketi"]),
            ),
        );
    }
    // nodePort 30080 → port 80 → named targetPort "http" = 8080 on the pod.
    must_pass(
        &deployed,
        Check::tcp(
            "named targetPort",
            Place::Client,
            "192.168.10.12:30080",
            3,
            answered_from(&["web-2"], "192.168.10.200"),
        ),
    );
    // Hairpin: the heketi pod reaching itself through its own Service is masqueraded to its node.
    must_pass(
        &deployed,
        Check::tcp(
            "hairpin",
            Place::pod("heketi-5f6b8c7d9-kx2lq"),
            "10.96.125.27:8080",
            3,
            answered_from(&["heketi"], "192.168.10.12"),
        ),
    );
    // ClusterIP from a pod on the same node as a backend and from another node: pod IPs kept.
    must_pass(
        &deployed,
        Check::tcp(
            "same node",
            Place::pod("web-1"),
            "10.96.0.80:80",
            20,
            spread(&["apache-6d4cf56db6-a1", "apache-6d4cf56db6-b2"]),
        ),
    );
    must_pass(
        &deployed,
        Check::tcp(
            "other node",
            Place::pod("legacy-api-0"),
            "10.96.0.80:80",
            5,
            answered_from(&["apache"], "10.244.3.80"),
        ),
    );
}

pub fn source_ranges_filter_load_balancer_traffic_but_not_node_ports(suite: Suite) {
    let Some(mut deployed) = suite.deployed("source_ranges_filter_load_balancer_traffic_but_not_node_ports")
    else {
        return;
    };
    must_pass(
        &deployed,
        Check::tcp(
            "allowed client",
            Place::Client,
            "203.0.113.10:80",
            3,
            answered(&["web-1"]),
        ),
    );
    let mut description = deployed.description().clone();
    let web = description
        .services
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("web-lb"))
        .unwrap();
    web.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    deployed.replan(description).unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "denied client",
            Place::Client,
            "203.0.113.10:80",
            2,
            Expect::Dropped,
        ),
    );
    must_pass(
        &deployed,
        Check::tcp(
            "NodePort is never filtered",
            Place::Client,
            "192.168.10.11:30080",
            3,
            answered(&["web-1"]),
        ),
    );
}

pub fn an_endpoint_change_is_a_partial_sync(suite: Suite) {
    let Some(mut deployed) = suite.deployed("an_endpoint_change_is_a_partial_sync") else {
        return;
    };
    let mut description = deployed.description().clone();
    let apache = slice_mut(&mut description, "apache-x7k2p");
    apache
        .endpoints
        .as_mut()
        .unwrap()
        .retain(|e| e.addresses[0] != "10.244.1.10");
    deployed.replan(description).unwrap();
    for node in ["node-a", "node-b", "node-c"] {
        let status = deployed.status(node).unwrap().unwrap();
        assert_eq!(
            status.last_sync_mode,
            Some(SyncMode::Partial),
            "{node}: {status:?}"
        );
    }
    must_pass(
        &deployed,
        Check::tcp(
            "only the remaining backend",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            10,
            answered(&["apache-6d4cf56db6-b2"]),
        ),
    );
    // Scaling to zero: REJECT (refused at once); scaling back: forwarding again.
    let mut description = deployed.description().clone();
    slice_mut(&mut description, "apache-x7k2p").endpoints = Some(vec![]);
    deployed.replan(description).unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "no endpoints",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            2,
            Expect::Refused,
        ),
    );
    deployed.replan(example()).unwrap();
    must_pass(
        &deployed,
        Check::tcp(
            "back",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            10,
            answered(&["apache"]),
        ),
    );
}

/// `service.kubernetes.io/headless` on a Service with a ClusterIP: kube-proxy stops forwarding it, and
/// so does Switchyard, in one partial sync; without the label it is back.
pub fn the_headless_label_takes_a_service_down_and_back(suite: Suite) {
    let Some(mut deployed) = suite.deployed("the_headless_label_takes_a_service_down_and_back") else {
        return;
    };
    let up = || {
        Check::tcp(
            "apache forwarded",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            6,
            answered(&["apache"]),
        )
    };
    must_pass(&deployed, up());
    let mut description = deployed.description().clone();
    let apache = description
        .services
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("apache"))
        .unwrap();
    apache
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("service.kubernetes.io/headless".into(), String::new());
    deployed.replan(description).unwrap();
    for node in ["node-a", "node-b", "node-c"] {
        let status = deployed.status(node).unwrap().unwrap();
        assert_eq!(
            status.last_sync_mode,
            Some(SyncMode::Partial),
            "{node}: {status:?}"
        );
    }
    let down = checks::run(
        &deployed.lab,
        &Check::tcp(
            "apache not forwarded",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            3,
            answered(&["apache"]),
        ),
    )
    .unwrap();
    // Not DNATed: the ClusterIP is routed like any address the pod's node has no route for.
    assert!(
        down.tally.answered.is_empty(),
        "still forwarded with the label: {down}"
    );
    deployed.replan(example()).unwrap();
    must_pass(&deployed, up());
}

/// What `probe` returns once `done` holds, or its last value after 10 s (the caller asserts on it): for
/// what the agent's conntrack worker does right after an apply, off the sync loop.
fn settled<T>(mut probe: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let value = probe();
        if done(&value) || std::time::Instant::now() >= deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn stale_udp_conntrack_entries_are_removed_after_an_endpoint_change(suite: Suite) {
    let Some(mut deployed) =
        suite.deployed("stale_udp_conntrack_entries_are_removed_after_an_endpoint_change")
    else {
        return;
    };
    // DNS from a pod on node-a goes to node-local-dns-a (iTP=Local); the flow is tracked on node-a.
    must_pass(
        &deployed,
        Check::udp(
            "dns",
            Place::pod("apache-6d4cf56db6-a1"),
            "10.96.0.53:53",
            3,
            answered(&["node-local-dns-a"]),
        ),
    );
    let flows = |d: &Deployed| -> String {
        let out = d
            .exec_in_node(
                "node-a",
                &["conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.0.53"],
            )
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        flows(&deployed).contains("src=10.244.1.53"),
        "{}",
        flows(&deployed)
    );
    // node-local-dns-a moves to a new address: flows to the old one must go.
    let mut description = deployed.description().clone();
    let dns = slice_mut(&mut description, "node-local-dns-z8r2c");
    for endpoint in dns.endpoints.as_mut().unwrap() {
        if endpoint.addresses[0] == "10.244.1.53" {
            endpoint.addresses[0] = "10.244.1.54".into();
        }
    }
    deployed.replan(description).unwrap();
    // The agent's conntrack worker deletes them right after the apply, off the sync loop: the status
    // can say "applied" a moment before (seconds under the load of the whole suite).
    let after = settled(|| flows(&deployed), |after| !after.contains("src=10.244.1.53"));
    assert!(
        !after.contains("src=10.244.1.53"),
        "stale UDP flows remain:\n{after}"
    );
}

/// A TCP client that holds one connection open and sends a byte every 50 ms: prints `connected <pod>`
/// (the endpoint that answered), then `reset <unix time>` once a send fails, and exits.
const HOLDING_CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
line = b""
while not line.endswith(b"\n"):
    chunk = s.recv(256)
    if not chunk:
        break
    line += chunk
print("connected", line.split()[0].decode(), flush=True)
while True:
    try:
        s.send(b"x")
    except OSError as e:
        print("reset", time.time(), e.errno, flush=True)
        sys.exit(0)
    time.sleep(0.05)
"#;

pub fn a_connection_to_a_removed_endpoint_is_reset_and_one_to_a_terminating_endpoint_drains(suite: Suite) {
    let Some(mut deployed) = suite
        .deployed("a_connection_to_a_removed_endpoint_is_reset_and_one_to_a_terminating_endpoint_drains")
    else {
        return;
    };
    // nginx-pod-3 (node-c) holds a connection to apache (10.96.0.80: a1 on node-a, b2 on node-b); the
    // DNAT and its conntrack entry are on node-c.
    let argv: Vec<String> = ["python3", "-c", HOLDING_CLIENT, "10.96.0.80", "80"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let client = deployed.lab.spawn_in(&Place::pod("nginx-pod-3"), &argv).unwrap();
    client
        .wait_for_output("connected", Duration::from_secs(10))
        .unwrap();
    let pod = client
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("connected ").map(str::to_string))
        .unwrap();
    let ip = if pod.ends_with("-a1") {
        "10.244.1.10"
    } else {
        "10.244.2.10"
    };
    let mut description = deployed.description().clone();
    let set_conditions = |description: &mut ClusterDescription, serving: bool| {
        let apache = slice_mut(description, "apache-x7k2p");
        for endpoint in apache.endpoints.as_mut().unwrap() {
            if endpoint.addresses[0] == ip {
                let conditions = endpoint.conditions.get_or_insert_with(Default::default);
                conditions.ready = Some(false);
                conditions.serving = Some(serving);
                conditions.terminating = Some(true);
            }
        }
    };
    // Terminating while serving, then past serving: the connection drains, untouched.
    for serving in [true, false] {
        set_conditions(&mut description, serving);
        deployed.replan(description.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !client.stdout().contains("reset"),
            "a connection to {pod}, terminating (serving: {serving}), was cut:\n{}",
            client.stdout()
        );
    }
    // Gone from the slice: the next packet meets the rules again (the other endpoint answers RST).
    let apache = slice_mut(&mut description, "apache-x7k2p");
    apache
        .endpoints
        .as_mut()
        .unwrap()
        .retain(|e| e.addresses[0] != ip);
    deployed.replan(description).unwrap();
    let applied = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    client
        .wait_for_output("reset", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the connection to removed {pod} still stands: {e}"));
    let reset_at: f64 = client
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("reset ")?.split(' ').next()?.parse().ok())
        .unwrap();
    assert!(
        reset_at - applied <= 1.0,
        "reset {:.2} s after every agent applied the removal",
        reset_at - applied
    );
    // The clearing runs on the agent's conntrack worker; its count reaches the status on the next tick
    // (seconds under the load of the whole suite: 2 s was once too short).
    let status = settled(
        || deployed.status("node-c").unwrap().unwrap(),
        |status| status.conntrack_flows_cleared >= 1,
    );
    assert!(status.conntrack_flows_cleared >= 1, "node-c's status: {status:?}");
    let flows = deployed
        .exec_in_node(
            "node-c",
            &[
                "conntrack",
                "-L",
                "-p",
                "tcp",
                "--orig-dst",
                "10.96.0.80",
                "--reply-src",
                ip,
            ],
        )
        .unwrap();
    let left = String::from_utf8_lossy(&flows.stdout);
    assert!(
        !left.contains("dport=80"),
        "flows to the removed endpoint remain:\n{left}"
    );
}

pub fn a_killed_agent_leaves_rules_working_and_a_restart_reuses_them(suite: Suite) {
    let Some(mut deployed) = suite.deployed("a_killed_agent_leaves_rules_working_and_a_restart_reuses_them")
    else {
        return;
    };
    deployed.stop_agent("node-c");
    must_pass(
        &deployed,
        Check::tcp(
            "still forwarding",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            5,
            answered(&["apache"]),
        ),
    );
    // The restarted agent syncs (full, reusing the kernel's rules) and reports afresh.
    std::fs::remove_file(deployed.status_path("node-c")).unwrap();
    deployed.start_agent("node-c").unwrap();
    deployed.wait_applied(Duration::from_secs(20)).unwrap();
    let status = deployed.status("node-c").unwrap().unwrap();
    assert_eq!(status.last_sync_mode, Some(SyncMode::Full));
    must_pass(
        &deployed,
        Check::tcp(
            "after restart",
            Place::pod("nginx-pod-3"),
            "10.96.0.80:80",
            5,
            answered(&["apache"]),
        ),
    );
}

pub fn drift_is_repaired_within_a_resync_period(suite: Suite) {
    let Some(deployed) = suite.deployed("drift_is_repaired_within_a_resync_period") else {
        return;
    };
    suite.tamper(&deployed, "node-b");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status = deployed.status("node-b").unwrap().unwrap();
        if status.drift_repairs >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "drift not repaired: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    must_pass(
        &deployed,
        Check::tcp(
            "repaired",
            Place::pod("web-2"),
            "10.96.0.80:80",
            5,
            answered(&["apache"]),
        ),
    );
}

pub fn bad_plans_keep_the_last_good_rules(suite: Suite) {
    let Some(deployed) = suite.deployed("bad_plans_keep_the_last_good_rules") else {
        return;
    };
    // A plan entry the agent cannot use: reported, the rest applied.
    let mut plan = deployed.plan("node-a").unwrap().remove(0);
    let bad = plan
        .spec
        .services
        .iter_mut()
        .find(|s| s.name == "default/apache")
        .unwrap();
    std::sync::Arc::make_mut(bad).cluster_ip = "10.96.0.999".into();
    // Edited on purpose: with the revision its content hashes to (else the file is refused whole as
    // cut or edited, before its entries are looked at).
    plan.spec.revision = switchyard_api::revision::compute(&plan.spec).unwrap();
    deployed
        .write_raw_plan("node-a", &serde_saphyr::to_string(&plan).unwrap())
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        let status = deployed.status("node-a").unwrap().unwrap();
        if !status.failures.is_empty() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "bad entry not reported");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.failures[0].service.contains("default/apache"),
        "{status:?}"
    );
    must_pass(
        &deployed,
        Check::tcp(
            "other services",
            Place::pod("web-1"),
            "10.96.97.97:80",
            3,
            answered(&["nginx-pod"]),
        ),
    );

    // A malformed plan is rejected whole: InvalidPlan, and the last good rules keep forwarding.
    deployed
        .write_raw_plan(
            "node-a",
            "apiVersion: switchyard.io/v1alpha2\nkind: NodeForwardingPlan\nspec: {nodeName: \"\"}\n",
        )
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status = deployed.status("node-a").unwrap().unwrap();
        let applied = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::APPLIED)
            .cloned();
        if applied
            .as_ref()
            .is_some_and(|c| c.status == conditions::status::FALSE)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "malformed plan not reported: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    must_pass(
        &deployed,
        Check::tcp(
            "last good rules",
            Place::pod("web-1"),
            "10.96.97.97:80",
            3,
            answered(&["nginx-pod"]),
        ),
    );
}

pub fn cleanup_removes_exactly_what_the_agent_made(suite: Suite) {
    let Some(mut deployed) = suite.deployed("cleanup_removes_exactly_what_the_agent_made") else {
        return;
    };
    // Someone else's object in the same namespace must survive.
    suite.add_foreign_object(&deployed, "node-a");
    deployed.stop_agent("node-a");
    let lab_binary = deployed.lab.options().lab_binary.display().to_string();
    let out = deployed
        .exec_in_node("node-a", &[&lab_binary, "agent", "cleanup"])
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    suite.assert_cleaned(&deployed, "node-a");
    let probe = deployed
        .lab
        .probe(
            &Place::pod("web-1"),
            Proto::Tcp,
            "10.96.0.80:80".parse().unwrap(),
            Duration::from_millis(700),
        )
        .unwrap();
    assert!(
        !probe.is_answered(),
        "service traffic still forwarded after cleanup"
    );
}

pub fn a_cluster_policy_udp_service_spreads_over_every_endpoint(suite: Suite) {
    let Some(mut deployed) = suite.deployed("a_cluster_policy_udp_service_spreads_over_every_endpoint")
    else {
        return;
    };
    // node-local-dns with internalTrafficPolicy Cluster: a plain UDP service (nftables: class maps).
    let mut description = deployed.description().clone();
    let dns = description
        .services
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("node-local-dns"))
        .unwrap();
    dns.spec.as_mut().unwrap().internal_traffic_policy = Some("Cluster".into());
    deployed.replan(description).unwrap();
    must_pass(
        &deployed,
        Check::udp(
            "UDP over the Cluster policy",
            Place::pod("nginx-pod-3"),
            "10.96.0.53:53",
            30,
            spread(&["node-local-dns-a", "node-local-dns-b"]),
        ),
    );
}

/// `explain --kernel` on a node whose agent really programmed its rules: it agrees with the plan, and
/// after one rule (iptables) or map element (nftables) is edited by hand it names it as drift.
pub fn explain_kernel_follows_the_installed_rules_and_names_a_hand_edit(suite: Suite) {
    let Some(mut deployed) =
        suite.deployed("explain_kernel_follows_the_installed_rules_and_names_a_hand_edit")
    else {
        return;
    };
    // Stopped, so nothing repairs the hand edit below; its rules stay.
    deployed.stop_agent("node-a");
    let lab_binary = deployed.lab.options().lab_binary.display().to_string();
    let plan = deployed.plan_path("node-a").display().to_string();
    let explain = |deployed: &Deployed| {
        let argv = [
            lab_binary.as_str(),
            "agent",
            "explain",
            "--plan",
            plan.as_str(),
            "--to",
            "10.96.0.80:80",
            "--from",
            "10.244.1.10",
            "--kernel",
        ];
        let out = deployed.exec_in_node("node-a", &argv).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = explain(&deployed);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("kernel: the installed rules take the same path as the plan"),
        "{stdout}"
    );
    // Both backends count each endpoint's new connections (none yet in this lab).
    let forwarded = "=> FORWARDED to 10.244.1.10:80 (50%, masqueraded, 0 connections counted), 10.244.2.10:80 (50%, 0 connections counted)";
    assert!(stdout.contains(forwarded), "{stdout}");

    // Every demo flow, on the node where it meets Switchyard, against the rules the agents installed:
    // the kernel agrees with the plan, and the exit status is what the real packets of that check show.
    for check in example_checks() {
        let (node, from) = match &check.from {
            Place::Pod(name) => {
                let pod = deployed.lab.pod(name).unwrap();
                (pod.node.clone(), pod.ip.to_string())
            }
            Place::Node(name) => (name.clone(), "node".to_string()),
            Place::Client => {
                let owner = deployed
                    .lab
                    .nodes()
                    .iter()
                    .find(|n| std::net::IpAddr::V4(n.ip) == check.to.ip());
                (
                    owner.map_or("node-a".to_string(), |n| n.name.clone()),
                    "192.168.10.200".to_string(),
                )
            }
            Place::Fabric | Place::Balancer => continue,
        };
        let to = match check.proto {
            Proto::Tcp => format!("{}/tcp", check.to),
            Proto::Udp => format!("{}/udp", check.to),
        };
        let node_plan = deployed.plan_path(&node).display().to_string();
        let argv = [
            lab_binary.as_str(),
            "agent",
            "explain",
            "--plan",
            &node_plan,
            "--to",
            &to,
            "--from",
            &from,
            "--kernel",
        ];
        let out = deployed.exec_in_node(&node, &argv).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let forwarded = !matches!(check.expect, Expect::Refused | Expect::Dropped);
        assert_eq!(
            out.status.code(),
            Some(if forwarded { 0 } else { 3 }),
            "{}: {stdout}{}",
            check.name,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("kernel: the installed rules take the same path as the plan"),
            "{} on {node}: {stdout}",
            check.name
        );
    }

    // Someone points default/apache's second pick somewhere else.
    let run = |argv: &[&str]| {
        let out = deployed.exec_in_node("node-a", argv).unwrap();
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let want = match suite.backend {
        Backend::Nftables => {
            let table = run(&["nft", "list", "table", "ip", "switchyard"]);
            // The map holding 10.96.0.80's picks: the `map … {` line before its element.
            let map = table
                .lines()
                .scan(String::new(), |current, line| {
                    if let Some(name) = line.trim().strip_prefix("map ") {
                        *current = name.trim_end_matches(" {").to_string();
                    }
                    Some((current.clone(), line.to_string()))
                })
                // Counted maps list each element's counter between its key and its value.
                .find(|(_, line)| {
                    line.contains("10.96.0.80 . tcp . 80 . 1 :")
                        || line.contains("10.96.0.80 . tcp . 80 . 1 counter ")
                })
                .map(|(map, _)| map)
                .unwrap();
            run(&[
                "nft",
                "delete",
                "element",
                "ip",
                "switchyard",
                &map,
                "{ 10.96.0.80 . tcp . 80 . 1 }",
            ]);
            run(&[
                "nft",
                "add",
                "element",
                "ip",
                "switchyard",
                &map,
                "{ 10.96.0.80 . tcp . 80 . 1 : 10.244.9.9 . 80 }",
            ]);
            format!(
                "{map} element 10.96.0.80 . tcp . 80 . 1: kernel `10.244.9.9 . 80`, plan `10.244.2.10 . 80`"
            )
        }
        _ => {
            let chain = switchyard_agent::iptables::names::cluster_policy_chain("default/apache", "tcp");
            let rules = run(&["iptables", "-t", "nat", "-S", &chain]);
            let position = rules.lines().filter(|l| l.starts_with("-A ")).count().to_string();
            run(&[
                "iptables",
                "-t",
                "nat",
                "-R",
                &chain,
                &position,
                "-p",
                "tcp",
                "-m",
                "tcp",
                "-j",
                "DNAT",
                "--to-destination",
                "10.244.9.9:80",
            ]);
            format!(
                "nat {chain} rule {position}: kernel `-A {chain} -p tcp -m tcp -j DNAT --to-destination 10.244.9.9:80`"
            )
        }
    };
    let (code, stdout, stderr) = explain(&deployed);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("kernel: DRIFT"), "{stdout}");
    assert!(stdout.contains(&want), "want {want:?} in:\n{stdout}");
}
