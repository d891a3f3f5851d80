//! A leaving node behind a load balancer (issue 42, item 4): the balancer health-checks kube-proxy's
//! port on every node, a node gets Karpenter's taint, and its drain is seen from outside and in its
//! status, with no connection failing.
//!
//! ```text
//! default/shop: LoadBalancer, eTP=Cluster; http 80 ─► 8080 (NodePort 31080), echo 7 ─► 7007 (NodePort 31007)
//!   ─► shop-a 10.244.1.90 (node-a), shop-c 10.244.3.90 (node-c); node-b has no shop pod
//! <id>-balancer 192.168.10.250: GET <node>:10256/healthz every 1 s; new connections round robin over
//!   the nodes that answered 200, to <node>:31080 (frontend :80) and <node>:31007 (frontend :7)
//! the client: two streams of short connections to 192.168.10.250:80, and long-lived echo connections
//!   to 192.168.10.250:7 until three went to node-b (a line each way every 100 ms)
//! 1. node-b gets `karpenter.sh/disrupted` (the description's Node, re-planned): its /healthz answers
//!    503 within 2 s of the plan files' write, /livez 200 all along; the balancer's next check marks it
//!    unhealthy and no new connection goes there after; status.draining.connections = 3 = what
//!    `conntrack -L` in node-b shows open; the long-lived flows are closed one by one: 2, 1, 0, then
//!    Drained=True NoConnections
//! 2. the taint removed: /healthz 200, the balancer marks node-b healthy and sends it new connections
//! all along: 0 failed connections (short and long-lived), none refused by the balancer
//! ```

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Taint;
use switchyard_api::conditions;
use switchyard_e2e::balance::{
    Answer, Balancer, BalancerConfig, BalancerLog, Event, Frontend, HEALTH_PORT, epoch_ms, get_status,
};
use switchyard_e2e::long_lived::LongLived;
use switchyard_e2e::traffic::{Flow, Traffic};
use switchyard_e2e::{ClusterDescription, Deployed, Place, netns};

use super::{Suite, example};

const SHOP: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Cluster
  clusterIP: 10.96.7.80
  clusterIPs: [10.96.7.80]
  ipFamilies: [IPv4]
  selector: {app: shop}
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 31080, protocol: TCP}
  - {name: echo, port: 7, targetPort: 7007, nodePort: 31007, protocol: TCP}
status:
  loadBalancer:
    ingress: [{hostname: shop.balancer.lab.example}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: shop-s8k2d
  namespace: default
  labels: {kubernetes.io/service-name: shop}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: echo, port: 7007, protocol: TCP, appProtocol: switchyard.io/echo}
endpoints:
- addresses: [10.244.1.90]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-a
  targetRef: {kind: Pod, name: shop-a}
- addresses: [10.244.3.90]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-c
  targetRef: {kind: Pod, name: shop-c}
"#;

const BALANCER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 10, 250);
const HTTP_NODE_PORT: u16 = 31080;
const ECHO_NODE_PORT: u16 = 31007;
const LEAVING: &str = "node-b";
const KARPENTER_TAINT: &str = "karpenter.sh/disrupted";
/// Long-lived connections that land on the leaving node.
const LONG_LIVED: usize = 3;
/// How often the test itself asks the leaving node's /healthz and /livez.
const WATCH_EVERY: Duration = Duration::from_millis(50);
/// Generous bounds on waits that are not what the test measures (they only keep a failure from
/// hanging): a status count (every 5 s), the balancer's log.
const WAIT: Duration = Duration::from_secs(30);

fn frontend(port: u16, node_port: u16) -> Frontend {
    Frontend {
        listen: SocketAddr::from((BALANCER_IP, port)),
        node_port,
    }
}

/// What the test saw of a node's kube-proxy port, every [`WATCH_EVERY`], from the balancer's side.
struct HealthWatch {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u64, Answer, Answer)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl HealthWatch {
    fn start(deployed: &Deployed, node: Ipv4Addr) -> HealthWatch {
        let netns = deployed.lab.netns(&Place::Balancer).unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
            std::thread::spawn(move || {
                netns::in_netns(&netns, move || {
                    let port = SocketAddr::from((node, HEALTH_PORT));
                    while !stop.load(Ordering::Relaxed) {
                        let healthz = get_status(port, "/healthz", Duration::from_secs(1));
                        let livez = get_status(port, "/livez", Duration::from_secs(1));
                        let at = epoch_ms(SystemTime::now());
                        samples.lock().unwrap().push((at, healthz, livez));
                        std::thread::sleep(WATCH_EVERY);
                    }
                })
                .unwrap();
            })
        };
        HealthWatch {
            stop,
            samples,
            thread,
        }
    }

    /// When /healthz first answered `code` at or after `since` (ms since the epoch), waiting for it.
    fn first(&self, code: u16, since: u64) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self
                .samples
                .lock()
                .unwrap()
                .iter()
                .find(|(at, healthz, _)| *at >= since && *healthz == Answer::Status(code))
                .map(|(at, _, _)| *at);
            if let Some(at) = found {
                return at;
            }
            assert!(Instant::now() < deadline, "/healthz never answered {code}");
            std::thread::sleep(WATCH_EVERY);
        }
    }

    /// Stops; every sample.
    fn stop(self) -> Vec<(u64, Answer, Answer)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        Arc::try_unwrap(self.samples).unwrap().into_inner().unwrap()
    }
}

