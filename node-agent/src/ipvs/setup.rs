//! IPVS mode on this host: the real edges wired together, for `apply`/`run` (backend selection with
//! fallback) and `cleanup`.
//!
//! ```text
//! host_dataplane ─► SelectDataplane(iptables, factory: ipset installed? ─► NetlinkIpvs::connect_or_load
//!                                                      ─► IpvsDataplane(real edges))
//!                                    + leftovers: swyd-ipvs0 exists? ─► IpvsDataplane::cleanup
//! cleanup_objects ─► our virtual servers, ipsets and swyd-ipvs0 (after the caller removed the SWYD rules)
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::dataplane::{IpvsConfig, IpvsDataplane, IpvsEdges, remove_objects};
use super::dummy::{NetlinkDummy, ServiceAddrs};
use super::ipset::ExecIpsets;
use super::kernel::{Absent, Ipvs};
use super::netlink::NetlinkIpvs;
use super::select::{IpvsFactory, Leftovers, SelectDataplane};
use super::sysctl::{OSRELEASE, ProcSysctls};
use crate::command::find_in_path;
use crate::error::Error;
use crate::host::{HostFeatures, NetlinkAddrs};
use crate::iptables::dataplane::IptablesDataplane;
use crate::iptables::exec::ExecIptables;
use crate::sync::dataplane::{Cleanup, Dataplane};
use crate::sync::{Clock, SystemClock};

fn edges(ipvs: Box<dyn Ipvs>, iptables: ExecIptables) -> IpvsEdges<ExecIptables> {
    IpvsEdges {
        ipvs,
        ipsets: Box::new(ExecIpsets),
        dummy: Box::new(NetlinkDummy),
        iptables,
        addrs: Box::new(NetlinkAddrs),
        sysctls: Box::new(ProcSysctls),
    }
}

/// The dataplane for `apply` and `run`: the plan's backend, IPVS when this host can do it.
pub fn host_dataplane(iptables: ExecIptables, features: HostFeatures, grace: Duration) -> SelectDataplane {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = IpvsConfig {
        grace,
        features,
        kernel_release: std::fs::read_to_string(OSRELEASE)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    let (factory_iptables, factory_clock, factory_config) =
        (iptables.clone(), Arc::clone(&clock), config.clone());
    let factory: IpvsFactory = Box::new(move || {
        if find_in_path("ipset").is_none() {
            return Err(Error::IpvsUnavailable(
                "the ipset command is not installed".into(),
            ));
        }
        let ipvs = NetlinkIpvs::connect_or_load()?;
        // Without the dummy driver no service address can be local, so IPVS would never see traffic.
        NetlinkDummy
            .ensure()
            .map_err(|e| Error::IpvsUnavailable(format!("cannot create {}: {e}", super::dummy::INTERFACE)))?;
        let dataplane = IpvsDataplane::new(
            edges(Box::new(ipvs), factory_iptables.clone()),
            Arc::clone(&factory_clock),
            factory_config.clone(),
        );
        Ok(Box::new(dataplane) as Box<dyn Dataplane>)
    });
    let leftover_iptables = iptables.clone();
    let leftovers: Leftovers = Box::new(move || {
        if !NetlinkDummy.exists()? {
            return Ok(Cleanup::default());
        }
        // IPVS mode ran here before. Without the module loaded no virtual server can exist.
        let ipvs: Box<dyn Ipvs> = match NetlinkIpvs::connect() {
            Ok(ipvs) => Box::new(ipvs),
            Err(_) => Box::new(Absent),
        };
        IpvsDataplane::new(
            edges(ipvs, leftover_iptables.clone()),
            Arc::clone(&clock),
            config.clone(),
        )
        .cleanup()
    });
    let iptables = IptablesDataplane::new(iptables, NetlinkAddrs, features);
    SelectDataplane::new(Box::new(iptables), factory).with_leftover_cleanup(leftovers)
}

/// Removes IPVS mode's virtual servers, ipsets and interface; run after the SWYD iptables rules are
/// gone. Returns how many objects went.
pub fn cleanup_objects() -> Result<usize, Error> {
    let mut ipvs: Box<dyn Ipvs> = match NetlinkIpvs::connect() {
        Ok(ipvs) => Box::new(ipvs),
        Err(_) => Box::new(Absent),
    };
    let mut ipsets = ExecIpsets;
    if find_in_path("ipset").is_none() && !NetlinkDummy.exists()? {
        return Ok(0);
    }
    let (services, _, rest) = remove_objects(&mut *ipvs, &mut ipsets, &mut NetlinkDummy, || {
        Ok(Cleanup::default())
    })?;
    Ok(services + rest)
}

/// What `render --backend ipvs` prints on this host: NodePorts resolved against its addresses (none
/// when they cannot be read), nothing changed.
pub fn render_for_host(
    spec: &switchyard_api::NodeForwardingPlanSpec,
    skip: &std::collections::HashSet<usize>,
    features: HostFeatures,
    local: &[std::net::IpAddr],
) -> String {
    // Service addresses already on the dummy interface are not the node's own.
    let bound = NetlinkDummy.addresses().unwrap_or_default();
    let local_addrs: Vec<std::net::IpAddr> = local.iter().copied().filter(|ip| !bound.contains(ip)).collect();
    let facts = super::IpvsFacts {
        local_addrs,
        random_fully: features.random_fully,
        tcp_be_liberal: features.tcp_be_liberal,
    };
    let desired = super::render(spec, &facts, skip);
    let node_ports: Vec<_> = desired
        .glue
        .keys()
        .map(|family| {
            (
                *family,
                super::node_port_addresses(spec, *family, &facts.local_addrs, &desired.addresses),
            )
        })
        .collect();
    super::text::render_text(spec, &desired, &node_ports)
}
