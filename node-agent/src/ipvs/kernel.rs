//! The IPVS kernel edge: the [`Ipvs`] trait and the kernel's vocabulary (virtual services, real
//! servers), implemented by [`super::netlink::NetlinkIpvs`] (generic netlink) and
//! `fake::FakeIpvs` (an in-memory kernel).
//!
//! ```text
//! IpvsDataplane ─► services()            ◄─ IPVS_CMD_GET_SERVICE dump (every virtual service, ours or not)
//!               ├► add/update/delete_service ─► IPVS_CMD_{NEW,SET,DEL}_SERVICE
//!               ├► destinations(vs)       ◄─ IPVS_CMD_GET_DEST dump (with connection counters)
//!               └► add/update/delete_destination ─► IPVS_CMD_{NEW,SET,DEL}_DEST
//! ```
//!
//! Virtual services are identified by (protocol, address, port): Switchyard never creates fwmark
//! services, but it lists them (another tool may own some) and leaves them alone.

use std::net::IpAddr;

use switchyard_api::{IpFamily, Protocol};

use crate::error::Error;

/// `IP_VS_SVC_F_PERSISTENT`: the service is persistent (ClientIP affinity).
pub const SVC_F_PERSISTENT: u32 = 0x0001;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every service it holds; never ours to set.
pub const SVC_F_HASHED: u32 = 0x0002;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding (kube-proxy's and ours).
pub const FWD_MASQUERADE: u32 = 0;
/// `IP_VS_CONN_F_FWD_MASK`.
pub const FWD_MASK: u32 = 0x0007;

/// `IPPROTO_*` of a transport protocol.
pub fn ip_proto(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::TCP => 6,
        Protocol::UDP => 17,
        Protocol::SCTP => 132,
    }
}

/// The protocol of an `IPPROTO_*` number, when it is one a Service can use.
pub fn protocol_of(number: u16) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::TCP),
        17 => Some(Protocol::UDP),
        132 => Some(Protocol::SCTP),
        _ => None,
    }
}

/// A virtual service as Switchyard names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VirtualKey {
    /// The service address (ClusterIP, external IP, LB IP or node IP).
    pub addr: IpAddr,
    /// Transport protocol.
    pub protocol: Protocol,
    /// The service port (or NodePort).
    pub port: u16,
}

impl VirtualKey {
    /// Its IP family.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }
}

impl std::fmt::Display for VirtualKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(ip) => write!(f, "{} {ip}:{}", self.protocol.lower(), self.port),
            IpAddr::V6(ip) => write!(f, "{} [{ip}]:{}", self.protocol.lower(), self.port),
        }
    }
}

/// A real server of a virtual service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealKey {
    /// Endpoint address.
    pub addr: IpAddr,
    /// Endpoint port.
    pub port: u16,
}

impl std::fmt::Display for RealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// How a virtual service is addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Protocol (an `IPPROTO_*` number), address and port.
    Addr {
        /// `IPPROTO_*`.
        protocol: u16,
        /// Address.
        addr: IpAddr,
        /// Port.
        port: u16,
    },
    /// A firewall mark (never created by Switchyard).
    Fwmark(u32),
}

/// One IPVS virtual service as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Address family.
    pub family: IpFamily,
    /// Protocol/address/port or firewall mark.
    pub target: Target,
    /// Scheduler name (`rr`, `wrr`, ...).
    pub scheduler: String,
    /// `IP_VS_SVC_F_*` flags, without the kernel's own `HASHED` bit.
    pub flags: u32,
    /// Persistence timeout in seconds (0 when not persistent).
    pub timeout: u32,
    /// Persistence netmask: a mask for IPv4 (`0xffffffff`), a prefix length for IPv6 (128).
    pub netmask: u32,
}

impl Service {
    /// The service Switchyard programs for `key`: masquerade-style, no persistence granularity
    /// beyond the single client address (as ipvsadm's and kube-proxy's defaults).
    pub fn new(key: VirtualKey, scheduler: &str, persistence_seconds: Option<u32>) -> Self {
        let family = key.family();
        Self {
            family,
            target: Target::Addr {
                protocol: ip_proto(key.protocol),
                addr: key.addr,
                port: key.port,
            },
            scheduler: scheduler.to_string(),
            flags: if persistence_seconds.is_some() {
                SVC_F_PERSISTENT
            } else {
                0
            },
            timeout: persistence_seconds.unwrap_or(0),
            netmask: match family {
                IpFamily::IPv4 => 0xffff_ffff,
                IpFamily::IPv6 => 128,
            },
        }
    }

    /// The key, for protocol/address/port services of a Service protocol.
    pub fn key(&self) -> Option<VirtualKey> {
        match self.target {
            Target::Addr { protocol, addr, port } => Some(VirtualKey {
                addr,
                protocol: protocol_of(protocol)?,
                port,
            }),
            Target::Fwmark(_) => None,
        }
    }

    /// Persistence timeout, when the service is persistent.
    pub fn persistence(&self) -> Option<u32> {
        (self.flags & SVC_F_PERSISTENT != 0).then_some(self.timeout)
    }
}

