//! Refusals since a verification that the plan does not explain, from the kernel's refusal counters
//! (the traffic series `switchyard_service_refused_connections_total` exports).
//!
//! ```text
//! at the verification: series ─► RefusalCount::baseline (every refusal series' value)
//! every few seconds:   series ─► growth since the last count, per (Service port, reason)
//!   ─► judged by the plan applied now: REJECT of an entry with endpoints, DROP for want of local
//!      endpoints where its Local policy has some (or it has none), a source-range DROP without ranges
//!   ─► unexpected += growth (monotonic: a later plan never takes a counted refusal back)
//!   ─► RefusedCheck { unexpected, examples: `ns/svc:port no-endpoints +3`, checkedAt }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

use switchyard_api::verification::{MAX_EXAMPLES, RefusedCheck};
use switchyard_api::{NodeForwardingPlanSpec, ServicePlan, TrafficPolicy};

use crate::counters::{Refusal, Series, ServicePort, What};

/// The plan refuses connections of `entry` this way.
fn explains(entry: &ServicePlan, refusal: Refusal) -> bool {
    let no_local = entry.local_endpoints().next().is_none();
    match refusal {
        Refusal::NoEndpoints => !entry.has_endpoints,
        Refusal::NoLocalEndpoints => {
            let internal = entry.internal_policy == TrafficPolicy::Local;
            let external = entry.external_policy == TrafficPolicy::Local && entry.externally_accessible();
            entry.has_endpoints && (internal || external) && no_local
        }
        Refusal::SourceRange => !entry.source_ranges.is_empty(),
    }
}

/// Whether some applied entry of `service` explains `refusal`; a Service port the plan no longer has
/// cannot be judged and counts as explained.
fn explained(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    service: &ServicePort,
    refusal: Refusal,
) -> bool {
    let mut entries = spec
        .services
        .iter()
        .enumerate()
        .filter(|(i, e)| !skip.contains(i) && *e.name == *service.name && e.protocol == service.protocol)
        .map(|(_, e)| e)
        .peekable();
    entries.peek().is_none() || entries.any(|e| explains(e, refusal))
}

/// The refusal counts since a verification.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusalCount {
    last: HashMap<(ServicePort, Refusal), u64>,
    unexpected: u64,
    places: BTreeMap<(String, &'static str), u64>,
}

fn refusals(series: &[Series]) -> impl Iterator<Item = ((ServicePort, Refusal), u64)> + '_ {
    series.iter().filter_map(|s| match s.what {
        What::Refused(refusal) => Some(((s.service.clone(), refusal), s.value)),
        _ => None,
    })
}

impl RefusalCount {
    /// Counting starts from what `series` hold now.
    pub fn baseline(series: &[Series]) -> Self {
        Self {
            last: refusals(series).collect(),
            ..Self::default()
        }
    }

    /// Adds the growth since the last count that the plan (`spec` without `skip`) does not explain.
    /// Returns true when the unexpected count grew.
    pub fn update(
        &mut self,
        series: &[Series],
        spec: &NodeForwardingPlanSpec,
        skip: &HashSet<usize>,
    ) -> bool {
        let before = self.unexpected;
        let mut now = HashMap::new();
        for (key, value) in refusals(series) {
            // A series the accumulator started afresh (a new process) counts from 0.
            let last = self
                .last
                .get(&key)
                .copied()
                .filter(|last| *last <= value)
                .unwrap_or(0);
            let grown = value - last;
            if grown > 0 && !explained(spec, skip, &key.0, key.1) {
                self.unexpected += grown;
                *self
                    .places
                    .entry((key.0.name.to_string(), key.1.label()))
                    .or_default() += grown;
            }
            now.insert(key, value);
        }
        self.last = now;
        self.unexpected > before
    }

