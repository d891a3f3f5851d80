//! The controller's configuration file: YAML, validated, every field optional with a documented default.
//!
//! ```yaml
//! # switchyard-controller configuration (all fields optional; these are the defaults)
//! clusterCIDRs: []                 # pod CIDRs of the cluster, at most one per family (local-traffic detector)
//! detectLocalMode: ClusterCIDR     # ClusterCIDR | NodeCIDR | BridgeInterface | InterfaceNamePrefix | None
//!                                  # (ClusterCIDR without clusterCIDRs = no detector)
//! bridgeInterface: null            # BridgeInterface: the pods' bridge, e.g. cbr0 (matched by name: -i cbr0)
//! interfaceNamePrefix: null        # InterfaceNamePrefix: the pods' interface prefix, e.g. veth (-i veth+)
//! masqueradeAll: false             # masquerade all ClusterIP traffic, not only off-cluster sources
//! masqueradeBit: 14                # mark bit asking for masquerade (0x4000)
//! nodePortAddresses: null          # unset: [primary] on nftables nodes (kube-proxy's nftables default),
//!                                  # every local address elsewhere; [] = every local address on every
//!                                  # backend; [primary]; or CIDRs
//! localhostNodePorts: false        # iptables nodes also serve NodePorts on 127.0.0.0/8 (route_localnet=1)
//! externalIPs: allowAll            # allowAll | deny | {allowCIDRs: [203.0.113.0/24]}: Service externalIPs
//!                                  # outside the policy get no rules and a Warning Event (CVE-2020-8554)
//! nodePortRange: null              # e.g. "30000-32767"; when set, NodePorts outside it are rejected
//! defaultBackend: iptables         # iptables | ipvs | nftables
//! backendNodeLabel: switchyard.io/backend   # a node label overriding defaultBackend for that node
//! serviceProxyName: switchyard     # Services labelled service.kubernetes.io/service-proxy-name=<this> are ours too
//! ipvsScheduler: rr                # default IPVS scheduler (per-service annotation switchyard.io/ipvs-scheduler)
//! maxObjectBytes: 49152            # byte budget per ForwardingSlice and plan: above it a view gets more
//!                                  # slices and a node's overrides move into its own view
//! minPlanInterval: 1s              # live controller: coalesce bursts of changes at least this far apart
//! sliceFoldAfter: 10m              # live controller: a packed slice whose Service slices were all quiet this
//!                                  # long is written with their entries and they are deleted (one at a time)
//! writeQPS: 50                     # live controller: global write budget, plans and slices (writes per second;
//!                                  # kube-scheduler's default: a fresh start of 5,000 nodes takes ~105 s)
//! writeBurst: 100                  # live controller: burst above the budget
//! leavingSignals:                  # what on a Node says it is leaving: its plan says so, its agent fails
//! - deletionTimestamp              # kube-proxy's /healthz (503) and reports the connections it still carries.
//! - taint:ToBeDeletedByClusterAutoscaler   # Also known: unschedulable (a cordon), taint:KEY, label:KEY,
//! - taint:karpenter.sh/disrupted   # label:KEY=VALUE; the first that matches is the reason
//! drainGracePeriod: 10m            # after this long leaving, a node reports Drained even with connections left
//! ```

use std::{net::IpAddr, path::Path, time::Duration};

use ipnet::IpNet;
use serde::Deserialize;
use switchyard_api::{
    Backend, DetectLocalMode, IpFamily,
    ip::{is_zero_cidr, parse_cidr_sloppy},
    names::{IPVS_SCHEDULERS, LABEL_BACKEND, check_interface_name},
};

use crate::Error;
use crate::planner::leaving::{LeavingSignal, default_signals};

/// Smallest object byte budget accepted: below it the slice count would explode.
pub const MIN_OBJECT_BYTES: usize = 16 * 1024;
/// Largest object byte budget accepted: etcd refuses objects above ~1.5 MiB.
pub const MAX_OBJECT_BYTES: usize = 1_400_000;
/// Default object byte budget: one endpoint change rewrites one slice of at most this size (kube-proxy's
/// unit is one EndpointSlice of up to 100 endpoints, ~10-20 KiB), and 10,000 Services fit ~100 slices.
pub const DEFAULT_OBJECT_BYTES: usize = 48 * 1024;

