//! Fields of a plan or slice file that its kind's schema does not know, read as kubectl's strict
//! validation reads them (`kubectl apply --validate=strict`): by field path, against the structural
//! schema the API server itself uses (the CRD's `openAPIV3Schema`).
//!
//! ```text
//! text ─► serde (JSON or YAML; no tree is built) ─► each document: kind ─► its CRD schema
//!                                                   each map key looked up in the schema ─► unknown: its path
//! ```
//!
//! Why: serde reads past a key it does not know, so a typo of a field whose value is its default
//! (`masqueradeAlll: false`) reads as the field absent, and a plan's revision (over what was read) would
//! still match. A plan file is refused when any of its fields is unknown, so every edit of a field name
//! is seen; the API path does not use this (the API server prunes what the CRD does not know).

use std::cell::RefCell;
use std::fmt;
use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::crd::{crd, slice_crd};

/// At most this many unknown fields are named; the rest are counted.
pub const MAX_NAMED: usize = 20;

/// One unknown field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// The object: `NodeForwardingPlan node-a`, `ForwardingSlice all-0000`, or `the plan` for a bare spec.
    pub object: String,
    /// Its path, as kubectl writes it: `spec.services[3].endpoints[0].clustr`.
    pub path: String,
}

impl fmt::Display for UnknownField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: unknown field \"{}\"", self.object, self.path)
    }
}

/// What [`unknown_fields_json`] and [`unknown_fields_yaml`] found: the first [`MAX_NAMED`] unknown
/// fields and how many there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownFields {
    /// The first [`MAX_NAMED`], in the order of the text.
    pub named: Vec<UnknownField>,
    /// All of them.
    pub total: usize,
}

impl UnknownFields {
    fn extend(&mut self, other: Self) {
        self.total += other.total;
        let room = MAX_NAMED.saturating_sub(self.named.len());
        self.named.extend(other.named.into_iter().take(room));
    }

    /// None found.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl fmt::Display for UnknownFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named: Vec<String> = self.named.iter().map(ToString::to_string).collect();
        f.write_str(&named.join("; "))?;
        if self.total > self.named.len() {
            write!(f, " (and {} more)", self.total - self.named.len())?;
        }
        Ok(())
    }
}

/// The root schemas of both kinds, built once.
struct Schemas {
    plan: JSONSchemaProps,
    slice: JSONSchemaProps,
}

fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let root = |crd: CustomResourceDefinition| {
            crd.spec
                .versions
                .into_iter()
                .next()
                .and_then(|v| v.schema)
                .and_then(|s| s.open_api_v3_schema)
                .unwrap_or_default()
        };
        Schemas {
            plan: root(crd()),
            slice: root(slice_crd()),
        }
    })
}

/// The unknown fields of a JSON text: one or more documents (objects, Lists, or a bare plan spec).
pub fn unknown_fields_json(text: &str) -> Result<UnknownFields, String> {
    let mut found = UnknownFields::default();
    let mut deserializer = serde_json::Deserializer::from_str(text);
    // `end()` succeeds once only whitespace is left: documents are read until then.
    while deserializer.end().is_err() {
        let document = serde::Deserialize::deserialize(&mut deserializer)
            .map_err(|e: serde_json::Error| e.to_string())?;
        let Document(fields) = document;
        found.extend(fields);
    }
    Ok(found)
}

/// The unknown fields of a YAML text (one document or several).
pub fn unknown_fields_yaml(text: &str, options: serde_saphyr::Options) -> Result<UnknownFields, String> {
    let documents: Vec<Option<Document>> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| e.to_string())?;
    let mut found = UnknownFields::default();
    for Document(fields) in documents.into_iter().flatten() {
        found.extend(fields);
    }
    Ok(found)
}

/// The unknown fields of one object (or List) already read as JSON.
pub fn unknown_fields_value(value: &serde_json::Value) -> UnknownFields {
    use serde::Deserialize as _;
    // Reading a Value cannot fail for want of syntax; a walk that did would report nothing.
    Document::deserialize(value).map_or_else(|_| UnknownFields::default(), |Document(fields)| fields)
}

/// One document's unknown fields.
struct Document(UnknownFields);

impl<'de> serde::Deserialize<'de> for Document {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let state = RefCell::new(Walk::default());
        DocumentSeed {
            state: &state,
            depth: 0,
        }
        .deserialize(deserializer)?;
        Ok(Document(state.into_inner().found))
    }
}

/// Lists inside Lists: as deep as the plan file reader follows them.
const MAX_LIST_DEPTH: usize = 4;

/// Where the walk is: the object being read, the path inside it, and what was found.
#[derive(Default)]
struct Walk {
    object: String,
    path: Vec<Segment>,
    found: UnknownFields,
}

