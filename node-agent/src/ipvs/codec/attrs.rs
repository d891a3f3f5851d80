//! The IPVS netlink attributes, one enum per nesting level, as laid out in the kernel's uapi
//! `include/uapi/linux/ip_vs.h` and parsed by `net/netfilter/ipvs/ip_vs_ctl.c`.
//!
//! ```text
//! genlmsghdr (cmd, version 1) ─► CmdAttr::Service ─► [SvcAttr: AF u16, PROTOCOL u16, ADDR 16 bytes, PORT be16,
//!                                                     SCHED_NAME nul-string, FLAGS {u32 flags, u32 mask},
//!                                                     TIMEOUT u32, NETMASK u32, ...]
//!                             └► CmdAttr::Dest ────► [DestAttr: ADDR, PORT be16, FWD_METHOD u32, WEIGHT u32,
//!                                                     U/L_THRESH u32, *_CONNS u32, ADDR_FAMILY u16, ...]
//! ```
//!
//! Integers are host order except the ports (network order, `nla_get_be16`). NETMASK is copied raw: an
//! IPv4 mask in network order (`0xffffffff` reads the same either way), an IPv6 prefix length as a
//! host-order number. Addresses are always 16 bytes (`union nf_inet_addr`), IPv4 in the first four,
//! as ipvsadm sends them. Nested attributes are sent with `NLA_F_NESTED`, as ipvsadm (libnl) does; the
//! kernel's replies leave it out, and parsing ignores it. Attributes this codec does not model
//! (statistics) are kept as [`DefaultNla`] so a parse never fails on a newer kernel's additions.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NESTED, Nla, NlaBuffer, NlasIterator, Parseable, emit_u16,
    emit_u16_be, emit_u32, parse_string, parse_u8, parse_u16, parse_u16_be, parse_u32,
};

/// `IPVS_CMD_ATTR_*`.
pub mod cmd_attr {
    /// `IPVS_CMD_ATTR_SERVICE`: nested service attributes.
    pub const SERVICE: u16 = 1;
    /// `IPVS_CMD_ATTR_DEST`: nested destination attributes.
    pub const DEST: u16 = 2;
}

/// `IPVS_SVC_ATTR_*`.
pub mod svc_attr {
    /// Address family (u16).
    pub const AF: u16 = 1;
    /// `IPPROTO_*` (u16).
    pub const PROTOCOL: u16 = 2;
    /// Virtual address (16 bytes).
    pub const ADDR: u16 = 3;
    /// Virtual port (be16).
    pub const PORT: u16 = 4;
    /// Firewall mark (u32).
    pub const FWMARK: u16 = 5;
    /// Scheduler name (nul-terminated).
    pub const SCHED_NAME: u16 = 6;
    /// `struct ip_vs_flags { u32 flags; u32 mask; }`.
    pub const FLAGS: u16 = 7;
    /// Persistence timeout in seconds (u32).
    pub const TIMEOUT: u16 = 8;
    /// Persistence netmask (u32).
    pub const NETMASK: u16 = 9;
    /// Persistence engine name (nul-terminated).
    pub const PE_NAME: u16 = 11;
}

/// `IPVS_DEST_ATTR_*`.
pub mod dest_attr {
    /// Real server address (16 bytes).
    pub const ADDR: u16 = 1;
    /// Real server port (be16).
    pub const PORT: u16 = 2;
    /// Forwarding method (u32).
    pub const FWD_METHOD: u16 = 3;
    /// Weight (u32).
    pub const WEIGHT: u16 = 4;
    /// Upper threshold (u32).
    pub const U_THRESH: u16 = 5;
    /// Lower threshold (u32).
    pub const L_THRESH: u16 = 6;
    /// Active connections (u32).
    pub const ACTIVE_CONNS: u16 = 7;
    /// Inactive connections (u32).
    pub const INACT_CONNS: u16 = 8;
    /// Persistence templates (u32).
    pub const PERSIST_CONNS: u16 = 9;
    /// Address family of the real server (u16).
    pub const ADDR_FAMILY: u16 = 11;
    /// Tunnel type (u8; tunnel forwarding only).
    pub const TUN_TYPE: u16 = 13;
    /// Tunnel port (be16).
    pub const TUN_PORT: u16 = 14;
    /// Tunnel flags (u16).
    pub const TUN_FLAGS: u16 = 15;
    /// 64-bit statistics (nested `IPVS_STATS_ATTR_*`; dumps only).
    pub const STATS64: u16 = 12;
}

