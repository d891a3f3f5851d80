//! The traffic series on `/metrics`: read at each scrape, straight from the kernel.
//!
//! ```text
//! GET /metrics ─► TrafficCollector::encode ─► CounterSource::read ─► Accumulator::update
//!   ─► cap (Service and refusal series first, then endpoints) ─► OpenMetrics families:
//!      switchyard_service_connections_total{namespace,service,port,protocol,frontend}
//!      switchyard_endpoint_connections_total{namespace,service,port,protocol,endpoint}
//!      switchyard_service_refused_connections_total{namespace,service,port,protocol,reason}
//!      switchyard_agent_traffic_series_omitted, …_traffic_counter_read_failures_total,
//!      …_traffic_counter_read_seconds
//! ```
//!
//! Cardinality: one series per (Service port, frontend kind), per (Service port, endpoint) and per
//! (Service port, refusal reason) that the kernel counts; `--traffic-endpoint-series=false` drops the
//! per-endpoint ones, and at most `--traffic-max-series` are exported (the rest counted in
//! `…_traffic_series_omitted`). A failed read exports no traffic series that scrape (the failure is
//! counted and logged); the accumulator keeps its memory for the next one.

use crate::xtables::mode::IptablesMode;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{Accumulator, CounterSource, NodeCounter, Series, What};

/// The label a family adds to a series, or `None` when the series is not of that family.
type LabelOf = fn(&What) -> Option<(&'static str, String)>;

/// How many series to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountersConfig {
    /// Export the per-endpoint series.
    pub endpoints: bool,
    /// At most this many traffic series per scrape.
    pub max_series: usize,
    /// Which iptables the iptables backend's counters read (the backend's own `--iptables-mode`).
    pub iptables_mode: IptablesMode,
}

impl Default for CountersConfig {
    fn default() -> Self {
        Self {
            endpoints: true,
            max_series: 100_000,
            iptables_mode: IptablesMode::Auto,
        }
    }
}

struct Inner {
    source: Box<dyn CounterSource>,
    accumulator: Accumulator,
    failures: u64,
}

/// The prometheus-client collector of the traffic series.
pub struct TrafficCollector {
    config: CountersConfig,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for TrafficCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrafficCollector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One scrape's worth: the series to export and the collector's own health.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrape {
    /// The exported series (Services' and refusals first, then endpoints; each group sorted).
    pub series: Vec<Series>,
    /// Series over the cap (or per-endpoint ones when those are off: not counted).
    pub omitted: usize,
    /// Reads that failed since the start.
    pub failures: u64,
    /// How long the kernel read took.
    pub read_seconds: f64,
}

impl TrafficCollector {
    /// A collector reading `source`.
    pub fn new(source: Box<dyn CounterSource>, config: CountersConfig) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner {
                source,
                accumulator: Accumulator::default(),
                failures: 0,
            }),
        }
    }

    /// Reads the kernel once and returns what a scrape exports.
    pub fn scrape(&self) -> Scrape {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let read = inner.source.read();
        let read_seconds = started.elapsed().as_secs_f64();
        let all = match read {
            Ok(samples) => inner.accumulator.update(samples),
            Err(e) => {
                inner.failures += 1;
                tracing::warn!(error = %e, "reading the traffic counters failed");
                Vec::new()
            }
        };
        // The node-wide counters are a handful of series: never cut.
        let (node, all): (Vec<Series>, Vec<Series>) =
            all.into_iter().partition(|s| matches!(s.what, What::Node(_)));
        let (mut series, endpoints): (Vec<Series>, Vec<Series>) = all
            .into_iter()
            .partition(|s| !matches!(s.what, What::Endpoint(_)));
        if self.config.endpoints {
            series.extend(endpoints);
        }
        let omitted = series.len().saturating_sub(self.config.max_series);
        series.truncate(self.config.max_series);
        series.extend(node);
        Scrape {
            series,
            omitted,
            failures: inner.failures,
            read_seconds,
        }
    }
}

