//! kube-proxy's health contract, as cloud load balancers use it: `:10256/healthz` answers 503 as soon
//! as the node's plan says it is leaving while `/livez` stays 200, the status counts the connections
//! still going through the node until they end, and a port another program holds (kube-proxy during a
//! migration) is retried, reported, and taken once free.

use std::time::{Duration, Instant};

use switchyard_agent::conntrack::{FakeConntrack, Flow, Tuple};
use switchyard_agent::run::grace::GracePeriod;
use switchyard_agent::status_writer::WriterConfig;
use switchyard_agent::xtables::fake::FakeIptables;
use switchyard_api::conditions::{DEGRADED, DRAINED, reasons, status};
use switchyard_api::{Leaving, NodeForwardingPlanStatus, Protocol};
use switchyard_test_support::fake_apiserver::FakeApiServer;

use crate::fixtures::{base, local_addrs};
use crate::live_support::{
    Agent, NODE, config, get, metric, put_plan, stored_status, syncer, wait, wait_http,
};

fn writer() -> WriterConfig {
    WriterConfig {
        min_interval: Duration::from_millis(100),
        progress_interval: Duration::from_millis(300),
        retry_min: Duration::from_millis(100),
        retry_max: Duration::from_millis(400),
    }
}

/// A TCP flow from an outside client to the node's NodePort, DNATed to `endpoint`.
fn through_node_port(client_port: u16, endpoint: &str) -> Flow {
    let ip = |s: &str| s.parse().unwrap();
    Flow {
        original: Tuple {
            src: ip("198.51.100.7"),
            dst: ip("192.168.10.11"),
            sport: client_port,
            dport: 30080,
        },
        reply: Tuple {
            src: ip(endpoint),
            dst: ip("192.168.10.11"),
            sport: 8080,
            dport: client_port,
        },
    }
}

fn condition<'a>(status: &'a NodeForwardingPlanStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_node_fails_healthz_at_once_keeps_livez_and_reports_its_drain() {
    let server = FakeApiServer::new();
    let serving = base();
    put_plan(&server, &serving);
    let iptables = FakeIptables::new(&local_addrs());
    let conntrack = FakeConntrack::default();
    // Two long-lived connections through the NodePort, and one from a pod to a ClusterIP (not counted).
    conntrack.add_tracked(Protocol::TCP, through_node_port(41000, "10.244.2.5"));
    conntrack.add_tracked(Protocol::TCP, through_node_port(41001, "10.244.3.5"));
    let pod_flow = Flow {
        original: Tuple {
            dst: "10.96.0.2".parse().unwrap(),
            dport: 443,
            ..through_node_port(41002, "10.244.2.6").original
        },
        ..through_node_port(41002, "10.244.2.6")
    };
    conntrack.add_tracked(Protocol::TCP, pod_flow);
    let agent = Agent::start_api(
        server.client(),
        syncer(&iptables).with_conntrack(Box::new(conntrack.clone())),
        config(None, GracePeriod::Never),
        writer(),
    )
    .await;
    wait("kube-proxy's health port", || agent.healthz_addr().is_some()).await;
    let health = agent.healthz_addr().unwrap();
    wait("the first sync", || {
        stored_status(&server, NODE)
            .is_some_and(|s| s.observed_revision.as_deref() == Some(&serving.revision))
    })
    .await;
    let body = wait_http("a serving node", health, "/healthz", 200).await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (json["nodeEligible"].as_bool(), json["healthy"].as_bool()),
        (Some(true), Some(true)),
        "{body}"
    );
    assert_eq!(json["status"]["IPv4"]["healthy"], true, "{body}");
    assert!(stored_status(&server, NODE).is_some_and(|s| s.draining.is_none()));

    // The Karpenter taint reaches the plan.
    let mut leaving = serving.clone();
    leaving.leaving = Some(Leaving {
        reason: "taint:karpenter.sh/disrupted".into(),
        since: None,
        drain_grace_seconds: 600,
    });
    switchyard_api::testing::finish(&mut leaving);
    let written = Instant::now();
    put_plan(&server, &leaving);
    let body = wait_http("/healthz to fail", health, "/healthz", 503).await;
    let failed_after = written.elapsed();
    assert!(
        failed_after < Duration::from_secs(2),
        "503 after {failed_after:?}"
    );
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (json["nodeEligible"].as_bool(), json["healthy"].as_bool()),
        (Some(false), Some(false)),
        "{body}"
    );
    let (code, body) = get(health, "/livez").await;
    assert_eq!(code, 200, "liveness never fails for leaving: {body}");
    assert!(!body.contains("nodeEligible"), "{body}");
    assert_eq!(
        get(agent.addr(), "/livez").await.0,
        200,
        "the DaemonSet's probe on --metrics-bind"
    );

    wait("the drain counted in status", || {
        stored_status(&server, NODE)
            .is_some_and(|s| s.draining.as_ref().and_then(|d| d.connections) == Some(2))
    })
    .await;
    let s = stored_status(&server, NODE).unwrap();
    let draining = s.draining.as_ref().unwrap();
    assert_eq!(draining.reason, "taint:karpenter.sh/disrupted");
    assert_eq!(
        draining
            .services
            .iter()
            .map(|s| (s.service.as_str(), s.connections))
            .collect::<Vec<_>>(),
        vec![("ns1/web", 2)]
    );
    assert_eq!(
        condition(&s, DRAINED),
        Some((status::FALSE, reasons::CONNECTIONS_REMAIN))
    );
    let text = wait_metrics(&agent, |t| {
        metric(t, "switchyard_agent_drain_connections") == Some(2.0)
    })
    .await;
    assert_eq!(metric(&text, "switchyard_agent_leaving"), Some(1.0), "{text}");
    assert!(
        text.contains(r#"switchyard_agent_drain_service_connections{namespace="ns1",service="web"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"switchyard_agent_healthz_total{code="503"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"switchyard_agent_livez_total{code="200"}"#),
        "{text}"
    );

    // The long-lived connections end: the next count says so, and the node is drained.
    for flow in conntrack.tracked() {
        conntrack.remove_tracked(&flow.1);
    }
    wait("Drained", || {
        stored_status(&server, NODE)
            .is_some_and(|s| condition(&s, DRAINED) == Some((status::TRUE, reasons::NO_CONNECTIONS)))
    })
    .await;
    assert_eq!(
        stored_status(&server, NODE)
            .unwrap()
            .draining
            .unwrap()
            .connections,
        Some(0)
    );

    // The taint is removed: eligible again, the drain and its condition gone.
    put_plan(&server, &serving);
    wait_http("/healthz back", health, "/healthz", 200).await;
    wait("the drain gone from status", || {
        stored_status(&server, NODE).is_some_and(|s| s.draining.is_none() && condition(&s, DRAINED).is_none())
    })
    .await;
    agent.stop().await;
}

