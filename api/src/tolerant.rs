//! Watched objects decoded so that a field the reader never reads cannot fail its watch, and a field it
//! does read fails only its own object, by name and field path.
//!
//! ```text
//! watch event / list item ─► serde_json::Value (only invalid JSON fails: the stream is broken then)
//!     ─► P::prune: what the reader never reads is dropped here, before it is decoded
//!     ─► K, through serde_path_to_error ─► Tolerant::Decoded(K)
//!                                       └► Tolerant::Undecodable { metadata (lenient), kind, path, message }
//! ```
//!
//! kube-runtime's watcher decodes each event into its object type; one that does not decode fails the
//! whole watch, which restarts with backoff, and while the writer of that object keeps writing no change
//! of any other object of the kind gets through. The API server accepts and serves values the types
//! library refuses (k8s-openapi requires a Service status condition's `lastTransitionTime`, which the
//! upstream conformance suite writes as `null`). Watching `Tolerant<K, P>` instead of `K` keeps the
//! stream healthy: the reader gets every object that decodes, and for one that does not its key
//! (from metadata read field by field if need be) and what is wrong with it, to keep its last good
//! version.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use serde_json::{Map, Value};

/// What a reader drops from an object of kind `K` before decoding it: fields it never reads, which
/// therefore can never fail it. Implemented by the reader for its own marker type.
pub trait Prune<K> {
    /// Removes from the object's JSON what the reader never reads.
    fn prune(object: &mut Map<String, Value>);
}

/// Drops nothing: every field is decoded.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keep;

impl<K> Prune<K> for Keep {
    fn prune(_: &mut Map<String, Value>) {}
}

/// An object that the API server served but that does not decode into its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecodable {
    /// Its metadata, as far as it could be read (name, namespace, uid, resourceVersion, labels,
    /// annotations, deletionTimestamp at least, when they are well formed).
    pub metadata: ObjectMeta,
    /// Its kind (`Service`, `ForwardingSlice`, ...).
    pub kind: String,
    /// Its apiVersion (`v1`, `switchyard.io/v1alpha2`, ...).
    pub api_version: String,
    /// The field that does not decode, as kubectl names fields (`spec.ports[0].port`; `.` for the
    /// object itself).
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl Undecodable {
    /// `namespace/name`, or `name` for a cluster-scoped object (`?` when it has none).
    pub fn object(&self) -> String {
        let name = self.metadata.name.as_deref().unwrap_or("?");
        match &self.metadata.namespace {
            Some(namespace) => format!("{namespace}/{name}"),
            None => name.to_string(),
        }
    }
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} cannot be read: {}: {}",
            self.kind,
            self.object(),
            self.path,
            self.message
        )
    }
}

/// An object of kind `K` as a tolerant watch delivers it: decoded, or what is known of it and why it
/// did not decode. `P` says what is pruned before decoding ([`Keep`]: nothing).
pub enum Tolerant<K, P = Keep> {
    /// It decoded (after pruning).
    Decoded(K),
    /// It did not.
    Undecodable(Box<Undecodable>, PhantomData<fn() -> P>),
}

impl<K, P> Tolerant<K, P> {
    /// The object, or why it could not be read.
    pub fn into_result(self) -> Result<K, Box<Undecodable>> {
        match self {
            Self::Decoded(object) => Ok(object),
            Self::Undecodable(undecodable, _) => Err(undecodable),
        }
    }

    /// The object, if it decoded.
    pub fn decoded(&self) -> Option<&K> {
        match self {
            Self::Decoded(object) => Some(object),
            Self::Undecodable(..) => None,
        }
    }

    /// Why it did not decode, if it did not.
    pub fn undecodable(&self) -> Option<&Undecodable> {
        match self {
            Self::Decoded(_) => None,
            Self::Undecodable(undecodable, _) => Some(undecodable),
        }
    }
}

impl<K, P> Tolerant<K, P>
where
    K: Resource + DeserializeOwned,
    K::DynamicType: Default,
    P: Prune<K>,
{
    /// Decodes one object's JSON: prunes it, then decodes it into `K`, naming the field that fails.
    pub fn from_value(mut value: Value) -> Self {
        if let Value::Object(object) = &mut value {
            P::prune(object);
        }
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(object) => Self::Decoded(object),
            Err(error) => {
                let path = error.path().to_string();
                let message = crate::words::plain(&error.inner().to_string());
                let dt = K::DynamicType::default();
                Self::Undecodable(
                    Box::new(Undecodable {
                        metadata: lenient_metadata(value.get("metadata")),
                        kind: K::kind(&dt).into_owned(),
                        api_version: K::api_version(&dt).into_owned(),
                        path,
                        message,
                    }),
                    PhantomData,
                )
            }
        }
    }
}

