//! An in-memory [`Ipvs`]: the kernel's IPVS table as the agent sees it through netlink, with the
//! kernel's answers for bad requests (EEXIST, ESRCH, ENOENT for a missing scheduler module), so tests
//! compare the resulting state rather than a sequence of calls.
//!
//! ```text
//! FakeIpvs (cloneable handle, shared state)
//!   ├─ Ipvs impl ─► services / add / update / delete, destinations / add / update / delete
//!   └─ test controls ─► table(), set_connections, remove_scheduler, fail_service, add_foreign, changes()
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use switchyard_api::IpFamily;

use super::kernel::{Destination, Ipvs, RealKey, Service, VirtualKey};
use crate::error::Error;

const EEXIST: i32 = 17;
const ESRCH: i32 = 3;
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;

/// The schedulers Debian's kernel ships as modules.
const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// One virtual service and its real servers.
pub type Entry = (Service, BTreeMap<RealKey, Destination>);

#[derive(Debug, Default)]
struct State {
    table: BTreeMap<VirtualKey, Entry>,
    foreign: Vec<Service>,
    schedulers: BTreeSet<String>,
    failing: BTreeMap<VirtualKey, i32>,
    changes: usize,
}

/// The fake; clones share one table.
#[derive(Debug, Clone)]
pub struct FakeIpvs {
    state: Arc<Mutex<State>>,
}

impl Default for FakeIpvs {
    fn default() -> Self {
        Self::new()
    }
}

fn describe(service: &Service) -> String {
    service
        .key()
        .map_or_else(|| format!("{:?}", service.target), |k| k.to_string())
}

