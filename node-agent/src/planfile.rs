//! Plan files and status files on local disk.
//!
//! ```text
//! file ─► read_plan_bytes(): at most switchyard_api::yaml::MAX_PLAN_BYTES (64 MiB), a larger file is
//!         refused by its size before it is read
//!      ─► parse_plan_text() ─► ParsedPlanFile { plan, slices }
//!           one NodeForwardingPlan object (YAML or JSON), or a bare spec: a self-contained plan
//!           (`switchyard-controller plan --node N`), or a live plan with views
//!           + ForwardingSlices (multi-document YAML or a `kind: List`, as `plan --objects --node N` or
//!             `kubectl get nfp,fws -o yaml` print them): composed like the API source does
//!      ─► checked whole: each object says what it is (kind, apiVersion switchyard.io/v1alpha2, the name
//!         its spec gives it), no field its kind's schema does not know (switchyard_api::known), and
//!         the plan and every slice hash to their own `revision` (switchyard_api::revision::verify):
//!         anything cut or edited is refused, naming the object, and the rules applied last stay
//!      ─► every entry with a /0 source range opened, as kube-proxy reads it (no firewall)
//! status ─► write_status_file() ─► <file>.tmp ─► rename ─► <file>   (readers never see half a file)
//! ```
//!
//! JSON goes through serde_json (fastest, least memory for a 10,000-service plan); YAML through
//! serde-saphyr with the limits of `switchyard_api::yaml` (its defaults stop at 250,000 nodes, which a
//! 2,000-service plan already exceeds; an exceeded limit is reported in words). Files holding slices are dispatched by each document's
//! kind (JSON specs parsed in place from the text, YAML specs read straight into the type the document's
//! `kind` names); plan-only files are read straight into the typed spec. Entry lists stop at their limit
//! while they are read (`switchyard_api::bounded`), so no reading holds more than a plan may.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::value::RawValue;
use switchyard_api::bounded;
use switchyard_api::revision;
use switchyard_api::validate::{MAX_NODE_NAME, MAX_REVISION};
use switchyard_api::words;
use switchyard_api::yaml::MAX_PLAN_BYTES;
use switchyard_api::{
    ForwardingSliceSpec, NodeForwardingPlanSpec, NodeForwardingPlanStatus, PlanSummary, ServicePlan,
};

use crate::error::Error;
use crate::sync::SliceObject;

/// What a plan file holds, as parsed from its text (unshared; [`LoadedPlan`] is the form handed on).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedPlanFile {
    /// The node's plan.
    pub plan: NodeForwardingPlanSpec,
    /// ForwardingSlices (name, spec), for a plan with views.
    pub slices: Vec<(String, ForwardingSliceSpec)>,
}

/// A NodeForwardingPlan object: its spec, and the fields that say what it is (checked by
/// [`check_object`]); status and the rest of metadata are read past.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<RawMetadata>,
    spec: NodeForwardingPlanSpec,
}

impl Object {
    /// The spec, once the object says it is a NodeForwardingPlan named after its node. In a List the
    /// items may leave out kind and apiVersion (the List's kind says them).
    fn checked(self, in_list: bool) -> Result<NodeForwardingPlanSpec, String> {
        let name = self.metadata.and_then(|m| m.name).unwrap_or_default();
        check_object(
            &Head {
                api_version: self.api_version.as_deref(),
                kind: self.kind.as_deref(),
                name: &name,
                in_list,
            },
            "NodeForwardingPlan",
            &self.spec.node_name,
        )?;
        Ok(self.spec)
    }
}

/// What an object says it is.
struct Head<'a> {
    api_version: Option<&'a str>,
    kind: Option<&'a str>,
    name: &'a str,
    in_list: bool,
}

/// The API version plan files are read as.
const API_VERSION: &str = "switchyard.io/v1alpha2";

/// An object of a plan file must say what it is, in the version this agent reads, under the name its
/// spec gives it (a plan: its node's; a slice: the one [`switchyard_api::slice::expected_name`] gives):
/// a file whose header was cut or edited is refused like one whose spec was.
fn check_object(head: &Head<'_>, want_kind: &str, want_name: &str) -> Result<(), String> {
    match head.kind {
        Some(kind) if kind == want_kind => {}
        Some(kind) => return Err(format!("the object is a {kind:?}, not a {want_kind}")),
        None if head.in_list => {}
        None => {
            return Err(format!(
                "the object has no kind (a plan file holds `kind: {want_kind}`)"
            ));
        }
    }
    match head.api_version {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "{want_kind} {}: apiVersion is {other:?}, and this agent reads {API_VERSION}",
                head.name
            ));
        }
        None if head.in_list => {}
        None => {
            return Err(format!(
                "{want_kind} {}: no apiVersion (want {API_VERSION})",
                head.name
            ));
        }
    }
    if head.name != want_name {
        return Err(format!(
            "{want_kind} {:?}: its spec says it is {want_name:?} (metadata.name must be that)",
            head.name
        ));
    }
    Ok(())
}

/// `kubectl get nfp -o yaml|json` output.
#[derive(Deserialize)]
struct List {
    items: Vec<Object>,
}

impl List {
    fn specs(self) -> Result<Vec<NodeForwardingPlanSpec>, String> {
        self.items.into_iter().map(|o| o.checked(true)).collect()
    }
}

fn yaml_options() -> serde_saphyr::Options {
    switchyard_api::yaml::large_file_options()
}

/// Parses the text of a plan file.
pub fn parse_plan_text(text: &str) -> Result<ParsedPlanFile, String> {
    let file = parse_unsealed(text)?;
    check_integrity(&file)?;
    Ok(file)
}

/// `seal`: a hand-written or hand-edited plan (without slices) with the summary and the revision its
/// content gives, as YAML, and that revision: what the agent then accepts. Everything but the
/// revision is checked as when a plan file is read (objects, fields, syntax); what validation refuses
/// stays refused when it is applied.
pub fn seal_plan_text(text: &str) -> Result<(String, String), String> {
    let file = parse_unsealed(text)?;
    if !file.slices.is_empty() {
        return Err(format!(
            "the file holds {} ForwardingSlice(s): seal works on a plan without slices (the controller \
             writes plans with slices, `switchyard-controller plan`)",
            file.slices.len()
        ));
    }
    let mut plan = file.plan;
    plan.summary = PlanSummary::of(plan.services.iter().chain(&plan.overrides));
    plan.revision = revision::compute(&plan).map_err(|e| e.to_string())?;
    let yaml = serde_saphyr::to_string(&plan).map_err(|e| e.to_string())?;
    Ok((yaml, plan.revision))
}

