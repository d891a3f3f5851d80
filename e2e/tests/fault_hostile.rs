//! Fault 7 of the fault suite (issue "faults and hostile input"): plans and slices that are valid YAML or
//! JSON but hostile, fed to one node's agent while real traffic flows through the lab.
//!
//! ```text
//! example cluster, one file-fed agent per node ─► Traffic from node-a's pods and through node-a, running
//! for each hostile input: reset node-a's agent's peak RSS ─► write the plan file (atomically)
//!     ─► wait for the status to say it: InvalidPlan (rejected whole, the last good rules stay) or a
//!        failure naming the entry (the rest applied), or applied as it is (a /0 source range)
//!     ─► read the agent's peak RSS (VmHWM)
//! restore the good plan ─► applied, no failures ─► `fault: hostile-plan: N connections, 0 failed (…)`
//! ```
//!
//! Needs root (see `common::lab_allowed`). docs/benchmarks.md records the peak memory per input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_api::{
    Backend, ForwardingSlice, ForwardingSliceSpec, NodeForwardingPlan, NodeForwardingPlanSpec,
    NodeForwardingPlanStatus, PlanSummary, ServicePlan, conditions, revision,
    testing::{self, EntryExt},
};
use switchyard_e2e::traffic::{Flow, Traffic};
use switchyard_e2e::{ClusterDescription, Deployed, Place};

/// The node whose agent is fed the hostile plans.
const NODE: &str = "node-a";
/// How long the agent gets to read (and refuse) one input: a 64 MiB file in a debug build takes seconds.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(90);
/// The agent's peak RSS while it reads any one hostile input must stay below this.
const MAX_PEAK_RSS_KIB: u64 = 200 * 1024;
/// Where node-a's agent serves /metrics inside its namespace (the agent's default).
const METRICS: &str = "127.0.0.1:10263";

fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

fn deployed(test: &str, backend: Backend) -> Option<Deployed> {
    if !common::lab_allowed(test) {
        return None;
    }
    let mut config = switchyard_controller::Config::load(&repo("examples/controller-config.yaml")).unwrap();
    config.default_backend = backend;
    let description = ClusterDescription::from_file(&repo("examples/cluster.yaml")).unwrap();
    let deployed = Deployed::up(description, config, common::options()).unwrap();
    for cidr in ["203.0.113.0/24", "10.96.0.0/16"] {
        deployed
            .lab
            .client_route_via(cidr.parse().unwrap(), NODE)
            .unwrap();
    }
    Some(deployed)
}

/// Connections that node-a's rules carry, to Services whose endpoints never change here: ClusterIPs from
/// two of node-a's pods (TCP and UDP, Cluster and Local policy), node-a's NodePort and its LoadBalancer
/// VIP (with source ranges) from outside.
fn flows() -> Vec<Flow> {
    vec![
        Flow::tcp(Place::pod("web-1"), "10.96.0.80:80", &["apache"]).unwrap(),
        Flow::tcp(Place::pod("web-1"), "10.96.97.97:80", &["nginx-pod"]).unwrap(),
        Flow::tcp(
            Place::pod("apache-6d4cf56db6-a1"),
            "10.96.125.27:8080",
            &["heketi"],
        )
        .unwrap(),
        Flow::udp(
            Place::pod("apache-6d4cf56db6-a1"),
            "10.96.0.53:53",
            &["node-local-dns-a"],
        )
        .unwrap(),
        Flow::tcp(Place::Client, "192.168.10.11:32701", &["nginx-gateway"]).unwrap(),
        Flow::tcp(Place::Client, "203.0.113.10:80", &["web-1"]).unwrap(),
    ]
}

