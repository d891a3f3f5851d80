//! The configuration files of a lab cluster (pure): spec ─► containerd, kubelet, CNI, kubeconfig text.
//!
//! ```text
//! node dir D (bound over the default paths inside the node's mount namespace, see node.rs)
//!   D/containerd.toml   CRI v1, runc (cgroupfs), overlayfs, pause 3.10.2, restrict_oom_score_adj
//!   D/kubelet.yaml      cgroup v1 accepted, cgroupfs under the node's own cgroup root, oomScoreAdj 0
//!   D/cni-conf/10-switchyard-lab.conflist   bridge cni0 + host-local (the node's pod CIDR) + portmap
//! <lab>/kubeconfig/<identity>   one per client certificate, all naming the API server's real address
//! ```
//!
//! What this machine needs (../shared/k8s/README.md): root here lacks CAP_SYS_RESOURCE, so nothing may
//! lower an OOM score (containerd `restrict_oom_score_adj`, kubelet `oomScoreAdj: 0`); cgroups are
//! v1, which a v1.36 kubelet accepts only with `failCgroupV1: false` and the cgroupfs driver.

use std::{net::Ipv4Addr, path::Path};

use super::spec::{CLUSTER_DOMAIN, KubeNodeSpec};

/// The sandbox image a v1.36 kubelet expects.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// The CNI network's name.
pub const CNI_NETWORK: &str = "switchyard-lab";
/// The kubelet's healthz port (loopback of the node).
pub const KUBELET_HEALTHZ_PORT: u16 = 10248;

/// containerd's configuration for one node; every path is the default one, which the node's mount
/// namespace binds to its own directory.
pub fn containerd_toml() -> String {
    format!(
        r#"# containerd for one lab node (written by switchyard-lab; the paths are the node's own binds)
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: a sandbox asked to run at -998 would fail to start.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"#
    )
}

/// The kubelet's configuration for `node`, trusting client certificates signed by `ca`.
pub fn kubelet_yaml(
    node: &KubeNodeSpec,
    ca: &Path,
    resolv_conf: &Path,
    cluster_dns: Option<Ipv4Addr>,
) -> String {
    let dns = cluster_dns.map_or_else(String::new, |ip| format!("clusterDNS: [{ip}]\n"));
    format!(
        r#"# kubelet for lab node {name} (written by switchyard-lab)
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroups v1, no CAP_SYS_RESOURCE.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
oomScoreAdj: 0
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {KUBELET_HEALTHZ_PORT}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
clusterDomain: {CLUSTER_DOMAIN}
{dns}resolvConf: {resolv}
failSwapOn: false
# Images are imported, never pulled: keep them whatever the disk says.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 4s
"#,
        name = node.name,
        cgroup = node.cgroup,
        ip = node.ip,
        ca = ca.display(),
        resolv = resolv_conf.display(),
    )
}

/// The CNI configuration of `node`: a bridge with the node's pod CIDR, as kubenet did. Hairpin mode
/// lets a pod reach itself through a Service.
pub fn cni_conflist(node: &KubeNodeSpec) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "{CNI_NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{cidr}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#,
        cidr = node.pod_cidr
    )
}

/// A kubeconfig for one client certificate.
pub fn kubeconfig(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: switchyard-lab
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: switchyard-lab
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: switchyard-lab
  context:
    cluster: switchyard-lab
    user: switchyard-lab
current-context: switchyard-lab
"#,
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::kube::spec::KubeSpec;

    fn node_b() -> KubeNodeSpec {
        KubeSpec::new("sy00aa", Path::new("/tmp/lab/sy00aa"), 2).nodes[1].clone()
    }

    #[test]
    fn the_kubelet_runs_on_cgroup_v1_with_its_own_root_and_no_oom_adjustment() {
        let text = kubelet_yaml(&node_b(), Path::new("/ca.crt"), Path::new("/r.conf"), None);
        for line in [
            "failCgroupV1: false",
            "cgroupDriver: cgroupfs",
            "cgroupRoot: /switchyard-lab-sy00aa-node-b",
            "oomScoreAdj: 0",
            "address: 192.168.30.12",
            "x509: {clientCAFile: /ca.crt}",
        ] {
            assert!(text.lines().any(|l| l.trim() == line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("clusterDNS"));
        let with_dns = kubelet_yaml(
            &node_b(),
            Path::new("/c"),
            Path::new("/r"),
            Some(Ipv4Addr::new(10, 96, 0, 10)),
        );
        assert!(with_dns.contains("clusterDNS: [10.96.0.10]"));
        let parsed: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(parsed["kind"], "KubeletConfiguration");
    }

    #[test]
    fn containerd_restricts_oom_scores_and_uses_cgroupfs() {
        let text = containerd_toml();
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains("SystemdCgroup = false"));
        assert!(text.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")));
    }

    #[test]
    fn the_cni_configuration_is_json_with_the_nodes_pod_cidr() {
        let parsed: serde_json::Value = serde_json::from_str(&cni_conflist(&node_b())).unwrap();
        assert_eq!(
            parsed["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.1.0/24"
        );
        assert_eq!(parsed["plugins"][0]["hairpinMode"], true);
    }

    #[test]
    fn a_kubeconfig_names_its_files() {
        let text = kubeconfig(
            "https://192.168.30.10:6443",
            &PathBuf::from("/p/ca.crt"),
            &PathBuf::from("/p/a.crt"),
            &PathBuf::from("/p/a.key"),
        );
        let parsed: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            parsed["clusters"][0]["cluster"]["server"],
            "https://192.168.30.10:6443"
        );
        assert_eq!(parsed["users"][0]["user"]["client-key"], "/p/a.key");
    }
}