/// Parses a plan file's text, everything but whether its content matches its revision.
fn parse_unsealed(text: &str) -> Result<ParsedPlanFile, String> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err("the file is empty".into());
    }
    let parsed = if text.contains("ForwardingSlice") {
        parse_documents(text)
    } else if trimmed.starts_with('{') || trimmed.starts_with('[') {
        parse_json(text).and_then(|plans| one_plan(plans, Vec::new()))
    } else {
        parse_yaml(text).and_then(|plans| one_plan(plans, Vec::new()))
    };
    let file = parsed.map_err(|error| match cluster_dump_kind(text) {
        Some(kind) => format!(
            "this is a cluster dump (it holds a {kind}), not a node's plan: make one with \
             `switchyard-controller plan -f DUMP --node NAME -o yaml` first ({error})"
        ),
        None => error,
    })?;
    check_known_fields(text)?;
    Ok(file)
}

/// Refuses a file with a field its kind does not know (kubectl's strict validation): serde reads past
/// such a key, so a renamed field whose value is its default would read as absent and still match the
/// revision. A second, tree-free pass over the text.
fn check_known_fields(text: &str) -> Result<(), String> {
    let trimmed = text.trim_start();
    let found = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        switchyard_api::known::unknown_fields_json(text)
    } else {
        switchyard_api::known::unknown_fields_yaml(text, yaml_options())
    };
    match found {
        Ok(found) if found.is_empty() => Ok(()),
        Ok(found) => Err(format!(
            "{found}: a field this agent does not know (a typo, an edit, or a plan written by a newer \
             Switchyard); refused (the rules applied last stay)"
        )),
        // The typed reading above succeeded on the same text; this pass is no stricter about syntax.
        Err(e) => Err(format!("not a valid plan file: {e}")),
    }
}

/// The first cluster-dump kind (`Service`, `EndpointSlice`, `Node`) the text declares, if any: what
/// `kubectl get services,endpointslices,nodes` prints, which `plan` reads and the agent does not.
fn cluster_dump_kind(text: &str) -> Option<&'static str> {
    const KINDS: [&str; 3] = ["Service", "EndpointSlice", "Node"];
    // Plans name their Node in ownerReferences (`kind: Node`): a file with plans is no dump.
    if text.contains("NodeForwardingPlan") || text.contains("ForwardingSlice") {
        return None;
    }
    // `kind: X` in YAML, `"kind": "X"` in JSON (anywhere on a line: `kubectl -o json` may be one line).
    let values = text.match_indices("kind").filter_map(|(at, _)| {
        let rest = text[at + 4..].trim_start_matches('"').trim_start();
        let value = rest.strip_prefix(':')?.trim_start().trim_start_matches('"');
        let end = value
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(value.len());
        Some(&value[..end])
    });
    values
        .into_iter()
        .find_map(|value| KINDS.into_iter().find(|kind| *kind == value))
}

/// A plan and each slice carry `revision`, the hash of their whole content (`switchyard_api::revision`,
/// the function the controller writes it with): a file whose content hashes to anything else was cut
/// short (a half-written file, a `head`) or edited, whatever the edit, and applying it could drop or
/// change Services silently. A revision validation refuses anyway (empty, too long) is left to it, so
/// its message names the field.
fn check_integrity(file: &ParsedPlanFile) -> Result<(), String> {
    let refused =
        |what: &str, mismatch: revision::Mismatch, stated: PlanSummary, entries: Vec<&Arc<ServicePlan>>| {
            let found = PlanSummary::of(entries);
            let counts = if stated == found {
                String::new()
            } else {
                format!(
                    "; its summary says {} entries and {} endpoints, the file holds {} and {}",
                    stated.entries, stated.endpoints, found.entries, found.endpoints
                )
            };
            format!(
                "{what}: its content does not match its revision {} (the content hashes to {}{counts}): cut \
             short or edited; refused (the rules applied last stay). A plan edited on purpose needs the \
             revision its content hashes to",
                mismatch.stated, mismatch.computed
            )
        };
    let checkable = |revision: &str| !revision.is_empty() && revision.len() <= MAX_REVISION;
    let plan = &file.plan;
    if checkable(&plan.revision) {
        let verified = revision::verify(plan).map_err(|e| e.to_string())?;
        if let Err(mismatch) = verified {
            let entries = plan.services.iter().chain(&plan.overrides).collect();
            let what = format!("NodeForwardingPlan {}", plan.node_name);
            return Err(refused(&what, mismatch, plan.summary, entries));
        }
    }
    for (name, slice) in &file.slices {
        if !checkable(&slice.revision) {
            continue;
        }
        let verified = revision::verify_slice(slice).map_err(|e| e.to_string())?;
        if let Err(mismatch) = verified {
            let what = format!("ForwardingSlice {name}");
            return Err(refused(
                &what,
                mismatch,
                slice.summary,
                slice.entries.iter().collect(),
            ));
        }
    }
    Ok(())
}

fn one_plan(
    mut plans: Vec<NodeForwardingPlanSpec>,
    slices: Vec<(String, ForwardingSliceSpec)>,
) -> Result<ParsedPlanFile, String> {
    match plans.len() {
        1 => Ok(ParsedPlanFile {
            plan: plans.remove(0),
            slices,
        }),
        0 => Err("the file holds no NodeForwardingPlan".into()),
        n => Err(format!(
            "the file holds {n} NodeForwardingPlans, want one: pass one node's plan \
             (`switchyard-controller plan -f DUMP --node NAME`)"
        )),
    }
}

fn parse_yaml(text: &str) -> Result<Vec<NodeForwardingPlanSpec>, String> {
    let object_error = match serde_saphyr::from_multiple_with_options::<Option<Object>>(text, yaml_options())
    {
        Ok(objects) => {
            let specs = objects
                .into_iter()
                .flatten()
                .map(|o| o.checked(false))
                .collect::<Result<Vec<_>, _>>()?;
            if !specs.is_empty() {
                return Ok(specs);
            }
            "no document".to_string()
        }
        Err(e) => match switchyard_api::yaml::exceeded_limit(&e) {
            // Every reading below would stop at the same limit.
            Some(limit) => return Err(limit),
            None if bounded::exceeded(&e.to_string()) => {
                return Err(format!(
                    "not a valid NodeForwardingPlan object: {}",
                    words::yaml(&e)
                ));
            }
            None => words::yaml(&e),
        },
    };
    let list_error = match serde_saphyr::from_str_with_options::<List>(text, yaml_options()) {
        Ok(list) => return list.specs(),
        Err(e) => words::yaml(&e),
    };
    match serde_saphyr::from_multiple_with_options::<Option<NodeForwardingPlanSpec>>(text, yaml_options()) {
        Ok(specs) if specs.iter().any(Option::is_some) => Ok(specs.into_iter().flatten().collect()),
        Ok(_) => Err("no document".into()),
        Err(spec_error) => Err(explain(
            text,
            &object_error,
            &list_error,
            &words::yaml(&spec_error),
        )),
    }
}