/// Open connections to the shop's NodePorts in `node`'s conntrack table (every state but TIME_WAIT
/// and CLOSE, which are connections that have ended), and every entry by state.
fn conntrack_open(deployed: &Deployed, node: &str) -> (u64, BTreeMap<String, u64>) {
    let out = deployed
        .exec_in_node(node, &["conntrack", "-L", "-p", "tcp"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    let mut open = 0;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let dport = words.iter().find_map(|w| w.strip_prefix("dport="));
        let shop = matches!(
            dport.and_then(|p| p.parse::<u16>().ok()),
            Some(HTTP_NODE_PORT | ECHO_NODE_PORT)
        );
        let Some(state) = words.get(3).filter(|_| shop) else {
            continue;
        };
        *states.entry(state.to_string()).or_default() += 1;
        if !matches!(*state, "TIME_WAIT" | "CLOSE") {
            open += 1;
        }
    }
    (open, states)
}

/// The leaving node's drain as its status shows it: (connections, checkedAt).
fn drain_count(deployed: &Deployed) -> Option<(u64, String)> {
    let draining = deployed.status(LEAVING).unwrap()?.draining?;
    Some((draining.connections?, draining.checked_at?))
}

/// Waits for a count taken after `seen` (the checkedAt last seen) that equals `want`; returns it with
/// how many counts it took. The first count listed after the change must show it: the one before it
/// may have been listed just before and taken by the agent just after (every 5 s, taken at its next
/// 100 ms tick), so at most two.
fn await_count(deployed: &Deployed, seen: Option<String>, want: u64) -> (String, usize) {
    let deadline = Instant::now() + WAIT;
    let mut last = seen;
    let mut counts = 0;
    loop {
        if let Some((connections, at)) = drain_count(deployed)
            && Some(&at) != last.as_ref()
        {
            counts += 1;
            if connections == want {
                return (at, counts);
            }
            assert!(
                counts < 2,
                "the second count after the change says {connections}, not {want}"
            );
            last = Some(at);
        }
        assert!(
            Instant::now() < deadline,
            "status.draining never counted {want}: {:?}",
            deployed.status(LEAVING).unwrap().and_then(|s| s.draining)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn seconds(ms: u64, since: u64) -> f64 {
    (ms as f64 - since as f64) / 1000.0
}

pub fn a_leaving_node_is_drained_by_a_load_balancer_with_no_failed_connection(suite: Suite) {
    let test = "a_leaving_node_is_drained_by_a_load_balancer_with_no_failed_connection";
    if !crate::common::lab_allowed(test) {
        return;
    }
    let mut description = example();
    let shop = ClusterDescription::from_yaml(SHOP).unwrap();
    description.services.extend(shop.services);
    description.endpoint_slices.extend(shop.endpoint_slices);
    let mut options = crate::common::options();
    options.balancer_ip = Some(BALANCER_IP);
    let mut deployed = Deployed::up(description, suite.config(), options).unwrap();
    let nodes: Vec<Ipv4Addr> = deployed.lab.nodes().iter().map(|n| n.ip).collect();
    let leaving_ip = deployed.lab.node(LEAVING).unwrap().ip;
    let config = BalancerConfig {
        frontends: vec![frontend(80, HTTP_NODE_PORT), frontend(7, ECHO_NODE_PORT)],
        nodes: nodes.clone(),
        health_port: HEALTH_PORT,
        interval: Duration::from_secs(1),
    };
    let balancer = deployed.lab.start_balancer(&config).unwrap();
    let ready = balancer.log().unwrap();
    for &node in &nodes {
        let health = ready.health_of(node);
        assert!(
            health.len() == 1 && health[0].healthy,
            "{node} is healthy from the first check (the agents serve :10256): {health:?}"
        );
    }

    let watch = HealthWatch::start(&deployed, leaving_ip);
    let http = format!("{BALANCER_IP}:80");
    let flows = [
        Flow::tcp(Place::Client, &http, &["shop-"]).unwrap(),
        Flow::tcp(Place::Client, &http, &["shop-"]).unwrap(),
    ];
    let traffic = Traffic::start(&deployed.lab, &flows).unwrap();
    let long_lived = open_long_lived_on_the_leaving_node(&deployed, &balancer, leaving_ip);
    let exchanges_before: Vec<u64> = long_lived.iter().map(LongLived::exchanges).collect();

    // 1. Karpenter's taint on node-b.
    traffic.phase("leaving");
    let written = epoch_ms(
        deployed
            .change_node(LEAVING, |node| {
                let spec = node.spec.get_or_insert_with(Default::default);
                spec.taints.get_or_insert_with(Vec::new).push(Taint {
                    key: KARPENTER_TAINT.into(),
                    effect: "NoSchedule".into(),
                    value: None,
                    time_added: None,
                });
            })
            .unwrap(),
    );
    let unhealthy_at = watch.first(503, written);
    let to_503 = seconds(unhealthy_at, written);
    assert!(
        to_503 <= 2.0,
        "/healthz answered 503 {to_503:.2} s after the plan was written (promised: 2 s)"
    );
    let (down, log) = health_change(&balancer, leaving_ip, false, written);
    // The balancer decides and logs under one lock: nothing picked after the change in the log's order.
    let down_index = log
        .events
        .iter()
        .position(|e| matches!(e, Event::Health { node, healthy: false, .. } if *node == leaving_ip))
        .unwrap();
    let picked_after: Vec<_> = log.events[down_index..]
        .iter()
        .filter(|e| matches!(e, Event::Picked { node, .. } if *node == leaving_ip))
        .collect();
    assert!(
        picked_after.is_empty(),
        "new connections to {LEAVING} after its check failed: {picked_after:?}"
    );
    let bound = config.interval + config.check_timeout();
    let noticed = seconds(down, unhealthy_at);
    assert!(
        noticed <= bound.as_secs_f64(),
        "the balancer marked {LEAVING} unhealthy {noticed:.2} s after /healthz said 503 (one check period \
         and a check's timeout: {:.1} s)",
        bound.as_secs_f64()
    );
    let before = log.picks_to(leaving_ip).len();
    assert!(before > 0, "the balancer used {LEAVING} before it left: {log:?}");
    let last_pick = log.picks_to(leaving_ip).last().map(|p| p.at_ms).unwrap_or(0);

    // Its drain: the three long-lived flows, once the short connections the balancer sent there before
    // the change have ended (its log says when each closed); the count and the kernel agree.
    balancer
        .wait_for("only the long-lived connections open on the node", WAIT, |log| {
            (log.open_to(leaving_ip).len() == LONG_LIVED).then_some(())
        })
        .unwrap();
    let seen = drain_count(&deployed).map(|(_, at)| at);
    let (mut seen, _) = await_count(&deployed, seen, LONG_LIVED as u64);
    let (open, states) = conntrack_open(&deployed, LEAVING);
    assert_eq!(open, LONG_LIVED as u64, "conntrack -L in {LEAVING}: {states:?}");
    let status = deployed.status(LEAVING).unwrap().unwrap();
    let drained = condition(&status, conditions::DRAINED);
    assert_eq!(
        drained.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some((conditions::status::FALSE, conditions::reasons::CONNECTIONS_REMAIN)),
        "{status:?}"
    );
    let mut counts = vec![format!("{LONG_LIVED} (conntrack: {states:?})")];
    for (index, flow) in long_lived.iter().enumerate() {
        assert!(
            flow.exchanges() > exchanges_before[index] && flow.failure().is_none(),
            "long-lived flow {index} kept exchanging through the leaving node: {} then {}, {:?}",
            exchanges_before[index],
            flow.exchanges(),
            flow.failure()
        );
    }
    let mut reports = Vec::new();
    for (index, flow) in long_lived.into_iter().enumerate() {
        let closed = Instant::now();
        let report = flow.close();
        assert_eq!(report.failure, None, "long-lived flow {index}: {report:?}");
        reports.push(report.exchanges);
        let want = (LONG_LIVED - index - 1) as u64;
        let (at, taken) = await_count(&deployed, Some(seen), want);
        seen = at;
        let (open, states) = conntrack_open(&deployed, LEAVING);
        assert_eq!(open, want, "conntrack -L in {LEAVING}: {states:?}");
        counts.push(format!(
            "{want} {:.1} s after a close ({taken} count; conntrack: {states:?})",
            closed.elapsed().as_secs_f64()
        ));
    }
    let status = deployed.status(LEAVING).unwrap().unwrap();
    let drained = condition(&status, conditions::DRAINED);
    assert_eq!(
        drained.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some((conditions::status::TRUE, conditions::reasons::NO_CONNECTIONS)),
        "{status:?}"
    );

    // 2. The taint removed: served again, and used again.
    traffic.phase("back");
    let written_back = epoch_ms(
        deployed
            .change_node(LEAVING, |node| {
                if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                    taints.retain(|t| t.key != KARPENTER_TAINT);
                }
            })
            .unwrap(),
    );
    let healthy_at = watch.first(200, written_back);
    let (up, _) = health_change(&balancer, leaving_ip, true, written_back);
    let used_again = balancer
        .wait_for("a new connection to the node back", WAIT, |log| {
            log.picks_to(leaving_ip).into_iter().find(|p| p.at_ms >= up)
        })
        .unwrap();
    let status = deployed.status(LEAVING).unwrap().unwrap();
    assert!(
        status.draining.is_none() && condition(&status, conditions::DRAINED).is_none(),
        "{status:?}"
    );

    let report = traffic.stop();
    let samples = watch.stop();
    let log = balancer.log().unwrap();
    let livez_not_200: Vec<_> = samples
        .iter()
        .filter(|(_, _, livez)| *livez != Answer::Status(200))
        .collect();
    assert!(
        livez_not_200.is_empty(),
        "/livez must stay 200: {livez_not_200:?}"
    );
    let backend = suite.backend;
    println!("{}", report.line(&format!("leaving node ({backend})")));
    assert_eq!(report.total().failed, 0, "{:?}", report.failures);
    for phase in ["before", "leaving", "back"] {
        assert!(report.phase(phase).connections > 0, "{phase}: {report:?}");
    }
    assert!(log.failures().is_empty(), "{:?}", log.failures());
    for &node in nodes.iter().filter(|&&n| n != leaving_ip) {
        assert_eq!(
            log.health_of(node).len(),
            1,
            "{node} stayed healthy: {:?}",
            log.health_of(node)
        );
    }
    println!(
        "leaving node ({backend}): /healthz 503 {to_503:.2} s after node-b's plan was written; /livez 200 \
         in all {} checks; the balancer marked node-b unhealthy {noticed:.2} s after that (check period \
         {} s), its last new connection there {:.2} s before; connections to node-b: {before} before, 0 \
         after",
        samples.len(),
        config.interval.as_secs(),
        seconds(down, last_pick)
    );
    println!(
        "leaving node ({backend}): draining.connections {}; Drained=True NoConnections; long-lived \
         exchanges {reports:?}, 0 failed",
        counts.join(" → ")
    );
    println!(
        "leaving node ({backend}): taint removed: /healthz 200 {:.2} s after the plan, the balancer marked \
         node-b healthy {:.2} s later and sent it a new connection {:.2} s after that",
        seconds(healthy_at, written_back),
        seconds(up, healthy_at),
        seconds(used_again.at_ms, up)
    );
}

/// Long-lived connections through the balancer until [`LONG_LIVED`] went to `node` (the balancer's
/// log says where each went); the others are closed.
fn open_long_lived_on_the_leaving_node(
    deployed: &Deployed,
    balancer: &Balancer,
    node: Ipv4Addr,
) -> Vec<LongLived> {
    let echo = SocketAddr::from((BALANCER_IP, 7));
    let mut kept = Vec::new();
    for _ in 0..30 {
        let flow = LongLived::open(&deployed.lab, &Place::Client, echo, Duration::from_millis(100)).unwrap();
        let client = flow.local_addr();
        let went = balancer
            .wait_for("the long-lived connection's node", WAIT, |log| {
                log.node_of(client)
            })
            .unwrap();
        if went == node {
            kept.push(flow);
            if kept.len() == LONG_LIVED {
                // A few exchanges through the node before it leaves.
                while kept.iter().any(|f| f.exchanges() < 5) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return kept;
            }
        } else {
            assert_eq!(flow.close().failure, None);
        }
    }
    panic!("the balancer sent fewer than {LONG_LIVED} of 30 connections to {node}");
}

/// Waits for the balancer's health change of `node` to `healthy` after `since`; when, and the log.
fn health_change(balancer: &Balancer, node: Ipv4Addr, healthy: bool, since: u64) -> (u64, BalancerLog) {
    let at = balancer
        .wait_for("the node's health change", WAIT, |log| {
            log.health_of(node)
                .into_iter()
                .find(|t| t.healthy == healthy && t.at_ms >= since)
                .map(|t| t.at_ms)
        })
        .unwrap();
    (at, balancer.log().unwrap())
}

fn condition<'a>(
    status: &'a switchyard_api::NodeForwardingPlanStatus,
    type_: &str,
) -> Option<&'a switchyard_api::PlanCondition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}
