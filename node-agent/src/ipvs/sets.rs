//! The ipsets of IPVS mode (pure): which sets exist, their types, how members are written, how
//! `ipset save` output is read, and the `ipset restore` batches that turn the kernel's sets into the
//! desired ones.
//!
//! ```text
//! render ─► DesiredSets { name ─► (SetKind, family, members) } ─┐
//! ipset save ─► parse_save ─► SavedSets { name ─► SavedSet } ───┴─► batches() ─► (add batch, remove batch)
//!                                       create missing sets, add new members │ del stale members, destroy stale sets
//! ```
//!
//! The sets are kube-proxy's (`KUBE-CLUSTER-IP`, `KUBE-LOOP-BACK`, ...) under our prefix, one per
//! family (`SWYD-` for IPv4, `SWYD-6-` for IPv6), plus two for the no-endpoint verdicts, which kube-proxy's
//! IPVS mode leaves to IPVS itself. Members are written exactly as `ipset save` prints them, so the diff
//! of desired against saved is a plain set difference.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use switchyard_api::{IpFamily, Protocol};

use crate::error::Error;

/// Prefix of every set the agent owns.
pub const PREFIX: &str = "SWYD-";

/// The ipset types IPVS mode uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// `hash:ip`.
    HashIp,
    /// `hash:ip,port`.
    HashIpPort,
    /// `hash:ip,port,ip`.
    HashIpPortIp,
    /// `hash:ip,port,net`.
    HashIpPortNet,
    /// `bitmap:port` (no family).
    BitmapPort,
}

impl SetKind {
    /// The type name ipset uses.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::HashIp => "hash:ip",
            Self::HashIpPort => "hash:ip,port",
            Self::HashIpPortIp => "hash:ip,port,ip",
            Self::HashIpPortNet => "hash:ip,port,net",
            Self::BitmapPort => "bitmap:port",
        }
    }
}

/// One set of IPVS mode (its name depends on the family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetId {
    /// ClusterIP,proto:port of every entry (masquerade of off-cluster sources; allowed by the filter).
    ClusterIp,
    /// externalIP,proto:port with externalTrafficPolicy Cluster (masqueraded).
    ExternalIp,
    /// externalIP,proto:port with externalTrafficPolicy Local (client IP kept).
    ExternalIpLocal,
    /// Every LoadBalancer IP,proto:port.
    LoadBalancer,
    /// LoadBalancer IP,proto:port with externalTrafficPolicy Local (not masqueraded).
    LoadBalancerLocal,
    /// LoadBalancer IP,proto:port that has source ranges (filtered).
    LoadBalancerFirewall,
    /// LB IP,proto:port,source range: allowed sources.
    LoadBalancerSourceCidr,
    /// LB IP,proto:port,LB IP: the node reaching its own LB IP when a range holds a node IP.
    LoadBalancerSourceIp,
    /// nodeIP,proto:nodePort with externalTrafficPolicy Cluster (masqueraded).
    NodePort,
    /// nodeIP,proto:nodePort with externalTrafficPolicy Local.
    NodePortLocal,
    /// Health-check node ports (accepted).
    HealthCheckNodePort,
    /// endpointIP,proto:port,endpointIP of endpoints on this node: hairpin traffic, masqueraded.
    LoopBack,
    /// Every address bound to the dummy interface (other ports on them are rejected).
    ServiceIps,
    /// Frontends of entries without any usable endpoint: REJECT.
    NoEndpoints,
    /// Frontends whose policy's endpoint set is empty on this node while others exist: DROP.
    NoLocalEndpoints,
}

impl SetId {
    /// Every set, in a fixed order.
    pub const ALL: [SetId; 15] = [
        Self::ClusterIp,
        Self::ExternalIp,
        Self::ExternalIpLocal,
        Self::LoadBalancer,
        Self::LoadBalancerLocal,
        Self::LoadBalancerFirewall,
        Self::LoadBalancerSourceCidr,
        Self::LoadBalancerSourceIp,
        Self::NodePort,
        Self::NodePortLocal,
        Self::HealthCheckNodePort,
        Self::LoopBack,
        Self::ServiceIps,
        Self::NoEndpoints,
        Self::NoLocalEndpoints,
    ];