/// The configuration as written in the file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default, rename = "clusterCIDRs")]
    cluster_cidrs: Vec<String>,
    detect_local_mode: Option<DetectLocalMode>,
    bridge_interface: Option<String>,
    interface_name_prefix: Option<String>,
    masquerade_all: Option<bool>,
    masquerade_bit: Option<u8>,
    node_port_addresses: Option<Vec<String>>,
    localhost_node_ports: Option<bool>,
    #[serde(rename = "externalIPs")]
    external_ips: Option<RawExternalIps>,
    node_port_range: Option<String>,
    default_backend: Option<String>,
    backend_node_label: Option<String>,
    service_proxy_name: Option<String>,
    ipvs_scheduler: Option<String>,
    max_object_bytes: Option<usize>,
    min_plan_interval: Option<String>,
    slice_fold_after: Option<String>,
    #[serde(rename = "writeQPS")]
    write_qps: Option<f64>,
    write_burst: Option<u32>,
    leaving_signals: Option<Vec<String>>,
    drain_grace_period: Option<String>,
}

/// `externalIPs` as written: `allowAll`, `deny`, or `{allowCIDRs: [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum RawExternalIps {
    AllowAll,
    Deny,
    #[serde(rename = "allowCIDRs")]
    AllowCidrs(Vec<String>),
}

/// Which Service `externalIPs` get rules (KEP-5707 deprecates them: anyone who may edit a Service can
/// capture traffic to any address through them, CVE-2020-8554).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExternalIpPolicy {
    /// Every externalIP is served (kube-proxy's behaviour, and the default).
    #[default]
    AllowAll,
    /// Only externalIPs inside one of these CIDRs are served.
    AllowCidrs(Vec<IpNet>),
    /// No externalIP is served.
    Deny,
}

impl ExternalIpPolicy {
    /// Whether `ip` may be served.
    pub fn allows(&self, ip: &IpAddr) -> bool {
        match self {
            Self::AllowAll => true,
            Self::AllowCidrs(cidrs) => cidrs.iter().any(|c| c.contains(ip)),
            Self::Deny => false,
        }
    }

