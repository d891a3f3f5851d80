//! Objects of every watched Kubernetes kind with an odd value in one field at a time, for the tests of
//! tolerant decoding (`switchyard_api::tolerant`): in unit tests against the decoder, and against a real
//! API server, which accepts some of them.
//!
//! ```text
//! samples::{service, endpoint_slice, node} (every field k8s-openapi knows, set) ─┐
//! any object the API server served ───────────────────────────────────────────────┴─► odd_values(object)
//!     ─► per path (kubectl style: spec.ports[0].port): null · a scalar of another type · an unknown field
//! ```

use serde_json::{Map, Value, json};

/// One object with one odd value.
#[derive(Debug, Clone, PartialEq)]
pub struct Odd {
    /// Where, as kubectl and serde_path_to_error name fields (`spec.ports[0].port`).
    pub path: String,
    /// What was put there.
    pub value: Value,
    /// The whole object with it.
    pub object: Value,
}

/// Every variant of `object` with one odd value: each member and element (but `apiVersion`, `kind`
/// and `metadata.resourceVersion`) set to `null`; each scalar replaced by one of another type; each
/// object given an unknown member.
pub fn odd_values(object: &Value) -> Vec<Odd> {
    let mut paths = Vec::new();
    walk(object, String::new(), &mut paths);
    let mut odd = Vec::new();
    for (path, value) in paths {
        if matches!(path.as_str(), "apiVersion" | "kind" | "metadata.resourceVersion") {
            continue;
        }
        let mut variants = vec![Value::Null];
        variants.extend(other_type(&value));
        if value.is_object() {
            let mut with_unknown = value.clone();
            if let Some(map) = with_unknown.as_object_mut() {
                map.insert("switchyardUnknownField".into(), json!({"odd": [null, 1, "x"]}));
            }
            variants.push(with_unknown);
        }
        for variant in variants {
            let mut copy = object.clone();
            if let Some(slot) = at(&mut copy, &path) {
                *slot = variant.clone();
            }
            odd.push(Odd {
                path: path.clone(),
                value: variant,
                object: copy,
            });
        }
    }
    odd
}

/// True when `a` and `b` name the same field or one lies inside the other.
pub fn related(a: &str, b: &str) -> bool {
    let inside = |outer: &str, inner: &str| {
        outer == "."
            || inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    };
    inside(a, b) || inside(b, a)
}

fn walk(value: &Value, path: String, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            for (key, member) in map {
                let path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                out.push((path.clone(), member.clone()));
                walk(member, path, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("{path}[{i}]");
                out.push((path.clone(), item.clone()));
                walk(item, path, out);
            }
        }
        _ => {}
    }
}

/// A scalar of another type than `value`'s (none for objects and arrays).
fn other_type(value: &Value) -> Option<Value> {
    match value {
        Value::String(_) => Some(json!(7)),
        Value::Number(_) | Value::Bool(_) => Some(json!("odd")),
        Value::Null | Value::Object(_) | Value::Array(_) => None,
    }
}

/// The value at a path [`walk`] produced (member names may contain dots: labels, annotations).
fn at<'a>(value: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    let mut current = value;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(index) = rest.strip_prefix('[') {
            let (number, tail) = index.split_once(']')?;
            current = current.as_array_mut()?.get_mut(number.parse::<usize>().ok()?)?;
            rest = tail.strip_prefix('.').unwrap_or(tail);
            continue;
        }
        let map: &mut Map<String, Value> = current.as_object_mut()?;
        // The longest member name that matches (a label key may hold dots).
        let key = map
            .keys()
            .filter(|key| {
                rest.strip_prefix(key.as_str())
                    .is_some_and(|tail| tail.is_empty() || tail.starts_with('.') || tail.starts_with('['))
            })
            .max_by_key(|key| key.len())?
            .clone();
        let tail = &rest[key.len()..];
        rest = tail.strip_prefix('.').unwrap_or(tail);
        current = map.get_mut(&key)?;
    }
    Some(current)
}