    fn base(self) -> &'static str {
        match self {
            Self::ClusterIp => "CLUSTER-IP",
            Self::ExternalIp => "EXTERNAL-IP",
            Self::ExternalIpLocal => "EXTERNAL-IP-LOCAL",
            Self::LoadBalancer => "LOAD-BALANCER",
            Self::LoadBalancerLocal => "LB-LOCAL",
            Self::LoadBalancerFirewall => "LB-FW",
            Self::LoadBalancerSourceCidr => "LB-SRC-CIDR",
            Self::LoadBalancerSourceIp => "LB-SRC-IP",
            Self::NodePort => "NODE-PORT",
            Self::NodePortLocal => "NODE-PORT-LOCAL",
            Self::HealthCheckNodePort => "HEALTH-CHECK",
            Self::LoopBack => "LOOP-BACK",
            Self::ServiceIps => "IPVS-IPS",
            Self::NoEndpoints => "NO-ENDPOINTS",
            Self::NoLocalEndpoints => "NO-LOCAL-EP",
        }
    }

    /// The set's type.
    pub fn kind(self) -> SetKind {
        match self {
            Self::LoadBalancerSourceCidr => SetKind::HashIpPortNet,
            Self::LoadBalancerSourceIp | Self::LoopBack => SetKind::HashIpPortIp,
            Self::HealthCheckNodePort => SetKind::BitmapPort,
            Self::ServiceIps => SetKind::HashIp,
            _ => SetKind::HashIpPort,
        }
    }

    /// The set's name for `family`: `SWYD-<base>` or `SWYD-6-<base>` (at most 24 characters; ipset
    /// allows 31).
    pub fn name(self, family: IpFamily) -> String {
        match family {
            IpFamily::IPv4 => format!("{PREFIX}{}", self.base()),
            IpFamily::IPv6 => format!("{PREFIX}6-{}", self.base()),
        }
    }
}

fn host(ip: IpAddr) -> String {
    ip.to_string()
}

/// `ip,proto:port`, as `ipset save` prints a `hash:ip,port` member.
pub fn ip_port(ip: IpAddr, protocol: Protocol, port: u16) -> String {
    format!("{},{}:{port}", host(ip), protocol.lower())
}

/// `ip,proto:port,ip2` (`hash:ip,port,ip`).
pub fn ip_port_ip(ip: IpAddr, protocol: Protocol, port: u16, ip2: IpAddr) -> String {
    format!("{},{}", ip_port(ip, protocol, port), host(ip2))
}

/// `ip,proto:port,net` (`hash:ip,port,net`); ipset prints a host route without its prefix length.
pub fn ip_port_net(ip: IpAddr, protocol: Protocol, port: u16, net: IpNet) -> String {
    let net = net.trunc();
    let net = if net.prefix_len() == net.max_prefix_len() {
        host(net.addr())
    } else {
        net.to_string()
    };
    format!("{},{net}", ip_port(ip, protocol, port))
}

/// A set the render wants, with its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredSet {
    /// Its type.
    pub kind: SetKind,
    /// Its family.
    pub family: IpFamily,
    /// Members in `ipset save` form.
    pub members: BTreeSet<String>,
}

/// Every desired set by name.
pub type DesiredSets = BTreeMap<String, DesiredSet>;

/// A set as `ipset save` showed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedSet {
    /// Type name (`hash:ip,port`).
    pub kind: String,
    /// `inet6` when the save says so; `inet` otherwise (bitmap types have no family).
    pub family: Option<IpFamily>,
    /// Members as printed.
    pub members: BTreeSet<String>,
}

/// Our sets as `ipset save` showed them, by name.
pub type SavedSets = BTreeMap<String, SavedSet>;

/// Reads `ipset save` output, keeping only sets named with our prefix.
pub fn parse_save(text: &str) -> Result<SavedSets, Error> {
    let mut sets = SavedSets::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let bad = |reason: &str| Error::ParseIpset {
            line: line.to_string(),
            reason: reason.to_string(),
        };
        match words.next() {
            Some("create") => {
                let name = words.next().ok_or_else(|| bad("no set name"))?;
                if !name.starts_with(PREFIX) {
                    continue;
                }
                let kind = words.next().ok_or_else(|| bad("no set type"))?.to_string();
                let options: Vec<&str> = words.collect();
                let family = match options.iter().position(|w| *w == "family") {
                    Some(i) => match options.get(i + 1) {
                        Some(&"inet") => Some(IpFamily::IPv4),
                        Some(&"inet6") => Some(IpFamily::IPv6),
                        _ => return Err(bad("unknown family")),
                    },
                    None => None,
                };
                sets.insert(
                    name.to_string(),
                    SavedSet {
                        kind,
                        family,
                        members: BTreeSet::new(),
                    },
                );
            }
            Some("add") => {
                let name = words.next().ok_or_else(|| bad("no set name"))?;
                let Some(set) = sets.get_mut(name) else {
                    // Someone else's set (or ours declared after its members, which ipset never does).
                    continue;
                };
                let member = words.next().ok_or_else(|| bad("no member"))?;
                set.members.insert(member.to_string());
            }
            _ => {}
        }
    }
    Ok(sets)
}

