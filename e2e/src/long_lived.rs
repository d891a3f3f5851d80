//! A long-lived connection that keeps exchanging data, closed when the test says: what a drain must
//! let finish.
//!
//! ```text
//! LongLived::open(lab, from, echo address, period)   connect from inside `from` (setns thread)
//!   ─► the answer line "<pod> <peer>" ─► a thread: every period write "<n>\n", read it back (timeout)
//!        └─ a reset, a timeout or other bytes ─► the failure, kept; the exchanges stop
//! LongLived::close() ─► stop ─► shut down writing ─► the echo closes too (EOF, within the timeout)
//!                    ─► LongLivedReport { exchanges, failure }
//! ```
//!
//! Each exchange is a round trip through everything on the path (a balancer, a node's rules and
//! conntrack entry, the pod), so a path that silently drops packets fails within one timeout, not
//! only one that resets. The far end is a pod's echo port (`crate::serve`; a slice port with
//! `appProtocol: switchyard.io/echo`).

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{LabError, Result};
use crate::probe::{ProbeResult, Proto};
use crate::{Lab, Place, netns};

/// How long one exchange, and the close, may take.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a long-lived connection saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LongLivedReport {
    /// Round trips that came back intact.
    pub exchanges: u64,
    /// The first thing that went wrong (the exchanges stopped there), if anything did.
    pub failure: Option<String>,
}

/// An open long-lived connection.
pub struct LongLived {
    local: SocketAddr,
    pod: String,
    stop: Arc<AtomicBool>,
    exchanges: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
}

impl LongLived {
    /// Connects from `from` to `to` (an echo port), reads the answer line, and starts exchanging a line
    /// every `period`.
    pub fn open(lab: &Lab, from: &Place, to: SocketAddr, period: Duration) -> Result<LongLived> {
        let netns = lab.netns(from)?;
        // NB: a socket belongs to the namespace it was made in, whichever thread uses it later.
        let stream = netns::in_netns(netns, move || TcpStream::connect_timeout(&to, EXCHANGE_TIMEOUT))?
            .map_err(|source| LabError::Socket {
                what: format!("connecting from {from} to {to}"),
                source,
            })?;
        Self::start(stream, &format!("{to} from {from}"), period)
    }

    /// Starts on a connection already made; `what` names it in errors.
    fn start(stream: TcpStream, what: &str, period: Duration) -> Result<LongLived> {
        let socket_error = |doing: &str, source| LabError::Socket {
            what: format!("{doing} {what}"),
            source,
        };
        stream
            .set_read_timeout(Some(EXCHANGE_TIMEOUT))
            .map_err(|e| socket_error("a read timeout on the connection to", e))?;
        let local = stream
            .local_addr()
            .map_err(|e| socket_error("the local address of the connection to", e))?;
        let mut reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|e| socket_error("sharing the connection to", e))?,
        );
        let mut answer = String::new();
        reader
            .read_line(&mut answer)
            .map_err(|e| socket_error("reading the answer of", e))?;
        let pod = match crate::probe::parse_reply(&answer) {
            ProbeResult::Answered { pod, .. } => pod,
            other => {
                return Err(LabError::Socket {
                    what: format!("{} {what}: {other}", Proto::Tcp),
                    source: std::io::ErrorKind::InvalidData.into(),
                });
            }
        };
        let writer = stream
            .try_clone()
            .map_err(|e| socket_error("sharing the connection to", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let exchanges = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, exchanges, failure) =
                (Arc::clone(&stop), Arc::clone(&exchanges), Arc::clone(&failure));
            std::thread::spawn(move || {
                let outcome = exchange_until_stopped(writer, reader, period, &stop, &exchanges);
                if let Err(why) = outcome {
                    *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
                }
            })
        };
        Ok(LongLived {
            local,
            pod,
            stop,
            exchanges,
            failure,
            stream,
            thread: Some(thread),
        })
    }

    /// Its local address: the client address a balancer in front logs for it.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The pod that answered.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// Intact round trips so far.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(Ordering::Relaxed)
    }

    /// What went wrong so far, if anything.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops exchanging and closes: the echo must see the end and close its side within the timeout.
    pub fn close(mut self) -> LongLivedReport {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            self.set_failure("the exchanging thread panicked".into());
        }
        if self.failure().is_none()
            && let Err(why) = close_cleanly(&self.stream)
        {
            self.set_failure(why);
        }
        LongLivedReport {
            exchanges: self.exchanges(),
            failure: self.failure(),
        }
    }

    fn set_failure(&self, why: String) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure.get_or_insert(why);
    }
}

impl Drop for LongLived {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Every `period`: a numbered line out, the same line back. Returns the first thing that went wrong.
fn exchange_until_stopped(
    mut writer: TcpStream,
    mut reader: BufReader<TcpStream>,
    period: Duration,
    stop: &AtomicBool,
    exchanges: &AtomicU64,
) -> std::result::Result<(), String> {
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let line = format!("{n}\n");
        writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("exchange {n}: writing: {e}"))?;
        let mut back = String::new();
        match reader.read_line(&mut back) {
            Ok(_) if back == line => {
                exchanges.fetch_add(1, Ordering::Relaxed);
            }
            Ok(0) => return Err(format!("exchange {n}: the connection was closed")),
            Ok(_) => return Err(format!("exchange {n}: got {back:?} back")),
            Err(e) => return Err(format!("exchange {n}: reading: {e}")),
        }
        std::thread::sleep(period);
    }
    Ok(())
}

/// Shuts down writing and waits for the far end to close too (nothing else may arrive).
fn close_cleanly(stream: &TcpStream) -> std::result::Result<(), String> {
    stream
        .shutdown(Shutdown::Write)
        .map_err(|e| format!("closing: {e}"))?;
    let mut rest = String::new();
    let mut reader = BufReader::new(stream);
    match reader.read_line(&mut rest) {
        Ok(0) => Ok(()),
        Ok(_) => Err(format!("closing: got {rest:?} after the last exchange")),
        Err(e) => Err(format!("closing: the far end did not close: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{ServeConfig, serve};
    use std::net::{IpAddr, Ipv4Addr, TcpListener};
    use std::time::Instant;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Loopback, no namespaces: a pod's echo port behind, round trips counted, a clean close.
    #[test]
    fn exchanges_come_back_intact_until_closed() {
        let port = free_port();
        let mut config = ServeConfig::new("echo-pod");
        config.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        config.echo = vec![port];
        std::thread::spawn(move || serve(&config, || Ok(())));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + Duration::from_secs(2);
        let stream = loop {
            match TcpStream::connect(addr) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let held = LongLived::start(stream, "the echo", Duration::from_millis(5)).unwrap();
        assert_eq!(held.pod(), "echo-pod");
        while held.exchanges() < 5 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let report = held.close();
        assert_eq!(report.failure, None);
        assert!(report.exchanges >= 5, "{report:?}");
    }

    /// A far end that answers, then stops echoing: the exchange times out and says so.
    #[test]
    fn a_silent_path_fails_within_the_exchange_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, peer) = listener.accept().unwrap();
            stream.write_all(format!("mute {peer}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_secs(10));
        });
        let held = LongLived::start(
            TcpStream::connect(addr).unwrap(),
            "the mute end",
            Duration::from_millis(5),
        )
        .unwrap();
        let started = Instant::now();
        while held.failure().is_none() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let report = held.close();
        assert_eq!(report.exchanges, 0);
        assert!(
            report
                .failure
                .as_deref()
                .is_some_and(|f| f.contains("exchange 1: reading")),
            "{report:?}"
        );
    }
}
