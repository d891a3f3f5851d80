//! Whether a node is leaving the cluster, decided once for the fleet from its Node object.
//!
//! ```text
//! config leavingSignals (parsed: LeavingSignal::parse) ─┐
//! Node: deletionTimestamp, spec.taints, spec.unschedulable, labels ─► leaving(node, signals, grace)
//!   ─► the first signal that matches, in the configured order ─► Leaving { reason, since, grace }
//!   ─► the plan header (`spec.leaving`) ─► the agent fails kube-proxy's /healthz and reports its drain
//! ```
//!
//! kube-proxy v1.36 (KEP-3836) answers 503 on `/healthz` while its Node has a `deletionTimestamp` or
//! the cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint. Karpenter marks the nodes it is
//! about to remove with `karpenter.sh/disrupted` (aws-load-balancer-controller#4023 counts it too), so
//! the defaults are those three. A cordon (`spec.unschedulable`) and any taint or label the user names
//! are opt-in: a cordon often means maintenance, not removal.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use switchyard_api::Leaving;

/// The cluster autoscaler's taint on a node it is about to delete.
pub const TAINT_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";
/// Karpenter's taint on a node it is about to disrupt.
pub const TAINT_KARPENTER: &str = "karpenter.sh/disrupted";

/// The signals used when the configuration names none: kube-proxy's two and Karpenter's.
pub fn default_signals() -> Vec<LeavingSignal> {
    vec![
        LeavingSignal::DeletionTimestamp,
        LeavingSignal::Taint(TAINT_CLUSTER_AUTOSCALER.to_string()),
        LeavingSignal::Taint(TAINT_KARPENTER.to_string()),
    ]
}

/// One thing on a Node that says it is leaving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeavingSignal {
    /// The Node is being deleted (`metadata.deletionTimestamp`).
    DeletionTimestamp,
    /// The Node is cordoned (`spec.unschedulable`).
    Unschedulable,
    /// The Node carries a taint with this key (any value and effect).
    Taint(String),
    /// The Node carries this label (with this value, when one is given).
    Label {
        /// The label's key.
        key: String,
        /// The value it must have; any value when absent.
        value: Option<String>,
    },
}

/// What the configuration may name, for the error that refuses an unknown signal.
pub const KNOWN_SIGNALS: &str = "deletionTimestamp, unschedulable, taint:KEY, label:KEY or label:KEY=VALUE";

impl LeavingSignal {
    /// Reads one configured signal; an unknown one is an error naming it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let key_ok = |key: &str| {
            !key.is_empty()
                && key.len() <= 316
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        };
        match text.split_once(':') {
            None if text == "deletionTimestamp" => Ok(Self::DeletionTimestamp),
            None if text == "unschedulable" => Ok(Self::Unschedulable),
            Some(("taint", key)) if key_ok(key) => Ok(Self::Taint(key.to_string())),
            Some(("label", rest)) => {
                let (key, value) = match rest.split_once('=') {
                    Some((key, value)) => (key, Some(value.to_string())),
                    None => (rest, None),
                };
                if key_ok(key) {
                    Ok(Self::Label {
                        key: key.to_string(),
                        value,
                    })
                } else {
                    Err(format!("{text:?}: {key:?} is not a label key"))
                }
            }
            Some(("taint", key)) => Err(format!("{text:?}: {key:?} is not a taint key")),
            _ => Err(format!("unknown signal {text:?} (known: {KNOWN_SIGNALS})")),
        }
    }

    /// The signal as configured (and as the plan's `leaving.reason` says it).
    pub fn name(&self) -> String {
        match self {
            Self::DeletionTimestamp => "deletionTimestamp".to_string(),
            Self::Unschedulable => "unschedulable".to_string(),
            Self::Taint(key) => format!("taint:{key}"),
            Self::Label { key, value: None } => format!("label:{key}"),
            Self::Label {
                key,
                value: Some(value),
            } => format!("label:{key}={value}"),
        }
    }

    /// Whether `node` shows this signal, and since when if it says.
    fn matches(&self, node: &Node) -> Option<Option<String>> {
        match self {
            Self::DeletionTimestamp => {
                let at = node.metadata.deletion_timestamp.as_ref()?;
                Some(Some(at.0.to_string()))
            }
            Self::Unschedulable => node
                .spec
                .as_ref()
                .and_then(|spec| spec.unschedulable)
                .filter(|cordoned| *cordoned)
                .map(|_| None),
            Self::Taint(key) => node
                .spec
                .as_ref()?
                .taints
                .as_ref()?
                .iter()
                .find(|taint| &taint.key == key)
                .map(|taint| taint.time_added.as_ref().map(|at| at.0.to_string())),
            Self::Label { key, value } => {
                let found = node.metadata.labels.as_ref()?.get(key)?;
                value
                    .as_ref()
                    .is_none_or(|wanted| wanted == found)
                    .then_some(None)
            }
        }
    }
}

