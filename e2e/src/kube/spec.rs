//! The shape of a lab cluster (pure): lab id + node count ─► names, addresses, CIDRs, directories.
//!
//! ```text
//! <id>-fabric   bridge br0 ── eth0 of the control plane, every node and the client (192.168.30.0/24)
//! <id>-cp       192.168.30.10: etcd (loopback), kube-apiserver :6443, controller-manager, scheduler
//! <id>-node-a   192.168.30.11, pod CIDR 10.244.0.0/24 on bridge cni0; other nodes' pod CIDRs via them,
//!               default via the control plane (a gateway that forwards nothing)
//! <id>-node-b   192.168.30.12, pod CIDR 10.244.1.0/24 …
//! <id>-client   192.168.30.200: Service, external and load-balancer IPs routed via node-a
//! ```
//!
//! Every address is inside the lab's namespaces; 203.0.113.0/24 (where this machine's package
//! registries resolve) is never used or routed.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use ipnet::Ipv4Net;

/// The API server's secure port.
pub const APISERVER_PORT: u16 = 6443;
/// The Service CIDR; its first address is the `kubernetes` Service.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The cluster's pod CIDR; node `i` gets `10.244.i.0/24`.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// External IPs and load-balancer IPs the tests give Services (TEST-NET-2, routed via the gateway node).
pub const EXTERNAL_CIDR: &str = "198.51.100.0/24";
/// The cluster DNS domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One network namespace and the `ip -batch` lines to run in it.
pub type BatchLines = (String, Vec<String>);

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeNodeSpec {
    /// The Node's name (`node-a`, `node-b`, …).
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// Its InternalIP on the fabric.
    pub ip: Ipv4Addr,
    /// Its pod CIDR (set on the Node before the kubelet registers).
    pub pod_cidr: Ipv4Net,
    /// The kubelet's cgroup root (one per node, in every cgroup v1 hierarchy).
    pub cgroup: String,
    /// Where its kubelet, containerd, CNI configuration and logs live.
    pub dir: PathBuf,
    /// The fabric's port for it.
    pub fabric_port: String,
}

/// The whole cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeSpec {
    /// The lab id.
    pub id: String,
    /// The lab's state directory.
    pub dir: PathBuf,
    /// The fabric namespace.
    pub fabric_netns: String,
    /// The control plane's namespace.
    pub cp_netns: String,
    /// The control plane's address.
    pub cp_ip: Ipv4Addr,
    /// The outside client's namespace.
    pub client_netns: String,
    /// The outside client's address.
    pub client_ip: Ipv4Addr,
    /// The nodes, in order (the first is the client's gateway).
    pub nodes: Vec<KubeNodeSpec>,
    /// The fabric subnet.
    pub fabric: Ipv4Net,
}

impl KubeSpec {
    /// The cluster of lab `id` with `node_count` nodes (at most 26: node-a … node-z).
    pub fn new(id: &str, dir: &Path, node_count: usize) -> KubeSpec {
        let node_count = node_count.min(26);
        let fabric = Ipv4Net::new(Ipv4Addr::new(192, 168, 30, 0), 24).unwrap_or_default();
        let nodes = (0..node_count)
            .map(|index| {
                let letter = char::from(b'a' + u8::try_from(index).unwrap_or(0));
                let name = format!("node-{letter}");
                let octet = u8::try_from(index).unwrap_or(0);
                KubeNodeSpec {
                    netns: format!("{id}-{name}"),
                    ip: Ipv4Addr::new(192, 168, 30, 11 + octet),
                    pod_cidr: Ipv4Net::new(Ipv4Addr::new(10, 244, octet, 0), 24).unwrap_or_default(),
                    cgroup: format!("switchyard-lab-{id}-{name}"),
                    dir: dir.join("nodes").join(&name),
                    fabric_port: format!("nd{index}"),
                    name,
                }
            })
            .collect();
        KubeSpec {
            id: id.to_owned(),
            dir: dir.to_path_buf(),
            fabric_netns: format!("{id}-fabric"),
            cp_netns: format!("{id}-cp"),
            cp_ip: Ipv4Addr::new(192, 168, 30, 10),
            client_netns: format!("{id}-client"),
            client_ip: Ipv4Addr::new(192, 168, 30, 200),
            nodes,
            fabric,
        }
    }

