//! ServiceCIDR objects (networking.k8s.io/v1, KEP-1880) → the Service ranges every plan's header
//! carries, so agents drop traffic to unallocated addresses inside them (kube-proxy's nftables
//! `cluster-ips-check`).
//!
//! ```text
//! ServiceCIDR objects (watch, or a dump) ─┐
//! pod CIDRs (clusterCIDRs, Nodes' podCIDRs) ┴─► accept() ─► sorted, deduplicated CIDRs ─► Config.service_cidrs
//!                                                      └─► [CidrProblem] ─► warning (offline) | Warning Event
//! ```
//!
//! A ServiceCIDR with a CIDR that is not canonical, or that overlaps a pod CIDR, is ignored whole: a
//! range that covers pods would drop pod traffic on every node. Its problem names it; the other
//! ServiceCIDRs, and every Service, are unaffected. Like kube-proxy, a ServiceCIDR being deleted still
//! counts (its addresses may still be allocated).

use ipnet::IpNet;
use k8s_openapi::api::{core::v1::Node, networking::v1::ServiceCIDR};
use switchyard_api::ip::{parse_cidr_sloppy, parse_cidr_strict};

use crate::Config;

/// The most ServiceCIDRs a plan carries (the CRD's limit); more are ignored with a problem.
pub const MAX_SERVICE_CIDRS: usize = 64;

/// The Event reasons.
pub mod reasons {
    /// A CIDR of the object is not a canonical CIDR.
    pub const INVALID: &str = "InvalidServiceCIDR";
    /// A CIDR of the object overlaps a pod CIDR.
    pub const OVERLAPS_POD_CIDR: &str = "ServiceCIDROverlapsPodCIDR";
    /// More Service ranges than a plan carries.
    pub const TOO_MANY: &str = "TooManyServiceCIDRs";
}

/// Why one ServiceCIDR object is ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CidrProblem {
    /// The object's name.
    pub name: String,
    /// Its uid, for the Event.
    pub uid: Option<String>,
    /// One of [`reasons`].
    pub reason: &'static str,
    /// What is wrong, in words.
    pub message: String,
}

/// The Service ranges of `objects`, sorted and deduplicated, and why the others are ignored.
/// `pod_cidrs`: the configured cluster CIDRs and the Nodes' pod CIDRs.
pub fn accept<'a>(
    objects: impl IntoIterator<Item = &'a ServiceCIDR>,
    pod_cidrs: &[IpNet],
) -> (Vec<IpNet>, Vec<CidrProblem>) {
    let mut accepted: Vec<IpNet> = Vec::new();
    let mut problems = Vec::new();
    for object in objects {
        let name = object.metadata.name.clone().unwrap_or_default();
        let problem = |reason, message| CidrProblem {
            name: name.clone(),
            uid: object.metadata.uid.clone(),
            reason,
            message,
        };
        let texts = object.spec.as_ref().and_then(|s| s.cidrs.as_ref());
        let mut cidrs = Vec::new();
        let mut refused = None;
        for text in texts.into_iter().flatten() {
            let Some(net) = parse_cidr_strict(text) else {
                refused = Some(problem(
                    reasons::INVALID,
                    format!("{text:?} is not a canonical CIDR; this ServiceCIDR is ignored"),
                ));
                break;
            };
            if let Some(pods) = pod_cidrs.iter().find(|pods| overlap(pods, &net)) {
                refused = Some(problem(
                    reasons::OVERLAPS_POD_CIDR,
                    format!(
                        "{net} overlaps the pod CIDR {pods}: dropping traffic to its unallocated addresses \
                         would drop pod traffic; this ServiceCIDR is ignored"
                    ),
                ));
                break;
            }
            cidrs.push(net);
        }
        match refused {
            Some(problem) => problems.push(problem),
            None => accepted.extend(cidrs),
        }
    }
    accepted.sort();
    accepted.dedup();
    if accepted.len() > MAX_SERVICE_CIDRS {
        problems.push(CidrProblem {
            name: String::new(),
            uid: None,
            reason: reasons::TOO_MANY,
            message: format!(
                "{} Service ranges, a plan carries at most {MAX_SERVICE_CIDRS}: the others are not dropped",
                accepted.len()
            ),
        });
        accepted.truncate(MAX_SERVICE_CIDRS);
    }
    problems.sort();
    (accepted, problems)
}

