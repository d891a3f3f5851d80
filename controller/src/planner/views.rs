//! Splitting one view's entries into ForwardingSlices, with their revisions, from per-entry digests:
//! packed slices for what has not changed since they were written, Service slices for what has.
//!
//! ```text
//! members (Service, hash, entry digest + size) ─► smallest power-of-two count whose every slice fits
//!   maxObjectBytes (Services too big for any slice on their own left out of the check)
//!   ─► per Service, against the previous layout of the same count:
//!        entries as packed, no Service slice ─► packed (current)
//!        entries changed, new, or gone, or a Service slice already ─► the packed copy stays as
//!            written; the current entries go in the Service's own slice (empty when gone)
//!        no previous layout (or a new count) ─► everything packed (current)
//!   ─► per packed slice: digest sum, bytes, counts ─► revision;   per Service slice: its own revision
//! fold(packed slices) ─► their Services' current entries written into them, their Service slices retired
//! ```
//!
//! Slice of an entry = hash(Service key) mod count, so all entries of a Service share a slice and one
//! endpoint change rewrites one slice. Power-of-two counts keep assignments stable while a view grows:
//! doubling splits each slice in two instead of reshuffling everything. Why Service slices: a packed
//! slice holds ~50 Services, and every node of the view receives the whole object on every write; a
//! Service slice carries one Service, about the bytes of its EndpointSlice. A node's own view is read by
//! that node alone and stays packed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use switchyard_api::{
    ForwardingSliceSpec, PlanSummary, ServicePlan, View,
    revision::{EntrySum, slice_revision_with},
    slice::{MAX_SLICES_PER_VIEW, service_slice_name, slice_name},
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

/// Services of one packed slice changing in one planning round from which the packed slice is
/// rewritten instead of giving each a Service slice: one write of ≤ 48 KiB (~50 Services) against
/// this many writes of ~1.2 KB. One change, or a few, stays in Service slices (what every node
/// receives per change is what matters there); a bulk change is written in far fewer requests.
pub const BATCH: usize = 8;

/// One member of a view: (Service hash, Service key, entry).
pub type Member<'a> = (u64, &'a str, &'a Arc<PlannedEntry>);

/// Running totals of one packed slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    sum: EntrySum,
    bytes: usize,
    summary: PlanSummary,
}

/// One Service's entries in one slice, sorted by key, with their digest sum.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entries {
    hash: u64,
    entries: Vec<Arc<PlannedEntry>>,
    sum: EntrySum,
    len: usize,
    /// Kept for a later rebuild without the entries themselves (see [`ViewLayout::kept`]).
    digest_only: bool,
}

impl Entries {
    fn new(hash: u64, mut entries: Vec<Arc<PlannedEntry>>) -> Self {
        entries.sort_by(|a, b| a.entry.key().cmp(&b.entry.key()));
        let sum = entries.iter().map(|e| e.fingerprint.digest).collect();
        let len = entries.len();
        Self {
            hash,
            entries,
            sum,
            len,
            digest_only: false,
        }
    }

    fn same_as(&self, other: &Self) -> bool {
        self.sum == other.sum && self.len == other.len
    }

    fn summary(&self) -> PlanSummary {
        PlanSummary {
            entries: self.entries.len() as u32,
            endpoints: self.entries.iter().map(|e| e.entry.endpoints.len() as u32).sum(),
        }
    }

    fn plans(&self) -> impl Iterator<Item = Arc<ServicePlan>> + '_ {
        self.entries.iter().map(|e| Arc::clone(&e.entry))
    }
}

/// A Service whose current entries differ from its packed copy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceSlice {
    current: Entries,
    revision: String,
}

/// One slice of a view, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceId<'a> {
    /// Packed slice `index`.
    Packed(u32),
    /// The Service slice of this Service key.
    Service(&'a str),
}

