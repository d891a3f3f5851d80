//! Names, labels, annotations and field managers both binaries must agree on.

/// API group of the CRD.
pub const GROUP: &str = "switchyard.io";
/// Field manager of the controller's server-side apply (spec only).
pub const CONTROLLER_FIELD_MANAGER: &str = "switchyard-controller";
/// Field manager of the agent's server-side apply (status only).
pub const AGENT_FIELD_MANAGER: &str = "switchyard-agent";
/// Field manager of the controller's rollouts when they set a Node's backend label (server-side apply
/// of that one label; a ValidatingAdmissionPolicy lets the controller change nothing else on a Node).
pub const ROLLOUT_FIELD_MANAGER: &str = "switchyard-rollout";

/// Label on every plan object: the node it is for.
pub const LABEL_NODE: &str = "switchyard.io/node";
/// Label on every ForwardingSlice: its view's id (`all`, `zone-<zone>`, …); agents select their views'
/// slices by it.
pub const LABEL_VIEW: &str = "switchyard.io/view";
/// Label selecting which objects the controller manages.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "switchyard-controller";

/// Node label overriding the controller's default backend for one node (default key; configurable).
pub const LABEL_BACKEND: &str = "switchyard.io/backend";
/// Service annotation overriding the IPVS scheduler.
pub const ANNOTATION_IPVS_SCHEDULER: &str = "switchyard.io/ipvs-scheduler";
/// Service annotation: IPVS real-server weights by the endpoint's node, `node-a=3,node-b=1`
/// (1..65535; nodes not listed weigh 1). Used by weighted schedulers (wrr, wlc).
pub const ANNOTATION_IPVS_WEIGHTS: &str = "switchyard.io/ipvs-weights";
/// Service annotation: `"true"` keeps established connections to an endpoint that leaves the Service
/// (the agent otherwise clears their conntrack entries, so the next packet meets the rules again).
pub const ANNOTATION_KEEP_CONNECTIONS: &str = "switchyard.io/keep-connections";
/// On the plan in an agent's cache file: the backend that agent had in use when it wrote it, so a
/// restarted agent judges a switch from it with the switch gate instead of taking the plan's backend
/// unjudged.
pub const ANNOTATION_BACKEND_IN_USE: &str = "switchyard.io/backend-in-use";

/// Longest interface name Linux accepts (`IFNAMSIZ` − 1).
pub const MAX_INTERFACE_NAME: usize = 15;

/// Checks an interface name (or name prefix) the way Linux's `dev_valid_name` does — 1 to 15 bytes,
/// not `.` or `..`, no `/`, `:` or whitespace — and refuses what would change its meaning in a rule:
/// quotes and backslashes (nft strings), `*` and `+` (the wildcards iptables and nft append to a
/// prefix), and anything outside printable ASCII. The message says what is wrong, not where.
pub fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_INTERFACE_NAME {
        return Err(format!(
            "is {} bytes; an interface name has at most {MAX_INTERFACE_NAME}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not an interface name"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | ':' | '"' | '\\' | '\'' | '*' | '+'))
    {
        return Err(format!(
            "{name:?} contains {bad:?}, which no interface name may contain"
        ));
    }
    Ok(())
}

/// Well-known Kubernetes labels and annotations the planner reads.
pub mod k8s {
    /// Services carrying it belong to another proxy (unless the value is ours).
    pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
    /// Services and EndpointSlices carrying it (any value) are not proxied, as kube-proxy's
    /// informers select `!service.kubernetes.io/headless` (the EndpointSlice controller puts it on
    /// the slices of headless Services).
    pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
    /// EndpointSlice → Service link.
    pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
    /// Node zone.
    pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
    /// Set by the EndpointSlice controller: when the change that produced this slice happened.
    pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
}

/// Plan annotation: the earliest EndpointSlice `last-change-trigger-time` among the changes this write
/// carries, so the agent can measure network programming latency end to end.
pub const ANNOTATION_TRIGGER_TIME: &str = "switchyard.io/last-change-trigger-time";

/// IPVS schedulers the agent knows (`mh` only where the kernel has it).
pub const IPVS_SCHEDULERS: &[&str] = &["rr", "wrr", "lc", "wlc", "dh", "sh", "sed", "nq", "mh"];

/// kube-proxy's ServicePortName string: `namespace/name:port`, or `namespace/name` for an unnamed port.
pub fn service_port_name(namespace: &str, name: &str, port_name: &str) -> String {
    if port_name.is_empty() {
        format!("{namespace}/{name}")
    } else {
        format!("{namespace}/{name}:{port_name}")
    }
}

/// The label selector of the slices of `views`: `switchyard.io/view in (all,zone-a)`.
pub fn views_selector<'a>(views: impl IntoIterator<Item = &'a str>) -> String {
    let list: Vec<&str> = views.into_iter().collect();
    format!("{LABEL_VIEW} in ({})", list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_port_names_follow_kube_proxy() {
        assert_eq!(service_port_name("ns1", "svc1", "p80"), "ns1/svc1:p80");
        assert_eq!(service_port_name("ns1", "svc1", ""), "ns1/svc1");
    }

    #[test]
    fn views_select_by_label() {
        assert_eq!(
            views_selector(["all", "zone-a"]),
            "switchyard.io/view in (all,zone-a)"
        );
    }
}
