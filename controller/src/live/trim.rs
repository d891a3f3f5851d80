//! What the controller keeps of the objects it watches: every watch decodes into [`Delivered<K>`], which
//! drops the fields below from the event's JSON before it is decoded, so they can neither fail a watch
//! nor take memory.
//!
//! ```text
//! watch event JSON ─► Unread::prune (per kind, below) ─► decode (switchyard_api::tolerant)
//!                  ─► Delivered<K>: decoded | undecodable (key and field path) ─► engine caches ─► planner
//! ```
//!
//! Only fields the planner never reads are dropped: field-ownership bookkeeping, `kubectl apply`'s copy
//! of the whole object, a Service's status conditions (`lastTransitionTime: null` is accepted by the API
//! server and written by the upstream conformance suite, but refused by k8s-openapi), a Node's status
//! beyond its addresses (images, conditions, capacity: kilobytes per Node on a real cluster), an
//! endpoint's deprecated topology and its target reference beyond the Pod's name, and the agents'
//! status on our plans. At 10,000 Services and 1,000 Nodes that is tens of MiB the controller would
//! otherwise hold for nothing. A Node's spec (taints, unschedulable), labels and deletionTimestamp stay.

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use serde_json::{Map, Value};
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    tolerant::{Prune, Tolerant},
};

/// `kubectl apply`'s record of the last applied object.
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object as the controller's watches deliver it.
pub type Delivered<K> = Tolerant<K, Unread>;

/// What the controller never reads, per kind (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Unread;

/// A Service: metadata bookkeeping and status conditions (annotations carry IPVS settings; status
/// carries load balancer addresses).
impl Prune<Service> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        if let Some(status) = field(object, "status") {
            status.remove("conditions");
        }
    }
}

/// An EndpointSlice: metadata bookkeeping, each endpoint's deprecated topology map, and its target
/// reference down to the Pod's name (which the plan shows).
impl Prune<EndpointSlice> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        let endpoints = object.get_mut("endpoints").and_then(Value::as_array_mut);
        for endpoint in endpoints.into_iter().flatten().filter_map(Value::as_object_mut) {
            endpoint.remove("deprecatedTopology");
            if let Some(target) = field(endpoint, "targetRef") {
                target.retain(|key, _| key == "name");
            }
        }
    }
}

/// A Node: metadata bookkeeping and every status field but its addresses.
impl Prune<Node> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        if let Some(status) = field(object, "status") {
            status.retain(|key, _| key == "addresses");
        }
    }
}

/// A ServiceCIDR: metadata bookkeeping and its status (conditions the controller never reads).
impl Prune<ServiceCIDR> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        object.remove("status");
    }
}

/// Our plans: metadata bookkeeping and the agents' status (the controller compares specs only).
impl Prune<NodeForwardingPlan> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
        object.remove("status");
    }
}

/// Our slices: metadata bookkeeping.
impl Prune<ForwardingSlice> for Unread {
    fn prune(object: &mut Map<String, Value>) {
        metadata(object);
    }
}

/// `object[name]` as a map, when it is one (also for the rollouts' own pruning).
pub(super) fn field<'a>(
    object: &'a mut Map<String, Value>,
    name: &str,
) -> Option<&'a mut Map<String, Value>> {
    object.get_mut(name).and_then(Value::as_object_mut)
}