fn refused(operation: String, errno: i32) -> Error {
    Error::IpvsRequest {
        operation,
        errno: Some(errno),
        reason: std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

impl FakeIpvs {
    /// An empty table with every scheduler available.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                schedulers: SCHEDULERS.iter().map(|s| s.to_string()).collect(),
                ..State::default()
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The whole table (protocol/address/port services).
    pub fn table(&self) -> BTreeMap<VirtualKey, Entry> {
        self.lock().table.clone()
    }

    /// The real servers of one service and their weights (empty when it does not exist).
    pub fn weights(&self, key: &VirtualKey) -> BTreeMap<RealKey, u32> {
        self.lock()
            .table
            .get(key)
            .map(|(_, reals)| reals.iter().map(|(k, d)| (*k, d.weight)).collect())
            .unwrap_or_default()
    }

    /// Mutating calls that succeeded so far (adds, updates, deletes).
    pub fn changes(&self) -> usize {
        self.lock().changes
    }

    /// Sets a real server's connection counters (traffic the test pretends happened).
    pub fn set_connections(&self, key: &VirtualKey, real: &RealKey, active: u32, inactive: u32) -> bool {
        let mut state = self.lock();
        match state
            .table
            .get_mut(key)
            .and_then(|(_, reals)| reals.get_mut(real))
        {
            Some(dest) => {
                dest.active_conns = active;
                dest.inactive_conns = inactive;
                true
            }
            None => false,
        }
    }

    /// Makes a scheduler module unavailable (services asking for it fail with ENOENT), or available again.
    pub fn set_scheduler_available(&self, name: &str, available: bool) {
        let mut state = self.lock();
        if available {
            state.schedulers.insert(name.to_string());
        } else {
            state.schedulers.remove(name);
        }
    }

    /// Makes every request about `key` fail with `errno` (`None`: succeed again).
    pub fn fail_service(&self, key: VirtualKey, errno: Option<i32>) {
        let mut state = self.lock();
        match errno {
            Some(errno) => state.failing.insert(key, errno),
            None => state.failing.remove(&key),
        };
    }

    /// Adds a service behind the agent's back (another tool, or drift), bypassing all checks.
    pub fn insert(&self, service: Service, reals: &[Destination]) {
        let mut state = self.lock();
        match service.key() {
            Some(key) => {
                let reals = reals.iter().map(|d| (d.real, *d)).collect();
                state.table.insert(key, (service, reals));
            }
            None => state.foreign.push(service),
        }
    }

    /// Removes a service behind the agent's back.
    pub fn remove(&self, key: &VirtualKey) -> bool {
        self.lock().table.remove(key).is_some()
    }

    fn check(state: &State, key: &VirtualKey, operation: impl FnOnce() -> String) -> Result<(), Error> {
        match state.failing.get(key) {
            Some(errno) => Err(refused(operation(), *errno)),
            None => Ok(()),
        }
    }

    fn validate(state: &State, service: &Service, operation: impl FnOnce() -> String) -> Result<(), Error> {
        if !state.schedulers.contains(&service.scheduler) {
            // The kernel asks for module ip_vs_<name>; when that fails it answers ENOENT.
            return Err(refused(operation(), ENOENT));
        }
        if service.family == IpFamily::IPv6 && !(1..=128).contains(&service.netmask) {
            return Err(refused(operation(), EINVAL));
        }
        Ok(())
    }
}

impl Ipvs for FakeIpvs {
    fn services(&mut self) -> Result<Vec<Service>, Error> {
        let state = self.lock();
        Ok(state
            .table
            .values()
            .map(|(service, _)| service.clone())
            .chain(state.foreign.iter().cloned())
            .collect())
    }

    fn add_service(&mut self, service: &Service) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("add service {}", describe(service));
        let key = service.key().ok_or_else(|| refused(operation(), EINVAL))?;
        Self::check(&state, &key, operation)?;
        Self::validate(&state, service, operation)?;
        if state.table.contains_key(&key) {
            return Err(refused(operation(), EEXIST));
        }
        state.table.insert(key, (service.clone(), BTreeMap::new()));
        state.changes += 1;
        Ok(())
    }

    fn update_service(&mut self, service: &Service) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("update service {}", describe(service));
        let key = service.key().ok_or_else(|| refused(operation(), EINVAL))?;
        Self::check(&state, &key, operation)?;
        Self::validate(&state, service, operation)?;
        match state.table.get_mut(&key) {
            Some((existing, _)) => *existing = service.clone(),
            None => return Err(refused(operation(), ESRCH)),
        }
        state.changes += 1;
        Ok(())
    }

    fn delete_service(&mut self, key: &VirtualKey) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("delete service {key}");
        Self::check(&state, key, operation)?;
        if state.table.remove(key).is_none() {
            return Err(refused(operation(), ESRCH));
        }
        state.changes += 1;
        Ok(())
    }

    fn destinations(&mut self, key: &VirtualKey) -> Result<Vec<Destination>, Error> {
        let state = self.lock();
        let operation = || format!("list real servers of {key}");
        Self::check(&state, key, operation)?;
        match state.table.get(key) {
            Some((_, reals)) => Ok(reals.values().copied().collect()),
            None => Err(refused(operation(), ESRCH)),
        }
    }

    fn add_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("add real server {} to {key}", dest.real);
        Self::check(&state, key, operation)?;
        let reals = match state.table.get_mut(key) {
            Some((_, reals)) => reals,
            None => return Err(refused(operation(), ESRCH)),
        };
        if reals.contains_key(&dest.real) {
            return Err(refused(operation(), EEXIST));
        }
        reals.insert(
            dest.real,
            Destination {
                active_conns: 0,
                inactive_conns: 0,
                persistent_conns: 0,
                connections: 0,
                ..*dest
            },
        );
        state.changes += 1;
        Ok(())
    }

    fn update_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("update real server {} of {key}", dest.real);
        Self::check(&state, key, operation)?;
        let existing = match state.table.get_mut(key) {
            Some((_, reals)) => reals.get_mut(&dest.real),
            None => return Err(refused(operation(), ESRCH)),
        };
        match existing {
            Some(existing) => {
                existing.weight = dest.weight;
                existing.forward = dest.forward;
                existing.upper_threshold = dest.upper_threshold;
                existing.lower_threshold = dest.lower_threshold;
            }
            None => return Err(refused(operation(), ENOENT)),
        }
        state.changes += 1;
        Ok(())
    }

    fn delete_destination(&mut self, key: &VirtualKey, real: &RealKey) -> Result<(), Error> {
        let mut state = self.lock();
        let operation = || format!("delete real server {real} of {key}");
        Self::check(&state, key, operation)?;
        let removed = match state.table.get_mut(key) {
            Some((_, reals)) => reals.remove(real).is_some(),
            None => return Err(refused(operation(), ESRCH)),
        };
        if !removed {
            return Err(refused(operation(), ENOENT));
        }
        state.changes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipvs::kernel::Target;
    use switchyard_api::Protocol;

    fn vs(addr: &str, port: u16) -> VirtualKey {
        VirtualKey {
            addr: addr.parse().unwrap(),
            protocol: Protocol::TCP,
            port,
        }
    }

    fn rs(addr: &str, port: u16) -> RealKey {
        RealKey {
            addr: addr.parse().unwrap(),
            port,
        }
    }

    fn errno(result: Result<impl std::fmt::Debug, Error>) -> Option<i32> {
        match result {
            Err(Error::IpvsRequest { errno, .. }) => errno,
            other => panic!("expected a refused request, got {other:?}"),
        }
    }

    #[test]
    fn it_answers_like_the_kernel() {
        let mut ipvs = FakeIpvs::new();
        let key = vs("10.96.0.10", 80);
        let service = Service::new(key, "rr", None);
        ipvs.add_service(&service).unwrap();
        assert_eq!(errno(ipvs.add_service(&service)), Some(EEXIST));
        assert_eq!(errno(ipvs.delete_service(&vs("10.96.0.11", 80))), Some(ESRCH));
        assert_eq!(errno(ipvs.destinations(&vs("10.96.0.11", 80))), Some(ESRCH));

        let dest = Destination::new(rs("10.244.1.1", 8080), 1);
        ipvs.add_destination(&key, &dest).unwrap();
        assert_eq!(errno(ipvs.add_destination(&key, &dest)), Some(EEXIST));
        let missing = Destination::new(rs("10.244.1.2", 8080), 1);
        assert_eq!(errno(ipvs.update_destination(&key, &missing)), Some(ENOENT));
        assert_eq!(errno(ipvs.delete_destination(&key, &missing.real)), Some(ENOENT));
        ipvs.update_destination(&key, &Destination::new(dest.real, 0))
            .unwrap();
        assert_eq!(ipvs.weights(&key), BTreeMap::from([(dest.real, 0)]));
        assert_eq!(ipvs.changes(), 3);

        ipvs.delete_service(&key).unwrap();
        assert!(ipvs.table().is_empty());
    }

    #[test]
    fn a_missing_scheduler_module_and_injected_failures_are_refused() {
        let mut ipvs = FakeIpvs::new();
        ipvs.set_scheduler_available("mh", false);
        let key = vs("10.96.0.10", 80);
        assert_eq!(
            errno(ipvs.add_service(&Service::new(key, "mh", None))),
            Some(ENOENT)
        );
        ipvs.set_scheduler_available("mh", true);
        ipvs.add_service(&Service::new(key, "mh", None)).unwrap();
        ipvs.fail_service(key, Some(EINVAL));
        assert_eq!(errno(ipvs.destinations(&key)), Some(EINVAL));
        ipvs.fail_service(key, None);
        assert!(ipvs.destinations(&key).unwrap().is_empty());
        let mut v6 = Service::new(
            VirtualKey {
                addr: "fd00::1".parse().unwrap(),
                protocol: Protocol::UDP,
                port: 53,
            },
            "rr",
            None,
        );
        v6.netmask = 0xffff_ffff;
        assert_eq!(errno(ipvs.add_service(&v6)), Some(EINVAL));
    }

    #[test]
    fn counters_and_foreign_services_are_visible() {
        let mut ipvs = FakeIpvs::new();
        let key = vs("10.96.0.10", 80);
        let real = rs("10.244.1.1", 8080);
        ipvs.insert(Service::new(key, "rr", None), &[Destination::new(real, 1)]);
        assert!(ipvs.set_connections(&key, &real, 2, 5));
        let dest = ipvs.destinations(&key).unwrap()[0];
        assert_eq!((dest.active_conns, dest.inactive_conns), (2, 5));
        let mut fwmark = Service::new(key, "rr", None);
        fwmark.target = Target::Fwmark(7);
        ipvs.insert(fwmark, &[]);
        assert_eq!(ipvs.services().unwrap().len(), 2);
        assert!(ipvs.remove(&key));
        assert!(!ipvs.set_connections(&key, &real, 0, 0));
    }
}
