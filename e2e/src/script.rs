//! How a [`Layout`] is built: layout ─► ordered stages of `ip -batch` scripts and sysctls (pure).
//!
//! ```text
//! stage 1  every netns   sysctls: no IPv6, rp_filter 0, no redirects, ip_forward (1 on nodes only)
//! stage 2  fabric        lo up, bridge br0
//! stage 3  nodes, client eth0 (veth, peer in the fabric), address; pod veths (peer in the pod), /32 routes,
//!                        other nodes' pod CIDRs via their InternalIPs; client routes to services via a node
//!          balancer      eth0 and its address only (it reaches the nodes' own addresses on the fabric)
//! stage 4  fabric        ports enslaved to br0 and up
//!          pods          address /32, default via 169.254.1.1 onlink, permanent neighbour for the gateway
//!          nodes         proxy_arp=1, proxy_delay=0 on pod veths
//! ```
//!
//! Actions of one stage touch different namespaces (or different objects) and may run in parallel;
//! stages run in order. Links are only ever created inside lab namespaces (`ip -n <netns>`), never in
//! the host's. Pods are routed, not bridged, so every pod packet crosses its node's netfilter.

use std::{fmt, net::Ipv4Addr};

use crate::{
    layout::{LabNode, Layout},
    names::{self, BRIDGE, POD_GATEWAY, POD_GATEWAY_MAC, UPLINK},
};

/// One thing to do in one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `ip -n <netns> -batch -` with these lines.
    Ip { netns: String, lines: Vec<String> },
    /// Writes under `/proc/sys/` from a thread inside `netns`: (path below /proc/sys, value).
    Sysctl {
        netns: String,
        settings: Vec<(String, String)>,
    },
}

/// The stages that build a lab, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BuildScript {
    pub stages: Vec<Vec<Action>>,
}

impl BuildScript {
    /// The script that builds `layout` once its namespaces exist.
    pub fn for_layout(layout: &Layout) -> Self {
        let mut stage1 = vec![namespace_sysctls(&layout.fabric_netns, false)];
        stage1.push(namespace_sysctls(&layout.client.netns, false));
        stage1.extend(
            layout
                .balancer
                .iter()
                .map(|balancer| namespace_sysctls(&balancer.netns, false)),
        );
        stage1.extend(
            layout
                .nodes
                .iter()
                .map(|node| namespace_sysctls(&node.netns, true)),
        );
        stage1.extend(routed_pods(layout).map(|pod| namespace_sysctls(&pod.netns, false)));

        let stage2 = vec![Action::Ip {
            netns: layout.fabric_netns.clone(),
            lines: vec![
                "link set lo up".into(),
                format!("link add {BRIDGE} type bridge forward_delay 0 stp_state 0"),
                format!("link set {BRIDGE} up"),
            ],
        }];

        let mut stage3: Vec<Action> = layout
            .nodes
            .iter()
            .map(|node| node_uplink(layout, node))
            .collect();
        stage3.push(client_uplink(layout));
        stage3.extend(layout.balancer.as_ref().map(|balancer| Action::Ip {
            netns: balancer.netns.clone(),
            lines: fabric_host_uplink(layout, balancer.ip, names::BALANCER_FABRIC_PORT),
        }));

        let mut stage4 = vec![fabric_attach(layout)];
        stage4.extend(routed_pods(layout).map(|pod| Action::Ip {
            netns: pod.netns.clone(),
            lines: vec![
                "link set lo up".into(),
                format!("addr add {}/32 dev {UPLINK}", pod.ip),
                format!("link set {UPLINK} up"),
                format!("neigh replace {POD_GATEWAY} lladdr {POD_GATEWAY_MAC} dev {UPLINK} nud permanent"),
                format!("route add default via {POD_GATEWAY} dev {UPLINK} onlink"),
            ],
        }));
        stage4.extend(
            layout
                .nodes
                .iter()
                .filter_map(|node| pod_veth_sysctls(layout, node)),
        );

        BuildScript {
            stages: vec![stage1, stage2, stage3, stage4],
        }
    }
}

fn routed_pods(layout: &Layout) -> impl Iterator<Item = &crate::layout::LabPod> {
    layout.pods.iter().filter(|pod| !pod.host_network)
}

