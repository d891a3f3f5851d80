//! The traffic helper: (netns, protocol, destination) ─► a connection from inside that namespace ─►
//! which pod answered and the source address it saw.
//!
//! ```text
//! probe(netns, tcp, 10.96.0.10:80, 2s)
//!   thread ─setns─► netns ─ connect ─► … node netfilter (the agent's rules) … ─► pod server
//!                                                   "web-a1 192.168.10.200:40312\n" ◄──┘
//!   ─► Answered { pod: "web-a1", seen_source: 192.168.10.200:40312 }
//! ```
//!
//! Outcomes: an answer; `Refused` (TCP RST or ICMP port unreachable, e.g. a REJECT rule or a closed UDP
//! port — a connected UDP socket reports it as ECONNREFUSED); `TimedOut` (a DROP, or nothing there);
//! `Error` (e.g. no route). `probe_many` runs n probes on one thread in one namespace.

use std::{
    collections::BTreeMap,
    fmt,
    io::{ErrorKind, Read},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    str::FromStr,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::netns;

/// The transport a probe uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// A TCP connection.
    Tcp,
    /// A UDP datagram on a connected socket.
    Udp,
}

/// What one probe saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ProbeResult {
    /// A backend answered.
    Answered {
        /// The pod that answered.
        pod: String,
        /// The source address (and port) the pod saw.
        seen_source: SocketAddr,
    },
    /// Actively refused: TCP reset or ICMP port unreachable.
    Refused,
    /// No answer within the timeout.
    TimedOut,
    /// Anything else (no route, host unreachable, a garbled answer, …).
    Error {
        /// What happened.
        message: String,
    },
}

/// What `n` probes saw, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTally {
    /// Answers per pod.
    pub answered: BTreeMap<String, usize>,
    /// Answers per source IP the pods saw.
    pub seen_sources: BTreeMap<IpAddr, usize>,
    /// Refused probes.
    pub refused: usize,
    /// Probes that timed out.
    pub timed_out: usize,
    /// Probes that failed otherwise.
    pub errors: usize,
    /// The last error message, if any.
    pub last_error: Option<String>,
}

impl ProbeResult {
    /// The answering pod, if any.
    pub fn pod(&self) -> Option<&str> {
        match self {
            ProbeResult::Answered { pod, .. } => Some(pod),
            _ => None,
        }
    }

    /// The source IP the pod saw, if any.
    pub fn seen_ip(&self) -> Option<IpAddr> {
        match self {
            ProbeResult::Answered { seen_source, .. } => Some(seen_source.ip()),
            _ => None,
        }
    }

    /// True for an answer.
    pub fn is_answered(&self) -> bool {
        matches!(self, ProbeResult::Answered { .. })
    }
}

impl ProbeTally {
    /// Counts one result.
    pub fn add(&mut self, result: ProbeResult) {
        match result {
            ProbeResult::Answered { pod, seen_source } => {
                *self.answered.entry(pod).or_default() += 1;
                *self.seen_sources.entry(seen_source.ip()).or_default() += 1;
            }
            ProbeResult::Refused => self.refused += 1,
            ProbeResult::TimedOut => self.timed_out += 1,
            ProbeResult::Error { message } => {
                self.errors += 1;
                self.last_error = Some(message);
            }
        }
    }

    /// How many probes were answered.
    pub fn total_answered(&self) -> usize {
        self.answered.values().sum()
    }

    /// How many probes were counted.
    pub fn total(&self) -> usize {
        self.total_answered() + self.refused + self.timed_out + self.errors
    }
}

/// One probe from inside namespace `netns` (on a thread that enters it).
pub fn probe(netns: &str, proto: Proto, dst: SocketAddr, timeout: Duration) -> ProbeResult {
    netns::in_netns(netns, || probe_here(proto, dst, timeout)).unwrap_or_else(|error| ProbeResult::Error {
        message: error.to_string(),
    })
}

/// `n` probes in a row from inside namespace `netns`, on one thread, each with its own connection.
pub fn probe_many(netns: &str, proto: Proto, dst: SocketAddr, n: usize, timeout: Duration) -> ProbeTally {
    netns::in_netns(netns, || probe_many_here(proto, dst, n, timeout)).unwrap_or_else(|error| {
        let mut tally = ProbeTally::default();
        tally.add(ProbeResult::Error {
            message: error.to_string(),
        });
        tally
    })
}

/// `n` probes in a row from the calling thread's namespace.
pub fn probe_many_here(proto: Proto, dst: SocketAddr, n: usize, timeout: Duration) -> ProbeTally {
    let mut tally = ProbeTally::default();
    for _ in 0..n {
        tally.add(probe_here(proto, dst, timeout));
    }
    tally
}

/// One probe from the calling thread's namespace.
pub fn probe_here(proto: Proto, dst: SocketAddr, timeout: Duration) -> ProbeResult {
    match proto {
        Proto::Tcp => probe_tcp(dst, timeout),
        Proto::Udp => probe_udp(dst, timeout),
    }
}