/// `IPVS_STATS_ATTR_*`, inside `STATS64`.
pub mod stats_attr {
    /// Connections scheduled (u64, host order).
    pub const CONNS: u16 = 1;
}

/// Parses every attribute of `payload` with `parse`.
pub(super) fn parse_all<T>(
    payload: &[u8],
    parse: impl Fn(&NlaBuffer<&[u8]>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    NlasIterator::new(payload)
        .map(|nla| nla.and_then(|nla| parse(&nla)))
        .collect()
}

fn emit_nested<T: Nla>(attrs: &[T], buffer: &mut [u8]) {
    attrs.emit(buffer);
}

fn nested_len<T: Nla>(attrs: &[T]) -> usize {
    attrs.buffer_len()
}

fn nul_string_len(value: &str) -> usize {
    value.len() + 1
}

fn emit_nul_string(value: &str, buffer: &mut [u8]) {
    buffer[..value.len()].copy_from_slice(value.as_bytes());
    buffer[value.len()] = 0;
}

fn other(nla: &NlaBuffer<&[u8]>) -> Result<DefaultNla, DecodeError> {
    DefaultNla::parse(nla)
}

// emit_u16/u32 fail only when the buffer is too small, and `value_len` sized it.
fn put_u16(buffer: &mut [u8], value: u16) {
    let _ = emit_u16(buffer, value);
}

fn put_u32(buffer: &mut [u8], value: u32) {
    let _ = emit_u32(buffer, value);
}

/// A top-level attribute of an IPVS message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmdAttr {
    /// `IPVS_CMD_ATTR_SERVICE`.
    Service(Vec<SvcAttr>),
    /// `IPVS_CMD_ATTR_DEST`.
    Dest(Vec<DestAttr>),
    /// Anything else (daemon, timeouts).
    Other(DefaultNla),
}

impl Nla for CmdAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::Service(attrs) => nested_len(attrs),
            Self::Dest(attrs) => nested_len(attrs),
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Service(_) => cmd_attr::SERVICE | NLA_F_NESTED,
            Self::Dest(_) => cmd_attr::DEST | NLA_F_NESTED,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Service(attrs) => emit_nested(attrs, buffer),
            Self::Dest(attrs) => emit_nested(attrs, buffer),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl CmdAttr {
    /// Parses one top-level attribute.
    pub fn parse(nla: &NlaBuffer<&[u8]>) -> Result<Self, DecodeError> {
        Ok(match nla.kind() {
            cmd_attr::SERVICE => Self::Service(parse_all(nla.value(), SvcAttr::parse)?),
            cmd_attr::DEST => Self::Dest(parse_all(nla.value(), DestAttr::parse)?),
            _ => Self::Other(other(nla)?),
        })
    }
}

/// A service attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SvcAttr {
    /// `AF_INET` (2) or `AF_INET6` (10).
    Af(u16),
    /// `IPPROTO_*`.
    Protocol(u16),
    /// 16 bytes (`union nf_inet_addr`).
    Addr(Vec<u8>),
    /// Host order here, network order on the wire.
    Port(u16),
    /// Firewall mark.
    Fwmark(u32),
    /// Scheduler name.
    SchedName(String),
    /// Flags and the mask of the flags to change.
    Flags {
        /// `IP_VS_SVC_F_*`.
        flags: u32,
        /// Which flags the request sets.
        mask: u32,
    },
    /// Persistence timeout (seconds).
    Timeout(u32),
    /// Persistence netmask (raw; see the module docs).
    Netmask(u32),
    /// Persistence engine.
    PeName(String),
    /// Statistics and anything newer.
    Other(DefaultNla),
}

