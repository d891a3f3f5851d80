//! Names the lab gives things: lab id ─► namespace names, interface names.
//!
//! ```text
//! lab id   sy1a2b                      ("sy" + 4 hex digits, unique per running lab)
//! netns    sy1a2b-fabric  sy1a2b-client  sy1a2b-balancer  sy1a2b-node-a  sy1a2b-pod-web-a1
//! links    fabric: br0, nd<i> (node i), cl (client), lb (balancer)   node: eth0, pv<j> (pod j)
//!          pod/client/balancer: eth0
//! ```
//!
//! Every namespace name starts with the lab id and a dash, which is how `gc --all` recognises
//! leftovers; interface names stay within the kernel's 15 characters.

use std::collections::BTreeSet;

/// The prefix of every lab id.
pub const ID_PREFIX: &str = "sy";
/// The longest namespace name the lab makes (a file name under /run/netns).
const MAX_NETNS_NAME: usize = 64;

/// The bridge in the fabric namespace.
pub const BRIDGE: &str = "br0";
/// The interface every node, pod and the client has towards its uplink.
pub const UPLINK: &str = "eth0";
/// The gateway address every pod routes through (answered by its node; Calico's choice).
pub const POD_GATEWAY: &str = "169.254.1.1";
/// The MAC address of every node-side pod veth, so pods can hold a permanent neighbour entry.
pub const POD_GATEWAY_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// A lab id from two random bytes.
pub fn lab_id(random: [u8; 2]) -> String {
    format!("{ID_PREFIX}{:02x}{:02x}", random[0], random[1])
}

/// True if `id` has the shape of a lab id.
pub fn is_lab_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX).is_some_and(|hex| {
        hex.len() == 4
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// The lab id a namespace name belongs to, if it looks like one of ours (`<id>-…`).
pub fn lab_id_of_netns(netns: &str) -> Option<&str> {
    let (id, rest) = netns.split_once('-')?;
    (is_lab_id(id) && !rest.is_empty()).then_some(id)
}

/// The fabric namespace.
pub fn fabric_netns(id: &str) -> String {
    format!("{id}-fabric")
}

/// The external client's namespace.
pub fn client_netns(id: &str) -> String {
    format!("{id}-client")
}

/// The outside load balancer's namespace (only in a lab asked for one).
pub fn balancer_netns(id: &str) -> String {
    format!("{id}-balancer")
}

/// The fabric-side port of node number `index`.
pub fn fabric_port(index: usize) -> String {
    format!("nd{index}")
}

/// The fabric-side port of the client.
pub const CLIENT_FABRIC_PORT: &str = "cl";

/// The fabric-side port of the load balancer.
pub const BALANCER_FABRIC_PORT: &str = "lb";

/// The node-side veth of the `index`-th pod on a node.
pub fn pod_veth(index: usize) -> String {
    format!("pv{index}")
}

/// Allocates unique, sanitised namespace names within one lab.
#[derive(Debug, Default)]
pub struct NetnsNames {
    taken: BTreeSet<String>,
}

impl NetnsNames {
    /// Starts with the fixed names of lab `id` taken.
    pub fn new(id: &str) -> Self {
        NetnsNames {
            taken: [fabric_netns(id), client_netns(id), balancer_netns(id)]
                .into_iter()
                .collect(),
        }
    }

    /// `<id>-<node>` when the node name starts with "node", else `<id>-node-<node>`.
    pub fn node(&mut self, id: &str, node: &str) -> String {
        let stem = sanitize(node);
        let stem = if stem.starts_with("node") {
            stem
        } else {
            format!("node-{stem}")
        };
        self.unique(id, &stem)
    }

    /// `<id>-pod-<pod>`.
    pub fn pod(&mut self, id: &str, pod: &str) -> String {
        self.unique(id, &format!("pod-{}", sanitize(pod)))
    }

    fn unique(&mut self, id: &str, stem: &str) -> String {
        let room = MAX_NETNS_NAME - id.len() - 1;
        let base: String = stem.chars().take(room.saturating_sub(4)).collect();
        let mut candidate = format!("{id}-{base}");
        let mut n = 1;
        while self.taken.contains(&candidate) {
            n += 1;
            candidate = format!("{id}-{base}-{n}");
        }
        self.taken.insert(candidate.clone());
        candidate
    }
}

/// Lowercase letters, digits, `-` and `.`; anything else becomes `-`.
fn sanitize(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "x".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let id = lab_id([0x1a, 0x2b]);
        assert_eq!(id, "sy1a2b");
        assert!(is_lab_id(&id));
        assert!(!is_lab_id("sy1A2b"));
        assert!(!is_lab_id("sy1a2"));
        assert_eq!(lab_id_of_netns("sy1a2b-node-a"), Some("sy1a2b"));
        assert_eq!(lab_id_of_netns("sy1a2b"), None);
        assert_eq!(lab_id_of_netns("other-node-a"), None);
    }

    #[test]
    fn namespace_names_are_unique_and_prefixed() {
        let mut names = NetnsNames::new("sy0001");
        assert_eq!(names.node("sy0001", "node-a"), "sy0001-node-a");
        assert_eq!(names.node("sy0001", "Worker_1"), "sy0001-node-worker-1");
        assert_eq!(names.pod("sy0001", "web-a1"), "sy0001-pod-web-a1");
        assert_eq!(names.pod("sy0001", "web-a1"), "sy0001-pod-web-a1-2");
        let long = names.pod("sy0001", &"x".repeat(300));
        assert!(long.len() <= MAX_NETNS_NAME);
        assert_eq!(names.node("sy0001", "fabric"), "sy0001-node-fabric");
    }

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        assert!(fabric_port(99_999).len() <= 15);
        assert!(pod_veth(999_999).len() <= 15);
    }
}
