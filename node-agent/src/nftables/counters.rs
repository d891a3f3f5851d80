//! The nftables traffic counters: per-element counters of the counted sets and the counters of the
//! source-range rules, read over netlink and named after the plan's Services.
//!
//! ```text
//! NFT_MSG_GETSET dump ─► counted sets present (SetId::counted)
//! NFT_MSG_GETSETELEM dump per set ─► (key bytes, data, counter packets) ─► decode_key / decode_value
//! NFT_MSG_GETRULE dump ─► firewall-… chains' rule counters
//!   ─► RawCounters ─► samples(raw, plan) ─► [counters::Sample]
//!        fast-N, service-ips         (addr . proto . port)        ─► its entry's frontend kind
//!        fast-np-N, service-nodeports (proto . port)               ─► nodePort
//!        fast-N-eps, fast-np-N-eps    (… . slot : ep . port)       ─► endpoint ep:port
//!        no-endpoint-*                (: goto reject-chain | drop) ─► refused: no-endpoints | no-local-endpoints
//!        firewall-… rule counter                                   ─► refused: source-range
//! ```
//!
//! Why netlink and not `nft -j list`: nft loads every element of the table before it prints (1.5 s at
//! 10,000 Services here); the dumps cost milliseconds and decode only the attributes needed. The key
//! layout is [`super::batch::key_bytes`]'s, read backwards (the tests go round the loop).
//!
//! Not counted yet: the per-endpoint split of complex entries (Local policies, affinity), whose
//! endpoints are picked by an anonymous map inside their chain: their Service series count them.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

use super::batch::{
    NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_LIST_ELEM, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE, VERDICT_DROP,
    VERDICT_GOTO,
};
use super::model::{Key, SetId, Value};
use super::names;
use super::netlink::{
    ATTR_TABLE, Attr, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFTA_RULE_CHAIN, NFTA_SET_NAME,
    NftNetlink, attrs, string,
};
use crate::counters::frontends::{Frontends, applied_entries, service_port};
use crate::counters::{Refusal, Sample, ServicePort, What, element_id};
use crate::error::Error;

const NFTA_SET_ELEM_EXPR: u16 = 7;
const NFTA_SET_ELEM_EXPRESSIONS: u16 = 10;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;

/// What one read of a table's counters found, still in the table's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawCounters {
    /// (set, key, value, packets) of every counted element.
    pub elements: Vec<(SetId, Key, Value, u64)>,
    /// (chain, packets) of every counting rule of a `firewall-…` chain.
    pub firewall_rules: Vec<(String, u64)>,
}

fn find<'a>(list: &[Attr<'a>], kind: u16) -> Option<&'a [u8]> {
    list.iter().find(|a| a.kind == kind).map(|a| a.value)
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?))
}

/// The packets of a `counter` expression (`NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`), if it is one.
fn counter_packets(expr: &[u8]) -> Option<u64> {
    let list = attrs(expr);
    if string(find(&list, NFTA_EXPR_NAME)?) != "counter" {
        return None;
    }
    be_u64(find(&attrs(find(&list, NFTA_EXPR_DATA)?), NFTA_COUNTER_PACKETS)?)
}

/// The counter of one set element (`NFTA_SET_ELEM_EXPR`, or the first counter of
/// `NFTA_SET_ELEM_EXPRESSIONS`).
fn element_packets(element: &[Attr<'_>]) -> Option<u64> {
    if let Some(expr) = find(element, NFTA_SET_ELEM_EXPR) {
        return counter_packets(expr);
    }
    attrs(find(element, NFTA_SET_ELEM_EXPRESSIONS)?)
        .iter()
        .filter(|a| a.kind == NFTA_LIST_ELEM)
        .find_map(|a| counter_packets(a.value))
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (bytes.get(..n)?, bytes.get(n..)?);
    *bytes = rest;
    Some(head)
}

fn read_addr(bytes: &mut &[u8], family: IpFamily) -> Option<IpAddr> {
    Some(match family {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(take(bytes, 4)?).ok()?)),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(take(bytes, 16)?).ok()?)),
    })
}