/// The metadata of an object that did not decode: as `ObjectMeta` when that part decodes, else the
/// fields a cache, an Event and a relist need, each read on its own (one bad field loses only itself).
fn lenient_metadata(value: Option<&Value>) -> ObjectMeta {
    let Some(value) = value else {
        return ObjectMeta::default();
    };
    if let Ok(metadata) = ObjectMeta::deserialize(value) {
        return metadata;
    }
    let text = |field: &str| value.get(field).and_then(Value::as_str).map(str::to_string);
    let map = |field: &str| {
        let map = value.get(field)?.as_object()?;
        Some(
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect::<BTreeMap<String, String>>(),
        )
    };
    let time = |field: &str| Time::deserialize(value.get(field)?).ok();
    ObjectMeta {
        name: text("name"),
        namespace: text("namespace"),
        uid: text("uid"),
        resource_version: text("resourceVersion"),
        generation: value.get("generation").and_then(Value::as_i64),
        labels: map("labels"),
        annotations: map("annotations"),
        creation_timestamp: time("creationTimestamp"),
        deletion_timestamp: time("deletionTimestamp"),
        ..ObjectMeta::default()
    }
}

impl<'de, K, P> Deserialize<'de> for Tolerant<K, P>
where
    K: Resource + DeserializeOwned,
    K::DynamicType: Default,
    P: Prune<K>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Self::from_value)
    }
}

impl<K: Resource, P> Resource for Tolerant<K, P> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Decoded(object) => object.meta(),
            Self::Undecodable(undecodable, _) => &undecodable.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Decoded(object) => object.meta_mut(),
            Self::Undecodable(undecodable, _) => &mut undecodable.metadata,
        }
    }
}

impl<K, P> From<K> for Tolerant<K, P> {
    fn from(object: K) -> Self {
        Self::Decoded(object)
    }
}

// By hand: derived impls would require `P: Clone` (or `Debug`, `PartialEq`) of the marker type.
impl<K: Clone, P> Clone for Tolerant<K, P> {
    fn clone(&self) -> Self {
        match self {
            Self::Decoded(object) => Self::Decoded(object.clone()),
            Self::Undecodable(undecodable, _) => Self::Undecodable(undecodable.clone(), PhantomData),
        }
    }
}

impl<K: fmt::Debug, P> fmt::Debug for Tolerant<K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decoded(object) => f.debug_tuple("Decoded").field(object).finish(),
            Self::Undecodable(undecodable, _) => f.debug_tuple("Undecodable").field(undecodable).finish(),
        }
    }
}