fn create_line(name: &str, set: &DesiredSet) -> String {
    match set.kind {
        SetKind::BitmapPort => format!("create {name} bitmap:port range 0-65535"),
        kind => {
            let family = match set.family {
                IpFamily::IPv4 => "inet",
                IpFamily::IPv6 => "inet6",
            };
            format!(
                "create {name} {} family {family} hashsize 1024 maxelem 65536",
                kind.type_name()
            )
        }
    }
}

fn same_type(saved: &SavedSet, set: &DesiredSet) -> bool {
    saved.kind == set.kind.type_name()
        && (set.kind == SetKind::BitmapPort || saved.family.unwrap_or(IpFamily::IPv4) == set.family)
}

/// Two `ipset restore -exist` batches: the first creates missing sets and adds new members (run before
/// the iptables rules that match them are written); the second deletes stale members and destroys
/// sets we no longer want (run last, when no rule refers to them any more). A set of the wrong type is
/// destroyed and created again in the first batch. Empty strings mean nothing to do.
pub fn batches(desired: &DesiredSets, saved: &SavedSets) -> (String, String) {
    let mut add = String::new();
    let mut remove = String::new();
    for (name, set) in desired {
        let current = saved.get(name).filter(|s| same_type(s, set));
        if current.is_none() {
            if saved.contains_key(name) {
                add.push_str(&format!("destroy {name}\n"));
            }
            add.push_str(&create_line(name, set));
            add.push('\n');
        }
        let have = current.map(|s| &s.members);
        for member in &set.members {
            if !have.is_some_and(|m| m.contains(member)) {
                add.push_str(&format!("add {name} {member}\n"));
            }
        }
        if let Some(have) = have {
            for member in have.difference(&set.members) {
                remove.push_str(&format!("del {name} {member}\n"));
            }
        }
    }
    for name in saved.keys().filter(|n| !desired.contains_key(*n)) {
        remove.push_str(&format!("destroy {name}\n"));
    }
    (add, remove)
}

