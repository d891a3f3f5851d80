//! Long-lived UDP flows on real packets (issue 51): kube-proxy's conntrack reconciler judges a flow by
//! its endpoint's address *and* port, lets terminating endpoints drain, and clears a Service whose
//! endpoints all turned unready (kubernetes#139628).
//!
//! ```text
//! default/udp-echo: UDP 10.96.5.53:5353, NodePort 30553 ─► udp-echo-1 10.244.2.61 (node-b, ready)
//!                                                           udp-echo-2 10.244.3.61 (node-c, not ready)
//! holding clients (one socket each, a datagram every 50 ms):
//!   nginx-pod-3 (node-c) ─► the ClusterIP          the outside client ─► 192.168.10.11:30553 (node-a)
//! 1. the slice's port 5353 → 5354, same addresses: both flows answered on 5354 within 1 s
//! 2. udp-echo-1 terminating (still serving), udp-echo-2 ready: both flows stay on udp-echo-1 (1.5 s)
//! 3. both unready: both flows are refused (the Service's REJECT) within 1 s
//! ```
//!
//! Each endpoint's pod serves 5353 from the start (the lab's server, answering with the pod's name); the
//! test starts a second server on 5354 in the same pod, answering `<pod>-new`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchyard_e2e::checks::{self, Check, answered};
use switchyard_e2e::{ChildHandle, ClusterDescription, Deployed, Place};

use super::{Suite, example, settled, slice_mut};

const UDP_ECHO: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: udp-echo, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.5.53
  clusterIPs: [10.96.5.53]
  externalTrafficPolicy: Cluster
  ports:
  - {name: echo, port: 5353, protocol: UDP, targetPort: 5353, nodePort: 30553}
  selector: {app: udp-echo}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: udp-echo-k2x9q
  namespace: default
  labels:
    kubernetes.io/service-name: udp-echo
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports: [{name: echo, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.244.2.61]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-b
  targetRef: {kind: Pod, name: udp-echo-1}
- addresses: [10.244.3.61]
  conditions: {ready: false, serving: false, terminating: false}
  nodeName: node-c
  targetRef: {kind: Pod, name: udp-echo-2}
"#;

const SLICE: &str = "udp-echo-k2x9q";
const NEW_PORT: u16 = 5354;

/// One UDP socket, connected (one source port: one conntrack entry), a datagram every 50 ms; prints
/// `<unix time> <who answered>`, `<unix time> refused` (ICMP port unreachable) or `<unix time> timeout`.
const HOLDING_UDP_CLIENT: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], int(sys.argv[2])))
s.settimeout(0.2)
while True:
    try:
        s.send(b"x")
        line = s.recv(256).split()[0].decode()
    except socket.timeout:
        line = "timeout"
    except ConnectionRefusedError:
        line = "refused"
    print(time.time(), line, flush=True)
    time.sleep(0.05)
"#;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What a holding client printed: (time, who answered or why not).
fn replies(client: &ChildHandle) -> Vec<(f64, String)> {
    client
        .stdout()
        .lines()
        .filter_map(|line| {
            let (at, what) = line.split_once(' ')?;
            Some((at.parse().ok()?, what.to_string()))
        })
        .collect()
}

/// When `client` first printed `what` at or after `since`.
fn first(client: &ChildHandle, what: &str, since: f64) -> Option<f64> {
    replies(client)
        .into_iter()
        .find(|(at, said)| *at >= since && said == what)
        .map(|(at, _)| at)
}

struct Flow {
    name: &'static str,
    client: ChildHandle,
}