/// What a ServiceCIDR must not overlap: the configured cluster CIDRs and every Node's pod CIDRs.
pub fn pod_cidrs<'a>(nodes: impl IntoIterator<Item = &'a Node>, config: &Config) -> Vec<IpNet> {
    let mut cidrs = config.cluster_cidrs.clone();
    for node in nodes {
        let spec = node.spec.as_ref();
        let texts = spec.and_then(|s| s.pod_cidrs.as_ref()).into_iter().flatten();
        cidrs.extend(
            texts
                .chain(spec.and_then(|s| s.pod_cidr.as_ref()))
                .filter_map(|t| parse_cidr_sloppy(t)),
        );
    }
    cidrs.sort();
    cidrs.dedup();
    cidrs
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn object(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
    }

    #[test]
    fn bad_service_cidrs_are_ignored_alone_and_named() {
        let pods: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        /// (case, objects, ranges accepted, (object, message) of each one ignored).
        type Case = (
            &'static str,
            Vec<ServiceCIDR>,
            Vec<&'static str>,
            Vec<(&'static str, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "the default and an extra range, dual-stack",
                vec![
                    object("kubernetes", &["10.96.0.0/16", "fd00:10:96::/112"]),
                    object("extra", &["10.97.0.0/16"]),
                ],
                vec!["10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112"],
                vec![],
            ),
            (
                "overlapping the pod CIDR, either way round",
                vec![
                    object("kubernetes", &["10.96.0.0/16"]),
                    object("inside-pods", &["10.244.5.0/24"]),
                    object("around-pods", &["10.0.0.0/8"]),
                ],
                vec!["10.96.0.0/16"],
                vec![
                    ("around-pods", "10.0.0.0/8 overlaps the pod CIDR 10.244.0.0/16"),
                    ("inside-pods", "10.244.5.0/24 overlaps the pod CIDR 10.244.0.0/16"),
                ],
            ),
            (
                "invalid: the whole object goes, its valid CIDR too",
                vec![
                    object("kubernetes", &["10.96.0.0/16"]),
                    object("typo", &["10.98.0.0/16", "10.99.0.1/16"]),
                ],
                vec!["10.96.0.0/16"],
                vec![("typo", "\"10.99.0.1/16\" is not a canonical CIDR")],
            ),
            (
                "the same range twice",
                vec![object("a", &["10.96.0.0/16"]), object("b", &["10.96.0.0/16"])],
                vec!["10.96.0.0/16"],
                vec![],
            ),
        ];
        for (name, objects, want, want_problems) in cases {
            let (got, problems) = accept(&objects, &pods);
            let got: Vec<String> = got.iter().map(ToString::to_string).collect();
            assert_eq!(got, want, "{name}");
            let problems: Vec<(&str, &str)> = problems
                .iter()
                .map(|p| (p.name.as_str(), p.message.as_str()))
                .collect();
            assert_eq!(problems.len(), want_problems.len(), "{name}: {problems:?}");
            for ((object, message), (want_object, want_message)) in problems.iter().zip(&want_problems) {
                assert_eq!(object, want_object, "{name}");
                assert!(message.contains(want_message), "{name}: {message}");
            }
        }
    }

    #[test]
    fn more_ranges_than_a_plan_carries_are_cut_with_a_problem() {
        let objects: Vec<ServiceCIDR> = (0..70)
            .map(|i| object(&format!("r{i}"), &[&format!("10.{i}.0.0/16")]))
            .collect();
        let (got, problems) = accept(&objects, &[]);
        assert_eq!(got.len(), MAX_SERVICE_CIDRS);
        assert_eq!(problems[0].reason, reasons::TOO_MANY);
    }
}