    /// The check as the status shows it, counted at `at` (RFC 3339).
    pub fn check(&self, at: String) -> RefusedCheck {
        let mut places: Vec<(&(String, &str), &u64)> = self.places.iter().collect();
        places.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        RefusedCheck {
            unexpected: self.unexpected,
            examples: places
                .into_iter()
                .take(MAX_EXAMPLES)
                .map(|((service, reason), n)| format!("{service} {reason} +{n}"))
                .collect(),
            checked_at: at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::Protocol;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    fn refused(service: &str, refusal: Refusal, value: u64) -> Series {
        Series {
            service: ServicePort {
                name: service.into(),
                protocol: Protocol::TCP,
            },
            what: What::Refused(refusal),
            value,
        }
    }

    #[test]
    fn only_refusals_the_plan_does_not_make_are_unexpected() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns/none:http", "10.96.0.1", 80),
                entry("ns/served:http", "10.96.0.2", 80).with(ep("10.244.2.2", 80)),
                entry("ns/etp-none:http", "10.96.0.3", 80)
                    .with(ep("10.244.2.3", 80))
                    .node_port(30083)
                    .etp_local(),
                entry("ns/etp-here:http", "10.96.0.4", 80)
                    .with(ep("10.244.1.4", 80).local())
                    .node_port(30084)
                    .etp_local(),
                entry("ns/ranged:http", "10.96.0.5", 80)
                    .with(ep("10.244.2.5", 80))
                    .lb_ip("203.0.113.5")
                    .source_range("198.51.100.0/24"),
            ],
        );
        type Case = (&'static str, Refusal, bool);
        let cases: [Case; 7] = [
            ("ns/none:http", Refusal::NoEndpoints, false),
            ("ns/served:http", Refusal::NoEndpoints, true),
            ("ns/etp-none:http", Refusal::NoLocalEndpoints, false),
            ("ns/etp-here:http", Refusal::NoLocalEndpoints, true),
            ("ns/served:http", Refusal::NoLocalEndpoints, true),
            ("ns/ranged:http", Refusal::SourceRange, false),
            ("ns/served:http", Refusal::SourceRange, true),
        ];
        for (service, refusal, unexpected) in cases {
            let mut count = RefusalCount::baseline(&[refused(service, refusal, 10)]);
            let grew = count.update(&[refused(service, refusal, 13)], &spec, &HashSet::new());
            assert_eq!(grew, unexpected, "{service} {refusal:?}");
            assert_eq!(
                count.check(String::new()).unexpected,
                if unexpected { 3 } else { 0 }
            );
        }
    }

    #[test]
    fn the_count_only_grows_and_names_where() {
        let with = plan(
            "node-a",
            vec![
                entry("ns/a:http", "10.96.0.1", 80).with(ep("10.244.2.1", 80)),
                entry("ns/b:http", "10.96.0.2", 80).with(ep("10.244.2.2", 80)),
            ],
        );
        let mut count = RefusalCount::baseline(&[refused("ns/a:http", Refusal::NoEndpoints, 5)]);
        assert!(!count.update(
            &[refused("ns/a:http", Refusal::NoEndpoints, 5)],
            &with,
            &HashSet::new()
        ));
        let now = [
            refused("ns/a:http", Refusal::NoEndpoints, 7),
            refused("ns/b:http", Refusal::NoEndpoints, 4),
        ];
        assert!(count.update(&now, &with, &HashSet::new()));
        // The Services lose their endpoints: later refusals are explained, earlier ones stay counted.
        let without = plan(
            "node-a",
            vec![
                entry("ns/a:http", "10.96.0.1", 80),
                entry("ns/b:http", "10.96.0.2", 80),
            ],
        );
        let later = [
            refused("ns/a:http", Refusal::NoEndpoints, 50),
            refused("ns/b:http", Refusal::NoEndpoints, 40),
        ];
        assert!(!count.update(&later, &without, &HashSet::new()));
        let check = count.check("2026-12-03T10:00:00Z".into());
        assert_eq!(check.unexpected, 6);
        assert_eq!(
            check.examples,
            ["ns/b:http no-endpoints +4", "ns/a:http no-endpoints +2"]
        );
        assert_eq!(check.checked_at, "2026-12-03T10:00:00Z");
    }
}
