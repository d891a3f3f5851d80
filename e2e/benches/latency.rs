//! Data plane: first-connection latency to a ClusterIP through the agent's rules, in the lab, at 100 /
//! 1,000 / 10,000 services (5 endpoints each), for the iptables and the nftables backend. Needs root.
//!
//! One node, one backend pod, one client pod. The measured Service sorts last, so its rule is the last
//! one a new connection meets in iptables' linear `SWYD-SERVICES` chain (the worst case; nftables finds
//! it with one hash lookup per endpoint-count class wherever it sorts); every other Service gets
//! synthetic endpoints that never receive traffic. Each sample is a new TCP connection (conntrack NEW:
//! the packet walks the rules) timed from `connect` to the backend's first byte.
//!
//! `cargo bench -p switchyard-e2e --bench latency` (`SWITCHYARD_BENCH_SMOKE=1` for a tiny run; under
//! `cargo test` it runs as that smoke check; `SWITCHYARD_BENCH_BACKENDS=nftables` for one backend).
//! At the full sizes it prints `target first-connection latency (nftables) … met|MISSED` (p50 at 10,000
//! Services within 10% of p50 at 100) and records it, with the iptables figures, for `make bench`'s
//! summary table (the file named by SWITCHYARD_BENCH_SUMMARY).

use std::{
    io::Read,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use switchyard_api::{
    Backend, ServicePlan, revision,
    testing::{EntryExt, entry, ep},
};
use switchyard_e2e::{ClusterDescription, Deployed, LabOptions, netns};

const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-a}
  spec: {podCIDR: 10.244.1.0/24}
  status: {addresses: [{type: InternalIP, address: 192.168.10.11}]}
