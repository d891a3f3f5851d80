//! The intake: everything the watches delivered, as the engine keeps it. Caches of the Services,
//! EndpointSlices and Nodes the planner reads, our own plans and slices as their watches show them,
//! and what that makes dirty.
//!
//! ```text
//! Service / EndpointSlice / Node events ─► caches ─► dirty Services (by key) | rebuild (relist, Node)
//!                                            ├► an empty relist while objects were known ─► suspects
//!                                            └► a version that does not decode: last good kept ─► broken
//! our plans / slices events ─► Seen (revision, consistent?) ─► Watched { tracker, synced, relist }
//!                                                              └► edited or deleted by others ─► restored
//!    (one that does not decode is seen as inconsistent, so it is restored; and reported in broken)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice, networking::v1::ServiceCIDR},
    jiff::Timestamp,
};
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    names::{LABEL_NODE, LABEL_VIEW},
    revision,
    tolerant::Undecodable,
};

use super::{
    cache::{ObjectCache, cluster, namespaced},
    object::ObjectRef,
    tracker::{Observed, Tracker},
    trim::Delivered,
};

/// A kind whose relist came back empty while objects were known: unconfirmed, so ignored for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SuspectEmpty {
    /// Services.
    Services,
    /// EndpointSlices.
    Slices,
}

/// What the watches delivered.
pub(super) struct Intake {
    pub(super) services: ObjectCache<Service>,
    pub(super) slices: ObjectCache<EndpointSlice>,
    pub(super) nodes: ObjectCache<Node>,
    /// ServiceCIDRs (the plans' Service ranges).
    pub(super) service_cidrs: ObjectCache<ServiceCIDR>,
    /// The API server has no ServiceCIDRs (their watch failed before listing): plan without waiting
    /// for them.
    pub(super) service_cidrs_unavailable: bool,
    /// Our plans, as their watch shows them.
    pub(super) plans: Watched,
    /// Our ForwardingSlices, as their watch shows them.
    pub(super) fws: Watched,
    /// Services to re-plan, with the earliest trigger time of their changes.
    pub(super) dirty_services: BTreeMap<String, Option<Timestamp>>,
    /// The whole cluster must be re-planned (a relist, a Node change).
    pub(super) rebuild: bool,
    /// Objects a watch showed changed or deleted by someone else (for logs and metrics).
    pub(super) restored: Vec<ObjectRef>,
    /// Objects whose latest version did not decode, each once per breakage (for logs and metrics).
    pub(super) broken: Vec<Undecodable>,
    /// Empty relists waiting for confirmation (the objects known before them stay in the caches).
    pub(super) suspects: BTreeSet<SuspectEmpty>,
}

impl Intake {
    /// Nothing delivered yet: the first planning is a full one.
    pub(super) fn new() -> Self {
        Self {
            services: ObjectCache::new(namespaced),
            slices: ObjectCache::new(namespaced),
            nodes: ObjectCache::new(cluster),
            service_cidrs: ObjectCache::new(cluster),
            service_cidrs_unavailable: false,
            plans: Watched::default(),
            fws: Watched::default(),
            dirty_services: BTreeMap::new(),
            rebuild: true,
            restored: Vec::new(),
            broken: Vec::new(),
            suspects: BTreeSet::new(),
        }
    }
}

/// Objects of one written kind listed (or written) since its watch's relist began.
#[derive(Debug, Default)]
pub(super) struct Relist(pub(super) Option<BTreeSet<String>>);

/// The objects of one kind we write, as their watch shows them.
#[derive(Debug, Default)]
pub(super) struct Watched {
    pub(super) tracker: Tracker,
    /// Listed once.
    pub(super) synced: bool,
    pub(super) relist: Relist,
}

/// Which of our kinds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ours {
    Plans,
    Slices,
}

impl Ours {
    pub(super) fn object(self, name: String) -> ObjectRef {
        match self {
            Self::Plans => ObjectRef::Plan(name),
            Self::Slices => ObjectRef::Slice(name),
        }
    }
}

/// One watched object of ours, reduced to what the engine compares.
pub(super) struct Seen {
    pub(super) name: String,
    pub(super) observed: Observed,
    pub(super) resource_version: Option<String>,
    /// Why its spec could not be read, when it could not.
    pub(super) undecodable: Option<Box<Undecodable>>,
}

impl Seen {
    /// A plan: consistent when its spec hashes to its revision and it carries the node label the agent
    /// selects it by (a plan without it is as good as missing for the agent). One that does not decode
    /// is inconsistent.
    pub(super) fn plan(plan: Delivered<NodeForwardingPlan>) -> Option<Self> {
        let plan = match plan.into_result() {
            Ok(plan) => plan,
            Err(undecodable) => {
                let meta = &undecodable.metadata;
                let label = meta.labels.as_ref().and_then(|l| l.get(LABEL_NODE));
                let node = label.or(meta.name.as_ref()).cloned();
                return Self::undecodable(undecodable, node);
            }
        };
        let name = plan.metadata.name?;
        let label = plan
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_NODE))
            .cloned();
        let consistent = label.as_ref() == Some(&name)
            && revision::compute(&plan.spec).is_ok_and(|r| r == plan.spec.revision);
        Some(Self {
            observed: Observed {
                revision: plan.spec.revision,
                consistent,
                node: Some(label.unwrap_or(plan.spec.node_name)),
            },
            name,
            resource_version: plan.metadata.resource_version,
            undecodable: None,
        })
    }

    /// A slice: consistent when its spec hashes to its revision and it carries the view label agents
    /// select it by. One that does not decode is inconsistent.
    pub(super) fn slice(slice: Delivered<ForwardingSlice>) -> Option<Self> {
        let slice = match slice.into_result() {
            Ok(slice) => slice,
            Err(undecodable) => return Self::undecodable(undecodable, None),
        };
        let name = slice.metadata.name?;
        let labelled =
            slice.metadata.labels.as_ref().and_then(|l| l.get(LABEL_VIEW)) == Some(&slice.spec.view);
        let consistent =
            labelled && revision::compute_slice(&slice.spec).is_ok_and(|r| r == slice.spec.revision);
        Some(Self {
            observed: Observed {
                revision: slice.spec.revision,
                consistent,
                node: None,
            },
            name,
            resource_version: slice.metadata.resource_version,
            undecodable: None,
        })
    }

    /// One of ours that does not decode: nothing of it can be compared, so it is rewritten. `node`: a
    /// plan's (its label, else its name: what the orphan sweep goes by).
    fn undecodable(undecodable: Box<Undecodable>, node: Option<String>) -> Option<Self> {
        let meta = &undecodable.metadata;
        let name = meta.name.clone()?;
        Some(Self {
            name,
            observed: Observed {
                revision: String::new(),
                consistent: false,
                node,
            },
            resource_version: meta.resource_version.clone(),
            undecodable: Some(undecodable),
        })
    }
}

impl Relist {
    pub(super) fn note(&mut self, name: &str) {
        if let Some(seen) = self.0.as_mut() {
            seen.insert(name.to_string());
        }
    }
}
