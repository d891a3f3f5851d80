//! The real [`Conntrack`]: the `conntrack` command of conntrack-tools.
//!
//! ```text
//! list(protocol, family)  ─► conntrack -L -p tcp|udp|sctp -f ipv4|ipv6 ─► parse_line() per line ─► [Flow]
//! list_open(…)            ─► the same, without the lines whose state says the connection ended
//!                            (has_ended: TIME_WAIT, CLOSE, SCTP's CLOSED)
//! delete_matching(flows)  ─► conntrack -D -p tcp|udp|sctp -f … [--orig-dst] --orig-port-dst
//!                            --reply-src [--reply-port-src]   (every entry of one endpoint, one exec)
//! ```
//!
//! Why the CLI rather than ctnetlink: no maintained Rust crate speaks the conntrack netlink family
//! (rtnetlink covers links, addresses and routes only), and hand-writing its codec (nested tuple
//! attributes, per-protocol layouts) is a lot of unsafe-adjacent parsing for an operation that runs only
//! after an endpoint change. conntrack-tools is on every node kube-proxy ever ran on (its images ship
//! it). An endpoint may have many flows: one `conntrack -D` with filters deletes them all in one exec
//! (the tool dumps the table once and deletes each match over ctnetlink; 100,000 flows in ~0.8 s here,
//! see docs/benchmarks.md), and its per-entry listing on stdout goes to /dev/null. A filter names the
//! original destination and port and the reply's source and port, which is all a stale UDP flow is
//! judged by, so it deletes no flow that is not stale.

use std::net::IpAddr;
use std::process::{Command, Stdio};

use switchyard_api::{IpFamily, Protocol};

use super::{Conntrack, EndpointFlows, Flow, Tuple};
use crate::command;
use crate::error::Error;

/// `conntrack` from `$PATH` (or another binary, for tests).
#[derive(Debug, Clone)]
pub struct CliConntrack {
    binary: String,
}

impl Default for CliConntrack {
    fn default() -> Self {
        Self {
            binary: "conntrack".into(),
        }
    }
}

impl CliConntrack {
    /// Uses `binary` instead of `conntrack`.
    pub fn with_binary(binary: impl Into<String>) -> Self {
        Self {
            binary: binary.into(),
        }
    }
}

fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::TCP => "tcp",
        Protocol::UDP => "udp",
        Protocol::SCTP => "sctp",
    }
}

fn family_flag(family: IpFamily) -> &'static str {
    match family {
        IpFamily::IPv4 => "ipv4",
        IpFamily::IPv6 => "ipv6",
    }
}

/// Parses one line of `conntrack -L` (plain or `-o extended`) output; `None` for lines that are not
/// TCP, UDP or SCTP flows (headers, summaries, ICMP).
pub fn parse_line(line: &str) -> Result<Option<Flow>, Error> {
    let mut words = line.split_whitespace();
    let protocol = match words.next() {
        Some("ipv4" | "ipv6") => {
            words.next();
            words.next()
        }
        other => other,
    };
    if !matches!(protocol, Some("udp" | "tcp" | "sctp")) {
        return Ok(None);
    }
    let bad = |reason: &str| Error::ParseConntrack {
        line: line.to_string(),
        reason: reason.to_string(),
    };
    let mut addrs: Vec<IpAddr> = Vec::with_capacity(4);
    let mut ports: Vec<u16> = Vec::with_capacity(4);
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        match key {
            "src" | "dst" => addrs.push(value.parse().map_err(|_| bad("bad address"))?),
            "sport" | "dport" => ports.push(value.parse().map_err(|_| bad("bad port"))?),
            _ => {}
        }
    }
    match (addrs.as_slice(), ports.as_slice()) {
        ([a, b, c, d, ..], [p, q, r, s, ..]) => Ok(Some(Flow {
            original: Tuple {
                src: *a,
                dst: *b,
                sport: *p,
                dport: *q,
            },
            reply: Tuple {
                src: *c,
                dst: *d,
                sport: *r,
                dport: *s,
            },
        })),
        _ => Err(bad("want src, dst, sport and dport for both directions")),
    }
}

