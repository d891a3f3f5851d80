//! The agent binary against the real kernel, each test in its own network namespace: apply, partial
//! syncs and drift repairs of `run`, a payload the kernel rejects, stale UDP conntrack entries, cleanup.
//! Root only (see `lab`); never touches the host's own namespace.

use std::time::Duration;

use switchyard_agent::iptables::names;
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, finish, plan};
use switchyard_api::{
    Backend, NodeForwardingPlan, NodeForwardingPlanSpec, NodeForwardingPlanStatus, Protocol,
};

use crate::lab::{AGENT, Netns, lab_allowed, rules_in, wait_for, write_atomic};

const WAIT: Duration = Duration::from_secs(20);

fn spec() -> NodeForwardingPlanSpec {
    plan(
        "node-a",
        vec![
            entry("ns1/web:http", "10.96.0.1", 80)
                .node_port(30080)
                .with(ep("10.244.2.5", 8080))
                .with(ep("10.244.3.5", 8080)),
            entry("ns1/api:https", "10.96.0.2", 443).with(ep("10.244.2.6", 8443)),
            entry("kube-system/dns:dns", "10.96.0.10", 53)
                .protocol(Protocol::UDP)
                .with(ep("10.244.2.53", 53)),
        ],
    )
}

fn write_plan(netns: &Netns, spec: &NodeForwardingPlanSpec) -> String {
    let path = netns.path("plan.yaml");
    let object = NodeForwardingPlan::new(&spec.node_name, spec.clone());
    write_atomic(&path, &serde_saphyr::to_string(&object).unwrap());
    path.display().to_string()
}

