//! The IPVS backend of the [`Dataplane`] trait: render, then bring each kernel object to the rendered
//! state by difference — never by rebuilding.
//!
//! ```text
//! SyncRequest ─► sysctls (full syncs) ─► dummy: ensure swyd-ipvs0, read its addresses
//!   ─► render(plan, local addresses without the dummy's) ─► Desired
//!   ─► ipset restore: create sets, add members ─► glue: iptables-restore --noflush (full syncs, or when it
//!      changed; stale SWYD chains and jump rules of the other backend removed) ─► dummy: add addresses
//!   ─► IPVS, per virtual server (all on a full sync; on a partial one only those that changed, that are
//!      draining, or that failed last time): list its real servers, diff::reconcile, apply the operations
//!      (a kernel error fails that virtual server only: reported for its entry, retried next sync)
//!   ─► dummy: remove stale addresses ─► ipset restore: delete stale members and sets ─► model
//!   (without a model, the first sync or a switch from another backend: the glue last, so the
//!   iptables backend's chains it replaces keep forwarding until the virtual servers are in)
//! check_drift ─► finish due drains ─► compare kernel (IPVS, addresses, ipsets, glue) with the model
//! cleanup ───► our virtual servers (address on the dummy, or a NodePort in our sets), every SWYD chain
//!              and jump rule, our ipsets, the dummy interface
//! retire(iptables) ─► the same, but of the SWYD chains only the glue's own (GLUE_ONLY): the iptables
//!              backend's sync already rewrote the ones they share
//! retire(any) first ─► idle virtual servers deleted; those with established TCP/SCTP connections kept (with the dummy,
//!              the sets and the glue) until they close or the drain period ends: `draining()` says so,
//!              and the selector retries at every sync and drift check
//! ```
//!
//! Which virtual servers are ours is read from the kernel, not remembered: those whose address is on
//! our dummy interface, and NodePort ones whose node address and port are in our NodePort sets. So a
//! restarted agent, or `cleanup` on a fresh one, finds them; everything else in the IPVS table is left
//! alone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec, ServiceFailure, SyncMode};

use super::diff::{Current, Draining, Op, reconcile};
use super::dummy::ServiceAddrs;
use super::glue::{GLUE_ONLY, Glue, jump_rules, owned_chains, payload};
use super::ipset::Ipsets;
use super::kernel::{Ipvs, Service, VirtualKey};
use super::render::{Desired, VirtualServer, render};
use super::sets::{self, SavedSet, SavedSets, SetId, ip_port};
use super::sysctl::wanted;
use crate::backend::HostFacts;
use crate::error::Error;
use crate::probe::LocalAddrs;
use crate::sync::Clock;
use crate::sync::dataplane::{Cleanup, Dataplane, Drift, DriftReasons, SyncOutcome, SyncRequest};
use crate::sync::status_fields::{MAX_REASON, entry_label, short};
use crate::sysctl::Sysctls;
use crate::verify::kernel::{Kernel, KernelView};
use crate::xtables::cleanup::{remove_owned, remove_owned_matching};
use crate::xtables::jumps::JumpRule;
use crate::xtables::kernel::Iptables;
use crate::xtables::payload::Table;
use crate::xtables::save::SavedTable;

/// The kernel edges IPVS mode drives.
pub struct IpvsEdges<I> {
    /// IPVS over generic netlink.
    pub ipvs: Box<dyn Ipvs>,
    /// ipset.
    pub ipsets: Box<dyn Ipsets>,
    /// The dummy interface holding the service addresses.
    pub dummy: Box<dyn ServiceAddrs>,
    /// iptables, for the glue (cloned for cleanup, which reuses the iptables backend's).
    pub iptables: I,
    /// The node's local addresses (NodePorts are served on them).
    pub addrs: Box<dyn LocalAddrs>,
    /// sysctls.
    pub sysctls: Box<dyn Sysctls>,
}