impl Flow {
    fn hold(deployed: &Deployed, name: &'static str, from: Place, to: (&str, u16)) -> Self {
        let argv: Vec<String> = ["python3", "-c", HOLDING_UDP_CLIENT, to.0, &to.1.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let client = deployed.lab.spawn_in(&from, &argv).unwrap();
        let flow = Self { name, client };
        let since = now();
        let answered = settled(|| first(&flow.client, "udp-echo-1", since), Option::is_some);
        assert!(
            answered.is_some(),
            "{name}: never answered by udp-echo-1:\n{}",
            flow.client.stdout()
        );
        flow
    }

    /// When `what` first answered since `written` (the new plan files were written); panics with the
    /// flow's output when it never did.
    fn reached(&self, what: &str, written: f64) -> f64 {
        let at = settled(|| first(&self.client, what, written), Option::is_some);
        at.unwrap_or_else(|| {
            panic!(
                "{}: no `{what}` since the plan was written:\n{}",
                self.name,
                tail(&self.client.stdout())
            )
        })
    }

    /// Asserts that `what` answered within 1 s of `applied` (every agent reported the plan written at
    /// `written` applied); prints both delays.
    fn reached_within_a_second(&self, what: &str, written: f64, applied: f64) {
        let at = self.reached(what, written);
        eprintln!(
            "udp: {}: `{what}` {:.3} s after the plan was written, {:+.3} s after every agent applied it",
            self.name,
            at - written,
            at - applied
        );
        assert!(
            at - applied <= 1.0,
            "{}: `{what}` only {:.2} s after every agent applied the plan:\n{}",
            self.name,
            at - applied,
            tail(&self.client.stdout())
        );
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn with_udp_echo() -> ClusterDescription {
    let mut description = example();
    let extra = ClusterDescription::from_yaml(UDP_ECHO).unwrap();
    description.services.extend(extra.services);
    description.endpoint_slices.extend(extra.endpoint_slices);
    description
}

/// Sets the conditions of the endpoint at `address` in the udp-echo slice.
fn set_conditions(
    description: &mut ClusterDescription,
    address: &str,
    ready: bool,
    serving: bool,
    terminating: bool,
) {
    let slice = slice_mut(description, SLICE);
    for endpoint in slice.endpoints.as_mut().unwrap() {
        if endpoint.addresses[0] == address {
            let conditions = endpoint.conditions.get_or_insert_with(Default::default);
            conditions.ready = Some(ready);
            conditions.serving = Some(serving);
            conditions.terminating = Some(terminating);
        }
    }
}

/// Starts a second server in `pod`, on the new port, answering `<pod>-new`.
fn serve_new_port(deployed: &Deployed, pod: &str) -> ChildHandle {
    let ip = deployed.lab.pod(pod).unwrap().ip.to_string();
    let argv: Vec<String> = [
        deployed.lab.options().lab_binary.display().to_string(),
        "serve".into(),
        "--name".into(),
        format!("{pod}-new"),
        "--bind".into(),
        ip,
        "--udp".into(),
        NEW_PORT.to_string(),
    ]
    .to_vec();
    let server = deployed.lab.spawn_in(&Place::pod(pod), &argv).unwrap();
    server
        .wait_for_output(switchyard_e2e::serve::READY, Duration::from_secs(10))
        .unwrap();
    server
}

pub fn a_held_udp_flow_reaches_its_endpoints_new_port_keeps_a_terminating_one_and_ends_when_all_are_unready(
    suite: Suite,
) {
    let Some(mut deployed) = suite.deployed_with(
        "a_held_udp_flow_reaches_its_endpoints_new_port_keeps_a_terminating_one_and_ends_when_all_are_unready",
        with_udp_echo(),
    ) else {
        return;
    };
    let _servers = [
        serve_new_port(&deployed, "udp-echo-1"),
        serve_new_port(&deployed, "udp-echo-2"),
    ];
    let flows = [
        Flow::hold(
            &deployed,
            "ClusterIP from nginx-pod-3",
            Place::pod("nginx-pod-3"),
            ("10.96.5.53", 5353),
        ),
        Flow::hold(
            &deployed,
            "NodePort from the client",
            Place::Client,
            ("192.168.10.11", 30553),
        ),
    ];

    // 1. The target port changes, the addresses stay.
    let mut description = deployed.description().clone();
    let service = description
        .services
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("udp-echo"))
        .unwrap();
    service.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port = Some(
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(NEW_PORT.into()),
    );
    slice_mut(&mut description, SLICE).ports.as_mut().unwrap()[0].port = Some(NEW_PORT.into());
    let written = now();
    deployed.replan(description.clone()).unwrap();
    let applied = now();
    for flow in &flows {
        flow.reached_within_a_second("udp-echo-1-new", written, applied);
    }
    for node in ["node-a", "node-c"] {
        let status = settled(
            || deployed.status(node).unwrap().unwrap(),
            |status| status.conntrack_flows_cleared >= 1,
        );
        assert!(status.conntrack_flows_cleared >= 1, "{node}'s status: {status:?}");
    }

    // 2. udp-echo-1 terminates while serving and udp-echo-2 becomes ready: new flows go to udp-echo-2,
    // the held ones drain on udp-echo-1.
    set_conditions(&mut description, "10.244.2.61", false, true, true);
    set_conditions(&mut description, "10.244.3.61", true, true, false);
    deployed.replan(description.clone()).unwrap();
    let applied = now();
    let outcome = checks::run(
        &deployed.lab,
        &Check::udp(
            "new flows go to the ready endpoint",
            Place::pod("nginx-pod-3"),
            "10.96.5.53:5353",
            4,
            answered(&["udp-echo-2"]),
        ),
    )
    .unwrap();
    assert!(outcome.passed(), "{outcome}");
    std::thread::sleep(Duration::from_millis(1500));
    for flow in &flows {
        let since: Vec<(f64, String)> = replies(&flow.client)
            .into_iter()
            .filter(|(at, _)| *at >= applied)
            .collect();
        assert!(
            since.len() >= 5 && since.iter().all(|(_, who)| who == "udp-echo-1-new"),
            "{}: a flow to a terminating endpoint must stay on it:\n{}",
            flow.name,
            tail(&flow.client.stdout())
        );
    }

    // 3. Every endpoint unready, still listed (kubernetes#139628): the held flows meet the REJECT.
    set_conditions(&mut description, "10.244.2.61", false, false, true);
    set_conditions(&mut description, "10.244.3.61", false, false, false);
    let written = now();
    deployed.replan(description).unwrap();
    let applied = now();
    for flow in &flows {
        flow.reached_within_a_second("refused", written, applied);
    }
}