enum Segment {
    Field(&'static str),
    Index(usize),
}

impl Walk {
    fn unknown(&mut self, key: &str) {
        self.found.total += 1;
        if self.found.named.len() >= MAX_NAMED {
            return;
        }
        let mut path = String::new();
        for segment in &self.path {
            match segment {
                Segment::Field(name) if path.is_empty() => path.push_str(name),
                Segment::Field(name) => {
                    path.push('.');
                    path.push_str(name);
                }
                Segment::Index(index) => path.push_str(&format!("[{index}]")),
            }
        }
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        self.found.named.push(UnknownField {
            object: self.object.clone(),
            path,
        });
    }
}

/// A document: an object (by its `kind`), a List of them, or a bare plan spec.
struct DocumentSeed<'s> {
    state: &'s RefCell<Walk>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// The top-level keys every Kubernetes object has besides those its schema lists.
const OBJECT_KEYS: [&str; 6] = ["apiVersion", "kind", "metadata", "spec", "status", "items"];

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let schemas = schemas();
        let mut kind: Option<String> = None;
        let mut name = String::new();
        let mut first = true;
        while let Some(key) = map.next_key::<String>()? {
            if first && !OBJECT_KEYS.contains(&key.as_str()) {
                // A bare spec (`nodeName: …` at the top): the plan spec's fields.
                let spec = schemas.plan.properties.as_ref().and_then(|p| p.get("spec"));
                return match spec {
                    Some(spec) => {
                        self.state.borrow_mut().object = "the plan".into();
                        FieldsSeed {
                            schema: spec,
                            state: self.state,
                        }
                        .rest_of_map(key, map)
                    }
                    None => drain(map),
                };
            }
            first = false;
            match key.as_str() {
                "kind" => kind = map.next_value::<Option<String>>()?,
                "metadata" => {
                    // Read as any value: the plan file reader checks metadata, not this walk.
                    let metadata = map.next_value::<Option<serde_json::Value>>()?;
                    name = metadata
                        .as_ref()
                        .and_then(|m| m.get("name"))
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                }
                "items" if self.depth < MAX_LIST_DEPTH => map.next_value_seed(ItemsSeed {
                    state: self.state,
                    depth: self.depth + 1,
                })?,
                "apiVersion" | "items" => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    let root = match kind.as_deref() {
                        Some("NodeForwardingPlan") => &schemas.plan,
                        Some("ForwardingSlice") => &schemas.slice,
                        // Another kind, or `spec` before `kind`: the plan file reader refuses those.
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    self.state.borrow_mut().object =
                        format!("{} {name}", kind.as_deref().unwrap_or_default());
                    match root
                        .properties
                        .as_ref()
                        .and_then(|p| p.get_key_value(key.as_str()))
                    {
                        Some((field, schema)) => {
                            self.state.borrow_mut().path.push(Segment::Field(field.as_str()));
                            map.next_value_seed(FieldsSeed {
                                schema,
                                state: self.state,
                            })?;
                            self.state.borrow_mut().path.pop();
                        }
                        None => {
                            self.state.borrow_mut().unknown(&key);
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // A JSON array of objects (`[{…}, {…}]`), as the plan file reader also takes.
        while seq
            .next_element_seed(DocumentSeed {
                state: self.state,
                depth: self.depth + 1,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}

fn drain<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The items of a List: documents.
struct ItemsSeed<'s> {
    state: &'s RefCell<Walk>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(DocumentSeed {
            state: self.state,
            depth: self.depth,
        })
    }
}

/// A value read against its schema.
struct FieldsSeed<'s> {
    schema: &'static JSONSchemaProps,
    state: &'s RefCell<Walk>,
}

impl<'s> FieldsSeed<'s> {
    /// The rest of a map whose first key was already read.
    fn rest_of_map<'de, A: MapAccess<'de>>(self, first: String, mut map: A) -> Result<(), A::Error> {
        self.entry(&first, &mut map)?;
        while let Some(key) = map.next_key::<String>()? {
            self.entry(&key, &mut map)?;
        }
        Ok(())
    }

    fn entry<'de, A: MapAccess<'de>>(&self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let schema = self.schema;
        if let Some((field, child)) = schema.properties.as_ref().and_then(|p| p.get_key_value(key)) {
            self.state.borrow_mut().path.push(Segment::Field(field.as_str()));
            map.next_value_seed(FieldsSeed {
                schema: child,
                state: self.state,
            })?;
            self.state.borrow_mut().path.pop();
            return Ok(());
        }
        if let Some(JSONSchemaPropsOrBool::Schema(additional)) = &schema.additional_properties {
            return map.next_value_seed(FieldsSeed {
                schema: additional,
                state: self.state,
            });
        }
        let open = schema.x_kubernetes_preserve_unknown_fields == Some(true)
            || matches!(
                schema.additional_properties,
                Some(JSONSchemaPropsOrBool::Bool(true))
            )
            || schema.properties.is_none();
        if !open {
            self.state.borrow_mut().unknown(key);
        }
        map.next_value::<IgnoredAny>()?;
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            self.entry(&key, &mut map)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some(JSONSchemaPropsOrArray::Schema(items)) = &self.schema.items else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut index = 0;
        loop {
            self.state.borrow_mut().path.push(Segment::Index(index));
            let more = seq
                .next_element_seed(FieldsSeed {
                    schema: items,
                    state: self.state,
                })?
                .is_some();
            self.state.borrow_mut().path.pop();
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}
