//! What failed at a process edge.

use std::net::SocketAddr;
use std::path::PathBuf;

/// A failure of one of the shared process edges.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file named by `--kubeconfig` could not be read or used.
    #[error("the kubeconfig {} could not be used (check it, or pass another with --kubeconfig): {cause}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The innermost cause, once.
        cause: String,
    },
    /// No flag was given and neither the pod's service account nor a kubeconfig could be used.
    #[error(
        "no Kubernetes client configuration: {pod}; {tried} could not be used ({cause}). Pass --kubeconfig \
         FILE or set KUBECONFIG"
    )]
    NoClientConfig {
        /// Why the in-cluster configuration was not used.
        pod: &'static str,
        /// Which kubeconfig was tried.
        tried: String,
        /// The innermost cause, once.
        cause: String,
    },
    /// A configuration was found but no client could be built from it (TLS, proxy settings).
    #[error("building the Kubernetes client: {cause}")]
    Client {
        /// The innermost cause, once.
        cause: String,
    },
    /// `--metrics-bind` could not be bound (taken, or not an address of this host).
    #[error("binding {addr} for /healthz, /readyz and /metrics: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("installing the SIGTERM and SIGINT handlers: {0}")]
    Signals(#[source] std::io::Error),
}