impl Collector for TrafficCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let scrape = self.scrape();
        let families: [(&str, &str, LabelOf); 3] = [
            (
                "switchyard_service_connections",
                "New connections to a Service port through one kind of frontend, counted by the kernel on this node",
                |what| match what {
                    What::Frontend(f) => Some(("frontend", f.label().to_string())),
                    _ => None,
                },
            ),
            (
                "switchyard_endpoint_connections",
                "New connections this node sent to one endpoint of a Service port, counted by the kernel",
                |what| match what {
                    What::Endpoint(e) => Some(("endpoint", e.clone())),
                    _ => None,
                },
            ),
            (
                "switchyard_service_refused_connections",
                "Connections to a Service port this node refused (no-endpoints: REJECT; no-local-endpoints, source-range: DROP)",
                |what| match what {
                    What::Refused(r) => Some(("reason", r.label().to_string())),
                    _ => None,
                },
            ),
        ];
        for (name, help, label) in families {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            for series in &scrape.series {
                let Some((key, value)) = label(&series.what) else {
                    continue;
                };
                let (namespace, service, port) = series.service.parts();
                let labels = [
                    ("namespace", namespace),
                    ("service", service),
                    ("port", port),
                    ("protocol", series.service.protocol.lower()),
                    (key, value.as_str()),
                ];
                ConstCounter::new(series.value).encode(family.encode_family(&labels)?)?;
            }
        }
        for counter in [NodeCounter::InvalidDropped, NodeCounter::LocalhostNodePorts] {
            let total: u64 = scrape
                .series
                .iter()
                .filter(|s| s.what == What::Node(counter))
                .map(|s| s.value)
                .sum();
            // Only where the kernel has the rule (the iptables backend; localhost NodePorts opted in).
            if scrape.series.iter().any(|s| s.what == What::Node(counter)) {
                let (name, help) = counter.metric();
                let value = ConstCounter::new(total);
                value.encode(encoder.encode_descriptor(name, help, None, value.metric_type())?)?;
            }
        }
        let omitted = ConstGauge::new(scrape.omitted as i64);
        omitted.encode(encoder.encode_descriptor(
            "switchyard_agent_traffic_series_omitted",
            "Traffic series not exported by the last scrape: over --traffic-max-series",
            None,
            omitted.metric_type(),
        )?)?;
        let failures = ConstCounter::new(scrape.failures);
        failures.encode(encoder.encode_descriptor(
            "switchyard_agent_traffic_counter_read_failures",
            "Scrapes whose read of the kernel's traffic counters failed",
            None,
            failures.metric_type(),
        )?)?;
        let seconds = ConstGauge::new(scrape.read_seconds);
        seconds.encode(encoder.encode_descriptor(
            "switchyard_agent_traffic_counter_read_seconds",
            "How long the last read of the kernel's traffic counters took",
            None,
            seconds.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::{Frontend, Refusal, Sample, ServicePort};
    use crate::error::Error;
    use prometheus_client::registry::Registry;
    use switchyard_api::Protocol;

    /// Hands out prepared reads (`None`: a failed one), then fails.
    struct Reads(Vec<Option<Vec<Sample>>>);

    impl CounterSource for Reads {
        fn read(&mut self) -> Result<Vec<Sample>, Error> {
            if self.0.is_empty() {
                return Err(Error::NftNetlink {
                    operation: "reading counters".into(),
                    reason: "gone".into(),
                });
            }
            self.0.remove(0).ok_or_else(|| Error::NftNetlink {
                operation: "reading counters".into(),
                reason: "busy".into(),
            })
        }
    }

    fn sample(what: What, element: u64, packets: u64) -> Sample {
        Sample {
            service: ServicePort {
                name: "ns1/web:http".into(),
                protocol: Protocol::TCP,
            },
            what,
            element,
            packets,
        }
    }

    fn read() -> Vec<Sample> {
        vec![
            sample(What::Frontend(Frontend::ClusterIp), 1, 7),
            sample(What::Frontend(Frontend::NodePort), 2, 3),
            sample(What::Endpoint("10.244.1.5:8080".into()), 3, 6),
            sample(What::Endpoint("10.244.2.5:8080".into()), 4, 4),
            sample(What::Refused(Refusal::SourceRange), 5, 2),
        ]
    }

    fn text(collector: TrafficCollector) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(collector));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn a_scrape_exports_every_family_with_its_labels() {
        let out = text(TrafficCollector::new(
            Box::new(Reads(vec![Some(read())])),
            CountersConfig::default(),
        ));
        for line in [
            r#"switchyard_service_connections_total{namespace="ns1",service="web",port="http",protocol="tcp",frontend="clusterIP"} 7"#,
            r#"switchyard_service_connections_total{namespace="ns1",service="web",port="http",protocol="tcp",frontend="nodePort"} 3"#,
            r#"switchyard_endpoint_connections_total{namespace="ns1",service="web",port="http",protocol="tcp",endpoint="10.244.1.5:8080"} 6"#,
            r#"switchyard_service_refused_connections_total{namespace="ns1",service="web",port="http",protocol="tcp",reason="source-range"} 2"#,
            "switchyard_agent_traffic_series_omitted 0",
            "switchyard_agent_traffic_counter_read_failures_total 0",
        ] {
            assert!(out.contains(line), "missing {line} in\n{out}");
        }
    }

    #[test]
    fn the_cap_keeps_service_series_first_and_counts_the_rest() {
        let collector = TrafficCollector::new(
            Box::new(Reads(vec![Some(read()), Some(read())])),
            CountersConfig {
                endpoints: true,
                max_series: 3,
                ..CountersConfig::default()
            },
        );
        let scrape = collector.scrape();
        assert_eq!(scrape.omitted, 2);
        assert!(scrape.series.iter().all(|s| !matches!(s.what, What::Endpoint(_))));
        let off = TrafficCollector::new(
            Box::new(Reads(vec![Some(read())])),
            CountersConfig {
                endpoints: false,
                max_series: 100,
                ..CountersConfig::default()
            },
        );
        let scrape = off.scrape();
        assert_eq!((scrape.series.len(), scrape.omitted), (3, 0));
    }

    #[test]
    fn a_failed_read_is_counted_and_the_next_one_continues_the_series() {
        let mut grown = read();
        grown[0].packets = 9;
        let collector = TrafficCollector::new(
            Box::new(Reads(vec![Some(read()), None, Some(grown)])),
            CountersConfig::default(),
        );
        assert_eq!(collector.scrape().series[0].value, 7);
        let failed = collector.scrape();
        assert_eq!((failed.series.len(), failed.failures), (0, 1));
        assert_eq!(
            collector.scrape().series[0].value,
            9,
            "the series goes on after a failed read"
        );
        let failed = collector.scrape();
        assert_eq!((failed.series.len(), failed.failures), (0, 2));
    }
}