/// Whether a `conntrack -L` line is an entry kept after its connection ended: TCP's TIME_WAIT (two
/// minutes by default) and CLOSE (after a reset), SCTP's CLOSED. The state is the word before the
/// first address; UDP has none.
pub fn has_ended(line: &str) -> bool {
    line.split_whitespace()
        .take_while(|word| !word.contains('='))
        .any(|word| matches!(word, "TIME_WAIT" | "CLOSE" | "CLOSED"))
}

/// The `conntrack -D` arguments selecting every entry of `flows`.
pub fn delete_matching_args(flows: &EndpointFlows) -> Vec<String> {
    let protocol = protocol_name(flows.protocol);
    let mut args: Vec<String> = ["-D", "-p", protocol, "-f", family_flag(flows.family)]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(frontend) = flows.frontend {
        args.extend(["--orig-dst".into(), frontend.to_string()]);
    }
    args.extend([
        "--orig-port-dst".into(),
        flows.port.to_string(),
        "--reply-src".into(),
        flows.endpoint.to_string(),
    ]);
    if let Some(port) = flows.endpoint_port {
        args.extend(["--reply-port-src".into(), port.to_string()]);
    }
    args
}

/// How many entries `conntrack -D` says it deleted (`… 3 flow entries have been deleted.`).
pub fn deleted_count(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|line| {
        let (before, _) = line.split_once(" flow entries have been deleted")?;
        before.rsplit(' ').next()?.parse().ok()
    })
}

impl CliConntrack {
    /// The entries `conntrack -L` lists for `protocol` and `family`, those whose lines `keep` accepts.
    fn list_lines(
        &self,
        protocol: Protocol,
        family: IpFamily,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<Flow>, Error> {
        let stdout = command::stdout_of(Command::new(&self.binary).args([
            "-L",
            "-p",
            protocol_name(protocol),
            "-f",
            family_flag(family),
        ]))?;
        let mut flows = Vec::new();
        for line in stdout.lines().filter(|line| keep(line)) {
            if let Some(flow) = parse_line(line)? {
                flows.push(flow);
            }
        }
        Ok(flows)
    }
}

impl Conntrack for CliConntrack {
    fn list(&mut self, protocol: Protocol, family: IpFamily) -> Result<Vec<Flow>, Error> {
        self.list_lines(protocol, family, |_| true)
    }

    fn list_open(&mut self, protocol: Protocol, family: IpFamily) -> Result<Vec<Flow>, Error> {
        self.list_lines(protocol, family, |line| !has_ended(line))
    }

