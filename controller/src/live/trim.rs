//! What the controller keeps of the objects it watches: the watch streams pass every object through
//! these functions before the caches see it.
//!
//! ```text
//! watcher ─► trim::{service, endpoint_slice, node} ─► engine caches ─► planner
//! ```
//!
//! Only fields the planner never reads are dropped: field-ownership bookkeeping, `kubectl apply`'s copy
//! of the whole object, a Node's status beyond its addresses (images, conditions, capacity: kilobytes
//! per Node on a real cluster), and an endpoint's target reference beyond the Pod's name. At 10,000
//! Services and 1,000 Nodes that is tens of MiB the controller would otherwise hold for nothing.

use k8s_openapi::api::{
    core::v1::{Node, NodeStatus, ObjectReference, Service},
    discovery::v1::EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// `kubectl apply`'s record of the last applied object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A Service: metadata bookkeeping only (annotations carry IPVS settings; status carries load balancer
/// addresses).
pub fn service(service: &mut Service) {
    metadata(&mut service.metadata);
}

/// An EndpointSlice: metadata bookkeeping, each endpoint's deprecated topology map, and its target
/// reference down to the Pod's name (which the plan shows).
pub fn endpoint_slice(slice: &mut EndpointSlice) {
    metadata(&mut slice.metadata);
    for endpoint in slice.endpoints.iter_mut().flatten() {
        endpoint.deprecated_topology = None;
        if let Some(target) = endpoint.target_ref.as_mut() {
            *target = ObjectReference {
                name: target.name.take(),
                ..ObjectReference::default()
            };
        }
    }
}

/// A Node: metadata bookkeeping and every status field but its addresses.
pub fn node(node: &mut Node) {
    metadata(&mut node.metadata);
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            addresses: status.addresses.take(),
            ..NodeStatus::default()
        };
    }
}

fn metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

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

    #[test]
    fn drops_bookkeeping_and_keeps_what_planning_reads() {
        let before = untrimmed();
        let mut after = untrimmed();
        after.services.iter_mut().for_each(super::service);
        after.slices.iter_mut().for_each(endpoint_slice);
        after.nodes.iter_mut().for_each(node);

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
}
