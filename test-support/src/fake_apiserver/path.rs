//! Reading a request's URI: the path into a [`Target`] (collection, namespace, name, subresource),
//! and query parameters, percent-decoded.

use super::Kind;

/// Where a request points: the collection, optional namespace, optional name, optional subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) kind: Kind,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

pub(super) fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/..., /apis/<group>/<version>/...
    let rest = match parts.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(name.to_string()), None),
        [resource, name, sub] => (*resource, Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    let kind = match resource {
        "services" => Kind::Service,
        "endpointslices" => Kind::EndpointSlice,
        "nodes" => Kind::Node,
        "nodeforwardingplans" => Kind::Plan,
        "forwardingslices" => Kind::ForwardingSlice,
        "forwardingrollouts" => Kind::Rollout,
        "leases" => Kind::Lease,
        "events" => Kind::Event,
        "customresourcedefinitions" => Kind::CustomResourceDefinition,
        "namespaces" => Kind::Namespace,
        "servicecidrs" => Kind::ServiceCidr,
        _ => return None,
    };
    Some(Target {
        kind,
        namespace,
        name,
        subresource,
    })
}

pub(super) fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

pub(super) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