fn parse_json(text: &str) -> Result<Vec<NodeForwardingPlanSpec>, String> {
    let object_error = match words::from_json::<Object>(text) {
        Ok(object) => return object.checked(false).map(|spec| vec![spec]),
        // Every reading below would stop at the same list.
        Err(e) if bounded::exceeded(&e) => {
            return Err(format!("not a valid NodeForwardingPlan object: {e}"));
        }
        Err(e) => e,
    };
    let list_error = match words::from_json::<List>(text) {
        Ok(list) => return list.specs(),
        Err(e) => e,
    };
    if let Ok(objects) = serde_json::from_str::<Vec<Object>>(text) {
        return objects.into_iter().map(|o| o.checked(false)).collect();
    }
    match words::from_json::<NodeForwardingPlanSpec>(text) {
        Ok(spec) => Ok(vec![spec]),
        Err(spec_error) => Err(explain(text, &object_error, &list_error, &spec_error)),
    }
}

/// A file with ForwardingSlices: documents (or List items) dispatched by kind. JSON is read in place:
/// each document's `spec` is parsed straight from its text into the typed spec (a generic JSON tree of
/// 10,000 entries would take several times the memory of the typed one); YAML documents likewise, by
/// their `kind` ([`YamlDocument`]).
fn parse_documents(text: &str) -> Result<ParsedPlanFile, String> {
    let trimmed = text.trim_start();
    let mut found = Found::default();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        for document in serde_json::Deserializer::from_str(text).into_iter::<&RawValue>() {
            found.take(document.map_err(|e| format!("invalid JSON: {}", words::plain(&e.to_string())))?)?;
        }
    } else {
        let documents =
            serde_saphyr::from_multiple_with_options::<Option<YamlDocument>>(text, yaml_options()).map_err(
                |e| match switchyard_api::yaml::exceeded_limit(&e) {
                    Some(limit) => limit,
                    None => format!("invalid YAML: {}", words::yaml(&e)),
                },
            )?;
        for document in documents.into_iter().flatten() {
            found.take(document)?;
        }
    }
    one_plan(found.plans, found.slices)
}

/// Lists inside Lists: `kubectl` prints one level, a hand-made bundle maybe two; a limit keeps a hostile
/// file from recursing the reader off its stack.
const MAX_LIST_DEPTH: usize = 4;

/// The plans and slices of a file, as its documents are read.
#[derive(Default)]
struct Found {
    plans: Vec<NodeForwardingPlanSpec>,
    slices: Vec<(String, ForwardingSliceSpec)>,
}

impl Found {
    fn take<D: Document>(&mut self, document: D) -> Result<(), String> {
        self.take_nested(document, 0)
    }

    fn take_nested<D: Document>(&mut self, document: D, depth: usize) -> Result<(), String> {
        let Some(parts) = document.parts()? else {
            return Ok(());
        };
        match parts.kind.as_str() {
            "List" | "NodeForwardingPlanList" | "ForwardingSliceList" if depth >= MAX_LIST_DEPTH => {
                return Err(format!("Lists nested more than {MAX_LIST_DEPTH} deep"));
            }
            "List" | "NodeForwardingPlanList" | "ForwardingSliceList" => {
                for item in parts.items {
                    self.take_nested(item, depth + 1)?;
                }
            }
            "NodeForwardingPlan" => {
                let spec = D::plan(parts.spec)
                    .map_err(|e| format!("NodeForwardingPlan {}: not a valid spec: {e}", parts.name))?;
                let head = Head {
                    api_version: parts.api_version.as_deref(),
                    kind: Some(&parts.kind),
                    name: &parts.name,
                    in_list: depth > 0,
                };
                check_object(&head, "NodeForwardingPlan", &spec.node_name)?;
                self.plans.push(spec);
            }
            "ForwardingSlice" => {
                let spec = D::slice(parts.spec)
                    .map_err(|e| format!("ForwardingSlice {}: not a valid spec: {e}", parts.name))?;
                let head = Head {
                    api_version: parts.api_version.as_deref(),
                    kind: Some(&parts.kind),
                    name: &parts.name,
                    in_list: depth > 0,
                };
                if parts.name.is_empty() {
                    return Err("a ForwardingSlice without metadata.name".into());
                }
                // Object names are DNS subdomains in Kubernetes; the name goes into status and logs.
                if parts.name.len() > MAX_NODE_NAME {
                    return Err(format!(
                        "a ForwardingSlice name is {} bytes, longer than the {MAX_NODE_NAME} Kubernetes allows",
                        parts.name.len()
                    ));
                }
                check_object(
                    &head,
                    "ForwardingSlice",
                    &switchyard_api::slice::expected_name(&spec),
                )?;
                self.slices.push((parts.name, spec));
            }
            other => return Err(format!("unexpected object of kind {other:?}")),
        }
        Ok(())
    }
}

/// What the dispatch reads of one document.
struct Parts<D: Document> {
    api_version: Option<String>,
    kind: String,
    name: String,
    spec: Option<D::Spec>,
    items: Vec<D>,
}

/// A document of a plan file: JSON text in place, or a YAML document read into typed specs.
trait Document: Sized {
    /// Its spec as read so far.
    type Spec;
    /// Its kind, name, spec and List items; `None` for an empty document.
    fn parts(self) -> Result<Option<Parts<Self>>, String>;
    /// The spec of a NodeForwardingPlan (missing: an error).
    fn plan(spec: Option<Self::Spec>) -> Result<NodeForwardingPlanSpec, String>;
    /// The spec of a ForwardingSlice (missing: an error).
    fn slice(spec: Option<Self::Spec>) -> Result<ForwardingSliceSpec, String>;
}

/// The fields of a JSON document, borrowed from the file's text.
#[derive(Deserialize)]
struct RawDocument<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Option<RawMetadata>,
    #[serde(borrow, default)]
    spec: Option<&'a RawValue>,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct RawMetadata {
    #[serde(default)]
    name: Option<String>,
}

impl<'a> Document for &'a RawValue {
    type Spec = &'a RawValue;

    fn parts(self) -> Result<Option<Parts<Self>>, String> {
        if self.get() == "null" {
            return Ok(None);
        }
        let raw: RawDocument<'a> = serde_json::from_str(self.get())
            .map_err(|e| format!("invalid JSON: {}", words::plain(&e.to_string())))?;
        Ok(Some(Parts {
            api_version: raw.api_version,
            kind: raw.kind,
            name: raw.metadata.and_then(|m| m.name).unwrap_or_default(),
            spec: raw.spec,
            items: raw.items.unwrap_or_default(),
        }))
    }