async fn wait_metrics(agent: &Agent, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = get(agent.addr(), "/metrics").await;
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "metrics never matched:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_health_port_is_retried_reported_and_taken_once_free() {
    // kube-proxy still runs during a migration: it holds the port.
    let kube_proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = kube_proxy.local_addr().unwrap();
    let server = FakeApiServer::new();
    put_plan(&server, &base());
    let iptables = FakeIptables::new(&local_addrs());
    let mut settings = config(None, GracePeriod::Never);
    settings.healthz_bind = Some(port);
    let agent = Agent::start(server.client(), &iptables, settings, writer()).await;
    wait("Degraded PortUnavailable, the plan applied all the same", || {
        stored_status(&server, NODE).is_some_and(|s| {
            condition(&s, DEGRADED) == Some((status::TRUE, reasons::PORT_UNAVAILABLE))
                && s.observed_revision.is_some()
        })
    })
    .await;
    let s = stored_status(&server, NODE).unwrap();
    let message = &s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap().message;
    assert!(
        message.contains(&port.to_string()) && message.contains("kube-proxy"),
        "{message}"
    );
    let bound = format!(
        r#"switchyard_agent_kube_proxy_port_bound{{port="{}"}} 0"#,
        port.port()
    );
    wait_metrics(&agent, |t| t.contains(&bound)).await;

    drop(kube_proxy);
    let freed = Instant::now();
    wait("the port taken", || agent.healthz_addr() == Some(port)).await;
    let took = freed.elapsed();
    assert!(took < Duration::from_secs(3), "taken {took:?} after it was free");
    wait_http("/livez on the port", port, "/livez", 200).await;
    wait("Degraded cleared", || {
        stored_status(&server, NODE)
            .is_some_and(|s| condition(&s, DEGRADED) == Some((status::FALSE, reasons::HEALTHY)))
    })
    .await;
    agent.stop().await;
}