/// How one view is split into slices, with their revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLayout {
    view: View,
    id: String,
    count: u32,
    /// What the packed slices hold, by Service: its current entries, or, for a Service with a Service
    /// slice, the entries its packed slice was last written with (none: it was never packed).
    packed: BTreeMap<String, Entries>,
    /// Services whose current entries differ from their packed copy.
    services: BTreeMap<String, ServiceSlice>,
    buckets: Vec<Bucket>,
    revisions: Vec<String>,
}

impl ViewLayout {
    /// Lays out a view's members, in any order; `budget` is the byte budget of one object. With a
    /// `previous` layout of the same view and count, what its packed slices hold stays as it is and
    /// every Service that differs from it gets a Service slice; without one (or with another count)
    /// everything is packed. Either way a Service that has a Service slice (in `previous`, or in
    /// `existing`: those found in the cluster) keeps it, with its current entries, until a fold: agents
    /// take a Service slice deleted while the packed slices hold other entries for someone else's
    /// delete, so one is only deleted when they match.
    pub fn build(
        view: View,
        members: &[Member<'_>],
        budget: usize,
        previous: Option<&ViewLayout>,
        existing: &BTreeSet<String>,
    ) -> Result<Self, Error> {
        let id = view.id();
        let count = fitting_count(&view, &id, members, budget)?;
        let mut grouped: BTreeMap<&str, (u64, Vec<Arc<PlannedEntry>>)> = BTreeMap::new();
        for (hash, service, planned) in members {
            grouped
                .entry(service)
                .or_insert_with(|| (*hash, Vec::new()))
                .1
                .push(Arc::clone(planned));
        }
        let earlier = previous.filter(|p| p.id == id && shares(&view));
        let previous = earlier.filter(|p| p.count == count);
        let mut packed = BTreeMap::new();
        let mut changed: BTreeMap<String, Entries> = BTreeMap::new();
        // Service slices to keep when everything is packed anew (a first layout, or a new count).
        let mut keep: BTreeSet<&str> = existing.iter().map(String::as_str).collect();
        if previous.is_none() {
            keep.extend(earlier.iter().flat_map(|e| e.services.keys().map(String::as_str)));
        }
        if !shares(&view) {
            keep.clear();
        }
        for (service, (hash, entries)) in grouped {
            let current = Entries::new(hash, entries);
            let Some(previous) = previous else {
                if keep.remove(service) {
                    changed.insert(service.to_string(), current.clone());
                }
                packed.insert(service.to_string(), current);
                continue;
            };
            let old = previous.packed.get(service);
            let has_slice = previous.services.contains_key(service) || existing.contains(service);
            // A Service slice stays until it is folded (its packed slice written first): deleting
            // it any other way would show the packed copy to agents before it is current.
            if !has_slice && old.is_some_and(|old| old.same_as(&current)) {
                packed.insert(service.to_string(), current);
                continue;
            }
            match old {
                // Kept without its entries (a rebuild; the Service changed in the same round): the
                // old copy cannot stay, so the packed slice gets the current one.
                Some(old) if old.digest_only => {
                    packed.insert(service.to_string(), current.clone());
                    if has_slice {
                        changed.insert(service.to_string(), current);
                    }
                    continue;
                }
                Some(old) => {
                    packed.insert(service.to_string(), old.clone());
                }
                None => {}
            }
            changed.insert(service.to_string(), current);
        }
        if previous.is_none() {
            // Kept Service slices of Services with no entries in this view any more: empty.
            for service in keep {
                let hash = earlier
                    .and_then(|e| e.services.get(service))
                    .map_or_else(|| service_hash(service), |s| s.current.hash);
                changed.insert(service.to_string(), Entries::new(hash, Vec::new()));
            }
        }
        if let Some(previous) = previous {
            for (service, old) in &previous.packed {
                if !packed.contains_key(service) && !changed.contains_key(service) && !old.digest_only {
                    // Gone since its packed slice was written: an empty Service slice says so.
                    packed.insert(service.clone(), old.clone());
                    changed.insert(service.clone(), Entries::new(old.hash, Vec::new()));
                }
            }
            // A Service slice of a Service that is gone and was never packed empties too: agents
            // take a Service slice deleted while it differs from the packed copy for someone else's
            // delete and keep using it, so one is only deleted once it matches (a fold).
            for (service, slice) in &previous.services {
                if !packed.contains_key(service) && !changed.contains_key(service) {
                    changed.insert(service.clone(), Entries::new(slice.current.hash, Vec::new()));
                }
            }
            for service in existing {
                if !packed.contains_key(service) && !changed.contains_key(service) {
                    changed.insert(service.clone(), Entries::new(service_hash(service), Vec::new()));
                }
            }
        }
        let mut layout = Self {
            view,
            id,
            count,
            packed,
            services: BTreeMap::new(),
            buckets: Vec::new(),
            revisions: Vec::new(),
        };
        for (service, current) in changed {
            let revision = layout.service_revision(&service, &current)?;
            layout
                .services
                .insert(service, ServiceSlice { current, revision });
        }
        layout.sum_buckets()?;
        Ok(layout)
    }

    /// Re-lays out only the `touched` Services (those re-planned) when the view keeps its count: what
    /// [`Self::build`] against this layout gives, without regrouping every member — except that when
    /// [`BATCH`] or more Services of one packed slice without Service slices changed, that packed slice
    /// is rewritten with their current entries instead. Returns false, changing nothing, when the count changes or the view is a
    /// node's own (then the caller builds the layout anew).
    pub fn update(
        &mut self,
        members: &[Member<'_>],
        budget: usize,
        touched: &BTreeSet<&str>,
    ) -> Result<bool, Error> {
        if !shares(&self.view) || fitting_count(&self.view, &self.id, members, budget)? != self.count {
            return Ok(false);
        }
        let mut grouped: BTreeMap<&str, (u64, Vec<Arc<PlannedEntry>>)> = BTreeMap::new();
        for (hash, service, planned) in members.iter().filter(|(_, s, _)| touched.contains(s)) {
            grouped
                .entry(service)
                .or_insert_with(|| (*hash, Vec::new()))
                .1
                .push(Arc::clone(planned));
        }
        // Changed Services without a Service slice, by the packed slice they belong to.
        let mut batches: BTreeMap<u32, Vec<(String, Entries)>> = BTreeMap::new();
        for service in touched {
            let has_slice = self.services.contains_key(*service);
            let current = match grouped.remove(service) {
                Some((hash, entries)) => Entries::new(hash, entries),
                None => match (self.packed.get(*service), self.services.get(*service)) {
                    (Some(old), _) => Entries::new(old.hash, Vec::new()),
                    // Gone, never packed: its Service slice empties (it goes at the next fold).
                    (None, Some(slice)) => Entries::new(slice.current.hash, Vec::new()),
                    (None, None) => continue,
                },
            };
            match self.packed.get(*service) {
                Some(old) if !has_slice && old.same_as(&current) && !current.entries.is_empty() => {
                    // Same digests, so the packed slice's sums and counts stay.
                    self.packed.insert(service.to_string(), current);
                }
                _ if !has_slice => {
                    batches
                        .entry(self.index_of(current.hash))
                        .or_default()
                        .push((service.to_string(), current));
                }
                _ => {
                    let revision = self.service_revision(service, &current)?;
                    self.services
                        .insert(service.to_string(), ServiceSlice { current, revision });
                }
            }
        }
        let mut repacked = false;
        for (_, changed) in batches {
            if changed.len() >= BATCH {
                // Many Services of one packed slice changed at once (a bulk creation, a node going
                // down): one write of the packed slice instead of as many Service slices.
                for (service, current) in changed {
                    if current.entries.is_empty() {
                        self.packed.remove(&service);
                    } else {
                        self.packed.insert(service, current);
                    }
                }
                repacked = true;
                continue;
            }
            for (service, current) in changed {
                let revision = self.service_revision(&service, &current)?;
                self.services.insert(service, ServiceSlice { current, revision });
            }
        }
        if repacked {
            self.sum_buckets()?;
        }
        Ok(true)
    }

    /// What a rebuild needs of this layout: every packed Service's digest, and the entries only of
    /// those a Service slice shadows (the rest are the current entries, which the rebuild plans
    /// anew), so a rebuild never holds two copies of every entry.
    pub fn kept(&self) -> Self {
        let mut kept = self.clone();
        for (service, packed) in &mut kept.packed {
            if !self.services.contains_key(service) {
                packed.entries = Vec::new();
                packed.digest_only = true;
            }
        }
        for slice in kept.services.values_mut() {
            slice.current.entries = Vec::new();
            slice.current.digest_only = true;
        }
        kept
    }

    /// Writes the current entries of every Service with a Service slice shadowing packed slice
    /// `index` into it; their Service slices are no longer wanted. Returns whether anything changed.
    pub fn fold(&mut self, index: u32) -> Result<bool, Error> {
        let folded: Vec<String> = self
            .services
            .iter()
            .filter(|(_, s)| self.index_of(s.current.hash) == index)
            .map(|(service, _)| service.clone())
            .collect();
        for service in &folded {
            let Some(slice) = self.services.remove(service) else {
                continue;
            };
            if slice.current.entries.is_empty() {
                self.packed.remove(service);
            } else {
                self.packed.insert(service.clone(), slice.current);
            }
        }
        if folded.is_empty() {
            return Ok(false);
        }
        self.sum_buckets()?;
        Ok(true)
    }

    fn sum_buckets(&mut self) -> Result<(), Error> {
        let mut buckets = vec![Bucket::default(); self.count as usize];
        for packed in self.packed.values() {
            let bucket = &mut buckets[self.index_of(packed.hash) as usize];
            for planned in &packed.entries {
                bucket.sum.add(planned.fingerprint.digest);
                bucket.bytes += planned.fingerprint.bytes + 1;
                bucket.summary.entries += 1;
                bucket.summary.endpoints += planned.entry.endpoints.len() as u32;
            }
        }
        let mut revisions = Vec::with_capacity(buckets.len());
        for (index, bucket) in buckets.iter().enumerate() {
            let spec = header(&self.view, &self.id, index as u32, self.count, bucket.summary);
            revisions.push(slice_revision_with(&spec, bucket.sum)?);
        }
        self.buckets = buckets;
        self.revisions = revisions;
        Ok(())
    }

    fn service_header(&self, service: &str, current: &Entries) -> ForwardingSliceSpec {
        let mut spec = header(
            &self.view,
            &self.id,
            self.index_of(current.hash),
            self.count,
            current.summary(),
        );
        spec.service = Some(service.to_string());
        spec
    }

    fn service_revision(&self, service: &str, current: &Entries) -> Result<String, Error> {
        Ok(slice_revision_with(
            &self.service_header(service, current),
            current.sum,
        )?)
    }

    /// The view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The packed slice an entry of the Service with this hash lands in.
    pub fn index_of(&self, hash: u64) -> u32 {
        (hash % u64::from(self.count)) as u32
    }

    /// Name of packed slice `index`.
    pub fn name(&self, index: u32) -> String {
        slice_name(&self.id, index)
    }

    /// Name of the slice holding a Service's current entries: its Service slice when it has one.
    pub fn location(&self, service: &str, hash: u64) -> String {
        if self.services.contains_key(service) {
            service_slice_name(&self.id, service)
        } else {
            self.name(self.index_of(hash))
        }
    }

    /// (name, revision) of every slice: packed ones in index order, then Service slices.
    pub fn slices(&self) -> impl Iterator<Item = (String, &str)> {
        let packed = self
            .revisions
            .iter()
            .enumerate()
            .map(|(i, r)| (slice_name(&self.id, i as u32), r.as_str()));
        let services = self
            .services
            .iter()
            .map(|(service, s)| (service_slice_name(&self.id, service), s.revision.as_str()));
        packed.chain(services)
    }

    /// Which slice of this view `name` is, when it is wanted.
    pub fn find(&self, name: &str) -> Option<SliceId<'_>> {
        if let Some(rest) = name.strip_prefix(self.id.as_str()) {
            if let Some(index) = rest.strip_prefix('-').and_then(|i| i.parse::<u32>().ok())
                && index < self.count
                && self.name(index) == name
            {
                return Some(SliceId::Packed(index));
            }
            if let Some((namespace, service_name)) = rest.strip_prefix('.').and_then(|r| r.split_once('.')) {
                let key = format!("{namespace}/{service_name}");
                if let Some((key, _)) = self.services.get_key_value(&key) {
                    return Some(SliceId::Service(key));
                }
            }
        }
        None
    }

    /// The revision of one of this view's slices.
    pub fn revision(&self, id: SliceId<'_>) -> Option<&str> {
        match id {
            SliceId::Packed(index) => self.revisions.get(index as usize).map(String::as_str),
            SliceId::Service(service) => self.services.get(service).map(|s| s.revision.as_str()),
        }
    }

    /// One slice, materialised.
    pub fn spec(&self, id: SliceId<'_>) -> Option<ForwardingSliceSpec> {
        match id {
            SliceId::Packed(index) => {
                let entries = self
                    .packed
                    .values()
                    .filter(|p| self.index_of(p.hash) == index)
                    .flat_map(Entries::plans)
                    .collect();
                Some(self.packed_spec(index, entries))
            }
            SliceId::Service(service) => {
                let slice = self.services.get(service)?;
                let mut spec = self.service_header(service, &slice.current);
                spec.revision = slice.revision.clone();
                spec.entries = slice.current.plans().collect();
                Some(spec)
            }
        }
    }

    /// Every slice, materialised: (name, spec), packed slices then Service slices.
    pub fn specs(&self) -> Vec<(String, ForwardingSliceSpec)> {
        let mut buckets: Vec<Vec<Arc<ServicePlan>>> = vec![Vec::new(); self.count as usize];
        for packed in self.packed.values() {
            buckets[self.index_of(packed.hash) as usize].extend(packed.plans());
        }
        let mut out: Vec<(String, ForwardingSliceSpec)> = buckets
            .into_iter()
            .enumerate()
            .map(|(index, entries)| (self.name(index as u32), self.packed_spec(index as u32, entries)))
            .collect();
        for service in self.services.keys() {
            if let Some(spec) = self.spec(SliceId::Service(service)) {
                out.push((service_slice_name(&self.id, service), spec));
            }
        }
        out
    }

    fn packed_spec(&self, index: u32, mut entries: Vec<Arc<ServicePlan>>) -> ForwardingSliceSpec {
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
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

    /// Packed slices shadowed by Service slices: index → the Services shadowing it.
    pub fn shadowed(&self) -> BTreeMap<u32, BTreeSet<&str>> {
        let mut out: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
        for (service, slice) in &self.services {
            out.entry(self.index_of(slice.current.hash))
                .or_default()
                .insert(service.as_str());
        }
        out
    }

    /// Number of Service slices.
    pub fn service_slices(&self) -> usize {
        self.services.len()
    }
}

/// Whether a view gets Service slices: every view but a node's own, which only that node reads.
fn shares(view: &View) -> bool {
    !matches!(view, View::Node(_))
}

/// The packed slice count of a view's members under a byte budget for whole objects.
fn fitting_count(view: &View, id: &str, members: &[Member<'_>], budget: usize) -> Result<u32, Error> {
    let header_bytes = serde_json::to_vec(&header(view, id, 0, 1, PlanSummary::default()))
        .map_err(switchyard_api::Error::from)?
        .len();
    let budget = budget.saturating_sub(header_bytes + OBJECT_OVERHEAD_BYTES);
    let mut per_service: HashMap<u64, usize> = HashMap::new();
    for (hash, _, planned) in members {
        *per_service.entry(*hash).or_default() += planned.fingerprint.bytes + 1;
    }
    Ok(smallest_fitting_count(&per_service, budget))
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
        service: None,
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
