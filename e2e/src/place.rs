//! Where in a lab something runs: [`Place`] (node, pod, client, balancer, fabric) ─► `Lab::netns` ─► a
//! namespace.

use std::fmt;

/// Where in the lab something runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// A node's namespace, by node name.
    Node(String),
    /// A pod's namespace, by pod name (host-network pods: their node's namespace).
    Pod(String),
    /// The external client.
    Client,
    /// The outside load balancer's host (a lab built with `LabOptions::balancer_ip`).
    Balancer,
    /// The fabric (the bridge's namespace).
    Fabric,
}

impl Place {
    /// A node by name.
    pub fn node(name: impl Into<String>) -> Self {
        Place::Node(name.into())
    }

    /// A pod by name.
    pub fn pod(name: impl Into<String>) -> Self {
        Place::Pod(name.into())
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Node(name) => write!(f, "node/{name}"),
            Place::Pod(name) => write!(f, "pod/{name}"),
            Place::Client => f.write_str("client"),
            Place::Balancer => f.write_str("balancer"),
            Place::Fabric => f.write_str("fabric"),
        }
    }
}