impl Nla for SvcAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::Af(_) | Self::Protocol(_) | Self::Port(_) => 2,
            Self::Fwmark(_) | Self::Timeout(_) | Self::Netmask(_) => 4,
            Self::Flags { .. } => 8,
            Self::Addr(bytes) => bytes.len(),
            Self::SchedName(name) | Self::PeName(name) => nul_string_len(name),
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Af(_) => svc_attr::AF,
            Self::Protocol(_) => svc_attr::PROTOCOL,
            Self::Addr(_) => svc_attr::ADDR,
            Self::Port(_) => svc_attr::PORT,
            Self::Fwmark(_) => svc_attr::FWMARK,
            Self::SchedName(_) => svc_attr::SCHED_NAME,
            Self::Flags { .. } => svc_attr::FLAGS,
            Self::Timeout(_) => svc_attr::TIMEOUT,
            Self::Netmask(_) => svc_attr::NETMASK,
            Self::PeName(_) => svc_attr::PE_NAME,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Af(v) | Self::Protocol(v) => put_u16(buffer, *v),
            Self::Port(port) => {
                let _ = emit_u16_be(buffer, *port);
            }
            Self::Fwmark(v) | Self::Timeout(v) | Self::Netmask(v) => put_u32(buffer, *v),
            Self::Flags { flags, mask } => {
                put_u32(&mut buffer[..4], *flags);
                put_u32(&mut buffer[4..8], *mask);
            }
            Self::Addr(bytes) => buffer.copy_from_slice(bytes),
            Self::SchedName(name) | Self::PeName(name) => emit_nul_string(name, buffer),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl SvcAttr {
    /// Parses one service attribute.
    pub fn parse(nla: &NlaBuffer<&[u8]>) -> Result<Self, DecodeError> {
        let value = nla.value();
        Ok(match nla.kind() {
            svc_attr::AF => Self::Af(parse_u16(value)?),
            svc_attr::PROTOCOL => Self::Protocol(parse_u16(value)?),
            svc_attr::ADDR => Self::Addr(value.to_vec()),
            svc_attr::PORT => Self::Port(parse_u16_be(value)?),
            svc_attr::FWMARK => Self::Fwmark(parse_u32(value)?),
            svc_attr::SCHED_NAME => Self::SchedName(parse_string(value)?),
            svc_attr::FLAGS => {
                if value.len() != 8 {
                    return Err(DecodeError::invalid_number(8, value.len()));
                }
                Self::Flags {
                    flags: parse_u32(&value[..4])?,
                    mask: parse_u32(&value[4..])?,
                }
            }
            svc_attr::TIMEOUT => Self::Timeout(parse_u32(value)?),
            svc_attr::NETMASK => Self::Netmask(parse_u32(value)?),
            svc_attr::PE_NAME => Self::PeName(parse_string(value)?),
            _ => Self::Other(other(nla)?),
        })
    }
}

