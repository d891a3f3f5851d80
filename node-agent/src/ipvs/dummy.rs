//! The dummy interface that holds every service IP, so the kernel treats traffic to them as local and
//! hands it to IPVS: [`ServiceAddrs`], implemented over rtnetlink by [`NetlinkDummy`] and in memory by
//! `FakeDummy`.
//!
//! ```text
//! IpvsDataplane ─► ensure()     ─► RTM_NEWLINK swyd-ipvs0 (kind dummy, up) when missing
//!               ├► addresses()  ◄─ RTM_GETADDR dump filtered to its index (none when it is missing)
//!               ├► change(add, remove) ─► RTM_NEWADDR ip/32|/128, RTM_DELADDR
//!               └► delete()     ─► RTM_DELLINK (cleanup)
//! ```
//!
//! kube-proxy leaves kube-ipvs0 down; ours is up, because IPv6 installs local routes only for addresses
//! of an interface that is up. A dummy device has NOARP, so being up announces nothing and skips DAD.
//! Every call runs on a short-lived thread with its own single-threaded runtime, as [`crate::probe`]
//! does, because the sync path is blocking code that may run inside the agent's runtime.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::{Handle, LinkDummy};

use crate::error::Error;

/// The interface's name.
pub const INTERFACE: &str = "swyd-ipvs0";

/// `EEXIST` / `ENODEV` / `EADDRNOTAVAIL` as rtnetlink reports them (negated errno).
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// The service-address interface.
pub trait ServiceAddrs: Send {
    /// True when the interface exists.
    fn exists(&mut self) -> Result<bool, Error>;
    /// Creates the interface (up) when it does not exist.
    fn ensure(&mut self) -> Result<(), Error>;
    /// Its addresses; empty when the interface does not exist.
    fn addresses(&mut self) -> Result<BTreeSet<IpAddr>, Error>;
    /// Adds and removes addresses (host prefixes). Adding a present or removing an absent address is
    /// not an error.
    fn change(&mut self, add: &[IpAddr], remove: &[IpAddr]) -> Result<(), Error>;
    /// Deletes the interface with its addresses; false when it did not exist.
    fn delete(&mut self) -> Result<bool, Error>;
}

/// The real interface, over rtnetlink.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetlinkDummy;

type Job<T> = Box<dyn FnOnce(Handle) -> Pin<Box<dyn Future<Output = Result<T, String>> + Send>> + Send>;

fn failed(reason: impl std::fmt::Display) -> Error {
    Error::ServiceInterface {
        interface: INTERFACE.to_string(),
        reason: reason.to_string(),
    }
}

/// Runs `job` against a fresh rtnetlink connection on its own thread and runtime.
fn block<T: Send + 'static>(job: Job<T>) -> Result<T, Error> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
            let task = tokio::spawn(connection);
            let result = job(handle).await;
            task.abort();
            result
        })
    })
    .join()
    .map_err(|_| failed("the netlink thread panicked"))?
    .map_err(failed)
}

fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|c| c.get().saturating_neg()),
        _ => None,
    }
}

/// The interface's index, `None` when it does not exist.
async fn index(handle: &Handle) -> Result<Option<u32>, String> {
    let mut links = handle.link().get().match_name(INTERFACE.to_string()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(Some(link.header.index)),
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(format!("looking it up: {e}")),
    }
}

async fn address_messages(handle: &Handle, index: u32) -> Result<Vec<AddressMessage>, String> {
    handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|e| format!("listing addresses: {e}"))
}

fn address_of(message: &AddressMessage) -> Option<IpAddr> {
    message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) | AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    })
}

impl ServiceAddrs for NetlinkDummy {
    fn exists(&mut self) -> Result<bool, Error> {
        block(Box::new(|handle| {
            Box::pin(async move { Ok(index(&handle).await?.is_some()) })
        }))
    }

    fn ensure(&mut self) -> Result<(), Error> {
        block(Box::new(|handle| {
            Box::pin(async move {
                if index(&handle).await?.is_some() {
                    return Ok(());
                }
                match handle
                    .link()
                    .add(LinkDummy::new(INTERFACE).up().build())
                    .execute()
                    .await
                {
                    Ok(()) => Ok(()),
                    Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
                    Err(e) => Err(format!("creating it: {e}")),
                }
            })
        }))
    }

    fn addresses(&mut self) -> Result<BTreeSet<IpAddr>, Error> {
        block(Box::new(|handle| {
            Box::pin(async move {
                let Some(index) = index(&handle).await? else {
                    return Ok(BTreeSet::new());
                };
                Ok(address_messages(&handle, index)
                    .await?
                    .iter()
                    .filter_map(address_of)
                    .collect())
            })
        }))
    }

