//! Probes of the host: what the agent reads from it for the pure render (iptables features, the
//! conntrack liberal-TCP sysctl, the node's local addresses), which [`crate::backend::HostFacts`] holds.
//!
//! ```text
//! iptables --version ─► parse_iptables_version ─► ≥ 1.6.2 ─► random_fully ─┐
//! /proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal ─► tcp_be_liberal ────┼─► backend::HostFacts
//! LocalAddrs (rtnetlink RTM_GETADDR dump | fixed list) ─► local addresses ──┘   (assembled by
//!                                                                                wiring::dataplane, and
//!                                                                                per sync by the
//!                                                                                dataplanes)
//! ```
//!
//! The agent runs in the node's network namespace (host network), so a plain rtnetlink socket sees the
//! node's addresses. The socket is opened on a short-lived thread with its own single-threaded runtime:
//! the sync path is blocking code that may itself run inside the agent's tokio runtime, where a nested
//! `block_on` would panic.

use std::net::IpAddr;
use std::path::Path;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;

use crate::error::Error;

/// Where the sysctl lives (per network namespace).
pub const TCP_BE_LIBERAL_SYSCTL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";

/// `(major, minor, patch)` from `iptables --version` output such as `iptables v1.8.9 (nf_tables)`.
pub fn parse_iptables_version(text: &str) -> Option<(u32, u32, u32)> {
    let start = text.find(" v")? + 2;
    let version: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// `--random-fully` arrived in iptables 1.6.2 (kube-proxy's `MinRandomFullyVersion`).
pub fn supports_random_fully(version: (u32, u32, u32)) -> bool {
    version >= (1, 6, 2)
}

/// The sysctl's value; false when it cannot be read (conntrack not loaded means the default, 0).
pub fn read_tcp_be_liberal(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|v| v != 0)
}

/// The node's local addresses (every address on every interface, loopback included).
pub trait LocalAddrs: Send {
    /// Lists them now.
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, Error>;
}

/// A fixed list: the fake for tests and for `render` on a machine that is not the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FixedAddrs(pub Vec<IpAddr>);

impl LocalAddrs for FixedAddrs {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, Error> {
        Ok(self.0.clone())
    }
}

/// The real one: an `RTM_GETADDR` dump over rtnetlink.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetlinkAddrs;

impl LocalAddrs for NetlinkAddrs {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, Error> {
        std::thread::spawn(list_addresses)
            .join()
            .map_err(|_| Error::ListAddresses {
                source: "the netlink thread panicked".into(),
            })?
    }
}

fn list_addresses() -> Result<Vec<IpAddr>, Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| Error::ListAddresses { source: e.into() })?;
    runtime.block_on(async {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::ListAddresses { source: e.into() })?;
        let task = tokio::spawn(connection);
        let mut messages = handle.address().get().execute();
        let mut addrs = Vec::new();
        loop {
            match messages.try_next().await {
                Ok(Some(message)) => {
                    // IFA_LOCAL is the interface's own address on point-to-point links (IFA_ADDRESS is
                    // the peer there); elsewhere only IFA_ADDRESS may be present.
                    let local = message.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Local(ip) => Some(*ip),
                        _ => None,
                    });
                    let address = message.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    });
                    if let Some(ip) = local.or(address) {
                        addrs.push(ip);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    task.abort();
                    return Err(Error::ListAddresses { source: e.into() });
                }
            }
        }
        task.abort();
        addrs.sort_unstable();
        addrs.dedup();
        Ok(addrs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_gate_random_fully() {
        assert_eq!(
            parse_iptables_version("iptables v1.8.9 (nf_tables)"),
            Some((1, 8, 9))
        );
        assert_eq!(parse_iptables_version("iptables v1.6.1"), Some((1, 6, 1)));
        assert_eq!(parse_iptables_version("iptables v1.4"), Some((1, 4, 0)));
        assert_eq!(parse_iptables_version("garbage"), None);
        assert!(supports_random_fully((1, 8, 9)));
        assert!(supports_random_fully((1, 6, 2)));
        assert!(!supports_random_fully((1, 6, 1)));
    }

    #[test]
    fn the_sysctl_is_read_leniently() {
        let scratch = switchyard_test_support::scratch::dir("host").unwrap();
        let dir = scratch.path();
        let file = dir.join("liberal");
        std::fs::write(&file, "1\n").unwrap();
        assert!(read_tcp_be_liberal(&file));
        std::fs::write(&file, "0\n").unwrap();
        assert!(!read_tcp_be_liberal(&file));
        assert!(!read_tcp_be_liberal(&dir.join("missing")));
    }

    #[test]
    fn netlink_lists_loopback() {
        // Every network namespace has lo; when netlink is unusable (a sandbox), say so but do not fail.
        match NetlinkAddrs.local_addrs() {
            Ok(addrs) => assert!(addrs.iter().any(IpAddr::is_loopback), "{addrs:?}"),
            Err(e) => eprintln!("netlink unavailable here: {e}"),
        }
        assert!(FixedAddrs(vec![]).local_addrs().unwrap().is_empty());
    }
}