fn read_proto(bytes: &mut &[u8]) -> Option<Protocol> {
    match take(bytes, 4)?[0] {
        6 => Some(Protocol::TCP),
        17 => Some(Protocol::UDP),
        132 => Some(Protocol::SCTP),
        _ => None,
    }
}

fn read_port(bytes: &mut &[u8]) -> Option<u16> {
    let b = take(bytes, 4)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

fn read_slot(bytes: &mut &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(take(bytes, 4)?.try_into().ok()?))
}

/// The key of a counted set's element from the bytes the kernel stores ([`super::batch::key_bytes`]
/// backwards); `None` for a set that is not counted or bytes of another shape.
pub fn decode_key(id: SetId, family: IpFamily, mut bytes: &[u8]) -> Option<Key> {
    let b = &mut bytes;
    let key = match id {
        SetId::ServiceIps | SetId::NoEndpointServices | SetId::Fast(_) => {
            Key::Frontend(read_addr(b, family)?, read_proto(b)?, read_port(b)?)
        }
        SetId::FastEps(_) => Key::FrontendSlot(
            read_addr(b, family)?,
            read_proto(b)?,
            read_port(b)?,
            read_slot(b)?,
        ),
        SetId::ServiceNodeports | SetId::NoEndpointNodeports | SetId::FastNp(_) => {
            Key::Port(read_proto(b)?, read_port(b)?)
        }
        SetId::FastNpEps(_) => Key::PortSlot(read_proto(b)?, read_port(b)?, read_slot(b)?),
        _ => return None,
    };
    b.is_empty().then_some(key)
}

/// The value of an element (`NFTA_SET_ELEM_DATA`): a DNAT target or a verdict.
fn decode_value(data: Option<&[u8]>, family: IpFamily) -> Option<Value> {
    let Some(data) = data else {
        return Some(Value::None);
    };
    let list = attrs(data);
    if let Some(mut bytes) = find(&list, NFTA_DATA_VALUE) {
        let b = &mut bytes;
        return Some(Value::Endpoint(read_addr(b, family)?, read_port(b)?));
    }
    let verdict = attrs(find(&list, NFTA_DATA_VERDICT)?);
    let code = i32::from_be_bytes(find(&verdict, NFTA_VERDICT_CODE)?.get(0..4)?.try_into().ok()?);
    match code {
        VERDICT_DROP => Some(Value::Drop),
        VERDICT_GOTO => Some(Value::Goto(string(find(&verdict, NFTA_VERDICT_CHAIN)?).into())),
        _ => None,
    }
}

impl NftNetlink {
    /// The counters of our table of `family` (empty when the table does not exist).
    pub fn counters(&mut self, family: IpFamily) -> Result<RawCounters, Error> {
        let mut raw = RawCounters::default();
        if !self.table_exists(family)? {
            return Ok(raw);
        }
        let mut sets = Vec::new();
        self.dump(
            "listing sets",
            NFT_MSG_GETSET,
            family,
            &[(ATTR_TABLE, names::TABLE)],
            &mut |body| {
                if let Some(name) = find(&attrs(body), NFTA_SET_NAME)
                    && let Some(id) = SetId::parse(&string(name)).filter(|id| id.counted())
                {
                    sets.push((string(name), id));
                }
            },
        )?;
        for (name, id) in sets {
            let elements = &mut raw.elements;
            self.dump(
                "reading set counters",
                NFT_MSG_GETSETELEM,
                family,
                &[(ATTR_TABLE, names::TABLE), (NFTA_SET_ELEM_LIST_SET, &name)],
                &mut |body| {
                    for list in attrs(body)
                        .iter()
                        .filter(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS)
                    {
                        for element in attrs(list.value).iter().filter(|a| a.kind == NFTA_LIST_ELEM) {
                            let element = attrs(element.value);
                            let decoded = (|| {
                                let key = find(&attrs(find(&element, NFTA_SET_ELEM_KEY)?), NFTA_DATA_VALUE)?;
                                Some((
                                    decode_key(id, family, key)?,
                                    decode_value(find(&element, NFTA_SET_ELEM_DATA), family)?,
                                    element_packets(&element)?,
                                ))
                            })();
                            if let Some((key, value, packets)) = decoded {
                                elements.push((id, key, value, packets));
                            }
                        }
                    }
                },
            )?;
        }
        let rules = &mut raw.firewall_rules;
        self.dump(
            "reading rule counters",
            NFT_MSG_GETRULE,
            family,
            &[(ATTR_TABLE, names::TABLE)],
            &mut |body| {
                let list = attrs(body);
                let Some(chain) = find(&list, NFTA_RULE_CHAIN).map(string) else {
                    return;
                };
                if !chain.starts_with(names::FIREWALL_PREFIX) {
                    return;
                }
                let packets = find(&list, NFTA_RULE_EXPRESSIONS).and_then(|exprs| {
                    attrs(exprs)
                        .iter()
                        .filter(|a| a.kind == NFTA_LIST_ELEM)
                        .find_map(|a| counter_packets(a.value))
                });
                if let Some(packets) = packets {
                    rules.push((chain, packets));
                }
            },
        )?;
        Ok(raw)
    }
}