/// How the saved sets differ from the desired ones (for drift checks): a few reasons.
pub fn differences(desired: &DesiredSets, saved: &SavedSets) -> Vec<String> {
    let mut reasons = Vec::new();
    for (name, set) in desired {
        match saved.get(name) {
            None => reasons.push(format!("ipset {name} is missing")),
            Some(s) if !same_type(s, set) => reasons.push(format!(
                "ipset {name} is a {}, want {}",
                s.kind,
                set.kind.type_name()
            )),
            Some(s) if s.members != set.members => {
                let missing = set.members.difference(&s.members).count();
                let extra = s.members.difference(&set.members).count();
                reasons.push(format!(
                    "ipset {name} lacks {missing} and has {extra} unexpected members"
                ));
            }
            Some(_) => {}
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_fit_ipset_and_differ_per_family() {
        for id in SetId::ALL {
            for family in [IpFamily::IPv4, IpFamily::IPv6] {
                assert!(id.name(family).len() <= 31, "{}", id.name(family));
                assert!(id.name(family).starts_with(PREFIX));
            }
            assert_ne!(id.name(IpFamily::IPv4), id.name(IpFamily::IPv6));
        }
        assert_eq!(SetId::ClusterIp.name(IpFamily::IPv6), "SWYD-6-CLUSTER-IP");
    }

    #[test]
    fn members_are_written_as_ipset_save_prints_them() {
        assert_eq!(ip_port(ip("10.96.0.10"), Protocol::TCP, 80), "10.96.0.10,tcp:80");
        assert_eq!(ip_port(ip("fd00::a"), Protocol::SCTP, 9), "fd00::a,sctp:9");
        assert_eq!(
            ip_port_ip(ip("10.244.0.2"), Protocol::UDP, 53, ip("10.244.0.2")),
            "10.244.0.2,udp:53,10.244.0.2"
        );
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            ip_port_net(ip("203.0.113.7"), Protocol::TCP, 443, net("192.168.0.0/16")),
            "203.0.113.7,tcp:443,192.168.0.0/16"
        );
        assert_eq!(
            ip_port_net(ip("203.0.113.7"), Protocol::TCP, 443, net("192.168.1.9/32")),
            "203.0.113.7,tcp:443,192.168.1.9"
        );
    }

    const SAVE: &str = "create SWYD-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x5b9d2a1c
add SWYD-CLUSTER-IP 10.96.0.10,tcp:80
add SWYD-CLUSTER-IP 10.96.0.99,tcp:80
create OTHER hash:ip family inet hashsize 1024 maxelem 65536
add OTHER 1.2.3.4
create SWYD-6-IPVS-IPS hash:ip family inet6 hashsize 1024 maxelem 65536
create SWYD-HEALTH-CHECK bitmap:port range 0-65535
add SWYD-HEALTH-CHECK 30000
create SWYD-OLD hash:ip family inet hashsize 1024 maxelem 65536
";

    #[test]
    fn save_output_is_read_and_others_sets_ignored() {
        let saved = parse_save(SAVE).unwrap();
        assert_eq!(
            saved.keys().collect::<Vec<_>>(),
            [
                "SWYD-6-IPVS-IPS",
                "SWYD-CLUSTER-IP",
                "SWYD-HEALTH-CHECK",
                "SWYD-OLD"
            ]
        );
        assert_eq!(saved["SWYD-6-IPVS-IPS"].family, Some(IpFamily::IPv6));
        assert_eq!(saved["SWYD-HEALTH-CHECK"].family, None);
        assert_eq!(saved["SWYD-CLUSTER-IP"].members.len(), 2);
        assert!(parse_save("create SWYD-X hash:ip family ipx").is_err());
    }

    #[test]
    fn batches_only_touch_what_differs() {
        let saved = parse_save(SAVE).unwrap();
        let set = |kind, family, members: &[&str]| DesiredSet {
            kind,
            family,
            members: members.iter().map(|m| m.to_string()).collect(),
        };
        let desired = DesiredSets::from([
            (
                "SWYD-CLUSTER-IP".to_string(),
                set(
                    SetKind::HashIpPort,
                    IpFamily::IPv4,
                    &["10.96.0.10,tcp:80", "10.96.0.11,udp:53"],
                ),
            ),
            (
                "SWYD-HEALTH-CHECK".to_string(),
                set(SetKind::BitmapPort, IpFamily::IPv4, &["30000"]),
            ),
            // Exists with the wrong family: recreated.
            (
                "SWYD-6-IPVS-IPS".to_string(),
                set(SetKind::HashIpPort, IpFamily::IPv6, &[]),
            ),
            (
                "SWYD-NO-ENDPOINTS".to_string(),
                set(SetKind::HashIpPort, IpFamily::IPv4, &[]),
            ),
        ]);
        let (add, remove) = batches(&desired, &saved);
        assert_eq!(
            add,
            "destroy SWYD-6-IPVS-IPS
create SWYD-6-IPVS-IPS hash:ip,port family inet6 hashsize 1024 maxelem 65536
add SWYD-CLUSTER-IP 10.96.0.11,udp:53
create SWYD-NO-ENDPOINTS hash:ip,port family inet hashsize 1024 maxelem 65536
"
        );
        assert_eq!(
            remove,
            "del SWYD-CLUSTER-IP 10.96.0.99,tcp:80
destroy SWYD-OLD
"
        );
        assert_eq!(differences(&desired, &saved).len(), 3);
        let mut applied = saved.clone();
        applied.remove("SWYD-OLD");
        for (name, set) in &desired {
            applied.insert(
                name.clone(),
                SavedSet {
                    kind: set.kind.type_name().into(),
                    family: (set.kind != SetKind::BitmapPort).then_some(set.family),
                    members: set.members.clone(),
                },
            );
        }
        assert_eq!(batches(&desired, &applied), (String::new(), String::new()));
        assert!(differences(&desired, &applied).is_empty());
    }
}