fn probe_tcp(dst: SocketAddr, timeout: Duration) -> ProbeResult {
    probe_tcp_keeping(dst, timeout).0
}

/// A TCP probe from the calling thread's namespace that keeps its connection: the answer, and the
/// stream (the backend has half-closed it) when it was read.
pub fn probe_tcp_keeping(dst: SocketAddr, timeout: Duration) -> (ProbeResult, Option<TcpStream>) {
    let deadline = Instant::now() + timeout;
    let mut stream = match TcpStream::connect_timeout(&dst, timeout) {
        Ok(stream) => stream,
        Err(error) => return (classify(&error), None),
    };
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    if let Err(error) = stream.set_read_timeout(Some(remaining)) {
        return (classify(&error), None);
    }
    let mut reply = String::new();
    match stream.read_to_string(&mut reply) {
        Ok(_) => (parse_reply(&reply), Some(stream)),
        Err(error) => (classify(&error), None),
    }
}

fn probe_udp(dst: SocketAddr, timeout: Duration) -> ProbeResult {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).into(),
        SocketAddr::V6(_) => (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).into(),
    };
    let exchange = || -> std::io::Result<String> {
        let socket = UdpSocket::bind(any)?;
        socket.connect(dst)?;
        socket.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        socket.send(b"probe\n")?;
        let mut buffer = [0u8; 2048];
        let n = socket.recv(&mut buffer)?;
        Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
    };
    match exchange() {
        Ok(reply) => parse_reply(&reply),
        Err(error) => classify(&error),
    }
}

fn classify(error: &std::io::Error) -> ProbeResult {
    match error.kind() {
        ErrorKind::ConnectionRefused => ProbeResult::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => ProbeResult::TimedOut,
        _ => ProbeResult::Error {
            message: error.to_string(),
        },
    }
}

/// Parses `<pod> <ip>:<port>`.
pub(crate) fn parse_reply(reply: &str) -> ProbeResult {
    let mut words = reply.split_whitespace();
    match (
        words.next(),
        words.next().map(str::parse::<SocketAddr>),
        words.next(),
    ) {
        (Some(pod), Some(Ok(seen_source)), None) => ProbeResult::Answered {
            pod: pod.to_owned(),
            seen_source,
        },
        _ => ProbeResult::Error {
            message: format!("unexpected reply {reply:?}"),
        },
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

impl FromStr for Proto {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            other => Err(format!("unknown protocol {other:?} (tcp or udp)")),
        }
    }
}

impl fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeResult::Answered { pod, seen_source } => {
                write!(f, "answered by {pod}, which saw {seen_source}")
            }
            ProbeResult::Refused => f.write_str("refused"),
            ProbeResult::TimedOut => f.write_str("timed out"),
            ProbeResult::Error { message } => write!(f, "error: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{ServeConfig, reply_line, serve};

    #[test]
    fn parses_replies() {
        let seen: SocketAddr = "10.0.0.1:4242".parse().unwrap();
        assert_eq!(
            parse_reply(&reply_line("web-a1", seen)),
            ProbeResult::Answered {
                pod: "web-a1".into(),
                seen_source: seen
            }
        );
        assert!(matches!(parse_reply("garbage"), ProbeResult::Error { .. }));
    }

    #[test]
    fn results_serialise_as_tagged_json() {
        let json = serde_json::to_string(&ProbeResult::Refused).unwrap();
        assert_eq!(json, r#"{"result":"refused"}"#);
        let answered: ProbeResult =
            serde_json::from_str(r#"{"result":"answered","pod":"p","seen_source":"1.2.3.4:5"}"#).unwrap();
        assert_eq!(answered.pod(), Some("p"));
    }

    /// Loopback, no namespaces: the server and the probe agree on the protocol.
    #[test]
    fn probes_a_local_server() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        drop(tcp);
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        drop(udp);
        let mut config = ServeConfig::new("loopback");
        config.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        config.tcp = vec![tcp_port];
        config.udp = vec![udp_port];
        std::thread::spawn(move || serve(&config, || Ok(())));
        let timeout = Duration::from_secs(2);
        let deadline = Instant::now() + timeout;
        let tcp_dst: SocketAddr = (Ipv4Addr::LOCALHOST, tcp_port).into();
        let mut result = probe_here(Proto::Tcp, tcp_dst, timeout);
        while !result.is_answered() && Instant::now() < deadline {
            result = probe_here(Proto::Tcp, tcp_dst, timeout);
        }
        assert_eq!(result.pod(), Some("loopback"));
        assert_eq!(result.seen_ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let udp_dst: SocketAddr = (Ipv4Addr::LOCALHOST, udp_port).into();
        assert_eq!(probe_here(Proto::Udp, udp_dst, timeout).pod(), Some("loopback"));
        let tally = probe_many_here(Proto::Tcp, tcp_dst, 20, timeout);
        assert_eq!(tally.answered.get("loopback"), Some(&20));
    }
}
