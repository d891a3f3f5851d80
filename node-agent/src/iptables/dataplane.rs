//! The iptables backend of the [`Dataplane`] trait: render + one `iptables-restore --noflush` per
//! family per sync, the jump rules on full syncs, drift checks against `iptables-save`, and cleanup.
//!
//! ```text
//!                      ┌ full: iptables-save -t nat, -t filter (existing chains, missing jump rules)
//!                      │       ─► PayloadJob::Full (stale chains deleted, missing jumps inserted) ─┐
//! SyncRequest ─► per family                                                                        ├─► restore ─► Programmed
//!                      └ partial: canary still there? ─► PayloadJob::Partial (unchanged entries) ──┘    (model)
//!                        (no: full, reported as drift)
//! check_drift ─► iptables-save -t filter, -t nat ─► SavedTable ─► canary, jump rules, rule counts vs model
//! cleanup ─────► iptables-save ─► delete our jump rules ─► flush + delete every SWYD-* chain (both families)
//! ```
//!
//! A partial sync finds unchanged entries by comparing each plan entry with the one of the same key
//! in the last applied plan (and the render environment: node IPs, cluster settings, host facts; any
//! change there makes the sync full). Families: IPv4 and/or IPv6 as the plan has entries or node IPs
//! of them (IPv4 when it has neither); a family once programmed keeps being synced, so its chains
//! are emptied rather than left behind when its entries go.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{self, Write};
use std::sync::Arc;
use std::time::Instant;

use switchyard_api::{
    Backend, ClusterSettings, IpFamily, NodeForwardingPlanSpec, Protocol, ServiceFailure, ServicePlan,
    SyncMode,
};

use super::drift::{DriftSchedule, check_family, saved};
use super::names;
use super::render::{jump_rules, large_cluster};
use super::stream::{PayloadJob, Programmed, StreamMode, Streamed};
use crate::backend::{FamilyEnv, HostFacts, sync_scope};
use crate::command::RestoreInput;
use crate::error::Error;
use crate::probe::LocalAddrs;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, DriftReasons, SyncOutcome, SyncRequest};
use crate::sync::status_fields::{MAX_REASON, entry_label, short};
use crate::verify::kernel::{Kernel, KernelView};
use crate::xtables::cleanup::remove_owned;
use crate::xtables::kernel::Iptables;
use crate::xtables::payload::Table;

/// Most entries one sync leaves out because the kernel refused their rules; each costs one more
/// restore, and more than a few means something host-wide (a missing module) that isolating entries
/// cannot fix.
const MAX_REFUSED_ENTRIES: usize = 8;

/// Everything besides the entries that shapes the rendered rules of a family.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RenderEnv {
    /// The host's features (its addresses matter only through `env.node_port_ips`).
    facts: HostFacts,
    env: FamilyEnv,
    cluster: ClusterSettings,
    /// Large-cluster mode (no per-endpoint comments): a flip rewrites every Service's chains.
    large: bool,
}

#[derive(Debug, Clone)]
struct FamilyModel {
    programmed: Programmed,
    env: RenderEnv,
}

#[derive(Debug, Clone)]
struct LastApplied {
    spec: Arc<NodeForwardingPlanSpec>,
    skip: HashSet<usize>,
}

/// The iptables backend over an [`Iptables`] edge and a source of local addresses.
#[derive(Debug)]
pub struct IptablesDataplane<I, A> {
    iptables: I,
    addrs: A,
    facts: HostFacts,
    families: BTreeMap<IpFamily, FamilyModel>,
    last: Option<LastApplied>,
    /// When drift checks read whole tables.
    drift_schedule: DriftSchedule,
    /// Entries the kernel refused (left out so the rest could be applied): tried again only on full
    /// syncs or when their content changes, so one bad entry does not cost a failed restore per sync.
    refused: Vec<Refused>,
}

/// An entry the kernel refused, as it was then.
#[derive(Debug, Clone)]
struct Refused {
    entry: ServicePlan,
    failure: ServiceFailure,
}

/// Feeds a [`PayloadJob`] to `iptables-restore` and keeps what the first complete write produced.
struct JobInput<'a> {
    job: PayloadJob<'a>,
    streamed: Option<Streamed>,
}

impl RestoreInput for JobInput<'_> {
    fn write_to(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let streamed = self.job.write(out)?;
        self.streamed.get_or_insert(streamed);
        Ok(())
    }
}

