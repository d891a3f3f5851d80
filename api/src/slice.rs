//! `ForwardingSlice`: a bounded group of entries exactly as every node of one *view* forwards them.
//!
//! ```text
//! planner: entry answered alike in every zone ──► view `all`            ─┐ bucket = hash(Service) mod count
//!          entry that differs by zone (hints) ──► view `zone-<zone>`     ─┼─► packed slices <view>-0000 … <view>-<count-1>
//!          a node's overrides too big for its plan ► view `node-<node>` ─┘      (count: a power of two)
//!          a Service that changed since its packed slice was written ───► Service slice <view>.<namespace>.<name>
//! agent:   plan.views ─► label selector switchyard.io/view in (…) ─► crate::compose
//! ```
//!
//! Packed slices hold many Services each, so a fresh start writes few objects. A Service that changes
//! afterwards gets a Service slice of its own (like its EndpointSlice for kube-proxy): its entries there
//! replace the packed copy, which stays as it was, so one endpoint change writes one object of about the
//! size of the Service's EndpointSlice and every node of the view receives only that. Once every Service
//! slice of a packed slice has been quiet for a while, the controller folds them back: the packed slice
//! is written with their current entries first, then the Service slices are deleted. A view is complete
//! when packed slices `0..count` are all present and agree on `count`; an agent never programs from an
//! incomplete view. Service slices are optional: without one, a Service's packed copy is current.

use std::sync::Arc;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plan::{PlanSummary, ServicePlan};

/// Most slices one view may be split into.
pub const MAX_SLICES_PER_VIEW: u32 = 4096;

/// Entries exactly as the nodes of one view forward them. Written only by the controller; no status.
// kube-derive's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "switchyard.io",
    version = "v1alpha2",
    kind = "ForwardingSlice",
    plural = "forwardingslices",
    singular = "forwardingslice",
    shortname = "fws",
    category = "switchyard",
    derive = "PartialEq",
    doc = "A bounded group of Service entries exactly as every node of one view forwards them (view `all`: \
           entries that come out the same in every zone; `zone-<zone>`: topology-hinted entries as that \
           zone's nodes see them). Nodes compose their views' slices with their NodeForwardingPlan's overrides.",
    printcolumn(
        name = "View",
        type_ = "string",
        json_path = ".spec.view",
        description = "Which nodes use this slice"
    ),
    printcolumn(
        name = "Index",
        type_ = "integer",
        json_path = ".spec.index",
        description = "Position in the view"
    ),
    printcolumn(
        name = "Count",
        type_ = "integer",
        json_path = ".spec.count",
        description = "Slices in the view"
    ),
    printcolumn(
        name = "Entries",
        type_ = "integer",
        json_path = ".spec.summary.entries",
        description = "Service entries in this slice"
    ),
    printcolumn(
        name = "Endpoints",
        type_ = "integer",
        json_path = ".spec.summary.endpoints",
        description = "Endpoints across the entries"
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".spec.revision",
        description = "Content hash the agents report"
    ),
    printcolumn(
        name = "Service",
        type_ = "string",
        json_path = ".spec.service",
        description = "The one Service of a Service slice (empty: a packed slice)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone", priority = 1),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node", priority = 1),
    selectable = ".spec.view"
)]
#[serde(rename_all = "camelCase")]
// Atomic for the same reason as the plan's spec: the controller's forced apply replaces it whole.
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ForwardingSliceSpec {
    /// The view's id: `all`, `unzoned`, `zone-<zone>` or `node-<node>` (see [`View::id`]).
    #[schemars(length(min = 1, max = 63))]
    pub view: String,
    /// The zone of a zone view, as the Node label spells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The node of a node view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A Service slice's Service (`namespace/name`): the slice carries that Service's current entries
    /// for its view, which replace the Service's entries in the view's packed slices (an empty Service
    /// slice: the Service has no entries in this view). Absent on a packed slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 317))]
    pub service: Option<String>,
    /// This slice's position, `0..count` (a Service slice: the packed slice whose copy it replaces).
    pub index: u32,
    /// How many slices the view has; every slice of a complete view carries the same count.
    #[schemars(range(min = 1, max = 4096))]
    pub count: u32,
    /// Content hash of this spec (all fields but `revision`).
    #[schemars(length(min = 1, max = 64))]
    pub revision: String,
    /// Counts, for `kubectl get fws` (informational).
    // Required: the controller always writes it, and a slice file without it was cut short (a Service
    // slice of a Service that left the view counts zeros, which a missing summary would also read as).
    pub summary: PlanSummary,
    /// The entries, sorted by key, with no node's `onNode`/`local` flags set.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::bounded::entries"
    )]
    pub entries: Vec<Arc<ServicePlan>>,
}

