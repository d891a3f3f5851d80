//! A real Kubernetes cluster in the lab: the v1.36 control plane and kubelets with containerd, each
//! node in its own network and mount namespace, for running Switchyard as its users do.
//!
//! ```text
//! $SWITCHYARD_K8S_BIN ─► K8sBinaries ─┐      target/images/*.tar (scripts/image/build.sh) ─┐
//! KubeSpec (pure: names, addresses) ──┼─► KubeCluster::up ─► <id>-cp: etcd, apiserver, kcm, scheduler
//! files.rs (pure: containerd, kubelet, CNI, kubeconfig) ──┘     <id>-node-*: holder, containerd
//!                                                               (images imported), kubelet, (kube-proxy)
//!                                                               <id>-client; host relay to the API
//! tests / `switchyard-lab kube up` ─► kubectl, kube::Client, probes from pods, nodes and the client
//! prometheus.rs: a real Prometheus in <id>-cp scraping what the monitoring component's PodMonitors select
//! drop / `kube down ID` / signal ─► teardown: namespaces, node cgroups (pods), sysctls, mount points
//! ```

pub mod binaries;
pub mod cluster;
pub mod control_plane;
pub mod files;
pub mod flows;
pub mod hold;
pub mod install;
pub mod node;
pub mod pki;
pub mod prometheus;
pub mod spec;
pub mod traffic;

pub use binaries::{K8S_BIN_ENV, K8sBinaries};
pub use cluster::{KubeCluster, KubeOptions};
pub use spec::KubeSpec;