/// Settings of IPVS mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsConfig {
    /// How long a TCP real server that left the plan may keep its connections (weight 0) before it is
    /// deleted anyway.
    pub grace: Duration,
    /// What was discovered about the host at start (iptables features for the glue).
    pub facts: HostFacts,
    /// The kernel release (`uname -r`), for the sysctls that depend on it.
    pub kernel_release: String,
    /// After a switch away from IPVS, how long its virtual servers that still carry connections stay
    /// for them (new connections go through the new backend); each goes earlier once it has none.
    pub switch_drain: Duration,
}

impl Default for IpvsConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(30),
            facts: HostFacts::default(),
            kernel_release: String::new(),
            switch_drain: Duration::from_secs(600),
        }
    }
}

/// What the kernel holds after the last successful sync.
#[derive(Debug, Clone)]
struct Model {
    /// The whole desired state of that sync.
    desired: Desired,
    /// The virtual servers that were programmed (failed ones are missing).
    applied: BTreeMap<VirtualKey, VirtualServer>,
}

/// The IPVS backend.
pub struct IpvsDataplane<I> {
    edges: IpvsEdges<I>,
    clock: Arc<dyn Clock>,
    config: IpvsConfig,
    model: Option<Model>,
    draining: BTreeMap<VirtualKey, Draining>,
    /// Virtual servers the kernel refused in the last sync, with the error.
    failed: BTreeMap<VirtualKey, String>,
    failures: Vec<ServiceFailure>,
    /// Since a switch away from IPVS: the virtual servers kept for their connections.
    leaving: Option<Leaving>,
}

/// IPVS switched away from, its busy virtual servers kept ([`IpvsDataplane::retire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Leaving {
    /// The first attempt to retire.
    since: std::time::Instant,
    /// Virtual servers kept at the last attempt.
    services: usize,
    /// Their open connections then.
    connections: u64,
}

/// The connections a real server still carries that a switch waits for: established TCP and SCTP
/// ones. Not UDP's: IPVS keeps a UDP entry for 5 minutes after its last packet and every DNS query is
/// one, so waiting for them would keep IPVS for minutes on any node (kube-proxy's IPVS mode does not
/// drain UDP real servers either). Closing TCP entries (TIME_WAIT, FIN_WAIT) are not waited for.
fn open_connections(real: &super::kernel::Destination) -> u64 {
    u64::from(real.active_conns)
}

impl<I> std::fmt::Debug for IpvsDataplane<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsDataplane")
            .field("config", &self.config)
            .field("synced", &self.model.is_some())
            .field("draining", &self.draining.len())
            .field("failed", &self.failed.len())
            .finish_non_exhaustive()
    }
}

/// The same virtual server settings (the owning entry's index may move between plans).
fn same_settings(a: &VirtualServer, b: &VirtualServer) -> bool {
    a.scheduler == b.scheduler && a.persistence == b.persistence && a.reals == b.reals
}

/// A virtual server is ours when its address is on our dummy interface, or when it is a NodePort our
/// NodePort sets list.
fn owned(key: &VirtualKey, bound: &BTreeSet<IpAddr>, saved: &SavedSets) -> bool {
    if bound.contains(&key.addr) {
        return true;
    }
    let member = ip_port(key.addr, key.protocol, key.port);
    [SetId::NodePort, SetId::NodePortLocal].iter().any(|id| {
        saved
            .get(&id.name(key.family()))
            .is_some_and(|set| set.members.contains(&member))
    })
}

/// The model's sets in the form `ipset save` gives (what a partial sync diffs against).
fn saved_form(desired: &Desired) -> SavedSets {
    desired
        .sets
        .iter()
        .map(|(name, set)| {
            let kind = set.kind;
            (
                name.clone(),
                SavedSet {
                    kind: kind.type_name().to_string(),
                    family: (kind != sets::SetKind::BitmapPort).then_some(set.family),
                    members: set.members.clone(),
                },
            )
        })
        .collect()
}