impl<K: PartialEq, P> PartialEq for Tolerant<K, P> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Decoded(a), Self::Decoded(b)) => a == b,
            (Self::Undecodable(a, _), Self::Undecodable(b, _)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::json;

    use super::*;
    use crate::ForwardingSlice;

    /// Drops a Service's status conditions, as the controller does.
    struct NoConditions;

    impl Prune<Service> for NoConditions {
        fn prune(object: &mut Map<String, Value>) {
            if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
                status.remove("conditions");
            }
        }
    }

    fn service(status: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7", "uid": "u1"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
            "status": status,
        })
    }

    fn null_condition() -> Value {
        json!({"conditions": [{"type": "Ready", "status": "True", "reason": "x", "message": "",
                               "lastTransitionTime": null}],
               "loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}})
    }

    /// Where decoding of one object ends: `Ok(())` or the field path that failed.
    fn outcome<K, P>(value: Value) -> Result<(), String>
    where
        K: Resource + DeserializeOwned,
        K::DynamicType: Default,
        P: Prune<K>,
    {
        // Through serde, as a watch event's object or a list item is read.
        let tolerant: Tolerant<K, P> = serde_json::from_value(value).map_err(|e| format!("serde: {e}"))?;
        tolerant.into_result().map(drop).map_err(|u| u.path)
    }

    #[test]
    fn what_decodes_and_what_names_its_field() {
        type Cases = Vec<(&'static str, Result<(), String>, Result<(), &'static str>)>;
        let cases: Cases = vec![
            (
                "a null lastTransitionTime, conditions pruned",
                outcome::<Service, NoConditions>(service(null_condition())),
                Ok(()),
            ),
            (
                "a null lastTransitionTime, nothing pruned: the condition's field is named",
                outcome::<Service, Keep>(service(null_condition())),
                Err("status.conditions[0].lastTransitionTime"),
            ),
            (
                "a null in a Node's status condition",
                outcome::<Node, Keep>(json!({
                    "metadata": {"name": "node-a"},
                    "status": {"conditions": [{"type": "Ready", "status": "True",
                                               "lastHeartbeatTime": null, "lastTransitionTime": null,
                                               "reason": null, "message": null}],
                               "addresses": [{"type": "InternalIP", "address": "192.168.10.11"}]},
                })),
                Ok(()),
            ),
            (
                "an EndpointSlice with odd but accepted values",
                outcome::<EndpointSlice, Keep>(json!({
                    "metadata": {"name": "web-1", "namespace": "shop"},
                    "addressType": "IPv4",
                    "ports": null,
                    "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": null},
                                   "hints": {"forZones": []}, "targetRef": {"kind": "Pod"},
                                   "deprecatedTopology": {"": ""}, "zone": ""}],
                })),
                Ok(()),
            ),
            (
                "an unknown field",
                outcome::<Service, Keep>(json!({
                    "metadata": {"name": "web", "namespace": "shop"},
                    "spec": {"ports": [{"port": 80, "appProtocolV2": {"x": 1}}]},
                    "futureField": [null],
                })),
                Ok(()),
            ),
            (
                "a malformed field the reader needs",
                outcome::<Service, NoConditions>(json!({
                    "metadata": {"name": "web", "namespace": "shop"},
                    "spec": {"ports": [{"port": 80}, {"port": "eighty"}]},
                })),
                Err("spec.ports[1].port"),
            ),
            (
                "a slice index past u32",
                outcome::<ForwardingSlice, Keep>(json!({
                    "metadata": {"name": "all-0000"},
                    "spec": {"view": "all", "index": 4_294_967_296_u64, "count": 1, "revision": "r"},
                })),
                Err("spec.index"),
            ),
        ];
        for (case, got, want) in cases {
            assert_eq!(got, want.map_err(str::to_string), "{case}");
        }
    }

    #[test]
    fn an_undecodable_object_keeps_its_key_and_says_what_is_wrong() {
        let value = json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "9", "uid": "u1",
                         "labels": {"app": "web"}, "deletionTimestamp": "2026-12-07T10:00:00Z",
                         // ObjectMeta itself does not decode: read field by field.
                         "generation": "one"},
            "spec": {"ports": [{"port": "eighty"}]},
        });
        let tolerant: Tolerant<Service> = serde_json::from_value(value).unwrap();
        assert_eq!(tolerant.meta().name.as_deref(), Some("web"));
        assert_eq!(tolerant.meta().namespace.as_deref(), Some("shop"));
        assert_eq!(tolerant.meta().resource_version.as_deref(), Some("9"));
        assert_eq!(tolerant.meta().uid.as_deref(), Some("u1"));
        assert!(tolerant.meta().deletion_timestamp.is_some());
        assert_eq!(
            tolerant
                .meta()
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("web")
        );
        let undecodable = tolerant.undecodable().unwrap();
        assert_eq!(undecodable.kind, "Service");
        assert_eq!(
            undecodable.to_string(),
            "Service shop/web cannot be read: metadata.generation: \"one\" is the wrong kind of value: \
             it must be a whole number"
        );
    }

    #[test]
    fn the_resource_is_the_wrapped_kind() {
        assert_eq!(Tolerant::<Service>::plural(&()), "services");
        assert_eq!(Tolerant::<EndpointSlice>::api_version(&()), "discovery.k8s.io/v1");
        assert_eq!(Tolerant::<ForwardingSlice>::kind(&()), "ForwardingSlice");
        let decoded: Tolerant<Service> = serde_json::from_value(service(json!({}))).unwrap();
        assert_eq!(decoded.meta().resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn only_invalid_json_fails() {
        assert!(serde_json::from_str::<Tolerant<Service>>("{\"metadata\": ").is_err());
        assert!(
            serde_json::from_str::<Tolerant<Service>>("[1, 2]")
                .unwrap()
                .undecodable()
                .is_some()
        );
    }
}