/// One real server as the kernel holds it, with its connection counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    /// Address and port.
    pub real: RealKey,
    /// Forwarding method (`IP_VS_CONN_F_*`, masked with [`FWD_MASK`]).
    pub forward: u32,
    /// Scheduling weight; 0 keeps existing connections but takes no new ones.
    pub weight: u32,
    /// Upper connection threshold (0: none).
    pub upper_threshold: u32,
    /// Lower connection threshold (0: none).
    pub lower_threshold: u32,
    /// Connections in ESTABLISHED (TCP) state.
    pub active_conns: u32,
    /// Other connection entries (TIME_WAIT, FIN_WAIT, UDP, ...).
    pub inactive_conns: u32,
    /// Persistence templates.
    pub persistent_conns: u32,
    /// Connections scheduled to it since it was added (the traffic counters' endpoint count).
    pub connections: u64,
}

impl Destination {
    /// A masquerading real server with `weight` and no thresholds or counters.
    pub fn new(real: RealKey, weight: u32) -> Self {
        Self {
            real,
            forward: FWD_MASQUERADE,
            weight,
            upper_threshold: 0,
            lower_threshold: 0,
            active_conns: 0,
            inactive_conns: 0,
            persistent_conns: 0,
            connections: 0,
        }
    }
}

/// The IPVS operations the agent needs. Every call is one netlink request (or dump); errors name the
/// operation and the kernel's errno.
pub trait Ipvs: Send {
    /// Every virtual service.
    fn services(&mut self) -> Result<Vec<Service>, Error>;
    /// Adds a virtual service.
    fn add_service(&mut self, service: &Service) -> Result<(), Error>;
    /// Changes the scheduler or persistence of an existing virtual service.
    fn update_service(&mut self, service: &Service) -> Result<(), Error>;
    /// Deletes a virtual service and its real servers.
    fn delete_service(&mut self, key: &VirtualKey) -> Result<(), Error>;
    /// The real servers of a virtual service.
    fn destinations(&mut self, key: &VirtualKey) -> Result<Vec<Destination>, Error>;
    /// Adds a real server.
    fn add_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error>;
    /// Changes a real server's weight, forwarding method or thresholds.
    fn update_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error>;
    /// Deletes a real server.
    fn delete_destination(&mut self, key: &VirtualKey, real: &RealKey) -> Result<(), Error>;
}

/// The [`Ipvs`] of a kernel without IPVS: it holds no virtual service, and nothing can be added. Cleanup
/// uses it where the IPVS family does not resolve (nothing of ours can exist there).
#[derive(Debug, Clone, Copy, Default)]
pub struct Absent;

impl Absent {
    fn refuse<T>(what: String) -> Result<T, Error> {
        Err(Error::IpvsUnavailable(format!(
            "cannot {what}: the kernel has no IPVS"
        )))
    }
}

impl Ipvs for Absent {
    fn services(&mut self) -> Result<Vec<Service>, Error> {
        Ok(Vec::new())
    }
    fn add_service(&mut self, service: &Service) -> Result<(), Error> {
        Self::refuse(format!("add service {:?}", service.target))
    }
    fn update_service(&mut self, service: &Service) -> Result<(), Error> {
        Self::refuse(format!("update service {:?}", service.target))
    }
    fn delete_service(&mut self, key: &VirtualKey) -> Result<(), Error> {
        Self::refuse(format!("delete service {key}"))
    }
    fn destinations(&mut self, _key: &VirtualKey) -> Result<Vec<Destination>, Error> {
        Ok(Vec::new())
    }
    fn add_destination(&mut self, key: &VirtualKey, _dest: &Destination) -> Result<(), Error> {
        Self::refuse(format!("add a real server to {key}"))
    }
    fn update_destination(&mut self, key: &VirtualKey, _dest: &Destination) -> Result<(), Error> {
        Self::refuse(format!("update a real server of {key}"))
    }
    fn delete_destination(&mut self, key: &VirtualKey, _real: &RealKey) -> Result<(), Error> {
        Self::refuse(format!("delete a real server of {key}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_carry_family_specific_netmasks_and_persistence() {
        let key = VirtualKey {
            addr: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::TCP,
            port: 80,
        };
        let service = Service::new(key, "rr", None);
        assert_eq!(
            (service.netmask, service.flags, service.timeout),
            (0xffff_ffff, 0, 0)
        );
        assert_eq!(service.key(), Some(key));
        assert_eq!(service.persistence(), None);
        let v6 = VirtualKey {
            addr: "fd00::10".parse().unwrap(),
            protocol: Protocol::SCTP,
            port: 9,
        };
        let service = Service::new(v6, "sh", Some(10800));
        assert_eq!(service.netmask, 128);
        assert_eq!(service.persistence(), Some(10800));
        assert_eq!(v6.to_string(), "sctp [fd00::10]:9");
        assert_eq!(protocol_of(ip_proto(Protocol::SCTP)), Some(Protocol::SCTP));
        assert_eq!(protocol_of(1), None);
    }
}