    /// The policy as the configuration spells it, for messages.
    pub fn describe(&self) -> String {
        match self {
            Self::AllowAll => "allowAll".into(),
            Self::Deny => "deny".into(),
            Self::AllowCidrs(cidrs) => format!(
                "allowCIDRs [{}]",
                cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Cluster pod CIDRs, at most one per family.
    pub cluster_cidrs: Vec<IpNet>,
    /// Local-traffic detector mode.
    pub detect_local_mode: DetectLocalMode,
    /// The bridge (BridgeInterface) or interface-name prefix (InterfaceNamePrefix) the detector
    /// matches; `None` for the other modes.
    pub detect_local_interface: Option<String>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
    /// Masquerade mark bit.
    pub masquerade_bit: u8,
    /// `nodePortAddresses`, canonical (`primary` or CIDRs); `None`: the backend's default (see
    /// [`Config::node_port_addresses_for`]).
    pub node_port_addresses: Option<Vec<String>>,
    /// Serve NodePorts on localhost too (iptables nodes only).
    pub localhost_node_ports: bool,
    /// Which Service externalIPs get rules.
    pub external_ips: ExternalIpPolicy,
    /// The Service ranges of the cluster (ServiceCIDR objects), set by whoever reads them — the live
    /// controller's watch, or the dump `plan` reads — not by the file.
    pub service_cidrs: Vec<IpNet>,
    /// Accepted NodePort range, inclusive, when configured.
    pub node_port_range: Option<(u16, u16)>,
    /// Backend for nodes without the override label.
    pub default_backend: Backend,
    /// Node label overriding the backend.
    pub backend_node_label: String,
    /// The `service-proxy-name` value that means "ours".
    pub service_proxy_name: String,
    /// Default IPVS scheduler.
    pub ipvs_scheduler: String,
    /// Byte budget per ForwardingSlice and per plan object.
    pub max_object_bytes: usize,
    /// Live controller: minimum interval between planning runs.
    pub min_plan_interval: Duration,
    /// Live controller: how long every Service slice shadowing a packed slice must have been quiet
    /// before their entries are folded back into it.
    pub slice_fold_after: Duration,
    /// Live controller: plan writes per second.
    pub write_qps: f64,
    /// Live controller: write burst.
    pub write_burst: u32,
    /// What on a Node says it is leaving, in order.
    pub leaving_signals: Vec<LeavingSignal>,
    /// How long a leaving node's agent waits for its connections to end before it reports Drained.
    pub drain_grace_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_cidrs: Vec::new(),
            detect_local_mode: DetectLocalMode::ClusterCIDR,
            detect_local_interface: None,
            masquerade_all: false,
            masquerade_bit: 14,
            node_port_addresses: None,
            localhost_node_ports: false,
            external_ips: ExternalIpPolicy::AllowAll,
            service_cidrs: Vec::new(),
            node_port_range: None,
            default_backend: Backend::Iptables,
            backend_node_label: LABEL_BACKEND.to_string(),
            service_proxy_name: "switchyard".to_string(),
            ipvs_scheduler: "rr".to_string(),
            max_object_bytes: DEFAULT_OBJECT_BYTES,
            min_plan_interval: Duration::from_secs(1),
            slice_fold_after: Duration::from_secs(600),
            write_qps: 50.0,
            write_burst: 100,
            leaving_signals: default_signals(),
            drain_grace_period: Duration::from_secs(600),
        }
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|problems| Error::InvalidConfig {
            path: path.display().to_string(),
            problems,
        })
    }