impl ForwardingSliceSpec {
    /// Releases the spare capacity a parser leaves in its entries (see [`crate::plan::shrink_entries`]).
    pub fn shrink_to_fit(&mut self) {
        crate::plan::shrink_entries(&mut self.entries);
    }

    /// Reads a `/0` source range as kube-proxy does (see [`crate::plan::open_zero_source_ranges`]).
    /// Returns how many entries were opened.
    pub fn open_zero_source_ranges(&mut self) -> usize {
        crate::plan::open_zero_source_ranges(&mut self.entries)
    }
}

/// Which nodes a slice is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum View {
    /// Every node: entries that come out the same in every zone.
    All,
    /// The nodes of one zone (`None`: nodes without a zone label).
    Zone(Option<String>),
    /// One node, whose overrides outgrew its plan object.
    Node(String),
}

/// Longest view id (a label value).
const MAX_ID: usize = 63;

impl View {
    /// The id used as label value and name prefix: `all`, `unzoned`, `zone-<zone>`, `node-<node>`. A zone
    /// or node name that is not a lowercase DNS label of up to 58 characters is shortened, lowercased
    /// and suffixed with a hash of the full name, so ids stay unique and valid.
    pub fn id(&self) -> String {
        match self {
            Self::All => "all".into(),
            Self::Zone(None) => "unzoned".into(),
            // A zone already named `zone-…` (kind's and many labs' `zone-a`) is its own id: not
            // `zone-zone-a`. Its slices were named that way before; `legacy_id` still reads them.
            Self::Zone(Some(zone)) if zone.starts_with("zone-") && plain("", zone) => zone.clone(),
            Self::Zone(Some(zone)) => prefixed("zone-", zone),
            Self::Node(node) => prefixed("node-", node),
        }
    }

    /// The id this view had before a zone named `zone-…` became its own id (`zone-zone-a` for `zone-a`):
    /// slices a controller of that time wrote stay readable, so agents can be upgraded before the
    /// controller. `None` where the id never changed.
    pub fn legacy_id(&self) -> Option<String> {
        match self {
            Self::Zone(Some(zone)) if zone.starts_with("zone-") && plain("", zone) => {
                Some(prefixed("zone-", zone))
            }
            _ => None,
        }
    }

    /// Specificity: later views replace entries of earlier ones.
    pub fn rank(&self) -> u8 {
        match self {
            Self::All => 0,
            Self::Zone(_) => 1,
            Self::Node(_) => 2,
        }
    }

    /// The views a node in `zone` composes, most general first.
    pub fn for_node(zone: Option<&str>) -> [Self; 2] {
        [Self::All, Self::Zone(zone.map(str::to_string))]
    }

    /// The view a slice spec claims, when its fields agree with its id.
    pub fn of_slice(spec: &ForwardingSliceSpec) -> Option<Self> {
        let view = match (spec.view.as_str(), &spec.zone, &spec.node) {
            ("all", None, None) => Self::All,
            ("unzoned", None, None) => Self::Zone(None),
            (_, Some(zone), None) => Self::Zone(Some(zone.clone())),
            (_, None, Some(node)) => Self::Node(node.clone()),
            _ => return None,
        };
        (view.id() == spec.view || view.legacy_id().as_deref() == Some(spec.view.as_str())).then_some(view)
    }
}

impl std::fmt::Display for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id())
    }
}

