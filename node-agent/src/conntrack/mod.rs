//! Conntrack hygiene after syncs: kube-proxy's stale UDP cleanup (its conntrack reconciler), and the
//! flows of endpoints that left their Service, on every protocol.
//!
//! ```text
//! sync applied, some UDP entry's endpoints changed
//!   └─► udp_targets(spec, family) ─► Targets { (service IP, port) → serving endpoints (address, port),
//!                                              nodePort → serving endpoints }
//!       Conntrack::list(UDP, family) ─► [Flow] ─► stale_filters(targets, flows) ─► Conntrack::delete_matching
//!       each (one per frontend × stale endpoint address and port, however many clients)
//! sync applied over an earlier plan
//!   └─► removed_endpoints(previous, current) ─► [EndpointFlows] ─► clear_removed():
//!       ≤ 16 filters: Conntrack::delete_matching each; more: Conntrack::list per protocol and family
//!       once ─► matched(filters, flows) ─► delete_matching only for the filters something matches
//! ```
//!
//! UDP has no connection teardown: a client that keeps sending to a ClusterIP keeps its conntrack entry,
//! and with it the DNAT to an endpoint that may be gone, or serve on another port now, for as long as it
//! sends (kubernetes#19029, #125467). After a sync in which any UDP entry's endpoints changed, every UDP
//! flow whose original destination is one of an entry's frontends (ClusterIP, LoadBalancer IP or
//! externalIP with the port, or any address with the NodePort) and whose reply source, address and port,
//! is not one of that entry's serving endpoints is deleted, so the next packet is DNATed afresh
//! ([`select`]). Traffic policy and topology are ignored; terminating endpoints still serve, so their
//! flows drain; an entry whose endpoints are all gone or unready loses every flow (kubernetes#139628:
//! its REJECT answers the next packet).
//!
//! TCP, SCTP (and UDP) connections to an endpoint that *left* its Service — listed nowhere in the new
//! plan's entry, neither as an endpoint nor as an unready address — are cleared too ([`removed`]):
//! terminating endpoints stay listed, so they drain untouched.

pub mod cli;
pub mod drain;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod removed;
pub mod select;
pub mod settings;

pub use cli::CliConntrack;
#[cfg(any(test, feature = "testing"))]
pub use fake::FakeConntrack;
pub use removed::{EndpointFlows, LIST_FIRST_ABOVE, matched, removed_endpoints};
pub use select::{Targets, stale_filters, udp_fingerprints, udp_targets};
pub use settings::ConntrackSettings;

use std::net::IpAddr;

use switchyard_api::{IpFamily, Protocol};

use crate::error::Error;

/// One direction of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

/// A conntrack entry: the original direction and the expected reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    /// As the client sent it (destination = the service frontend).
    pub original: Tuple,
    /// As the reply comes back (source = the endpoint the flow was DNATed to).
    pub reply: Tuple,
}

impl Flow {
    /// The family of its addresses.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.original.src)
    }
}

/// The conntrack table.
pub trait Conntrack: Send {
    /// Every entry of `protocol` and `family`.
    fn list(&mut self, protocol: Protocol, family: IpFamily) -> Result<Vec<Flow>, Error>;
    /// The entries of `protocol` and `family` whose connection has not ended: a TCP entry in
    /// TIME_WAIT or CLOSE (SCTP: CLOSED) stays for minutes after its connection closed, to absorb late
    /// packets, and is no connection that still goes through the node. A table that keeps no states
    /// (the fake) lists every entry.
    fn list_open(&mut self, protocol: Protocol, family: IpFamily) -> Result<Vec<Flow>, Error> {
        self.list(protocol, family)
    }
    /// Deletes every entry of `flows` (one filter, however many entries match); returns how many.
    fn delete_matching(&mut self, flows: &EndpointFlows) -> Result<u64, Error>;
}

/// Deletes the entries of every filter in `filters` (from [`removed_endpoints`]); returns how many
/// entries went and how many filters were run. Each `conntrack -D` walks the whole table, so past
/// [`LIST_FIRST_ABOVE`] filters the table is listed once per protocol and family and only the filters
/// some entry matches are run: a change that replaces every endpoint of 10,000 Services leaves ~50,000
/// filters, nearly all of them matching nothing, which one process each would take minutes to learn.
pub fn clear_removed(
    conntrack: &mut dyn Conntrack,
    filters: &[EndpointFlows],
) -> Result<(u64, usize), Error> {
    let run: Vec<EndpointFlows> = if filters.len() <= LIST_FIRST_ABOVE {
        filters.to_vec()
    } else {
        let mut kinds: Vec<(Protocol, IpFamily)> = filters.iter().map(|f| (f.protocol, f.family)).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let mut run = Vec::new();
        for (protocol, family) in kinds {
            let flows = conntrack.list(protocol, family)?;
            run.extend(matched(filters, protocol, family, &flows));
        }
        run
    };
    let mut cleared = 0;
    for flows in &run {
        cleared += conntrack.delete_matching(flows)?;
    }
    Ok((cleared, run.len()))
}
