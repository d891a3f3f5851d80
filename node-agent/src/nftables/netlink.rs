//! The cheap look at our table: chain names, rule counts with the first rule's comment, set names with
//! their comments and element counts, straight from nf_tables over netlink.
//!
//! ```text
//! NFT_MSG_GETCHAIN dump (family) ─► chains of table `switchyard` (name, hooked?)
//! NFT_MSG_GETRULE dump (table)   ─► per chain: rule count, first rule's comment (userdata)
//! NFT_MSG_GETSET dump (table)    ─► named sets: comment (userdata)
//! NFT_MSG_GETSETELEM dump (set)  ─► per non-dynamic set: element count
//!                                ─► Summary
//! apply_batch(Batch)             ─► BATCH_BEGIN … NEWSETELEM/DELSETELEM … BATCH_END ─► one ack per message
//! ```
//!
//! Why not `nft -j list`: nft loads every set element before it prints even one chain (1.5 s for a
//! chain at 10,000 services here); these dumps cost milliseconds, so the periodic drift check can run
//! every resync period. Only counts and comments are decoded; the full read-back
//! ([`super::listing`]) still goes through `nft -j`.
//!
//! A dump that the kernel marks interrupted (the ruleset changed while it ran) is an error; the caller
//! retries at the next check.

use std::collections::BTreeMap;

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};
use switchyard_api::IpFamily;

use super::kernel::{ChainSummary, SetSummary, Summary};
use super::names::TABLE;
use crate::error::Error;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_GETCHAIN: u16 = 4;
pub(super) const NFT_MSG_GETRULE: u16 = 7;
pub(super) const NFT_MSG_GETSET: u16 = 10;
pub(super) const NFT_MSG_GETSETELEM: u16 = 13;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const ENOENT: i32 = 2;

/// `NFTA_*_TABLE` is attribute 1 of tables' children (chains, rules, sets, element lists).
pub(super) const ATTR_TABLE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
pub(super) const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_USERDATA: u16 = 7;
pub(super) const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFT_SET_ANONYMOUS: u32 = 0x1;
/// libnftnl's `NFTNL_UDATA_RULE_COMMENT`.
const UDATA_RULE_COMMENT: u8 = 0;
/// libnftnl's `NFTNL_UDATA_SET_COMMENT`.
const UDATA_SET_COMMENT: u8 = 7;

const RECV_BUFFER: usize = 256 * 1024;

fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::IPv4 => 2,
        IpFamily::IPv6 => 10,
    }
}

fn failed(operation: &str, reason: impl std::fmt::Display) -> Error {
    Error::NftNetlink {
        operation: operation.to_string(),
        reason: reason.to_string(),
    }
}

/// A netlink attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    /// Type, without the nested/byte-order flags.
    pub kind: u16,
    /// Payload.
    pub value: &'a [u8],
}

/// The attributes in `data` (a sequence of aligned `nlattr`s); stops at the first malformed one.
pub fn attrs(mut data: &[u8]) -> Vec<Attr<'_>> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let kind = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            break;
        }
        out.push(Attr {
            kind,
            value: &data[4..len],
        });
        let aligned = (len + 3) & !3;
        data = data.get(aligned..).unwrap_or(&[]);
    }
    out
}

pub(super) fn string(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// The comment in libnftnl user data (`type u8, len u8, value` records).
pub fn udata_comment(mut data: &[u8], comment_type: u8) -> Option<String> {
    while data.len() >= 2 {
        let (kind, len) = (data[0], usize::from(data[1]));
        let value = data.get(2..2 + len)?;
        if kind == comment_type {
            return Some(string(value));
        }
        data = &data[2 + len..];
    }
    None
}

fn push_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn c_string(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

/// A dump request: `nlmsghdr`, `nfgenmsg`, attributes.
pub fn request(command: u16, family: IpFamily, sequence: u32, attributes: &[(u16, &str)]) -> Vec<u8> {
    let mut buf = vec![0u8; 16];
    buf.extend_from_slice(&[nfproto(family), 0, 0, 0]);
    for (kind, value) in attributes {
        push_attr(&mut buf, *kind, &c_string(value));
    }
    let len = buf.len() as u32;
    buf[0..4].copy_from_slice(&len.to_ne_bytes());
    buf[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | command).to_ne_bytes());
    buf[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    buf[8..12].copy_from_slice(&sequence.to_ne_bytes());
    buf
}

/// A netlink socket for nf_tables dumps in the current network namespace.
pub struct NftNetlink {
    socket: Socket,
    sequence: u32,
}

impl std::fmt::Debug for NftNetlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftNetlink").finish_non_exhaustive()
    }
}