/// The Service port behind each source-range firewall chain of a family's applied entries.
fn firewalls(
    spec: &NodeForwardingPlanSpec,
    skip: &std::collections::HashSet<usize>,
    family: IpFamily,
) -> HashMap<String, ServicePort> {
    applied_entries(spec, skip, Some(family))
        .filter(|entry| !entry.source_ranges.is_empty())
        .map(|entry| {
            (
                names::firewall_chain(&entry.name, entry.protocol.lower()),
                service_port(entry),
            )
        })
        .collect()
}

/// The counters of one family's table, named after the plan's Service ports. Elements the plan does
/// not explain (a read racing a sync) are left out.
pub fn samples(
    raw: &RawCounters,
    spec: &NodeForwardingPlanSpec,
    skip: &std::collections::HashSet<usize>,
    family: IpFamily,
) -> Vec<Sample> {
    let index = Frontends::of(spec, skip, Some(family));
    let firewalls = firewalls(spec, skip, family);
    let mut out = Vec::with_capacity(raw.elements.len() + raw.firewall_rules.len());
    for (id, key, value, packets) in &raw.elements {
        let found = match (key, value) {
            (Key::Frontend(a, p, port), _) | (Key::FrontendSlot(a, p, port, _), _) => {
                index.address(*a, *p, *port)
            }
            (Key::Port(p, port), _) | (Key::PortSlot(p, port, _), _) => index.node_port(*p, *port),
            _ => None,
        };
        let Some((service, kind)) = found else {
            continue;
        };
        let what = match (id, value) {
            (SetId::FastEps(_) | SetId::FastNpEps(_), Value::Endpoint(ep, port)) => {
                What::Endpoint(std::net::SocketAddr::new(*ep, *port).to_string())
            }
            (SetId::NoEndpointServices | SetId::NoEndpointNodeports, Value::Drop) => {
                What::Refused(Refusal::NoLocalEndpoints)
            }
            (SetId::NoEndpointServices | SetId::NoEndpointNodeports, _) => {
                What::Refused(Refusal::NoEndpoints)
            }
            (SetId::Fast(_) | SetId::FastNp(_) | SetId::ServiceIps | SetId::ServiceNodeports, _) => {
                What::Frontend(kind)
            }
            _ => continue,
        };
        out.push(Sample {
            service: service.clone(),
            what,
            element: element_id((family, id, key)),
            packets: *packets,
        });
    }
    for (chain, packets) in &raw.firewall_rules {
        if let Some(service) = firewalls.get(chain) {
            out.push(Sample {
                service: service.clone(),
                what: What::Refused(Refusal::SourceRange),
                element: element_id((family, chain)),
                packets: *packets,
            });
        }
    }
    out
}