/// What the agent must make of an input.
enum Verdict {
    /// Rejected whole: Applied=False, reason InvalidPlan, the message says this; the applied revision
    /// does not move.
    Rejected(&'static str),
    /// Applied without the hostile entry: this revision observed, a failure says this.
    Skipped { revision: String, failure: &'static str },
    /// Applied as it is, with no failures.
    Applied { revision: String },
}

struct Case {
    name: &'static str,
    text: String,
    verdict: Verdict,
}

/// An entry of an unused Service with one endpoint of its family (`switchyard_api::testing::entry`).
fn entry(name: &str, cluster_ip: &str, port: u16) -> ServicePlan {
    let endpoint = if cluster_ip.contains(':') {
        "fd00:10:244:1::99"
    } else {
        "10.244.1.99"
    };
    testing::entry(name, cluster_ip, port).with(testing::ep(endpoint, 8080))
}

/// The plan as a file (its summary and revision as `stamped` left them: a hostile plan whose content
/// does not hash to its revision is refused before its content is looked at, which `planfile`'s tests
/// and `tests/fuzz.rs` cover; these inputs are hostile *and* intact).
fn yaml(spec: &NodeForwardingPlanSpec) -> String {
    serde_saphyr::to_string(&NodeForwardingPlan::new(NODE, spec.clone())).unwrap()
}

/// `spec` with its summary counting what it holds and its revision the hash of its content, as the
/// controller writes it.
fn stamped(mut spec: NodeForwardingPlanSpec) -> NodeForwardingPlanSpec {
    spec.summary = PlanSummary::of(spec.services.iter().chain(&spec.overrides));
    spec.revision = revision::compute(&spec).unwrap();
    spec
}

/// `spec` with one more entry (an unused Service: skipping it costs no traffic), stamped.
fn plus(spec: &NodeForwardingPlanSpec, extra: ServicePlan) -> NodeForwardingPlanSpec {
    let mut spec = spec.clone();
    spec.services.push(Arc::new(extra));
    spec.services.sort_by(|a, b| a.key().cmp(&b.key()));
    stamped(spec)
}

/// The plan object as JSON with `n` generated entries after its own, each with `endpoints` endpoints:
/// written as text, as a hostile generator would (200,000 typed entries would cost the test what it
/// measures in the agent).
fn json_with_entries(spec: &NodeForwardingPlanSpec, n: usize, endpoints: usize) -> String {
    let object = serde_json::to_value(NodeForwardingPlan::new(NODE, spec.clone())).unwrap();
    let own = serde_json::to_string(&object["spec"]["services"]).unwrap();
    let mut text = String::with_capacity(n * (120 + endpoints * 50));
    text.push_str(own.trim_end_matches(']'));
    for i in 0..n {
        let ip = format!("10.{}.{}.{}", 100 + (i >> 16), (i >> 8) & 255, i & 255);
        text.push_str(&format!(
            ",{{\"name\":\"hostile/s{i}:p\",\"protocol\":\"TCP\",\"family\":\"IPv4\",\"clusterIP\":\"{ip}\",\
             \"port\":80,\"hasEndpoints\":{},\"endpoints\":[",
            endpoints > 0
        ));
        for e in 0..endpoints {
            let sep = if e == 0 { "" } else { "," };
            text.push_str(&format!(
                "{sep}{{\"ip\":\"10.244.{}.{}\",\"port\":8080,\"cluster\":true}}",
                e + 1,
                i & 255
            ));
        }
        text.push_str("]}");
    }
    text.push(']');
    let mut object = object;
    object["spec"]["services"] = serde_json::Value::String("@SERVICES@".into());
    serde_json::to_string(&object)
        .unwrap()
        .replacen("\"@SERVICES@\"", &text, 1)
}

/// A live plan (view `all`, node-a's own entries as overrides, which keep their node flags) and slice
/// `all-0000` holding `entries`, as a JSON List or YAML documents, both stamped; and the live plan's
/// revision.
fn with_slice(spec: &NodeForwardingPlanSpec, entries: Vec<ServicePlan>, json: bool) -> (String, String) {
    let mut live = spec.clone();
    live.views = vec!["all".into()];
    live.overrides = std::mem::take(&mut live.services);
    let live = stamped(live);
    let entries: Vec<Arc<ServicePlan>> = entries.into_iter().map(Arc::new).collect();
    let mut spec = ForwardingSliceSpec {
        view: "all".into(),
        zone: None,
        node: None,
        service: None,
        index: 0,
        count: 1,
        revision: String::new(),
        summary: PlanSummary::of(&entries),
        entries,
    };
    spec.revision = revision::compute_slice(&spec).unwrap();
    let slice = ForwardingSlice::new("all-0000", spec);
    let revision = live.revision.clone();
    let plan = NodeForwardingPlan::new(NODE, live);
    if json {
        let text = serde_json::json!({"kind": "List", "items": [slice, plan]}).to_string();
        return (text, revision);
    }
    let text = format!(
        "{}---\n{}",
        serde_saphyr::to_string(&slice).unwrap(),
        serde_saphyr::to_string(&plan).unwrap()
    );
    (text, revision)
}

/// The same as YAML documents, slice `all-0000` holding `n` generated entries, written as text.
fn yaml_slice_with_entries(spec: &NodeForwardingPlanSpec, n: usize) -> String {
    let (documents, _) = with_slice(spec, vec![], false);
    let (slice, plan) = documents.split_once("---\n").unwrap();
    let mut text = String::with_capacity(n * 140 + documents.len());
    text.push_str(slice.trim_end());
    text.push_str("\n  entries:\n");
    for i in 0..n {
        let ip = format!("10.{}.{}.{}", 100 + (i >> 16), (i >> 8) & 255, i & 255);
        text.push_str(&format!(
            "  - name: hostile/s{i}:p\n    protocol: TCP\n    family: IPv4\n    clusterIP: {ip}\n    port: 80\n    \
             hasEndpoints: false\n"
        ));
    }
    text.push_str("---\n");
    text.push_str(plan);
    text
}

fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} is not in the plan");
    text.replacen(from, to, 1)
}

