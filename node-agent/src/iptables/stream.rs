//! Restore payloads written while the render runs, so a sync never holds the whole ruleset or payload,
//! and partial syncs that render only what changed.
//!
//! ```text
//! pass 1: spec ─► render_selected() ─┬─ changed entries: chain group ─► Programmed (names, counts,
//!                 (wanted = changed)  │                                  frontends; kept for writing if partial)
//!                                     └─ unchanged entries: top-level rules only; group carried over
//!         (partial, same entries in the same order: render_groups() of the changed ones first; if none
//!          changed its frontends, the top-level chains are carried over and render_selected() is skipped)
//!         top-level chains ─► written when their rules changed (always when full)
//!         stale chains (gone from the new model) ─► flushed, then deleted
//! write:  sorted declarations ─► rules (full: pass 2 renders again, streaming) ─► -X stale ─► -I jumps
//!                                                  │
//!                                                  ▼
//!                          io::Write (iptables-restore's stdin, or a buffer)
//! ```
//!
//! At 10,000 services × 5 endpoints the full [`Ruleset`](super::Ruleset) is about 35 MB and its payload
//! 25 MB; a full sync keeps neither. It renders twice instead (about 0.1 s at that size): once to learn
//! every chain name, which must all be declared before the first rule and in sorted order (declared
//! out of order, iptables-nft-restore takes twice as long at 1,000 services and much worse beyond), and
//! once to stream the rules. What the edge keeps is [`Programmed`]: per entry, its chain names and rule
//! counts (for stale-chain and drift detection), and a fingerprint per top-level chain.
//!
//! A partial sync asks the caller which entries are unchanged (the edge compares plan entries, which
//! is far cheaper than rendering them: the 160,000 per-service rules are most of a full render's time)
//! and renders only the others. Most changes (an endpoint replaced) leave every frontend as it was: then
//! not even the unchanged entries' top-level rules are rendered (~50 ms at 10,000 Services), as each
//! group's model keeps a fingerprint of its frontends and the model one of the entries' order. Top-level
//! chains whose rules did not change are not rewritten either,
//! unlike kube-proxy, which rewrites them on every sync: with iptables-nft, flushing and refilling a
//! 10,000-rule `SERVICES` chain costs about 0.7 s, the one changed service's chains 20-40 ms.
//!
//! The payload has the same chains and rules as [`Ruleset::full_payload`](super::Ruleset::full_payload)
//! in another order, which `iptables-restore` accepts equally (tests check both give the same state):
//!
//! ```text
//! *nat
//! :<every chain written, stale ones too> - [0:0]   sorted
//! -A <group rules> / -A <changed top-level rules>  (every chain is declared before any rule jumps to it,
//! -X <stale>                                        which iptables-legacy needs at parse time)
//! -I <built-in chain> 1 <jump rule>                full syncs, the jump rules iptables-save showed missing
//! COMMIT
//! *filter                                          top-level chains only (when changed), jump rules
//! ...
//! COMMIT
//! ```

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::{self, Write};
use std::sync::Arc;

use switchyard_api::{EntryKey, IpFamily, NodeForwardingPlanSpec, ServicePlan};

use super::names;
use super::render::{render_each, render_groups, render_selected};
use super::ruleset::ServiceChains;
use crate::backend::HostFacts;
use crate::xtables::jumps::JumpRule;
use crate::xtables::payload::{Chain, Table, write_declaration, write_rules};

/// One entry's chains with their rule counts, shared so partial syncs carry unchanged entries over.
pub type GroupChains = Arc<[(String, usize)]>;

/// What our chains of one family hold after a successful restore, as far as the agent knows: the model
/// partial syncs and drift detection compare against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Programmed {
    groups: HashMap<EntryKey, GroupModel>,
    top: BTreeMap<(Table, String), (u64, usize)>,
    /// A fingerprint of the entries' keys in plan order: with it and every changed entry's frontends
    /// unchanged, the top-level chains are known to be unchanged without rendering them.
    order: u64,
}

/// What the model keeps of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupModel {
    chains: GroupChains,
    /// [`ServiceChains::frontends`].
    frontends: u64,
}

impl Programmed {
    /// Rules in all our chains of both tables.
    pub fn rules(&self) -> usize {
        let groups: usize = self
            .groups
            .values()
            .flat_map(|g| g.chains.iter())
            .map(|(_, n)| n)
            .sum();
        groups + self.top.values().map(|(_, n)| n).sum::<usize>()
    }