impl<I: Iptables, A: LocalAddrs> IptablesDataplane<I, A> {
    /// A backend with no model yet: its first sync is full and reads the kernel's chains first.
    pub fn new(iptables: I, addrs: A, facts: HostFacts) -> Self {
        Self {
            iptables,
            addrs,
            facts,
            families: BTreeMap::new(),
            last: None,
            drift_schedule: DriftSchedule::default(),
            refused: Vec::new(),
        }
    }

    /// The edge (tests inspect their fake through it).
    pub fn iptables(&self) -> &I {
        &self.iptables
    }

    /// What was discovered about the host at start (the render's features; addresses are read per sync).
    pub fn facts(&self) -> &HostFacts {
        &self.facts
    }

    /// The reason a partial sync of `family` cannot be trusted, if the canary is gone.
    fn canary_missing(&mut self, family: IpFamily) -> Result<Option<String>, Error> {
        for table in [Table::Nat, Table::Filter] {
            if !self.iptables.chain_exists(family, table, names::CANARY)? {
                return Ok(Some(format!(
                    "{} missing from the {family:?} {table} table",
                    names::CANARY
                )));
            }
        }
        Ok(None)
    }

    /// One attempt at every family; an error says which family's restore failed.
    fn sync_families(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, (Option<IpFamily>, Error)> {
        let spec: &NodeForwardingPlanSpec = request.spec;
        let (families, local) =
            sync_scope(spec, self.families.keys().copied(), &mut self.addrs).map_err(|e| (None, e))?;
        // Cloned, not taken: a failed attempt must leave it for the retry without the refused entry.
        let last = self.last.clone();
        let previous_entries: HashMap<(&str, Protocol, IpFamily), &Arc<ServicePlan>> = last
            .as_ref()
            .map(|last| {
                last.spec
                    .services
                    .iter()
                    .enumerate()
                    .filter(|(index, _)| !last.skip.contains(index))
                    .map(|(_, entry)| (entry.key(), entry))
                    .collect()
            })
            .unwrap_or_default();
        let mut outcome = SyncOutcome::nothing();
        let mut applied: Vec<String> = Vec::new();
        for family in families {
            let facts = self.facts.with_local_addrs(local.clone());
            let result = match self.sync_family(request, family, facts, &previous_entries) {
                Ok(result) => result,
                // A family restored before this one keeps its new rules (each restore commits on its
                // own): say so rather than claim the previous rules stay everywhere.
                Err(e) if !applied.is_empty() => {
                    // The applied family's model now holds the new plan: the old `last` would make a
                    // later partial sync take reverted entries for unchanged.
                    self.last = None;
                    let error = Error::FamiliesPartlyApplied {
                        applied: applied.join(", "),
                        source: Box::new(e),
                    };
                    return Err((Some(family), error));
                }
                Err(e) => return Err((Some(family), e)),
            };
            applied.push(format!("{family:?}"));
            if result.full {
                outcome.mode = SyncMode::Full;
            }
            outcome.rules += result.rules as u64;
            outcome.written += result.written;
            outcome.removed += result.removed;
            outcome.drift = outcome.drift.or(result.drift);
        }
        drop(previous_entries);
        self.last = Some(LastApplied {
            spec: Arc::clone(request.spec),
            skip: request.skip.clone(),
        });
        Ok(outcome)
    }

    fn sync_family(
        &mut self,
        request: SyncRequest<'_>,
        family: IpFamily,
        facts: HostFacts,
        previous_entries: &HashMap<(&str, Protocol, IpFamily), &Arc<ServicePlan>>,
    ) -> Result<FamilyResult, Error> {
        let spec: &NodeForwardingPlanSpec = request.spec;
        let env = RenderEnv {
            facts: self.facts.clone(),
            env: FamilyEnv::new(spec, family, &facts.local_addrs),
            cluster: spec.cluster.clone(),
            large: large_cluster(spec, family, request.skip),
        };
        // Whatever happens next, the old model no longer describes the kernel with certainty: it is
        // taken out now and replaced after a successful restore (or put back after a refused one).
        let model = self.families.remove(&family).filter(|m| m.env == env);
        let started = Instant::now();
        let mut drift = None;
        let partial_model = match model {
            Some(model) if !request.full => match self.canary_missing(family)? {
                None => Some(model),
                Some(reason) => {
                    drift = Some(reason);
                    None
                }
            },
            _ => None,
        };
        let unchanged =
            |_: usize, entry: &Arc<ServicePlan>| previous_entries.get(&entry.key()) == Some(&entry);
        let existing;
        let existing_filter;
        let mut missing_jumps = Vec::new();
        let mode = match &partial_model {
            Some(model) => StreamMode::Partial {
                previous: &model.programmed,
                unchanged: &unchanged,
            },
            None => {
                // One iptables-save per table tells which chains exist (stale ones get deleted) and which
                // jump rules are missing (they get inserted in the same transaction): no per-rule
                // `iptables -C`, which costs tens of milliseconds each with iptables-nft at scale.
                let (nat, filter) = (
                    saved(&mut self.iptables, family, Table::Nat)?,
                    saved(&mut self.iptables, family, Table::Filter)?,
                );
                let wanted = jump_rules(family);
                missing_jumps = wanted
                    .iter()
                    .filter(|jump| {
                        let saved = if jump.table == Table::Nat { &nat } else { &filter };
                        !saved.has_jump(jump)
                    })
                    .cloned()
                    .collect();
                // Jumps into our chains that no current rule explains (an older layout's, or one with
                // an older comment) go first: a chain still referenced cannot be deleted, and an old
                // jump would keep steering packets (kubernetes#132516).
                for (table, saved) in [(Table::Nat, &nat), (Table::Filter, &filter)] {
                    for stale in saved.jumps.iter().filter(|j| !wanted.iter().any(|w| j.is(w))) {
                        self.iptables
                            .delete_rule(family, table, stale.chain, &stale.args)?;
                        tracing::info!(?family, %table, chain = stale.chain, target = stale.target(), "deleted stale jump rule");
                    }
                }
                existing = nat.owned.into_keys().collect::<BTreeSet<String>>();
                existing_filter = filter.owned.into_keys().collect::<BTreeSet<String>>();
                StreamMode::Full {
                    existing: &existing,
                    existing_filter: &existing_filter,
                }
            }
        };
        let full = matches!(mode, StreamMode::Full { .. });
        let checked = started.elapsed();
        let mut input = JobInput {
            job: PayloadJob {
                spec,
                facts: &facts,
                family,
                skip: request.skip,
                mode,
                jumps: &missing_jumps,
            },
            streamed: None,
        };
        let restored = self.iptables.restore(family, &mut input);
        let JobInput { streamed, .. } = input;
        if let Err(error) = restored {
            // iptables-restore commits all or nothing: after a refusal the kernel still matches the
            // model, so the next attempt can stay partial.
            if matches!(error, Error::IptablesRestore { .. })
                && let Some(model) = partial_model
            {
                self.families.insert(family, model);
            }
            return Err(error);
        }
        let streamed = streamed.ok_or_else(|| Error::RunCommand {
            command: "iptables-restore".into(),
            source: io::Error::other("the payload was not written completely"),
        })?;
        for jump in &missing_jumps {
            tracing::info!(?family, table = %jump.table, chain = jump.chain, target = jump.target(), "inserted jump rule");
        }
        let result = FamilyResult {
            full,
            rules: streamed.programmed.rules(),
            written: streamed.written.len(),
            removed: streamed.stale.len() + streamed.stale_filter.len(),
            drift,
        };
        tracing::debug!(
            ?family,
            full,
            written = streamed.written.len(),
            top_level = ?streamed.top_written,
            stale = streamed.stale.len(),
            read_kernel_ms = checked.as_millis() as u64,
            render_and_restore_ms = (started.elapsed() - checked).as_millis() as u64,
            "restored"
        );
        self.families.insert(
            family,
            FamilyModel {
                programmed: streamed.programmed,
                env,
            },
        );
        Ok(result)
    }
}

struct FamilyResult {
    full: bool,
    rules: usize,
    written: usize,
    removed: usize,
    drift: Option<String>,
}

impl<I: Iptables, A: LocalAddrs> Dataplane for IptablesDataplane<I, A> {
    fn backend(&self) -> Backend {
        Backend::Iptables
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let spec = request.spec;
        let mut skip = request.skip.clone();
        let mut left_out = Vec::new();
        // Entries refused before and unchanged since stay out until a full sync tries them again.
        let known = std::mem::take(&mut self.refused);
        if !request.full {
            for (index, entry) in spec.services.iter().enumerate() {
                if skip.contains(&index) {
                    continue;
                }
                if let Some(refused) = known.iter().find(|r| r.entry == **entry) {
                    skip.insert(index);
                    left_out.push(index);
                    self.refused.push(refused.clone());
                }
            }
        }
        loop {
            let attempt = SyncRequest {
                spec,
                skip: &skip,
                full: request.full,
            };
            let (family, error) = match self.sync_families(attempt) {
                Ok(mut outcome) => {
                    outcome.left_out = left_out;
                    return Ok(outcome);
                }
                Err(failed) => failed,
            };
            // A restore is atomic, so the kernel still holds the previous rules: leave the refused
            // entry out and apply everything else, as the plan's other entries deserve.
            let refused = family
                .filter(|_| self.refused.len() < MAX_REFUSED_ENTRIES)
                .and_then(|family| refused_entry(spec, family, &skip, &error));
            let Some(index) = refused else {
                return Err(error);
            };
            let label = entry_label(spec, index);
            tracing::warn!(entry = %label, %error, "the kernel refused this entry's rules; applying the others without it");
            let mut reason = format!("refused by the kernel: {}", error.root());
            if let Some(line) = error.failing_line() {
                reason.push_str(&format!("; the refused line: {line}"));
            }
            self.refused.push(Refused {
                entry: ServicePlan::clone(&spec.services[index]),
                failure: ServiceFailure {
                    service: label,
                    reason: short(&reason, MAX_REASON),
                },
            });
            skip.insert(index);
            left_out.push(index);
        }
    }

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        self.refused.iter().map(|r| r.failure.clone()).collect()
    }

    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        let started = Instant::now();
        let whole = self.drift_schedule.whole_due(started);
        let mut reasons = DriftReasons::default();
        let mut result = Ok(());
        for (family, model) in &self.families {
            result = check_family(
                &mut self.iptables,
                *family,
                &model.programmed,
                whole,
                &mut reasons,
            );
            if result.is_err() {
                break;
            }
        }
        self.drift_schedule.record(whole, started.elapsed());
        result?;
        Ok(reasons.finish())
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        self.forget();
        remove_owned(&mut self.iptables)
    }

    fn forget(&mut self) {
        self.families.clear();
        self.last = None;
    }

    fn kernel_view(&mut self) -> Result<Option<KernelView>, Error> {
        let local = self.addrs.local_addrs()?;
        let families: Vec<IpFamily> = self.families.keys().copied().collect();
        let mut saves = BTreeMap::new();
        for family in families {
            let tables = [Table::Nat, Table::Filter]
                .into_iter()
                .map(|table| self.iptables.save(family, table))
                .collect::<Result<Vec<_>, _>>()?;
            saves.insert(family, tables);
        }
        Ok(Some(KernelView {
            facts: self.facts.with_local_addrs(local),
            kernel: Kernel::Iptables(saves),
            leftovers: Vec::new(),
        }))
    }
}

