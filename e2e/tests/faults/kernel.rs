//! Faults on the node itself: the agent killed in the middle of a 10,000-Service restore (fault 3),
//! another program rewriting our rules or holding the xtables lock (fault 5), a full or read-only state
//! directory (fault 6).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_api::{Backend, conditions};
use switchyard_e2e::traffic::{Traffic, TrafficReport};
use switchyard_test_support::fake_apiserver::Kind;
use switchyard_test_support::synthetic::{Shape, pod_ip, service, slice};

use crate::harness::{APPLY_TIMEOUT, ApiLab, checkout_pod, set_checkout_new_ready, tail};
use crate::stable_flows;

const FULL_SYNCS: &str = "switchyard_agent_syncs_total{mode=\"full\"}";
/// How many Services the large restore holds.
const LARGE: usize = 10_000;
/// Services whose endpoint addresses tell which restore the kernel holds.
const SAMPLES: [usize; 5] = [0, 1_234, 5_000, 8_765, LARGE - 1];

fn assert_clean(report: &TrafficReport, fault: &str) {
    switchyard_test_support::announce::announce(&report.line(fault));
    assert_eq!(report.total().failed, 0, "{fault}: {:#?}", report.failures);
}

// === fault 3: SIGKILL in the middle of a large restore ===

fn large_shape() -> Shape {
    Shape {
        nodes: 3,
        services: LARGE,
        endpoints: 2,
        zones: 1,
        etp_local_percent: 0,
        itp_local_percent: 0,
        hinted_percent: 0,
    }
}

/// Puts the 10,000 Services (ClusterIPs in 10.100.0.0/16, away from the example's) with their
/// EndpointSlices of `generation` (which moves every Service's first endpoint).
fn put_large(api: &ApiLab, generation: usize) {
    let shape = large_shape();
    for s in 0..LARGE {
        if generation == 0 {
            let mut svc = service(s, &shape);
            let ip = format!("10.100.{}.{}", s / 256, s % 256);
            let spec = svc.spec.as_mut().unwrap();
            spec.cluster_ip = Some(ip.clone());
            spec.cluster_ips = Some(vec![ip]);
            api.put(Kind::Service, svc);
        }
        api.put(Kind::EndpointSlice, slice(s, &shape, generation));
    }
}

/// The node's rules as text (the table the backend owns).
fn rules(api: &ApiLab, node: &str, backend: Backend) -> String {
    let argv: &[&str] = match backend {
        Backend::Nftables => &["nft", "list", "table", "ip", "switchyard"],
        _ => &["iptables-save", "-t", "nat"],
    };
    String::from_utf8_lossy(&api.exec(node, argv).stdout).into_owned()
}

/// Which generation of the large change the kernel holds: `Some(generation)` when every sample says
/// the same, `None` for a mix (or none of them).
fn generation_in_kernel(api: &ApiLab, node: &str, backend: Backend) -> Option<usize> {
    let text = rules(api, node, backend);
    let holds = |ip: String| {
        // Whole addresses only: 10.64.0.1 must not match 10.64.0.16.
        text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .any(|word| word == ip)
    };
    let old = SAMPLES.iter().filter(|&&s| holds(pod_ip(s, 0, 0))).count();
    let new = SAMPLES.iter().filter(|&&s| holds(pod_ip(s, 0, 1))).count();
    match (old, new) {
        (n, 0) if n == SAMPLES.len() => Some(0),
        (0, n) if n == SAMPLES.len() => Some(1),
        _ => {
            eprintln!("kernel holds {old} old and {new} new sample endpoints");
            None
        }
    }
}