    fn plan(spec: Option<Self::Spec>) -> Result<NodeForwardingPlanSpec, String> {
        decode_json(spec)
    }

    fn slice(spec: Option<Self::Spec>) -> Result<ForwardingSliceSpec, String> {
        decode_json(spec)
    }
}

fn decode_json<T: DeserializeOwned>(spec: Option<&RawValue>) -> Result<T, String> {
    words::from_json(spec.map_or("null", RawValue::get))
}

/// One YAML document (or List item), its spec read straight into the type its `kind` names: no generic
/// tree of the file is built (one would take ~9 times the file's size: 233 MiB for 200,000 entries), and
/// the spec's entry lists stop at their limit while they are read. So `kind` must come before `spec`, as
/// kubectl, `switchyard-controller` and every Kubernetes serializer write it.
#[derive(Default)]
struct YamlDocument {
    api_version: Option<String>,
    kind: String,
    name: String,
    spec: Option<YamlSpec>,
    items: Vec<YamlDocument>,
}

/// The spec of a YAML document, by its kind.
enum YamlSpec {
    Plan(Box<NodeForwardingPlanSpec>),
    Slice(Box<ForwardingSliceSpec>),
    /// The spec of another kind, read past (the dispatch refuses the kind).
    Other,
}

impl<'de> Deserialize<'de> for YamlDocument {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(YamlDocumentVisitor)
    }
}

struct YamlDocumentVisitor;

impl<'de> serde::de::Visitor<'de> for YamlDocumentVisitor {
    type Value = YamlDocument;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object (a map with kind, metadata and spec, or a List with items)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<YamlDocument, A::Error> {
        use serde::de::{Error as _, IgnoredAny};
        let mut document = YamlDocument::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "kind" => document.kind = map.next_value::<Option<String>>()?.unwrap_or_default(),
                "apiVersion" => document.api_version = map.next_value::<Option<String>>()?,
                "metadata" => {
                    document.name = map
                        .next_value::<Option<RawMetadata>>()?
                        .and_then(|m| m.name)
                        .unwrap_or_default();
                }
                "spec" => {
                    let invalid = |e: A::Error| {
                        A::Error::custom(format_args!(
                            "{} {}: not a valid spec: {e}",
                            document.kind, document.name
                        ))
                    };
                    document.spec = match document.kind.as_str() {
                        "NodeForwardingPlan" => map
                            .next_value::<Option<NodeForwardingPlanSpec>>()
                            .map_err(invalid)?
                            .map(|spec| YamlSpec::Plan(Box::new(spec))),
                        "ForwardingSlice" => map
                            .next_value::<Option<ForwardingSliceSpec>>()
                            .map_err(invalid)?
                            .map(|spec| YamlSpec::Slice(Box::new(spec))),
                        "" => {
                            return Err(A::Error::custom(
                                "`spec` comes before `kind`: write `kind` first, as kubectl does",
                            ));
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            Some(YamlSpec::Other)
                        }
                    };
                }
                "items" => {
                    document.items = map
                        .next_value::<Option<Vec<Option<YamlDocument>>>>()?
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .collect();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(document)
    }
}

impl Document for YamlDocument {
    type Spec = YamlSpec;

    fn parts(self) -> Result<Option<Parts<Self>>, String> {
        Ok(Some(Parts {
            api_version: self.api_version,
            kind: self.kind,
            name: self.name,
            spec: self.spec,
            items: self.items,
        }))
    }

    fn plan(spec: Option<Self::Spec>) -> Result<NodeForwardingPlanSpec, String> {
        match spec {
            Some(YamlSpec::Plan(spec)) => Ok(*spec),
            _ => decode_json(None),
        }
    }

    fn slice(spec: Option<Self::Spec>) -> Result<ForwardingSliceSpec, String> {
        match spec {
            Some(YamlSpec::Slice(spec)) => Ok(*spec),
            _ => decode_json(None),
        }
    }
}

/// The error that matches what the file looks like: an object's when it has a `spec`, else a bare
/// spec's.
/// The error of the reading the text looks meant for: a List (`kubectl get nfp -o yaml|json`, or
/// `switchyard-controller plan --node N -o json`), an object, or a bare spec.
fn explain(text: &str, object_error: &str, list_error: &str, spec_error: &str) -> String {
    let looks_like_list =
        text.contains("\nitems:") || text.starts_with("items:") || text.contains("\"items\"");
    let looks_like_object =
        text.contains("\nspec:") || text.starts_with("spec:") || text.contains("\"spec\"");
    if looks_like_list {
        format!("not a valid List of NodeForwardingPlans: {list_error}")
    } else if looks_like_object {
        format!("not a valid NodeForwardingPlan object: {object_error}")
    } else {
        format!("neither a NodeForwardingPlan object nor a bare spec: {spec_error}")
    }
}

/// A plan file read: the plan and its slices, shared.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPlan {
    /// The plan.
    pub plan: Arc<NodeForwardingPlanSpec>,
    /// Its slices.
    pub slices: Vec<SliceObject>,
}

/// Reads a plan file (`-`: standard input) whole, refusing one over [`MAX_PLAN_BYTES`]: a regular file
/// by its size, before anything is read; a pipe as soon as it passes the limit. What a larger plan
/// would cost is never allocated.
pub fn read_plan_bytes(path: &Path) -> Result<Vec<u8>, Error> {
    let read_error = |source| Error::ReadPlan {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |size: String| {
        read_error(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "the file is {size} bytes, more than the {MAX_PLAN_BYTES} ({} MiB) a plan file may hold \
                 (a 10,000-Service plan is about 5 MB)",
                MAX_PLAN_BYTES >> 20
            ),
        ))
    };
    let limit = MAX_PLAN_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    // `-` is standard input, so `switchyard-controller plan … --node N -o yaml | switchyard-agent …
    // --plan -` works without a file.
    if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
    } else {
        let file = std::fs::File::open(path).map_err(read_error)?;
        let size = file.metadata().map_err(read_error)?.len();
        if size > MAX_PLAN_BYTES as u64 {
            return Err(too_large(size.to_string()));
        }
        bytes.reserve_exact(size as usize + 1);
        file.take(limit).read_to_end(&mut bytes).map_err(read_error)?;
    }
    if bytes.len() > MAX_PLAN_BYTES {
        return Err(too_large(format!("more than {MAX_PLAN_BYTES}")));
    }
    Ok(bytes)
}

/// Reads and parses a plan file.
pub fn read_plan_file(path: &Path) -> Result<LoadedPlan, Error> {
    parse_plan_bytes(path, read_plan_bytes(path)?)
}

