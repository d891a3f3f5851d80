//! Reading cluster dumps for offline planning.
//!
//! ```text
//! file ─► JSON or (multi-document) YAML ─► documents ─► v1 List items flattened ─► kind dispatch
//!                                                        Service / EndpointSlice / Node ─► Snapshot
//!                                                        ServiceCIDR ─► the plans' Service ranges
//!                                                        NodeForwardingPlan / ForwardingSlice ─► audit
//! ```
//!
//! Accepts exactly what `kubectl get services,endpointslices,nodes -A -o yaml|json` prints (a v1 `List`),
//! multi-document YAML, or single objects. Other kinds are ignored, each named. A document that cannot
//! be parsed, or an object whose structure does not match its kind, fails the whole file with its
//! position: offline planning of a half-read dump would mislead its reader.
//!
//! Read as kubectl's strict validation reads (`kubectl apply --validate=strict`): a field a known kind
//! does not have (`prots:` for `ports:`) is reported by object and field path ([`UnknownField`]; the
//! caller warns, or with `--strict` refuses), found by comparing each object as written with the typed
//! object read back (what the types library does not know is what it dropped).

use std::path::Path;

use k8s_openapi::api::{
    core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice, networking::v1::ServiceCIDR,
};
use serde_json::Value;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, words};

use crate::{Error, planner::Snapshot};

/// What was read, plus kinds that were ignored.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The objects the planner uses.
    pub snapshot: Snapshot,
    /// NodeForwardingPlans (for `audit`).
    pub plans: Vec<NodeForwardingPlan>,
    /// ServiceCIDRs (networking.k8s.io/v1), for the plans' Service ranges.
    pub service_cidrs: Vec<ServiceCIDR>,
    /// ForwardingSlices (for `audit`).
    pub forwarding_slices: Vec<ForwardingSlice>,
    /// Every object of a kind not read here, named.
    pub ignored: Vec<Ignored>,
    /// Fields the types of a known kind do not have, in the order of the input.
    pub unknown_fields: Vec<UnknownField>,
}

/// An object of a kind the reader does not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    /// Its kind.
    pub kind: String,
    /// `namespace/name`, or `name`.
    pub name: String,
    /// Where it is: `dump.yaml: document 1, items[3]`.
    pub at: String,
}

impl Ignored {
    /// The known kind this one is most likely a typo of (`Servce`: `Service`), if any.
    pub fn meant(&self) -> Option<&'static str> {
        READ_KINDS
            .into_iter()
            // One slip per five letters, and one at least: `Servce` and `Nodes` are near misses, `Pod`
            // (two from `Node`) and `Endpoints` are kinds of their own.
            .find(|known| {
                known.eq_ignore_ascii_case(&self.kind)
                    || edit_distance(known, &self.kind) <= known.len() / 5 + 1
            })
    }
}

/// The kinds this reader uses.
pub const READ_KINDS: [&str; 5] = [
    "Service",
    "EndpointSlice",
    "Node",
    "NodeForwardingPlan",
    "ForwardingSlice",
];

/// A field the object's kind does not have, as kubectl's strict validation names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// `Service default/web`.
    pub object: String,
    /// `spec.prots`.
    pub path: String,
    /// Where the object is: `dump.yaml: document 1, items[3]`.
    pub at: String,
}

impl std::fmt::Display for UnknownField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: unknown field \"{}\" ({})",
            self.object, self.path, self.at
        )
    }
}