impl NftNetlink {
    /// Opens the socket.
    pub fn open() -> Result<Self, Error> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| failed("opening the socket", e))?;
        socket.bind_auto().map_err(|e| failed("binding the socket", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| failed("connecting the socket", e))?;
        // Acknowledgements carry only the request's header, not the whole batch message back.
        socket
            .set_cap_ack(true)
            .map_err(|e| failed("setting NETLINK_CAP_ACK", e))?;
        Ok(Self { socket, sequence: 1 })
    }

    /// The next free sequence number, advanced past `count` messages.
    pub fn reserve_sequences(&mut self, count: usize) -> u32 {
        let first = self.sequence.wrapping_add(1);
        self.sequence = self.sequence.wrapping_add(count as u32 + 2);
        first
    }

    /// Runs one dump, handing each reply's attributes (after the `nfgenmsg`) to `each`. `Ok(false)` when
    /// the kernel answered ENOENT (no such table or set).
    pub(super) fn dump(
        &mut self,
        operation: &str,
        command: u16,
        family: IpFamily,
        attributes: &[(u16, &str)],
        each: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, Error> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let message = request(command, family, sequence, attributes);
        self.socket.send(&message, 0).map_err(|e| failed(operation, e))?;
        let mut buf: Vec<u8> = Vec::with_capacity(RECV_BUFFER);
        loop {
            buf.clear();
            let received = self.socket.recv(&mut buf, 0).map_err(|e| failed(operation, e))?;
            if received > buf.len() {
                return Err(failed(operation, "a netlink message was truncated"));
            }
            let mut data = &buf[..];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let flags = u16::from_ne_bytes([data[6], data[7]]);
                let seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                if len < 16 || len > data.len() {
                    return Err(failed(operation, "a malformed netlink message"));
                }
                let body = &data[16..len];
                data = data.get((len + 3) & !3..).unwrap_or(&[]);
                if seq != sequence {
                    continue;
                }
                if flags & NLM_F_DUMP_INTR != 0 {
                    return Err(failed(operation, "the ruleset changed during the dump"));
                }
                match kind {
                    NLMSG_DONE => return Ok(true),
                    NLMSG_ERROR => {
                        let errno = body
                            .get(0..4)
                            .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or_default();
                        return match errno {
                            0 => Ok(true),
                            ENOENT => Ok(false),
                            errno => Err(failed(operation, std::io::Error::from_raw_os_error(errno))),
                        };
                    }
                    _ => each(body.get(4..).unwrap_or(&[])),
                }
            }
        }
    }

    /// Sends an element batch ([`super::batch::encode`]) and waits for every message's acknowledgement.
    /// The kernel commits all of it or nothing; the first error names the message that failed.
    pub fn apply_batch(&mut self, batch: &super::batch::Batch) -> Result<(), Error> {
        const OPERATION: &str = "applying an element batch";
        self.socket
            .send(&batch.bytes, 0)
            .map_err(|e| failed(OPERATION, e))?;
        let mut pending: BTreeMap<u32, &str> = batch
            .messages
            .iter()
            .map(|(s, what)| (*s, what.as_str()))
            .collect();
        let mut first_error: Option<String> = None;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut buf: Vec<u8> = Vec::with_capacity(RECV_BUFFER);
        self.socket
            .set_non_blocking(true)
            .map_err(|e| failed(OPERATION, e))?;
        let result = loop {
            if pending.is_empty() {
                break Ok(());
            }
            buf.clear();
            match self.socket.recv(&mut buf, 0) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() > deadline {
                        break Err(failed(
                            OPERATION,
                            "no acknowledgement from the kernel within 10 s",
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    continue;
                }
                Err(e) => break Err(failed(OPERATION, e)),
            }
            let mut data = &buf[..];
            while data.len() >= 16 {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let kind = u16::from_ne_bytes([data[4], data[5]]);
                let seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
                if len < 16 || len > data.len() {
                    break;
                }
                let body = &data[16..len];
                data = data.get((len + 3) & !3..).unwrap_or(&[]);
                if kind != NLMSG_ERROR {
                    continue;
                }
                let Some(what) = pending.remove(&seq) else {
                    continue;
                };
                let errno = body
                    .get(0..4)
                    .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .unwrap_or_default();
                if errno != 0 && first_error.is_none() {
                    first_error = Some(format!("{what}: {}", std::io::Error::from_raw_os_error(errno)));
                }
            }
        };
        self.socket
            .set_non_blocking(false)
            .map_err(|e| failed(OPERATION, e))?;
        result?;
        match first_error {
            None => Ok(()),
            Some(reason) => Err(Error::NftTransaction {
                family: String::new(),
                line: None,
                stderr: format!("netlink batch refused, nothing applied: {reason}"),
                context: String::new(),
            }),
        }
    }

    /// Whether our table of `family` exists (one short dump: the canary before a partial sync).
    pub fn table_exists(&mut self, family: IpFamily) -> Result<bool, Error> {
        let mut found = false;
        self.dump("listing tables", NFT_MSG_GETTABLE, family, &[], &mut |body| {
            found |= attrs(body)
                .iter()
                .any(|a| a.kind == NFTA_TABLE_NAME && string(a.value) == TABLE);
        })?;
        Ok(found)
    }

    /// The summary of our table of `family`; `None` when it does not exist.
    pub fn summary(&mut self, family: IpFamily) -> Result<Option<Summary>, Error> {
        if !self.table_exists(family)? {
            return Ok(None);
        }
        let mut summary = Summary::default();
        let ours = |list: &[Attr<'_>]| {
            list.iter()
                .any(|a| a.kind == ATTR_TABLE && string(a.value) == TABLE)
        };

        self.dump(
            "listing chains",
            NFT_MSG_GETCHAIN,
            family,
            &[(ATTR_TABLE, TABLE)],
            &mut |body| {
                let list = attrs(body);
                if !ours(&list) {
                    return;
                }
                if let Some(name) = list.iter().find(|a| a.kind == NFTA_CHAIN_NAME) {
                    summary.chains.insert(
                        string(name.value),
                        ChainSummary {
                            base: list.iter().any(|a| a.kind == NFTA_CHAIN_HOOK),
                            rules: 0,
                            digest: None,
                        },
                    );
                }
            },
        )?;

        let chains = &mut summary.chains;
        self.dump(
            "listing rules",
            NFT_MSG_GETRULE,
            family,
            &[(ATTR_TABLE, TABLE)],
            &mut |body| {
                let list = attrs(body);
                if !ours(&list) {
                    return;
                }
                let Some(chain) = list.iter().find(|a| a.kind == NFTA_RULE_CHAIN) else {
                    return;
                };
                let entry = chains.entry(string(chain.value)).or_insert(ChainSummary {
                    base: false,
                    rules: 0,
                    digest: None,
                });
                if entry.rules == 0 {
                    entry.digest = list
                        .iter()
                        .find(|a| a.kind == NFTA_RULE_USERDATA)
                        .and_then(|a| udata_comment(a.value, UDATA_RULE_COMMENT));
                }
                entry.rules += 1;
            },
        )?;

        let mut sets: BTreeMap<String, Option<String>> = BTreeMap::new();
        self.dump(
            "listing sets",
            NFT_MSG_GETSET,
            family,
            &[(ATTR_TABLE, TABLE)],
            &mut |body| {
                let list = attrs(body);
                if !ours(&list) {
                    return;
                }
                let flags = list
                    .iter()
                    .find(|a| a.kind == NFTA_SET_FLAGS)
                    .and_then(|a| a.value.get(0..4))
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                if flags & NFT_SET_ANONYMOUS != 0 {
                    return;
                }
                if let Some(name) = list.iter().find(|a| a.kind == NFTA_SET_NAME) {
                    let comment = list
                        .iter()
                        .find(|a| a.kind == NFTA_SET_USERDATA)
                        .and_then(|a| udata_comment(a.value, UDATA_SET_COMMENT));
                    sets.insert(string(name.value), comment);
                }
            },
        )?;
        for (name, comment) in sets {
            let mut elements = 0usize;
            self.dump(
                "listing set elements",
                NFT_MSG_GETSETELEM,
                family,
                &[(ATTR_TABLE, TABLE), (NFTA_SET_ELEM_LIST_SET, &name)],
                &mut |body| {
                    for list in attrs(body)
                        .iter()
                        .filter(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS)
                    {
                        elements += attrs(list.value)
                            .iter()
                            .filter(|a| a.kind == NFTA_LIST_ELEM)
                            .count();
                    }
                },
            )?;
            summary.sets.insert(
                name,
                SetSummary {
                    digest: comment,
                    elements,
                },
            );
        }
        Ok(Some(summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_laid_out_like_libnftnls() {
        let message = request(
            NFT_MSG_GETSETELEM,
            IpFamily::IPv6,
            7,
            &[(1, "switchyard"), (2, "fast-5")],
        );
        // header 16 + nfgenmsg 4 + attr (4 + 11 → 16) + attr (4 + 7 → 12)
        assert_eq!(message.len(), 48);
        assert_eq!(
            u32::from_ne_bytes([message[0], message[1], message[2], message[3]]),
            48
        );
        assert_eq!(u16::from_ne_bytes([message[4], message[5]]), (10 << 8) | 13);
        assert_eq!(u16::from_ne_bytes([message[6], message[7]]), 0x301);
        assert_eq!(message[16], 10);
        let list = attrs(&message[20..]);
        assert_eq!(list.len(), 2);
        assert_eq!((list[0].kind, string(list[0].value).as_str()), (1, "switchyard"));
        assert_eq!((list[1].kind, string(list[1].value).as_str()), (2, "fast-5"));
    }

    #[test]
    fn comments_are_found_in_user_data() {
        let data = [3u8, 2, b'x', b'y', 0, 4, b'a', b'b', b'c', 0];
        assert_eq!(udata_comment(&data, 0).as_deref(), Some("abc"));
        assert_eq!(udata_comment(&data, 7), None);
        assert_eq!(udata_comment(&[0, 9, b'a'], 0), None, "truncated record");
        assert!(attrs(&[8, 0, 1, 0]).is_empty(), "length beyond the data");
    }
}