    fn change(&mut self, add: &[IpAddr], remove: &[IpAddr]) -> Result<(), Error> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        let (add, remove) = (add.to_vec(), remove.to_vec());
        block(Box::new(move |handle| {
            Box::pin(async move {
                let index = index(&handle)
                    .await?
                    .ok_or_else(|| "the interface does not exist".to_string())?;
                for ip in add {
                    let prefix = if ip.is_ipv4() { 32 } else { 128 };
                    match handle.address().add(index, ip, prefix).execute().await {
                        Ok(()) => {}
                        Err(e) if errno(&e) == Some(EEXIST) => {}
                        Err(e) => return Err(format!("adding {ip}: {e}")),
                    }
                }
                if remove.is_empty() {
                    return Ok(());
                }
                let remove: BTreeSet<IpAddr> = remove.into_iter().collect();
                for message in address_messages(&handle, index).await? {
                    let Some(ip) = address_of(&message).filter(|ip| remove.contains(ip)) else {
                        continue;
                    };
                    match handle.address().del(message).execute().await {
                        Ok(()) => {}
                        Err(e) if errno(&e) == Some(EADDRNOTAVAIL) => {}
                        Err(e) => return Err(format!("removing {ip}: {e}")),
                    }
                }
                Ok(())
            })
        }))
    }

    fn delete(&mut self) -> Result<bool, Error> {
        block(Box::new(|handle| {
            Box::pin(async move {
                let Some(index) = index(&handle).await? else {
                    return Ok(false);
                };
                match handle.link().del(index).execute().await {
                    Ok(()) => Ok(true),
                    Err(e) if errno(&e) == Some(ENODEV) => Ok(false),
                    Err(e) => Err(format!("deleting it: {e}")),
                }
            })
        }))
    }
}

/// An in-memory interface; clones share it.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Default)]
pub struct FakeDummy {
    state: Arc<Mutex<Option<BTreeSet<IpAddr>>>>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeDummy {
    /// No interface yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Option<BTreeSet<IpAddr>>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its addresses, `None` when it does not exist.
    pub fn state(&self) -> Option<BTreeSet<IpAddr>> {
        self.lock().clone()
    }

    /// Removes an address behind the agent's back.
    pub fn tamper_remove(&self, ip: IpAddr) -> bool {
        self.lock().as_mut().is_some_and(|ips| ips.remove(&ip))
    }
}

#[cfg(any(test, feature = "testing"))]
impl ServiceAddrs for FakeDummy {
    fn exists(&mut self) -> Result<bool, Error> {
        Ok(self.lock().is_some())
    }

    fn ensure(&mut self) -> Result<(), Error> {
        self.lock().get_or_insert_with(BTreeSet::new);
        Ok(())
    }

    fn addresses(&mut self) -> Result<BTreeSet<IpAddr>, Error> {
        Ok(self.lock().clone().unwrap_or_default())
    }

    fn change(&mut self, add: &[IpAddr], remove: &[IpAddr]) -> Result<(), Error> {
        let mut state = self.lock();
        let ips = state
            .as_mut()
            .ok_or_else(|| failed("the interface does not exist"))?;
        ips.extend(add.iter().copied());
        for ip in remove {
            ips.remove(ip);
        }
        Ok(())
    }

    fn delete(&mut self) -> Result<bool, Error> {
        Ok(self.lock().take().is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_behaves_like_an_interface() {
        let mut dummy = FakeDummy::new();
        let ip: IpAddr = "10.96.0.10".parse().unwrap();
        assert!(dummy.addresses().unwrap().is_empty());
        assert!(dummy.change(&[ip], &[]).is_err(), "no interface yet");
        assert!(!dummy.exists().unwrap());
        dummy.ensure().unwrap();
        assert!(dummy.exists().unwrap());
        dummy.change(&[ip, ip], &[]).unwrap();
        assert_eq!(dummy.state(), Some(BTreeSet::from([ip])));
        dummy.change(&[], &[ip, "10.96.0.11".parse().unwrap()]).unwrap();
        assert_eq!(dummy.state(), Some(BTreeSet::new()));
        assert!(dummy.delete().unwrap());
        assert!(!dummy.delete().unwrap());
    }

    #[test]
    fn the_real_one_reads_nothing_when_the_interface_is_missing() {
        // This machine has no dummy driver and the interface is never created in unit tests; listing must
        // answer "no addresses" (or a clean error where netlink is unusable), never panic.
        match (NetlinkDummy.addresses(), NetlinkDummy.exists()) {
            (Ok(ips), Ok(exists)) => assert!(ips.is_empty() && !exists),
            (Err(e), _) | (_, Err(e)) => eprintln!("netlink unavailable here: {e}"),
        }
    }
}
