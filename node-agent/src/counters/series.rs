//! Kernel counters → monotonic series.
//!
//! ```text
//! [Sample] ─► group by (service, what) ─► per series, per element: last value seen
//!   element counter went down (rewritten: counts again from 0) ─► its last value is retired into the series
//!   element gone (moved to another set, endpoint swapped)       ─► its last value is retired
//!   series gone (Service or endpoint removed)                   ─► forgotten
//!   value = retired + Σ current element counters
//! ```
//!
//! So within one process a series never decreases. What it can miss: connections counted by an element
//! after the last read and before the agent rewrote it; and a rewritten element that has counted past
//! its old value by the next read looks like growth, not a reset (counted low, never high).

use std::collections::{BTreeMap, HashMap};

use super::{Sample, ServicePort, What};

/// One exported series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// The Service port.
    pub service: ServicePort,
    /// What it counts.
    pub what: What,
    /// Connections since the series appeared in this process.
    pub value: u64,
}

#[derive(Debug, Default)]
struct State {
    retired: u64,
    elements: HashMap<u64, u64>,
}

/// The memory of every series' elements between reads.
#[derive(Debug, Default)]
pub struct Accumulator {
    series: HashMap<(ServicePort, What), State>,
}

impl Accumulator {
    /// Folds one read of the kernel into the series; returns every series, sorted.
    pub fn update(&mut self, samples: Vec<Sample>) -> Vec<Series> {
        let mut grouped: BTreeMap<(ServicePort, What), HashMap<u64, u64>> = BTreeMap::new();
        for sample in samples {
            *grouped
                .entry((sample.service, sample.what))
                .or_default()
                .entry(sample.element)
                .or_default() += sample.packets;
        }
        let mut next = HashMap::with_capacity(grouped.len());
        let mut out = Vec::with_capacity(grouped.len());
        for (key, elements) in grouped {
            let mut state = self.series.remove(&key).unwrap_or_default();
            for (element, last) in &state.elements {
                match elements.get(element) {
                    Some(now) if now >= last => {}
                    // Rewritten (counting again from 0) or gone: what it had counted stays counted.
                    _ => state.retired += last,
                }
            }
            state.elements = elements;
            let value = state.retired + state.elements.values().sum::<u64>();
            out.push(Series {
                service: key.0.clone(),
                what: key.1.clone(),
                value,
            });
            next.insert(key, state);
        }
        self.series = next;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Frontend;
    use switchyard_api::Protocol;

    fn web() -> ServicePort {
        ServicePort {
            name: "ns/web:http".into(),
            protocol: Protocol::TCP,
        }
    }

    fn sample(what: What, element: u64, packets: u64) -> Sample {
        Sample {
            service: web(),
            what,
            element,
            packets,
        }
    }

    /// One read and the values it must give.
    type Read = (Vec<Sample>, Vec<(What, u64)>);

    fn cluster() -> What {
        What::Frontend(Frontend::ClusterIp)
    }

    fn values(series: &[Series]) -> Vec<(What, u64)> {
        series.iter().map(|s| (s.what.clone(), s.value)).collect()
    }

    #[test]
    fn series_follow_their_elements_and_never_decrease() {
        let a = || What::Endpoint("10.244.1.5:80".into());
        let b = || What::Endpoint("10.244.2.5:80".into());
        let mut acc = Accumulator::default();
        // (reads: samples) → expected values, one row per read.
        let table: Vec<Read> = vec![
            // Two elements of one series (an endpoint reached through two frontends) add up.
            (
                vec![sample(a(), 1, 4), sample(a(), 2, 6), sample(cluster(), 3, 10)],
                vec![(cluster(), 10), (a(), 10)],
            ),
            // Element 1 rewritten (0 again) while 2 grows: the series keeps 4 and adds 2.
            (
                vec![sample(a(), 1, 0), sample(a(), 2, 8), sample(cluster(), 3, 12)],
                vec![(cluster(), 12), (a(), 12)],
            ),
            // The frontend moved to another set (new element): still monotonic.
            (
                vec![sample(a(), 1, 1), sample(a(), 2, 8), sample(cluster(), 4, 2)],
                vec![(cluster(), 14), (a(), 13)],
            ),
            // A new endpoint appears at its kernel value.
            (
                vec![
                    sample(a(), 1, 1),
                    sample(a(), 2, 8),
                    sample(b(), 5, 3),
                    sample(cluster(), 4, 5),
                ],
                vec![(cluster(), 17), (a(), 13), (b(), 3)],
            ),
            // An endpoint that left is forgotten; if it comes back it starts again.
            (
                vec![sample(b(), 5, 4), sample(cluster(), 4, 6)],
                vec![(cluster(), 18), (b(), 4)],
            ),
            (
                vec![sample(a(), 9, 0), sample(b(), 5, 4), sample(cluster(), 4, 6)],
                vec![(cluster(), 18), (a(), 0), (b(), 4)],
            ),
        ];
        for (i, (samples, want)) in table.into_iter().enumerate() {
            assert_eq!(values(&acc.update(samples)), want, "read {i}");
        }
    }

    #[test]
    fn nothing_read_forgets_everything() {
        let mut acc = Accumulator::default();
        acc.update(vec![sample(cluster(), 1, 5)]);
        assert!(acc.update(Vec::new()).is_empty());
        assert_eq!(
            values(&acc.update(vec![sample(cluster(), 1, 5)])),
            vec![(cluster(), 5)]
        );
    }
}