/// Whether `node` is leaving: the first of `signals` it shows.
pub fn leaving(node: &Node, signals: &[LeavingSignal], drain_grace: Duration) -> Option<Leaving> {
    signals.iter().find_map(|signal| {
        let since = signal.matches(node)?;
        Some(Leaving {
            reason: signal.name(),
            since,
            drain_grace_seconds: u32::try_from(drain_grace.as_secs()).unwrap_or(u32::MAX),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn node(edit: impl FnOnce(&mut Node)) -> Node {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("node-a".into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: None,
        };
        edit(&mut node);
        node
    }

    fn taint(key: &str, added: Option<&str>) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            time_added: added.map(|at| Time(at.parse().unwrap())),
            value: None,
        }
    }

    fn taints(node: &mut Node, taints: Vec<Taint>) {
        node.spec.get_or_insert_with(Default::default).taints = Some(taints);
    }

    #[test]
    fn the_first_configured_signal_a_node_shows_is_its_reason() {
        let grace = Duration::from_secs(600);
        let all: Vec<LeavingSignal> = [
            "deletionTimestamp",
            "taint:ToBeDeletedByClusterAutoscaler",
            "taint:karpenter.sh/disrupted",
            "unschedulable",
            "label:example.com/retiring=yes",
        ]
        .iter()
        .map(|s| LeavingSignal::parse(s).unwrap())
        .collect();
        // (what, node, signals, reason, since)
        type Case = (
            &'static str,
            Node,
            Vec<LeavingSignal>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            ("serving", node(|_| {}), all.clone(), None, None),
            (
                "deleted",
                node(|n| n.metadata.deletion_timestamp = Some(Time("2026-12-07T10:00:00Z".parse().unwrap()))),
                all.clone(),
                Some("deletionTimestamp"),
                Some("2026-12-07T10:00:00Z"),
            ),
            (
                "the autoscaler's taint, with its time",
                node(|n| {
                    taints(
                        n,
                        vec![taint(
                            "ToBeDeletedByClusterAutoscaler",
                            Some("2026-12-07T09:00:00Z"),
                        )],
                    )
                }),
                default_signals(),
                Some("taint:ToBeDeletedByClusterAutoscaler"),
                Some("2026-12-07T09:00:00Z"),
            ),
            (
                "Karpenter's taint among many others",
                node(|n| {
                    let mut many: Vec<Taint> = (0..50)
                        .map(|i| taint(&format!("example.com/t{i}"), None))
                        .collect();
                    many.push(taint("karpenter.sh/disrupted", None));
                    taints(n, many)
                }),
                default_signals(),
                Some("taint:karpenter.sh/disrupted"),
                None,
            ),
            (
                "cordoned, but cordons are not a default signal",
                node(|n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(true)),
                default_signals(),
                None,
                None,
            ),
            (
                "cordoned, opted in",
                node(|n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(true)),
                all.clone(),
                Some("unschedulable"),
                None,
            ),
            (
                "uncordoned explicitly",
                node(|n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(false)),
                all.clone(),
                None,
                None,
            ),
            (
                "a label with the wrong value",
                node(|n| {
                    n.metadata.labels = Some([("example.com/retiring".to_string(), "no".to_string())].into())
                }),
                all.clone(),
                None,
                None,
            ),
            (
                "a label with the value asked for",
                node(|n| {
                    n.metadata.labels = Some([("example.com/retiring".to_string(), "yes".to_string())].into())
                }),
                all.clone(),
                Some("label:example.com/retiring=yes"),
                None,
            ),
            (
                "deleted and tainted: the first configured wins",
                node(|n| {
                    n.metadata.deletion_timestamp = Some(Time("2026-12-07T10:00:00Z".parse().unwrap()));
                    taints(n, vec![taint("ToBeDeletedByClusterAutoscaler", None)]);
                }),
                all.clone(),
                Some("deletionTimestamp"),
                Some("2026-12-07T10:00:00Z"),
            ),
            (
                "no signals configured",
                node(|n| taints(n, vec![taint("karpenter.sh/disrupted", None)])),
                vec![],
                None,
                None,
            ),
        ];
        for (what, node, signals, reason, since) in cases {
            let found = leaving(&node, &signals, grace);
            assert_eq!(found.as_ref().map(|l| l.reason.as_str()), reason, "{what}");
            assert_eq!(found.as_ref().and_then(|l| l.since.as_deref()), since, "{what}");
            if let Some(found) = found {
                assert_eq!(found.drain_grace_seconds, 600, "{what}");
            }
        }
    }

    #[test]
    fn signals_read_back_as_written_and_unknown_ones_are_named() {
        for text in [
            "deletionTimestamp",
            "unschedulable",
            "taint:ToBeDeletedByClusterAutoscaler",
            "taint:karpenter.sh/disrupted",
            "label:example.com/retiring",
            "label:example.com/retiring=yes",
        ] {
            assert_eq!(LeavingSignal::parse(text).unwrap().name(), text);
        }
        for (text, says) in [
            ("cordon", "unknown signal \"cordon\""),
            ("deletiontimestamp", "unknown signal"),
            ("taint:", "is not a taint key"),
            ("taint:a b", "is not a taint key"),
            ("label:=x", "is not a label key"),
            ("annotation:x", "unknown signal"),
        ] {
            let error = LeavingSignal::parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert!(
            LeavingSignal::parse("cordon")
                .unwrap_err()
                .contains(KNOWN_SIGNALS)
        );
    }
}
