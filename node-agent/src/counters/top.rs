//! `switchyard-agent top`: the busiest Service ports on this node, from one read of the kernel's
//! counters.
//!
//! ```text
//! [Series] (one read: Accumulator::update of a fresh accumulator = the kernel's own counts)
//!   ─► per Service port: connections (Σ frontends), by frontend, refused (Σ reasons), endpoints
//!   ─► sorted by connections, then refused, then name ─► the first `limit` ─► a table
//! ```
//!
//! A fresh process has no memory of earlier reads, so the counts are the kernel's: connections since
//! each element was last written (a Service whose endpoints changed counts again from then).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Frontend, Series, ServicePort, What};

/// One Service port's line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopRow {
    /// `namespace/name:port`.
    pub service: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    /// New connections through any frontend.
    pub connections: u64,
    /// By frontend kind (label → count), only those with a series.
    pub frontends: BTreeMap<&'static str, u64>,
    /// Refused, all reasons.
    pub refused: u64,
    /// Endpoints with a series, and the busiest one (`ip:port`, count).
    pub endpoints: usize,
    /// The endpoint with the most connections.
    pub busiest_endpoint: Option<(String, u64)>,
}

/// The `limit` busiest Service ports of `series`.
pub fn busiest(series: &[Series], limit: usize) -> Vec<TopRow> {
    let mut rows: BTreeMap<&ServicePort, TopRow> = BTreeMap::new();
    for s in series {
        let row = rows.entry(&s.service).or_insert_with(|| TopRow {
            service: s.service.name.to_string(),
            protocol: s.service.protocol.lower(),
            connections: 0,
            frontends: BTreeMap::new(),
            refused: 0,
            endpoints: 0,
            busiest_endpoint: None,
        });
        match &s.what {
            What::Frontend(kind) => {
                row.connections += s.value;
                *row.frontends.entry(Frontend::label(*kind)).or_default() += s.value;
            }
            What::Refused(_) => row.refused += s.value,
            What::Node(_) => {}
            What::Endpoint(endpoint) => {
                row.endpoints += 1;
                if row.busiest_endpoint.as_ref().is_none_or(|(_, n)| s.value > *n) {
                    row.busiest_endpoint = Some((endpoint.clone(), s.value));
                }
            }
        }
    }
    let mut rows: Vec<TopRow> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.connections
            .cmp(&a.connections)
            .then(b.refused.cmp(&a.refused))
            .then(a.service.cmp(&b.service))
    });
    rows.truncate(limit);
    rows
}

/// The rows as an aligned table.
pub fn table(rows: &[TopRow]) -> String {
    let mut out = String::new();
    let width = rows
        .iter()
        .map(|r| r.service.len() + r.protocol.len() + 1)
        .max()
        .unwrap_or(7)
        .max(7);
    let _ = writeln!(
        out,
        "{:<width$}  {:>11}  {:>7}  {:>9}  {:<40}  BUSIEST ENDPOINT",
        "SERVICE", "CONNECTIONS", "REFUSED", "ENDPOINTS", "BY FRONTEND"
    );
    for row in rows {
        let frontends: Vec<String> = row.frontends.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let busiest = row
            .busiest_endpoint
            .as_ref()
            .map_or("-".to_string(), |(e, n)| format!("{e} ({n})"));
        let _ = writeln!(
            out,
            "{:<width$}  {:>11}  {:>7}  {:>9}  {:<40}  {busiest}",
            format!("{}/{}", row.service, row.protocol),
            row.connections,
            row.refused,
            row.endpoints,
            if frontends.is_empty() {
                "-".to_string()
            } else {
                frontends.join(", ")
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Refusal;
    use switchyard_api::Protocol;

    fn series(name: &str, what: What, value: u64) -> Series {
        Series {
            service: ServicePort {
                name: name.into(),
                protocol: Protocol::TCP,
            },
            what,
            value,
        }
    }

    #[test]
    fn the_busiest_service_ports_come_first_with_their_breakdown() {
        let all = vec![
            series("ns/quiet", What::Frontend(Frontend::ClusterIp), 1),
            series("ns/web:http", What::Frontend(Frontend::ClusterIp), 20),
            series("ns/web:http", What::Frontend(Frontend::NodePort), 3),
            series("ns/web:http", What::Endpoint("10.244.1.5:80".into()), 9),
            series("ns/web:http", What::Endpoint("10.244.2.5:80".into()), 14),
            series("ns/gone", What::Refused(Refusal::NoEndpoints), 4),
        ];
        let rows = busiest(&all, 2);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].service.as_str(), rows[0].connections),
            ("ns/web:http", 23)
        );
        assert_eq!(rows[0].frontends[&"nodePort"], 3);
        assert_eq!(rows[0].busiest_endpoint, Some(("10.244.2.5:80".into(), 14)));
        assert_eq!(rows[0].endpoints, 2);
        assert_eq!((rows[1].service.as_str(), rows[1].connections), ("ns/quiet", 1));
        let text = table(&rows);
        assert!(
            text.lines().nth(1).unwrap().starts_with("ns/web:http/tcp"),
            "{text}"
        );
        assert!(text.contains("clusterIP 20, nodePort 3"), "{text}");
        assert!(text.contains("10.244.2.5:80 (14)"), "{text}");
    }
}