impl<I: Iptables + Clone + 'static> IpvsDataplane<I> {
    /// A backend with no model: its first sync is full.
    pub fn new(edges: IpvsEdges<I>, clock: Arc<dyn Clock>, config: IpvsConfig) -> Self {
        Self {
            edges,
            clock,
            config,
            model: None,
            draining: BTreeMap::new(),
            failed: BTreeMap::new(),
            failures: Vec::new(),
            leaving: None,
        }
    }

    /// Before IPVS's objects go after a switch away from it: the virtual servers with no open
    /// connection go now, those that carry some stay until they have none or the drain period is over
    /// (their connections keep flowing through IPVS's own connection table; the successor's rules DNAT
    /// every new connection before IPVS sees a packet). `Some` (what went so far) while any stays: the
    /// dummy interface, the sets and the glue stay with them.
    fn drain_leaving(&mut self) -> Result<Option<Cleanup>, Error> {
        let now = self.clock.now();
        let since = self.leaving.map_or(now, |leaving| leaving.since);
        let over = now.saturating_duration_since(since) >= self.config.switch_drain;
        let bound = self.edges.dummy.addresses()?;
        let saved = self.edges.ipsets.list().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list ipsets; NodePort virtual servers are not recognised as ours");
            SavedSets::new()
        });
        let (mut removed, mut services, mut connections) = (0, 0, 0u64);
        for service in self.edges.ipvs.services()? {
            let Some(key) = service.key().filter(|key| owned(key, &bound, &saved)) else {
                continue;
            };
            let open: u64 = if over {
                0
            } else {
                self.edges
                    .ipvs
                    .destinations(&key)?
                    .iter()
                    .map(open_connections)
                    .sum()
            };
            if open == 0 {
                self.edges.ipvs.delete_service(&key)?;
                removed += 1;
            } else {
                services += 1;
                connections += open;
            }
        }
        if services == 0 {
            if over && self.leaving.is_some() {
                tracing::info!(period = ?self.config.switch_drain, "the drain period after the switch away from IPVS is over: its remaining virtual servers are removed");
            }
            self.leaving = None;
            return Ok(None);
        }
        let leaving = Leaving {
            since,
            services,
            connections,
        };
        if self.leaving.map(|l| (l.services, l.connections)) != Some((services, connections)) {
            tracing::info!(
                services,
                connections,
                "switched away from IPVS: its virtual servers that still carry connections stay until those close (at most the drain period)"
            );
        }
        self.leaving = Some(leaving);
        Ok(Some(Cleanup {
            jumps: 0,
            objects: removed,
        }))
    }

    fn set_sysctls(&mut self) {
        for (path, value) in wanted(&self.config.kernel_release) {
            let current = self.edges.sysctls.get(path).ok();
            if current.as_deref() == Some(value) {
                continue;
            }
            if let Err(e) = self.edges.sysctls.set(path, value) {
                // Often read-only in a container; the DaemonSet's init container sets them instead.
                tracing::warn!(error = %e, "cannot set sysctl {path}={value}");
            }
        }
    }

    fn saved_table(&mut self, family: IpFamily, table: Table) -> Result<SavedTable, Error> {
        let mut saved = SavedTable::default();
        self.edges
            .iptables
            .save_lines(family, table, &mut |line| saved.feed(line))?;
        Ok(saved)
    }

    /// Rewrites the glue of every family whose glue changed since `model` (all of them on a full sync).
    fn write_changed_glue(
        &mut self,
        desired: &Desired,
        model: Option<&Model>,
        full: bool,
    ) -> Result<(), Error> {
        for (family, glue) in &desired.glue {
            let unchanged = !full && model.and_then(|m| m.desired.glue.get(family)) == Some(glue);
            if !unchanged {
                self.write_glue(*family, glue)?;
            }
        }
        Ok(())
    }

    /// Rewrites the glue of `family`: our chains, our jump rules; the other backend's leftovers go.
    fn write_glue(&mut self, family: IpFamily, glue: &Glue) -> Result<(), Error> {
        let ours = jump_rules(family);
        let mut stale = Vec::new();
        let mut missing: Vec<JumpRule> = Vec::new();
        for table in [Table::Filter, Table::Nat] {
            let saved = self.saved_table(family, table)?;
            for jump in &saved.jumps {
                if !ours.iter().any(|rule| rule.table == table && jump.is(rule)) {
                    tracing::info!(?family, %table, chain = jump.chain, target = jump.target(), "removing a stale jump rule");
                    self.edges
                        .iptables
                        .delete_rule(family, table, jump.chain, &jump.args)?;
                }
            }
            let keep = owned_chains(table);
            stale.extend(
                saved
                    .owned
                    .keys()
                    .filter(|name| !keep.contains(name.as_str()))
                    .map(|name| (table, name.clone())),
            );
            missing.extend(
                ours.iter()
                    .filter(|rule| rule.table == table && !saved.has_jump(rule))
                    .cloned(),
            );
        }
        let mut text = payload(glue, &stale, &missing);
        self.edges.iptables.restore(family, &mut text)
    }

    /// Lists the kernel's real servers of `key`, reconciles and applies. Returns (changed, deleted).
    fn reconcile_key(
        &mut self,
        key: &VirtualKey,
        want: Option<&VirtualServer>,
        service: Option<&Service>,
    ) -> Result<(bool, bool), Error> {
        let dests = match service {
            Some(_) => self.edges.ipvs.destinations(key)?,
            None => Vec::new(),
        };
        let current = service.map(|service| Current {
            service,
            dests: &dests,
        });
        let mut draining = self.draining.remove(key).unwrap_or_default();
        let ops = reconcile(
            key,
            want,
            current,
            &mut draining,
            self.clock.now(),
            self.config.grace,
        );
        if !draining.is_empty() {
            self.draining.insert(*key, draining);
        }
        let ipvs = &mut self.edges.ipvs;
        let mut deleted = false;
        for op in &ops {
            match op {
                Op::AddService(s) => ipvs.add_service(s)?,
                Op::UpdateService(s) => ipvs.update_service(s)?,
                Op::DeleteService => {
                    ipvs.delete_service(key)?;
                    deleted = true;
                }
                Op::AddDest(d) => ipvs.add_destination(key, d)?,
                Op::UpdateDest(d) => {
                    if d.weight == 0 {
                        tracing::info!(service = %key, real = %d.real, "draining a real server (weight 0)");
                    }
                    ipvs.update_destination(key, d)?
                }
                Op::DeleteDest(real) => ipvs.delete_destination(key, real)?,
            }
        }
        Ok((!ops.is_empty(), deleted))
    }

    fn keyed_services(&mut self) -> Result<BTreeMap<VirtualKey, Service>, Error> {
        Ok(self
            .edges
            .ipvs
            .services()?
            .into_iter()
            .filter_map(|s| Some((s.key()?, s)))
            .collect())
    }

    /// One failure per entry, from refused virtual servers and frontends claimed twice.
    fn entry_failures_of(
        spec: &NodeForwardingPlanSpec,
        desired: &Desired,
        failed: &BTreeMap<VirtualKey, String>,
    ) -> Vec<ServiceFailure> {
        let mut by_entry: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (key, reason) in failed {
            if let Some(vs) = desired.virtuals.get(key) {
                by_entry.entry(vs.entry).or_default().push(reason.clone());
            }
        }
        for (entry, reason) in &desired.conflicts {
            by_entry.entry(*entry).or_default().push(reason.clone());
        }
        by_entry
            .into_iter()
            .map(|(entry, reasons)| ServiceFailure {
                service: entry_label(spec, entry),
                reason: short(&reasons.join("; "), MAX_REASON),
            })
            .collect()
    }

    /// Finishes drains that are due (on drift checks, which run every resync period, as kube-proxy checks
    /// its graceful-termination list every minute).
    fn finish_drains(&mut self, applied: &BTreeMap<VirtualKey, VirtualServer>) -> Result<(), Error> {
        if self.draining.is_empty() {
            return Ok(());
        }
        let services = self.keyed_services()?;
        let keys: Vec<VirtualKey> = self.draining.keys().copied().collect();
        for key in keys {
            let Some(want) = applied.get(&key) else {
                self.draining.remove(&key);
                continue;
            };
            if let Err(e) = self.reconcile_key(&key, Some(want), services.get(&key)) {
                tracing::warn!(error = %e, service = %key, "finishing the drain of real servers failed");
            }
        }
        Ok(())
    }

    fn drift_of(&mut self, model: &Model, reasons: &mut DriftReasons) -> Result<(), Error> {
        self.finish_drains(&model.applied)?;
        if !self.failed.is_empty() {
            reasons.note(format!(
                "{} virtual servers the kernel refused in the last sync are retried",
                self.failed.len()
            ));
        }
        let services = self.keyed_services()?;
        let bound = self.edges.dummy.addresses()?;
        for (key, vs) in &model.applied {
            let Some(service) = services.get(key) else {
                reasons.note(format!("virtual server {key} is missing"));
                continue;
            };
            let want = Service::new(*key, &vs.scheduler, vs.persistence);
            if (service.scheduler.as_str(), service.persistence())
                != (want.scheduler.as_str(), want.persistence())
            {
                reasons.note(format!(
                    "virtual server {key} has scheduler {} {:?}",
                    service.scheduler,
                    service.persistence()
                ));
            }
            let dests = self.edges.ipvs.destinations(key)?;
            let draining = self.draining.get(key);
            for (real, weight) in &vs.reals {
                match dests.iter().find(|d| d.real == *real) {
                    None => reasons.note(format!("real server {real} of {key} is missing")),
                    Some(d) if d.weight != *weight => reasons.note(format!(
                        "real server {real} of {key} has weight {}, not {weight}",
                        d.weight
                    )),
                    Some(_) => {}
                }
            }
            for dest in dests.iter().filter(|d| !vs.reals.contains_key(&d.real)) {
                if !draining.is_some_and(|d| d.contains_key(&dest.real)) {
                    reasons.note(format!("real server {} of {key} is not in the plan", dest.real));
                }
            }
        }
        for key in services.keys() {
            if bound.contains(&key.addr) && !model.applied.contains_key(key) && !self.failed.contains_key(key)
            {
                reasons.note(format!("virtual server {key} is not in the plan"));
            }
        }
        for ip in model.desired.addresses.difference(&bound) {
            reasons.note(format!(
                "address {ip} is missing from {}",
                super::dummy::INTERFACE
            ));
        }
        for ip in bound.difference(&model.desired.addresses) {
            reasons.note(format!(
                "address {ip} on {} is not in the plan",
                super::dummy::INTERFACE
            ));
        }
        let saved = self.edges.ipsets.list()?;
        reasons.extend(sets::differences(&model.desired.sets, &saved));
        for (family, glue) in &model.desired.glue {
            for table in [Table::Filter, Table::Nat] {
                let saved = self.saved_table(*family, table)?;
                for chain in glue.chains(table) {
                    match saved.owned.get(&chain.name) {
                        None => reasons.note(format!("{family:?} {table} chain {} is missing", chain.name)),
                        Some(n) if *n != chain.rules.len() => reasons.note(format!(
                            "{family:?} {table} chain {} has {n} rules, want {}",
                            chain.name,
                            chain.rules.len()
                        )),
                        Some(_) => {}
                    }
                }
                for rule in jump_rules(*family).iter().filter(|r| r.table == table) {
                    if !saved.has_jump(rule) {
                        reasons.note(format!(
                            "{family:?} {table} jump {} -> {} is missing",
                            rule.chain,
                            rule.target()
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl<I: Iptables + Clone + 'static> Dataplane for IpvsDataplane<I> {
    fn backend(&self) -> Backend {
        Backend::Ipvs
    }

    fn sync(&mut self, request: SyncRequest<'_>) -> Result<SyncOutcome, Error> {
        let spec: &NodeForwardingPlanSpec = request.spec;
        // Whatever happens next, the old model no longer describes the kernel with certainty.
        let model = self.model.take();
        // In use again (a switch back while it was being left): nothing of it is leaving any more.
        self.leaving = None;
        let full = request.full || model.is_none();
        if full {
            self.set_sysctls();
        }
        self.edges.dummy.ensure()?;
        let bound = self.edges.dummy.addresses()?;
        let local_addrs = self
            .edges
            .addrs
            .local_addrs()?
            .into_iter()
            .filter(|ip| !bound.contains(ip))
            .collect();
        let facts = self.config.facts.with_local_addrs(local_addrs);
        let desired = render(spec, &facts, request.skip);

        let saved_sets = match (&model, full) {
            (Some(model), false) => saved_form(&model.desired),
            _ => self.edges.ipsets.list()?,
        };
        let (add_members, remove_members) = sets::batches(&desired.sets, &saved_sets);
        self.edges.ipsets.restore(&add_members)?;
        // Without a model (the first sync, or a switch from another backend) the glue goes in last: the
        // iptables backend's chains it replaces keep DNATting every new connection, before IPVS sees it,
        // until the virtual servers are ready to take over (make before break).
        let glue_last = model.is_none();
        if !glue_last {
            self.write_changed_glue(&desired, model.as_ref(), full)?;
        }
        let new_addresses: Vec<IpAddr> = desired.addresses.difference(&bound).copied().collect();
        self.edges.dummy.change(&new_addresses, &[])?;

        let services = self.keyed_services()?;
        let (keys, mut applied): (BTreeSet<VirtualKey>, _) = match model {
            Some(model) if !full => {
                let changed = desired
                    .virtuals
                    .iter()
                    .filter(|(k, v)| model.applied.get(k).is_none_or(|a| !same_settings(a, v)))
                    .map(|(k, _)| *k)
                    .chain(
                        model
                            .applied
                            .keys()
                            .filter(|k| !desired.virtuals.contains_key(k))
                            .copied(),
                    )
                    .chain(self.draining.keys().copied())
                    .chain(self.failed.keys().copied())
                    .collect();
                (changed, model.applied)
            }
            previous => {
                let mut keys: BTreeSet<VirtualKey> = desired.virtuals.keys().copied().collect();
                keys.extend(previous.iter().flat_map(|m| m.applied.keys().copied()));
                keys.extend(services.keys().filter(|k| owned(k, &bound, &saved_sets)).copied());
                (keys, BTreeMap::new())
            }
        };
        let mut failed = BTreeMap::new();
        let (mut written, mut removed) = (0, 0);
        for key in keys {
            let want = desired.virtuals.get(&key);
            match self.reconcile_key(&key, want, services.get(&key)) {
                Ok((changed, deleted)) => {
                    written += usize::from(changed && !deleted);
                    removed += usize::from(deleted);
                    match want {
                        Some(vs) => applied.insert(key, vs.clone()),
                        None => applied.remove(&key),
                    };
                }
                Err(e) => {
                    tracing::warn!(error = %e, service = %key, "the kernel refused a virtual server; the rest is applied");
                    failed.insert(key, e.to_string());
                    applied.remove(&key);
                }
            }
        }

        if glue_last {
            self.write_changed_glue(&desired, None, full)?;
        }
        let stale_addresses: Vec<IpAddr> = bound.difference(&desired.addresses).copied().collect();
        self.edges.dummy.change(&[], &stale_addresses)?;
        self.edges.ipsets.restore(&remove_members)?;

        self.failures = Self::entry_failures_of(spec, &desired, &failed);
        self.failed = failed;
        let rules = desired.server_count();
        self.model = Some(Model { desired, applied });
        Ok(SyncOutcome {
            mode: if full { SyncMode::Full } else { SyncMode::Partial },
            rules,
            written,
            removed,
            drift: None,
            left_out: Vec::new(),
        })
    }

    /// Also finishes drains that are due, and reports virtual servers the kernel refused last time as
    /// drift, so the syncer's repair (a full sync) retries them every resync period.
    fn check_drift(&mut self) -> Result<Option<Drift>, Error> {
        let Some(model) = self.model.take() else {
            return Ok(None);
        };
        let mut reasons = DriftReasons::default();
        let result = self.drift_of(&model, &mut reasons);
        self.model = Some(model);
        result?;
        Ok(reasons.finish())
    }

    fn cleanup(&mut self) -> Result<Cleanup, Error> {
        self.forget();
        self.draining.clear();
        self.leaving = None;
        // The glue is SWYD chains and jump rules like the iptables backend's: its cleanup removes both.
        // It runs between the two halves: the sets it matches can only go once no rule refers to them.
        let edges = &mut self.edges;
        let (services, chains, rest) =
            remove_objects(&mut *edges.ipvs, &mut *edges.ipsets, &mut *edges.dummy, || {
                remove_owned(&mut edges.iptables)
            })?;
        Ok(Cleanup {
            jumps: chains.jumps,
            objects: services + chains.objects + rest,
        })
    }

    fn retire(&mut self, successor: Backend) -> Result<Cleanup, Error> {
        self.forget();
        self.draining.clear();
        if let Some(so_far) = self.drain_leaving()? {
            return Ok(so_far);
        }
        if successor != Backend::Iptables {
            return self.cleanup();
        }
        // The iptables backend's full sync rewrote the chains the glue shares with it: only the glue's
        // own chains (and their jump rules) go, so its forwarding is never interrupted.
        let edges = &mut self.edges;
        let (services, chains, rest) =
            remove_objects(&mut *edges.ipvs, &mut *edges.ipsets, &mut *edges.dummy, || {
                remove_owned_matching(&mut edges.iptables, &|chain| GLUE_ONLY.contains(&chain))
            })?;
        Ok(Cleanup {
            jumps: chains.jumps,
            objects: services + chains.objects + rest,
        })
    }

    fn forget(&mut self) {
        self.model = None;
        self.failed.clear();
        self.failures.clear();
    }

    fn draining(&self) -> Option<String> {
        self.leaving.map(|leaving| {
            format!(
                "{} IPVS virtual server(s) kept for {} open connection(s) after the switch away from IPVS",
                leaving.services, leaving.connections
            )
        })
    }

    fn kernel_view(&mut self) -> Result<Option<KernelView>, Error> {
        let bound = self.edges.dummy.addresses()?;
        let local = self
            .edges
            .addrs
            .local_addrs()?
            .into_iter()
            .filter(|ip| !bound.contains(ip))
            .collect();
        let mut servers = BTreeMap::new();
        for service in self.edges.ipvs.services()? {
            if let Some(key) = service.key() {
                let reals = self.edges.ipvs.destinations(&key)?;
                servers.insert(key, (service, reals));
            }
        }
        Ok(Some(KernelView {
            facts: self.config.facts.with_local_addrs(local),
            kernel: Kernel::Ipvs(servers),
            leftovers: Vec::new(),
        }))
    }

    fn entry_failures(&self) -> Vec<ServiceFailure> {
        self.failures.clone()
    }
}

/// Removes IPVS mode's kernel objects: our virtual servers, then whatever `between` removes (the
/// iptables rules that match our sets), then our ipsets and the dummy interface. Returns (virtual
/// servers, what `between` reported, sets plus interface).
pub fn remove_objects(
    ipvs: &mut dyn Ipvs,
    ipsets: &mut dyn Ipsets,
    dummy: &mut dyn ServiceAddrs,
    between: impl FnOnce() -> Result<Cleanup, Error>,
) -> Result<(usize, Cleanup, usize), Error> {
    let bound = dummy.addresses()?;
    let saved = ipsets.list().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot list ipsets; not removing any");
        SavedSets::new()
    });
    let mut services = 0;
    for service in ipvs.services()? {
        if let Some(key) = service.key().filter(|k| owned(k, &bound, &saved)) {
            ipvs.delete_service(&key)?;
            services += 1;
        }
    }
    let chains = between()?;
    let destroy: String = saved.keys().map(|name| format!("destroy {name}\n")).collect();
    ipsets.restore(&destroy)?;
    let rest = saved.len() + usize::from(dummy.delete()?);
    Ok((services, chains, rest))
}