static LAST_STORED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Which generation the stored ForwardingSlices hold for the sample Services (`None`: a mix, or none).
fn stored_generation(api: &ApiLab) -> Option<usize> {
    // What node-a composes from the stored objects: a changed Service's packed copy stays behind its
    // Service slice, so the raw text of the slices holds both generations.
    let plan = api.server.get(Kind::Plan, "node-a")?;
    let plan: switchyard_api::NodeForwardingPlanSpec = serde_json::from_value(plan["spec"].clone()).ok()?;
    let slices: Vec<(String, switchyard_api::ForwardingSliceSpec)> = api
        .server
        .keys(Kind::ForwardingSlice)
        .into_iter()
        .filter_map(|name| {
            let object = api.server.get(Kind::ForwardingSlice, &name)?;
            Some((name, serde_json::from_value(object["spec"].clone()).ok()?))
        })
        .collect();
    let refs: Vec<switchyard_api::compose::SliceRef<'_>> = slices
        .iter()
        .map(|(name, spec)| switchyard_api::compose::SliceRef { name, spec })
        .collect();
    let composed = switchyard_api::compose::compose(&plan, &refs).ok()?;
    let text = serde_json::to_string(&composed.spec.services).ok()?;
    let holds = |ip: String| text.contains(&format!("\"{ip}\""));
    let old = SAMPLES.iter().filter(|&&s| holds(pod_ip(s, 0, 0))).count();
    let new = SAMPLES.iter().filter(|&&s| holds(pod_ip(s, 0, 1))).count();
    // Printed when it changes: a wait that times out shows how far the controller got.
    let seen = format!(
        "{} Services in node-a's plan ({} slices), {old} old and {new} new samples",
        composed.spec.services.len(),
        slices.len()
    );
    let mut last = LAST_STORED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *last != seen {
        eprintln!("stored: {seen}");
        *last = seen;
    }
    match (old, new) {
        (n, 0) if n == SAMPLES.len() => Some(0),
        (0, n) if n == SAMPLES.len() => Some(1),
        _ => None,
    }
}

/// The pid of a restore the agent runs now (`iptables-restore`, `nft -f`), if any.
fn restore_child(agent_pid: u32) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
        let (head, rest) = stat.rsplit_once(") ")?;
        let comm = head.split_once(" (")?.1;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        if ppid != agent_pid || !(comm.starts_with("iptables") || comm == "nft") {
            return None;
        }
        // A restore, not a read (`iptables-save`, `nft -j list`, a drift check).
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let restoring = args.iter().any(|a| a.ends_with(b"-restore")) || args.iter().any(|a| *a == b"-f");
        restoring.then_some(pid)
    })
}