    /// Entries with a chain group (possibly empty).
    pub fn entries(&self) -> usize {
        self.groups.len()
    }

    /// The chains of one entry.
    pub fn group(&self, key: &EntryKey) -> Option<&GroupChains> {
        self.groups.get(key).map(|g| &g.chains)
    }

    /// The top-level chains of `table` (shared by every entry) with the number of rules each must hold.
    pub fn top_chain_counts(&self, table: Table) -> Vec<(&str, usize)> {
        self.top
            .iter()
            .filter(|((t, _), _)| *t == table)
            .map(|((_, name), (_, n))| (name.as_str(), *n))
            .collect()
    }

    /// Every owned chain of `table` with the number of rules it must hold.
    pub fn chain_counts(&self, table: Table) -> HashMap<&str, usize> {
        let mut counts: HashMap<&str, usize> = self
            .top
            .iter()
            .filter(|((t, _), _)| *t == table)
            .map(|((_, name), (_, n))| (name.as_str(), *n))
            .collect();
        if table == Table::Nat {
            counts.extend(
                self.groups
                    .values()
                    .flat_map(|g| g.chains.iter())
                    .map(|(name, n)| (name.as_str(), *n)),
            );
        }
        counts
    }

    /// Every nat chain of the model (each name once: names hash their entry, top-level ones are fixed).
    fn names(&self) -> impl Iterator<Item = &str> {
        self.top
            .keys()
            .filter(|(t, _)| *t == Table::Nat)
            .map(|(_, name)| name.as_str())
            .chain(
                self.groups
                    .values()
                    .flat_map(|g| g.chains.iter())
                    .map(|(name, _)| name.as_str()),
            )
    }
}

/// Which payload to write.
#[derive(Clone, Copy)]
pub enum StreamMode<'a> {
    /// Every owned chain declared and written, canary included. `existing` and `existing_filter` are
    /// our chains the kernel holds now (from `iptables-save`); every one no longer rendered is deleted,
    /// whatever wrote it (an older layout's chains, kubernetes#132516).
    Full {
        /// Our chains present in the kernel's nat table.
        existing: &'a BTreeSet<String>,
        /// Our chains present in the kernel's filter table.
        existing_filter: &'a BTreeSet<String>,
    },
    /// The groups of changed entries and the top-level chains whose rules changed; chains `previous`
    /// had that are gone are deleted. The canary is not declared.
    Partial {
        /// The model of this family after the last successful sync.
        previous: &'a Programmed,
        /// True for an entry (plan index, entry) the caller knows renders exactly as last time.
        unchanged: &'a dyn Fn(usize, &Arc<ServicePlan>) -> bool,
    },
}

/// What a written payload leaves in the kernel once restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Streamed {
    /// The new model.
    pub programmed: Programmed,
    /// Entries whose chain groups were written, in plan order.
    pub written: Vec<EntryKey>,
    /// Top-level chains written (`table chain`).
    pub top_written: Vec<String>,
    /// Chains deleted as stale, sorted.
    pub stale: Vec<String>,
    /// Filter chains deleted as stale (full syncs only), sorted.
    pub stale_filter: Vec<String>,
}

/// One family's payload, ready to be written (as often as needed: writing is deterministic).
#[derive(Clone, Copy)]
pub struct PayloadJob<'a> {
    /// The plan.
    pub spec: &'a NodeForwardingPlanSpec,
    /// What the edge discovered about the host, for this family.
    pub facts: &'a HostFacts,
    /// Which family.
    pub family: IpFamily,
    /// Entry indexes that failed validation.
    pub skip: &'a HashSet<usize>,
    /// Full or partial.
    pub mode: StreamMode<'a>,
    /// Jump rules from built-in chains to insert in the same transaction (those `iptables-save`
    /// showed missing; empty in partial syncs).
    pub jumps: &'a [JumpRule],
}

fn fingerprint(rules: &[String]) -> u64 {
    let mut hasher = DefaultHasher::new();
    rules.hash(&mut hasher);
    hasher.finish()
}

