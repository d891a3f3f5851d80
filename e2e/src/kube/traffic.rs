//! Real connections in a lab cluster: a pod's network namespace (found through its cgroup) or a named
//! namespace ─► HTTP to agnhost `netexec` ─► which pod answered and the client address it saw.
//!
//! ```text
//! pod uid ─► /sys/fs/cgroup/pids/<node cgroup>/kubepods/…/pod<uid>/<container>/cgroup.procs ─► pid
//!         ─► /proc/<pid>/ns/net ─► thread setns ─► connect ─► GET /hostname, GET /clientip (one
//!            connection: the same backend) ─► Answered { pod, seen_source } | Refused | TimedOut
//! Prober: one thread per source, settled in its namespace, a connection every interval; counts
//!         answered and failed connections (with when, at which stage and what) until stopped
//! clock(): one test-wide clock (seconds since first use, and UTC to match the agents' logs) that
//!         failures and the test's steps are both stamped with
//! ```

use std::{
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, LazyLock, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nix::sched::{CloneFlags, setns};

use crate::{
    error::{LabError, Result},
    probe::ProbeResult,
};

/// The network namespace file of the pod with `uid` on a node whose kubelet uses cgroup root
/// `cgroup`: the first process of any of its containers (the sandbox's pause, usually).
pub fn pod_netns(cgroup: &str, uid: &str) -> Result<PathBuf> {
    let root = Path::new("/sys/fs/cgroup/pids").join(cgroup);
    let wanted = format!("pod{uid}");
    let dir = find_dir(&root, &wanted, 4).ok_or_else(|| LabError::Kube {
        what: format!("the cgroup of pod {uid}"),
        detail: format!("no {wanted} below {}", root.display()),
    })?;
    let mut pids = Vec::new();
    collect_pids(&dir, &mut pids);
    pids.into_iter()
        .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")))
        .find(|path| path.exists())
        .ok_or_else(|| LabError::Kube {
            what: format!("the network namespace of pod {uid}"),
            detail: format!("no process in {}", dir.display()),
        })
}

fn find_dir(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let children: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| entry.path())
        .collect();
    if let Some(found) = children
        .iter()
        .find(|child| child.file_name().is_some_and(|n| n == name))
    {
        return Some(found.clone());
    }
    if depth == 0 {
        return None;
    }
    children.iter().find_map(|child| find_dir(child, name, depth - 1))
}

fn collect_pids(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|line| line.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.filter_map(|entry| entry.ok()) {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                collect_pids(&entry.path(), pids);
            }
        }
    }
}

/// The test-wide epoch: an instant and the wall clock at that instant.
static EPOCH: LazyLock<(Instant, SystemTime)> = LazyLock::new(|| (Instant::now(), SystemTime::now()));

/// Milliseconds on the test-wide clock.
pub fn clock_ms() -> u128 {
    EPOCH.0.elapsed().as_millis()
}

