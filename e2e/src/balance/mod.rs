//! The outside load balancer of the lab: a cloud load balancer in front of an `externalTrafficPolicy:
//! Cluster` LoadBalancer Service, as small as it can be and still tell what it did.
//!
//! ```text
//! switchyard-lab balance --frontend 192.168.10.250:80=31080 --nodes 192.168.10.11,… --health-port 10256
//!                        --interval 1s          (inside <id>-balancer, started by Lab::start_balancer)
//!   every node, every interval (fixed rate, one thread each): check::get_status(node:10256, /healthz)
//!       ─► Pool::checked ─► a change? ─► {"event":"health",…} on stdout
//!   first round done ─► {"event":"ready"}
//!   each frontend: accept ─► Pool::pick (round robin over the healthy) ─► {"event":"picked",…}
//!       ─► connect node:NodePort ─► proxy::pipe until both ends close ─► {"event":"closed",…}
//!          (no node, or the node refuses ─► {"event":"failed",…}, the client's connection closed)
//! tests ─► Balancer::log() ─► BalancerLog: each node's health changes, each connection's node
//! ```
//!
//! Why a userspace proxy to NodePorts rather than ECMP routes the balancer would rewrite: it is what
//! NodePort-targeting load balancers do (AWS's NLB with instance targets and its Classic LB, for
//! instance), the choice for each new connection is a decision the balancer makes and logs, so a test
//! can say which node every connection went to and when, and a connection stays on its node by
//! construction. Changing an ECMP route's next hops rehashes existing flows onto other nodes (breaking
//! them, which is what a drain must avoid), and the kernel does not say which next hop a flow took.

mod check;
mod event;
mod handle;
mod pool;
mod proxy;

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

pub use check::get_status;
pub use event::{BalancerLog, Event, Pick, Transition, epoch_ms};
pub use handle::Balancer;
pub use pool::{Answer, Pool};

use crate::error::{LabError, Result};

/// kube-proxy's health port, which cloud load balancers probe.
pub const HEALTH_PORT: u16 = 10256;
/// The path they probe.
pub const HEALTH_PATH: &str = "/healthz";
/// How long a node gets to accept a forwarded connection (the lab's probe timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the balancer listens, and the NodePort it forwards that to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// The balancer's address and port.
    pub listen: SocketAddr,
    /// The Service's NodePort on every node.
    pub node_port: u16,
}

impl FromStr for Frontend {
    type Err = String;

    /// `ADDR:PORT=NODEPORT`, e.g. `192.168.10.250:80=31080`.
    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        let (listen, node_port) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: want ADDR:PORT=NODEPORT"))?;
        Ok(Frontend {
            listen: listen
                .parse()
                .map_err(|_| format!("{listen:?} is not ADDR:PORT"))?,
            node_port: node_port
                .parse()
                .map_err(|_| format!("{node_port:?} is not a port"))?,
        })
    }
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.listen, self.node_port)
    }
}

/// What the balancer does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalancerConfig {
    /// Where it listens, each with its NodePort.
    pub frontends: Vec<Frontend>,
    /// The nodes' addresses.
    pub nodes: Vec<Ipv4Addr>,
    /// The port it checks on every node.
    pub health_port: u16,
    /// How often each node is checked; a check waits at most half of it.
    pub interval: Duration,
}

impl BalancerConfig {
    /// The `switchyard-lab balance …` command line.
    pub fn argv(&self, lab_binary: &Path) -> Vec<String> {
        let mut argv = vec![lab_binary.display().to_string(), "balance".into()];
        for frontend in &self.frontends {
            argv.extend(["--frontend".to_string(), frontend.to_string()]);
        }
        let nodes: Vec<String> = self.nodes.iter().map(ToString::to_string).collect();
        argv.extend([
            "--nodes".to_string(),
            nodes.join(","),
            "--health-port".to_string(),
            self.health_port.to_string(),
            "--interval".to_string(),
            format!("{}ms", self.interval.as_millis()),
        ]);
        argv
    }

    /// How long one check may take: half the interval, so checks keep their rate.
    pub fn check_timeout(&self) -> Duration {
        self.interval / 2
    }

    fn validate(&self) -> Result<()> {
        let problem = if self.frontends.is_empty() {
            Some("no frontend")
        } else if self.nodes.is_empty() {
            Some("no node")
        } else if self.interval < Duration::from_millis(10) {
            Some("an interval under 10 ms")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(LabError::BalancerConfig(problem.to_string())),
            None => Ok(()),
        }
    }
}

/// What every thread of the balancer shares.
struct Shared {
    pool: Mutex<Pool>,
    next_id: AtomicU64,
}

