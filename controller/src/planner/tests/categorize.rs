//! kube-proxy's `CategorizeEndpoints` behaviour, as tables (written from `pkg/proxy/topology.go`'s
//! semantics, not copied from its tests).

use std::net::IpAddr;

use crate::planner::{
    slices::EndpointInfo,
    topology::{Policies, TopologyMode, categorize, topology_mode},
};

struct Ep {
    ip: &'static str,
    node: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

const fn ready(ip: &'static str, node: &'static str) -> Ep {
    Ep {
        ip,
        node,
        ready: true,
        serving: true,
        terminating: false,
        zones: &[],
        nodes: &[],
    }
}

const fn zoned(ip: &'static str, node: &'static str, zones: &'static [&'static str]) -> Ep {
    Ep {
        ip,
        node,
        ready: true,
        serving: true,
        terminating: false,
        zones,
        nodes: &[],
    }
}

const fn node_hinted(ip: &'static str, node: &'static str, zone: &'static [&'static str]) -> Ep {
    Ep {
        ip,
        node,
        ready: true,
        serving: true,
        terminating: false,
        zones: zone,
        nodes: &[],
    }
}

const fn serving_terminating(ip: &'static str, node: &'static str) -> Ep {
    Ep {
        ip,
        node,
        ready: false,
        serving: true,
        terminating: true,
        zones: &[],
        nodes: &[],
    }
}

const fn terminating_not_serving(ip: &'static str, node: &'static str) -> Ep {
    Ep {
        ip,
        node,
        ready: false,
        serving: false,
        terminating: true,
        zones: &[],
        nodes: &[],
    }
}

fn infos(eps: &[Ep]) -> Vec<EndpointInfo> {
    eps.iter()
        .map(|e| EndpointInfo {
            ip: e.ip.parse::<IpAddr>().unwrap(),
            port: 80,
            ready: e.ready,
            serving: e.serving,
            terminating: e.terminating,
            node: Some(e.node.to_string()),
            zone_hints: e.zones.iter().map(|z| z.to_string()).collect(),
            node_hints: e.nodes.iter().map(|n| n.to_string()).collect(),
            pod: None,
        })
        .collect()
}

const CLUSTER: Policies = Policies {
    internal_local: false,
    external_local: false,
    externally_accessible: false,
};
const ITP_LOCAL: Policies = Policies {
    internal_local: true,
    external_local: false,
    externally_accessible: false,
};
const ETP_LOCAL: Policies = Policies {
    internal_local: false,
    external_local: true,
    externally_accessible: true,
};
const ETP_LOCAL_INTERNAL_ONLY: Policies = Policies {
    internal_local: false,
    external_local: true,
    externally_accessible: false,
};
const BOTH_LOCAL: Policies = Policies {
    internal_local: true,
    external_local: true,
    externally_accessible: true,
};

struct Case {
    name: &'static str,
    policies: Policies,
    node: &'static str,
    zone: Option<&'static str>,
    endpoints: Vec<Ep>,
    cluster: &'static [&'static str],
    local: &'static [&'static str],
    has_any: bool,
}

