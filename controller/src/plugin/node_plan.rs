//! `kubectl switchyard plan --node N`: what one node forwards, from the live objects.
//!
//! ```text
//! its NodeForwardingPlan + the ForwardingSlices of its views ─► compose (exactly as its agent does)
//!   ─► one self-contained plan (no views; the revision hashes this content; the live status kept)
//! ```
//!
//! The output is a plan file: `switchyard-agent render|explain --plan FILE` reads it on any machine.
//! Pure: the command reads the objects.

use switchyard_api::{ForwardingSlice, NodeForwardingPlan, compose::SliceRef, compose::compose, revision};

use crate::error::Error;

/// `live` composed with `slices` (any superset of its views' slices).
pub fn composed_plan(
    live: &NodeForwardingPlan,
    slices: &[ForwardingSlice],
) -> Result<NodeForwardingPlan, Error> {
    let node = live
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| live.spec.node_name.clone());
    let refs: Vec<SliceRef<'_>> = slices
        .iter()
        .filter_map(|s| {
            Some(SliceRef {
                name: s.metadata.name.as_deref()?,
                spec: &s.spec,
            })
        })
        .collect();
    let composed = compose(&live.spec, &refs).map_err(|why| {
        Error::Compose(format!(
            "node {node}'s plan cannot be composed from the API server's slices yet: {why}"
        ))
    })?;
    let mut spec = composed.spec;
    spec.revision = revision::compute(&spec)?;
    let mut metadata = live.metadata.clone();
    // Server bookkeeping says nothing about what the node forwards, and a file with it cannot be applied.
    metadata.managed_fields = None;
    metadata.resource_version = None;
    metadata.uid = None;
    metadata.generation = None;
    Ok(NodeForwardingPlan {
        metadata,
        spec,
        status: live.status.clone(),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use switchyard_api::testing::{EntryExt as _, entry, ep, live_plan, slice};

    use super::*;

    fn object(spec: switchyard_api::NodeForwardingPlanSpec) -> NodeForwardingPlan {
        NodeForwardingPlan {
            metadata: ObjectMeta {
                name: Some(spec.node_name.clone()),
                resource_version: Some("42".to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    #[test]
    fn a_live_plan_composes_with_its_views_into_a_plan_file_whose_revision_matches() {
        let live = object(live_plan("node-a", &["all"], Vec::new()));
        let (name, spec) = slice(
            "all",
            0,
            1,
            vec![entry("ns/web:http", "10.96.0.10", 80).with(ep("10.244.1.5", 8080))],
        );
        let slices = [ForwardingSlice::new(&name, spec)];
        let plan = composed_plan(&live, &slices).unwrap();
        assert!(plan.spec.views.is_empty(), "self-contained");
        assert_eq!(plan.spec.services.len(), 1);
        assert_eq!(plan.spec.revision, revision::compute(&plan.spec).unwrap());
        assert_eq!(plan.metadata.resource_version, None);
    }

    #[test]
    fn a_view_without_its_slices_says_which_node_and_why() {
        let live = object(live_plan("node-a", &["all"], Vec::new()));
        let error = composed_plan(&live, &[]).unwrap_err().to_string();
        assert!(error.contains("node node-a's plan cannot be composed"), "{error}");
    }
}
