//! Sharding and revisions of one node's plan, computed from per-entry digests and sizes.
//!
//! ```text
//! zone accumulators (sum of digests, bytes, counts per shard) ─► adjusted by the node's overrides
//!   ─► smallest power-of-two shard count whose every shard fits maxPlanBytes
//!   ─► revisions: shards 1.. from their own content; the primary from its content + the others' revisions
//! ```
//!
//! Shard of an entry = hash(Service key) mod count, so a change to one Service rewrites one shard and the
//! primary (which lists the others' revisions). Power-of-two counts keep assignments stable while the
//! plan grows: doubling the count splits each shard in two instead of reshuffling everything.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use switchyard_api::{
    NodeForwardingPlanSpec, PlanSummary, ShardInfo,
    revision::{EntrySum, revision_with},
};

use super::{NodeInfo, PlannedEntry, Slot, Zone, nodes::local_traffic_cidrs};
use crate::{Error, config::Config};

/// Most shards one node's plan may be split into.
pub const MAX_SHARDS: u32 = 1024;
/// Allowance for metadata, labels and managed fields the API server adds around the spec.
const OBJECT_OVERHEAD_BYTES: usize = 4096;
/// From this shard count on, a Service too big for any object on its own (all its entries share a
/// shard) no longer drives the count up: more shards cannot make it fit, and the node would end up
/// with MAX_SHARDS objects. Its shard goes over the budget instead (the API server's limit is
/// ~1.5 MiB, so a write failure and its log line tell the operator).
const OVERSIZED_CHECK_FROM: u32 = 8;

/// A node's plan objects, primary first.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePlan {
    /// The node.
    pub node: String,
    /// The Node's UID, for ownerReferences (absent in hand-written input).
    pub node_uid: Option<String>,
    /// Shard 0 (named after the node) first.
    pub objects: Vec<NodeForwardingPlanSpec>,
}

/// Running totals of one shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardAcc {
    sum: EntrySum,
    bytes: usize,
    services: u32,
    endpoints: u32,
}

/// Zone-wide accumulators per (zone, shard count), computed once and shared by the zone's nodes.
#[derive(Debug, Default)]
pub struct ZoneCache(HashMap<(Zone, u32), Vec<ShardAcc>>);

impl ZoneCache {
    fn get(&mut self, zone: &Zone, count: u32, slots: &[Slot]) -> Vec<ShardAcc> {
        self.0
            .entry((zone.clone(), count))
            .or_insert_with(|| {
                let mut accs = vec![ShardAcc::default(); count as usize];
                for slot in slots {
                    if let Some(planned) = slot.by_zone.get(zone) {
                        let acc = &mut accs[(slot.shard_hash % u64::from(count)) as usize];
                        acc.sum.add(planned.fingerprint.digest);
                        acc.bytes += planned.fingerprint.bytes + 1;
                        acc.services += 1;
                        acc.endpoints += planned.entry.endpoints.len() as u32;
                    }
                }
                accs
            })
            .clone()
    }
}

/// Every shard fits `budget` once the bytes of oversized Services (`exempt`) are left out.
fn fits(accs: &[ShardAcc], exempt: &[usize], budget: usize) -> bool {
    accs.iter()
        .zip(exempt)
        .all(|(acc, exempt)| acc.bytes.saturating_sub(*exempt) <= budget)
}

/// Bytes per shard (of `count`) taken by Services whose entries on this node alone exceed `budget`,
/// and those Services' shard hashes.
fn oversized_bytes(node: &NodeInfo, slots: &[Slot], count: u32, budget: usize) -> (Vec<usize>, Vec<u64>) {
    let mut per_service: HashMap<u64, usize> = HashMap::new();
    for slot in slots {
        let planned = slot
            .overrides
            .get(&node.name)
            .or_else(|| slot.by_zone.get(&node.zone));
        if let Some(planned) = planned {
            *per_service.entry(slot.shard_hash).or_default() += planned.fingerprint.bytes + 1;
        }
    }
    let mut exempt = vec![0; count as usize];
    let mut oversized = Vec::new();
    for (hash, bytes) in per_service {
        if bytes > budget {
            exempt[(hash % u64::from(count)) as usize] += bytes;
            oversized.push(hash);
        }
    }
    (exempt, oversized)
}