/// Levenshtein distance, for kinds (short words).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The paths of `written`'s fields that `read` (the typed object serialised back) does not have: the
/// fields the types dropped. A `null` is no field (kubectl prints some), and list items are compared by
/// position.
fn dropped_fields(written: &Value, read: &Value, path: &mut String, out: &mut Vec<String>) {
    match (written, read) {
        (Value::Object(written), Value::Object(read)) => {
            for (key, value) in written {
                if value.is_null() {
                    continue;
                }
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                match read.get(key) {
                    Some(read) => dropped_fields(value, read, path, out),
                    None => out.push(path.clone()),
                }
                path.truncate(len);
            }
        }
        (Value::Array(written), Value::Array(read)) => {
            for (i, (written, read)) in written.iter().zip(read).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                dropped_fields(written, read, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Reads `value` as `T` and reports the fields `T` does not have.
fn read_strictly<T>(value: Value, object: &str, at: &str, loaded: &mut Loaded) -> Result<T, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "NodeForwardingPlan" || kind == "ForwardingSlice" {
        // Our own kinds leave default values out when written back, so an explicit `local: false` would
        // read as dropped: their CRD schema says what they have instead.
        let found = switchyard_api::known::unknown_fields_value(&value);
        loaded
            .unknown_fields
            .extend(found.named.into_iter().map(|field| UnknownField {
                object: object.to_string(),
                path: field.path,
                at: at.to_string(),
            }));
        return words::from_value(value);
    }
    let typed: T = words::from_value(value.clone())?;
    // Serialising a typed object cannot fail; were it to, nothing would be reported rather than all.
    if let Ok(read) = serde_json::to_value(&typed) {
        let mut paths = Vec::new();
        dropped_fields(&value, &read, &mut String::new(), &mut paths);
        loaded
            .unknown_fields
            .extend(paths.into_iter().map(|path| UnknownField {
                object: object.to_string(),
                path,
                at: at.to_string(),
            }));
    }
    Ok(typed)
}

/// Reads every file (`-`: standard input, as kubectl's `-f -`) into one snapshot. An empty file is an
/// error: it is what a failed `kubectl get … > FILE` leaves, and planning nothing from it would look
/// like success.
pub fn load_files<P: AsRef<Path>>(paths: &[P]) -> Result<Loaded, Error> {
    let mut loaded = Loaded::default();
    for path in paths {
        let path = path.as_ref();
        let stdin = path == Path::new("-");
        let name = if stdin {
            "standard input".to_owned()
        } else {
            path.display().to_string()
        };
        let read_error = |source| Error::ReadFile {
            path: name.clone(),
            source,
        };
        let bytes = if stdin {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes).map_err(read_error)?;
            bytes
        } else {
            std::fs::read(path).map_err(read_error)?
        };
        let text = String::from_utf8(bytes).map_err(|e| Error::ParseInput {
            path: name.clone(),
            message: format!("not UTF-8: {e}"),
        })?;
        if text.trim().is_empty() {
            return Err(Error::ParseInput {
                path: name,
                message: "the input is empty (what a failed `kubectl get … > FILE` leaves)".into(),
            });
        }
        load_text(&name, &text, &mut loaded)?;
    }
    Ok(loaded)
}

/// Parses one file's text into `loaded`. `name` is used in error messages.
pub fn load_text(name: &str, text: &str, loaded: &mut Loaded) -> Result<(), Error> {
    let documents = parse_documents(name, text)?;
    for (doc_index, doc) in documents.into_iter().enumerate() {
        let at = format!("document {}", doc_index + 1);
        add_object(name, &at, doc, loaded)?;
    }
    // Object names stay as written; a reader of many files needs the file too.
    for field in &mut loaded.unknown_fields {
        if !field.at.contains(": ") {
            field.at = format!("{name}: {}", field.at);
        }
    }
    for ignored in &mut loaded.ignored {
        if !ignored.at.contains(": ") {
            ignored.at = format!("{name}: {}", ignored.at);
        }
    }
    Ok(())
}

fn parse_documents(name: &str, text: &str) -> Result<Vec<Value>, Error> {
    let error = |message: String| Error::ParseInput {
        path: name.to_string(),
        message,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // JSON: one value, or several concatenated (as `kubectl get -o json` of separate calls gives).
        let json: Result<Vec<Value>, serde_json::Error> = serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect();
        return match json {
            Ok(documents) => Ok(documents),
            // Flow-style YAML starts the same way; only when that fails too is it reported as JSON.
            Err(e) => parse_yaml(text).map_err(|_| {
                error(format!(
                    "invalid JSON at line {} column {}: {e}",
                    e.line(),
                    e.column()
                ))
            }),
        };
    }
    parse_yaml(text).map_err(|e| {
        error(
            switchyard_api::yaml::exceeded_limit(&e)
                .unwrap_or_else(|| format!("invalid YAML: {}", words::yaml(&e))),
        )
    })
}

fn parse_yaml(text: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    let mut options = switchyard_api::yaml::large_file_options();
    options.leading_zero_numbers_as_strings = true;
    let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

fn add_object(name: &str, at: &str, value: Value, loaded: &mut Loaded) -> Result<(), Error> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let named = |value: &Value| {
        let meta = value.get("metadata");
        let ns = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str);
        let object = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>");
        match ns {
            Some(ns) => format!("{ns}/{object}"),
            None => object.to_string(),
        }
    };
    let describe = |value: &Value| format!("{kind} {}", named(value));
    let invalid = |what: String, e: String| Error::ParseInput {
        path: name.to_string(),
        message: format!("{at} ({what}): {e}"),
    };
    match kind.as_str() {
        "List"
        | "ServiceList"
        | "EndpointSliceList"
        | "NodeList"
        | "ServiceCIDRList"
        | "NodeForwardingPlanList"
        | "ForwardingSliceList" => {
            let items = match value.get("items") {
                Some(Value::Array(items)) => items.clone(),
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(Error::ParseInput {
                        path: name.to_string(),
                        message: format!("{at}: `items` of a {kind} must be a list"),
                    });
                }
            };
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for (i, mut item) in items.into_iter().enumerate() {
                // Typed lists omit kind/apiVersion on their items.
                if let (Some(item_kind), Some(map)) = (item_kind, item.as_object_mut()) {
                    map.entry("kind")
                        .or_insert_with(|| Value::String(item_kind.to_string()));
                }
                add_object(name, &format!("{at}, items[{i}]"), item, loaded)?;
            }
        }
        "Service" => {
            let what = describe(&value);
            let object: Service = read_strictly(with_api_version(value, "v1"), &what, at, loaded)
                .map_err(|e| invalid(what, e))?;
            loaded.snapshot.services.push(object);
        }
        "EndpointSlice" => {
            let what = describe(&value);
            let object: EndpointSlice =
                read_strictly(with_api_version(value, "discovery.k8s.io/v1"), &what, at, loaded)
                    .map_err(|e| invalid(what, e))?;
            loaded.snapshot.slices.push(object);
        }
        "Node" => {
            let what = describe(&value);
            let object: Node = read_strictly(with_api_version(value, "v1"), &what, at, loaded)
                .map_err(|e| invalid(what, e))?;
            loaded.snapshot.nodes.push(object);
        }
        "ServiceCIDR" => {
            let what = describe(&value);
            let object: ServiceCIDR = words::from_value(with_api_version(value, "networking.k8s.io/v1"))
                .map_err(|e| invalid(what, e))?;
            loaded.service_cidrs.push(object);
        }
        "NodeForwardingPlan" => {
            let what = describe(&value);
            let object: NodeForwardingPlan = read_strictly(
                with_api_version(value, "switchyard.io/v1alpha2"),
                &what,
                at,
                loaded,
            )
            .map_err(|e| invalid(what, e))?;
            loaded.plans.push(object);
        }
        "ForwardingSlice" => {
            let what = describe(&value);
            let object: ForwardingSlice = read_strictly(
                with_api_version(value, "switchyard.io/v1alpha2"),
                &what,
                at,
                loaded,
            )
            .map_err(|e| invalid(what, e))?;
            loaded.forwarding_slices.push(object);
        }
        "" => {
            // `kubectl get -o yaml` prints `kind: List` after the items: a List without it was cut off.
            let truncated = value.get("items").is_some_and(Value::is_array);
            let message = if truncated {
                format!(
                    "{at}: a list of items without its `kind: List` line, which `kubectl get -o yaml` \
                     prints last: the file looks truncated"
                )
            } else {
                format!("{at}: object has no `kind`")
            };
            return Err(Error::ParseInput {
                path: name.to_string(),
                message,
            });
        }
        _ => {
            let name = named(&value);
            loaded.ignored.push(Ignored {
                kind,
                name,
                at: at.to_string(),
            });
        }
    }
    Ok(())
}

