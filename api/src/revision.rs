//! The plan revision: a content hash the controller writes and the agent reports back.
//!
//! ```text
//! entry ─► JSON ─► sha256 ─► 128-bit digest ─┐ (wrapping sum over entries: order-free, and updatable in O(1)
//!                                             │  when one entry changes — a one-endpoint change re-hashes one
//! header fields ─► JSON ───────────────────────┴► sha256 ─► first 12 hex chars = revision   entry, not 10k)
//! ```
//!
//! The sum makes the revision independent of entry order (entries are sorted anyway) and lets the
//! planner keep per-node revisions current incrementally. It is a change detector, not a security
//! boundary: the agent trusts the API server for authenticity.
//!
//! **The digest of a plan file.** The revision covers every spec field (the header as the exhaustive
//! destructuring below lists it, and every entry), so the agent checks a plan or slice *file* against it
//! ([`verify`], [`verify_slice`]): content that hashes to anything else was cut or edited and is refused.
//! The JSON hashed is the typed spec's own serialisation (fields in declaration order, defaults left out
//! where the type leaves them out), never the file's bytes, so YAML and JSON, kubectl's and ours, hash the
//! same.
//!
//! **Versions.** The domain string (`switchyard.io/v1alpha2/NodeForwardingPlan`) names the scheme. Within
//! `v1alpha2` it never changes, and a field added later must be left out of the JSON when absent (as
//! `leaving` and `service` are), so every plan written before it hashes as it did: an agent of any
//! version accepts the files of any controller of `v1alpha2` that do not use a field it does not know
//! (one that does is refused by name, `switchyard_api::known`, rather than applied in part). A new scheme
//! comes with a new API version and domain string. The API path does not check: the API server is the
//! authority there, the controller restores hand edits, and during a rolling upgrade a newer controller's
//! fields unknown to an older agent must not stop its updates.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    Error,
    plan::{
        Backend, ClusterSettings, Leaving, LocalEndpoints, NodeForwardingPlanSpec, PlanSummary, ServicePlan,
    },
    slice::ForwardingSliceSpec,
};

/// Length of a revision string (hex characters).
pub const REVISION_LEN: usize = 12;

/// Digest and serialised size of one entry, computed together from one serialisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryFingerprint {
    /// First 128 bits of sha256 of the entry's JSON.
    pub digest: u128,
    /// Bytes of the entry's JSON (what it adds to the object's size, give or take a comma).
    pub bytes: usize,
}

/// Fingerprints one entry.
pub fn fingerprint(entry: &ServicePlan) -> Result<EntryFingerprint, Error> {
    let json = serde_json::to_vec(entry)?;
    let hash = Sha256::digest(&json);
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash[..16]);
    Ok(EntryFingerprint {
        digest: u128::from_le_bytes(first),
        bytes: json.len(),
    })
}

/// Order-free accumulator of entry digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct EntrySum(u128);

impl EntrySum {
    /// Adds an entry.
    pub fn add(&mut self, digest: u128) {
        self.0 = self.0.wrapping_add(digest);
    }

    /// Removes an entry previously added.
    pub fn remove(&mut self, digest: u128) {
        self.0 = self.0.wrapping_sub(digest);
    }
}

impl FromIterator<u128> for EntrySum {
    fn from_iter<I: IntoIterator<Item = u128>>(iter: I) -> Self {
        let mut sum = Self::default();
        iter.into_iter().for_each(|d| sum.add(d));
        sum
    }
}

/// Every plan spec field except `revision` and the entries, borrowed for hashing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanHeader<'a> {
    node_name: &'a str,
    zone: &'a Option<String>,
    node_ips: &'a [String],
    pod_cidrs: &'a [String],
    backend: Backend,
    cluster: &'a ClusterSettings,
    // NB: skipped when absent, so the revisions of serving nodes' plans are what they were before.
    #[serde(skip_serializing_if = "Option::is_none")]
    leaving: &'a Option<Leaving>,
    views: &'a [String],
    endpoints_on_node: &'a [String],
    local_endpoints: &'a [LocalEndpoints],
    summary: &'a PlanSummary,
}

/// Every slice spec field except `revision` and `entries`, borrowed for hashing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SliceHeader<'a> {
    view: &'a str,
    zone: &'a Option<String>,
    node: &'a Option<String>,
    // Absent on packed slices, so their revisions are what they were before Service slices existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    service: &'a Option<String>,
    index: u32,
    count: u32,
    summary: &'a PlanSummary,
}

