//! Element-only transactions as one nf_tables netlink batch, bypassing the `nft` CLI.
//!
//! ```text
//! Transaction (only add/delete element ops, small) ─► encode() ─► BATCH_BEGIN
//!                                                                  NEWSETELEM / DELSETELEM (≤ 100 elements each, ACK)
//!                                                                  BATCH_END          ─► one atomic commit
//! anything else (chains, sets, a large transaction) ─► None: the caller uses `nft -f`
//! ```
//!
//! Why: `nft` 1.0.6 fetches every element of every set before it runs a `delete element` (measured
//! 14 ms per call at 10,000 services, against 3 ms for an add), and replacing an endpoint is a delete
//! plus an add. A one-service change is a handful of element swaps, so it goes to the kernel directly:
//! well under a millisecond.
//!
//! Encoding (what nft itself sends; checked against `nft -j list` in the real-kernel tests): each part of
//! a concatenated key or value takes a multiple of 4 bytes; addresses in network order, `inet_proto` one
//! byte, `inet_service` two bytes big-endian, the `numgen` slot a 32-bit host-order integer; a verdict
//! is `NFTA_DATA_VERDICT { code (big-endian), chain }`.

use std::net::IpAddr;

use switchyard_api::{IpFamily, Protocol};

use super::model::{Key, SetId, Value};
use super::names::TABLE;
use super::transaction::{Op, Transaction};

/// Largest batch sent over netlink; bigger transactions go through `nft -f`.
pub const MAX_BATCH_BYTES: usize = 128 * 1024;
/// Elements per netlink message (each message is acknowledged on its own).
const ELEMENTS_PER_MESSAGE: usize = 100;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;

const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub(super) const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub(super) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub(super) const NFTA_LIST_ELEM: u16 = 1;
pub(super) const NFTA_SET_ELEM_KEY: u16 = 1;
pub(super) const NFTA_SET_ELEM_DATA: u16 = 2;
pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;
pub(super) const NFTA_VERDICT_CHAIN: u16 = 2;
/// `NF_DROP`.
pub(super) const VERDICT_DROP: i32 = 0;
/// `NFT_GOTO`.
pub(super) const VERDICT_GOTO: i32 = -4;

/// One element change: the key, and the value when it is added.
type Change<'a> = (&'a Key, Option<&'a Value>);

/// An encoded batch and what each acknowledged message was, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The bytes to send, in one `send`.
    pub bytes: Vec<u8>,
    /// `(sequence number, "add element … set")` of each message the kernel acknowledges.
    pub messages: Vec<(u32, String)>,
}

fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::IPv4 => 2,
        IpFamily::IPv6 => 10,
    }
}

