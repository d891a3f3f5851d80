//! This host's real edges wired together, in one place: the dataplane `apply` and `run` use (iptables
//! with IPVS and nftables as candidates), what `render` prints here, and what `cleanup` removes.
//!
//! ```text
//! host_dataplane ─► Selector(iptables: ExecIptables + NetlinkAddrs,   (+ switch_gate: verify::SwitchGate)
//!                    ipvs: ipset installed? ─► NetlinkIpvs::connect_or_load ─► dummy ensured ─► IpvsDataplane
//!                          leftovers: swyd-ipvs0 exists? ─► IpvsDataplane::retire (module loaded or not),
//!                    nftables: `nft` found ─► NftablesDataplane (leftovers: set up, then cleanup))
//! render_for_host ─► iptables --version, tcp_be_liberal, local addresses less the dummy's ─► render_text
//! cleanup ─► iptables variants holding our rules ─► IptablesDataplane::cleanup; nft tables; IPVS objects
//! ```

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use switchyard_api::{Backend, NodeForwardingPlanSpec};

use super::render_text::render_text;
use crate::backend::HostFacts;
use crate::backend::select::{Candidate, Factory, Gate, Leftovers, Selector};
use crate::command::{find_in_path, stdout_of};
use crate::error::Error;
use crate::iptables::dataplane::IptablesDataplane;
use crate::ipvs::dataplane::{IpvsConfig, IpvsDataplane, IpvsEdges, remove_objects};
use crate::ipvs::dummy::{INTERFACE, NetlinkDummy, ServiceAddrs};
use crate::ipvs::ipset::ExecIpsets;
use crate::ipvs::kernel::{Absent, Ipvs};
use crate::ipvs::netlink::NetlinkIpvs;
use crate::ipvs::sysctl::OSRELEASE;
use crate::nftables::dataplane::NftablesDataplane;
use crate::nftables::exec::ExecNft;
use crate::probe::{
    FixedAddrs, NetlinkAddrs, TCP_BE_LIBERAL_SYSCTL, parse_iptables_version, read_tcp_be_liberal,
    supports_random_fully,
};
use crate::sync::dataplane::{Cleanup, Dataplane};
use crate::sync::{Clock, SystemClock};
use crate::sysctl::ProcSysctls;
use crate::verify::SwitchGate;
use crate::xtables::exec::ExecIptables;
use crate::xtables::mode::{IptablesMode, Variant};

/// What `iptables --version` says on this host (`None` without iptables).
pub fn iptables_version() -> Option<String> {
    stdout_of(std::process::Command::new("iptables").arg("--version")).ok()
}

/// The host facts discovered once at start: `--random-fully` support from the iptables version, and
/// the liberal-TCP sysctl. No local addresses: the dataplanes read those per sync.
pub fn discover_facts(iptables_version: Option<&str>) -> HostFacts {
    HostFacts {
        random_fully: iptables_version
            .and_then(parse_iptables_version)
            .is_some_and(supports_random_fully),
        tcp_be_liberal: read_tcp_be_liberal(std::path::Path::new(TCP_BE_LIBERAL_SYSCTL)),
        local_addrs: Vec::new(),
    }
}

/// The switch gate of `run`: every frontend's verdict under the old and the new backend's render
/// ([`crate::verify::SwitchGate`]).
pub fn switch_gate() -> Gate {
    let mut gate = SwitchGate::default();
    Box::new(move |spec, skip, from, to| {
        gate.check(spec, skip, from, to)
            .map_err(|refused| refused.to_string())
    })
}

/// The dataplane for `apply` and `run`: the plan's backend, falling back to iptables where this host
/// cannot run it.
pub fn host_dataplane(iptables: ExecIptables, facts: HostFacts, ipvs: IpvsPeriods) -> Selector {
    let candidates = vec![
        ipvs_candidate(iptables.clone(), &facts, ipvs),
        nftables_candidate(),
    ];
    Selector::new(
        Box::new(IptablesDataplane::new(iptables, NetlinkAddrs, facts)),
        candidates,
    )
}