/// A destination (real server) attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestAttr {
    /// 16 bytes (`union nf_inet_addr`).
    Addr(Vec<u8>),
    /// Host order here, network order on the wire.
    Port(u16),
    /// `IP_VS_CONN_F_*` forwarding method.
    FwdMethod(u32),
    /// Weight.
    Weight(u32),
    /// Upper threshold.
    UpperThreshold(u32),
    /// Lower threshold.
    LowerThreshold(u32),
    /// Active connections (dumps only).
    ActiveConns(u32),
    /// Inactive connections (dumps only).
    InactiveConns(u32),
    /// Persistence templates (dumps only).
    PersistConns(u32),
    /// Address family of the real server.
    AddrFamily(u16),
    /// Tunnel type.
    TunType(u8),
    /// Tunnel port (host order here, network order on the wire).
    TunPort(u16),
    /// Tunnel flags.
    TunFlags(u16),
    /// `STATS64`'s connection count: connections scheduled to this real server since it was added
    /// (dumps only; the other statistics are not kept).
    Connections(u64),
    /// The other statistics and anything newer.
    Other(DefaultNla),
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::TunType(_) => 1,
            Self::Port(_) | Self::AddrFamily(_) | Self::TunPort(_) | Self::TunFlags(_) => 2,
            Self::Addr(bytes) => bytes.len(),
            Self::Other(nla) => nla.value_len(),
            // One nested `CONNS` attribute: header and u64.
            Self::Connections(_) => 12,
            _ => 4,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Addr(_) => dest_attr::ADDR,
            Self::Port(_) => dest_attr::PORT,
            Self::FwdMethod(_) => dest_attr::FWD_METHOD,
            Self::Weight(_) => dest_attr::WEIGHT,
            Self::UpperThreshold(_) => dest_attr::U_THRESH,
            Self::LowerThreshold(_) => dest_attr::L_THRESH,
            Self::ActiveConns(_) => dest_attr::ACTIVE_CONNS,
            Self::InactiveConns(_) => dest_attr::INACT_CONNS,
            Self::PersistConns(_) => dest_attr::PERSIST_CONNS,
            Self::AddrFamily(_) => dest_attr::ADDR_FAMILY,
            Self::TunType(_) => dest_attr::TUN_TYPE,
            Self::TunPort(_) => dest_attr::TUN_PORT,
            Self::TunFlags(_) => dest_attr::TUN_FLAGS,
            Self::Connections(_) => dest_attr::STATS64 | NLA_F_NESTED,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Addr(bytes) => buffer.copy_from_slice(bytes),
            Self::Port(port) | Self::TunPort(port) => {
                let _ = emit_u16_be(buffer, *port);
            }
            Self::AddrFamily(v) | Self::TunFlags(v) => put_u16(buffer, *v),
            Self::TunType(v) => buffer[0] = *v,
            Self::Connections(conns) => {
                buffer[0..2].copy_from_slice(&12u16.to_ne_bytes());
                buffer[2..4].copy_from_slice(&stats_attr::CONNS.to_ne_bytes());
                buffer[4..12].copy_from_slice(&conns.to_ne_bytes());
            }
            Self::FwdMethod(v)
            | Self::Weight(v)
            | Self::UpperThreshold(v)
            | Self::LowerThreshold(v)
            | Self::ActiveConns(v)
            | Self::InactiveConns(v)
            | Self::PersistConns(v) => put_u32(buffer, *v),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl DestAttr {
    /// Parses one destination attribute.
    pub fn parse(nla: &NlaBuffer<&[u8]>) -> Result<Self, DecodeError> {
        let value = nla.value();
        Ok(match nla.kind() {
            dest_attr::ADDR => Self::Addr(value.to_vec()),
            dest_attr::PORT => Self::Port(parse_u16_be(value)?),
            dest_attr::FWD_METHOD => Self::FwdMethod(parse_u32(value)?),
            dest_attr::WEIGHT => Self::Weight(parse_u32(value)?),
            dest_attr::U_THRESH => Self::UpperThreshold(parse_u32(value)?),
            dest_attr::L_THRESH => Self::LowerThreshold(parse_u32(value)?),
            dest_attr::ACTIVE_CONNS => Self::ActiveConns(parse_u32(value)?),
            dest_attr::INACT_CONNS => Self::InactiveConns(parse_u32(value)?),
            dest_attr::PERSIST_CONNS => Self::PersistConns(parse_u32(value)?),
            dest_attr::ADDR_FAMILY => Self::AddrFamily(parse_u16(value)?),
            dest_attr::TUN_TYPE => Self::TunType(parse_u8(value)?),
            dest_attr::TUN_PORT => Self::TunPort(parse_u16_be(value)?),
            dest_attr::TUN_FLAGS => Self::TunFlags(parse_u16(value)?),
            dest_attr::STATS64 => {
                let mut conns = 0;
                for stat in NlasIterator::new(value) {
                    let stat = stat?;
                    if stat.kind() == stats_attr::CONNS {
                        let bytes = stat
                            .value()
                            .get(0..8)
                            .ok_or_else(|| DecodeError::from("a short STATS64 CONNS"))?;
                        conns = u64::from_ne_bytes(
                            bytes
                                .try_into()
                                .map_err(|_| DecodeError::from("a short STATS64 CONNS"))?,
                        );
                    }
                }
                Self::Connections(conns)
            }
            _ => Self::Other(other(nla)?),
        })
    }
}
