//! A TCP relay between the host and a lab namespace, in either direction: how an agent inside a node's
//! namespace reaches an API server that listens in the host namespace (and how a test takes that API
//! server away from it), and how the host reaches a lab cluster's API server inside its namespace.
//!
//! ```text
//! Relay::start(netns, targets)       listener in <netns> at the server's own IP:port (setns thread)
//!                                      accept ─► pipe on host threads ─► the real server (host)
//! Relay::into_netns(listen, netns, target)
//!                                    listener on the host (e.g. 127.0.0.1:0)
//!                                      accept ─► connect from a <netns> thread ─► the server inside
//! cut()     ─► listener closed (connect: refused) and every piped connection shut down
//! restore() ─► listening again at the same address
//! ```
//!
//! The agent's kubeconfig names the server's real address, so nothing about the agent changes when the
//! relay is in between.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{LabError, Result};
use crate::netns;

/// Connections the relay pipes, so a cut can end them.
type Live = Arc<Mutex<Vec<TcpStream>>>;

/// Accepts inside a namespace at the API server's own address and pipes to the real server.
pub struct Relay {
    /// Where the listeners are: a namespace, or the host (None).
    listen_in: Option<String>,
    /// Where connections to the target are made from: a namespace, or the host (None).
    connect_in: Option<String>,
    /// (listen at, connect to) pairs.
    routes: Vec<(SocketAddr, SocketAddr)>,
    running: Option<Running>,
}

struct Running {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    live: Live,
}

impl Relay {
    /// Starts relaying each target from inside `netns` (a target the namespace cannot bind, such as
    /// `::1` without IPv6, is skipped while another one binds).
    pub fn start(netns: &str, targets: &[SocketAddr]) -> Result<Self> {
        let mut relay = Relay {
            listen_in: Some(netns.to_string()),
            connect_in: None,
            routes: targets.iter().map(|&target| (target, target)).collect(),
            running: None,
        };
        relay.restore()?;
        Ok(relay)
    }

    /// Listens on the host at `listen` (port 0: any free port) and connects each accepted
    /// connection to `target` from inside `netns`.
    pub fn into_netns(listen: SocketAddr, netns: &str, target: SocketAddr) -> Result<Self> {
        let mut relay = Relay {
            listen_in: None,
            connect_in: Some(netns.to_string()),
            routes: vec![(listen, target)],
            running: None,
        };
        relay.restore()?;
        Ok(relay)
    }

    /// Where the (first) listener listens: with port 0 asked for, the port it got.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.routes.first().map(|&(listen, _)| listen)
    }

    /// True while the relay accepts.
    pub fn is_up(&self) -> bool {
        self.running.is_some()
    }

    /// The API server becomes unreachable from the namespace: new connections are refused and the
    /// open ones end.
    pub fn cut(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop.store(true, Ordering::Relaxed);
            for thread in running.threads {
                let _ = thread.join();
            }
            for conn in running
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .drain(..)
            {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
    }

    /// Relays again (no-op while up).
    pub fn restore(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let live: Live = Arc::default();
        let mut threads = Vec::new();
        let mut last_error = None;
        let place = self.listen_in.as_deref().unwrap_or("the host").to_owned();
        for route in &mut self.routes {
            let (listen, target) = *route;
            // The socket belongs to the namespace of the thread that created it, wherever it is used.
            let bound = match &self.listen_in {
                Some(netns) => netns::in_netns(netns, move || TcpListener::bind(listen))?,
                None => TcpListener::bind(listen),
            };
            let listener = match bound {
                Ok(listener) => listener,
                Err(source) => {
                    last_error = Some(LabError::Socket {
                        what: format!("relay: binding {listen} in {place}"),
                        source,
                    });
                    continue;
                }
            };
            let socket_error = |source| LabError::Socket {
                what: format!("relay: listener at {listen}"),
                source,
            };
            listener.set_nonblocking(true).map_err(socket_error)?;
            // NB: keep the port a listener on port 0 got, so restore() listens there again.
            route.0 = listener.local_addr().map_err(socket_error)?;
            let (stop, live) = (Arc::clone(&stop), Arc::clone(&live));
            let connect_in = self.connect_in.clone();
            threads.push(std::thread::spawn(move || {
                accept_loop(listener, target, connect_in.as_deref(), &stop, &live)
            }));
        }
        if threads.is_empty() {
            return Err(last_error.unwrap_or_else(|| LabError::Socket {
                what: format!("relay: no address to relay in {place}"),
                source: std::io::ErrorKind::InvalidInput.into(),
            }));
        }
        self.running = Some(Running { stop, threads, live });
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    connect_in: Option<&str>,
    stop: &AtomicBool,
    live: &Live,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => pipe(conn, target, connect_in, live),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                eprintln!("relay: accept on {target}: {e}");
                return;
            }
        }
    }
}

/// Copies both ways between a relayed connection and the real server, connected from the host (this
/// thread's namespace) or from inside `connect_in`.
fn pipe(conn: TcpStream, target: SocketAddr, connect_in: Option<&str>, live: &Live) {
    let connect = move || TcpStream::connect_timeout(&target, Duration::from_secs(5));
    let server = match connect_in {
        Some(netns) => netns::in_netns(netns, connect)
            .ok()
            .and_then(std::result::Result::ok),
        None => connect().ok(),
    };
    let Some(server) = server else {
        return;
    };
    let _ = conn.set_nonblocking(false);
    let (Ok(conn2), Ok(server2)) = (conn.try_clone(), server.try_clone()) else {
        return;
    };
    if let (Ok(a), Ok(b)) = (conn.try_clone(), server.try_clone()) {
        let mut live = live.lock().unwrap_or_else(PoisonError::into_inner);
        // Keep only connections still open, so a long run does not pile up dead handles.
        live.retain(|c| c.peer_addr().is_ok());
        live.extend([a, b]);
    }
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    };
    copy(conn, server);
    copy(server2, conn2);
}