fn cases(good: &NodeForwardingPlanSpec) -> Vec<Case> {
    let huge = "a".repeat(10 << 20);
    // `good` is node-a's plan composed with its slices, under its live plan's revision: as a
    // self-contained file it carries its own (what `plan --node` writes).
    let again = stamped(good.clone());
    let good_yaml = yaml(&again);
    let extra = || entry("hostile/extra:p", "10.96.200.1", 80);
    let mut open = good.clone();
    let web = open
        .services
        .iter_mut()
        .find(|e| e.name == "default/web-lb:http")
        .expect("web-lb");
    assert!(!web.source_ranges.is_empty(), "web-lb has source ranges");
    Arc::make_mut(web).source_ranges.push("0.0.0.0/0".into());
    let open = stamped(open);
    let duplicate = {
        let mut spec = good.clone();
        let first = Arc::clone(&spec.services[0]);
        spec.services.insert(1, first);
        stamped(spec)
    };
    let port_0 = plus(good, entry("hostile/zero:p", "10.96.200.4", 0));
    let family = plus(good, {
        let mut v6 = entry("hostile/v6:p", "fd00:10:96::200", 80);
        v6.endpoints[0].ip = "10.244.1.99".into();
        v6
    });
    let long_name = plus(good, entry(&format!("hostile/{huge}:p"), "10.96.200.3", 80));
    let (slice_name_text, slice_name_revision) = with_slice(
        good,
        vec![entry(&format!("hostile/{huge}:p"), "10.96.200.6", 80)],
        false,
    );
    let backend = format!("backend: {}", good.backend);
    vec![
        Case {
            name: "duplicate YAML key",
            text: replaced(
                &yaml(&plus(good, extra())),
                "  nodeName: node-a\n",
                "  nodeName: node-a\n  nodeName: node-b\n",
            ),
            verdict: Verdict::Rejected("`nodeName` is given twice in one mapping"),
        },
        Case {
            name: "duplicate entry",
            text: yaml(&duplicate),
            verdict: Verdict::Skipped {
                revision: duplicate.revision.clone(),
                failure: "duplicate entry",
            },
        },
        Case {
            name: "Service port 0",
            text: yaml(&port_0),
            verdict: Verdict::Skipped {
                revision: port_0.revision.clone(),
                failure: "port: must be 1..65535",
            },
        },
        Case {
            name: "Service port 65536",
            text: replaced(
                &yaml(&plus(good, entry("hostile/big:p", "10.96.200.5", 65535))),
                "port: 65535\n",
                "port: 65536\n",
            ),
            verdict: Verdict::Rejected("this value does not fit: it must be a whole number from 0 to 65535"),
        },
        Case {
            name: "IPv4 endpoint in an IPv6 entry",
            text: yaml(&family),
            verdict: Verdict::Skipped {
                revision: family.revision.clone(),
                failure: "10.244.1.99 is not IPv6",
            },
        },
        Case {
            name: "unknown backend",
            text: replaced(&yaml(&plus(good, extra())), &backend, "backend: bpf"),
            verdict: Verdict::Rejected("unknown variant `bpf`"),
        },
        Case {
            name: "10 MB Service name",
            text: yaml(&long_name),
            verdict: Verdict::Skipped {
                revision: long_name.revision.clone(),
                failure: "is 10485760 bytes, longer than the 63 allowed",
            },
        },
        Case {
            name: "10 MB revision",
            // Too long to be checked against the content: validation refuses it, naming the field.
            text: yaml(&NodeForwardingPlanSpec {
                revision: huge.clone(),
                ..plus(good, extra())
            }),
            verdict: Verdict::Rejected("spec.revision: revision \"aaaa"),
        },
        Case {
            name: "slice entry with a 10 MB name",
            text: slice_name_text,
            verdict: Verdict::Skipped {
                revision: slice_name_revision,
                failure: "is 10485760 bytes, longer than the 63 allowed",
            },
        },
        Case {
            name: "200,000 entries, 10 endpoints each",
            text: json_with_entries(good, 200_000, 10),
            verdict: Verdict::Rejected("a plan file may hold"),
        },
        Case {
            name: "200,000 entries, no endpoints",
            text: json_with_entries(good, 200_000, 0),
            verdict: Verdict::Rejected("more than 100000 entries, the most one object may hold"),
        },
        Case {
            name: "slice of 200,000 entries, JSON",
            text: with_slice(
                good,
                (0..200_000)
                    .map(|i| entry(&format!("hostile/s{i}:p"), "10.96.200.2", 80))
                    .collect(),
                true,
            )
            .0,
            verdict: Verdict::Rejected(
                "ForwardingSlice all-0000: not a valid spec: entries: more than 100000 entries",
            ),
        },
        Case {
            name: "slice of 200,000 entries, YAML",
            text: yaml_slice_with_entries(good, 200_000),
            verdict: Verdict::Rejected(
                "ForwardingSlice all-0000: not a valid spec: more than 100000 entries",
            ),
        },
        Case {
            name: "source range 0.0.0.0/0",
            text: yaml(&open),
            verdict: Verdict::Applied {
                revision: open.revision.clone(),
            },
        },
        Case {
            name: "the good plan again",
            text: good_yaml,
            verdict: Verdict::Applied {
                revision: again.revision.clone(),
            },
        },
    ]
}

