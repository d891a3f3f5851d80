//! An in-memory conntrack table for tests: flows are added by the test, listed and deleted by the code
//! under test, and the filters it ran are recorded.
//!
//! ```text
//! test ─► add(flow) / add_tracked(protocol, flow) ─► FakeConntrack (shared) ◄─ list / delete_matching
//!                                                                               ─ code under test
//!                                                  └─► flows(), tracked(), cleared(), lists() for assertions
//! ```

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use switchyard_api::{IpFamily, Protocol};

use super::{Conntrack, EndpointFlows, Flow};
use crate::error::Error;

#[derive(Debug, Default)]
struct State {
    flows: Vec<Flow>,
    tracked: Vec<(Protocol, Flow)>,
    cleared: Vec<EndpointFlows>,
    lists: usize,
    fail: bool,
}

/// The fake; clones share one table.
#[derive(Debug, Clone, Default)]
pub struct FakeConntrack {
    state: Arc<Mutex<State>>,
}

impl FakeConntrack {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a UDP flow to the table.
    pub fn add(&self, flow: Flow) {
        self.lock().flows.push(flow);
    }

    /// Adds a flow of another protocol than UDP.
    pub fn add_tracked(&self, protocol: Protocol, flow: Flow) {
        self.lock().tracked.push((protocol, flow));
    }

    /// The UDP flows left.
    pub fn flows(&self) -> Vec<Flow> {
        self.lock().flows.clone()
    }

    /// Removes a flow of another protocol than UDP (the connection ended).
    pub fn remove_tracked(&self, flow: &Flow) {
        self.lock().tracked.retain(|(_, f)| f != flow);
    }

    /// The flows of other protocols left.
    pub fn tracked(&self) -> Vec<(Protocol, Flow)> {
        self.lock().tracked.clone()
    }

    /// The filters `delete_matching` was called with, in order.
    pub fn cleared(&self) -> Vec<EndpointFlows> {
        self.lock().cleared.clone()
    }

    /// How many times the table was listed.
    pub fn lists(&self) -> usize {
        self.lock().lists
    }

    /// Makes every call fail (conntrack missing).
    pub fn set_failing(&self, fail: bool) {
        self.lock().fail = fail;
    }
}

fn unavailable() -> Error {
    Error::RunCommand {
        command: "fake conntrack".into(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }
}

impl Conntrack for FakeConntrack {
    fn list(&mut self, protocol: Protocol, family: IpFamily) -> Result<Vec<Flow>, Error> {
        let mut state = self.lock();
        if state.fail {
            return Err(unavailable());
        }
        state.lists += 1;
        let udp = state.flows.iter().filter(|_| protocol == Protocol::UDP);
        let tracked = state
            .tracked
            .iter()
            .filter(|(p, _)| *p == protocol)
            .map(|(_, f)| f);
        Ok(udp
            .chain(tracked)
            .filter(|f| f.family() == family)
            .copied()
            .collect())
    }

    fn delete_matching(&mut self, flows: &EndpointFlows) -> Result<u64, Error> {
        let mut state = self.lock();
        if state.fail {
            return Err(unavailable());
        }
        state.cleared.push(*flows);
        let before = state.flows.len() + state.tracked.len();
        state.flows.retain(|f| !flows.matches(Protocol::UDP, f));
        state.tracked.retain(|(protocol, f)| !flows.matches(*protocol, f));
        Ok((before - state.flows.len() - state.tracked.len()) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::Tuple;

    fn flow(src: &str, dst: &str) -> Flow {
        let (src, dst) = (src.parse().unwrap(), dst.parse().unwrap());
        Flow {
            original: Tuple {
                src,
                dst,
                sport: 1,
                dport: 53,
            },
            reply: Tuple {
                src: dst,
                dst: src,
                sport: 53,
                dport: 1,
            },
        }
    }

    #[test]
    fn lists_by_protocol_and_family() {
        let mut fake = FakeConntrack::default();
        let (v4, v6) = (flow("10.0.0.1", "10.96.0.10"), flow("fd00::1", "fd00::10"));
        fake.add(v4);
        fake.add(v6);
        fake.add_tracked(Protocol::TCP, v4);
        assert_eq!(fake.list(Protocol::UDP, IpFamily::IPv4).unwrap(), vec![v4]);
        assert_eq!(fake.list(Protocol::UDP, IpFamily::IPv6).unwrap(), vec![v6]);
        assert_eq!(fake.list(Protocol::SCTP, IpFamily::IPv4).unwrap(), vec![]);
        fake.set_failing(true);
        assert!(fake.list(Protocol::UDP, IpFamily::IPv6).is_err());
        assert_eq!(fake.lists(), 3);
    }

    #[test]
    fn deletes_what_a_filter_matches_on_every_protocol() {
        let mut fake = FakeConntrack::default();
        let to = |endpoint: &str| {
            let mut f = flow("10.0.0.1", "10.96.0.10");
            f.reply.src = endpoint.parse().unwrap();
            f
        };
        fake.add(to("10.244.1.5"));
        fake.add_tracked(Protocol::TCP, to("10.244.1.5"));
        fake.add_tracked(Protocol::TCP, to("10.244.1.6"));
        let filter = EndpointFlows {
            protocol: Protocol::TCP,
            family: IpFamily::IPv4,
            frontend: Some("10.96.0.10".parse().unwrap()),
            port: 53,
            endpoint: "10.244.1.5".parse().unwrap(),
            endpoint_port: Some(53),
        };
        assert_eq!(fake.delete_matching(&filter).unwrap(), 1);
        assert_eq!(fake.delete_matching(&filter).unwrap(), 0);
        assert_eq!(fake.tracked(), vec![(Protocol::TCP, to("10.244.1.6"))]);
        assert_eq!(fake.flows(), vec![to("10.244.1.5")], "UDP is another protocol");
        let node_port = EndpointFlows {
            protocol: Protocol::UDP,
            frontend: None,
            ..filter
        };
        assert_eq!(fake.delete_matching(&node_port).unwrap(), 1);
        assert_eq!(fake.cleared(), vec![filter, filter, node_port]);
    }
}