    fn delete_matching(&mut self, flows: &EndpointFlows) -> Result<u64, Error> {
        let mut delete = Command::new(&self.binary);
        delete.args(delete_matching_args(flows)).stdout(Stdio::null());
        let out = command::output(&mut delete)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        match deleted_count(&stderr) {
            // Exit 1 with "0 flow entries have been deleted": nothing matched.
            Some(count) if out.status.success() || count == 0 => Ok(count),
            _ => Err(command::failed(&delete, &out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_kept_after_their_connection_ended_are_told_apart() {
        let flow = "src=192.168.10.250 dst=192.168.10.12 sport=40000 dport=31007 \
                    src=10.244.1.90 dst=192.168.10.12 sport=7007 dport=40000 [ASSURED] mark=0 use=1";
        for (state, ended) in [
            ("ESTABLISHED", false),
            ("FIN_WAIT", false),
            ("CLOSE_WAIT", false),
            ("LAST_ACK", false),
            ("SYN_SENT", false),
            ("TIME_WAIT", true),
            ("CLOSE", true),
        ] {
            let line = format!("tcp      6 117 {state} {flow}");
            assert_eq!(has_ended(&line), ended, "{line}");
            assert_eq!(
                has_ended(&format!("ipv4     2 {line}")),
                ended,
                "extended: {line}"
            );
        }
        assert!(has_ended(&format!("sctp     132 9 CLOSED {flow}")));
        assert!(!has_ended(&format!("udp      17 29 {flow}")), "UDP has no state");
    }

    #[test]
    fn plain_and_extended_lines_parse() {
        let plain = "udp      17 99 src=10.0.0.1 dst=10.96.0.10 sport=4000 dport=53 [UNREPLIED] \
                     src=10.244.2.53 dst=10.0.0.1 sport=53 dport=4000 [ASSURED] mark=0 use=1";
        let flow = parse_line(plain).unwrap().unwrap();
        assert_eq!(flow.original.dst, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!((flow.original.sport, flow.original.dport), (4000, 53));
        assert_eq!(flow.reply.src, "10.244.2.53".parse::<IpAddr>().unwrap());
        let extended = format!("ipv4     2 {plain}");
        assert_eq!(parse_line(&extended).unwrap(), Some(flow));
        let v6 = "udp      17 99 src=fd00::1 dst=fd00::10 sport=4000 dport=53 [UNREPLIED] src=fd00::53 \
                  dst=fd00::1 sport=53 dport=4000 mark=0 use=1";
        assert_eq!(parse_line(v6).unwrap().unwrap().family(), IpFamily::IPv6);
        assert_eq!(
            parse_line("conntrack v1.4.7 (conntrack-tools): 1 flow entries have been shown.").unwrap(),
            None
        );
        assert_eq!(
            parse_line("icmp     1 29 src=1.1.1.1 dst=2.2.2.2 type=8 code=0 id=1").unwrap(),
            None
        );
        let tcp = "tcp      6 431999 ESTABLISHED src=10.244.1.9 dst=10.96.0.1 sport=40000 dport=80 \
                   src=10.244.2.5 dst=10.244.1.9 sport=8080 dport=40000 [ASSURED] mark=0 use=1";
        let tcp = parse_line(tcp).unwrap().unwrap();
        assert_eq!(tcp.reply.src, "10.244.2.5".parse::<IpAddr>().unwrap());
        assert_eq!((tcp.original.dport, tcp.reply.sport), (80, 8080));
        assert!(parse_line("udp 17 30 src=10.0.0.1 dst=nope sport=1 dport=2").is_err());
        assert!(parse_line("udp 17 30 src=10.0.0.1 dst=10.0.0.2 sport=1 dport=2").is_err());
    }

    #[test]
    fn filtered_deletes_name_the_frontend_unless_a_node_port_and_report_their_count() {
        let flows = EndpointFlows {
            protocol: Protocol::SCTP,
            family: IpFamily::IPv6,
            frontend: Some("fd00::10".parse().unwrap()),
            port: 80,
            endpoint: "fd00:244::5".parse().unwrap(),
            endpoint_port: Some(8080),
        };
        assert_eq!(
            delete_matching_args(&flows).join(" "),
            "-D -p sctp -f ipv6 --orig-dst fd00::10 --orig-port-dst 80 --reply-src fd00:244::5 \
             --reply-port-src 8080"
        );
        let node_port = EndpointFlows {
            protocol: Protocol::TCP,
            frontend: None,
            port: 30080,
            endpoint_port: None,
            ..flows
        };
        assert_eq!(
            delete_matching_args(&node_port).join(" "),
            "-D -p tcp -f ipv6 --orig-port-dst 30080 --reply-src fd00:244::5"
        );
        let said =
            |n: &str| format!("conntrack v1.4.7 (conntrack-tools): {n} flow entries have been deleted.");
        assert_eq!(deleted_count(&said("100000")), Some(100_000));
        assert_eq!(deleted_count(&said("0")), Some(0));
        assert_eq!(
            deleted_count("conntrack v1.4.7 (conntrack-tools): Operation not permitted"),
            None
        );
    }
}
