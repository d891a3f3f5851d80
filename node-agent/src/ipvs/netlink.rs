//! The real [`Ipvs`]: one blocking generic-netlink socket, the IPVS family resolved through nlctrl.
//!
//! ```text
//! connect ─► nlctrl GETFAMILY "IPVS" ─► family id ──────────────────────────────┐
//!    └ ENOENT (ip_vs not loaded) ─► modprobe ip_vs ─► again ─► else Unavailable  │
//! request(IpvsMessage, flags) ─► GenlMessage ─► NetlinkMessage{seq} ─► send      ▼
//!                             ◄─ recv ─► decode_datagram: InnerMessage* … ACK (error 0) | DONE | -errno
//! ```
//!
//! Requests run one at a time on the calling thread (the sync path is blocking code already); each
//! waits for its acknowledgement, so an error belongs to exactly one virtual service or real server.

use std::fmt::Debug;
use std::process::Command;

use netlink_packet_core::{
    Emitable, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ALIGNTO, NetlinkMessage, NetlinkPayload,
    ParseableParametrized,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::protocols::NETLINK_GENERIC;
use netlink_sys::{Socket, SocketAddr};

use super::codec::{self, FAMILY_NAME, IpvsMessage, cmd};
use super::kernel::{Destination, Ipvs, RealKey, Service, VirtualKey};
use crate::error::Error;

/// `ENOENT`: what nlctrl answers for a family nobody registered.
const ENOENT: i32 = 2;

/// A failed netlink request: the errno the kernel answered with, or a transport or decode problem.
#[derive(Debug)]
pub struct Failure {
    /// The errno, when the kernel answered with one (or the socket failed with one).
    pub errno: Option<i32>,
    /// What went wrong, in words.
    pub reason: String,
}

impl Failure {
    fn io(e: std::io::Error) -> Self {
        Self {
            errno: e.raw_os_error(),
            reason: e.to_string(),
        }
    }

    fn decode(e: impl std::fmt::Display) -> Self {
        Self {
            errno: None,
            reason: format!("undecodable reply: {e}"),
        }
    }

    fn into_error(self, operation: String) -> Error {
        Error::IpvsRequest {
            operation,
            errno: self.errno,
            reason: self.reason,
        }
    }
}

/// The IPVS family over a generic-netlink socket.
pub struct NetlinkIpvs {
    socket: Socket,
    family_id: u16,
    sequence: u32,
}

impl std::fmt::Debug for NetlinkIpvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkIpvs")
            .field("family_id", &self.family_id)
            .finish_non_exhaustive()
    }
}