/// Puts a rendered group into the new model, and keeps it for writing in a partial sync (a full sync
/// renders again while writing).
fn record(streamed: &mut Streamed, pending: &mut Vec<ServiceChains>, full: bool, group: ServiceChains) {
    let chains: GroupChains = group
        .chains
        .iter()
        .map(|c| (c.name.clone(), c.rules.len()))
        .collect();
    streamed.written.push(group.key.clone());
    let model = GroupModel {
        chains,
        frontends: group.frontends,
    };
    streamed.programmed.groups.insert(group.key.clone(), model);
    if !full {
        pending.push(group);
    }
}

impl PayloadJob<'_> {
    /// Renders and writes the payload to `out`.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<Streamed> {
        let full = matches!(self.mode, StreamMode::Full { .. });
        let mut streamed = Streamed::default();

        // Pass 1: the new model (every entry's chain names and rule counts), and in a partial sync the
        // few groups to write, kept until the declarations are out.
        let carried: HashSet<usize> = match self.mode {
            StreamMode::Full { .. } => HashSet::new(),
            StreamMode::Partial { previous, unchanged } => self
                .entries()
                .filter(|(index, entry)| unchanged(*index, entry))
                .filter_map(|(index, entry)| {
                    let key = entry.entry_key();
                    let group = previous.groups.get(&key)?;
                    streamed.programmed.groups.insert(key, group.clone());
                    Some(index)
                })
                .collect(),
        };
        streamed.programmed.order = self.order();
        let mut pending: Vec<ServiceChains> = Vec::new();
        let changed = |index: usize, _: &ServicePlan| !carried.contains(&index);
        // A partial sync where the entries are the same ones in the same order and no changed entry's
        // frontends changed (an endpoint replaced, say) leaves the top-level chains as they are: only the
        // changed entries are rendered.
        let frontends_unchanged = match self.mode {
            StreamMode::Partial { previous, .. } if previous.order == streamed.programmed.order => {
                let mut same = true;
                render_groups(
                    self.spec,
                    self.facts,
                    self.family,
                    self.skip,
                    &changed,
                    &mut |_, group| {
                        same &= previous
                            .groups
                            .get(&group.key)
                            .is_some_and(|old| old.frontends == group.frontends);
                        record(&mut streamed, &mut pending, full, group);
                    },
                );
                if same {
                    streamed.programmed.top = previous.top.clone();
                } else {
                    // Rendered again below, with every entry's frontends.
                    streamed.written.clear();
                    pending.clear();
                }
                same
            }
            _ => false,
        };
        let top;
        let (nat, filter) = if frontends_unchanged {
            (Vec::new(), Vec::new())
        } else {
            top = render_selected(
                self.spec,
                self.facts,
                self.family,
                self.skip,
                &changed,
                &mut |_, group| record(&mut streamed, &mut pending, full, group),
            );
            (
                self.top_chains(Table::Nat, top.nat_chains(), &mut streamed),
                self.top_chains(Table::Filter, top.filter_chains(), &mut streamed),
            )
        };
        streamed.stale = self.stale(&streamed);

        // Declarations first, sorted: iptables-nft-restore takes about twice as long (and worse as the
        // table grows) when chains are declared out of order.
        out.write_all(b"*nat\n")?;
        let mut declared: Vec<&str> = if full {
            streamed.programmed.names().collect()
        } else {
            pending
                .iter()
                .flat_map(|g| g.chains.iter().map(|c| c.name.as_str()))
                .chain(nat.iter().map(|c| c.name.as_str()))
                .collect()
        };
        declared.extend(streamed.stale.iter().map(String::as_str));
        declared.sort_unstable();
        declared.dedup();
        for name in declared {
            write_declaration(out, name)?;
        }

        // Pass 2: the rules. A full sync renders again and streams every group; a partial one writes
        // the groups it kept.
        if full {
            let mut failure: Option<io::Error> = None;
            render_each(self.spec, self.facts, self.family, self.skip, &mut |group| {
                if failure.is_none()
                    && let Err(e) = group.chains.iter().try_for_each(|c| write_rules(out, c))
                {
                    failure = Some(e);
                }
            });
            if let Some(e) = failure {
                return Err(e);
            }
        } else {
            for chain in pending.iter().flat_map(|g| g.chains.iter()) {
                write_rules(out, chain)?;
            }
        }
        for chain in &nat {
            write_rules(out, chain)?;
        }
        for name in &streamed.stale {
            writeln!(out, "-X {name}")?;
        }
        self.write_jumps(out, Table::Nat)?;
        out.write_all(b"COMMIT\n")?;

        if let StreamMode::Full { existing_filter, .. } = self.mode {
            let live: HashSet<&str> = filter.iter().map(|c| c.name.as_str()).collect();
            streamed.stale_filter = existing_filter
                .iter()
                .filter(|name| !live.contains(name.as_str()))
                .cloned()
                .collect();
        }
        let jumps_into_filter = self.jumps.iter().any(|j| j.table == Table::Filter);
        if full || !filter.is_empty() || jumps_into_filter {
            out.write_all(b"*filter\n")?;
            let mut declared: Vec<&str> = filter.iter().map(|c| c.name.as_str()).collect();
            declared.extend(streamed.stale_filter.iter().map(String::as_str));
            declared.sort_unstable();
            for name in declared {
                write_declaration(out, name)?;
            }
            for chain in &filter {
                write_rules(out, chain)?;
            }
            for name in &streamed.stale_filter {
                writeln!(out, "-X {name}")?;
            }
            self.write_jumps(out, Table::Filter)?;
            out.write_all(b"COMMIT\n")?;
        }
        Ok(streamed)
    }

    /// `-I <chain> 1 <args>` for the jump rules of `table` to insert, in order (so the last one of a
    /// chain ends up first, as `iptables -I` one at a time would leave them).
    fn write_jumps(&self, out: &mut dyn Write, table: Table) -> io::Result<()> {
        for jump in self.jumps.iter().filter(|j| j.table == table) {
            let args: Vec<String> = jump
                .args
                .iter()
                .map(|a| {
                    if a.contains(' ') {
                        format!("\"{a}\"")
                    } else {
                        a.clone()
                    }
                })
                .collect();
            writeln!(out, "-I {} 1 {}", jump.chain, args.join(" "))?;
        }
        Ok(())
    }

    /// The payload as text (tests, and failure messages of small payloads).
    pub fn to_text(&self) -> io::Result<(String, Streamed)> {
        let mut buffer = Vec::new();
        let streamed = self.write(&mut buffer)?;
        Ok((String::from_utf8_lossy(&buffer).into_owned(), streamed))
    }

    /// [`Programmed::order`] of this job's entries.
    fn order(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        for (_, entry) in self.entries() {
            (&entry.name, entry.protocol).hash(&mut hasher);
        }
        hasher.finish()
    }

    /// The entries this family renders, with their plan indexes.
    fn entries(&self) -> impl Iterator<Item = (usize, &Arc<ServicePlan>)> + '_ {
        self.spec
            .services
            .iter()
            .enumerate()
            .filter(|(index, entry)| entry.family == self.family && !self.skip.contains(index))
    }

    /// Records every top-level chain of `table` in the new model; returns those to write.
    fn top_chains<'c>(&self, table: Table, chains: &'c [Chain], streamed: &mut Streamed) -> Vec<&'c Chain> {
        let mut write = Vec::new();
        for chain in chains {
            let print = (fingerprint(&chain.rules), chain.rules.len());
            let key = (table, chain.name.clone());
            let changed = match self.mode {
                StreamMode::Full { .. } => true,
                // Partial syncs never declare the canary; it stays as the last full sync left it.
                StreamMode::Partial { previous, .. } => {
                    chain.name != names::CANARY && previous.top.get(&key) != Some(&print)
                }
            };
            if changed {
                write.push(chain);
                streamed.top_written.push(format!("{table} {}", chain.name));
            }
            streamed.programmed.top.insert(key, print);
        }
        write
    }

    /// Per-service chains that the new model no longer has.
    fn stale(&self, streamed: &Streamed) -> Vec<String> {
        let mut stale: BTreeSet<String> = BTreeSet::new();
        match self.mode {
            StreamMode::Full { existing, .. } => {
                // Only worth a set of every live name when the kernel has chains the fixed ones do not
                // explain (at 10,000 Services it is the largest allocation of a first sync).
                let fixed: HashSet<&str> = streamed
                    .programmed
                    .top
                    .keys()
                    .filter(|(t, _)| *t == Table::Nat)
                    .map(|(_, name)| name.as_str())
                    .collect();
                if existing.iter().all(|name| fixed.contains(name.as_str())) {
                    return Vec::new();
                }
                let live: HashSet<&str> = streamed.programmed.names().collect();
                // Every chain of ours the new model lacks: a Service's that went, or one an older
                // layout made (kubernetes#132516: stale chains survive upgrades and break later).
                stale.extend(
                    existing
                        .iter()
                        .filter(|name| !live.contains(name.as_str()))
                        .cloned(),
                );
            }
            StreamMode::Partial { previous, .. } => {
                // A chain name belongs to one entry only (it hashes the entry's name and protocol), so an
                // old chain is still live only if the same entry's new group has it.
                for (key, old) in &previous.groups {
                    let new = streamed.programmed.groups.get(key);
                    for (name, _) in old.chains.iter() {
                        let live = new.is_some_and(|g| g.chains.iter().any(|(n, _)| n == name));
                        if !live && names::is_service_chain(name) {
                            stale.insert(name.clone());
                        }
                    }
                }
            }
        }
        stale.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::render;
    use crate::xtables::Tracer;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    /// Endpoints on the node keep a SEP chain (hairpin), so the partial sync has stale SEP chains to
    /// delete; the others are DNATed inline.
    fn spec(changed: bool) -> NodeForwardingPlanSpec {
        let mut services = vec![
            entry("ns/a:p", "10.96.0.1", 80)
                .with(ep("10.244.2.1", 80))
                .with(ep("10.244.3.1", 80).on_node()),
            entry("ns/b:p", "10.96.0.2", 80)
                .node_port(30002)
                .lb_ip("203.0.113.2")
                .source_range("198.51.100.0/24")
                .with(ep("10.244.2.2", 80)),
            entry("ns/none:p", "10.96.0.3", 80),
            entry("ns/same:p", "10.96.0.6", 80).with(ep("10.244.2.6", 80)),
        ];
        if changed {
            services[0].endpoints.pop();
            services.push(entry("ns/c:p", "10.96.0.4", 80).with(ep("10.244.2.4", 80)));
        } else {
            services.push(entry("ns/gone:p", "10.96.0.5", 80).with(ep("10.244.2.5", 80).on_node()));
        }
        plan("node-a", services)
    }

    fn none() -> &'static HashSet<usize> {
        static NONE: std::sync::OnceLock<HashSet<usize>> = std::sync::OnceLock::new();
        NONE.get_or_init(HashSet::new)
    }

    fn full<'a>(
        spec: &'a NodeForwardingPlanSpec,
        facts: &'a HostFacts,
        existing: &'a BTreeSet<String>,
    ) -> PayloadJob<'a> {
        PayloadJob {
            spec,
            facts,
            family: IpFamily::IPv4,
            skip: none(),
            mode: StreamMode::Full {
                existing,
                existing_filter: &NONE,
            },
            jumps: &[],
        }
    }

    static NONE: BTreeSet<String> = BTreeSet::new();

    /// Unchanged = equal to the entry of the same key in `old`.
    fn same_as(old: &NodeForwardingPlanSpec) -> impl Fn(usize, &Arc<ServicePlan>) -> bool + '_ {
        |_, entry| old.services.iter().any(|o| o == entry)
    }

    #[test]
    fn streamed_full_payload_gives_the_same_kernel_state_as_full_payload() {
        let facts = HostFacts::default();
        let spec = spec(false);
        let ruleset = render(&spec, &facts, IpFamily::IPv4, &HashSet::new());
        let existing = BTreeSet::new();
        let (text, streamed) = full(&spec, &facts, &existing).to_text().unwrap();
        let mut a = Tracer::new(IpFamily::IPv4, &[]).unwrap();
        a.restore(&ruleset.full_payload()).unwrap();
        let mut b = Tracer::new(IpFamily::IPv4, &[]).unwrap();
        b.restore(&text).unwrap();
        assert_eq!(a.dump(), b.dump());
        assert_eq!(streamed.programmed.rules(), ruleset.rule_count());
        assert_eq!(streamed.written.len(), ruleset.services().len());
        assert!(streamed.stale.is_empty());
        let nat = streamed.programmed.chain_counts(Table::Nat);
        assert_eq!(nat.len(), ruleset.chains()[&Table::Nat].len());
    }

    #[test]
    fn partial_payload_writes_only_changed_entries_and_chains_and_equals_a_full_sync() {
        let facts = HostFacts::default();
        let (old_spec, new_spec) = (spec(false), spec(true));
        let existing = BTreeSet::new();
        let (old_text, old) = full(&old_spec, &facts, &existing).to_text().unwrap();
        let unchanged = same_as(&old_spec);
        let job = PayloadJob {
            mode: StreamMode::Partial {
                previous: &old.programmed,
                unchanged: &unchanged,
            },
            ..full(&new_spec, &facts, &existing)
        };
        let (text, streamed) = job.to_text().unwrap();
        let written: Vec<&str> = streamed.written.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(written, ["ns/a:p", "ns/c:p"]);
        assert_eq!(streamed.top_written, ["nat SWYD-SERVICES"]);
        assert!(!text.contains(names::CANARY));
        assert!(
            !text.contains("*filter"),
            "the filter table did not change:\n{text}"
        );
        let same = names::cluster_policy_chain("ns/same:p", "tcp");
        assert!(!text.contains(&format!(":{same} ")) && !text.contains(&format!("-A {same} ")));
        let gone = names::cluster_policy_chain("ns/gone:p", "tcp");
        assert!(streamed.stale.contains(&gone), "{:?}", streamed.stale);
        assert_eq!(
            streamed.stale.len(),
            3,
            "gone's SVC and SEP, a's dropped SEP: {:?}",
            streamed.stale
        );

        let mut kernel = Tracer::new(IpFamily::IPv4, &[]).unwrap();
        kernel.restore(&old_text).unwrap();
        kernel.restore(&text).unwrap();
        let (fresh_text, fresh) = full(&new_spec, &facts, &existing).to_text().unwrap();
        let mut want = Tracer::new(IpFamily::IPv4, &[]).unwrap();
        want.restore(&fresh_text).unwrap();
        assert_eq!(
            kernel.dump(),
            want.dump(),
            "partial on top of old must equal full of new"
        );
        assert_eq!(streamed.programmed, fresh.programmed);
    }

    #[test]
    fn top_level_chains_are_not_rendered_again_when_no_changed_entry_changed_its_frontends() {
        let facts = HostFacts::default();
        let old_spec = spec(false);
        let existing = BTreeSet::new();
        let (_, old) = full(&old_spec, &facts, &existing).to_text().unwrap();
        let edited = |f: &dyn Fn(&mut ServicePlan)| {
            let mut new_spec = old_spec.clone();
            f(Arc::make_mut(&mut new_spec.services[0]));
            switchyard_api::testing::finish(&mut new_spec);
            new_spec
        };
        let replaced = edited(&|e| e.endpoints[0].ip = "10.244.2.77".into());
        let drained = edited(&|e| {
            e.endpoints.clear();
            e.has_endpoints = false;
        });
        for (new_spec, top_written) in [
            (replaced, vec![]),
            (drained, vec!["nat SWYD-SERVICES", "filter SWYD-SERVICES"]),
        ] {
            let unchanged = same_as(&old_spec);
            let job = PayloadJob {
                mode: StreamMode::Partial {
                    previous: &old.programmed,
                    unchanged: &unchanged,
                },
                ..full(&new_spec, &facts, &existing)
            };
            let (text, streamed) = job.to_text().unwrap();
            assert_eq!(streamed.top_written, top_written, "{text}");
            let written: Vec<&str> = streamed.written.iter().map(|k| k.name.as_str()).collect();
            assert_eq!(written, ["ns/a:p"]);
            let (_, fresh) = full(&new_spec, &facts, &existing).to_text().unwrap();
            assert_eq!(streamed.programmed, fresh.programmed);
        }
    }

    #[test]
    fn a_full_sync_deletes_stale_chains_the_kernel_still_has() {
        let facts = HostFacts::default();
        let (old_spec, new_spec) = (spec(false), spec(true));
        let old = render(&old_spec, &facts, IpFamily::IPv4, &HashSet::new());
        let existing: BTreeSet<String> = old.digest().nat_chains().clone();
        let (text, streamed) = full(&new_spec, &facts, &existing).to_text().unwrap();
        let gone = names::cluster_policy_chain("ns/gone:p", "tcp");
        assert!(streamed.stale.contains(&gone), "{:?}", streamed.stale);
        let mut kernel = Tracer::from_ruleset(&old, &[]).unwrap();
        kernel.restore(&text).unwrap();
        assert!(!kernel.has_chain(Table::Nat, &gone));
        assert!(!streamed.stale.iter().any(|s| s == names::SERVICES));
    }
}
