//! The network-namespace lab: a virtual multi-node cluster on one machine, real kernel, real packets.
//!
//! ```text
//! cluster.yaml ─► ClusterDescription ─► Layout (pure) ─► BuildScript (pure) ─► ip netns / ip -batch
//!   (Nodes, Services, EndpointSlices)      │                                         │
//!                                          ▼                                         ▼
//!                       <id>-fabric: bridge br0 ◄── eth0 of every <id>-node-* and of <id>-client
//!                       <id>-node-*: routes /32 to its <id>-pod-* (veth, proxy ARP), host-gw to others
//!                       <id>-pod-*:  `switchyard-lab serve` answers "<pod> <peer ip>:<port>"
//!                                          │
//! tests ─► Lab::probe / probe_many (setns thread) ─► ProbeResult { Answered | Refused | TimedOut | Error }
//!       ─► Lab::spawn_in (agents) / exec_in (iptables-save …) / write_plans (planner hook)
//!       ─► Lab::start_balancer: an outside load balancer (<id>-balancer) health-checking every node's
//!          :10256/healthz and spreading new connections over the healthy nodes' NodePorts
//! drop / SIGINT / SIGTERM / `switchyard-lab gc` ─► manifest ─► kill, delete namespaces
//! ```
//!
//! The lab only ever creates and deletes named namespaces in the host namespace; every link, address,
//! route and sysctl is made inside a lab namespace, and nothing routes out of the lab. Pods are routed
//! behind their node (Calico-style), so all pod traffic crosses the node's netfilter, as on a real node.
//! Building a lab needs root and iproute2 ([`preflight`]).

pub mod balance;
pub mod cgroups;
pub mod checks;
pub mod cluster;
pub mod cluster_demo;
pub mod command;
pub mod demo;
pub mod deployed;
pub mod error;
pub mod kube;
pub mod lab;
pub mod layout;
pub mod long_lived;
mod members;
pub mod names;
pub mod netns;
pub mod options;
mod place;
mod pods;
pub mod preflight;
pub mod probe;
mod registry;
pub mod relay;
mod script;
pub mod serve;
pub mod signals;
pub mod state;
mod summary;
mod supervisor;
pub mod teardown;
pub mod traffic;

pub use cluster::ClusterDescription;
pub use deployed::Deployed;
pub use error::{LabError, Result};
pub use lab::Lab;
pub use layout::{LabBalancer, LabClient, LabNode, LabPod, Layout};
pub use options::LabOptions;
pub use place::Place;
pub use probe::{ProbeResult, ProbeTally, Proto, probe, probe_many};
pub use signals::install_teardown_on_signal;
pub use supervisor::ChildHandle;
