//! Codec tests: requests against bytes laid out from the kernel's uapi `ip_vs.h` (and, in
//! `golden.rs`, against bytes captured from ipvsadm and from the kernel's dump replies in the VM).

use netlink_packet_core::{Emitable, ParseableParametrized};
use netlink_packet_generic::{GenlFamily, GenlHeader};
use switchyard_api::{IpFamily, Protocol};

use super::attrs::{CmdAttr, DestAttr, SvcAttr};
use super::*;
use crate::ipvs::kernel::{Destination, RealKey, Service, VirtualKey};

pub(super) fn hex(text: &str) -> Vec<u8> {
    let digits: String = text.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

pub(super) fn bytes_of(message: &IpvsMessage) -> Vec<u8> {
    let mut buffer = vec![0u8; message.buffer_len()];
    message.emit(&mut buffer);
    buffer
}

pub(super) fn parse(command: u8, bytes: &[u8]) -> IpvsMessage {
    IpvsMessage::parse_with_param(
        bytes,
        GenlHeader {
            cmd: command,
            version: VERSION,
        },
    )
    .unwrap()
}

fn key(addr: &str, protocol: Protocol, port: u16) -> VirtualKey {
    VirtualKey {
        addr: addr.parse().unwrap(),
        protocol,
        port,
    }
}

#[test]
fn an_ipv4_tcp_service_is_laid_out_as_uapi_ip_vs_h_says() {
    let service = Service::new(key("10.96.0.10", Protocol::TCP, 80), "rr", None);
    let message = service_request(cmd::NEW_SERVICE, &service);
    // IPVS_CMD_ATTR_SERVICE (84 bytes) {AF 2, PROTOCOL 6, ADDR 10.96.0.10 + 12 zero bytes, PORT be16 80,
    // SCHED_NAME "rr\0", FLAGS {0, mask ~0}, TIMEOUT 0, NETMASK 0xffffffff}
    let want = hex("5400 0180
         0600 0100 0200 0000
         0600 0200 0600 0000
         1400 0300 0a60000a 00000000 00000000 00000000
         0600 0400 0050 0000
         0700 0600 727200 00
         0c00 0700 00000000 ffffffff
         0800 0800 00000000
         0800 0900 ffffffff");
    assert_eq!(bytes_of(&message), want);
    assert_eq!(message.command(), cmd::NEW_SERVICE);
    assert_eq!(message.version(), 1);
    assert_eq!(IpvsMessage::family_name(), "IPVS");
}

#[test]
fn ipv6_sctp_services_carry_af_inet6_and_a_prefix_length_netmask() {
    let service = Service::new(key("fd00:10:96::1", Protocol::SCTP, 3868), "sh", Some(600));
    let message = service_request(cmd::NEW_SERVICE, &service);
    let CmdAttr::Service(attrs) = &message.attrs[0] else {
        panic!("{message:?}");
    };
    assert_eq!(attrs[0], SvcAttr::Af(AF_INET6));
    assert_eq!(attrs[1], SvcAttr::Protocol(132));
    assert_eq!(
        attrs[2],
        SvcAttr::Addr(hex("fd000010 00960000 00000000 00000001"))
    );
    assert_eq!(attrs[3], SvcAttr::Port(3868));
    assert_eq!(
        attrs[5],
        SvcAttr::Flags {
            flags: 1,
            mask: u32::MAX
        }
    );
    assert_eq!(attrs[6], SvcAttr::Timeout(600));
    assert_eq!(attrs[7], SvcAttr::Netmask(128));
    // Port 3868 = 0x0f1c in network order on the wire.
    let bytes = bytes_of(&message);
    assert!(bytes.windows(8).any(|w| w == hex("0600 0400 0f1c 0000")));
    // And back.
    let back = service_of(&parse(cmd::NEW_SERVICE, &bytes)).unwrap();
    assert_eq!(back, service);
}

#[test]
fn destination_requests_round_trip() {
    let vs = key("10.96.0.10", Protocol::UDP, 53);
    let dest = Destination::new(
        RealKey {
            addr: "10.244.1.5".parse().unwrap(),
            port: 5353,
        },
        1,
    );
    let message = dest_request(cmd::NEW_DEST, &vs, &dest);
    let want = bytes_of(&message);
    let back = destination_of(&parse(cmd::NEW_DEST, &want), IpFamily::IPv4).unwrap();
    assert_eq!(back, dest);

    let delete = delete_dest_request(&vs, &dest.real);
    let CmdAttr::Dest(attrs) = &delete.attrs[1] else {
        panic!("{delete:?}");
    };
    assert_eq!(attrs.len(), 2);
    assert_eq!(delete_service_request(&vs).attrs.len(), 1);
    assert!(list_services_request().attrs.is_empty());
    assert_eq!(list_destinations_request(&vs).command, cmd::GET_DEST);
}

#[test]
fn replies_drop_the_kernels_hashed_flag_and_ignore_statistics() {
    // A GET_SERVICE reply as the kernel builds it: flags carry IP_VS_SVC_F_HASHED (0x2), and nested
    // statistics follow (kept as opaque attributes).
    let mut attrs = match service_request(
        cmd::NEW_SERVICE,
        &Service::new(key("10.96.0.1", Protocol::TCP, 443), "wrr", Some(10800)),
    )
    .attrs
    .remove(0)
    {
        CmdAttr::Service(attrs) => attrs,
        other => panic!("{other:?}"),
    };
    attrs[5] = SvcAttr::Flags {
        flags: 0x3,
        mask: u32::MAX,
    };
    attrs.push(SvcAttr::Other(netlink_packet_core::DefaultNla::new(
        10,
        hex("0800 0100 07000000"),
    )));
    let reply = IpvsMessage {
        command: cmd::NEW_SERVICE,
        attrs: vec![CmdAttr::Service(attrs)],
    };
    let service = service_of(&parse(cmd::NEW_SERVICE, &bytes_of(&reply))).unwrap();
    assert_eq!(service.flags, 1);
    assert_eq!(service.persistence(), Some(10800));
    assert_eq!(service.scheduler, "wrr");
    assert_eq!(service.key(), Some(key("10.96.0.1", Protocol::TCP, 443)));
}

#[test]
fn fwmark_services_decode_without_a_key() {
    let reply = IpvsMessage {
        command: cmd::NEW_SERVICE,
        attrs: vec![CmdAttr::Service(vec![
            SvcAttr::Af(AF_INET),
            SvcAttr::Fwmark(7),
            SvcAttr::SchedName("rr".into()),
        ])],
    };
    let service = service_of(&parse(cmd::NEW_SERVICE, &bytes_of(&reply))).unwrap();
    assert_eq!(service.target, Target::Fwmark(7));
    assert_eq!(service.key(), None);
}

#[test]
fn malformed_replies_are_errors_not_panics() {
    for bytes in [
        hex("0800 0100"),
        hex("0800 0100 0400 0100"),
        hex("ffff 0100 00000000"),
    ] {
        let _ = IpvsMessage::parse_with_param(
            bytes.as_slice(),
            GenlHeader {
                cmd: cmd::NEW_SERVICE,
                version: VERSION,
            },
        );
    }
    let no_af = IpvsMessage {
        command: cmd::NEW_SERVICE,
        attrs: vec![CmdAttr::Service(vec![SvcAttr::Protocol(6)])],
    };
    assert!(service_of(&no_af).is_err());
    let no_dest = IpvsMessage {
        command: cmd::NEW_DEST,
        attrs: vec![CmdAttr::Dest(vec![DestAttr::Weight(1)])],
    };
    assert!(destination_of(&no_dest, IpFamily::IPv4).is_err());
    assert!(destination_of(&no_af, IpFamily::IPv4).is_err());
}

// === Against bytes captured from ipvsadm and the kernel (golden.rs) ===

/// A captured generic-netlink payload split into its genlmsghdr (command, version) and attributes.
fn captured(text: &str) -> (u8, u8, Vec<u8>) {
    let bytes = hex(text);
    (bytes[0], bytes[1], bytes[4..].to_vec())
}

fn assert_sends_what_ipvsadm_sends(capture: &str, message: &IpvsMessage) {
    let (command, version, attrs) = captured(capture);
    assert_eq!((message.command(), message.version()), (command, version));
    assert_eq!(bytes_of(message), attrs);
}

#[test]
fn service_requests_are_byte_for_byte_what_ipvsadm_sends() {
    use super::golden::*;
    let cases = [
        (
            ADD_TCP4_RR,
            cmd::NEW_SERVICE,
            key("10.96.0.10", Protocol::TCP, 80),
            "rr",
            None,
        ),
        (
            ADD_UDP6_SH_PERSISTENT,
            cmd::NEW_SERVICE,
            key("fd00::1", Protocol::UDP, 53),
            "sh",
            Some(600),
        ),
        (
            ADD_SCTP4_WRR,
            cmd::NEW_SERVICE,
            key("10.96.0.11", Protocol::SCTP, 3868),
            "wrr",
            None,
        ),
        (
            EDIT_TCP4_WRR_PERSISTENT,
            cmd::SET_SERVICE,
            key("10.96.0.10", Protocol::TCP, 80),
            "wrr",
            Some(10800),
        ),
    ];
    for (capture, command, vs, scheduler, persistence) in cases {
        let message = service_request(command, &Service::new(vs, scheduler, persistence));
        assert_sends_what_ipvsadm_sends(capture, &message);
    }
    assert_sends_what_ipvsadm_sends(
        GET_DEST_TCP4,
        &list_destinations_request(&key("10.96.0.10", Protocol::TCP, 80)),
    );
}

#[test]
fn destination_attributes_are_byte_for_byte_what_ipvsadm_sends() {
    use super::golden::*;
    // ipvsadm also repeats the whole service (scheduler, flags, ...) in destination requests, which the
    // kernel ignores; we send only its identity. The destination attribute itself must be identical.
    let cases = [
        (
            ADD_DEST4,
            key("10.96.0.10", Protocol::TCP, 80),
            "10.244.1.5",
            8080,
            1,
        ),
        (
            ADD_DEST6,
            key("fd00::1", Protocol::UDP, 53),
            "fd00:10:244::5",
            5353,
            0,
        ),
    ];
    for (capture, vs, ip, port, weight) in cases {
        let (command, _, attrs) = captured(capture);
        assert_eq!(command, cmd::NEW_DEST);
        let dest = Destination::new(
            RealKey {
                addr: ip.parse().unwrap(),
                port,
            },
            weight,
        );
        let message = dest_request(cmd::NEW_DEST, &vs, &dest);
        let ours = bytes_of(&IpvsMessage {
            command: cmd::NEW_DEST,
            attrs: vec![message.attrs[1].clone()],
        });
        assert!(
            attrs.ends_with(&ours),
            "{ours:02x?}\nnot at the end of\n{attrs:02x?}"
        );
        // And the kernel would read ipvsadm's request as ours.
        let theirs = parse(cmd::NEW_DEST, &attrs);
        assert_eq!(destination_of(&theirs, vs.family()).unwrap(), dest);
    }
}

#[test]
fn the_kernels_dump_replies_decode() {
    use super::golden::*;
    let reply = |text: &str| {
        let (command, version, attrs) = captured(text);
        assert_eq!(version, VERSION);
        parse(command, &attrs)
    };
    let services = [
        (
            REPLY_SERVICE_SCTP4,
            Service::new(key("10.96.0.11", Protocol::SCTP, 3868), "wrr", None),
        ),
        (
            REPLY_SERVICE_UDP6,
            Service::new(key("fd00::1", Protocol::UDP, 53), "sh", Some(600)),
        ),
        (
            REPLY_SERVICE_TCP4,
            Service::new(key("10.96.0.10", Protocol::TCP, 80), "wrr", Some(10800)),
        ),
    ];
    for (capture, want) in services {
        let message = reply(capture);
        assert_eq!(message.command, cmd::NEW_SERVICE);
        assert_eq!(service_of(&message).unwrap(), want);
    }
    let dest4 = destination_of(&reply(REPLY_DEST4), IpFamily::IPv4).unwrap();
    assert_eq!(
        dest4,
        Destination::new(
            RealKey {
                addr: "10.244.1.5".parse().unwrap(),
                port: 8080
            },
            1
        )
    );
    let dest6 = destination_of(&reply(REPLY_DEST6), IpFamily::IPv6).unwrap();
    assert_eq!(dest6.real.to_string(), "[fd00:10:244::5]:5353");
    assert_eq!(
        (dest6.weight, dest6.forward),
        (0, crate::ipvs::kernel::FWD_MASQUERADE)
    );
}

#[test]
fn a_destination_reply_carries_its_connection_count_from_the_64_bit_statistics() {
    // GET_DEST reply attributes as the kernel dumps them: STATS64 nests CONNS (u64) among others.
    let vs = key("10.96.0.10", Protocol::TCP, 80);
    let dest = Destination::new(
        RealKey {
            addr: "10.244.1.5".parse().unwrap(),
            port: 8080,
        },
        1,
    );
    let mut message = dest_request(cmd::NEW_DEST, &vs, &dest);
    for attr in &mut message.attrs {
        if let CmdAttr::Dest(attrs) = attr {
            attrs.push(DestAttr::Connections(42));
        }
    }
    let back = destination_of(&parse(cmd::NEW_DEST, &bytes_of(&message)), IpFamily::IPv4).unwrap();
    assert_eq!(back.connections, 42);
    assert_eq!(back.real, dest.real);
}