/// A Service with every field k8s-openapi knows set (allocated ones, such as the ClusterIP, left to
/// the API server).
pub fn service(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                     "annotations": {"example.com/note": "odd"}},
        "spec": {
            "type": "LoadBalancer", "selector": {"app": name},
            "ports": [{"name": "http", "protocol": "TCP", "appProtocol": "http", "port": 80,
                       "targetPort": 8080}],
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}},
            "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
            "ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"], "externalIPs": ["192.0.2.10"],
            "loadBalancerSourceRanges": ["10.0.0.0/8"], "publishNotReadyAddresses": false,
            "allocateLoadBalancerNodePorts": true, "trafficDistribution": "PreferClose",
        },
        "status": {
            "loadBalancer": {"ingress": [{"ip": "203.0.113.1", "ipMode": "VIP",
                                          "ports": [{"port": 80, "protocol": "TCP", "error": "none"}]}]},
            "conditions": [{"type": "StatusUpdate", "status": "True", "reason": "E2E", "message": "set",
                            "lastTransitionTime": "2026-12-07T10:00:00Z", "observedGeneration": 1}],
        },
    })
}

/// An EndpointSlice of `service` with every field k8s-openapi knows set.
pub fn endpoint_slice(namespace: &str, name: &str, service: &str, node: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080, "appProtocol": "http"}],
        "endpoints": [{
            "addresses": ["10.244.1.5"],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "hostname": "pod-a", "nodeName": node, "zone": "zone-a",
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": "pod-a", "uid": "u-1",
                          "resourceVersion": "1", "apiVersion": "v1"},
            "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": node}]},
            "deprecatedTopology": {"kubernetes.io/hostname": node},
        }],
    })
}

/// A Node with every field k8s-openapi knows set.
pub fn node(name: &str) -> Value {
    let time = "2026-12-07T10:00:00Z";
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "zone-a",
                                              "kubernetes.io/hostname": name},
                     "annotations": {"example.com/note": "odd"}},
        "spec": {
            "podCIDR": "10.244.9.0/24", "podCIDRs": ["10.244.9.0/24"], "providerID": format!("fake://{name}"),
            "unschedulable": false,
            "taints": [{"key": "example.com/odd", "value": "v", "effect": "NoSchedule", "timeAdded": time}],
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "192.168.10.99"},
                          {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": time,
                            "lastTransitionTime": time, "reason": "KubeletReady", "message": "ready"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                         "osImage": "odd", "containerRuntimeVersion": "containerd://2.0.0",
                         "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": ["registry.example/odd:1"], "sizeBytes": 1000}],
            "volumesInUse": ["kubernetes.io/csi/odd"],
            "volumesAttached": [{"name": "kubernetes.io/csi/odd", "devicePath": "/dev/odd"}],
            "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": true,
                                                              "userNamespaces": true}}],
            "features": {"supplementalGroupsPolicy": true},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gets_each_odd_value_and_nothing_else_changes() {
        let object =
            json!({"kind": "K", "metadata": {"labels": {"a.b/c": "x"}}, "spec": {"ports": [{"port": 80}]}});
        let odd = odd_values(&object);
        let paths: Vec<(&str, &Value)> = odd.iter().map(|o| (o.path.as_str(), &o.value)).collect();
        let unknown = json!({"odd": [null, 1, "x"]});
        let with_unknown = |mut value: Value| {
            value["switchyardUnknownField"] = unknown.clone();
            value
        };
        assert_eq!(
            paths,
            [
                ("metadata", &Value::Null),
                ("metadata", &with_unknown(object["metadata"].clone())),
                ("metadata.labels", &Value::Null),
                (
                    "metadata.labels",
                    &with_unknown(object["metadata"]["labels"].clone())
                ),
                ("metadata.labels.a.b/c", &Value::Null),
                ("metadata.labels.a.b/c", &json!(7)),
                ("spec", &Value::Null),
                ("spec", &with_unknown(object["spec"].clone())),
                ("spec.ports", &Value::Null),
                ("spec.ports[0]", &Value::Null),
                ("spec.ports[0]", &with_unknown(json!({"port": 80}))),
                ("spec.ports[0].port", &Value::Null),
                ("spec.ports[0].port", &json!("odd")),
            ]
        );
        let dotted = &odd[5].object;
        assert_eq!(dotted["metadata"]["labels"]["a.b/c"], json!(7));
        assert_eq!(odd[12].object["spec"]["ports"][0]["port"], json!("odd"));
        assert_eq!(odd[12].object["kind"], "K");
    }

    #[test]
    fn related_paths() {
        for (a, b, want) in [
            ("spec.ports[0].port", "spec.ports[0].port", true),
            ("spec.ports[0]", "spec.ports[0].port", true),
            ("spec.ports", "spec.ports[0]", true),
            (".", "spec", true),
            ("spec.port", "spec.ports", false),
            ("spec.ports[1]", "spec.ports[10]", false),
        ] {
            assert_eq!(related(a, b), want, "{a} ~ {b}");
        }
    }
}
