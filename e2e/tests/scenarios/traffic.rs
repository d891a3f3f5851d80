//! Per-Service traffic counters on real packets: connections through each frontend, to each endpoint and
//! refused, as the agent's `/metrics`, `top` and `explain --kernel` report them (nftables: element and
//! rule counters over netlink; iptables: rule counters from `iptables-save -c`).

use switchyard_e2e::{Deployed, Place};

use super::Suite;

/// Opens `count` TCP connections to `ip port` one after another, each closed at once; prints how many
/// were answered. A connection not answered within 0.5 s is given up (one SYN: dropped connections
/// count once).
const COUNTING_CLIENT: &str = r#"
import socket, sys
ip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
answered = 0
for _ in range(count):
    try:
        socket.create_connection((ip, port), timeout=0.5).close()
        answered += 1
    except OSError:
        pass
print("answered", answered, flush=True)
"#;

fn connect_times(deployed: &Deployed, from: &Place, target: (&str, u16), count: usize) -> usize {
    let argv: Vec<String> = [
        "python3",
        "-c",
        COUNTING_CLIENT,
        target.0,
        &target.1.to_string(),
        &count.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = deployed.lab.exec_in(from, &argv).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("answered ")?.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the client printed no count: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// The agent's `/metrics` on `node`.
fn scrape(deployed: &Deployed, node: &str) -> String {
    let out = deployed
    .exec_in_node(
        node,
        &[
            "python3",
            "-c",
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:10263/metrics', timeout=5).read().decode())",
        ],
    )
    .unwrap();
    assert!(
        out.status.success(),
        "scraping {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The sum of the series of `metric` whose labels contain every one of `labels` (`key="value"`).
fn series_sum(text: &str, metric: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

pub fn traffic_counters_count_every_connection_by_frontend_endpoint_and_refusal(suite: Suite) {
    let Some(mut deployed) =
        suite.deployed("traffic_counters_count_every_connection_by_frontend_endpoint_and_refusal")
    else {
        return;
    };
    let apache = ["service=\"apache\"", "namespace=\"default\""];
    let service = "switchyard_service_connections_total";
    let endpoint = "switchyard_endpoint_connections_total";
    let refused = "switchyard_service_refused_connections_total";
    // 20 connections from nginx-pod-3 (node-c) to apache's ClusterIP: 20 on the Service's clusterIP
    // series and 20 across its endpoints' series, on node-c.
    let pod_c = Place::pod("nginx-pod-3");
    assert_eq!(connect_times(&deployed, &pod_c, ("10.96.0.80", 80), 20), 20);
    let text = scrape(&deployed, "node-c");
    assert_eq!(
        series_sum(&text, service, &[apache[0], apache[1], "frontend=\"clusterIP\""]),
        20,
        "{text}"
    );
    assert_eq!(series_sum(&text, endpoint, &apache), 20, "{text}");
    assert!(
        text.contains(r#"endpoint="10.244.1.10:80""#) && text.contains(r#"endpoint="10.244.2.10:80""#),
        "both apache endpoints have a series: {text}"
    );
    // The NodePort and the LoadBalancer IP of web-lb (eTP=Local, web-1 on node-a) from the client.
    assert_eq!(
        connect_times(&deployed, &Place::Client, ("192.168.10.11", 30080), 3),
        3
    );
    assert_eq!(
        connect_times(&deployed, &Place::Client, ("203.0.113.10", 80), 4),
        4
    );
    let text = scrape(&deployed, "node-a");
    let web = "service=\"web-lb\"";
    assert_eq!(
        series_sum(&text, service, &[web, "frontend=\"nodePort\""]),
        3,
        "{text}"
    );
    assert_eq!(
        series_sum(&text, service, &[web, "frontend=\"loadBalancer\""]),
        4,
        "{text}"
    );
    // Refused: node-c has no web-lb endpoint (eTP=Local: DROP); and a source range that excludes the
    // client drops its LoadBalancer connections on node-a.
    assert_eq!(
        connect_times(&deployed, &Place::Client, ("192.168.10.13", 30080), 2),
        0
    );
    let text = scrape(&deployed, "node-c");
    assert_eq!(
        series_sum(&text, refused, &[web, "reason=\"no-local-endpoints\""]),
        2,
        "{text}"
    );
    let mut description = deployed.description().clone();
    description
        .services
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some("web-lb"))
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    deployed.replan(description.clone()).unwrap();
    assert_eq!(
        connect_times(&deployed, &Place::Client, ("203.0.113.10", 80), 3),
        0
    );
    let text = scrape(&deployed, "node-a");
    assert_eq!(
        series_sum(&text, refused, &[web, "reason=\"source-range\""]),
        3,
        "{text}"
    );
    // A partial sync of another Service (catalog loses an endpoint) leaves apache's counts alone, and
    // they go on counting.
    let catalog = description
        .endpoint_slices
        .iter_mut()
        .find(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .map(String::as_str)
                == Some("catalog")
        })
        .unwrap();
    catalog.endpoints.as_mut().unwrap().pop();
    deployed.replan(description).unwrap();
    let text = scrape(&deployed, "node-c");
    assert_eq!(
        series_sum(&text, endpoint, &apache),
        20,
        "after another Service's partial sync: {text}"
    );
    assert_eq!(connect_times(&deployed, &pod_c, ("10.96.0.80", 80), 5), 5);
    let text = scrape(&deployed, "node-c");
    assert_eq!(
        series_sum(&text, service, &[apache[0], apache[1], "frontend=\"clusterIP\""]),
        25,
        "{text}"
    );
    assert_eq!(series_sum(&text, endpoint, &apache), 25, "{text}");
    // `top` lists apache first on node-c, from the kernel's own counts (its elements were not
    // rewritten: 25).
    let binary = deployed.lab.options().lab_binary.display().to_string();
    let plan = deployed.plan_path("node-c").display().to_string();
    let out = deployed
        .exec_in_node(
            "node-c",
            &[&binary, "agent", "top", "--plan", &plan, "--limit", "3"],
        )
        .unwrap();
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "top: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // On iptables too: the source-range change of web-lb rewrote only node-c's filter rules (web-lb has
    // no endpoint there, so its frontends there are DROP rules), never apache's nat frontend rule.
    let first = top.lines().nth(1).unwrap_or_default();
    assert!(
        first.starts_with("default/apache/tcp") && first.split_whitespace().nth(1) == Some("25"),
        "{top}"
    );
    // `explain --kernel` puts each endpoint's count beside its share: 25 between them.
    let out = deployed
        .exec_in_node(
            "node-c",
            &[
                &binary,
                "agent",
                "explain",
                "--plan",
                &plan,
                "--to",
                "10.96.0.80:80",
                "--from",
                "node",
                "--kernel",
            ],
        )
        .unwrap();
    let explained = String::from_utf8_lossy(&out.stdout);
    let counted: u64 = explained
        .split(" connections counted")
        .filter_map(|before| before.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, 25, "{explained}");
}
