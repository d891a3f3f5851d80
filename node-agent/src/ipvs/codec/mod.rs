//! The IPVS generic-netlink codec: kernel vocabulary ([`Service`], [`Destination`]) ⇄ [`IpvsMessage`]
//! ⇄ bytes, on `netlink-packet-generic` (genlmsghdr, family resolution) and `netlink-packet-core`
//! (attributes, nlmsghdr).
//!
//! ```text
//! Service / Destination ─► service_request / dest_request ─► IpvsMessage { command, attrs }
//!        ▲                                                        │ GenlMessage (cmd, version 1, family id)
//!        │                                                        ▼ NetlinkMessage (flags, seq) ─► bytes
//!  service_of / destination_of ◄─ IpvsMessage ◄─ parse (replies of GET_SERVICE / GET_DEST dumps)
//! ```
//!
//! The request layout is libipvs's (ipvsadm 1.31): the same attributes in the same order, so the
//! bytes can be compared with what ipvsadm sends (see the golden tests). Nothing here does I/O.

pub mod attrs;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, Emitable, ParseableParametrized};
use netlink_packet_generic::{GenlFamily, GenlHeader};
use switchyard_api::IpFamily;

use self::attrs::{CmdAttr, DestAttr, SvcAttr, parse_all};
use super::kernel::{Destination, RealKey, SVC_F_HASHED, Service, Target, VirtualKey, ip_proto};

/// The generic-netlink family name the kernel registers when `ip_vs` is loaded.
pub const FAMILY_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const VERSION: u8 = 1;

/// `IPVS_CMD_*`.
pub mod cmd {
    /// Add a service (also the command of GET_SERVICE replies).
    pub const NEW_SERVICE: u8 = 1;
    /// Change a service.
    pub const SET_SERVICE: u8 = 2;
    /// Delete a service.
    pub const DEL_SERVICE: u8 = 3;
    /// Get (dump) services.
    pub const GET_SERVICE: u8 = 4;
    /// Add a destination (also the command of GET_DEST replies).
    pub const NEW_DEST: u8 = 5;
    /// Change a destination.
    pub const SET_DEST: u8 = 6;
    /// Delete a destination.
    pub const DEL_DEST: u8 = 7;
    /// Get (dump) the destinations of a service.
    pub const GET_DEST: u8 = 8;
}

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;

/// The address family number of `family`.
pub fn af(family: IpFamily) -> u16 {
    match family {
        IpFamily::IPv4 => AF_INET,
        IpFamily::IPv6 => AF_INET6,
    }
}

/// One IPVS generic-netlink message (the payload after the genlmsghdr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsMessage {
    /// `IPVS_CMD_*`.
    pub command: u8,
    /// Top-level attributes.
    pub attrs: Vec<CmdAttr>,
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.command
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Self {
            command: header.cmd,
            attrs: parse_all(buf, CmdAttr::parse)?,
        })
    }
}

/// 16 bytes, IPv4 in the first four (`union nf_inet_addr`).
fn addr_bytes(ip: IpAddr) -> Vec<u8> {
    let mut bytes = vec![0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes.copy_from_slice(&v6.octets()),
    }
    bytes
}