- apiVersion: v1
  kind: Service
  metadata: {name: measured, namespace: zzz}
  spec: {clusterIP: 10.96.255.254, ports: [{name: http, port: 80, targetPort: 8080}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: measured-1, namespace: zzz, labels: {kubernetes.io/service-name: measured}}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - {addresses: [10.244.1.10], nodeName: node-a, targetRef: {kind: Pod, name: backend}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: client-1, namespace: zzz, labels: {kubernetes.io/service-name: client}}
  addressType: IPv4
  ports: [{name: x, port: 9, protocol: TCP}]
  endpoints:
  - {addresses: [10.244.1.20], nodeName: node-a, targetRef: {kind: Pod, name: client}}
"#;

fn synthetic(i: usize) -> ServicePlan {
    (0..5).fold(
        entry(
            &format!("bench/svc-{i:05}:http"),
            &format!("10.100.{}.{}", i / 250, i % 250 + 1),
            80,
        ),
        |service, j| {
            service.with(ep(
                &format!("10.250.{}.{}", (i * 5 + j) / 250 % 250, (i * 5 + j) % 250 + 1),
                8080,
            ))
        },
    )
}

#[path = "../../benches/summary.rs"]
mod summary;
use summary::{record, target};

/// The p50s at 100 and 10,000 Services against the targets (nftables: 10k within 10% of 100).
fn judge(backend: Backend, p50: &[(usize, Duration)]) {
    let at = |n: usize| {
        p50.iter()
            .find(|(size, _)| *size == n)
            .map(|(_, d)| d.as_secs_f64() * 1e6)
    };
    let (Some(small), Some(large)) = (at(100), at(10_000)) else {
        return;
    };
    let value = format!("p50 {large:.0} µs at 10,000 vs {small:.0} µs at 100 Services");
    if backend == Backend::Nftables {
        target(
            "first-connection latency (nftables), 10,000 Services",
            &value,
            "p50 within 10% of 100 Services",
            large <= small * 1.10,
        );
    } else {
        record(
            &format!("first-connection latency ({backend}), 10,000 Services"),
            &value,
            "-",
            "-",
        );
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn measure(deployed: &Deployed, samples: usize) -> Result<Vec<Duration>, String> {
    let client = deployed
        .lab
        .netns(&switchyard_e2e::Place::pod("client"))
        .map_err(|e| e.to_string())?
        .to_string();
    let target: SocketAddr = "10.96.255.254:80".parse().map_err(|e| format!("{e}"))?;
    netns::in_netns(&client, move || {
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let start = Instant::now();
            let mut stream =
                TcpStream::connect_timeout(&target, Duration::from_secs(2)).map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).map_err(|e| e.to_string())?;
            times.push(start.elapsed());
        }
        Ok::<_, String>(times)
    })
    .map_err(|e| e.to_string())?
}

fn run() -> Result<(), String> {
    let smoke =
        std::env::var_os("SWITCHYARD_BENCH_SMOKE").is_some() || !std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if smoke { &[10] } else { &[100, 1_000, 10_000] };
    let samples = if smoke { 50 } else { 1_000 };
    if !switchyard_e2e::preflight::is_root() {
        println!("skip: the latency benchmark builds a lab and needs root");
        record(
            "first-connection latency benchmark",
            "skipped: needs root",
            "-",
            "-",
        );
        return Ok(());
    }
    let backends: Vec<Backend> = match std::env::var("SWITCHYARD_BENCH_BACKENDS") {
        Ok(list) => list
            .split(',')
            .map(|b| Backend::parse(b.trim()).ok_or_else(|| format!("unknown backend {b:?}")))
            .collect::<Result<_, _>>()?,
        Err(_) => vec![Backend::Iptables, Backend::Nftables],
    };
    for backend in backends {
        let p50 = measure_backend(backend, sizes, samples)?;
        if !smoke {
            judge(backend, &p50);
        }
    }
    Ok(())
}

/// Prints the backend's table; returns the p50 per number of Services.
fn measure_backend(
    backend: Backend,
    sizes: &[usize],
    samples: usize,
) -> Result<Vec<(usize, Duration)>, String> {
    println!(
        "first-connection latency to a ClusterIP, {backend} backend, {samples} new connections each (µs)"
    );
    println!(
        "{:>8} | {:>8} {:>8} {:>8} {:>10}",
        "services", "p50", "p90", "p99", "apply (s)"
    );
    let description = ClusterDescription::from_yaml(CLUSTER).map_err(|e| e.to_string())?;
    let mut config =
        switchyard_controller::Config::parse("clusterCIDRs: [10.244.0.0/16]\n").map_err(|e| e.join("; "))?;
    config.default_backend = backend;
    let deployed = Deployed::up(
        description,
        config,
        LabOptions::with_binary(env!("CARGO_BIN_EXE_switchyard-lab")),
    )
    .map_err(|e| e.to_string())?;
    let base = deployed.plan("node-a").map_err(|e| e.to_string())?.remove(0);
    let mut p50 = Vec::new();
    for &size in sizes {
        let mut plan = base.clone();
        plan.spec
            .services
            .extend((0..size.saturating_sub(1)).map(|i| std::sync::Arc::new(synthetic(i))));
        plan.spec.services.sort_by(|a, b| a.key().cmp(&b.key()));
        plan.spec.summary = switchyard_api::PlanSummary::of(&plan.spec.services);
        plan.spec.revision = revision::compute(&plan.spec).map_err(|e| e.to_string())?;
        let text = serde_json::to_string(&plan).map_err(|e| e.to_string())?;
        let start = Instant::now();
        deployed
            .write_raw_plan("node-a", &text)
            .map_err(|e| e.to_string())?;
        deployed
            .wait_applied(Duration::from_secs(900))
            .map_err(|e| e.to_string())?;
        let apply = start.elapsed();
        // Warm up (ARP, code paths), then measure.
        measure(&deployed, 20)?;
        let mut times = measure(&deployed, samples)?;
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{:>8} | {:>8.0} {:>8.0} {:>8.0} {:>10.1}",
            plan.spec.services.len(),
            us(percentile(&times, 0.5)),
            us(percentile(&times, 0.9)),
            us(percentile(&times, 0.99)),
            apply.as_secs_f64()
        );
        p50.push((plan.spec.services.len(), percentile(&times, 0.5)));
    }
    Ok(p50)
}

fn main() {
    if let Err(error) = run() {
        eprintln!("latency benchmark failed: {error}");
        std::process::exit(1);
    }
}
