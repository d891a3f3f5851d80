//! A TCP relay into a lab namespace: how an agent inside a node's namespace reaches an API server that
//! listens in the host namespace, and how a test takes that API server away from it.
//!
//! ```text
//! netns <node>: listener at the API server's own IP:port (bound from a setns thread)
//!   accept ─► pipe on host threads ─► the real server (host namespace)
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
    netns: String,
    targets: Vec<SocketAddr>,
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
            netns: netns.to_string(),
            targets: targets.to_vec(),
            running: None,
        };
        relay.restore()?;
        Ok(relay)
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
        for &target in &self.targets {
            // The socket belongs to the namespace of the thread that created it, wherever it is used.
            let listener = match netns::in_netns(&self.netns, move || TcpListener::bind(target))? {
                Ok(listener) => listener,
                Err(source) => {
                    last_error = Some(LabError::Socket {
                        what: format!("relay: binding {target} in {}", self.netns),
                        source,
                    });
                    continue;
                }
            };
            listener
                .set_nonblocking(true)
                .map_err(|source| LabError::Socket {
                    what: format!("relay: listener at {target}"),
                    source,
                })?;
            let (stop, live) = (Arc::clone(&stop), Arc::clone(&live));
            threads.push(std::thread::spawn(move || {
                accept_loop(listener, target, &stop, &live)
            }));
        }
        if threads.is_empty() {
            return Err(last_error.unwrap_or_else(|| LabError::Socket {
                what: format!("relay: no address to relay in {}", self.netns),
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

fn accept_loop(listener: TcpListener, target: SocketAddr, stop: &AtomicBool, live: &Live) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => pipe(conn, target, live),
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

/// Copies both ways between a relayed connection and the real server (this thread is in the host
/// namespace, so the connect reaches the real server).
fn pipe(conn: TcpStream, target: SocketAddr, live: &Live) {
    let Ok(server) = TcpStream::connect(target) else {
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