#[test]
fn categorize_endpoints_like_kube_proxy() {
    let cases = vec![
        Case {
            name: "cluster policy, no hints: every ready endpoint",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                ready("10.0.0.1", "node-a"),
                ready("10.0.0.2", "node-b"),
                ready("10.0.0.3", "node-c"),
            ],
            cluster: &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "zone hints for every endpoint and some for this zone: only this zone's",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-a"]),
                zoned("10.0.0.2", "node-b", &["zone-b"]),
                zoned("10.0.0.3", "node-c", &["zone-a", "zone-c"]),
            ],
            cluster: &["10.0.0.1", "10.0.0.3"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "zone hints, none for this zone: topology ignored",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-z"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-a"]),
                zoned("10.0.0.2", "node-b", &["zone-b"]),
            ],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "one ready endpoint without a hint: topology ignored",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-a"]),
                ready("10.0.0.2", "node-b"),
            ],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "node has no zone label: topology ignored",
            policies: CLUSTER,
            node: "node-a",
            zone: None,
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-a"]),
                zoned("10.0.0.2", "node-b", &["zone-b"]),
            ],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "hints of not-ready endpoints do not matter",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-a"]),
                zoned("10.0.0.2", "node-b", &["zone-b"]),
                serving_terminating("10.0.0.3", "node-c"),
            ],
            cluster: &["10.0.0.1"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "no ready endpoints: serving terminating ones anywhere, topology ignored",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                serving_terminating("10.0.0.1", "node-b"),
                serving_terminating("10.0.0.2", "node-c"),
                terminating_not_serving("10.0.0.3", "node-a"),
            ],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "only terminating, not serving: nothing usable",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![terminating_not_serving("10.0.0.1", "node-a")],
            cluster: &[],
            local: &[],
            has_any: false,
        },
        Case {
            name: "no endpoints",
            policies: CLUSTER,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![],
            cluster: &[],
            local: &[],
            has_any: false,
        },
        Case {
            name: "iTP Local with local ready endpoints: cluster set unused",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![ready("10.0.0.1", "node-a"), ready("10.0.0.2", "node-b")],
            cluster: &[],
            local: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "iTP Local, only remote endpoints: empty local set but endpoints exist (DROP, not REJECT)",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![ready("10.0.0.2", "node-b")],
            cluster: &[],
            local: &[],
            has_any: true,
        },
        Case {
            name: "iTP Local, local endpoint only serving-terminating: used as fallback",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                serving_terminating("10.0.0.1", "node-a"),
                ready("10.0.0.2", "node-b"),
            ],
            cluster: &[],
            local: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "iTP Local, local ready and local terminating: only ready",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                ready("10.0.0.1", "node-a"),
                serving_terminating("10.0.0.3", "node-a"),
            ],
            cluster: &[],
            local: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "iTP Local ignores topology hints",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-b"]),
                zoned("10.0.0.2", "node-b", &["zone-a"]),
            ],
            cluster: &[],
            local: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "eTP Local, externally accessible: both sets, topology only on the cluster set",
            policies: ETP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![
                zoned("10.0.0.1", "node-a", &["zone-b"]),
                zoned("10.0.0.2", "node-b", &["zone-a"]),
                zoned("10.0.0.3", "node-c", &["zone-b"]),
            ],
            cluster: &["10.0.0.2"],
            local: &["10.0.0.1"],
            has_any: true,
        },
        Case {
            name: "eTP Local without local endpoints: empty local set, cluster set for short-circuits",
            policies: ETP_LOCAL,
            node: "node-c",
            zone: Some("zone-b"),
            endpoints: vec![ready("10.0.0.1", "node-a"), ready("10.0.0.2", "node-b")],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "eTP Local ignored when not externally accessible",
            policies: ETP_LOCAL_INTERNAL_ONLY,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![ready("10.0.0.1", "node-a"), ready("10.0.0.2", "node-b")],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &[],
            has_any: true,
        },
        Case {
            name: "iTP and eTP Local, externally accessible",
            policies: BOTH_LOCAL,
            node: "node-b",
            zone: Some("zone-a"),
            endpoints: vec![ready("10.0.0.1", "node-a"), ready("10.0.0.2", "node-b")],
            cluster: &["10.0.0.1", "10.0.0.2"],
            local: &["10.0.0.2"],
            has_any: true,
        },
        Case {
            name: "Local policy: a node with nothing usable anywhere",
            policies: ITP_LOCAL,
            node: "node-a",
            zone: Some("zone-a"),
            endpoints: vec![terminating_not_serving("10.0.0.1", "node-a")],
            cluster: &[],
            local: &[],
            has_any: false,
        },
    ];
    for case in cases {
        let eps = infos(&case.endpoints);
        let got = categorize(&eps, case.policies, Some(case.node), case.zone);
        let pick = |flags: &[bool]| -> Vec<String> {
            eps.iter()
                .zip(flags)
                .filter(|(_, f)| **f)
                .map(|(e, _)| e.ip.to_string())
                .collect()
        };
        assert_eq!(pick(&got.cluster), case.cluster, "{}: cluster set", case.name);
        assert_eq!(pick(&got.local), case.local, "{}: local set", case.name);
        assert_eq!(got.has_any, case.has_any, "{}: hasAnyEndpoints", case.name);
    }
}

#[test]
fn topology_mode_prefers_node_hints_then_zone_hints() {
    let mut both = infos(&[
        node_hinted("10.0.0.1", "node-a", &["zone-a"]),
        node_hinted("10.0.0.2", "node-b", &["zone-a"]),
    ]);
    both[0].node_hints = vec!["node-a".into()];
    both[1].node_hints = vec!["node-b".into()];
    let cases: Vec<(&str, Option<&str>, Option<&str>, TopologyMode)> = vec![
        (
            "named node",
            Some("node-a"),
            Some("zone-a"),
            TopologyMode::PreferSameNode,
        ),
        (
            "unnamed node in the hinted zone",
            Some("node-z"),
            Some("zone-a"),
            TopologyMode::PreferSameZone,
        ),
        (
            "unnamed node elsewhere",
            Some("node-z"),
            Some("zone-b"),
            TopologyMode::None,
        ),
        (
            "generic node of the zone",
            None,
            Some("zone-a"),
            TopologyMode::PreferSameZone,
        ),
    ];
    for (name, node, zone, want) in cases {
        assert_eq!(topology_mode(&both, node, zone), want, "{name}");
    }
    let got = categorize(&both, CLUSTER, Some("node-a"), Some("zone-a"));
    assert_eq!(
        got.cluster,
        vec![true, false],
        "PreferSameNode keeps only this node's endpoint"
    );

    let mut partial = both.clone();
    partial[1].node_hints.clear();
    assert_eq!(
        topology_mode(&partial, Some("node-a"), Some("zone-a")),
        TopologyMode::PreferSameZone
    );
}