/// A growing netlink message buffer with nested attributes.
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn header(&mut self, kind: u16, flags: u16, sequence: u32, family: u8, res_id: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&sequence.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&[family, 0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    fn finish_message(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn attr(&mut self, kind: u16, value: &[u8]) {
        self.buf
            .extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
    }

    fn string(&mut self, kind: u16, value: &str) {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.attr(kind, &bytes);
    }

    fn begin_nested(&mut self, kind: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        start
    }

    fn end_nested(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
}

fn addr(out: &mut Vec<u8>, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
}

fn proto(out: &mut Vec<u8>, protocol: Protocol) {
    let number = match protocol {
        Protocol::TCP => 6,
        Protocol::UDP => 17,
        Protocol::SCTP => 132,
    };
    out.extend_from_slice(&[number, 0, 0, 0]);
}

fn port(out: &mut Vec<u8>, port: u16) {
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
}

/// The key of `id` as the kernel stores it; `None` when the key does not have the set's layout.
pub fn key_bytes(id: SetId, key: &Key) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(40);
    match (id, key) {
        (SetId::ClusterIps | SetId::NodeportIps, Key::Addr(ip)) => addr(&mut out, ip),
        (
            SetId::ServiceIps
            | SetId::NoEndpointServices
            | SetId::FirewallIps
            | SetId::FastMasq
            | SetId::Fast(_),
            Key::Frontend(ip, p, dport),
        ) => {
            addr(&mut out, ip);
            proto(&mut out, *p);
            port(&mut out, *dport);
        }
        (SetId::FastEps(_), Key::FrontendSlot(ip, p, dport, slot)) => {
            addr(&mut out, ip);
            proto(&mut out, *p);
            port(&mut out, *dport);
            out.extend_from_slice(&slot.to_ne_bytes());
        }
        (SetId::ServiceNodeports | SetId::NoEndpointNodeports | SetId::FastNp(_), Key::Port(p, dport)) => {
            proto(&mut out, *p);
            port(&mut out, *dport);
        }
        (SetId::FastNpEps(_), Key::PortSlot(p, dport, slot)) => {
            proto(&mut out, *p);
            port(&mut out, *dport);
            out.extend_from_slice(&slot.to_ne_bytes());
        }
        (SetId::Hairpin, Key::Hairpin(ip, p, dport)) => {
            addr(&mut out, ip);
            addr(&mut out, ip);
            proto(&mut out, *p);
            port(&mut out, *dport);
        }
        _ => return None,
    }
    Some(out)
}

fn data(w: &mut Writer, value: &Value) {
    let start = w.begin_nested(NFTA_SET_ELEM_DATA);
    match value {
        Value::Endpoint(ip, dport) => {
            let mut bytes = Vec::with_capacity(20);
            addr(&mut bytes, ip);
            port(&mut bytes, *dport);
            w.attr(NFTA_DATA_VALUE, &bytes);
        }
        Value::Goto(chain) => {
            let verdict = w.begin_nested(NFTA_DATA_VERDICT);
            w.attr(NFTA_VERDICT_CODE, &VERDICT_GOTO.to_be_bytes());
            w.string(NFTA_VERDICT_CHAIN, chain);
            w.end_nested(verdict);
        }
        Value::Drop => {
            let verdict = w.begin_nested(NFTA_DATA_VERDICT);
            w.attr(NFTA_VERDICT_CODE, &VERDICT_DROP.to_be_bytes());
            w.end_nested(verdict);
        }
        Value::None => {}
    }
    w.end_nested(start);
}

/// The transaction as one netlink batch with sequence numbers from `sequence`; `None` when it holds
/// anything but element changes of the sets with a fixed role, or is too large.
pub fn encode(transaction: &Transaction<'_>, mut sequence: u32) -> Option<Batch> {
    let family = nfproto(transaction.family);
    let mut w = Writer { buf: Vec::new() };
    let mut messages = Vec::new();
    let begin = w.header(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        sequence,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    w.finish_message(begin);
    for op in &transaction.ops {
        let (set, kind, flags, elements): (&str, u16, u16, Vec<Change<'_>>) = match op {
            Op::AddElements { set, elements } => (
                set,
                NFT_MSG_NEWSETELEM,
                NLM_F_CREATE,
                elements.sorted().into_iter().map(|(k, v)| (k, Some(v))).collect(),
            ),
            Op::DeleteElements { set, keys } => (
                set,
                NFT_MSG_DELSETELEM,
                0,
                keys.iter().map(|k| (k, None)).collect(),
            ),
            _ => return None,
        };
        let id = SetId::parse(set)?;
        for chunk in elements.chunks(ELEMENTS_PER_MESSAGE) {
            sequence = sequence.wrapping_add(1);
            let start = w.header(
                (NFNL_SUBSYS_NFTABLES << 8) | kind,
                NLM_F_REQUEST | NLM_F_ACK | flags,
                sequence,
                family,
                0,
            );
            w.string(NFTA_SET_ELEM_LIST_TABLE, TABLE);
            w.string(NFTA_SET_ELEM_LIST_SET, set);
            let list = w.begin_nested(NFTA_SET_ELEM_LIST_ELEMENTS);
            for (key, value) in chunk {
                let element = w.begin_nested(NFTA_LIST_ELEM);
                let key_attr = w.begin_nested(NFTA_SET_ELEM_KEY);
                w.attr(NFTA_DATA_VALUE, &key_bytes(id, key)?);
                w.end_nested(key_attr);
                if let Some(value) = value
                    && **value != Value::None
                {
                    data(&mut w, value);
                }
                w.end_nested(element);
            }
            w.end_nested(list);
            w.finish_message(start);
            let verb = if kind == NFT_MSG_NEWSETELEM {
                "add"
            } else {
                "delete"
            };
            messages.push((sequence, format!("{verb} element {set}")));
            if w.buf.len() > MAX_BATCH_BYTES {
                return None;
            }
        }
    }
    sequence = sequence.wrapping_add(1);
    let end = w.header(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        sequence,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    w.finish_message(end);
    Some(Batch {
        bytes: w.buf,
        messages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nftables::transaction::TxBuilder;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn keys_are_laid_out_in_four_byte_parts() {
        let key = Key::FrontendSlot(ip("10.96.0.1"), Protocol::UDP, 53, 2);
        let bytes = key_bytes(SetId::FastEps(3), &key).unwrap();
        let mut want = vec![10, 96, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0];
        want.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(bytes, want);
        assert_eq!(
            key_bytes(SetId::ClusterIps, &Key::Addr(ip("fd00::1")))
                .unwrap()
                .len(),
            16
        );
        assert_eq!(
            key_bytes(SetId::Hairpin, &Key::Hairpin(ip("10.0.0.1"), Protocol::TCP, 80))
                .unwrap()
                .len(),
            16
        );
        assert_eq!(
            key_bytes(SetId::ClusterIps, &key),
            None,
            "a key of another layout"
        );
    }

    #[test]
    fn only_small_element_transactions_are_batched() {
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.element_removed(
            "fast-2-eps",
            Key::FrontendSlot(ip("10.96.0.1"), Protocol::TCP, 80, 0),
        );
        tx.element_added(
            "fast-2-eps",
            Key::FrontendSlot(ip("10.96.0.1"), Protocol::TCP, 80, 0),
            Value::Endpoint(ip("10.244.1.1"), 8080),
        );
        tx.element_added(
            "service-ips",
            Key::Frontend(ip("10.96.0.2"), Protocol::TCP, 80),
            Value::Drop,
        );
        let batch = encode(&tx.finish(), 100).unwrap();
        assert_eq!(
            batch.messages,
            [
                (101, "delete element fast-2-eps".to_string()),
                (102, "add element fast-2-eps".to_string()),
                (103, "add element service-ips".to_string())
            ]
        );
        // Begin and end frame the batch; every message length is 4-byte aligned.
        assert_eq!(
            u16::from_ne_bytes([batch.bytes[4], batch.bytes[5]]),
            NFNL_MSG_BATCH_BEGIN
        );
        assert_eq!(batch.bytes.len() % 4, 0);

        let mut tx = TxBuilder::new(IpFamily::IPv4);
        tx.chain_removed("service-X");
        assert_eq!(encode(&tx.finish(), 1), None);
        let mut tx = TxBuilder::new(IpFamily::IPv4);
        for i in 0..10_000u16 {
            tx.element_added("fast-np-1", Key::Port(Protocol::TCP, i + 1), Value::None);
        }
        assert!(encode(&tx.finish(), 1).is_none(), "too large: nft -f takes it");
    }
}