impl NetlinkIpvs {
    /// Opens the socket and resolves the IPVS family; [`Error::IpvsUnavailable`] when the kernel has
    /// no IPVS (the module is not loaded).
    pub fn connect() -> Result<Self, Error> {
        let unavailable = |reason: String| Error::IpvsUnavailable(reason);
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(|e| unavailable(e.to_string()))?;
        socket.bind_auto().map_err(|e| unavailable(e.to_string()))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| unavailable(e.to_string()))?;
        let mut ipvs = Self {
            socket,
            family_id: 0,
            sequence: 0,
        };
        let request = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(FAMILY_NAME.to_string())],
        });
        let replies = ipvs.transact(request, NLM_F_REQUEST | NLM_F_ACK).map_err(|f| {
            if f.errno == Some(ENOENT) {
                unavailable("the kernel has no IPVS generic-netlink family (ip_vs is not loaded)".into())
            } else {
                unavailable(format!("resolving the IPVS family: {}", f.reason))
            }
        })?;
        ipvs.family_id = replies
            .iter()
            .flat_map(|reply| &reply.nlas)
            .find_map(|nla| match nla {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| unavailable("nlctrl answered without a family id".into()))?;
        Ok(ipvs)
    }

    /// [`Self::connect`], loading `ip_vs` with modprobe first when the family is missing (kube-proxy
    /// does the same). Fails when the module cannot be loaded either.
    pub fn connect_or_load() -> Result<Self, Error> {
        match Self::connect() {
            Ok(ipvs) => Ok(ipvs),
            Err(first) => {
                let loaded = crate::command::output(Command::new("modprobe").arg("ip_vs"));
                match loaded {
                    Ok(out) if out.status.success() => Self::connect(),
                    Ok(out) => Err(Error::IpvsUnavailable(format!(
                        "{first}; modprobe ip_vs failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ))),
                    Err(e) => Err(Error::IpvsUnavailable(format!("{first}; {e}"))),
                }
            }
        }
    }

    /// The family id the kernel assigned to IPVS.
    pub fn family_id(&self) -> u16 {
        self.family_id
    }

    fn request(
        &mut self,
        message: IpvsMessage,
        operation: impl FnOnce() -> String,
    ) -> Result<Vec<IpvsMessage>, Error> {
        let dump = matches!(message.command, cmd::GET_SERVICE | cmd::GET_DEST);
        let flags = if dump {
            NLM_F_REQUEST | NLM_F_DUMP
        } else {
            NLM_F_REQUEST | NLM_F_ACK
        };
        let mut genl = GenlMessage::from_payload(message);
        genl.set_resolved_family_id(self.family_id);
        self.transact(genl, flags).map_err(|f| f.into_error(operation()))
    }

    /// Sends one request and collects its replies until the acknowledgement (or the end of a dump).
    fn transact<F>(&mut self, mut message: GenlMessage<F>, flags: u16) -> Result<Vec<F>, Failure>
    where
        F: GenlFamily + Emitable + ParseableParametrized<[u8], GenlHeader> + Debug,
    {
        message.finalize();
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let mut packet = NetlinkMessage::from(message);
        packet.header.flags = flags;
        packet.header.sequence_number = sequence;
        packet.finalize();
        let mut buffer = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buffer);
        self.socket.send(&buffer, 0).map_err(Failure::io)?;
        let mut replies = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full().map_err(Failure::io)?;
            if decode_datagram(&data, sequence, &mut replies)? == Received::Finished {
                return Ok(replies);
            }
        }
    }
}

/// Whether a request's replies are complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// More datagrams follow (a dump in progress).
    More,
    /// The acknowledgement or the end of the dump arrived.
    Finished,
}

/// Decodes one received datagram: the messages answering request `sequence` are appended to `replies`
/// (others are skipped); an error message ends the request with its errno, an undecodable message
/// with a decode failure. What the kernel sends is trusted no more than a file: this never panics.
pub fn decode_datagram<F>(data: &[u8], sequence: u32, replies: &mut Vec<F>) -> Result<Received, Failure>
where
    F: GenlFamily + Emitable + ParseableParametrized<[u8], GenlHeader> + Debug,
{
    let mut offset = 0;
    while let Some(rest) = data.get(offset..).filter(|rest| !rest.is_empty()) {
        let reply = NetlinkMessage::<GenlMessage<F>>::deserialize(rest).map_err(Failure::decode)?;
        let length = reply.header.length as usize;
        if length == 0 {
            return Err(Failure::decode("a zero-length message"));
        }
        offset = offset.saturating_add(length.next_multiple_of(usize::from(NLMSG_ALIGNTO)));
        if reply.header.sequence_number != sequence {
            continue;
        }
        match reply.payload {
            NetlinkPayload::InnerMessage(genl) => replies.push(genl.payload),
            NetlinkPayload::Done(_) => return Ok(Received::Finished),
            NetlinkPayload::Error(error) => {
                return match error.code {
                    None => Ok(Received::Finished),
                    Some(code) => {
                        let errno = code.get().saturating_neg();
                        Err(Failure {
                            errno: Some(errno),
                            reason: std::io::Error::from_raw_os_error(errno).to_string(),
                        })
                    }
                };
            }
            _ => {}
        }
    }
    Ok(Received::More)
}

