//! The topology summary `switchyard-lab up` prints: [`Layout`] ─► one line per namespace.

use std::fmt::Write as _;

use crate::layout::Layout;

impl Layout {
    /// A human-readable summary: fabric, client and its routes, the balancer, every node with its pods.
    pub fn summary(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "  fabric  {:<16} {} on bridge",
            self.fabric_netns, self.fabric_subnet
        );
        let client = &self.client;
        let _ = writeln!(text, "  client  {:<16} {}", client.netns, client.ip);
        for (dst, via) in &client.routes {
            let _ = writeln!(text, "            route {dst} via {via}");
        }
        if let Some(balancer) = &self.balancer {
            let _ = writeln!(text, "  balancer {:<15} {}", balancer.netns, balancer.ip);
        }
        for node in &self.nodes {
            let cidrs: Vec<String> = node.pod_cidrs.iter().map(ToString::to_string).collect();
            let zone = node.zone.as_deref().unwrap_or("-");
            let _ = writeln!(
                text,
                "  node    {:<16} {} {} zone {zone} pods {}",
                node.netns,
                node.name,
                node.ip,
                cidrs.join(",")
            );
            for pod in self.pods.iter().filter(|pod| pod.node == node.name) {
                let ports: Vec<String> = pod
                    .tcp_ports
                    .iter()
                    .map(|p| format!("{p}/tcp"))
                    .chain(pod.udp_ports.iter().map(|p| format!("{p}/udp")))
                    .chain(pod.echo_ports.iter().map(|p| format!("{p}/echo")))
                    .collect();
                let kind = if pod.host_network { " (host network)" } else { "" };
                let _ = writeln!(
                    text,
                    "    pod   {:<16} {} {} {}{kind}",
                    pod.netns,
                    pod.name,
                    pod.ip,
                    ports.join(" ")
                );
            }
        }
        text
    }
}