/// sha256 over a domain string, the header's JSON and the entry sum; the first [`REVISION_LEN`] hex
/// characters.
fn revision_of(domain: &str, header: &impl Serialize, entries: EntrySum) -> Result<String, Error> {
    let mut hasher = Sha256::new();
    hasher.update(domain.as_bytes());
    hasher.update([0]);
    hasher.update(serde_json::to_vec(header)?);
    hasher.update(entries.0.to_le_bytes());
    let mut text = data_encoding::HEXLOWER.encode(&hasher.finalize());
    text.truncate(REVISION_LEN);
    Ok(text)
}

/// The revision of a plan spec whose entries (`overrides` and `services`) sum to `entries` (the spec's
/// own entries are ignored).
pub fn revision_with(spec: &NodeForwardingPlanSpec, entries: EntrySum) -> Result<String, Error> {
    // Exhaustive on purpose: a new spec field fails to compile here until it is hashed.
    let NodeForwardingPlanSpec {
        node_name,
        zone,
        node_ips,
        pod_cidrs,
        backend,
        cluster,
        leaving,
        revision: _,
        views,
        endpoints_on_node,
        local_endpoints,
        summary,
        overrides: _,
        services: _,
    } = spec;
    let header = PlanHeader {
        node_name,
        zone,
        node_ips,
        pod_cidrs,
        backend: *backend,
        cluster,
        leaving,
        views,
        endpoints_on_node,
        local_endpoints,
        summary,
    };
    revision_of("switchyard.io/v1alpha2/NodeForwardingPlan", &header, entries)
}

/// The revision of a plan spec computed from scratch.
pub fn compute(spec: &NodeForwardingPlanSpec) -> Result<String, Error> {
    revision_with(
        spec,
        sum_of(spec.overrides.iter().chain(&spec.services).map(|e| &**e))?,
    )
}

/// The revision of a slice spec whose entries sum to `entries` (the spec's own entries are ignored).
pub fn slice_revision_with(spec: &ForwardingSliceSpec, entries: EntrySum) -> Result<String, Error> {
    let ForwardingSliceSpec {
        view,
        zone,
        node,
        service,
        index,
        count,
        revision: _,
        summary,
        entries: _,
    } = spec;
    let header = SliceHeader {
        view,
        zone,
        node,
        service,
        index: *index,
        count: *count,
        summary,
    };
    revision_of("switchyard.io/v1alpha2/ForwardingSlice", &header, entries)
}

/// The revision of a slice spec computed from scratch.
pub fn compute_slice(spec: &ForwardingSliceSpec) -> Result<String, Error> {
    slice_revision_with(spec, sum_of(spec.entries.iter().map(|e| &**e))?)
}

/// A spec whose stated revision is not the hash of its content: it was cut short or edited after it
/// was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The revision the spec carries.
    pub stated: String,
    /// The revision its content hashes to.
    pub computed: String,
}

/// Checks that a plan spec's content hashes to its own `revision` (see the module's diagram: the same
/// function the controller writes it with).
pub fn verify(spec: &NodeForwardingPlanSpec) -> Result<Result<(), Mismatch>, Error> {
    let computed = compute(spec)?;
    Ok(mismatch(&spec.revision, computed))
}

/// Checks that a slice spec's content hashes to its own `revision`.
pub fn verify_slice(spec: &ForwardingSliceSpec) -> Result<Result<(), Mismatch>, Error> {
    let computed = compute_slice(spec)?;
    Ok(mismatch(&spec.revision, computed))
}

fn mismatch(stated: &str, computed: String) -> Result<(), Mismatch> {
    if stated == computed {
        Ok(())
    } else {
        Err(Mismatch {
            stated: stated.to_string(),
            computed,
        })
    }
}