/// `ms` on the test-wide clock as `t+12.345s (19:22:01.123 UTC)`: the first to order a failure among
/// the test's steps, the second to find it in an agent's log.
pub fn clock_at(ms: u128) -> String {
    let wall = EPOCH.1 + Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
    let since_epoch = wall.duration_since(UNIX_EPOCH).unwrap_or_default();
    let day_ms = since_epoch.as_millis() % 86_400_000;
    format!(
        "t+{}.{:03}s ({:02}:{:02}:{:02}.{:03} UTC)",
        ms / 1000,
        ms % 1000,
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// Now on the test-wide clock (see [`clock_at`]).
pub fn clock() -> String {
    clock_at(clock_ms())
}

/// Where an HTTP probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Connecting (a SYN unanswered, refused).
    Connect,
    /// The request on an established connection (an answer that did not come, or came wrong).
    Request,
}

/// One HTTP connection to an agnhost `netexec` at `dst`, from the current thread's namespace:
/// `/hostname` then `/clientip` on the same connection.
pub fn http_probe_here(dst: SocketAddr, timeout: Duration) -> ProbeResult {
    http_probe_staged(dst, timeout).0
}

/// [`http_probe_here`], and the stage it ended in.
fn http_probe_staged(dst: SocketAddr, timeout: Duration) -> (ProbeResult, Stage) {
    let mut stream = match TcpStream::connect_timeout(&dst, timeout) {
        Ok(stream) => stream,
        Err(error) => return (classify(&error), Stage::Connect),
    };
    (request(&mut stream, timeout), Stage::Request)
}

fn request(stream: &mut TcpStream, timeout: Duration) -> ProbeResult {
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let pod = match get(stream, "/hostname") {
        Ok(body) => body,
        Err(result) => return result,
    };
    let client = match get(stream, "/clientip") {
        Ok(body) => body,
        Err(result) => return result,
    };
    match client.trim().parse::<SocketAddr>() {
        Ok(seen_source) => ProbeResult::Answered {
            pod: pod.trim().to_owned(),
            seen_source,
        },
        Err(_) => ProbeResult::Error {
            message: format!("/clientip answered {client:?}"),
        },
    }
}

/// [`http_probe_here`] from inside the namespace of file `netns` (named, or a pod's).
pub fn http_probe(netns: &Path, dst: SocketAddr, timeout: Duration) -> ProbeResult {
    let label = netns.display().to_string();
    crate::netns::in_netns_at(netns, &label, || http_probe_here(dst, timeout)).unwrap_or_else(|error| {
        ProbeResult::Error {
            message: error.to_string(),
        }
    })
}

/// `n` probes from one namespace, one after another.
pub fn http_probe_many(netns: &Path, dst: SocketAddr, n: usize, timeout: Duration) -> Vec<ProbeResult> {
    let label = netns.display().to_string();
    crate::netns::in_netns_at(netns, &label, || {
        (0..n).map(|_| http_probe_here(dst, timeout)).collect()
    })
    .unwrap_or_else(|error| {
        vec![
            ProbeResult::Error {
                message: error.to_string(),
            };
            n
        ]
    })
}

fn get(stream: &mut TcpStream, path: &str) -> std::result::Result<String, ProbeResult> {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: switchyard-lab\r\nUser-Agent: switchyard-lab\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|error| classify(&error))?;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let body_start = end + 4;
            while buffer.len() < body_start + length {
                let read = stream.read(&mut chunk).map_err(|error| classify(&error))?;
                if read == 0 {
                    break;
                }
                buffer.extend_from_slice(&chunk[..read]);
            }
            if !head.starts_with("HTTP/1.1 200") {
                return Err(ProbeResult::Error {
                    message: format!("{path}: {}", head.lines().next().unwrap_or_default()),
                });
            }
            let body_end = (body_start + length).min(buffer.len());
            return Ok(String::from_utf8_lossy(&buffer[body_start..body_end]).into_owned());
        }
        let read = stream.read(&mut chunk).map_err(|error| classify(&error))?;
        if read == 0 {
            return Err(ProbeResult::Error {
                message: format!("{path}: the connection closed before an answer"),
            });
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

fn classify(error: &std::io::Error) -> ProbeResult {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => ProbeResult::Refused,
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => ProbeResult::TimedOut,
        _ => ProbeResult::Error {
            message: error.to_string(),
        },
    }
}

/// One failed connection of a [`Prober`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which source.
    pub source: String,
    /// When the connection was begun, on the test-wide clock ([`clock_at`]).
    pub began_ms: u128,
    /// How long it took to fail.
    pub took_ms: u128,
    /// Where it failed.
    pub stage: Stage,
    /// What was seen.
    pub result: ProbeResult,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:?} at the {:?} stage, begun {}, after {} ms",
            self.source,
            self.result,
            self.stage,
            clock_at(self.began_ms),
            self.took_ms
        )
    }
}

/// What a [`Prober`] counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProberTally {
    /// Answered connections.
    pub answered: usize,
    /// Failed ones, in order.
    pub failures: Vec<Failure>,
}

impl ProberTally {
    /// All connections.
    pub fn total(&self) -> usize {
        self.answered + self.failures.len()
    }
}

/// Connections to one destination from several namespaces, continuously, until stopped.
#[derive(Debug)]
pub struct Prober {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<ProberTally>>,
    threads: Vec<JoinHandle<()>>,
}

impl Prober {
    /// Starts one thread per `(label, namespace file, destination)`, each making a connection to its
    /// destination every `interval`.
    pub fn start(sources: &[(String, PathBuf, SocketAddr)], interval: Duration) -> Result<Prober> {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(ProberTally::default()));
        let mut threads = Vec::new();
        for (label, path, dst) in sources {
            let dst = *dst;
            let file = File::open(path).map_err(|error| LabError::EnterNetns {
                netns: label.clone(),
                reason: error.to_string(),
            })?;
            let (stop, tally, label) = (Arc::clone(&stop), Arc::clone(&tally), label.clone());
            threads.push(std::thread::spawn(move || {
                if let Err(errno) = setns(&file, CloneFlags::CLONE_NEWNET) {
                    eprintln!("prober {label}: entering its namespace: {errno}");
                    return;
                }
                drop(file);
                while !stop.load(Ordering::Relaxed) {
                    let began_ms = clock_ms();
                    let (result, stage) = http_probe_staged(dst, Duration::from_secs(2));
                    let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
                    if result.is_answered() {
                        tally.answered += 1;
                    } else {
                        tally.failures.push(Failure {
                            source: label.clone(),
                            began_ms,
                            took_ms: clock_ms().saturating_sub(began_ms),
                            stage,
                            result,
                        });
                    }
                    drop(tally);
                    std::thread::sleep(interval);
                }
            }));
        }
        Ok(Prober { stop, tally, threads })
    }

    /// What was counted so far.
    pub fn tally(&self) -> ProberTally {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops every thread and returns the final count.
    pub fn stop(mut self) -> ProberTally {
        self.halt();
        self.tally()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.halt();
    }
}