impl Shared {
    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Writes one event line on stdout (the lab keeps it in the balancer's log).
fn emit(event: &Event) {
    // NB: one locked write per line, so lines of different threads never interleave.
    let _ = writeln!(std::io::stdout().lock(), "{}", event.line());
}

/// Runs the balancer until it is killed; returns only when it cannot start.
pub fn run(config: &BalancerConfig) -> Result<()> {
    config.validate()?;
    let mut listeners = Vec::new();
    for frontend in &config.frontends {
        let listener = TcpListener::bind(frontend.listen).map_err(|source| LabError::Socket {
            what: format!("balancer: binding {}", frontend.listen),
            source,
        })?;
        listeners.push((*frontend, listener));
    }
    let shared = Arc::new(Shared {
        pool: Mutex::new(Pool::new(&config.nodes)),
        next_id: AtomicU64::new(1),
    });
    // The first round before accepting, so the first connection has a healthy node to go to.
    let first: Vec<_> = config
        .nodes
        .iter()
        .map(|&node| {
            let (config, shared) = (config.clone(), Arc::clone(&shared));
            std::thread::spawn(move || check_once(&config, node, &shared))
        })
        .collect();
    for thread in first {
        thread
            .join()
            .map_err(|_| LabError::ThreadPanicked("checking a node".into()))?;
    }
    let started = Instant::now();
    emit(&Event::Ready {
        at_ms: epoch_ms(SystemTime::now()),
    });
    let mut threads = Vec::new();
    for &node in &config.nodes {
        let (config, shared) = (config.clone(), Arc::clone(&shared));
        threads.push(std::thread::spawn(move || {
            keep_checking(&config, node, &shared, started)
        }));
    }
    for (frontend, listener) in listeners {
        let shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || accept(&listener, frontend, &shared)));
    }
    for thread in threads {
        thread
            .join()
            .map_err(|_| LabError::ThreadPanicked("balancing".into()))?;
    }
    Ok(())
}

fn check_once(config: &BalancerConfig, node: Ipv4Addr, shared: &Shared) {
    let answer = get_status(
        SocketAddr::from((node, config.health_port)),
        HEALTH_PATH,
        config.check_timeout(),
    );
    let at_ms = epoch_ms(SystemTime::now());
    // NB: emitted under the pool's lock, so the log orders health changes and picks as they happened.
    let mut pool = shared.pool();
    if let Some(event) = pool.checked(node, &answer, at_ms) {
        emit(&event);
    }
}

/// Checks `node` at `started + k × interval`; a check that ran past its tick skips the missed ones.
fn keep_checking(config: &BalancerConfig, node: Ipv4Addr, shared: &Shared, started: Instant) {
    let interval_ms = config.interval.as_millis().max(1);
    loop {
        let elapsed_ms = started.elapsed().as_millis();
        let next_ms = (elapsed_ms / interval_ms + 1) * interval_ms;
        let wait = u64::try_from(next_ms - elapsed_ms).unwrap_or(u64::MAX);
        std::thread::sleep(Duration::from_millis(wait));
        check_once(config, node, shared);
    }
}

fn accept(listener: &TcpListener, frontend: Frontend, shared: &Arc<Shared>) {
    loop {
        let (client, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("balancer: accepting on {}: {error}", frontend.listen);
                // An error that persists (out of file descriptors) must not spin a core.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let node = {
            let mut pool = shared.pool();
            let node = pool.pick();
            if let Some(node) = node {
                emit(&Event::Picked {
                    at_ms: epoch_ms(SystemTime::now()),
                    id,
                    client: peer,
                    frontend: frontend.listen,
                    node,
                });
            }
            node
        };
        std::thread::spawn(move || forward(client, peer, id, node, frontend.node_port));
    }
}

/// Connects to the picked node's NodePort and pipes until both ends close.
fn forward(client: TcpStream, peer: SocketAddr, id: u64, node: Option<Ipv4Addr>, node_port: u16) {
    let failed = |error: String| {
        emit(&Event::Failed {
            at_ms: epoch_ms(SystemTime::now()),
            id,
            client: peer,
            error,
        });
    };
    let Some(node) = node else {
        return failed("no healthy node".into());
    };
    let target = SocketAddr::from((node, node_port));
    let upstream = match TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) {
        Ok(upstream) => upstream,
        Err(error) => return failed(format!("connecting to {target}: {error}")),
    };
    // Small writes (an echo's lines) go out at once rather than waiting on Nagle.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let piped = proxy::pipe(client, upstream);
    emit(&Event::Closed {
        at_ms: epoch_ms(SystemTime::now()),
        id,
        to_node: piped.to_node,
        to_client: piped.to_client,
        error: piped.error,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_round_trips_its_frontends() {
        let frontend: Frontend = "192.168.10.250:80=31080".parse().unwrap();
        assert_eq!(
            frontend,
            Frontend {
                listen: "192.168.10.250:80".parse().unwrap(),
                node_port: 31080
            }
        );
        assert_eq!(frontend.to_string(), "192.168.10.250:80=31080");
        assert!("192.168.10.250:80".parse::<Frontend>().is_err());
        assert!("nowhere=31080".parse::<Frontend>().is_err());
        let config = BalancerConfig {
            frontends: vec![frontend],
            nodes: vec![Ipv4Addr::new(192, 168, 10, 11), Ipv4Addr::new(192, 168, 10, 12)],
            health_port: HEALTH_PORT,
            interval: Duration::from_secs(1),
        };
        assert_eq!(
            config.argv(Path::new("/bin/switchyard-lab")).join(" "),
            "/bin/switchyard-lab balance --frontend 192.168.10.250:80=31080 \
             --nodes 192.168.10.11,192.168.10.12 --health-port 10256 --interval 1000ms"
        );
        assert_eq!(config.check_timeout(), Duration::from_millis(500));
        assert!(config.validate().is_ok());
        let no_nodes = BalancerConfig {
            nodes: vec![],
            ..config
        };
        assert!(no_nodes.validate().is_err());
    }
}