fn addr_of(af: u16, bytes: &[u8]) -> Result<IpAddr, DecodeError> {
    match (af, bytes.len()) {
        (AF_INET, n) if n >= 4 => Ok(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        (AF_INET6, 16) => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(bytes);
            Ok(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => Err(DecodeError::from(format!(
            "address of {} bytes for address family {af}",
            bytes.len()
        ))),
    }
}

/// The attributes that identify a protocol/address/port service (what DEL_SERVICE and the
/// destination commands need).
fn service_identity(key: &VirtualKey) -> Vec<SvcAttr> {
    vec![
        SvcAttr::Af(af(key.family())),
        SvcAttr::Protocol(ip_proto(key.protocol)),
        SvcAttr::Addr(addr_bytes(key.addr)),
        SvcAttr::Port(key.port),
    ]
}

/// NEW_SERVICE / SET_SERVICE: identity, then scheduler, flags (mask: all bits, so the request states
/// them all), timeout and netmask, in libipvs's order.
pub fn service_request(command: u8, service: &Service) -> IpvsMessage {
    let mut attrs = vec![SvcAttr::Af(af(service.family))];
    match service.target {
        Target::Addr { protocol, addr, port } => attrs.extend([
            SvcAttr::Protocol(protocol),
            SvcAttr::Addr(addr_bytes(addr)),
            SvcAttr::Port(port),
        ]),
        Target::Fwmark(mark) => attrs.push(SvcAttr::Fwmark(mark)),
    }
    attrs.extend([
        SvcAttr::SchedName(service.scheduler.clone()),
        SvcAttr::Flags {
            flags: service.flags,
            mask: u32::MAX,
        },
        SvcAttr::Timeout(service.timeout),
        SvcAttr::Netmask(service.netmask),
    ]);
    IpvsMessage {
        command,
        attrs: vec![CmdAttr::Service(attrs)],
    }
}

/// DEL_SERVICE.
pub fn delete_service_request(key: &VirtualKey) -> IpvsMessage {
    IpvsMessage {
        command: cmd::DEL_SERVICE,
        attrs: vec![CmdAttr::Service(service_identity(key))],
    }
}

/// GET_SERVICE (sent as a dump).
pub fn list_services_request() -> IpvsMessage {
    IpvsMessage {
        command: cmd::GET_SERVICE,
        attrs: Vec::new(),
    }
}

/// GET_DEST of one service (sent as a dump).
pub fn list_destinations_request(key: &VirtualKey) -> IpvsMessage {
    IpvsMessage {
        command: cmd::GET_DEST,
        attrs: vec![CmdAttr::Service(service_identity(key))],
    }
}

/// The destination attributes of NEW_DEST / SET_DEST, in libipvs's order (the tunnel settings only
/// matter for tunnel forwarding; they are sent as zero, as ipvsadm does).
pub fn dest_attrs(dest: &Destination) -> Vec<DestAttr> {
    vec![
        DestAttr::AddrFamily(af(IpFamily::of(&dest.real.addr))),
        DestAttr::Addr(addr_bytes(dest.real.addr)),
        DestAttr::Port(dest.real.port),
        DestAttr::FwdMethod(dest.forward),
        DestAttr::Weight(dest.weight),
        DestAttr::TunType(0),
        DestAttr::TunPort(0),
        DestAttr::TunFlags(0),
        DestAttr::UpperThreshold(dest.upper_threshold),
        DestAttr::LowerThreshold(dest.lower_threshold),
    ]
}

/// NEW_DEST / SET_DEST.
pub fn dest_request(command: u8, key: &VirtualKey, dest: &Destination) -> IpvsMessage {
    IpvsMessage {
        command,
        attrs: vec![
            CmdAttr::Service(service_identity(key)),
            CmdAttr::Dest(dest_attrs(dest)),
        ],
    }
}

/// DEL_DEST.
pub fn delete_dest_request(key: &VirtualKey, real: &RealKey) -> IpvsMessage {
    IpvsMessage {
        command: cmd::DEL_DEST,
        attrs: vec![
            CmdAttr::Service(service_identity(key)),
            CmdAttr::Dest(vec![
                DestAttr::Addr(addr_bytes(real.addr)),
                DestAttr::Port(real.port),
            ]),
        ],
    }
}

/// The service in a GET_SERVICE reply.
pub fn service_of(message: &IpvsMessage) -> Result<Service, DecodeError> {
    let attrs = message
        .attrs
        .iter()
        .find_map(|a| match a {
            CmdAttr::Service(attrs) => Some(attrs),
            _ => None,
        })
        .ok_or_else(|| DecodeError::from("a service reply without IPVS_CMD_ATTR_SERVICE"))?;
    let mut family = None;
    let (mut protocol, mut addr, mut port, mut fwmark) = (None, None, None, None);
    let mut service = Service {
        family: IpFamily::IPv4,
        target: Target::Fwmark(0),
        scheduler: String::new(),
        flags: 0,
        timeout: 0,
        netmask: 0,
    };
    for attr in attrs {
        match attr {
            SvcAttr::Af(v) => family = Some(*v),
            SvcAttr::Protocol(v) => protocol = Some(*v),
            SvcAttr::Addr(bytes) => addr = Some(bytes.as_slice()),
            SvcAttr::Port(v) => port = Some(*v),
            SvcAttr::Fwmark(v) => fwmark = Some(*v),
            SvcAttr::SchedName(name) => service.scheduler = name.clone(),
            SvcAttr::Flags { flags, .. } => service.flags = flags & !SVC_F_HASHED,
            SvcAttr::Timeout(v) => service.timeout = *v,
            SvcAttr::Netmask(v) => service.netmask = *v,
            SvcAttr::PeName(_) | SvcAttr::Other(_) => {}
        }
    }
    let af = family.ok_or_else(|| DecodeError::from("a service without IPVS_SVC_ATTR_AF"))?;
    service.family = match af {
        AF_INET => IpFamily::IPv4,
        AF_INET6 => IpFamily::IPv6,
        other => return Err(DecodeError::from(format!("unknown address family {other}"))),
    };
    service.target = match (fwmark, protocol, addr, port) {
        (Some(mark), _, _, _) if mark != 0 => Target::Fwmark(mark),
        (_, Some(protocol), Some(bytes), Some(port)) => Target::Addr {
            protocol,
            addr: addr_of(af, bytes)?,
            port,
        },
        _ => {
            return Err(DecodeError::from(
                "a service with neither fwmark nor protocol/address/port",
            ));
        }
    };
    Ok(service)
}

/// The destination in a GET_DEST reply; `family` is its service's, used when the reply does not say.
pub fn destination_of(message: &IpvsMessage, family: IpFamily) -> Result<Destination, DecodeError> {
    let attrs = message
        .attrs
        .iter()
        .find_map(|a| match a {
            CmdAttr::Dest(attrs) => Some(attrs),
            _ => None,
        })
        .ok_or_else(|| DecodeError::from("a destination reply without IPVS_CMD_ATTR_DEST"))?;
    let mut af_number = af(family);
    let (mut addr, mut port) = (None, None);
    let mut dest = Destination::new(
        RealKey {
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 0,
        },
        0,
    );
    for attr in attrs {
        match attr {
            DestAttr::Addr(bytes) => addr = Some(bytes.as_slice()),
            DestAttr::Port(v) => port = Some(*v),
            DestAttr::FwdMethod(v) => dest.forward = *v & super::kernel::FWD_MASK,
            DestAttr::Weight(v) => dest.weight = *v,
            DestAttr::UpperThreshold(v) => dest.upper_threshold = *v,
            DestAttr::LowerThreshold(v) => dest.lower_threshold = *v,
            DestAttr::ActiveConns(v) => dest.active_conns = *v,
            DestAttr::InactiveConns(v) => dest.inactive_conns = *v,
            DestAttr::PersistConns(v) => dest.persistent_conns = *v,
            DestAttr::Connections(v) => dest.connections = *v,
            DestAttr::AddrFamily(v) => af_number = *v,
            DestAttr::TunType(_) | DestAttr::TunPort(_) | DestAttr::TunFlags(_) | DestAttr::Other(_) => {}
        }
    }
    let (Some(bytes), Some(port)) = (addr, port) else {
        return Err(DecodeError::from("a destination without address or port"));
    };
    dest.real = RealKey {
        addr: addr_of(af_number, bytes)?,
        port,
    };
    Ok(dest)
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
