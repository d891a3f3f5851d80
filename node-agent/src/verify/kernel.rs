//! The kernel check of a verification: what the backend in use holds, compared with the plan frontend
//! by frontend, with `explain --kernel`'s comparisons.
//!
//! ```text
//! Dataplane::kernel_view (the backend's own edge) ─► KernelView { facts, kernel, leftovers }
//!   iptables: iptables-save nat + filter ─► kernel tracer vs the plan's ─► explain::kernel::iptables::drift
//!   nftables: the table read back vs the plan's render ─► explain::kernel::nftables::drift
//!   ipvs: virtual and real servers vs the render's ─► explain::kernel::ipvs::drift
//! plan entries (not skipped) ─► frontends (at most MAX_FRONTENDS, spread evenly) ─► KernelCheck
//! leftovers: a previous backend whose rules are still there ─► a mismatch of its own
//! ```
//!
//! Pure: the view is read by the caller; nothing here touches the kernel.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use switchyard_api::verification::{KernelCheck, MAX_EXAMPLES};
use switchyard_api::{Backend, IpFamily, NodeForwardingPlanSpec};

use super::frontends::{Frontend, of_entry};
use crate::backend::HostFacts;
use crate::counters::Frontend as Kind;
use crate::explain::kernel::iptables::{drift as iptables_drift, kernel_tracer};
use crate::ipvs::kernel::{Destination, Service, VirtualKey};
use crate::nftables::model::TableState;
use crate::xtables::{Packet, Tracer};

/// The most frontends one check compares (a sample spread over the plan beyond that): each is a trace
/// through the whole ruleset with iptables.
pub const MAX_FRONTENDS: usize = 5_000;

/// What a backend's kernel holds, as read for a check.
#[derive(Debug, Clone)]
pub enum Kernel {
    /// `iptables-save` of nat and filter, per family.
    Iptables(BTreeMap<IpFamily, Vec<String>>),
    /// Our table per family, read back (`None`: there is none).
    Nftables(BTreeMap<IpFamily, Option<TableState>>),
    /// Every virtual server with its real servers.
    Ipvs(BTreeMap<VirtualKey, (Service, Vec<Destination>)>),
}

/// The kernel of the backend in use, and what the check needs to render the plan as it did.
#[derive(Debug, Clone)]
pub struct KernelView {
    /// The facts its render used, with the host's local addresses.
    pub facts: HostFacts,
    /// What the kernel holds.
    pub kernel: Kernel,
    /// Backends switched away from whose rules are still in the kernel (their removal failed).
    pub leftovers: Vec<Backend>,
}

/// Every `step`-th of `items`, at most `max` of them.
fn spread<T>(items: Vec<T>, max: usize) -> Vec<T> {
    if items.len() <= max || max == 0 {
        return items;
    }
    let len = items.len();
    items
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i * max) % len < max)
        .map(|(_, item)| item)
        .take(max)
        .collect()
}

/// Compares `view` with `spec` (without the entries in `skip`): the frontends compared, those that
/// differ, and a few of them in words.
pub fn check(spec: &NodeForwardingPlanSpec, skip: &HashSet<usize>, view: &KernelView) -> KernelCheck {
    let frontends: Vec<Frontend> = spec
        .services
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
        .flat_map(|(_, entry)| of_entry(spec, entry))
        .collect();
    let frontends = spread(frontends, MAX_FRONTENDS);
    let differences = match &view.kernel {
        Kernel::Iptables(saves) => iptables(spec, skip, &view.facts, saves, &frontends),
        Kernel::Nftables(tables) => nftables(spec, skip, &view.facts, tables, &frontends),
        Kernel::Ipvs(servers) => ipvs(spec, skip, &view.facts, servers, &frontends),
    };
    let differences = match differences {
        Ok(differences) => differences,
        Err(error) => {
            return KernelCheck {
                frontends: 0,
                mismatches: 0,
                examples: Vec::new(),
                error: Some(error),
            };
        }
    };
    let mut examples: Vec<String> = view
        .leftovers
        .iter()
        .map(|b| format!("the rules of {b}, the previous backend, are still in the kernel"))
        .collect();
    let mut mismatches = examples.len();
    for (frontend, drift) in frontends.iter().zip(&differences) {
        if let Some(first) = drift.first() {
            mismatches += 1;
            examples.push(format!("{frontend}: {first}"));
        }
    }
    examples.truncate(MAX_EXAMPLES);
    KernelCheck {
        frontends: u32::try_from(frontends.len()).unwrap_or(u32::MAX),
        mismatches: u32::try_from(mismatches).unwrap_or(u32::MAX),
        examples,
        error: None,
    }
}