    /// Every namespace the cluster creates.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names = vec![
            self.fabric_netns.clone(),
            self.cp_netns.clone(),
            self.client_netns.clone(),
        ];
        names.extend(self.nodes.iter().map(|node| node.netns.clone()));
        names
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&KubeNodeSpec> {
        self.nodes.iter().find(|node| node.name == name)
    }

    /// The `kubernetes` Service's ClusterIP (the Service CIDR's first address).
    pub fn kubernetes_service_ip() -> Ipv4Addr {
        Ipv4Addr::new(10, 96, 0, 1)
    }

    /// Where the certificates live.
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// The kubeconfig of identity `name` (admin, controller-manager, node-a, …).
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.dir.join("kubeconfig").join(name)
    }

    /// The `ip -batch` lines, per namespace, that build the topology once the namespaces exist, in
    /// two stages: the fabric's bridge first, then every member's uplink, address and routes.
    pub fn topology(&self) -> (Vec<BatchLines>, Vec<BatchLines>) {
        let bridge = vec![(
            self.fabric_netns.clone(),
            vec![
                "link set lo up".to_owned(),
                "link add br0 type bridge forward_delay 0 stp_state 0".to_owned(),
                "link set br0 up".to_owned(),
            ],
        )];
        let prefix = self.fabric.prefix_len();
        let mut members: Vec<(&str, &str, Ipv4Addr, Vec<String>)> = Vec::new();
        let mut cp_routes: Vec<String> = Vec::new();
        for node in &self.nodes {
            cp_routes.push(format!("route add {} via {}", node.pod_cidr, node.ip));
            let mut routes: Vec<String> = self
                .nodes
                .iter()
                .filter(|other| other.name != node.name)
                .map(|other| format!("route add {} via {}", other.pod_cidr, other.ip))
                .collect();
            // A node has a default gateway, as a real one does (the control plane, which forwards
            // nothing): traffic to a Service address is routed before netfilter can DNAT or REJECT it.
            routes.push(format!("route add default via {}", self.cp_ip));
            members.push((&node.netns, &node.fabric_port, node.ip, routes));
        }
        members.push((&self.cp_netns, "cp", self.cp_ip, cp_routes));
        let gateway = self.nodes.first().map(|node| node.ip);
        let client_routes: Vec<String> = gateway
            .map(|via| {
                vec![
                    format!("route add {SERVICE_CIDR} via {via}"),
                    format!("route add {EXTERNAL_CIDR} via {via}"),
                ]
            })
            .unwrap_or_default();
        members.push((&self.client_netns, "cl", self.client_ip, client_routes));

        let mut uplinks = Vec::new();
        let mut fabric_lines = Vec::new();
        for (netns, port, ip, routes) in members {
            let mut lines = vec![
                "link set lo up".to_owned(),
                format!("addr add {ip}/{prefix} dev eth0"),
                "link set eth0 up".to_owned(),
            ];
            lines.extend(routes);
            // NB: the veth is made from the fabric's side, its peer created straight in the member.
            fabric_lines.push(format!("link add {port} type veth peer name eth0 netns {netns}"));
            fabric_lines.push(format!("link set {port} master br0 up"));
            uplinks.push((netns.to_owned(), lines));
        }
        let mut first = bridge;
        if let Some((_, lines)) = first.first_mut() {
            lines.extend(fabric_lines);
        }
        (first, uplinks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_nodes_get_their_own_addresses_cidrs_and_routes() {
        let spec = KubeSpec::new("sy00aa", Path::new("/tmp/lab/sy00aa"), 2);
        assert_eq!(spec.nodes.len(), 2);
        let a = spec.node("node-a").unwrap();
        let b = spec.node("node-b").unwrap();
        assert_eq!(a.ip, Ipv4Addr::new(192, 168, 30, 11));
        assert_eq!(b.pod_cidr.to_string(), "10.244.1.0/24");
        assert_eq!(a.netns, "sy00aa-node-a");
        assert_eq!(a.cgroup, "switchyard-lab-sy00aa-node-a");
        assert_eq!(
            spec.namespaces(),
            [
                "sy00aa-fabric",
                "sy00aa-cp",
                "sy00aa-client",
                "sy00aa-node-a",
                "sy00aa-node-b"
            ]
        );
        let (fabric, members) = spec.topology();
        assert!(
            fabric[0]
                .1
                .contains(&"link add nd1 type veth peer name eth0 netns sy00aa-node-b".to_owned())
        );
        let node_a = &members
            .iter()
            .find(|(netns, _)| netns == "sy00aa-node-a")
            .unwrap()
            .1;
        assert!(node_a.contains(&"route add 10.244.1.0/24 via 192.168.30.12".to_owned()));
        assert!(
            !node_a.iter().any(|line| line.contains("10.244.0.0/24")),
            "no route to itself"
        );
        assert!(node_a.contains(&"route add default via 192.168.30.10".to_owned()));
        let cp = &members.iter().find(|(netns, _)| netns == "sy00aa-cp").unwrap().1;
        assert!(cp.contains(&"route add 10.244.0.0/24 via 192.168.30.11".to_owned()));
        let client = &members
            .iter()
            .find(|(netns, _)| netns == "sy00aa-client")
            .unwrap()
            .1;
        assert!(client.contains(&"route add 198.51.100.0/24 via 192.168.30.11".to_owned()));
    }

    #[test]
    fn nothing_is_routed_to_the_registries_range() {
        let spec = KubeSpec::new("sy00aa", Path::new("/x"), 3);
        let (fabric, members) = spec.topology();
        for (_, lines) in fabric.iter().chain(&members) {
            assert!(lines.iter().all(|line| !line.contains("203.0.113.")), "{lines:?}");
        }
    }

    #[test]
    fn a_control_plane_alone_has_no_node_and_routes_nothing_from_the_client() {
        let spec = KubeSpec::new("sy00aa", Path::new("/x"), 0);
        assert!(spec.nodes.is_empty());
        let (_, members) = spec.topology();
        let client = members
            .iter()
            .find(|(netns, _)| netns == "sy00aa-client")
            .unwrap();
        assert!(
            client.1.iter().all(|line| !line.starts_with("route")),
            "{client:?}"
        );
    }
}