    /// Parses and validates configuration text; every problem is listed.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            let mut options = serde_saphyr::Options::default();
            options.strict_booleans = true;
            // The default million replayed alias events take seconds: a few hundred bytes of nested
            // aliases would stall the controller's start (found by fuzzing).
            options.alias_limits.max_total_replayed_events = switchyard_api::yaml::MAX_ALIAS_EVENTS;
            serde_saphyr::from_str_with_options(text, options).map_err(|e| vec![e.to_string()])?
        };
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Self, Vec<String>> {
        let defaults = Self::default();
        let mut problems = Vec::new();
        let mut cluster_cidrs: Vec<IpNet> = Vec::new();
        for (i, text) in raw.cluster_cidrs.iter().enumerate() {
            match parse_cidr_sloppy(text) {
                None => problems.push(format!("clusterCIDRs[{i}]: {text:?} is not a CIDR")),
                Some(net) if cluster_cidrs.iter().any(|c| family(c) == family(&net)) => {
                    problems.push(format!("clusterCIDRs[{i}]: at most one CIDR per IP family"))
                }
                Some(net) => cluster_cidrs.push(net),
            }
        }
        let detect_local_mode = raw.detect_local_mode.unwrap_or(defaults.detect_local_mode);
        let detect_local_interface = detect_local_interface(
            detect_local_mode,
            raw.bridge_interface.as_deref(),
            raw.interface_name_prefix.as_deref(),
            &mut problems,
        );
        let masquerade_bit = raw.masquerade_bit.unwrap_or(defaults.masquerade_bit);
        if masquerade_bit > 31 {
            problems.push(format!("masqueradeBit: {masquerade_bit} is not in 0..31"));
        }
        let mut node_port_addresses = Vec::new();
        let written = raw.node_port_addresses.as_deref().unwrap_or_default();
        for (i, text) in written.iter().enumerate() {
            if text == "primary" {
                if written.len() > 1 {
                    problems.push("nodePortAddresses: `primary` cannot be combined with CIDRs".to_string());
                }
                node_port_addresses.push(text.clone());
            } else {
                match parse_cidr_sloppy(text) {
                    Some(net) => node_port_addresses.push(net.to_string()),
                    None => problems.push(format!(
                        "nodePortAddresses[{i}]: {text:?} is neither `primary` nor a CIDR"
                    )),
                }
            }
        }
        let node_port_addresses = raw.node_port_addresses.is_some().then_some(node_port_addresses);
        let external_ips = match raw.external_ips {
            None | Some(RawExternalIps::AllowAll) => ExternalIpPolicy::AllowAll,
            Some(RawExternalIps::Deny) => ExternalIpPolicy::Deny,
            Some(RawExternalIps::AllowCidrs(texts)) => {
                if texts.is_empty() {
                    problems.push(
                        "externalIPs.allowCIDRs: empty; write `externalIPs: deny` to serve none".to_string(),
                    );
                }
                let mut cidrs = Vec::new();
                for (i, text) in texts.iter().enumerate() {
                    match parse_cidr_sloppy(text) {
                        Some(net) => cidrs.push(net.trunc()),
                        None => problems.push(format!("externalIPs.allowCIDRs[{i}]: {text:?} is not a CIDR")),
                    }
                }
                ExternalIpPolicy::AllowCidrs(cidrs)
            }
        };
        let node_port_range = raw.node_port_range.as_deref().and_then(|text| {
            let parsed = text
                .split_once('-')
                .and_then(|(lo, hi)| Some((lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?)))
                .filter(|(lo, hi)| *lo >= 1 && lo <= hi);
            if parsed.is_none() {
                problems.push(format!("nodePortRange: {text:?} is not LOW-HIGH within 1-65535"));
            }
            parsed
        });
        let default_backend = match raw.default_backend.as_deref() {
            None => defaults.default_backend,
            Some(text) => Backend::parse(text).unwrap_or_else(|| {
                problems.push(format!(
                    "defaultBackend: {text:?} is not iptables, ipvs or nftables"
                ));
                defaults.default_backend
            }),
        };
        let backend_node_label = raw.backend_node_label.unwrap_or(defaults.backend_node_label);
        if backend_node_label.is_empty() {
            problems.push("backendNodeLabel: must not be empty".to_string());
        }
        let ipvs_scheduler = raw.ipvs_scheduler.unwrap_or(defaults.ipvs_scheduler);
        if !IPVS_SCHEDULERS.contains(&ipvs_scheduler.as_str()) {
            problems.push(format!(
                "ipvsScheduler: {ipvs_scheduler:?} is not one of {}",
                IPVS_SCHEDULERS.join(", ")
            ));
        }
        let max_object_bytes = raw.max_object_bytes.unwrap_or(defaults.max_object_bytes);
        if !(MIN_OBJECT_BYTES..=MAX_OBJECT_BYTES).contains(&max_object_bytes) {
            problems.push(format!(
                "maxObjectBytes: {max_object_bytes} is not in {MIN_OBJECT_BYTES}..{MAX_OBJECT_BYTES}"
            ));
        }
        let min_plan_interval = match raw.min_plan_interval.as_deref() {
            None => defaults.min_plan_interval,
            Some(text) => switchyard_api::duration::parse(text).unwrap_or_else(|why| {
                problems.push(format!("minPlanInterval: {why}"));
                defaults.min_plan_interval
            }),
        };
        let slice_fold_after = match raw.slice_fold_after.as_deref() {
            None => defaults.slice_fold_after,
            Some(text) => match switchyard_api::duration::parse(text) {
                Ok(after) if after >= Duration::from_secs(1) => after,
                Ok(_) => {
                    problems.push(format!("sliceFoldAfter: {text} is shorter than 1s"));
                    defaults.slice_fold_after
                }
                Err(why) => {
                    problems.push(format!("sliceFoldAfter: {why}"));
                    defaults.slice_fold_after
                }
            },
        };
        let write_qps = raw.write_qps.unwrap_or(defaults.write_qps);
        if !(write_qps > 0.0 && write_qps.is_finite()) {
            problems.push(format!("writeQPS: {write_qps} must be a positive number"));
        }
        let write_burst = raw.write_burst.unwrap_or(defaults.write_burst);
        if write_burst == 0 {
            problems.push("writeBurst: must be at least 1".to_string());
        }
        let leaving_signals = match raw.leaving_signals {
            None => defaults.leaving_signals,
            Some(texts) => texts
                .iter()
                .enumerate()
                .filter_map(|(i, text)| {
                    LeavingSignal::parse(text)
                        .map_err(|why| problems.push(format!("leavingSignals[{i}]: {why}")))
                        .ok()
                })
                .collect(),
        };
        let drain_grace_period = match raw.drain_grace_period.as_deref() {
            None => defaults.drain_grace_period,
            Some(text) => switchyard_api::duration::parse(text).unwrap_or_else(|why| {
                problems.push(format!("drainGracePeriod: {why}"));
                defaults.drain_grace_period
            }),
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Self {
            cluster_cidrs,
            detect_local_mode,
            detect_local_interface,
            masquerade_all: raw.masquerade_all.unwrap_or(defaults.masquerade_all),
            masquerade_bit,
            node_port_addresses,
            localhost_node_ports: raw.localhost_node_ports.unwrap_or(defaults.localhost_node_ports),
            external_ips,
            service_cidrs: Vec::new(),
            node_port_range,
            default_backend,
            backend_node_label,
            service_proxy_name: raw.service_proxy_name.unwrap_or(defaults.service_proxy_name),
            ipvs_scheduler,
            max_object_bytes,
            min_plan_interval,
            slice_fold_after,
            write_qps,
            write_burst,
            leaving_signals,
            drain_grace_period,
        })
    }

    /// The `nodePortAddresses` a node of `backend` gets: as configured, else kube-proxy's default for
    /// that backend — `primary` on nftables (KEP-3866: NodePorts on every local address expose them on
    /// interfaces nobody meant, e.g. a VPN or a docker bridge), every local address elsewhere.
    pub fn node_port_addresses_for(&self, backend: Backend) -> Vec<String> {
        match &self.node_port_addresses {
            Some(addresses) => addresses.clone(),
            None if backend == Backend::Nftables => vec!["primary".to_string()],
            None => Vec::new(),
        }
    }

    /// The cluster CIDR of a family, when configured.
    pub fn cluster_cidr(&self, family_wanted: IpFamily) -> Option<&IpNet> {
        self.cluster_cidrs.iter().find(|c| family(c) == family_wanted)
    }
}