/// Parses the bytes of the plan file `path` (see [`read_plan_bytes`]), consuming them: the text is
/// dropped before the plan is handed on, so one copy of a large plan is held at a time.
pub fn parse_plan_bytes(path: &Path, bytes: Vec<u8>) -> Result<LoadedPlan, Error> {
    let parse_error = |message: String| Error::ParsePlan {
        path: path.to_path_buf(),
        message,
    };
    let text =
        String::from_utf8(bytes).map_err(|e| parse_error(format!("the file is not UTF-8 text: {e}")))?;
    let file = parse_plan_text(&text).map_err(parse_error)?;
    drop(text);
    let mut plan = file.plan;
    // The parser grows lists by doubling: unshrunk, ~20% of a 10,000-entry plan's memory would be spare
    // capacity for the agent's life.
    plan.shrink_to_fit();
    let mut opened = plan.open_zero_source_ranges();
    let slices = file
        .slices
        .into_iter()
        .map(|(name, mut spec)| {
            spec.shrink_to_fit();
            opened += spec.open_zero_source_ranges();
            (name, Arc::new(spec))
        })
        .collect();
    if opened > 0 {
        tracing::debug!(
            entries = opened,
            "a source range of /0 allows every source (as in kube-proxy): those entries are not filtered"
        );
    }
    Ok(LoadedPlan {
        plan: Arc::new(plan),
        slices,
    })
}

/// The status as YAML.
pub fn status_yaml(status: &NodeForwardingPlanStatus) -> Result<String, Error> {
    serde_saphyr::to_string(status).map_err(Error::SerializeStatus)
}