fn sigkill_in_the_middle_of_a_large_restore(backend: Backend, test: &str) {
    // A long coalescing interval makes the 10,000-Service change one restore.
    let Some(mut api) = ApiLab::up(test, backend, &[("--min-sync-interval", "2s")], &[]) else {
        return;
    };
    let node = "node-a";
    // Each generation is one bulk change: rounds 5 s apart make each land in one or two planning
    // rounds, so the controller rewrites packed slices (its BATCH rule) and the test does not depend
    // on how fast this machine puts 20,000 objects.
    api.set_min_plan_interval(Duration::from_secs(5));
    put_large(&api, 0);
    // The controller writes the 10,000 Services as ~100 slices over many seconds (a debug build on a
    // busy machine: minutes), and the agents apply each partial state on the way; "applied" means
    // something only once the stored objects hold the whole first generation.
    api.wait_for(
        "the controller to write every slice of the first generation",
        Duration::from_secs(300),
        |api| stored_generation(api) == Some(0),
    );
    for n in api.nodes() {
        api.wait_applied(&n, Duration::from_secs(300));
    }
    assert_eq!(generation_in_kernel(&api, node, backend), Some(0));
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(1));

    traffic.phase("during");
    // The controller writes the change as ~100 slices; node-a sees them only once all are written (its
    // watch resumes from where it was and gets them at once), so the change is one restore there.
    api.cut(node);
    put_large(&api, 1);
    api.wait_for(
        "the controller to write every slice of the change",
        Duration::from_secs(300),
        |api| stored_generation(api) == Some(1),
    );
    api.restore(node);
    let pid = api.agent(node).pid();
    let deadline = Instant::now() + Duration::from_secs(120);
    let restore = loop {
        if let Some(child) = restore_child(pid) {
            break child;
        }
        assert!(
            Instant::now() < deadline,
            "{node}: no restore seen:\n{}",
            tail(&api.agent_log(node), 30)
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    api.kill_agent(node);
    let held = generation_in_kernel(&api, node, backend);
    assert!(
        held.is_some(),
        "{node}: the kernel holds a mix after SIGKILL during restore {restore}"
    );

    // Restart without the API server: the agent programs what its cache holds (the last plan it
    // applied), which the kernel already has; nothing is flushed.
    api.cut(node);
    api.start_agent(node);
    api.wait_for(
        "the restarted agent to sync from its cache",
        Duration::from_secs(120),
        |api| api.metric(node, FULL_SYNCS).unwrap_or(0.0) >= 1.0,
    );
    assert_eq!(
        generation_in_kernel(&api, node, backend),
        held,
        "the cache is the last applied plan"
    );
    traffic.phase("after");
    api.restore(node);
    api.wait_applied(node, Duration::from_secs(300));
    assert_eq!(generation_in_kernel(&api, node, backend), Some(1));
    std::thread::sleep(Duration::from_secs(1));
    let report = traffic.stop();
    println!("{node}: killed during restore (pid {restore}); the kernel then held generation {held:?}");
    assert_clean(&report, &format!("sigkill-mid-restore-{backend}"));
}

#[test]
fn sigkill_in_the_middle_of_an_iptables_restore_keeps_old_or_new_rules() {
    sigkill_in_the_middle_of_a_large_restore(Backend::Iptables, "sigkill_iptables");
}

#[test]
fn sigkill_in_the_middle_of_an_nftables_transaction_keeps_old_or_new_rules() {
    sigkill_in_the_middle_of_a_large_restore(Backend::Nftables, "sigkill_nftables");
}

// === fault 5: another program rewrites our rules, or holds the xtables lock ===

/// What an admin script or a firewall reload does to our rules.
fn tamper(api: &ApiLab, node: &str, backend: Backend) -> String {
    match backend {
        Backend::Nftables => {
            let out = api.exec(node, &["nft", "delete", "table", "ip", "switchyard"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            "nft delete table ip switchyard".into()
        }
        _ => {
            let mut flushed = Vec::new();
            for table in ["nat", "filter"] {
                let save = api.exec(node, &["iptables-save", "-t", table]);
                for line in String::from_utf8_lossy(&save.stdout).lines() {
                    if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split(' ').next())
                        && chain.starts_with("SWYD")
                    {
                        let out = api.exec(node, &["iptables", "-t", table, "-F", chain]);
                        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                        flushed.push(format!("{table}/{chain}"));
                    }
                }
            }
            assert!(!flushed.is_empty());
            format!("iptables -F of {} SWYD chains", flushed.len())
        }
    }
}

fn rules_rewritten_by_another_program_are_repaired(backend: Backend, test: &str) {
    let Some(api) = ApiLab::up(test, backend, &[], &[]) else {
        return;
    };
    // node-c carries the pod-to-ClusterIP flow from nginx-pod-3.
    let node = "node-c";
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let repairs_before = api.status(node).unwrap().drift_repairs;
    traffic.phase("rules-gone");
    let what = tamper(&api, node, backend);
    let tampered = Instant::now();
    api.wait_for("the drift to be repaired", Duration::from_secs(10), |api| {
        api.status(node).is_some_and(|s| s.drift_repairs > repairs_before)
    });
    let repaired_in = tampered.elapsed();
    traffic.phase("after");
    std::thread::sleep(Duration::from_secs(3));
    let repairs = api
        .metric(node, "switchyard_agent_drift_repairs_total")
        .unwrap_or(0.0);
    assert!(repairs >= 1.0, "drift repairs must show in the metrics");
    let report = traffic.stop();
    println!(
        "{node}: {what}; repaired in {:.1} s (resync period 2 s); new connections in that window have no \
         rules to follow: {} of {} failed",
        repaired_in.as_secs_f64(),
        report.phase("rules-gone").failed,
        report.phase("rules-gone").connections
    );
    let settled = TrafficReport {
        phases: report
            .phases
            .iter()
            .filter(|(p, _)| p != "rules-gone")
            .cloned()
            .collect(),
        failures: report
            .failures
            .iter()
            .filter(|f| !f.starts_with("rules-gone"))
            .cloned()
            .collect(),
        held: report.held,
    };
    if settled.total().failed > 0 {
        // Which flows the kernel still tracks oddly (unanswered or reset): the trace of a connection
        // from the window without rules that a later one ran into.
        let tracked = api.exec(node, &["conntrack", "-L"]);
        let odd: Vec<_> = String::from_utf8_lossy(&tracked.stdout)
            .lines()
            .filter(|l| l.contains("UNREPLIED") || l.contains(" CLOSE "))
            .map(str::to_owned)
            .collect();
        println!(
            "{node}: conntrack entries unanswered or reset after the repair:\n{}",
            odd.join("\n")
        );
    }
    assert_clean(&settled, &format!("rules-rewritten-{backend}"));
}

#[test]
fn iptables_rules_flushed_by_another_program_are_repaired_within_a_resync_period() {
    rules_rewritten_by_another_program_are_repaired(Backend::Iptables, "rules_flushed_iptables");
}

#[test]
fn an_nftables_table_deleted_by_another_program_is_repaired_within_a_resync_period() {
    rules_rewritten_by_another_program_are_repaired(Backend::Nftables, "table_deleted_nftables");
}

/// Another program holds the xtables lock for 30 s while a change arrives: the agent's restore waits
/// (5 s, as kube-proxy's), fails visibly, retries, and applies once the lock is free.
#[test]
fn a_held_xtables_lock_is_waited_for_and_the_change_lands_after() {
    let scratch = switchyard_test_support::scratch::dir("fault-xtables-lock").unwrap();
    let lock = scratch.path().join("xtables.lock");
    let env = format!("XTABLES_LOCKFILE={}", lock.display());
    let Some(api) = ApiLab::up(
        "xtables_lock",
        Backend::Iptables,
        &[("--iptables-mode", "legacy")],
        &[&env],
    ) else {
        return;
    };
    let node = "node-c";
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    traffic.phase("locked");
    let mut holder = Command::new("flock")
        .arg("-x")
        .arg(&lock)
        .args(["sleep", "30"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let locked = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    set_checkout_new_ready(&api, true);
    api.wait_for(
        "the refused restore to show in status",
        Duration::from_secs(25),
        |api| {
            api.status(node).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::APPLIED
                        && c.status == conditions::status::FALSE
                        && c.reason == conditions::reasons::APPLY_FAILED
                })
            })
        },
    );
    let message = api.status(node).unwrap().conditions;
    let failures = api
        .metric(node, "switchyard_agent_sync_failures_total")
        .unwrap_or(0.0);
    assert!(failures >= 1.0, "the failed restore must show in the metrics");
    assert_eq!(
        checkout_pod(&api).as_deref(),
        Some("checkout-old-1"),
        "the old rules stay while locked"
    );
    holder.wait().unwrap();
    traffic.phase("after");
    api.wait_applied(node, APPLY_TIMEOUT);
    let landed = locked.elapsed();
    api.wait_for(
        "checkout to reach its ready pod",
        Duration::from_secs(10),
        |api| checkout_pod(api).as_deref() == Some("checkout-new-1"),
    );
    let report = traffic.stop();
    println!(
        "{node}: xtables lock held 30 s; the change landed {:.1} s after the lock was taken; {failures} \
         failed syncs counted; status said {:?}",
        landed.as_secs_f64(),
        message
            .iter()
            .find(|c| c.type_ == conditions::APPLIED)
            .map(|c| &c.message)
    );
    assert_clean(&report, "xtables-lock-held-30s");
}

