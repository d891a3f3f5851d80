//! The nftables backend of the [`Dataplane`] trait: one `nft -f` transaction per family per sync, built
//! from a diff, never from a flush.
//!
//! ```text
//!                    ┌ full:    nft -j list table (read back) ─► render() ─► diff(kernel, desired) ─┐
//! SyncRequest ─► per family                                                                        ├─► Nft::apply ─► model
//!                    └ partial: table still there? (netlink) ─► incremental::delta(model) ─────────┘   (TableState)
//!                                          (Nft::apply: element changes only → netlink batch, else nft -f -)
//!                               (no: full, reported as drift; a contested key: full)
//! check_drift ─► netlink summary (chains, rule counts + digests, set element counts) vs model
//! cleanup ─────► delete table ip switchyard, delete table ip6 switchyard
//! ```
//!
//! Full syncs (start, after a failure, drift, the full-sync period) read the kernel's table back and
//! change only what differs, so a restarted agent leaves working rules alone. Partial syncs diff
//! against the model of the last successful sync. A failed transaction changes nothing in the kernel
//! (nft transactions are atomic); the model is dropped and the next sync is full.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, ServicePlan, SyncMode};

use super::diff::diff;
use super::incremental::delta;
use super::kernel::{Nft, summary_differences};
use super::model::TableState;
use super::names::TABLE;
use super::render::render_in;
use super::transaction::{Op, Transaction};
use crate::backend::{FamilyEnv, HostFacts, sync_scope};
use crate::error::Error;
use crate::probe::LocalAddrs;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, DriftReasons, SyncOutcome, SyncRequest};
use crate::verify::kernel::{Kernel, KernelView};

#[derive(Debug)]
struct FamilyModel {
    env: FamilyEnv,
    state: TableState,
}

#[derive(Debug, Clone)]
struct LastApplied {
    spec: Arc<NodeForwardingPlanSpec>,
    skip: HashSet<usize>,
}

/// The nftables backend over an [`Nft`] edge and a source of local addresses.
#[derive(Debug)]
pub struct NftablesDataplane<N, A> {
    nft: N,
    addrs: A,
    families: BTreeMap<IpFamily, FamilyModel>,
    last: Option<LastApplied>,
}

struct FamilyResult {
    full: bool,
    programmed: usize,
    written: usize,
    removed: usize,
    drift: Option<String>,
}

fn entries_of<'a>(
    spec: &'a NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    family: IpFamily,
) -> Vec<&'a Arc<ServicePlan>> {
    spec.services
        .iter()
        .enumerate()
        .filter(|(index, entry)| entry.family == family && !skip.contains(index))
        .map(|(_, entry)| entry)
        .collect()
}

fn removed_objects(transaction: &Transaction<'_>) -> usize {
    transaction
        .ops
        .iter()
        .filter(|op| matches!(op, Op::DeleteChain(_) | Op::DeleteSet(_)))
        .count()
}

impl<N: Nft, A: LocalAddrs> NftablesDataplane<N, A> {
    /// A backend with no model yet: its first sync is full and reads the kernel's table first.
    pub fn new(nft: N, addrs: A) -> Self {
        Self {
            nft,
            addrs,
            families: BTreeMap::new(),
            last: None,
        }
    }

    /// The edge (tests inspect their fake through it).
    pub fn nft(&self) -> &N {
        &self.nft
    }

    /// The edge, mutable (tests tamper with their fake through it).
    pub fn nft_mut(&mut self) -> &mut N {
        &mut self.nft
    }