impl Ipvs for NetlinkIpvs {
    fn services(&mut self) -> Result<Vec<Service>, Error> {
        let replies = self.request(codec::list_services_request(), || "list services".into())?;
        replies
            .iter()
            .map(|reply| {
                codec::service_of(reply).map_err(|e| Error::IpvsRequest {
                    operation: "list services".into(),
                    errno: None,
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    fn add_service(&mut self, service: &Service) -> Result<(), Error> {
        self.request(codec::service_request(cmd::NEW_SERVICE, service), || {
            format!("add service {}", describe(service))
        })
        .map(drop)
    }

    fn update_service(&mut self, service: &Service) -> Result<(), Error> {
        self.request(codec::service_request(cmd::SET_SERVICE, service), || {
            format!("update service {}", describe(service))
        })
        .map(drop)
    }

    fn delete_service(&mut self, key: &VirtualKey) -> Result<(), Error> {
        self.request(codec::delete_service_request(key), || {
            format!("delete service {key}")
        })
        .map(drop)
    }

    fn destinations(&mut self, key: &VirtualKey) -> Result<Vec<Destination>, Error> {
        let operation = || format!("list real servers of {key}");
        let replies = self.request(codec::list_destinations_request(key), operation)?;
        replies
            .iter()
            .map(|reply| {
                codec::destination_of(reply, key.family()).map_err(|e| Error::IpvsRequest {
                    operation: operation(),
                    errno: None,
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    fn add_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        self.request(codec::dest_request(cmd::NEW_DEST, key, dest), || {
            format!("add real server {} to {key}", dest.real)
        })
        .map(drop)
    }

    fn update_destination(&mut self, key: &VirtualKey, dest: &Destination) -> Result<(), Error> {
        self.request(codec::dest_request(cmd::SET_DEST, key, dest), || {
            format!("update real server {} of {key}", dest.real)
        })
        .map(drop)
    }

    fn delete_destination(&mut self, key: &VirtualKey, real: &RealKey) -> Result<(), Error> {
        self.request(codec::delete_dest_request(key, real), || {
            format!("delete real server {real} of {key}")
        })
        .map(drop)
    }
}

fn describe(service: &Service) -> String {
    match service.key() {
        Some(key) => key.to_string(),
        None => format!("{:?}", service.target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One datagram: `messages` (type, sequence, genl payload) back to back, each padded to 4 bytes.
    fn datagram(messages: &[(u16, u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, sequence, payload) in messages {
            let length = 16 + payload.len() as u32;
            out.extend_from_slice(&length.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&2u16.to_le_bytes());
            out.extend_from_slice(&sequence.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(payload);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out
    }

    #[test]
    fn datagrams_decode_to_replies_the_end_of_a_dump_or_the_errno() {
        // GET_SERVICE reply: genlmsghdr, then SERVICE { AF 2, FWMARK 7 }.
        let service: &[u8] = &[
            1, 1, 0, 0, 20, 0, 1, 0, 6, 0, 1, 0, 2, 0, 0, 0, 8, 0, 5, 0, 7, 0, 0, 0,
        ];
        let done: &[u8] = &[0, 0, 0, 0];
        let enoent: &[u8] = &(-2i32).to_le_bytes();
        let mut replies: Vec<IpvsMessage> = Vec::new();
        let data = datagram(&[(0x1c, 9, service), (0x1c, 8, service), (0x1c, 9, service)]);
        assert_eq!(decode_datagram(&data, 9, &mut replies).unwrap(), Received::More);
        assert_eq!(replies.len(), 2, "the message of another request is skipped");
        assert_eq!(
            codec::service_of(&replies[0]).unwrap().target,
            crate::ipvs::kernel::Target::Fwmark(7)
        );
        let data = datagram(&[(3, 9, done)]);
        assert_eq!(
            decode_datagram(&data, 9, &mut replies).unwrap(),
            Received::Finished
        );
        let failure = decode_datagram(&datagram(&[(2, 9, enoent)]), 9, &mut replies).unwrap_err();
        assert_eq!(failure.errno, Some(2));
        // Cut short, or a length field past the end: a decode failure, not a panic.
        let mut data = datagram(&[(0x1c, 9, service)]);
        data.truncate(20);
        assert_eq!(decode_datagram(&data, 9, &mut replies).unwrap_err().errno, None);
        let mut data = datagram(&[(0x1c, 9, service), (0x1c, 9, service)]);
        data[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_datagram(&data, 9, &mut replies).is_err());
    }

    #[test]
    fn a_kernel_without_ipvs_is_reported_as_unavailable() {
        // This machine's kernel has no ip_vs (and tests do not modprobe): connect must fail cleanly
        // with Unavailable. Where IPVS exists (the VM suite) it must resolve a family id instead.
        match NetlinkIpvs::connect() {
            Ok(ipvs) => assert_ne!(ipvs.family_id(), 0),
            Err(e) => assert_eq!(e.metric_label(), "ipvs_unavailable", "{e}"),
        }
    }
}