fn namespace_sysctls(netns: &str, forward: bool) -> Action {
    let mut settings: Vec<(String, String)> = Vec::new();
    for scope in ["all", "default"] {
        settings.push((format!("net/ipv6/conf/{scope}/disable_ipv6"), "1".into()));
        settings.push((format!("net/ipv4/conf/{scope}/rp_filter"), "0".into()));
        settings.push((format!("net/ipv4/conf/{scope}/send_redirects"), "0".into()));
        settings.push((format!("net/ipv4/conf/{scope}/accept_redirects"), "0".into()));
    }
    settings.push((
        "net/ipv4/ip_forward".into(),
        if forward { "1" } else { "0" }.into(),
    ));
    Action::Sysctl {
        netns: netns.to_owned(),
        settings,
    }
}

fn node_uplink(layout: &Layout, node: &LabNode) -> Action {
    let prefix = layout.fabric_subnet.prefix_len();
    let mut lines = vec![
        "link set lo up".to_owned(),
        format!(
            "link add {UPLINK} type veth peer name {} netns {}",
            node.fabric_port, layout.fabric_netns
        ),
        format!("addr add {}/{prefix} dev {UPLINK}", node.ip),
        format!("link set {UPLINK} up"),
    ];
    for pod in routed_pods(layout).filter(|pod| pod.node == node.name) {
        let Some(veth) = &pod.node_veth else { continue };
        lines.push(format!(
            "link add {veth} address {POD_GATEWAY_MAC} type veth peer name {UPLINK} netns {}",
            pod.netns
        ));
        lines.push(format!("link set {veth} up"));
        lines.push(format!("route add {}/32 dev {veth}", pod.ip));
    }
    for other in layout.nodes.iter().filter(|other| other.name != node.name) {
        for cidr in &other.pod_cidrs {
            lines.push(format!("route add {cidr} via {} dev {UPLINK}", other.ip));
        }
    }
    for (ip, owner) in layout
        .stray_pods()
        .into_iter()
        .filter(|(_, owner)| owner.name != node.name)
    {
        lines.push(format!("route add {ip}/32 via {} dev {UPLINK}", owner.ip));
    }
    // Like a real node, a default route: without one, traffic to a Service IP has no route before the
    // agent's DNAT (locally generated) or before FORWARD (a REJECT for a Service without endpoints).
    // The fabric has no router, so nothing it carries leaves the lab.
    lines.push(format!("route add default dev {UPLINK}"));
    Action::Ip {
        netns: node.netns.clone(),
        lines,
    }
}

/// A host outside the cluster on the fabric: its uplink and address, nothing routed beyond.
fn fabric_host_uplink(layout: &Layout, ip: Ipv4Addr, fabric_port: &str) -> Vec<String> {
    vec![
        "link set lo up".to_owned(),
        format!(
            "link add {UPLINK} type veth peer name {fabric_port} netns {}",
            layout.fabric_netns
        ),
        format!("addr add {ip}/{} dev {UPLINK}", layout.fabric_subnet.prefix_len()),
        format!("link set {UPLINK} up"),
    ]
}

fn client_uplink(layout: &Layout) -> Action {
    let client = &layout.client;
    let mut lines = fabric_host_uplink(layout, client.ip, names::CLIENT_FABRIC_PORT);
    for (dst, via) in &client.routes {
        if let Ok(node) = layout.node(via) {
            lines.push(format!("route add {dst} via {} dev {UPLINK}", node.ip));
        }
    }
    Action::Ip {
        netns: client.netns.clone(),
        lines,
    }
}

fn fabric_attach(layout: &Layout) -> Action {
    let ports = layout
        .nodes
        .iter()
        .map(|node| node.fabric_port.as_str())
        .chain([names::CLIENT_FABRIC_PORT])
        .chain(layout.balancer.iter().map(|_| names::BALANCER_FABRIC_PORT));
    let mut lines = Vec::new();
    for port in ports {
        lines.push(format!("link set {port} master {BRIDGE}"));
        lines.push(format!("link set {port} up"));
    }
    Action::Ip {
        netns: layout.fabric_netns.clone(),
        lines,
    }
}