/// The detector's interface for `mode`, checked; a name given for a mode that does not read it is a
/// problem too (it would silently do nothing).
fn detect_local_interface(
    mode: DetectLocalMode,
    bridge: Option<&str>,
    prefix: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<String> {
    let (field, wanted, other) = match mode {
        DetectLocalMode::BridgeInterface => ("bridgeInterface", bridge, ("interfaceNamePrefix", prefix)),
        DetectLocalMode::InterfaceNamePrefix => ("interfaceNamePrefix", prefix, ("bridgeInterface", bridge)),
        _ => {
            for (field, value) in [("bridgeInterface", bridge), ("interfaceNamePrefix", prefix)] {
                if value.is_some() {
                    problems.push(format!("{field}: detectLocalMode {mode:?} does not read it"));
                }
            }
            return None;
        }
    };
    if other.1.is_some() {
        problems.push(format!("{}: detectLocalMode {mode:?} does not read it", other.0));
    }
    match wanted {
        None => {
            problems.push(format!("{field}: detectLocalMode {mode:?} needs it"));
            None
        }
        Some(name) => match check_interface_name(name) {
            Ok(()) => Some(name.to_string()),
            Err(why) => {
                problems.push(format!("{field}: {why}"));
                None
            }
        },
    }
}

fn family(net: &IpNet) -> IpFamily {
    IpFamily::of(&net.addr())
}

/// True when `ip` is inside a CIDR list entry that is not `/0`.
pub fn in_any(ip: &IpAddr, cidrs: &[IpNet]) -> bool {
    cidrs.iter().any(|c| !is_zero_cidr(c) && c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_documented_defaults() {
        let config = Config::parse("").unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.masquerade_bit, 14);
        assert_eq!(config.max_object_bytes, 49_152);
        assert_eq!(config.default_backend, Backend::Iptables);
    }

    #[test]
    fn the_documented_example_parses_to_the_defaults() {
        let doc: String = include_str!("config.rs")
            .lines()
            .skip_while(|l| !l.starts_with("//! ```yaml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| {
                format!(
                    "{}\n",
                    l.trim_start_matches("//!").strip_prefix(' ').unwrap_or("")
                )
            })
            .collect();
        assert!(doc.contains("clusterCIDRs"));
        let config = Config::parse(&doc).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn a_full_config_parses() {
        let config = Config::parse(
            "clusterCIDRs: [010.244.0.0/16, fd00:10:244::/56]\nmasqueradeAll: true\nmasqueradeBit: 15\n\
             nodePortAddresses: [192.168.10.0/24]\nnodePortRange: 30000-32767\ndefaultBackend: ipvs\n\
             maxObjectBytes: 500000\nminPlanInterval: 250ms\nsliceFoldAfter: 1h\n\
             leavingSignals: [unschedulable, \"label:example.com/retiring=yes\"]\ndrainGracePeriod: 2m\n",
        )
        .unwrap();
        assert_eq!(config.cluster_cidrs[0].to_string(), "10.244.0.0/16");
        assert_eq!(
            config
                .cluster_cidr(IpFamily::IPv6)
                .map(|c| c.to_string())
                .as_deref(),
            Some("fd00:10:244::/56")
        );
        assert!(config.masquerade_all);
        assert_eq!(config.node_port_range, Some((30000, 32767)));
        assert_eq!(config.default_backend, Backend::Ipvs);
        assert_eq!(config.min_plan_interval, Duration::from_millis(250));
        assert_eq!(config.slice_fold_after, Duration::from_secs(3600));
        let signals: Vec<String> = config.leaving_signals.iter().map(LeavingSignal::name).collect();
        assert_eq!(signals, ["unschedulable", "label:example.com/retiring=yes"]);
        assert_eq!(config.drain_grace_period, Duration::from_secs(120));
        let defaults: Vec<String> = Config::default()
            .leaving_signals
            .iter()
            .map(LeavingSignal::name)
            .collect();
        assert_eq!(
            defaults,
            [
                "deletionTimestamp",
                "taint:ToBeDeletedByClusterAutoscaler",
                "taint:karpenter.sh/disrupted"
            ]
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let problems = Config::parse(
            "clusterCIDRs: [nope, 10.0.0.0/8, 10.1.0.0/16]\nmasqueradeBit: 40\nnodePortAddresses: [primary, x]\n\
             nodePortRange: 9-1\ndefaultBackend: ebpf\nipvsScheduler: fast\nmaxObjectBytes: 10\n\
             minPlanInterval: soon\nwriteQPS: 0\nwriteBurst: 0\nsliceFoldAfter: 10ms\n\
             leavingSignals: [deletionTimestamp, cordoned]\ndrainGracePeriod: later\n",
        )
        .unwrap_err();
        for want in [
            "clusterCIDRs[0]",
            "clusterCIDRs[2]",
            "masqueradeBit",
            "`primary` cannot be combined",
            "nodePortAddresses[1]",
            "nodePortRange",
            "defaultBackend",
            "ipvsScheduler",
            "maxObjectBytes",
            "minPlanInterval",
            "sliceFoldAfter: 10ms is shorter than 1s",
            "writeQPS",
            "writeBurst",
            "leavingSignals[1]: unknown signal \"cordoned\"",
            "drainGracePeriod",
        ] {
            assert!(
                problems.iter().any(|p| p.contains(want)),
                "missing {want} in {problems:?}"
            );
        }
    }

    /// Each bad exposure or detector setting is refused at start, naming its field.
    #[test]
    fn bad_detector_and_exposure_settings_name_their_field() {
        let cases = [
            (
                "detectLocalMode: BridgeInterface\n",
                "bridgeInterface: detectLocalMode BridgeInterface needs it",
            ),
            (
                "detectLocalMode: InterfaceNamePrefix\ninterfaceNamePrefix: \"\"\n",
                "interfaceNamePrefix: must not be empty",
            ),
            (
                "detectLocalMode: BridgeInterface\nbridgeInterface: a-very-long-bridge0\n",
                "bridgeInterface: is 19 bytes",
            ),
            (
                "detectLocalMode: BridgeInterface\nbridgeInterface: \"br 0\"\n",
                "bridgeInterface: \"br 0\" contains ' '",
            ),
            (
                "detectLocalMode: InterfaceNamePrefix\ninterfaceNamePrefix: \"veth*\"\n",
                "interfaceNamePrefix: \"veth*\" contains '*'",
            ),
            (
                "bridgeInterface: cbr0\n",
                "bridgeInterface: detectLocalMode ClusterCIDR does not read it",
            ),
            (
                "externalIPs: {allowCIDRs: [203.0.113.0/24, 198.51.100.0/33]}\n",
                "externalIPs.allowCIDRs[1]",
            ),
            ("externalIPs: {allowCIDRs: []}\n", "externalIPs.allowCIDRs: empty"),
            ("externalIPs: sometimes\n", "externalIPs"),
        ];
        for (text, want) in cases {
            let problems = Config::parse(text).unwrap_err();
            assert!(
                problems.iter().any(|p| p.contains(want)),
                "{text}: want {want:?} in {problems:?}"
            );
        }
    }

    #[test]
    fn detector_and_exposure_settings_parse() {
        let config = Config::parse(
            "detectLocalMode: InterfaceNamePrefix\ninterfaceNamePrefix: veth\nlocalhostNodePorts: true\n\
             externalIPs: {allowCIDRs: [203.0.113.7/24]}\nnodePortAddresses: []\n",
        )
        .unwrap();
        assert_eq!(config.detect_local_interface.as_deref(), Some("veth"));
        assert!(config.localhost_node_ports);
        let policy = &config.external_ips;
        assert_eq!(policy.describe(), "allowCIDRs [203.0.113.0/24]");
        assert!(policy.allows(&"203.0.113.200".parse().unwrap()));
        assert!(!policy.allows(&"198.51.100.1".parse().unwrap()));
        assert!(!ExternalIpPolicy::Deny.allows(&"203.0.113.200".parse().unwrap()));
        assert_eq!(
            Config::parse("externalIPs: deny\n").unwrap().external_ips,
            ExternalIpPolicy::Deny
        );
        // Written `[]`: every local address, on nftables too (the old behaviour, one setting away).
        assert_eq!(
            config.node_port_addresses_for(Backend::Nftables),
            Vec::<String>::new()
        );
        let defaults = Config::default();
        for (backend, want) in [
            (Backend::Nftables, vec!["primary".to_string()]),
            (Backend::Iptables, vec![]),
            (Backend::Ipvs, vec![]),
        ] {
            assert_eq!(defaults.node_port_addresses_for(backend), want, "{backend:?}");
        }
    }

    #[test]
    fn unknown_fields_and_yaml_11_booleans_are_rejected() {
        assert!(Config::parse("masqueradeAl: true\n").is_err());
        assert!(Config::parse("masqueradeAll: yes\n").is_err());
    }

    /// Found by the config fuzzer: seven levels of nine aliases as a key took 4 s to refuse. Five levels
    /// (59,049 events) stay under the parser's default budget of a million, so only our limit refuses
    /// them: no clock needed.
    #[test]
    fn an_alias_bomb_is_refused_at_once() {
        let mut bomb = String::from("[&a0 [x, x, x, x, x, x, x, x, x]");
        for level in 1..5 {
            bomb.push_str(&format!(
                ", &a{level} [{}]",
                vec![format!("*a{}", level - 1); 9].join(", ")
            ));
        }
        let problems = Config::parse(&format!("masqueradeBit: 14\n{bomb}]: 1\n")).unwrap_err();
        assert!(
            problems[0].contains("alias replay limit exceeded"),
            "{problems:?}"
        );
    }
}
