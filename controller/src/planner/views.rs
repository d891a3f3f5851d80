//! Splitting one view's entries into ForwardingSlices, with their revisions, from per-entry digests.
//!
//! ```text
//! members (Service hash, entry digest + size) ─► smallest power-of-two count whose every slice fits
//!   maxObjectBytes (Services too big for any slice on their own left out of the check)
//!   ─► per slice: digest sum, bytes, counts ─► revision (header + sum), no entry serialised again
//! ```
//!
//! Slice of an entry = hash(Service key) mod count, so all entries of a Service share a slice and one
//! endpoint change rewrites one slice. Power-of-two counts keep assignments stable while a view grows:
//! doubling splits each slice in two instead of reshuffling everything.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use switchyard_api::{
    ForwardingSliceSpec, PlanSummary, View,
    revision::{EntrySum, slice_revision_with},
    slice::{MAX_SLICES_PER_VIEW, slice_name},
};

use super::PlannedEntry;
use crate::Error;

/// Allowance for metadata, labels and managed fields the API server adds around a spec.
pub const OBJECT_OVERHEAD_BYTES: usize = 4096;

/// Stable 64-bit hash of a Service key.
pub fn service_hash(service_key: &str) -> u64 {
    let digest = Sha256::digest(service_key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Running totals of one slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    sum: EntrySum,
    bytes: usize,
    summary: PlanSummary,
}

/// How one view is split into slices, with their revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLayout {
    view: View,
    id: String,
    count: u32,
    buckets: Vec<Bucket>,
    revisions: Vec<String>,
}

impl ViewLayout {
    /// Lays out a view's members (Service hash, entry), in any order; `budget` is the byte budget of
    /// one object.
    pub fn build(view: View, members: &[(u64, &PlannedEntry)], budget: usize) -> Result<Self, Error> {
        let id = view.id();
        let header_bytes = serde_json::to_vec(&header(&view, &id, 0, 1, PlanSummary::default()))
            .map_err(switchyard_api::Error::from)?
            .len();
        let budget = budget.saturating_sub(header_bytes + OBJECT_OVERHEAD_BYTES);
        let mut per_service: HashMap<u64, usize> = HashMap::new();
        for (hash, planned) in members {
            *per_service.entry(*hash).or_default() += planned.fingerprint.bytes + 1;
        }
        let count = smallest_fitting_count(&per_service, budget);
        let mut buckets = vec![Bucket::default(); count as usize];
        for (hash, planned) in members {
            let bucket = &mut buckets[(hash % u64::from(count)) as usize];
            bucket.sum.add(planned.fingerprint.digest);
            bucket.bytes += planned.fingerprint.bytes + 1;
            bucket.summary.entries += 1;
            bucket.summary.endpoints += planned.entry.endpoints.len() as u32;
        }
        let mut revisions = Vec::with_capacity(count as usize);
        for (index, bucket) in buckets.iter().enumerate() {
            let spec = header(&view, &id, index as u32, count, bucket.summary);
            revisions.push(slice_revision_with(&spec, bucket.sum)?);
        }
        Ok(Self {
            view,
            id,
            count,
            buckets,
            revisions,
        })
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Number of slices.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The slice an entry of the Service with this hash lands in.
    pub fn index_of(&self, hash: u64) -> u32 {
        (hash % u64::from(self.count)) as u32
    }

    /// Name of slice `index`.
    pub fn name(&self, index: u32) -> String {
        slice_name(&self.id, index)
    }

    /// (name, revision) of every slice, in index order.
    pub fn slices(&self) -> impl Iterator<Item = (String, &str)> {
        self.revisions
            .iter()
            .enumerate()
            .map(|(i, r)| (slice_name(&self.id, i as u32), r.as_str()))
    }

    /// Slice `index` with its entries (which the caller picks, sorted, by [`Self::index_of`]).
    pub fn spec(&self, index: u32, entries: Vec<Arc<switchyard_api::ServicePlan>>) -> ForwardingSliceSpec {
        let summary = self
            .buckets
            .get(index as usize)
            .map(|b| b.summary)
            .unwrap_or_default();
        let mut spec = header(&self.view, &self.id, index, self.count, summary);
        spec.revision = self.revisions.get(index as usize).cloned().unwrap_or_default();
        spec.entries = entries;
        spec
    }
}

/// Smallest power-of-two count where every slice fits `budget`, not counting Services that exceed it
/// on their own (more slices cannot make those fit; their slice goes over the budget instead).
fn smallest_fitting_count(per_service: &HashMap<u64, usize>, budget: usize) -> u32 {
    let mut count = 1u32;
    loop {
        let mut bytes = vec![0usize; count as usize];
        for (hash, size) in per_service {
            if *size <= budget {
                bytes[(hash % u64::from(count)) as usize] += size;
            }
        }
        if bytes.iter().all(|b| *b <= budget) || count >= MAX_SLICES_PER_VIEW {
            return count;
        }
        count *= 2;
    }
}

fn header(view: &View, id: &str, index: u32, count: u32, summary: PlanSummary) -> ForwardingSliceSpec {
    let (zone, node) = match view {
        View::All | View::Zone(None) => (None, None),
        View::Zone(Some(zone)) => (Some(zone.clone()), None),
        View::Node(node) => (None, Some(node.clone())),
    };
    ForwardingSliceSpec {
        view: id.to_string(),
        zone,
        node,
        index,
        count,
        revision: String::new(),
        summary,
        entries: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_doubles_until_every_slice_fits_except_oversized_services() {
        let services: HashMap<u64, usize> = (0..100u64).map(|h| (h, 1000)).collect();
        assert_eq!(smallest_fitting_count(&services, 200_000), 1);
        let count = smallest_fitting_count(&services, 10_000);
        assert!(count.is_power_of_two() && count >= 16, "{count}");
        let mut with_giant = services.clone();
        with_giant.insert(1000, 1_000_000);
        assert_eq!(
            smallest_fitting_count(&with_giant, 200_000),
            1,
            "a Service bigger than any slice does not drive the count up"
        );
    }
}