/// Drops metadata bookkeeping nothing reads: managedFields and kubectl's last-applied annotation.
pub(super) fn metadata(object: &mut Map<String, Value>) {
    let Some(meta) = field(object, "metadata") else {
        return;
    };
    meta.remove("managedFields");
    if let Some(annotations) = field(meta, "annotations") {
        annotations.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
    use kube::Resource;
    use serde::{Serialize, de::DeserializeOwned};

    use super::*;
    use crate::config::Config;
    use crate::planner::fixtures::{ServiceExt, endpoint, service, slice, three_nodes};
    use crate::planner::{Planner, Snapshot};

    fn with_bookkeeping(meta: &mut ObjectMeta) {
        meta.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..ManagedFieldsEntry::default()
        }]);
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(LAST_APPLIED.into(), "{\"huge\":true}".into());
    }

    fn untrimmed() -> Snapshot {
        let mut svc = service("shop", "web", "10.96.0.10", |s| {
            s.port("http", 80, "TCP");
        });
        with_bookkeeping(&mut svc.metadata);
        let mut eps = slice(
            "shop",
            "web",
            &[("http", 8080, "TCP")],
            vec![endpoint("10.244.1.5", "node-a"), endpoint("10.244.3.5", "node-c")],
        );
        with_bookkeeping(&mut eps.metadata);
        for ep in eps.endpoints.iter_mut().flatten() {
            if let Some(target) = ep.target_ref.as_mut() {
                target.uid = Some("uid-pod".into());
                target.namespace = Some("shop".into());
            }
        }
        let mut nodes = three_nodes();
        for node in &mut nodes {
            with_bookkeeping(&mut node.metadata);
            node.status.get_or_insert_with(Default::default).conditions = Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]);
        }
        Snapshot {
            services: vec![svc],
            slices: vec![eps],
            nodes,
        }
    }

    /// An object as a watch of the controller reads it off the wire.
    fn watched<K>(object: &K) -> K
    where
        K: Serialize + Resource + DeserializeOwned,
        K::DynamicType: Default,
        Unread: Prune<K>,
    {
        let json = serde_json::to_value(object).unwrap();
        serde_json::from_value::<Delivered<K>>(json)
            .unwrap()
            .into_result()
            .unwrap()
    }

    #[test]
    fn drops_bookkeeping_and_keeps_what_planning_reads() {
        let before = untrimmed();
        let after = Snapshot {
            services: before.services.iter().map(watched).collect(),
            slices: before.slices.iter().map(watched).collect(),
            nodes: before.nodes.iter().map(watched).collect(),
        };

        let metas = after.services.iter().map(|s| &s.metadata);
        let metas = metas.chain(after.slices.iter().map(|s| &s.metadata));
        for meta in metas.chain(after.nodes.iter().map(|n| &n.metadata)) {
            assert!(meta.managed_fields.is_none());
            assert!(
                !meta
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(LAST_APPLIED))
            );
        }
        let status = after.nodes[0].status.as_ref().expect("status kept");
        assert!(status.conditions.is_none() && status.addresses.is_some());
        let target = after.slices[0].endpoints.as_ref().expect("endpoints")[0]
            .target_ref
            .as_ref()
            .expect("target kept");
        assert!(target.name.is_some() && target.uid.is_none() && target.namespace.is_none());

        let config = Config::default();
        let before = Planner::build(&before, &config).expect("plans");
        let after = Planner::build(&after, &config).expect("plans");
        for name in ["node-a", "node-b", "node-c"] {
            assert_eq!(
                before.composed(name),
                after.composed(name),
                "{name}: trimming changes no plan"
            );
            assert!(after.composed(name).is_some_and(|c| c.is_ok()));
        }
    }

    /// What tells that a Node is leaving stays: its taints, unschedulable, labels and deletionTimestamp.
    #[test]
    fn a_nodes_spec_labels_and_deletion_survive() {
        let mut node = three_nodes().remove(0);
        let spec = node.spec.get_or_insert_with(Default::default);
        spec.unschedulable = Some(true);
        spec.taints = Some(vec![Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]);
        node.metadata.deletion_timestamp = Some(Time("2026-12-07T10:00:00Z".parse().unwrap()));
        node.metadata.labels.get_or_insert_with(Default::default).insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            "".into(),
        );
        let kept = watched(&node);
        assert_eq!(kept.spec, node.spec);
        assert_eq!(kept.metadata.labels, node.metadata.labels);
        assert_eq!(kept.metadata.deletion_timestamp, node.metadata.deletion_timestamp);
    }

    /// A Service status condition without `lastTransitionTime` (as the conformance suite writes it), and
    /// a plan whose status an agent wrote oddly, decode: the controller never reads them.
    #[test]
    fn fields_never_read_never_fail() {
        let svc = serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Test",
                                       "message": "", "lastTransitionTime": null}],
                       "loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}},
        });
        let svc = serde_json::from_value::<Delivered<Service>>(svc)
            .unwrap()
            .into_result()
            .unwrap();
        let status = svc.status.unwrap();
        assert!(status.conditions.is_none());
        assert!(
            status.load_balancer.is_some(),
            "load balancer addresses are planned"
        );

        let plan = serde_json::json!({
            "metadata": {"name": "node-a"},
            "spec": serde_json::to_value(switchyard_api::testing::plan("node-a", vec![])).unwrap(),
            "status": {"observedRevision": 7, "conditions": "none"},
        });
        assert!(
            serde_json::from_value::<Delivered<NodeForwardingPlan>>(plan)
                .unwrap()
                .decoded()
                .is_some()
        );
    }
}