fn packet(frontend: &Frontend) -> Packet {
    Packet::new(
        frontend.source,
        frontend.protocol,
        frontend.addr.ip(),
        frontend.addr.port(),
    )
}

/// Per frontend, where the kernel's rules on its path differ from the plan's (empty: they agree).
type Differences = Result<Vec<Vec<String>>, String>;

fn iptables(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    facts: &HostFacts,
    saves: &BTreeMap<IpFamily, Vec<String>>,
    frontends: &[Frontend],
) -> Differences {
    let local: &[IpAddr] = &facts.local_addrs;
    let mut tracers: BTreeMap<IpFamily, (Tracer, Tracer)> = BTreeMap::new();
    for family in frontends.iter().map(|f| IpFamily::of(&f.addr.ip())) {
        if tracers.contains_key(&family) {
            continue;
        }
        let saved = saves.get(&family).map(Vec::as_slice).unwrap_or_default();
        if !saved
            .iter()
            .any(|save| save.lines().any(|l| l.starts_with(":SWYD-")))
        {
            return Err(format!(
                "no Switchyard rules for {family:?} in iptables-save (no SWYD-* chain)"
            ));
        }
        let ruleset = crate::iptables::render(spec, facts, family, skip);
        let plan = Tracer::from_ruleset(&ruleset, local).map_err(|e| e.to_string())?;
        let kernel = kernel_tracer(family, local, saved).map_err(|e| e.to_string())?;
        tracers.insert(family, (plan, kernel));
    }
    frontends
        .iter()
        .map(|frontend| {
            let Some((plan, kernel)) = tracers.get(&IpFamily::of(&frontend.addr.ip())) else {
                return Ok(Vec::new());
            };
            let packet = packet(frontend);
            let plan_trace = plan.trace(&packet).map_err(|e| e.to_string())?;
            let kernel_trace = kernel.trace(&packet).map_err(|e| e.to_string())?;
            Ok(iptables_drift(plan, &plan_trace, kernel, &kernel_trace))
        })
        .collect()
}

fn nftables(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    facts: &HostFacts,
    tables: &BTreeMap<IpFamily, Option<TableState>>,
    frontends: &[Frontend],
) -> Differences {
    let mut expected: BTreeMap<IpFamily, TableState> = BTreeMap::new();
    Ok(frontends
        .iter()
        .map(|frontend| {
            let family = IpFamily::of(&frontend.addr.ip());
            let want = expected
                .entry(family)
                .or_insert_with(|| crate::nftables::render(spec, facts, family, skip));
            let found = tables.get(&family).and_then(Option::as_ref);
            crate::explain::kernel::nftables::drift(
                want,
                found,
                &packet(frontend),
                frontend.kind == Kind::NodePort,
            )
        })
        .collect())
}

fn ipvs(
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    facts: &HostFacts,
    servers: &BTreeMap<VirtualKey, (Service, Vec<Destination>)>,
    frontends: &[Frontend],
) -> Differences {
    let desired = crate::ipvs::render(spec, facts, skip);
    Ok(frontends
        .iter()
        .map(|frontend| {
            let key = VirtualKey {
                addr: frontend.addr.ip(),
                protocol: frontend.protocol,
                port: frontend.addr.port(),
            };
            let kernel = servers
                .get(&key)
                .map(|(service, reals)| (service, reals.as_slice()));
            crate::explain::kernel::ipvs::drift(desired.virtuals.get(&key), kernel)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_spread_over_the_whole_list() {
        let every: Vec<usize> = (0..10).collect();
        assert_eq!(spread(every.clone(), 20), every);
        assert_eq!(spread(every.clone(), 5), [0, 2, 4, 6, 8]);
        assert_eq!(spread(every.clone(), 3), [0, 4, 7]);
        assert_eq!(spread((0..10_000).collect::<Vec<usize>>(), 7).len(), 7);
    }
}