/// How one node's plan is laid out, with its revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    count: u32,
    /// Revision of each shard, primary first.
    revisions: Vec<String>,
    /// Running totals per shard, kept so one changed entry updates one shard in O(1).
    accs: Vec<ShardAcc>,
    header_bytes: usize,
    /// Bytes per shard of Services too big for any object, which the budget check leaves out.
    exempt: Vec<usize>,
    /// Shard hashes of those Services: a change to one of them lays the node out again.
    oversized: Vec<u64>,
}

/// Stable 64-bit hash of a Service key.
pub fn shard_hash(service_key: &str) -> u64 {
    let digest = Sha256::digest(service_key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// The header every object of the node's plan shares (no services, no revision, no shard).
pub fn header(node: &NodeInfo, config: &Config) -> NodeForwardingPlanSpec {
    NodeForwardingPlanSpec {
        node_name: node.name.clone(),
        zone: node.zone.clone(),
        node_ips: node.ips.iter().map(ToString::to_string).collect(),
        pod_cidrs: node.pod_cidrs.iter().map(ToString::to_string).collect(),
        backend: node.backend,
        cluster: switchyard_api::ClusterSettings {
            detect_local: config.detect_local_mode,
            local_traffic_cidrs: local_traffic_cidrs(node, config)
                .iter()
                .map(ToString::to_string)
                .collect(),
            masquerade_all: config.masquerade_all,
            masquerade_bit: config.masquerade_bit,
            node_port_addresses: config.node_port_addresses.clone(),
            ipvs_scheduler: (node.backend == switchyard_api::Backend::Ipvs)
                .then(|| config.ipvs_scheduler.clone()),
        },
        revision: String::new(),
        shard: None,
        summary: PlanSummary::default(),
        services: Vec::new(),
    }
}

impl Layout {
    /// Lays out one node: `overrides` are the indexes of slots where the node has its own answer.
    pub fn compute(
        node: &NodeInfo,
        config: &Config,
        slots: &[Slot],
        overrides: &[usize],
        cache: &mut ZoneCache,
    ) -> Result<Self, Error> {
        let header = header(node, config);
        let header_bytes = serde_json::to_vec(&header)
            .map_err(switchyard_api::Error::from)?
            .len();
        let mut count = 1u32;
        let (accs, exempt, oversized) = loop {
            let mut accs = cache.get(&node.zone, count, slots);
            for &index in overrides {
                let slot = &slots[index];
                let (Some(base), Some(own)) = (slot.by_zone.get(&node.zone), slot.overrides.get(&node.name))
                else {
                    continue;
                };
                let acc = &mut accs[(slot.shard_hash % u64::from(count)) as usize];
                acc.sum.remove(base.fingerprint.digest);
                acc.sum.add(own.fingerprint.digest);
                acc.bytes = acc.bytes.saturating_sub(base.fingerprint.bytes) + own.fingerprint.bytes;
            }
            let budget = config
                .max_plan_bytes
                .saturating_sub(header_bytes + OBJECT_OVERHEAD_BYTES);
            let (exempt, oversized) = if count >= OVERSIZED_CHECK_FROM {
                oversized_bytes(node, slots, count, budget)
            } else {
                (vec![0; count as usize], Vec::new())
            };
            if fits(&accs, &exempt, budget) || count >= MAX_SHARDS {
                break (accs, exempt, oversized);
            }
            count *= 2;
        };

        let mut layout = Self {
            count,
            revisions: vec![String::new(); count as usize],
            accs,
            header_bytes,
            exempt,
            oversized,
        };
        layout.revise(&header, 1..count)?;
        Ok(layout)
    }

    /// Applies entries that left and joined the node's plan without re-planning anything else. Returns
    /// false when the result no longer fits the byte budget, so the caller must lay the node out anew.
    pub fn apply_delta(
        &mut self,
        node: &NodeInfo,
        config: &Config,
        removed: &[(u64, &PlannedEntry)],
        added: &[(u64, &PlannedEntry)],
    ) -> Result<bool, Error> {
        let count = u64::from(self.count);
        let touches_oversized = removed
            .iter()
            .chain(added)
            .any(|(hash, _)| self.oversized.contains(hash));
        if touches_oversized {
            return Ok(false);
        }
        let mut touched = std::collections::BTreeSet::new();
        for (hash, planned) in removed {
            let index = (hash % count) as usize;
            let acc = &mut self.accs[index];
            acc.sum.remove(planned.fingerprint.digest);
            acc.bytes = acc.bytes.saturating_sub(planned.fingerprint.bytes + 1);
            acc.services = acc.services.saturating_sub(1);
            acc.endpoints = acc.endpoints.saturating_sub(planned.entry.endpoints.len() as u32);
            touched.insert(index as u32);
        }
        for (hash, planned) in added {
            let index = (hash % count) as usize;
            let acc = &mut self.accs[index];
            acc.sum.add(planned.fingerprint.digest);
            acc.bytes += planned.fingerprint.bytes + 1;
            acc.services += 1;
            acc.endpoints += planned.entry.endpoints.len() as u32;
            touched.insert(index as u32);
        }
        let budget = config
            .max_plan_bytes
            .saturating_sub(self.header_bytes + OBJECT_OVERHEAD_BYTES);
        if !fits(&self.accs, &self.exempt, budget) {
            return Ok(false);
        }
        let header = header(node, config);
        self.revise(&header, touched.into_iter().filter(|&i| i > 0))?;
        Ok(true)
    }

    /// Recomputes the revisions of the given secondary shards, then the primary's (which lists them).
    fn revise(
        &mut self,
        header: &NodeForwardingPlanSpec,
        secondaries: impl Iterator<Item = u32>,
    ) -> Result<(), Error> {
        for index in secondaries {
            let spec = shard_header(header, index, self.count, Vec::new(), self.shard_summary(index));
            self.revisions[index as usize] = revision_with(&spec, self.accs[index as usize].sum)?;
        }
        let members = self.revisions[1..].to_vec();
        let primary = shard_header(header, 0, self.count, members, self.totals());
        self.revisions[0] = revision_with(&primary, self.accs[0].sum)?;
        Ok(())
    }

    fn totals(&self) -> PlanSummary {
        PlanSummary {
            services: self.accs.iter().map(|a| a.services).sum(),
            endpoints: self.accs.iter().map(|a| a.endpoints).sum(),
        }
    }

    fn shard_summary(&self, index: u32) -> PlanSummary {
        let acc = &self.accs[index as usize];
        PlanSummary {
            services: acc.services,
            endpoints: acc.endpoints,
        }
    }

    /// The node-wide revision (the primary shard's).
    pub fn primary_revision(&self) -> &str {
        self.revisions.first().map_or("", String::as_str)
    }

    /// Number of objects.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Revisions of the objects, primary first.
    pub fn revisions(&self) -> &[String] {
        &self.revisions
    }

    /// Builds only the wanted shards' specs, as (index, spec).
    pub fn materialize_shards(
        &self,
        node: &NodeInfo,
        config: &Config,
        slots: &[Slot],
        wanted: &std::collections::BTreeSet<u32>,
    ) -> Vec<(u32, NodeForwardingPlanSpec)> {
        let header = header(node, config);
        let mut objects: Vec<(u32, NodeForwardingPlanSpec)> = wanted
            .iter()
            .filter(|&&index| index < self.count)
            .map(|&index| (index, self.shard_spec(&header, index)))
            .collect();
        let mut position = vec![None; self.count as usize];
        for (at, (index, _)) in objects.iter().enumerate() {
            position[*index as usize] = Some(at);
        }
        for slot in slots {
            let shard = (slot.shard_hash % u64::from(self.count)) as usize;
            if let (Some(at), Some(planned)) = (position[shard], slot.for_node(node)) {
                objects[at].1.services.push(planned.entry.clone());
            }
        }
        objects
    }

    fn shard_spec(&self, header: &NodeForwardingPlanSpec, index: u32) -> NodeForwardingPlanSpec {
        let (members, summary) = if index == 0 {
            (self.revisions[1..].to_vec(), self.totals())
        } else {
            (Vec::new(), self.shard_summary(index))
        };
        let mut spec = shard_header(header, index, self.count, members, summary);
        spec.revision = self.revisions[index as usize].clone();
        spec
    }

    /// Builds the objects' specs.
    pub fn materialize(&self, node: &NodeInfo, config: &Config, slots: &[Slot]) -> NodePlan {
        let all = (0..self.count).collect();
        let objects = self
            .materialize_shards(node, config, slots, &all)
            .into_iter()
            .map(|(_, spec)| spec)
            .collect();
        NodePlan {
            node: node.name.clone(),
            node_uid: node.uid.clone(),
            objects,
        }
    }
}

fn shard_header(
    header: &NodeForwardingPlanSpec,
    index: u32,
    count: u32,
    members: Vec<String>,
    summary: PlanSummary,
) -> NodeForwardingPlanSpec {
    let mut spec = header.clone();
    spec.shard = (count > 1).then_some(ShardInfo {
        index,
        count,
        members,
    });
    spec.summary = summary;
    spec
}