fn read_status(path: &std::path::Path) -> Option<NodeForwardingPlanStatus> {
    serde_saphyr::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn apply_programs_our_chains_and_cleanup_removes_exactly_them() {
    if !lab_allowed("apply_programs_our_chains_and_cleanup_removes_exactly_them") {
        return;
    }
    let netns = Netns::new("apply");
    // Someone else's rules in the same tables.
    netns.sh("iptables -t nat -N FOREIGN && iptables -t nat -A FOREIGN -j RETURN && iptables -t nat -A PREROUTING -j FOREIGN");
    let spec = spec();
    let plan = write_plan(&netns, &spec);

    // Before apply the namespace holds none of the plan's rules: top says so (issue 45), rather than
    // print an empty table as if nothing had been counted.
    let out = netns.agent(&["top", "--plan", &plan]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the rules of node node-a's plan are not on this host"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());

    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "apply failed: {}", stderr(&out));
    // A one-shot command logs at warn: no word of jump rules or which iptables it found.
    assert!(!stderr(&out).contains("INFO"), "{}", stderr(&out));
    let out = netns.agent(&["top", "--plan", &plan]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "apply failed: {}", stderr(&out));
    let status: NodeForwardingPlanStatus =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(status.observed_revision.as_deref(), Some(spec.revision.as_str()));
    assert_eq!(status.services, Some(3));

    let save = netns.save();
    assert!(save.contains(":SWYD-CANARY"), "{save}");
    assert_eq!(
        rules_in(&save, names::SERVICES),
        3 + 1,
        "3 frontends and the NodePort jump:\n{save}"
    );
    assert!(save.contains(&format!(
        ":{}",
        names::cluster_policy_chain("ns1/web:http", "tcp")
    )));
    assert!(
        save.contains("-A PREROUTING -m comment --comment \"switchyard service portals\" -j SWYD-SERVICES"),
        "{save}"
    );
    assert!(save.contains(
        "-A POSTROUTING -m comment --comment \"switchyard postrouting rules\" -j SWYD-POSTROUTING"
    ));
    assert!(save.contains("-A FORWARD -m comment --comment \"switchyard forwarding rules\" -j SWYD-FORWARD"));
    assert!(save.contains("--to-destination 10.244.3.5:8080"));
    assert!(save.contains("-A PREROUTING -j FOREIGN"));

    // Applying again (a restart) changes nothing and duplicates nothing.
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        netns
            .save()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        save.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>()
    );

    let out = netns.agent(&["cleanup"]);
    assert!(out.status.success(), "cleanup failed: {}", stderr(&out));
    let after = netns.save();
    assert!(
        !after.contains("SWYD-"),
        "something of ours survived cleanup:\n{after}"
    );
    assert!(
        after.contains("-A FOREIGN -j RETURN") && after.contains("-A PREROUTING -j FOREIGN"),
        "{after}"
    );
    let out = netns.agent(&["cleanup"]);
    assert!(
        out.status.success(),
        "a second cleanup must succeed: {}",
        stderr(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 0 jump rules and 0 chains"));
}

#[test]
fn run_syncs_partially_repairs_drift_and_leaves_rules_on_sigterm() {
    if !lab_allowed("run_syncs_partially_repairs_drift_and_leaves_rules_on_sigterm") {
        return;
    }
    let netns = Netns::new("run");
    let mut a = spec();
    // An eTP=Local LoadBalancer with a local endpoint: its health-check port must answer 200.
    a.services.push(
        entry("ns2/lb:http", "10.96.0.20", 80)
            .lb_ip("203.0.113.20")
            .node_port(30020)
            .etp_local()
            .hc_node_port(32000)
            .with(ep("10.244.1.20", 8080).local())
            .into(),
    );
    finish(&mut a);
    let plan = write_plan(&netns, &a);
    let status_file = netns.path("status.yaml");
    let mut agent = netns.spawn_agent(&[
        "run",
        "--plan-file",
        &plan,
        "--status-file",
        &status_file.display().to_string(),
        "--resync-period",
        "500ms",
        "--poll-interval",
        "50ms",
        "--min-sync-interval",
        "0s",
    ]);
    let status = wait_for("the first sync", WAIT, || {
        read_status(&status_file).filter(|s| s.observed_revision.as_deref() == Some(a.revision.as_str()))
    });
    assert_eq!(status.last_sync_mode, Some(switchyard_api::SyncMode::Full));
    let first_save = netns.save();
    let services_rules = rules_in(&first_save, names::SERVICES);
    assert_eq!(
        services_rules, 6,
        "4 cluster IPs, 1 LB IP, the NodePort jump:\n{first_save}"
    );
    let health = wait_for("the health check server", WAIT, || {
        let answer = netns.sh(
            "bash -c 'exec 3<>/dev/tcp/127.0.0.1/32000 && printf \"GET /healthz HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3' 2>/dev/null || true",
        );
        (!answer.is_empty()).then_some(answer)
    });
    assert!(health.starts_with("HTTP/1.0 200 OK"), "{health}");
    assert!(
        health.ends_with(
            r#"{"service":{"namespace":"ns2","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}"#
        ),
        "{health}"
    );

    // An endpoint change: a partial sync.
    let mut b = a.clone();
    std::sync::Arc::make_mut(b.services.iter_mut().find(|e| e.name == "ns1/api:https").unwrap()).endpoints
        [0]
    .ip = "10.244.2.7".into();
    finish(&mut b);
    write_plan(&netns, &b);
    let status = wait_for("the partial sync", WAIT, || {
        read_status(&status_file).filter(|s| s.observed_revision.as_deref() == Some(b.revision.as_str()))
    });
    assert_eq!(status.last_sync_mode, Some(switchyard_api::SyncMode::Partial));
    let save = netns.save();
    assert!(
        save.contains("--to-destination 10.244.2.7:8443") && !save.contains("10.244.2.6"),
        "{save}"
    );

    assert_eq!(
        read_status(&status_file).unwrap().drift_repairs,
        0,
        "no drift yet"
    );
    // Someone flushes our dispatch chain: repaired, counted.
    netns.sh(&format!("iptables -t nat -F {}", names::SERVICES));
    wait_for("the flushed chain's repair", WAIT, || {
        read_status(&status_file).filter(|s| s.drift_repairs >= 1)
    });
    assert_eq!(rules_in(&netns.save(), names::SERVICES), services_rules);

    // Someone deletes a jump rule: repaired, counted.
    netns.sh(
        "iptables -t nat -D PREROUTING -m comment --comment 'switchyard service portals' -j SWYD-SERVICES",
    );
    wait_for("the jump rule's repair", WAIT, || {
        read_status(&status_file).filter(|s| s.drift_repairs >= 2)
    });
    assert!(
        netns
            .save()
            .contains("-A PREROUTING -m comment --comment \"switchyard service portals\" -j SWYD-SERVICES")
    );

    // SIGTERM: a clean exit, rules left in place.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = wait_for("the agent to exit", WAIT, || agent.try_wait().unwrap());
    let log = netns.agent_log();
    assert!(exit.success(), "{exit}\n{log}");
    assert!(log.contains("rules stay in place"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file:\n{log:?}");
    assert_eq!(
        rules_in(&netns.save(), names::SERVICES),
        services_rules,
        "rules survive the agent"
    );
}

#[test]
fn a_payload_the_kernel_rejects_leaves_the_old_rules() {
    if !lab_allowed("a_payload_the_kernel_rejects_leaves_the_old_rules") {
        return;
    }
    let netns = Netns::new("reject");
    let a = spec();
    let plan = write_plan(&netns, &a);
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Another component's chain jumps into api's chain, so the kernel refuses to delete it.
    let api = names::cluster_policy_chain("ns1/api:https", "tcp");
    netns.sh(&format!(
        "iptables -t nat -N HOLD && iptables -t nat -A HOLD -j {api}"
    ));
    let before = netns.save();

    let mut b = a.clone();
    b.services.retain(|e| e.name != "ns1/api:https");
    std::sync::Arc::make_mut(b.services.iter_mut().find(|e| e.name == "ns1/web:http").unwrap())
        .endpoints
        .pop();
    finish(&mut b);
    write_plan(&netns, &b);
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(
        log.contains("-restore failed at line") && log.contains("CHAIN_DEL"),
        "{log}"
    );
    let status: NodeForwardingPlanStatus =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(
        status.conditions.iter().any(|c| c.reason == "ApplyFailed"),
        "{status:?}"
    );
    // One try: neither the log nor the status promises a retry that a one-shot apply never makes.
    assert!(!log.to_lowercase().contains("retry"), "{log}");
    assert!(
        status.conditions.iter().all(|c| !c.message.contains("retrying")),
        "{status:?}"
    );

    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(&netns.save()),
        strip(&before),
        "the kernel must keep the old rules"
    );
}

#[test]
fn stale_udp_conntrack_entries_are_deleted_after_an_endpoint_change() {
    if !lab_allowed("stale_udp_conntrack_entries_are_deleted_after_an_endpoint_change") {
        return;
    }
    let netns = Netns::new("conntrack");
    let plan = write_plan(&netns, &spec());
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    let insert = |reply: &str, reply_port: u16, sport: u16| {
        netns.sh(&format!(
            "conntrack -I -p udp -s 10.244.1.9 -d 10.96.0.10 --sport {sport} --dport 53 -r {reply} -q 10.244.1.9 \
             --reply-port-src {reply_port} --reply-port-dst {sport} -t 120 2>/dev/null"
        ));
    };
    insert("10.244.3.53", 53, 41000); // answered by an endpoint that is about to go
    insert("10.244.2.53", 53, 41001); // answered by the endpoint that stays

    let mut b = spec();
    std::sync::Arc::make_mut(
        b.services
            .iter_mut()
            .find(|e| e.name == "kube-system/dns:dns")
            .unwrap(),
    )
    .endpoints
    .push(ep("10.244.2.54", 53));
    finish(&mut b);
    write_plan(&netns, &b);
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    let left = netns.sh("conntrack -L -p udp 2>/dev/null");
    assert!(!left.contains("sport=41000"), "the stale flow survived:\n{left}");
    assert!(left.contains("sport=41001"), "the good flow was deleted:\n{left}");

    // 10.244.2.53 now serves on 5353 (same address, new port): its flows on 53 go, one on 5353 stays.
    insert("10.244.2.53", 5353, 41002);
    let dns = b
        .services
        .iter_mut()
        .find(|e| e.name == "kube-system/dns:dns")
        .unwrap();
    std::sync::Arc::make_mut(dns).endpoints[0].port = 5353;
    finish(&mut b);
    write_plan(&netns, &b);
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    let left = netns.sh("conntrack -L -p udp 2>/dev/null");
    assert!(
        !left.contains("sport=41001"),
        "the flow to the old port survived:\n{left}"
    );
    assert!(
        left.contains("sport=41002"),
        "the flow to the new port was deleted:\n{left}"
    );
}

#[test]
fn apply_and_set_sysctls_raise_conntracks_timeouts_in_the_nodes_namespace_only() {
    if !lab_allowed("apply_and_set_sysctls_raise_conntracks_timeouts_in_the_nodes_namespace_only") {
        return;
    }
    const CLOSE_WAIT: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";
    const ESTABLISHED: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established";
    let host = |file: &str| std::fs::read_to_string(file).unwrap().trim().to_string();
    let host_before = (host(CLOSE_WAIT), host(ESTABLISHED));
    let netns = Netns::new("sysctls");
    let read = |file: &str| netns.sh(&format!("cat {file}")).trim().to_string();
    // A new namespace starts from the kernel's defaults, whatever the host set.
    assert_eq!(
        (read(CLOSE_WAIT), read(ESTABLISHED)),
        ("60".into(), "432000".into())
    );

    let plan = write_plan(&netns, &spec());
    // A one-shot apply logs at warn; asked for info, it says what it did with each value.
    let out = netns
        .command(AGENT)
        .args(["apply", "--plan", &plan])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(
        log.contains("nf_conntrack_tcp_timeout_close_wait: raised from 60 to 3600"),
        "{log}"
    );
    assert!(log.contains("432000 kept (higher than 86400"), "{log}");
    assert_eq!(read(CLOSE_WAIT), "3600");
    assert_eq!(read(ESTABLISHED), "432000", "never lowered unless asked");
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(!status.contains("ConntrackSysctlFailed"), "{status}");

    // The init container's command: lowering asked for, the close-wait timeout left alone.
    let out = netns.agent(&[
        "set-sysctls",
        "--conntrack-lower-host-values",
        "--conntrack-tcp-timeout-close-wait=0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "net.netfilter.nf_conntrack_tcp_timeout_established: lowered from 432000 to 86400\n"
    );
    assert_eq!(
        (read(CLOSE_WAIT), read(ESTABLISHED)),
        ("3600".into(), "86400".into())
    );
    assert_eq!(
        (host(CLOSE_WAIT), host(ESTABLISHED)),
        host_before,
        "the host's own namespace is untouched"
    );
}

#[test]
fn render_prints_what_apply_programs() {
    if !lab_allowed("render_prints_what_apply_programs") {
        return;
    }
    let netns = Netns::new("render");
    let plan = write_plan(&netns, &spec());
    let out = netns.agent(&["render", "--plan", &plan]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("# === IPv4: iptables-restore --noflush"), "{text}");
    assert!(
        !text.contains("IPv6"),
        "an IPv4-only plan renders no IPv6:\n{text}"
    );
    assert!(!netns.save().contains("SWYD-"), "render touches nothing");
    let out = netns.agent(&["render", "--plan", &plan, "--backend", "ipvs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("# === IPVS (ipvsadm-restore)"), "{text}");
    assert!(text.contains("-m set --match-set SWYD-CLUSTER-IP"), "{text}");
    assert!(!netns.save().contains("SWYD-"), "render touches nothing");
    let out = netns.agent(&["render", "--plan", &plan, "--backend", "bpf"]);
    assert_eq!(out.status.code(), Some(2));

    // Without --backend, the plan's own backend: what `apply` would program.
    for (backend, header) in [
        (Backend::Nftables, "# === IPv4: nft -f -"),
        (Backend::Ipvs, "# === IPVS (ipvsadm-restore)"),
        (Backend::Iptables, "# === IPv4: iptables-restore --noflush"),
    ] {
        let mut own = spec();
        own.backend = backend;
        finish(&mut own);
        let plan = write_plan(&netns, &own);
        let out = netns.agent(&["render", "--plan", &plan]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(header), "{backend:?}: {text}");
    }
}

/// `GET path` on the agent's HTTP port inside `netns` (bash's /dev/tcp): the whole answer.
fn http_in(netns: &Netns, path: &str) -> String {
    netns.sh(&format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/10263 && printf \"GET {path} HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3' 2>/dev/null || true"
    ))
}

#[test]
fn a_restart_without_the_api_server_reapplies_the_cached_plan_without_flushing() {
    if !lab_allowed("a_restart_without_the_api_server_reapplies_the_cached_plan_without_flushing") {
        return;
    }
    let netns = Netns::new("cache");
    let spec = spec();
    // What a previous agent left: the rules in the kernel, the plan in its cache.
    let plan = write_plan(&netns, &spec);
    let out = netns.agent(&["apply", "--plan", &plan]);
    assert!(out.status.success(), "apply failed: {}", stderr(&out));
    let before = netns.save();
    let state = netns.path("state");
    let mut object = NodeForwardingPlan::new("node-a", spec.clone());
    object.metadata.uid = Some("uid-1".into());
    let set = switchyard_agent::source::PlanSet {
        plan_meta: object.metadata.clone(),
        origin: switchyard_agent::source::Origin::Api,
        uid: object.metadata.uid.clone(),
        ..switchyard_agent::source::PlanSet::from_file(std::sync::Arc::new(spec.clone()), vec![])
    };
    switchyard_agent::source::cache::write(
        &switchyard_agent::source::cache::cache_path(&state),
        &set,
        switchyard_api::Backend::Iptables,
    )
    .unwrap();
    // An API server nobody answers for.
    let kubeconfig = netns.path("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n\
         clusters:\n- name: k\n  cluster: {server: 'http://127.0.0.1:1'}\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();

    let mut agent = netns.spawn_agent(&[
        "run",
        "--node-name",
        "node-a",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--state-dir",
        &state.display().to_string(),
        "--plan-deletion-grace",
        "1s",
    ]);
    let ready = wait_for("readiness from the cached plan", WAIT, || {
        let answer = http_in(&netns, "/readyz");
        answer.starts_with("HTTP/1.0 200").then_some(answer)
    });
    assert!(ready.ends_with("ready\n"), "{ready}");
    let health = http_in(&netns, "/healthz");
    assert!(health.starts_with("HTTP/1.0 200"), "{health}");
    assert!(
        health.contains(&format!("\"observedRevision\":\"{}\"", spec.revision)),
        "{health}"
    );
    let metrics = http_in(&netns, "/metrics");
    assert!(
        metrics.contains("switchyard_agent_syncs_total{mode=\"full\"} 1"),
        "{metrics}"
    );
    // The API server stays away: nothing is removed, whatever the grace period.
    std::thread::sleep(Duration::from_secs(2));
    let strip = |save: &str| -> Vec<String> {
        save.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l).to_string())
            .collect()
    };
    assert_eq!(
        strip(&netns.save()),
        strip(&before),
        "the same rules, never flushed"
    );
    let log = netns.agent_log();
    assert!(
        log.contains("applying the cached plan before contacting the API server"),
        "{log}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(agent.wait().unwrap().success(), "{}", netns.agent_log());
    assert!(netns.save().contains(":SWYD-SERVICES"), "rules stay on exit");
}