/// Writes the status as YAML to `path` atomically and durably (`switchyard_process::write_atomic`).
pub fn write_status_file(path: &Path, status: &NodeForwardingPlanStatus) -> Result<(), Error> {
    let yaml = status_yaml(status)?;
    switchyard_process::write_atomic_bytes(path, yaml.as_bytes()).map_err(|source| Error::WriteStatus {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EntryExt, entry, ep, live_plan, plan, slice};
    use switchyard_api::{ForwardingSlice, NodeForwardingPlan};

    fn spec(node: &str) -> NodeForwardingPlanSpec {
        plan(
            node,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        )
    }

    fn object(spec: NodeForwardingPlanSpec) -> NodeForwardingPlan {
        NodeForwardingPlan::new(&spec.node_name.clone(), spec)
    }

    #[test]
    fn a_sealed_plan_is_accepted_and_says_its_revision_and_counts() {
        let full = spec("node-a");
        let mut edited = full.clone();
        edited.revision = "hand-made".into();
        edited.summary = PlanSummary::default();
        let text = serde_saphyr::to_string(&edited).unwrap();
        assert!(
            parse_plan_text(&text).is_err(),
            "a revision that is no digest is refused"
        );
        let (sealed, revision) = seal_plan_text(&text).unwrap();
        assert_eq!(
            revision, full.revision,
            "the controller's own revision for the same content"
        );
        let back = parse_plan_text(&sealed).unwrap();
        assert_eq!(back.plan, full);
        // What stays refused: syntax, unknown fields, and files with slices (the controller writes those).
        assert!(seal_plan_text("services: [").is_err());
        let typo = text.replacen("services:", "servics:", 1);
        assert!(seal_plan_text(&typo).is_err());
    }

    #[test]
    fn a_plan_or_slice_whose_content_does_not_match_its_revision_is_refused() {
        let full = plan(
            "node-a",
            vec![
                entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80)),
                entry("ns/b:p", "10.96.0.2", 80).with(ep("10.244.2.2", 80)),
                entry("ns/c:p", "10.96.0.3", 80),
            ],
        );
        let text = serde_saphyr::to_string(&object(full.clone())).unwrap();
        assert!(parse_plan_text(&text).is_ok());
        // Cut at a line boundary after the second entry, as `head` or a half-written file leaves it.
        let cut_at = text.find("ns/c:p").unwrap();
        let cut = &text[..text[..cut_at].rfind("\n  - ").unwrap() + 1];
        let error = parse_plan_text(cut).unwrap_err();
        assert!(
            error.contains(&format!(
                "NodeForwardingPlan node-a: its content does not match its revision {}",
                full.revision
            )),
            "{error}"
        );
        assert!(
            error.contains("says 3 entries and 2 endpoints, the file holds 2 and 2"),
            "{error}"
        );
        // An edit the counts cannot see: one endpoint's flag gone (the issue's 85 rules becoming 82).
        let edited = text.replacen("      cluster: true\n", "", 1);
        assert_ne!(edited, text);
        let error = parse_plan_text(&edited).unwrap_err();
        assert!(
            error.contains("its content does not match its revision"),
            "{error}"
        );
        assert!(!error.contains("summary says"), "the counts agree: {error}");
        // A plan edited on purpose, its revision set to what its content hashes to, is taken.
        let mut edited = full.clone();
        Arc::make_mut(&mut edited.services[0]).endpoints[0].cluster = false;
        edited.revision = revision::compute(&edited).unwrap();
        assert!(parse_plan_text(&serde_saphyr::to_string(&object(edited)).unwrap()).is_ok());
        // A slice is checked against its own revision.
        let (name, mut view) = slice("all", 0, 1, vec![entry("ns/a:p", "10.96.0.1", 80)]);
        view.summary = PlanSummary {
            entries: 2,
            endpoints: 0,
        };
        let text = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&object(live_plan("node-a", &["all"], vec![]))).unwrap(),
            serde_saphyr::to_string(&ForwardingSlice::new(&name, view)).unwrap()
        );
        let error = parse_plan_text(&text).unwrap_err();
        assert!(
            error.contains(&format!(
                "ForwardingSlice {name}: its content does not match its revision"
            )),
            "{error}"
        );
    }

    #[test]
    fn a_field_no_schema_knows_or_a_header_that_is_not_the_plans_is_refused() {
        let text = serde_saphyr::to_string(&object(spec("node-a"))).unwrap();
        assert!(parse_plan_text(&text).is_ok());
        for (edit, from, to, want) in [
            (
                "a field added (serde reads past it, and the revision is over what was read)",
                "    masqueradeAll: false\n",
                "    masqueradeAll: false\n    masqueradeAlll: true\n",
                "NodeForwardingPlan node-a: unknown field \"spec.cluster.masqueradeAlll\"",
            ),
            (
                "a required field renamed",
                "    masqueradeAll: false\n",
                "    masqueradeAlll: false\n",
                "missing field `masqueradeAll`",
            ),
            (
                "a renamed endpoint flag",
                "      cluster: true\n",
                "      clustr: true\n",
                "unknown field \"spec.services[0].endpoints[0].clustr\"",
            ),
            (
                "an unknown top-level field",
                "kind: NodeForwardingPlan\n",
                "kind: NodeForwardingPlan\nspecs: {}\n",
                "unknown field \"specs\"",
            ),
            (
                "another kind",
                "kind: NodeForwardingPlan\n",
                "kind: NodeForwardingPlans\n",
                "the object is a \"NodeForwardingPlans\", not a NodeForwardingPlan",
            ),
            (
                "no kind",
                "kind: NodeForwardingPlan\n",
                "",
                "the object has no kind",
            ),
            (
                "another version",
                "apiVersion: switchyard.io/v1alpha2\n",
                "apiVersion: switchyard.io/v1alpha3\n",
                "apiVersion is \"switchyard.io/v1alpha3\", and this agent reads switchyard.io/v1alpha2",
            ),
            (
                "another name",
                "  name: node-a\n",
                "  name: node-b\n",
                "NodeForwardingPlan \"node-b\": its spec says it is \"node-a\"",
            ),
        ] {
            assert!(text.contains(from), "{edit}: {from:?} not in\n{text}");
            let error = parse_plan_text(&text.replacen(from, to, 1)).expect_err(edit);
            assert!(error.contains(want), "{edit}: {error}");
        }
        // The same in JSON, and a bare spec's fields.
        let json = serde_json::to_string(&object(spec("node-a"))).unwrap();
        let error = parse_plan_text(&json.replacen(
            "\"masqueradeAll\"",
            "\"masqueradeAlll\":true,\"masqueradeAll\"",
            1,
        ))
        .unwrap_err();
        assert!(
            error.contains("unknown field \"spec.cluster.masqueradeAlll\""),
            "{error}"
        );
        let bare = serde_saphyr::to_string(&spec("node-a")).unwrap();
        assert!(parse_plan_text(&bare).is_ok());
        let error =
            parse_plan_text(&bare.replacen("masqueradeAll:", "masqueradeAlll: true\n  masqueradeAll:", 1))
                .unwrap_err();
        assert!(
            error.contains("the plan: unknown field \"cluster.masqueradeAlll\""),
            "{error}"
        );
    }

    #[test]
    fn a_cluster_dump_given_as_a_plan_says_how_to_make_one() {
        for dump in [
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n",
            "{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [{\"kind\": \"Node\", \"metadata\": {\"name\": \"n\"}}]}",
            "kind: EndpointSlice\nmetadata: {name: a}\naddressType: IPv4\n",
        ] {
            let error = parse_plan_text(dump).unwrap_err();
            assert!(
                error.contains("this is a cluster dump") && error.contains("switchyard-controller plan"),
                "{dump}: {error}"
            );
        }
        // A list of plans is no cluster dump, though each names its Node as owner.
        let mut owned = object(spec("node-a"));
        owned.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: "node-a".into(),
                uid: "u".into(),
                ..Default::default()
            },
        ]);
        let two = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&owned).unwrap(),
            serde_saphyr::to_string(&owned).unwrap()
        );
        let error = parse_plan_text(&two).unwrap_err();
        assert!(
            !error.contains("cluster dump") && error.contains("want one"),
            "{error}"
        );
        let plans = format!(
            "kind: List\nitems:\n- {}",
            serde_saphyr::to_string(&object(spec("node-a")))
                .unwrap()
                .replace('\n', "\n  ")
        );
        let error = parse_plan_text(&plans).err().unwrap_or_default();
        assert!(!error.contains("cluster dump"), "{error}");
    }

    #[test]
    fn every_plan_file_shape_parses() {
        let one = spec("node-a");
        let object_yaml = serde_saphyr::to_string(&object(one.clone())).unwrap();
        let object_json = serde_json::to_string_pretty(&object(one.clone())).unwrap();
        let bare_yaml = serde_saphyr::to_string(&one).unwrap();
        let bare_json = serde_json::to_string(&one).unwrap();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [object(one.clone())]});
        for (name, text) in [
            ("object yaml", object_yaml),
            ("object json", object_json),
            ("bare yaml", bare_yaml),
            ("bare json", bare_json),
            ("list json", list.to_string()),
            ("list yaml", serde_saphyr::to_string(&list).unwrap()),
        ] {
            let file = parse_plan_text(&text).unwrap();
            assert_eq!(file.plan, one, "{name}");
            assert!(file.slices.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_live_plan_with_its_slices_parses_from_yaml_documents_or_a_list() {
        let live = live_plan("node-a", &["all"], vec![]);
        let (name, all) = slice(
            "all",
            0,
            1,
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        let slice_object = ForwardingSlice::new(&name, all.clone());
        let yaml = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&slice_object).unwrap(),
            serde_saphyr::to_string(&object(live.clone())).unwrap()
        );
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [slice_object, object(live.clone())]});
        let nested = serde_json::json!({"kind": "List", "items": [
            {"kind": "ForwardingSliceList", "items": [slice_object]},
            object(live.clone()),
        ]});
        let json_stream = format!(
            "{}\n{}",
            serde_json::to_string(&slice_object).unwrap(),
            serde_json::to_string_pretty(&object(live.clone())).unwrap()
        );
        for (shape, text) in [
            ("yaml documents", yaml),
            ("json list", list.to_string()),
            ("yaml list", serde_saphyr::to_string(&list).unwrap()),
            ("nested lists", nested.to_string()),
            ("json documents", json_stream),
        ] {
            let file = parse_plan_text(&text).unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert_eq!(file.plan, live, "{shape}");
            assert_eq!(file.slices, vec![(name.clone(), all.clone())], "{shape}");
        }
    }

    #[test]
    fn null_lists_and_names_read_as_empty_and_deep_nesting_is_an_error_not_a_crash() {
        let live = serde_json::to_value(object(live_plan("node-a", &["all"], vec![]))).unwrap();
        let (name, all) = slice("all", 0, 1, vec![]);
        let good = serde_json::to_value(ForwardingSlice::new(&name, all.clone())).unwrap();
        // Go encodes an empty list as null.
        let text = serde_json::json!({"kind": "List", "items": [
            {"kind": "ForwardingSliceList", "items": null},
            good,
            live,
        ]})
        .to_string();
        let file = parse_plan_text(&text).unwrap();
        assert_eq!(file.slices, vec![(name, all)]);

        let mut deep = String::from("{\"kind\":\"ForwardingSlice\"}");
        for _ in 0..20_000 {
            deep = format!("{{\"kind\":\"List\",\"items\":[{deep}]}}");
        }
        let error = parse_plan_text(&deep).expect_err("too deep");
        assert!(error.contains("nested"), "{error}");
    }

    #[test]
    fn files_with_slices_name_what_is_wrong() {
        let live = serde_json::to_value(object(live_plan("node-a", &["all"], vec![]))).unwrap();
        let (name, all) = slice("all", 0, 1, vec![]);
        let good = serde_json::to_value(ForwardingSlice::new(&name, all)).unwrap();
        let mut unnamed = good.clone();
        unnamed["metadata"] = serde_json::json!({});
        let mut bad_spec = good.clone();
        bad_spec["spec"]["index"] = serde_json::json!("first");
        let mut no_spec = live.clone();
        no_spec.as_object_mut().unwrap().remove("spec");
        let cases = [
            (
                vec![unnamed, live.clone()],
                "a ForwardingSlice without metadata.name",
            ),
            (
                vec![bad_spec, live.clone()],
                "ForwardingSlice all-0000: not a valid spec",
            ),
            (
                vec![good.clone(), no_spec],
                "NodeForwardingPlan node-a: not a valid spec",
            ),
            (
                vec![good.clone(), serde_json::json!({"kind": "ConfigMap"})],
                "unexpected object of kind \"ConfigMap\"",
            ),
            (vec![good.clone()], "the file holds no NodeForwardingPlan"),
            (
                vec![good, live.clone(), live],
                "the file holds 2 NodeForwardingPlans",
            ),
        ];
        for (items, want) in cases {
            let text = serde_json::json!({"kind": "List", "items": items}).to_string();
            let yaml = serde_saphyr::to_string(&serde_json::json!({"kind": "List", "items": items})).unwrap();
            for (shape, text) in [("json", text), ("yaml", yaml)] {
                let error = parse_plan_text(&text).expect_err(want);
                assert!(error.contains(want), "{shape}: {error:?} should say {want:?}");
            }
        }
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(parse_plan_text("").unwrap_err().contains("empty"));
        let err = parse_plan_text(
            "apiVersion: switchyard.io/v1alpha2\nkind: NodeForwardingPlan\nspec:\n  nodeName: 3\n",
        )
        .unwrap_err();
        assert!(err.contains("NodeForwardingPlan object"), "{err}");
        let err = parse_plan_text("nodeName: a\n").unwrap_err();
        assert!(err.contains("bare spec"), "{err}");
        assert!(parse_plan_text("{\"nodeName\": ").is_err());
        let two = format!(
            "{}---\n{}",
            serde_saphyr::to_string(&object(spec("node-a"))).unwrap(),
            serde_saphyr::to_string(&object(spec("node-b"))).unwrap()
        );
        let err = parse_plan_text(&two).unwrap_err();
        assert!(
            err.contains("2 NodeForwardingPlans, want one") && err.contains("--node NAME"),
            "{err}"
        );
    }

    /// What the agent makes of a plan file's text: refused before validation (unreadable), rejected whole
    /// by validation, applied without some entries, or applied.
    #[derive(Debug)]
    enum Outcome {
        Refused(String),
        Rejected(Vec<String>),
        Skipped(Vec<String>),
        Applied(Arc<NodeForwardingPlanSpec>),
    }

    /// As the agent's file source and syncer see `text`: parsed (and opened), composed with the slice
    /// headers validated, validated.
    fn outcome(text: String) -> Outcome {
        use crate::sync::{Composition, LastGood, compose_plan};
        let loaded = match parse_plan_bytes(Path::new("plan.yaml"), text.into_bytes()) {
            Ok(loaded) => loaded,
            Err(e) => return Outcome::Refused(e.to_string()),
        };
        let spec = match compose_plan(&loaded.plan, &loaded.slices, &mut LastGood::default()) {
            Composition::Ready { spec, .. } => spec,
            Composition::Incomplete(why) => return Outcome::Rejected(vec![why]),
        };
        let report = switchyard_api::validate::validate(&spec);
        if !report.plan.is_empty() {
            return Outcome::Rejected(report.plan.iter().map(ToString::to_string).collect());
        }
        if !report.entries.is_empty() {
            return Outcome::Skipped(report.all().map(ToString::to_string).collect());
        }
        Outcome::Applied(spec)
    }

    /// What a hostile input must come to, and a piece of what the agent must say.
    enum Want {
        Refused(&'static str),
        Rejected(&'static str),
        Skipped(&'static str),
    }

    impl Want {
        fn met_by(&self, got: &Outcome) -> bool {
            match (self, got) {
                (Want::Refused(want), Outcome::Refused(said)) => said.contains(want),
                (Want::Rejected(want), Outcome::Rejected(said))
                | (Want::Skipped(want), Outcome::Skipped(said)) => said.iter().any(|s| s.contains(want)),
                _ => false,
            }
        }
    }

    fn good_entry(i: usize) -> switchyard_api::ServicePlan {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        entry(&format!("ns/s{i}:p"), &ip, 80).with(ep("10.244.2.1", 80))
    }

    fn three() -> NodeForwardingPlanSpec {
        plan("node-a", (0..3).map(good_entry).collect())
    }

    /// The plan as a file, its summary counting the entries it now holds and its revision their hash,
    /// as the controller writes it (a revision a case set to something else is kept).
    fn yaml(mut spec: NodeForwardingPlanSpec) -> String {
        spec.summary = PlanSummary::of(spec.services.iter().chain(&spec.overrides));
        if spec.revision.len() == revision::REVISION_LEN {
            spec.revision = revision::compute(&spec).unwrap();
        }
        serde_saphyr::to_string(&object(spec)).unwrap()
    }

    fn with_entry(mutate: impl FnOnce(&mut switchyard_api::ServicePlan)) -> NodeForwardingPlanSpec {
        let mut spec = three();
        mutate(Arc::make_mut(&mut spec.services[1]));
        spec
    }

    /// A live plan and one slice of view `all` holding `entries`, as YAML documents (`json`: a JSON List).
    fn with_slice(entries: Vec<switchyard_api::ServicePlan>, json: bool) -> String {
        let (name, all) = slice("all", 0, 1, entries);
        let slice_object = ForwardingSlice::new(&name, all);
        let live = object(live_plan("node-a", &["all"], vec![]));
        if json {
            return serde_json::json!({"kind": "List", "items": [slice_object, live]}).to_string();
        }
        format!(
            "{}---\n{}",
            serde_saphyr::to_string(&slice_object).unwrap(),
            serde_saphyr::to_string(&live).unwrap()
        )
    }

    /// Fault 7 of the fault suite, below the kernel: every hostile input is refused or rejected whole
    /// (the last good rules stay), or costs only its own entry, with a message naming what and the limit.
    #[test]
    fn hostile_plans_are_refused_or_bounded_with_a_message_naming_the_limit() {
        let huge = "a".repeat(10 << 20);
        let many = |n: usize| -> Vec<Arc<switchyard_api::ServicePlan>> {
            (0..n).map(|i| Arc::new(good_entry(i))).collect()
        };
        let mut big = three();
        big.services = many(200_000);
        let big_json = serde_json::to_string(&object(big)).unwrap();
        let good = yaml(three());
        let good_json = serde_json::to_string(&object(three())).unwrap();
        let v6 = entry("ns/v6:p", "fd00:10:96::1", 80).with(ep("10.244.2.1", 80));
        let mut lb = good_entry(1);
        lb.load_balancer_ips = vec!["203.0.113.1".into()];
        lb.source_ranges = vec!["198.51.100.0/24".into(), "0.0.0.0/0".into()];
        let cases: Vec<(&str, String, Want)> = vec![
            (
                "200,000 entries",
                big_json,
                Want::Refused("more than 100000 entries, the most one object may hold"),
            ),
            (
                "10 MB Service name",
                yaml(with_entry(|e| e.name = format!("ns/{huge}:p"))),
                Want::Skipped("spec.services[1].name: Service name \"aaaa"),
            ),
            (
                "10 MB port name",
                yaml(with_entry(|e| e.name = format!("ns/s1:{huge}"))),
                Want::Skipped("bytes, longer than the 63 allowed"),
            ),
            (
                "10 MB clusterIP",
                yaml(with_entry(|e| e.cluster_ip = huge.clone())),
                Want::Skipped("(10485760 bytes) is not a canonical IP address"),
            ),
            (
                "10 MB revision",
                yaml(NodeForwardingPlanSpec {
                    revision: huge.clone(),
                    ..three()
                }),
                Want::Rejected("spec.revision: revision \"aaaa"),
            ),
            (
                "10 MB zone",
                yaml(NodeForwardingPlanSpec {
                    zone: Some(huge.clone()),
                    ..three()
                }),
                Want::Rejected("longer than the 63 allowed"),
            ),
            (
                "duplicate YAML key",
                good.replacen("    port: 80\n", "    port: 80\n    port: 81\n", 1),
                Want::Refused("`port` is given twice in one mapping: each key may appear once"),
            ),
            (
                "duplicate JSON key",
                good_json.replacen("\"port\":80,", "\"port\":80,\"port\":81,", 1),
                Want::Refused("duplicate field `port`"),
            ),
            (
                "duplicate entry",
                yaml(with_entry(|e| *e = good_entry(0))),
                Want::Skipped("spec.services[1].name: duplicate entry ns/s0:p TCP IPv4"),
            ),
            (
                "port 0",
                yaml(with_entry(|e| e.port = 0)),
                Want::Skipped("spec.services[1].port: must be 1..65535"),
            ),
            (
                "port 65536",
                good.replacen("    port: 80\n", "    port: 65536\n", 1),
                Want::Refused(
                    "port: 65536\n   |           ^ this value does not fit: it must be a whole number from 0 to 65535",
                ),
            ),
            (
                "nodePort 0",
                yaml(with_entry(|e| e.node_port = Some(0))),
                Want::Skipped("nodePort: must be 1..65535"),
            ),
            (
                "endpoint port 65536",
                good_json.replacen("\"port\":80,\"cluster\"", "\"port\":65536,\"cluster\"", 1),
                Want::Refused(
                    "spec.services[0].endpoints[0].port: 65536 is out of range: it must be a whole number from 0 to 65535",
                ),
            ),
            (
                "IPv4 endpoint in an IPv6 entry",
                yaml(NodeForwardingPlanSpec {
                    services: vec![Arc::new(v6)],
                    ..three()
                }),
                Want::Skipped("spec.services[0].endpoints[0].ip: 10.244.2.1 is not IPv6"),
            ),
            (
                "IPv6 endpoint in an IPv4 entry",
                yaml(with_entry(|e| e.endpoints[0].ip = "fd00:10:244::1".into())),
                Want::Skipped("fd00:10:244::1 is not IPv4"),
            ),
            (
                "unknown backend",
                good.replacen("backend: iptables", "backend: bpf", 1),
                Want::Refused("unknown variant `bpf`, expected one of iptables, ipvs, nftables"),
            ),
            (
                "slice of 200,000 entries",
                with_slice((0..200_000).map(good_entry).collect(), true),
                Want::Refused(
                    "ForwardingSlice all-0000: not a valid spec: entries: more than 100000 entries",
                ),
            ),
            (
                "slice entry with a 10 MB name",
                with_slice(
                    vec![good_entry(0), {
                        let mut e = good_entry(1);
                        e.name = format!("ns/{huge}");
                        e
                    }],
                    false,
                ),
                Want::Skipped("Service name \"aaaa"),
            ),
            (
                "slice entry with port 0",
                with_slice(
                    vec![good_entry(0), {
                        let mut e = good_entry(1);
                        e.port = 0;
                        e
                    }],
                    false,
                ),
                Want::Skipped("spec.services[1].port: must be 1..65535"),
            ),
            (
                "slice with a 10 MB revision",
                with_slice(vec![good_entry(0)], false).replacen(
                    "  revision: ",
                    &format!("  revision: {huge}"),
                    1,
                ),
                Want::Rejected("ForwardingSlice all-0000: rejected: spec.revision: revision \"aaaa"),
            ),
        ];
        for (name, text, want) in cases {
            let got = outcome(text);
            let shown = format!("{got:?}");
            assert!(want.met_by(&got), "{name}: {}", &shown[..shown.len().min(2000)]);
            if let Outcome::Refused(m) = &got {
                assert!(m.len() < 2_000, "{name}: a {} byte message", m.len());
            }
            for message in match &got {
                Outcome::Rejected(m) | Outcome::Skipped(m) => m.clone(),
                _ => vec![],
            } {
                assert!(message.len() < 1_000, "{name}: a {} byte message", message.len());
            }
        }

        // A /0 source range allows every source, as in kube-proxy: the entry is applied unfiltered.
        let mut open = three();
        open.services[1] = Arc::new(lb);
        match outcome(yaml(open)) {
            Outcome::Applied(spec) => assert!(spec.services[1].source_ranges.is_empty(), "{spec:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn status_files_are_replaced_whole() {
        let scratch = switchyard_test_support::scratch::dir("status").unwrap();
        let dir = scratch.path();
        let path = dir.join("status.yaml");
        let status = NodeForwardingPlanStatus {
            observed_revision: Some("abc".into()),
            drift_repairs: 2,
            ..Default::default()
        };
        write_status_file(&path, &status).unwrap();
        let back: NodeForwardingPlanStatus =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, status);
        assert!(!dir.join(".status.yaml.tmp").exists());
    }
}