/// Writes a plan file whole (a temporary file renamed over it): the agent never reads half of it.
fn write_plan(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn applied_condition(status: &NodeForwardingPlanStatus) -> Option<&switchyard_api::PlanCondition> {
    status.conditions.iter().find(|c| c.type_ == conditions::APPLIED)
}

/// Whether the status shows the verdict, given the revision the last good rules are of and the Applied
/// message before the input was written (a rejection must say something new: the agent's source keeps
/// only its latest state, so the next input must not be written before this one was seen).
fn shows(status: &NodeForwardingPlanStatus, verdict: &Verdict, last_good: &str, before: &str) -> bool {
    let applied = applied_condition(status);
    match verdict {
        Verdict::Rejected(message) => {
            applied.is_some_and(|c| {
                c.status == conditions::status::FALSE
                    && c.reason == conditions::reasons::INVALID_PLAN
                    && c.message.contains(message)
                    && c.message != before
            }) && status.observed_revision.as_deref() == Some(last_good)
        }
        Verdict::Skipped { revision, failure } => {
            status.observed_revision.as_deref() == Some(revision.as_str())
                && applied.is_some_and(|c| c.status == conditions::status::TRUE)
                && status.failures.iter().any(|f| f.reason.contains(failure))
        }
        Verdict::Applied { revision } => {
            status.observed_revision.as_deref() == Some(revision.as_str())
                && applied.is_some_and(|c| c.status == conditions::status::TRUE)
                && status.failures.is_empty()
        }
    }
}

/// A field of /proc/<pid>/status, in KiB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Resets the peak RSS (VmHWM) of `pid` to its current RSS (`clear_refs` 5, Linux 4.0+).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// One metric of node-a's agent, read over HTTP inside the node's namespace.
fn metric(deployed: &Deployed, name: &str) -> Option<f64> {
    let netns = deployed.lab.netns(&Place::node(NODE)).unwrap().to_string();
    let text = switchyard_e2e::netns::in_netns(&netns, || {
        let mut stream = std::net::TcpStream::connect(METRICS).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        Some(text)
    })
    .unwrap()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether node-a's kernel holds web-lb's source-range firewall chain.
fn kernel_has_firewall(deployed: &Deployed, backend: Backend) -> bool {
    let (argv, chain): (&[&str], String) = match backend {
        Backend::Nftables => (
            &["nft", "list", "table", "ip", "switchyard"],
            format!(
                "chain {} ",
                switchyard_agent::nftables::names::firewall_chain("default/web-lb:http", "tcp")
            ),
        ),
        _ => (
            &["iptables-save", "-t", "nat"],
            format!(
                ":{} ",
                switchyard_agent::iptables::names::firewall_chain("default/web-lb:http", "tcp")
            ),
        ),
    };
    let out = deployed.exec_in_node(NODE, argv).unwrap();
    String::from_utf8_lossy(&out.stdout).contains(&chain)
}

fn hostile_plans_keep_the_last_good_rules(test: &str, backend: Backend) {
    let Some(deployed) = deployed(test, backend) else {
        return;
    };
    let path = deployed.plan_path(NODE);
    let good = deployed.plan(NODE).unwrap().remove(0).spec;
    let pid = deployed.agent(NODE).unwrap().pid();
    assert!(
        kernel_has_firewall(&deployed, backend),
        "web-lb's source ranges are programmed"
    );
    let cases = cases(&good);
    let rejected_before = metric(&deployed, "switchyard_agent_rejected_plans_total").unwrap_or(0.0);

    let traffic = Traffic::start(&deployed.lab, &flows()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    traffic.phase("during");
    let mut last_good = good.revision.clone();
    let mut peaks = Vec::new();
    let mut rejected = 0;
    for case in &cases {
        if case.name == "the good plan again" {
            traffic.phase("after");
        }
        let started = Instant::now();
        reset_peak(pid);
        let before = proc_status_kib(pid, "VmRSS:");
        let said_before = deployed
            .status(NODE)
            .unwrap()
            .and_then(|s| applied_condition(&s).map(|c| c.message.clone()))
            .unwrap_or_default();
        write_plan(&path, &case.text);
        let status = loop {
            let status = deployed.status(NODE).unwrap().unwrap_or_default();
            if shows(&status, &case.verdict, &last_good, &said_before) {
                break status;
            }
            assert!(
                deployed.agent(NODE).unwrap().is_running(),
                "{}: the agent exited:\n{}",
                case.name,
                deployed.agent(NODE).unwrap().stderr()
            );
            assert!(
                started.elapsed() < VERDICT_TIMEOUT,
                "{}: the status does not show the verdict: {status:?}",
                case.name
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let peak = proc_status_kib(pid, "VmHWM:");
        let said = match &case.verdict {
            Verdict::Rejected(_) => {
                rejected += 1;
                applied_condition(&status).unwrap().message.clone()
            }
            Verdict::Skipped { .. } => {
                last_good = status.observed_revision.clone().unwrap();
                let failure = &status.failures[0];
                format!("{}: {}", failure.service, failure.reason)
            }
            Verdict::Applied { .. } => {
                last_good = status.observed_revision.clone().unwrap();
                "applied".to_string()
            }
        };
        println!(
            "hostile-plan: {:<50} {:>5.1} MB, RSS {:>3} MiB, peak {:>3} MiB, {:>5.1} s: {}",
            case.name,
            case.text.len() as f64 / 1e6,
            before / 1024,
            peak / 1024,
            started.elapsed().as_secs_f64(),
            said.chars().take(300).collect::<String>()
        );
        assert!(said.len() <= 1024, "{}: a {} byte message", case.name, said.len());
        peaks.push((case.name, peak));
        if case.name == "source range 0.0.0.0/0" {
            assert!(
                !kernel_has_firewall(&deployed, backend),
                "a /0 source range allows every source: no firewall, as in kube-proxy"
            );
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let report = traffic.stop();
    switchyard_test_support::announce::announce(&report.line("hostile-plan"));

    assert!(
        kernel_has_firewall(&deployed, backend),
        "the good plan's source ranges are back"
    );
    let rejected_after = metric(&deployed, "switchyard_agent_rejected_plans_total").unwrap();
    assert!(
        rejected_after - rejected_before >= f64::from(rejected),
        "rejections are counted: {rejected_before} → {rejected_after}, {rejected} rejected"
    );
    let log = deployed.agent(NODE).unwrap().stderr();
    assert!(
        log.contains("plan not applied; the current rules stay") && log.contains("skipping invalid entry"),
        "the log says what was refused:\n{}",
        &log[log.len().saturating_sub(4000)..]
    );
    assert!(
        log.len() < 4 << 20,
        "10 MB values are not logged whole: {} bytes of log",
        log.len()
    );
    for (name, peak) in &peaks {
        assert!(
            *peak < MAX_PEAK_RSS_KIB,
            "{name}: the agent's peak RSS was {} MiB",
            peak / 1024
        );
    }
    let total = report.total();
    assert!(
        report.phase("during").connections > 0 && report.phase("after").connections > 0,
        "{}",
        report.line("hostile-plan")
    );
    assert_eq!(
        total.failed,
        0,
        "{}; first failures: {:?}",
        report.line("hostile-plan"),
        report.failures
    );
}

#[test]
fn hostile_plans_keep_the_last_good_rules_nftables() {
    hostile_plans_keep_the_last_good_rules(
        "hostile_plans_keep_the_last_good_rules_nftables",
        Backend::Nftables,
    );
}

#[test]
fn hostile_plans_keep_the_last_good_rules_iptables() {
    hostile_plans_keep_the_last_good_rules(
        "hostile_plans_keep_the_last_good_rules_iptables",
        Backend::Iptables,
    );
}