    fn sync_family(
        &mut self,
        request: SyncRequest<'_>,
        family: IpFamily,
        env: FamilyEnv,
        last: Option<&LastApplied>,
    ) -> Result<FamilyResult, Error> {
        let spec: &NodeForwardingPlanSpec = request.spec;
        let started = Instant::now();
        // Whatever happens next, the old model no longer describes the kernel with certainty: it is
        // taken out now and put back only after a successful transaction.
        let model = self.families.remove(&family).filter(|m| m.env == env);
        let mut drift = None;
        let mut partial = None;
        if let (Some(mut model), Some(last), false) = (model, last, request.full) {
            if self.nft.exists(family)? {
                let previous = entries_of(&last.spec, &last.skip, family);
                let current = entries_of(spec, request.skip, family);
                match delta(&mut model.state, &env, &previous, &current) {
                    Ok(delta) => partial = Some((model.state, delta)),
                    Err(conflict) => {
                        tracing::info!(?family, reason = %conflict.0, "partial sync not possible; syncing in full");
                    }
                }
            } else {
                drift = Some(format!(
                    "table {} {TABLE} is gone",
                    super::model::family_keyword(family)
                ));
            }
        }
        let (state, full, written, removed) = match partial {
            Some((state, delta)) => {
                let removed = self.apply_timed(family, &delta.transaction, false, started)?;
                (state, false, delta.entries, removed)
            }
            None => {
                let before = self.nft.read(family)?;
                let desired = render_in(spec, &env, request.skip);
                let transaction = diff(before.as_ref(), &desired);
                // The table read back is no longer needed: dropped before the apply, the agent's
                // peak holds one table (the desired one, which the transaction borrows), not two.
                drop(before);
                let written = transaction.chain_changes() + transaction.element_changes();
                let removed = self.apply_timed(family, &transaction, true, started)?;
                drop(transaction);
                (desired, true, written, removed)
            }
        };
        let result = FamilyResult {
            full,
            programmed: state.rule_count() + state.element_count(),
            written,
            removed,
            drift,
        };
        self.families.insert(family, FamilyModel { env, state });
        Ok(result)
    }

    /// Applies `transaction` (unless empty), logs its size and timings, and returns how many chains
    /// and sets it removed.
    fn apply_timed(
        &mut self,
        family: IpFamily,
        transaction: &Transaction<'_>,
        full: bool,
        started: Instant,
    ) -> Result<usize, Error> {
        let computed = started.elapsed();
        if !transaction.is_empty() {
            self.nft.apply(transaction)?;
        }
        tracing::debug!(
            ?family,
            full,
            ops = transaction.ops.len(),
            elements = transaction.element_changes(),
            chains = transaction.chain_changes(),
            render_and_diff_ms = computed.as_millis() as u64,
            apply_ms = (started.elapsed() - computed).as_millis() as u64,
            "nft transaction applied"
        );
        Ok(removed_objects(transaction))
    }
}

impl<N: Nft, A: LocalAddrs> Dataplane for NftablesDataplane<N, A> {
    fn backend(&self) -> Backend {
        Backend::Nftables
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let spec: &NodeForwardingPlanSpec = request.spec;
        let (families, local) = sync_scope(spec, self.families.keys().copied(), &mut self.addrs)?;
        let last = self.last.take();
        let mut outcome = SyncOutcome::nothing();
        for family in families {
            let env = FamilyEnv::new(spec, family, &local);
            let result = self.sync_family(request, family, env, last.as_ref())?;
            if result.full {
                outcome.mode = SyncMode::Full;
            }
            outcome.rules += result.programmed as u64;
            outcome.written += result.written;
            outcome.removed += result.removed;
            outcome.drift = outcome.drift.or(result.drift);
        }
        self.last = Some(LastApplied {
            spec: Arc::clone(request.spec),
            skip: request.skip.clone(),
        });
        Ok(outcome)
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        let mut reasons = DriftReasons::default();
        let families: Vec<IpFamily> = self.families.keys().copied().collect();
        for family in families {
            let summary = self.nft.summary(family)?;
            let Some(model) = self.families.get(&family) else {
                continue;
            };
            match summary {
                None => reasons.note(format!(
                    "table {} {TABLE} is gone",
                    super::model::family_keyword(family)
                )),
                Some(summary) => reasons.extend(summary_differences(&model.state, &summary)),
            }
        }
        Ok(reasons.finish())
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        self.forget();
        let mut cleanup = Cleanup::default();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let summary = match self.nft.summary(family) {
                Ok(Some(summary)) => summary,
                Ok(None) => continue,
                Err(e) if family == IpFamily::IPv6 => {
                    // A host without IPv6 netfilter has nothing of ours there.
                    tracing::warn!(error = %e, "skipping IPv6 cleanup");
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.nft.apply(&Transaction {
                family,
                ops: vec![Op::DeleteTable],
            })?;
            cleanup.objects += summary.chains.len() + summary.sets.len();
        }
        Ok(cleanup)
    }

    fn forget(&mut self) {
        self.families.clear();
        self.last = None;
    }

    fn kernel_view(&mut self) -> Result<Option<KernelView>, Error> {
        let local = self.addrs.local_addrs()?;
        let families: Vec<IpFamily> = self.families.keys().copied().collect();
        let mut tables = BTreeMap::new();
        for family in families {
            tables.insert(family, self.nft.read(family)?);
        }
        Ok(Some(KernelView {
            facts: HostFacts::default().with_local_addrs(local),
            kernel: Kernel::Nftables(tables),
            leftovers: Vec::new(),
        }))
    }
}
