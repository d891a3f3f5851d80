//! The cost of the per-Service traffic counters (issue 23) on nftables, on the real kernel, at
//! 10,000 Services × 5 endpoints: the extra time the counters add to the first full sync (the agent's
//! rendered `nft -f` text with and without the sets' `counter;`, loaded into fresh network namespaces,
//! alternating, median of 3), and a whole `/metrics` scrape of the traffic series (the netlink read of
//! every counted element, the accumulator, the OpenMetrics text): time, size, series; and the same
//! scrape on iptables-nft and iptables-legacy (`iptables-save -c` of nat and filter after the agent's
//! full payload).
//!
//! ```text
//! cargo bench -p switchyard-agent --bench traffic_counters          (root; SWITCHYARD_BENCH_SMOKE=1: 100 Services)
//! ```

mod common;

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use switchyard_agent::backend::HostFacts;
use switchyard_agent::counters::{Applied, AppliedPlan, CounterSource, CountersConfig, TrafficCollector};
use switchyard_agent::nftables::render_text;
use switchyard_agent::wiring::counters::HostCounters;
use switchyard_agent::xtables::mode::{IptablesMode, Variant};
use switchyard_api::{Backend, IpFamily};

use common::{
    Netns, bare_iptables_restore, iptables_full_payload, median, ms, root_bench_main, smoke, spec, target,
};

const SERVICES: u32 = 10_000;
const RUNS: usize = 3;

/// Loads `text` with `nft -f` into a fresh namespace; returns the time and the namespace.
fn load(text: &str, tag: &str) -> Result<(Duration, Netns), String> {
    let netns = Netns::new(tag)?;
    let dir =
        switchyard_test_support::scratch::dir(&format!("bench-counters-{tag}")).map_err(|e| e.to_string())?;
    let path = dir.path().join("table.nft");
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let result = netns.exec(&format!("nft -f {}", path.display()));
    let took = started.elapsed();
    drop(dir);
    result?;
    Ok((took, netns))
}

fn main() -> ExitCode {
    root_bench_main("traffic_counters", "traffic counters benchmark", || {
        let services = if smoke() { 100 } else { SERVICES };
        let spec = spec(services, Backend::Nftables);
        let counted = render_text(&spec, &HostFacts::default(), IpFamily::IPv4, &HashSet::new());
        let bare = counted.replace(" counter;", "");
        if bare.len() == counted.len() {
            return Err("the rendered table has no counted set".into());
        }
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for run in 0..RUNS {
            with.push(load(&counted, &format!("with-{run}"))?.0);
            without.push(load(&bare, &format!("without-{run}"))?.0);
        }
        let (with, without) = (median(with), median(without));
        let extra = (with.as_secs_f64() / without.as_secs_f64() - 1.0) * 100.0;
        println!(
            "{services} Services x 5: first full sync (nft -f) with counters {}, without {}: {extra:+.1}%",
            ms(with),
            ms(without)
        );
        target(
            &format!("counters' extra first-sync time at {services} Services (nft -f, median of {RUNS})"),
            &format!("{extra:+.1}%"),
            "≤ 2%",
            extra <= 2.0,
        );

        let (_, netns) = load(&counted, "scrape")?;
        let plan = AppliedPlan::default();
        plan.set(Some(Applied {
            spec: std::sync::Arc::new(spec),
            skip: std::sync::Arc::new(HashSet::new()),
            backend: Backend::Nftables,
        }));
        let (took, bytes, series) =
            netns.within(move || scrape(Box::new(HostCounters::new(plan, IptablesMode::Auto))))?;
        println!(
            "{services} Services x 5: /metrics scrape of the traffic series {} ({series} series, {:.1} MiB)",
            ms(took),
            bytes as f64 / (1024.0 * 1024.0)
        );
        if series < services as usize * 6 {
            return Err(format!("{series} series, wanted one per Service and endpoint"));
        }
        target(
            &format!("a full /metrics scrape of the traffic series at {services} Services"),
            &ms(took),
            "≤ 1 s",
            took <= Duration::from_secs(1),
        );

        // iptables, both variants: the same plan's full payload restored into a fresh namespace, then
        // scraped: the counters come from `iptables-save -c` of nat and filter.
        let spec = std::sync::Arc::new(common::spec(services, Backend::Iptables));
        let (_, payload) = iptables_full_payload(&spec);
        let text = String::from_utf8(payload).map_err(|e| e.to_string())?;
        for (variant, mode) in [
            (Variant::Nft, IptablesMode::Nft),
            (Variant::Legacy, IptablesMode::Legacy),
        ] {
            let plan = AppliedPlan::default();
            plan.set(Some(Applied {
                spec: spec.clone(),
                skip: std::sync::Arc::new(HashSet::new()),
                backend: Backend::Iptables,
            }));
            let netns = Netns::new(&format!("iptables-{variant}-scrape"))?;
            let text = text.clone();
            let (took, bytes, series) = netns.within(move || {
                bare_iptables_restore(variant, &text)?;
                scrape(Box::new(HostCounters::new(plan, mode)))
            })?;
            println!(
                "{services} Services x 5: /metrics scrape of the traffic series on iptables-{variant} {} ({series} series, {:.1} MiB)",
                ms(took),
                bytes as f64 / (1024.0 * 1024.0)
            );
            if series < services as usize * 6 {
                return Err(format!(
                    "iptables-{variant}: {series} series, wanted one per Service and endpoint"
                ));
            }
        }
        Ok(())
    })
}

/// A whole `/metrics` scrape of the traffic series `source` reads (median of [`RUNS`]): time, bytes of
/// OpenMetrics text, traffic series.
fn scrape(source: Box<dyn CounterSource>) -> Result<(Duration, usize, usize), String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(TrafficCollector::new(source, CountersConfig::default())));
    let mut samples = Vec::new();
    let mut text = String::new();
    for _ in 0..RUNS {
        text.clear();
        let started = Instant::now();
        prometheus_client::encoding::text::encode(&mut text, &registry).map_err(|e| e.to_string())?;
        samples.push(started.elapsed());
    }
    let series = text
        .lines()
        .filter(|l| l.starts_with("switchyard_") && l.contains("connections_total{"))
        .count();
    Ok((median(samples), text.len(), series))
}