fn pod_veth_sysctls(layout: &Layout, node: &LabNode) -> Option<Action> {
    let settings: Vec<(String, String)> = routed_pods(layout)
        .filter(|pod| pod.node == node.name)
        .filter_map(|pod| pod.node_veth.as_ref())
        .flat_map(|veth| {
            [
                (format!("net/ipv4/conf/{veth}/proxy_arp"), "1".to_owned()),
                (format!("net/ipv4/neigh/{veth}/proxy_delay"), "0".to_owned()),
            ]
        })
        .collect();
    (!settings.is_empty()).then(|| Action::Sysctl {
        netns: node.netns.clone(),
        settings,
    })
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Ip { netns, lines } => {
                for line in lines {
                    writeln!(f, "ip -n {netns} {line}")?;
                }
            }
            Action::Sysctl { netns, settings } => {
                for (key, value) in settings {
                    writeln!(f, "sysctl -n {netns} {key}={value}")?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for BuildScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, stage) in self.stages.iter().enumerate() {
            writeln!(f, "# stage {}", index + 1)?;
            for action in stage {
                write!(f, "{action}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster::ClusterDescription, options::LabOptions};

    fn script() -> String {
        let description = ClusterDescription::from_yaml(include_str!("../testdata/cluster.yaml")).unwrap();
        let layout = Layout::plan("sy0001", &description, &LabOptions::with_binary("/bin/false")).unwrap();
        BuildScript::for_layout(&layout).to_string()
    }

    #[test]
    fn pods_are_routed_behind_their_node() {
        let script = script();
        for expected in [
            "ip -n sy0001-node-a link add pv0 address ee:ee:ee:ee:ee:ee type veth peer name eth0 netns sy0001-pod-web-a1",
            "ip -n sy0001-node-a route add 10.244.1.10/32 dev pv0",
            "ip -n sy0001-node-a route add 10.244.2.0/24 via 192.168.10.12 dev eth0",
            "ip -n sy0001-node-a route add default dev eth0",
            "ip -n sy0001-pod-web-a1 addr add 10.244.1.10/32 dev eth0",
            "ip -n sy0001-pod-web-a1 route add default via 169.254.1.1 dev eth0 onlink",
            "sysctl -n sy0001-node-a net/ipv4/conf/pv0/proxy_arp=1",
            "sysctl -n sy0001-node-a net/ipv4/ip_forward=1",
            "sysctl -n sy0001-pod-web-a1 net/ipv4/ip_forward=0",
        ] {
            assert!(script.contains(expected), "missing {expected:?} in\n{script}");
        }
    }

    #[test]
    fn nodes_and_client_share_the_fabric() {
        let script = script();
        for expected in [
            "ip -n sy0001-fabric link add br0 type bridge forward_delay 0 stp_state 0",
            "ip -n sy0001-node-b link add eth0 type veth peer name nd1 netns sy0001-fabric",
            "ip -n sy0001-node-b addr add 192.168.10.12/24 dev eth0",
            "ip -n sy0001-client addr add 192.168.10.200/24 dev eth0",
            "ip -n sy0001-client route add 10.96.0.10/32 via 192.168.10.11 dev eth0",
            "ip -n sy0001-fabric link set cl master br0",
        ] {
            assert!(script.contains(expected), "missing {expected:?} in\n{script}");
        }
        assert!(
            !script.contains("sy0001-node-b link add pv1"),
            "host-network pods get no veth"
        );
    }

    #[test]
    fn a_balancer_is_one_more_host_on_the_fabric_with_no_routes() {
        let description = ClusterDescription::from_yaml(include_str!("../testdata/cluster.yaml")).unwrap();
        let mut options = LabOptions::with_binary("/bin/false");
        assert!(!script().contains("balancer"));
        options.balancer_ip = Some(Ipv4Addr::new(192, 168, 10, 250));
        let layout = Layout::plan("sy0001", &description, &options).unwrap();
        let script = BuildScript::for_layout(&layout).to_string();
        for expected in [
            "sysctl -n sy0001-balancer net/ipv4/ip_forward=0",
            "ip -n sy0001-balancer link add eth0 type veth peer name lb netns sy0001-fabric",
            "ip -n sy0001-balancer addr add 192.168.10.250/24 dev eth0",
            "ip -n sy0001-fabric link set lb master br0",
        ] {
            assert!(script.contains(expected), "missing {expected:?} in\n{script}");
        }
        assert!(
            !script.contains("ip -n sy0001-balancer route"),
            "the balancer reaches only the fabric:\n{script}"
        );
    }

    #[test]
    fn every_action_names_a_lab_namespace() {
        for line in script().lines().filter(|line| !line.starts_with('#')) {
            let netns = line.split_whitespace().nth(2).unwrap();
            assert!(netns.starts_with("sy0001-"), "{line}");
        }
    }
}