/// Items of a `kubectl get -o yaml` List carry apiVersion; hand-written fixtures sometimes do not.
fn with_api_version(mut value: Value, api_version: &str) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.entry("apiVersion")
            .or_insert_with(|| Value::String(api_version.to_string()));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec:
    clusterIP: 10.96.0.10
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-abc
    namespace: default
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  endpoints: [{addresses: [10.244.1.5], nodeName: node-a}]
  ports: [{name: http, port: 8080, protocol: TCP}]
- apiVersion: v1
  kind: Node
  metadata: {name: node-a, labels: {topology.kubernetes.io/zone: "on"}}
- apiVersion: v1
  kind: Pod
  metadata: {name: p}
"#;

    #[test]
    fn reads_a_kubectl_list() {
        let mut loaded = Loaded::default();
        load_text("dump.yaml", LIST, &mut loaded).unwrap();
        assert_eq!(loaded.snapshot.services.len(), 1);
        assert_eq!(loaded.snapshot.slices.len(), 1);
        assert_eq!(loaded.snapshot.nodes.len(), 1);
        assert_eq!(
            loaded.ignored,
            vec![Ignored {
                kind: "Pod".into(),
                name: "p".into(),
                at: "dump.yaml: document 1, items[3]".into()
            }]
        );
        assert_eq!(loaded.unknown_fields, vec![]);
        let port = &loaded.snapshot.services[0]
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()[0];
        assert_eq!(port.port, 80);
        let zone = loaded.snapshot.nodes[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get("topology.kubernetes.io/zone");
        assert_eq!(zone.map(String::as_str), Some("on"));
    }

    #[test]
    fn reads_multi_document_yaml_and_json() {
        let yaml = "kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: b}\n---\n";
        let mut loaded = Loaded::default();
        load_text("nodes.yaml", yaml, &mut loaded).unwrap();
        let json = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"c"}}]}"#;
        load_text("nodes.json", json, &mut loaded).unwrap();
        let names: Vec<_> = loaded
            .snapshot
            .nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn flow_style_yaml_is_not_mistaken_for_json() {
        let yaml = "{kind: Node, metadata: {name: a}}
";
        let mut loaded = Loaded::default();
        load_text("node.yaml", yaml, &mut loaded).unwrap();
        assert_eq!(loaded.snapshot.nodes.len(), 1);
    }

    #[test]
    fn typed_lists_get_their_item_kind() {
        let yaml = "kind: NodeList\nitems:\n- metadata: {name: a}\n";
        let mut loaded = Loaded::default();
        load_text("nodes.yaml", yaml, &mut loaded).unwrap();
        assert_eq!(loaded.snapshot.nodes.len(), 1);
    }

    #[test]
    fn errors_name_the_file_and_position() {
        let cases = [
            (
                "bad.yaml",
                "kind: List\nitems:\n  - [unclosed\n",
                "bad.yaml: invalid YAML",
            ),
            (
                "bad.json",
                "{\"kind\": \"List\",\n \"items\": [}",
                "bad.json: invalid JSON at line 2",
            ),
            (
                "nokind.yaml",
                "metadata: {name: x}\n",
                "nokind.yaml: document 1: object has no `kind`",
            ),
            (
                "cut.yaml",
                "apiVersion: v1\nitems:\n- kind: Node\n  metadata: {name: a}\n",
                "cut.yaml: document 1: a list of items without its `kind: List` line, which `kubectl get -o \
                 yaml` prints last: the file looks truncated",
            ),
            (
                "storm.yaml",
                &"kind: Node\nmetadata: {name: a}\n---\n".repeat(switchyard_api::yaml::MAX_DOCUMENTS + 1),
                "storm.yaml: the file holds more than 100000 YAML documents",
            ),
            (
                "wrongtype.yaml",
                "kind: List\nitems:\n- kind: Service\n  metadata: {name: s, namespace: n}\n  spec: {ports: [{port: abc}]}\n",
                "wrongtype.yaml: document 1, items[0] (Service n/s): spec.ports[0].port: \"abc\" is the wrong kind \
                 of value: it must be a whole number from -2147483648 to 2147483647",
            ),
            (
                "twice.yaml",
                "kind: Node\nmetadata: {name: a}\nmetadata: {name: b}\n",
                "twice.yaml: invalid YAML: error: line 3 column 1: `metadata` is given twice in one mapping",
            ),
        ];
        for (name, text, want) in cases {
            let mut loaded = Loaded::default();
            let error = load_text(name, text, &mut loaded).unwrap_err().to_string();
            assert!(error.starts_with(want), "{name}: {error}");
        }
    }

    #[test]
    fn large_dumps_and_trees_of_many_documents_fit_the_yaml_limits() {
        // 3,000 Services: far above serde-saphyr's default 250,000-node budget.
        use switchyard_test_support::synthetic::{Shape, cluster};
        let snapshot = cluster(&Shape::new(3, 3_000, 5));
        let mut items: Vec<serde_json::Value> = Vec::new();
        items.extend(snapshot.services.iter().map(|o| serde_json::json!(o)));
        items.extend(snapshot.slices.iter().map(|o| serde_json::json!(o)));
        items.extend(snapshot.nodes.iter().map(|o| serde_json::json!(o)));
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let yaml = serde_saphyr::to_string(&list).unwrap();
        let mut loaded = Loaded::default();
        load_text("big.yaml", &yaml, &mut loaded).unwrap();
        assert_eq!(loaded.snapshot.services.len(), 3_000);
        // The same objects as one document each (a concatenated GitOps tree): 6,003 documents, far
        // above serde-saphyr's default of 1,024.
        let documents: Vec<String> = items
            .iter()
            .map(|item| serde_saphyr::to_string(item).unwrap())
            .collect();
        let mut loaded = Loaded::default();
        load_text("tree.yaml", &documents.join("---\n"), &mut loaded).unwrap();
        assert_eq!(loaded.snapshot.services.len(), 3_000);
        assert_eq!(loaded.snapshot.slices.len(), 3_000);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let error = load_files(&["/nonexistent/dump.yaml"]).unwrap_err().to_string();
        assert!(error.contains("/nonexistent/dump.yaml"), "{error}");
    }
}