// === fault 6: the state directory is full or read-only ===

/// The agent of node-a runs with its state directory on a 4 KiB tmpfs (full after the first page), or
/// on a read-only one: caching the plan fails, visibly; forwarding and changes go on.
#[test]
fn a_full_or_read_only_state_dir_fails_visibly_and_forwarding_goes_on() {
    let Some(mut api) = ApiLab::up("state_dir", Backend::Nftables, &[], &[]) else {
        return;
    };
    let node = "node-a";
    let traffic = Traffic::start(&api.lab, &stable_flows()).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    for (phase, options, ready) in [("disk-full", "size=4k", true), ("read-only", "ro", false)] {
        traffic.phase(phase);
        let dir = api.state_dir(node).join(phase);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.clone();
        let dir = dir.display().to_string();
        let script = format!("mount -t tmpfs -o {options} swyd-fault \"$0\" && exec \"$@\"");
        // The agent's own mount namespace: the tmpfs is gone with it, the host sees nothing.
        api.start_agent_with(
            node,
            &[
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                &dir,
            ],
            Some(path),
        );
        api.wait_for(
            "the failed cache write to be counted",
            Duration::from_secs(30),
            |api| {
                api.metric(node, "switchyard_agent_plan_cache_write_failures_total")
                    .unwrap_or(0.0)
                    >= 1.0
            },
        );
        set_checkout_new_ready(&api, ready);
        api.wait_applied(node, APPLY_TIMEOUT);
        let want = if ready { "checkout-new-1" } else { "checkout-old-1" };
        api.wait_for("the change to reach the kernel", Duration::from_secs(10), |api| {
            checkout_pod(api).as_deref() == Some(want)
        });
        let log = api.agent_log(node);
        assert!(
            log.contains("cannot cache the applied plan"),
            "{phase}: no log line:\n{}",
            tail(&log, 20)
        );
        api.wait_for("the failure to show in status", Duration::from_secs(10), |api| {
            api.status(node).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::DEGRADED
                        && c.status == conditions::status::TRUE
                        && c.reason == conditions::reasons::CACHE_WRITE_FAILED
                })
            })
        });
        let status = api.status(node).unwrap();
        let degraded = status.conditions.iter().find(|c| c.type_ == conditions::DEGRADED);
        println!("{node} ({phase}): Degraded: {:?}", degraded.map(|c| &c.message));
    }
    api.start_agent(node);
    api.wait_applied(node, APPLY_TIMEOUT);
    let report = traffic.stop();
    assert_clean(&report, "state-dir-full-or-read-only");
}