/// Whether `prefix` + `name` is a label value as it is: lowercase alphanumerics and '-', at most
/// [`MAX_ID`], starting and ending alphanumeric.
fn plain(prefix: &str, name: &str) -> bool {
    name.len() + prefix.len() <= MAX_ID
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn prefixed(prefix: &str, name: &str) -> String {
    if plain(prefix, name) {
        return format!("{prefix}{name}");
    }
    let hash = data_encoding::HEXLOWER.encode(&Sha256::digest(name.as_bytes())[..5]);
    let cleaned: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(MAX_ID - prefix.len() - hash.len() - 1)
        .collect();
    let cleaned = cleaned.trim_matches('-');
    if cleaned.is_empty() {
        format!("{prefix}{hash}")
    } else {
        format!("{prefix}{cleaned}-{hash}")
    }
}

/// Name of packed slice `index` of a view: `<view id>-<index, 4 digits>` (e.g. `all-0007`).
pub fn slice_name(view_id: &str, index: u32) -> String {
    format!("{view_id}-{index:04}")
}

/// Name of a view's Service slice for `service` (`namespace/name`): `<view id>.<namespace>.<name>`
/// (e.g. `all.default.web`). View ids hold no dot and namespaces are DNS labels, so names never collide
/// with packed slices or each other.
pub fn service_slice_name(view_id: &str, service: &str) -> String {
    let (namespace, name) = service.split_once('/').unwrap_or(("", service));
    format!("{view_id}.{namespace}.{name}")
}

/// The view id a slice's name starts with: before a Service slice's first '.', or before a packed
/// slice's last '-' (view ids hold no '.').
pub fn view_of_name(name: &str) -> &str {
    match name.split_once('.') {
        Some((view, _)) => view,
        None => name.rsplit_once('-').map_or(name, |(view, _)| view),
    }
}

/// The name a slice must carry for its spec: [`service_slice_name`] for a Service slice,
/// [`slice_name`] otherwise.
pub fn expected_name(spec: &ForwardingSliceSpec) -> String {
    match &spec.service {
        Some(service) => service_slice_name(&spec.view, service),
        None => slice_name(&spec.view, spec.index),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_label_value(value: &str) -> bool {
        value.len() <= 63
            && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    #[test]
    fn view_ids_are_readable_when_they_can_be_and_always_valid_and_distinct() {
        let cases = [
            (View::All, "all"),
            (View::Zone(None), "unzoned"),
            (View::Zone(Some("us-east-1a".into())), "zone-us-east-1a"),
            (View::Node("node-a".into()), "node-node-a"),
            (View::Zone(Some("Zone_A".into())), "zone-zone-a-"),
            (View::Zone(Some("zone.a".into())), "zone-zone-a-"),
            (View::Zone(Some("_".into())), "zone-"),
            (View::Node("n".repeat(253)), "node-nnnn"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (view, prefix) in cases {
            let id = view.id();
            assert!(id.starts_with(prefix), "{view:?}: {id}");
            assert!(valid_label_value(&id), "{view:?}: {id}");
            assert!(seen.insert(id.clone()), "{id} twice");
        }
        assert_ne!(
            View::Zone(Some("zone-a".into())).id(),
            View::Zone(Some("Zone-A".into())).id()
        );
        assert_eq!(slice_name("all", 7), "all-0007");
        assert_eq!(service_slice_name("zone-a", "default/web"), "zone-a.default.web");
        assert_eq!(view_of_name("zone-a.default.web"), "zone-a");
        assert_eq!(view_of_name("zone-us-east-1a-0007"), "zone-us-east-1a");
    }

    #[test]
    fn a_slice_names_its_view_consistently_or_not_at_all() {
        let spec = |view: &str, zone: Option<&str>, node: Option<&str>| ForwardingSliceSpec {
            view: view.into(),
            zone: zone.map(Into::into),
            node: node.map(Into::into),
            service: None,
            index: 0,
            count: 1,
            revision: "x".into(),
            summary: PlanSummary::default(),
            entries: vec![],
        };
        assert_eq!(View::of_slice(&spec("all", None, None)), Some(View::All));
        assert_eq!(
            View::of_slice(&spec("zone-a", Some("a"), None)),
            Some(View::Zone(Some("a".into())))
        );
        assert_eq!(
            View::of_slice(&spec("unzoned", None, None)),
            Some(View::Zone(None))
        );
        assert_eq!(View::of_slice(&spec("zone-b", Some("a"), None)), None);
        assert_eq!(View::of_slice(&spec("all", Some("a"), None)), None);
        assert_eq!(View::of_slice(&spec("zone-a", Some("a"), Some("n"))), None);
        assert_eq!(View::of_slice(&spec("nonsense", None, None)), None);
        // A zone named `zone-a` is view `zone-a`; the slices written as `zone-zone-a` still read.
        let zone_a = Some(View::Zone(Some("zone-a".into())));
        assert_eq!(View::of_slice(&spec("zone-a", Some("zone-a"), None)), zone_a);
        assert_eq!(View::of_slice(&spec("zone-zone-a", Some("zone-a"), None)), zone_a);
        assert_eq!(View::of_slice(&spec("zone-zone-a", Some("a"), None)), None);
    }

    #[test]
    fn a_zone_named_zone_something_is_not_named_twice() {
        for (zone, id, slice) in [
            ("zone-a", "zone-a", "zone-a-0000"),
            ("zone-1", "zone-1", "zone-1-0000"),
            // Every other zone keeps the names it had: they are part of the API.
            ("us-east-1a", "zone-us-east-1a", "zone-us-east-1a-0000"),
            ("a", "zone-a", "zone-a-0000"),
            ("zonea", "zone-zonea", "zone-zonea-0000"),
        ] {
            let view = View::Zone(Some(zone.into()));
            assert_eq!(view.id(), id, "{zone}");
            assert_eq!(slice_name(&view.id(), 0), slice, "{zone}");
        }
        assert_eq!(
            View::Zone(Some("zone-a".into())).legacy_id().as_deref(),
            Some("zone-zone-a")
        );
        assert_eq!(View::Zone(Some("us-east-1a".into())).legacy_id(), None);
    }
}
