//! What the rollouts keep of the objects they watch: each watch decodes into [`Delivered<K>`], which
//! drops what a rollout step never reads before decoding, so it can neither fail the watch nor take
//! memory.
//!
//! ```text
//! watch event JSON ─► Read::prune (per kind, below) ─► decode (switchyard_api::tolerant)
//!                  ─► Delivered<K>: decoded | undecodable (key and field path) ─► Observed
//! ```
//!
//! A step reads a Node's labels, a plan's header (node, backend, revision) and its agent's status, and
//! a rollout whole. The engine's own watches ([`crate::live::trim`]) keep the opposite of a plan (its
//! spec, never its status), so the rollouts watch plans on their own; their Node watch keeps only
//! metadata, a fraction of what the engine keeps per Node.

use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value};
use switchyard_api::{
    ForwardingRollout, NodeForwardingPlan,
    tolerant::{Prune, Tolerant},
};

use crate::live::trim::{field, metadata};

/// The fields of a plan's spec a step reads, and those its type requires to decode (the summary is
/// required so a plan file cannot lose it unnoticed; it is a handful of counts).
const PLAN_HEADER: [&str; 5] = ["nodeName", "backend", "cluster", "revision", "summary"];

/// An object as the rollouts' watches deliver it.
pub type Delivered<K> = Tolerant<K, Read>;

/// What the rollouts read, per kind (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Read;

/// A rollout: metadata bookkeeping only (its spec and status are all read).
impl Prune<ForwardingRollout> for Read {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
    }
}

/// A Node: its metadata (name, labels, resourceVersion), nothing of its spec or status.
impl Prune<Node> for Read {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        if let Some(meta) = field(object, "metadata") {
            meta.remove("annotations");
        }
        object.remove("spec");
        object.remove("status");
    }
}

/// A plan: its header and its agent's status; the entries (overrides, local endpoints) go.
impl Prune<NodeForwardingPlan> for Read {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        if let Some(spec) = field(object, "spec") {
            spec.retain(|key, _| PLAN_HEADER.contains(&key.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use switchyard_api::Backend;

    use super::*;
    use crate::live::trim::LAST_APPLIED;

    fn delivered<K>(value: Value) -> K
    where
        K: kube::Resource + serde::de::DeserializeOwned,
        K::DynamicType: Default,
        Read: Prune<K>,
    {
        serde_json::from_value::<Delivered<K>>(value)
            .unwrap()
            .into_result()
            .unwrap()
    }

    #[test]
    fn a_plan_keeps_its_header_and_status_and_drops_its_entries() {
        let mut spec = switchyard_api::testing::plan("node-a", vec![]);
        spec.backend = Backend::Nftables;
        spec.endpoints_on_node = vec!["10.244.1.5".into()];
        let mut value = json!({
            "apiVersion": "switchyard.io/v1alpha2",
            "kind": "NodeForwardingPlan",
            "metadata": {"name": "node-a", "resourceVersion": "7",
                         "managedFields": [{"manager": "switchyard-controller"}]},
            "spec": serde_json::to_value(&spec).unwrap(),
            "status": {"observedRevision": spec.revision, "backend": "nftables"},
        });
        value["spec"]["overrides"] = json!([{"broken": true}]);
        let plan: NodeForwardingPlan = delivered(value);
        assert_eq!(plan.spec.backend, Backend::Nftables);
        assert_eq!(plan.spec.revision, spec.revision);
        assert!(plan.spec.endpoints_on_node.is_empty() && plan.spec.overrides.is_empty());
        assert!(plan.metadata.managed_fields.is_none());
        let status = plan.status.unwrap();
        assert_eq!(status.backend, Some(Backend::Nftables));
        assert_eq!(status.observed_revision.as_deref(), Some(spec.revision.as_str()));
    }

    #[test]
    fn a_node_keeps_its_name_labels_and_version_only() {
        let node: Node = delivered(json!({
            "metadata": {"name": "node-a", "resourceVersion": "12",
                         "labels": {"switchyard.io/backend": "nftables"},
                         "annotations": {"big": "x"}},
            "spec": {"taints": "not a list"},
            "status": {"conditions": [{"type": "Ready", "lastTransitionTime": null}]},
        }));
        assert_eq!(node.metadata.resource_version.as_deref(), Some("12"));
        assert_eq!(node.metadata.labels.unwrap()["switchyard.io/backend"], "nftables");
        assert!(node.metadata.annotations.is_none() && node.spec.is_none() && node.status.is_none());
    }

    #[test]
    fn a_rollout_is_read_whole() {
        let rollout: ForwardingRollout = delivered(json!({
            "apiVersion": "switchyard.io/v1alpha2",
            "kind": "ForwardingRollout",
            "metadata": {"name": "to-nftables", "generation": 2,
                         "annotations": {LAST_APPLIED: "{}", "keep": "me"}},
            "spec": {"target": {"backend": "nftables"}, "maxParallel": 2},
            "status": {"phase": "Progressing", "total": 3},
        }));
        assert_eq!(rollout.spec.max_parallel, 2);
        assert_eq!(rollout.status.unwrap().total, 3);
        let annotations = rollout.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED) && annotations.contains_key("keep"));
    }
}
