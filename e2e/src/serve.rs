//! The backend every lab pod runs: bind ports ─► print `ready` ─► answer each TCP connection and UDP
//! datagram with one line `<pod-name> <peer-ip>:<peer-port>`.
//!
//! ```text
//! switchyard-lab serve --name web-a1 --bind 10.244.1.10 --tcp 8080 --udp 53 --echo 7007   (in the pod's netns)
//!   TCP:  accept ─► write the line ─► shut down writing ─► drain until the peer closes
//!   echo: accept ─► write the line ─► write back every byte read until the peer closes ─► close
//!   UDP:  recv_from ─► send_to the same peer from the same socket
//! ```
//!
//! The peer address is what the kernel handed the socket, i.e. the source address after any NAT on the
//! way: tests read masquerading (or its absence) from it.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use crate::error::{LabError, Result};

/// The line a server prints on stdout once every port is bound.
pub const READY: &str = "ready";

/// What one backend serves.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The name it answers with.
    pub name: String,
    /// The address it binds (the pod IP; 0.0.0.0 for every address).
    pub bind: IpAddr,
    /// TCP ports.
    pub tcp: Vec<u16>,
    /// UDP ports.
    pub udp: Vec<u16>,
    /// TCP ports served as an echo (long-lived connections that exchange data).
    pub echo: Vec<u16>,
}

impl ServeConfig {
    /// A backend named `name` on every address, no ports yet.
    pub fn new(name: impl Into<String>) -> Self {
        ServeConfig {
            name: name.into(),
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tcp: Vec::new(),
            udp: Vec::new(),
            echo: Vec::new(),
        }
    }
}

/// The reply line for a peer.
pub fn reply_line(name: &str, peer: SocketAddr) -> String {
    format!("{name} {peer}\n")
}

/// Prints [`READY`] on stdout (how `switchyard-lab serve` tells the lab it is listening).
pub fn announce_on_stdout() -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}")?;
    stdout.flush()
}

/// Binds every port, calls `announce` (e.g. [`announce_on_stdout`]), then serves forever; returns
/// only if binding or announcing fails.
pub fn serve(config: &ServeConfig, announce: impl FnOnce() -> std::io::Result<()>) -> Result<()> {
    let bind_error = |proto: &str, port: u16, source: std::io::Error| LabError::Socket {
        what: format!("binding {proto} {}:{port} for {}", config.bind, config.name),
        source,
    };
    let mut tcp = Vec::new();
    for (&port, echo) in config
        .tcp
        .iter()
        .map(|port| (port, false))
        .chain(config.echo.iter().map(|port| (port, true)))
    {
        let listener =
            TcpListener::bind((config.bind, port)).map_err(|error| bind_error("TCP", port, error))?;
        tcp.push((listener, echo));
    }
    let mut udp = Vec::new();
    for &port in &config.udp {
        udp.push(UdpSocket::bind((config.bind, port)).map_err(|error| bind_error("UDP", port, error))?);
    }
    let mut workers = Vec::new();
    for (listener, echo) in tcp {
        let name = config.name.clone();
        workers.push(std::thread::spawn(move || serve_tcp(&name, &listener, echo)));
    }
    for socket in udp {
        let name = config.name.clone();
        workers.push(std::thread::spawn(move || serve_udp(&name, &socket)));
    }
    announce().map_err(|source| LabError::Socket {
        what: "announcing readiness".into(),
        source,
    })?;
    for worker in workers {
        let _ = worker.join();
    }
    Ok(())
}

fn serve_tcp(name: &str, listener: &TcpListener, echo: bool) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) if echo => {
                let name = name.to_owned();
                std::thread::spawn(move || echo_tcp(&name, stream));
            }
            Ok(stream) => {
                let name = name.to_owned();
                std::thread::spawn(move || answer_tcp(&name, stream));
            }
            Err(error) => eprintln!("{name}: accept: {error}"),
        }
    }
}

fn answer_tcp(name: &str, mut stream: TcpStream) {
    let Ok(peer) = stream.peer_addr() else {
        return;
    };
    if let Err(error) = stream.write_all(reply_line(name, peer).as_bytes()) {
        eprintln!("{name}: writing to {peer}: {error}");
        return;
    }
    // NB: half-close, then drain, so a client that sent data does not get a reset before reading.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut sink = [0u8; 512];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// The answer line, then every byte back until the peer closes: a connection that stays open and
/// proves, each time its client reads its own bytes back, that the path through the node still works.
fn echo_tcp(name: &str, mut stream: TcpStream) {
    let Ok(peer) = stream.peer_addr() else {
        return;
    };
    if let Err(error) = stream.write_all(reply_line(name, peer).as_bytes()) {
        eprintln!("{name}: writing to {peer}: {error}");
        return;
    }
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                if let Err(error) = stream.write_all(&buffer[..n]) {
                    eprintln!("{name}: echoing to {peer}: {error}");
                    return;
                }
            }
            Err(error) => {
                eprintln!("{name}: reading from {peer}: {error}");
                return;
            }
        }
    }
}

fn serve_udp(name: &str, socket: &UdpSocket) {
    let mut buffer = [0u8; 2048];
    loop {
        match socket.recv_from(&mut buffer) {
            Ok((_, peer)) => {
                if let Err(error) = socket.send_to(reply_line(name, peer).as_bytes(), peer) {
                    eprintln!("{name}: replying to {peer}: {error}");
                }
            }
            Err(error) => eprintln!("{name}: recv: {error}"),
        }
    }
}