/// One read of both families' tables over `netlink`, named after `spec` (its entries `skip` left out).
pub fn read(
    netlink: &mut NftNetlink,
    spec: &NodeForwardingPlanSpec,
    skip: &HashSet<usize>,
) -> Result<Vec<Sample>, Error> {
    let mut out = Vec::new();
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let raw = netlink.counters(family)?;
        out.extend(samples(&raw, spec, skip, family));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Frontend;
    use crate::nftables::batch::key_bytes;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn keys_decode_from_the_bytes_the_batch_encodes() {
        let v4: IpAddr = "10.96.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let cases = [
            (
                SetId::Fast(2),
                IpFamily::IPv4,
                Key::Frontend(v4, Protocol::TCP, 80),
            ),
            (
                SetId::ServiceIps,
                IpFamily::IPv6,
                Key::Frontend(v6, Protocol::UDP, 53),
            ),
            (
                SetId::FastEps(3),
                IpFamily::IPv4,
                Key::FrontendSlot(v4, Protocol::SCTP, 9999, 2),
            ),
            (SetId::FastNp(1), IpFamily::IPv4, Key::Port(Protocol::TCP, 30080)),
            (
                SetId::FastNpEps(2),
                IpFamily::IPv6,
                Key::PortSlot(Protocol::UDP, 30053, 1),
            ),
            (
                SetId::NoEndpointNodeports,
                IpFamily::IPv4,
                Key::Port(Protocol::TCP, 30088),
            ),
        ];
        for (id, family, key) in cases {
            let bytes = key_bytes(id, &key).unwrap();
            assert_eq!(decode_key(id, family, &bytes), Some(key), "{id:?}");
            // One byte short or long is not a key of this set.
            assert_eq!(decode_key(id, family, &bytes[1..]), None, "{id:?}");
        }
        assert_eq!(
            decode_key(SetId::ClusterIps, IpFamily::IPv4, &[10, 96, 0, 1]),
            None
        );
    }

    #[test]
    fn raw_counters_are_named_after_the_plan() {
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/web:http", "10.96.0.1", 80)
                    .node_port(30080)
                    .external_ip("203.0.113.10")
                    .with(ep("10.244.1.5", 8080))
                    .with(ep("10.244.2.5", 8080)),
                entry("ns2/none:http", "10.96.0.2", 80).has_endpoints(false),
            ],
        );
        let raw = RawCounters {
            elements: vec![
                (
                    SetId::Fast(2),
                    Key::Frontend(ip("10.96.0.1"), Protocol::TCP, 80),
                    Value::None,
                    7,
                ),
                (
                    SetId::Fast(2),
                    Key::Frontend(ip("203.0.113.10"), Protocol::TCP, 80),
                    Value::None,
                    2,
                ),
                (SetId::FastNp(2), Key::Port(Protocol::TCP, 30080), Value::None, 1),
                (
                    SetId::FastEps(2),
                    Key::FrontendSlot(ip("10.96.0.1"), Protocol::TCP, 80, 0),
                    Value::Endpoint(ip("10.244.1.5"), 8080),
                    4,
                ),
                (
                    SetId::NoEndpointServices,
                    Key::Frontend(ip("10.96.0.2"), Protocol::TCP, 80),
                    Value::Goto("reject-chain".into()),
                    3,
                ),
                // Not in the plan (a read racing a sync): left out.
                (
                    SetId::Fast(1),
                    Key::Frontend(ip("10.96.9.9"), Protocol::TCP, 80),
                    Value::None,
                    5,
                ),
            ],
            firewall_rules: vec![],
        };
        let got: Vec<(String, What, u64)> = samples(&raw, &spec, &Default::default(), IpFamily::IPv4)
            .into_iter()
            .map(|s| (s.service.name.to_string(), s.what, s.packets))
            .collect();
        assert_eq!(
            got,
            vec![
                ("ns1/web:http".into(), What::Frontend(Frontend::ClusterIp), 7),
                ("ns1/web:http".into(), What::Frontend(Frontend::ExternalIp), 2),
                ("ns1/web:http".into(), What::Frontend(Frontend::NodePort), 1),
                ("ns1/web:http".into(), What::Endpoint("10.244.1.5:8080".into()), 4),
                ("ns2/none:http".into(), What::Refused(Refusal::NoEndpoints), 3),
            ]
        );
    }
}