fn sum_of<'a>(entries: impl IntoIterator<Item = &'a ServicePlan>) -> Result<EntrySum, Error> {
    let mut sum = EntrySum::default();
    for entry in entries {
        sum.add(fingerprint(entry)?.digest);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DetectLocalMode, IpFamily, PlanEndpoint, Protocol, TrafficPolicy};
    use std::sync::Arc;

    fn entry(name: &str, ep: &str) -> ServicePlan {
        ServicePlan {
            name: name.into(),
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            cluster_ip: "172.30.0.1".into(),
            port: 80,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            affinity_timeout_seconds: None,
            external_policy: TrafficPolicy::Cluster,
            internal_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            scheduler: None,
            unready_ips: vec![],
            keep_connections: false,
            has_endpoints: true,
            endpoints: vec![PlanEndpoint {
                ip: ep.into(),
                port: 80,
                cluster: true,
                local: false,
                on_node: false,
                terminating: false,
                weight: None,
            }],
        }
    }

    fn spec(services: Vec<ServicePlan>) -> NodeForwardingPlanSpec {
        NodeForwardingPlanSpec {
            node_name: "node-a".into(),
            zone: None,
            node_ips: vec!["192.168.0.1".into()],
            pod_cidrs: vec![],
            backend: Backend::Iptables,
            cluster: ClusterSettings {
                detect_local: DetectLocalMode::ClusterCIDR,
                local_traffic_cidrs: vec!["10.0.0.0/8".into()],
                local_traffic_interface: None,
                service_cidrs: vec![],
                localhost_node_ports: false,
                masquerade_all: false,
                masquerade_bit: 14,
                node_port_addresses: vec![],
                ipvs_scheduler: None,
            },
            leaving: None,
            revision: String::new(),
            views: vec![],
            endpoints_on_node: vec![],
            local_endpoints: vec![],
            summary: PlanSummary::default(),
            overrides: vec![],
            services: services.into_iter().map(Arc::new).collect(),
        }
    }

    #[test]
    fn revision_ignores_order_and_its_own_field() {
        let a = spec(vec![entry("ns/a", "10.0.0.1"), entry("ns/b", "10.0.0.2")]);
        let mut b = spec(vec![entry("ns/b", "10.0.0.2"), entry("ns/a", "10.0.0.1")]);
        b.revision = "something".into();
        assert_eq!(compute(&a).unwrap(), compute(&b).unwrap());
        assert_eq!(compute(&a).unwrap().len(), REVISION_LEN);
    }

    #[test]
    fn revision_changes_with_any_content() {
        let base = spec(vec![entry("ns/a", "10.0.0.1")]);
        let base_rev = compute(&base).unwrap();
        let mut endpoint = base.clone();
        Arc::make_mut(&mut endpoint.services[0]).endpoints[0].ip = "10.0.0.9".into();
        let mut header = base.clone();
        header.cluster.masquerade_all = true;
        let mut node = base.clone();
        node.zone = Some("zone-a".into());
        let mut on_node = base.clone();
        on_node.endpoints_on_node = vec!["10.0.0.1".into()];
        let mut views = base.clone();
        views.views = vec!["all".into()];
        for changed in [endpoint, header, node, on_node, views] {
            assert_ne!(compute(&changed).unwrap(), base_rev);
        }
    }

    #[test]
    fn slice_revisions_cover_their_header_and_entries() {
        let slice = ForwardingSliceSpec {
            view: "all".into(),
            zone: None,
            node: None,
            service: None,
            index: 0,
            count: 2,
            revision: String::new(),
            summary: PlanSummary::default(),
            entries: vec![Arc::new(entry("ns/a", "10.0.0.1"))],
        };
        let base = compute_slice(&slice).unwrap();
        assert_eq!(base.len(), REVISION_LEN);
        let mut index = slice.clone();
        index.index = 1;
        let mut entries = slice.clone();
        Arc::make_mut(&mut entries.entries[0]).port = 81;
        for changed in [index, entries] {
            assert_ne!(compute_slice(&changed).unwrap(), base);
        }
    }

    #[test]
    fn incremental_sum_matches_recomputation() {
        let old = entry("ns/a", "10.0.0.1");
        let new = entry("ns/a", "10.0.0.2");
        let other = entry("ns/b", "10.0.0.3");
        let mut sum: EntrySum = [&old, &other]
            .iter()
            .map(|e| fingerprint(e).unwrap().digest)
            .collect();
        sum.remove(fingerprint(&old).unwrap().digest);
        sum.add(fingerprint(&new).unwrap().digest);
        let fresh = spec(vec![new, other]);
        assert_eq!(revision_with(&fresh, sum).unwrap(), compute(&fresh).unwrap());
    }
}