/// The entry whose rule a restore error names: the entry name that starts the failing rule's
/// comment, or the hash in a per-service chain name (declarations carry no comment).
fn refused_entry(
    spec: &NodeForwardingPlanSpec,
    family: IpFamily,
    skip: &HashSet<usize>,
    error: &Error,
) -> Option<usize> {
    let line = error.failing_line()?;
    let commented = line.split_once("--comment ").map(|(_, rest)| {
        let rest = rest.strip_prefix('"').unwrap_or(rest);
        rest.split([' ', '"']).next().unwrap_or_default()
    });
    let candidates = || {
        spec.services
            .iter()
            .enumerate()
            .filter(move |(index, entry)| entry.family == family && !skip.contains(index))
    };
    if let Some(name) = commented.filter(|n| !n.is_empty())
        && let Some((index, _)) = candidates().find(|(_, entry)| entry.name == name)
    {
        return Some(index);
    }
    let hashes: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ':')
        .filter_map(|token| {
            ["SWYD-SVC-", "SWYD-SVL-", "SWYD-EXT-", "SWYD-FW-"]
                .iter()
                .find_map(|prefix| token.strip_prefix(prefix))
        })
        .collect();
    if hashes.is_empty() {
        return None;
    }
    candidates()
        .find(|(_, entry)| {
            let hash = names::port_proto_hash(&entry.name, entry.protocol.lower());
            hashes.contains(&hash.as_str())
        })
        .map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn between_whole_table_checks_the_top_level_chains_and_jumps_are_still_checked() {
        use crate::probe::FixedAddrs;
        use crate::xtables::fake::FakeIptables;
        let local: Vec<std::net::IpAddr> = vec!["192.168.10.11".parse().unwrap()];
        let fake = FakeIptables::new(&local);
        let mut dp = IptablesDataplane::new(fake.clone(), FixedAddrs(local), HostFacts::default());
        let mut spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        switchyard_api::testing::finish(&mut spec);
        let spec = Arc::new(spec);
        let skip = HashSet::new();
        dp.sync(SyncRequest {
            spec: &spec,
            skip: &skip,
            full: true,
        })
        .unwrap();
        assert_eq!(dp.check_drift().unwrap(), None);
        // As after an expensive whole-table check at scale.
        let later = Some(Instant::now() + std::time::Duration::from_secs(3600));

        dp.drift_schedule.defer_whole(later);
        let per_service = names::cluster_policy_chain("ns/a:p", "tcp");
        assert!(fake.flush_chain(IpFamily::IPv4, Table::Nat, &per_service));
        assert_eq!(
            dp.check_drift().unwrap(),
            None,
            "per-Service chains wait for the whole-table check"
        );
        dp.drift_schedule.defer_whole(None);
        let drift = dp.check_drift().unwrap().unwrap();
        assert!(drift.to_string().contains(&per_service), "{drift}");

        dp.drift_schedule.defer_whole(later);
        assert!(fake.flush_chain(IpFamily::IPv4, Table::Nat, names::SERVICES));
        let drift = dp.check_drift().unwrap().unwrap();
        assert!(drift.to_string().contains("SWYD-SERVICES has 0 rules"), "{drift}");

        dp.drift_schedule.defer_whole(later);
        assert!(fake.remove_jump(IpFamily::IPv4, Table::Nat, "PREROUTING", names::SERVICES));
        let drift = dp.check_drift().unwrap().unwrap();
        assert!(
            drift
                .to_string()
                .contains("jump PREROUTING -> SWYD-SERVICES is missing"),
            "{drift}"
        );
    }

    /// kubernetes#132516: a full sync over tables an older layout wrote leaves none of it: chains of
    /// ours it does not render, in either table, and the built-in jumps into them.
    #[test]
    fn a_full_sync_over_an_older_layout_keeps_nothing_stale() {
        use crate::probe::FixedAddrs;
        use crate::xtables::fake::FakeIptables;
        let local: Vec<std::net::IpAddr> = vec!["192.168.10.11".parse().unwrap()];
        let fake = FakeIptables::new(&local);
        fake.restore_text(
            IpFamily::IPv4,
            "*nat\n:SWYD-SERVICES - [0:0]\n:SWYD-OLD-DISPATCH - [0:0]\n\
             -A SWYD-OLD-DISPATCH -p tcp -j DNAT --to-destination 10.244.9.9:80\n\
             -A SWYD-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SWYD-OLD-DISPATCH\n\
             -A PREROUTING -m comment --comment \"switchyard old layout\" -j SWYD-OLD-DISPATCH\nCOMMIT\n\
             *filter\n:SWYD-OLD-FIREWALL - [0:0]\n-A SWYD-OLD-FIREWALL -j DROP\n\
             -A FORWARD -j SWYD-OLD-FIREWALL\nCOMMIT\n",
        )
        .unwrap();
        let mut dp = IptablesDataplane::new(fake.clone(), FixedAddrs(local), HostFacts::default());
        let mut spec = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        switchyard_api::testing::finish(&mut spec);
        let spec = Arc::new(spec);
        dp.sync(SyncRequest {
            spec: &spec,
            skip: &HashSet::new(),
            full: true,
        })
        .unwrap();
        let dump = fake.dump(IpFamily::IPv4);
        for stale in ["OLD", "10.244.9.9"] {
            assert!(!dump.contains(stale), "{stale} survived:\n{dump}");
        }
        assert!(
            dump.contains(&names::cluster_policy_chain("ns/a:p", "tcp")),
            "{dump}"
        );
        assert_eq!(dp.check_drift().unwrap(), None);
    }
}
