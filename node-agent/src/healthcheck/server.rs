//! The health-check HTTP listeners: one per port, started, updated and stopped as plans change.
//!
//! ```text
//! update(desired) ─┬─ new port ─────► bind [::]:port (0.0.0.0:port without IPv6) ─► axum task
//!                  ├─ kept port ────► watch::Sender::send(service)   (listener untouched)
//!                  └─ removed port ─► task aborted, socket closed
//! request ─► handler ─► respond(watch value, proxy healthy flag) ─► 200 / 503
//! ```
//!
//! Listeners accept on every address of the node (kube-proxy binds each `nodePortAddresses` IP
//! instead): the health-check port is a NodePort-range port only load balancers probe, and the
//! iptables rules ACCEPT it in `SWYD-NODEPORTS` whatever the destination address. A port that cannot be
//! bound (taken by another process) is reported back to the caller, which lists it in the status, and
//! is tried again on the next update; it never stops the agent.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{HcService, respond};
use crate::error::Error;

#[derive(Clone)]
struct Shared {
    service: watch::Receiver<HcService>,
    healthy: Arc<AtomicBool>,
}

struct Running {
    service: watch::Sender<HcService>,
    task: JoinHandle<()>,
}

/// The running listeners.
pub struct HealthServers {
    runtime: Handle,
    healthy: Arc<AtomicBool>,
    running: BTreeMap<u16, Running>,
}

impl std::fmt::Debug for HealthServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthServers")
            .field("ports", &self.ports())
            .finish_non_exhaustive()
    }
}

async fn handle(State(shared): State<Shared>) -> Response {
    let service = shared.service.borrow().clone();
    let answer = respond(&service, shared.healthy.load(Ordering::Relaxed));
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = (status, answer.body).into_response();
    for (name, value) in answer.headers {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// Binds `port` on every address: dual-stack `[::]` where IPv6 works (IPV6_V6ONLY cleared
/// explicitly, so IPv4 load-balancer probes reach it whatever `net.ipv6.bindv6only` says), else
/// `0.0.0.0`.
fn bind(port: u16) -> Result<TcpListener, Error> {
    let wrap = |source| Error::BindHealthCheck { port, source };
    let listener = match bind_dual_stack(port) {
        Ok(listener) => listener,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Err(wrap(e)),
        Err(_) => TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).map_err(wrap)?,
    };
    listener.set_nonblocking(true).map_err(wrap)?;
    Ok(listener)
}

fn bind_dual_stack(port: u16) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, None)?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

impl HealthServers {
    /// No listeners yet; they will run on `runtime` and report `healthy`.
    pub fn new(runtime: Handle, healthy: Arc<AtomicBool>) -> Self {
        Self {
            runtime,
            healthy,
            running: BTreeMap::new(),
        }
    }

    /// The ports being served.
    pub fn ports(&self) -> Vec<u16> {
        self.running.keys().copied().collect()
    }

    /// Serves exactly `desired`; returns the ports that could not be bound.
    pub fn update(&mut self, desired: &BTreeMap<u16, HcService>) -> Vec<Error> {
        let gone: Vec<u16> = self
            .running
            .keys()
            .filter(|port| !desired.contains_key(port))
            .copied()
            .collect();
        for port in gone {
            if let Some(running) = self.running.remove(&port) {
                running.task.abort();
                tracing::info!(port, "stopped health check server");
            }
        }
        let mut failures = Vec::new();
        for (port, service) in desired {
            if let Some(running) = self.running.get(port) {
                running.service.send_if_modified(|current| {
                    let changed = current != service;
                    if changed {
                        *current = service.clone();
                    }
                    changed
                });
                continue;
            }
            match self.start(*port, service.clone()) {
                Ok(running) => {
                    tracing::info!(port, service = %format!("{}/{}", service.namespace, service.name), "started health check server");
                    self.running.insert(*port, running);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot serve health check node port");
                    failures.push(e);
                }
            }
        }
        failures
    }

    fn start(&self, port: u16, service: HcService) -> Result<Running, Error> {
        let listener = bind(port)?;
        let _entered = self.runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|source| Error::BindHealthCheck { port, source })?;
        let (sender, receiver) = watch::channel(service);
        let app = Router::new().fallback(handle).with_state(Shared {
            service: receiver,
            healthy: Arc::clone(&self.healthy),
        });
        let task = self.runtime.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(port, error = %e, "health check server stopped");
            }
        });
        Ok(Running {
            service: sender,
            task,
        })
    }

    /// Stops every listener.
    pub fn stop_all(&mut self) {
        for (_, running) in std::mem::take(&mut self.running) {
            running.task.abort();
        }
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn get(port: u16) -> String {
        for _ in 0..50 {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                stream
                    .write_all(b"GET /anything HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let mut answer = String::new();
                stream.read_to_string(&mut answer).unwrap();
                return answer;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("nothing listens on {port}");
    }

    fn service(local_endpoints: usize) -> HcService {
        HcService {
            namespace: "ns".into(),
            name: "web".into(),
            local_endpoints,
        }
    }

    #[test]
    fn servers_answer_update_in_place_and_stop() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let healthy = Arc::new(AtomicBool::new(true));
        let mut servers = HealthServers::new(runtime.handle().clone(), Arc::clone(&healthy));
        // A port found free can be taken by a concurrently running test before we bind it: try a few.
        let port = (0..20)
            .map(|_| free_port())
            .find(|&port| servers.update(&BTreeMap::from([(port, service(1))])).is_empty())
            .expect("a free port");
        let answer = get(port);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("content-type: application/json"), "{answer}");
        assert!(lower.contains("x-content-type-options: nosniff"), "{answer}");
        assert!(lower.contains("x-load-balancing-endpoint-weight: 1"), "{answer}");
        assert!(answer.ends_with(
            r#"{"service":{"namespace":"ns","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}"#
        ));

        // The same port with new content: no rebind, new answer.
        assert!(servers.update(&BTreeMap::from([(port, service(0))])).is_empty());
        assert!(get(port).starts_with("HTTP/1.1 503"));
        healthy.store(false, Ordering::Relaxed);
        servers.update(&BTreeMap::from([(port, service(3))]));
        assert!(get(port).starts_with("HTTP/1.1 503"), "proxy unhealthy");

        // A port someone else holds is reported, not fatal.
        let taken = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let failures = servers.update(&BTreeMap::from([(port, service(3)), (taken_port, service(1))]));
        assert_eq!(failures.len(), 1);
        assert!(failures[0].to_string().contains(&taken_port.to_string()));
        assert_eq!(servers.ports(), vec![port]);

        servers.update(&BTreeMap::new());
        assert!(servers.ports().is_empty());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "listener closed"
        );
    }
}
