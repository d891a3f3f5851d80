//! The control plane's command lines (pure): addresses and certificate paths ─► argv for etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler.
//!
//! ```text
//! etcd                      127.0.0.1:<etcd port> (client), data in <lab>/etcd, no fsync (a lab)
//! kube-apiserver            <address>:6443, RBAC + Node authorization, NodeRestriction, SA tokens
//!                           signed by pki/service-account.key, kubelets reached by InternalIP
//! kube-controller-manager   every controller but those needing a cloud or allocating pod CIDRs
//!                           (the lab sets each Node's podCIDR itself); signs CSRs with the CA
//! kube-scheduler            default profile
//! ```
//!
//! The same argv serve a full lab cluster (inside `<id>-cp`) and a bare API server on the host's
//! loopback for the cluster suites (`BareApiServer`), which start only etcd and kube-apiserver.

use std::{net::Ipv4Addr, path::Path};

use super::{
    binaries::K8sBinaries,
    pki::Pki,
    spec::{CLUSTER_CIDR, SERVICE_CIDR},
};

/// Where the API server listens and what it advertises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiAddress {
    /// The address it binds and advertises (the `kubernetes` Service's endpoint).
    pub ip: Ipv4Addr,
    /// Its secure port.
    pub port: u16,
    /// etcd's client port (on 127.0.0.1).
    pub etcd_port: u16,
}

fn arg(key: &str, value: impl std::fmt::Display) -> String {
    format!("--{key}={value}")
}

/// etcd, serving only on loopback.
pub fn etcd(bin: &K8sBinaries, data_dir: &Path, address: ApiAddress) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", address.etcd_port);
    let peer = format!("http://127.0.0.1:{}", address.etcd_port + 1);
    vec![
        bin.path("etcd").display().to_string(),
        arg("name", "switchyard-lab"),
        arg("data-dir", data_dir.display()),
        arg("listen-client-urls", &client),
        arg("advertise-client-urls", &client),
        arg("listen-peer-urls", &peer),
        arg("initial-advertise-peer-urls", &peer),
        arg("initial-cluster", format!("switchyard-lab={peer}")),
        // NB: a lab's data is thrown away; fsync would only slow every write.
        "--unsafe-no-fsync".to_owned(),
        arg("log-level", "warn"),
    ]
}

/// kube-apiserver with RBAC (and Node authorization), admission as a real cluster has it.
pub fn apiserver(bin: &K8sBinaries, pki: &Pki, address: ApiAddress) -> Vec<String> {
    let path = |name: &str| pki.path(name).display().to_string();
    vec![
        bin.path("kube-apiserver").display().to_string(),
        arg("etcd-servers", format!("http://127.0.0.1:{}", address.etcd_port)),
        arg("bind-address", address.ip),
        arg("advertise-address", address.ip),
        arg("secure-port", address.port),
        arg("service-cluster-ip-range", SERVICE_CIDR),
        arg("service-node-port-range", "30000-32767"),
        arg("authorization-mode", "Node,RBAC"),
        arg("enable-admission-plugins", "NodeRestriction"),
        arg("allow-privileged", "true"),
        arg("client-ca-file", path("ca.crt")),
        arg("tls-cert-file", path("apiserver.crt")),
        arg("tls-private-key-file", path("apiserver.key")),
        arg("kubelet-client-certificate", path("apiserver-kubelet-client.crt")),
        arg("kubelet-client-key", path("apiserver-kubelet-client.key")),
        // Lab nodes have no DNS names the API server could resolve.
        arg("kubelet-preferred-address-types", "InternalIP"),
        arg("service-account-key-file", path("service-account.pub")),
        arg("service-account-signing-key-file", path("service-account.key")),
        arg(
            "service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
        ),
        arg("api-audiences", "https://kubernetes.default.svc.cluster.local"),
        arg("profiling", "false"),
        arg("v", "1"),
    ]
}

/// kube-controller-manager: no cloud, no pod-CIDR allocation (the lab sets each Node's podCIDR).
pub fn controller_manager(bin: &K8sBinaries, pki: &Pki, kubeconfig: &Path) -> Vec<String> {
    let path = |name: &str| pki.path(name).display().to_string();
    let kubeconfig = kubeconfig.display().to_string();
    vec![
        bin.path("kube-controller-manager").display().to_string(),
        arg("kubeconfig", &kubeconfig),
        arg("authentication-kubeconfig", &kubeconfig),
        arg("authorization-kubeconfig", &kubeconfig),
        arg("bind-address", "127.0.0.1"),
        arg("leader-elect", "false"),
        arg("use-service-account-credentials", "true"),
        arg("cluster-cidr", CLUSTER_CIDR),
        arg("service-cluster-ip-range", SERVICE_CIDR),
        arg("allocate-node-cidrs", "false"),
        arg("cluster-signing-cert-file", path("ca.crt")),
        arg("cluster-signing-key-file", path("ca.key")),
        arg("root-ca-file", path("ca.crt")),
        arg("service-account-private-key-file", path("service-account.key")),
        arg(
            "controllers",
            "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
        ),
        // A stopped kubelet's Node goes NotReady within 20 s (the life-cycle test stops one).
        arg("node-monitor-grace-period", "20s"),
        arg("v", "1"),
    ]
}

/// kube-scheduler with its default profile.
pub fn scheduler(bin: &K8sBinaries, kubeconfig: &Path) -> Vec<String> {
    let kubeconfig = kubeconfig.display().to_string();
    vec![
        bin.path("kube-scheduler").display().to_string(),
        arg("kubeconfig", &kubeconfig),
        arg("authentication-kubeconfig", &kubeconfig),
        arg("authorization-kubeconfig", &kubeconfig),
        arg("bind-address", "127.0.0.1"),
        arg("leader-elect", "false"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin() -> K8sBinaries {
        K8sBinaries::unchecked(Path::new("/k8s"))
    }

    #[test]
    fn the_api_server_authorizes_with_rbac_and_reaches_kubelets_by_internal_ip() {
        let address = ApiAddress {
            ip: Ipv4Addr::new(192, 168, 30, 10),
            port: 6443,
            etcd_port: 2379,
        };
        let argv = apiserver(&bin(), &Pki::open(Path::new("/pki")), address);
        assert_eq!(argv[0], "/k8s/kube-apiserver");
        for expected in [
            "--authorization-mode=Node,RBAC",
            "--advertise-address=192.168.30.10",
            "--etcd-servers=http://127.0.0.1:2379",
            "--kubelet-preferred-address-types=InternalIP",
            "--client-ca-file=/pki/ca.crt",
            "--service-cluster-ip-range=10.96.0.0/12",
        ] {
            assert!(argv.iter().any(|a| a == expected), "{expected} missing: {argv:?}");
        }
    }

    #[test]
    fn the_controller_manager_leaves_pod_cidrs_to_the_lab() {
        let argv = controller_manager(&bin(), &Pki::open(Path::new("/pki")), Path::new("/kc"));
        assert!(argv.contains(&"--allocate-node-cidrs=false".to_owned()));
        assert!(argv.iter().any(|a| a.starts_with("--controllers=*,-nodeipam")));
    }
}