fn ipvs_edges(ipvs: Box<dyn Ipvs>, iptables: ExecIptables) -> IpvsEdges<ExecIptables> {
    IpvsEdges {
        ipvs,
        ipsets: Box::new(ExecIpsets),
        dummy: Box::new(NetlinkDummy),
        iptables,
        addrs: Box::new(NetlinkAddrs),
        sysctls: Box::new(ProcSysctls),
    }
}

/// Connects to IPVS over netlink when the module is loaded; nothing can exist in IPVS otherwise.
fn ipvs_if_loaded() -> Box<dyn Ipvs> {
    match NetlinkIpvs::connect() {
        Ok(ipvs) => Box::new(ipvs),
        Err(_) => Box::new(Absent),
    }
}

/// The IPVS backend's periods (`--ipvs-graceful-period`, `--ipvs-switch-drain-period`).
#[derive(Debug, Clone, Copy)]
pub struct IpvsPeriods {
    /// How long a real server that left the plan keeps its connections.
    pub grace: Duration,
    /// How long, after a switch away from IPVS, its busy virtual servers stay for their connections.
    pub switch_drain: Duration,
}

fn ipvs_candidate(iptables: ExecIptables, facts: &HostFacts, periods: IpvsPeriods) -> Candidate {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = IpvsConfig {
        grace: periods.grace,
        switch_drain: periods.switch_drain,
        facts: facts.clone(),
        kernel_release: std::fs::read_to_string(OSRELEASE)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    let (factory_iptables, factory_clock, factory_config) =
        (iptables.clone(), Arc::clone(&clock), config.clone());
    let factory: Factory = Box::new(move || {
        if find_in_path("ipset").is_none() {
            return Err(Error::IpvsUnavailable(
                "the ipset command is not installed".into(),
            ));
        }
        let ipvs = NetlinkIpvs::connect_or_load()?;
        // Without the dummy driver no service address can be local, so IPVS would never see traffic.
        NetlinkDummy
            .ensure()
            .map_err(|e| Error::IpvsUnavailable(format!("cannot create {INTERFACE}: {e}")))?;
        Ok(Box::new(IpvsDataplane::new(
            ipvs_edges(Box::new(ipvs), factory_iptables.clone()),
            Arc::clone(&factory_clock),
            factory_config.clone(),
        )) as Box<dyn Dataplane>)
    });
    let leftovers: Leftovers = Box::new(move |successor| {
        if !NetlinkDummy.exists()? {
            return Ok(Cleanup::default());
        }
        // IPVS mode ran here before. Removed whole: nothing would come back for virtual servers kept
        // for their connections (a restart in the middle of a switch's drain cuts what it still held).
        IpvsDataplane::new(
            ipvs_edges(ipvs_if_loaded(), iptables.clone()),
            Arc::clone(&clock),
            IpvsConfig {
                switch_drain: Duration::ZERO,
                ..config.clone()
            },
        )
        .retire(successor)
    });
    Candidate {
        backend: Backend::Ipvs,
        title: "IPVS",
        factory,
        leftovers: Some(leftovers),
        // The glue's sync removes the iptables backend's chains and jump rules itself.
        replaces: &[Backend::Iptables],
    }
}

fn nftables_candidate() -> Candidate {
    let factory: Factory = Box::new(|| {
        let nft = ExecNft::detect()?;
        tracing::debug!(version = %nft.version().unwrap_or_default(), "nft found");
        Ok(Box::new(NftablesDataplane::new(nft, NetlinkAddrs)) as Box<dyn Dataplane>)
    });
    Candidate {
        backend: Backend::Nftables,
        title: "nftables",
        factory,
        leftovers: None,
        replaces: &[],
    }
}

/// What `render --backend <backend>` prints on this host: the host's iptables version and features,
/// NodePorts resolved against `local` (the caller reads them; IPVS leaves out the service addresses
/// already on its dummy interface, which are not the node's own). Nothing is changed.
pub fn render_for_host(
    backend: Backend,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
    local: &[IpAddr],
) -> String {
    // nftables rules depend on no iptables feature: no `iptables --version` for them.
    let version = (backend != Backend::Nftables).then(iptables_version).flatten();
    let mut facts = discover_facts(version.as_deref());
    facts.local_addrs = if backend == Backend::Ipvs {
        let bound = NetlinkDummy.addresses().unwrap_or_default();
        local.iter().copied().filter(|ip| !bound.contains(ip)).collect()
    } else {
        local.to_vec()
    };
    render_text(backend, spec, skip, &facts, version.as_deref())
}

/// One line of what `cleanup` did: what it cleaned, and what it removed or why it failed.
pub type CleanupReport = (String, Result<String, Error>);

/// Whether `variant`'s existing tables (`*-save` without `-t` lists only tables that exist, and creates
/// none) hold any chain or rule of ours, in either family.
fn holds_ours(variant: Variant) -> bool {
    ["iptables", "ip6tables"].iter().any(|binary| {
        let mut save = std::process::Command::new(format!("{binary}-{variant}-save"));
        stdout_of(&mut save).is_ok_and(|text| text.contains(crate::xtables::chains::PREFIX))
    })
}

/// `switchyard-agent cleanup`: every backend's rules and objects removed from this host, iptables
/// first (so no rule refers to the IPVS sets any more), in the variants `mode` names. An error of one
/// part does not stop the others.
pub fn cleanup(mode: IptablesMode) -> Vec<CleanupReport> {
    let variants: Vec<Variant> = match mode {
        IptablesMode::Nft => vec![Variant::Nft],
        IptablesMode::Legacy => vec![Variant::Legacy],
        IptablesMode::Auto => vec![Variant::Nft, Variant::Legacy],
    };
    let mut report = Vec::new();
    for variant in variants {
        let what = format!("iptables-{variant}");
        // Reading a legacy table with `-t` creates it; `auto` must leave a host that never used a
        // variant without its tables (iptables-save would warn about them from then on).
        if mode == IptablesMode::Auto && !holds_ours(variant) {
            report.push((
                what,
                Ok("removed 0 jump rules and 0 chains (none present)".into()),
            ));
            continue;
        }
        let iptables = match ExecIptables::with_variant(variant) {
            Ok(iptables) => iptables,
            Err(e) if mode == IptablesMode::Auto => {
                tracing::info!(%variant, error = %e, "not cleaning this variant");
                continue;
            }
            Err(e) => {
                report.push((what, Err(e)));
                continue;
            }
        };
        let mut dataplane = IptablesDataplane::new(iptables, FixedAddrs::default(), HostFacts::default());
        let done = dataplane
            .cleanup()
            .map(|done| format!("removed {} jump rules and {} chains", done.jumps, done.objects));
        report.push((what, done));
    }
    let nft = cleanup_nftables()
        .map(|removed| format!("removed {removed} chains and sets (tables ip/ip6 switchyard)"));
    report.push(("nftables".into(), nft));
    let ipvs = cleanup_ipvs_objects()
        .map(|removed| format!("removed {removed} virtual servers, ipsets and interfaces"));
    report.push(("ipvs".into(), ipvs));
    report
}

/// Deletes our nftables tables of both families; the number of chains and sets removed. A host without
/// `nft` has nothing of ours.
fn cleanup_nftables() -> Result<usize, Error> {
    let nft = match ExecNft::detect() {
        Ok(nft) => nft,
        Err(e) => {
            tracing::info!(error = %e, "no nft: no nftables table to clean");
            return Ok(0);
        }
    };
    Ok(NftablesDataplane::new(nft, FixedAddrs::default())
        .cleanup()?
        .objects)
}

/// Removes IPVS mode's virtual servers, ipsets and interface; run after the SWYD iptables rules are
/// gone. Returns how many objects went.
fn cleanup_ipvs_objects() -> Result<usize, Error> {
    let mut ipvs = ipvs_if_loaded();
    let mut ipsets = ExecIpsets;
    if find_in_path("ipset").is_none() && !NetlinkDummy.exists()? {
        return Ok(0);
    }
    let (services, _, rest) = remove_objects(&mut *ipvs, &mut ipsets, &mut NetlinkDummy, || {
        Ok(Cleanup::default())
    })?;
    Ok(services + rest)
}
