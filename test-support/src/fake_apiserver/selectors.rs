//! Label and field selectors, as LIST and WATCH take them: equality (`=`, `==`, `!=`), set-based
//! (`in`, `notin`) and existence (`key`, `!key`); a field selector's key is a dotted path into the
//! object (`metadata.name`).

use serde_json::Value;

pub(super) fn matches_selectors(object: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    let label_ok = labels.is_none_or(|sel| {
        selector_matches(sel, |k| {
            object
                .pointer("/metadata/labels")?
                .get(k)?
                .as_str()
                .map(str::to_string)
        })
    });
    let field_ok = fields.is_none_or(|sel| {
        selector_matches(sel, |k| {
            let pointer = format!("/{}", k.replace('.', "/"));
            object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .map(str::to_string)
        })
    });
    label_ok && field_ok
}

/// A label or field selector against a map: comma-separated terms, each `k=v`, `k==v`, `k!=v`,
/// `k in (a,b)`, `k notin (a,b)`, `k` or `!k` (commas inside parentheses belong to the set).
fn selector_matches(selector: &str, lookup: impl Fn(&str) -> Option<String>) -> bool {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| term_matches(term, &lookup))
}

fn term_matches(term: &str, lookup: &impl Fn(&str) -> Option<String>) -> bool {
    let set = |rest: &str| -> Vec<String> {
        rest.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.trim().to_string())
            .collect()
    };
    if let Some((key, rest)) = term.split_once(" notin ") {
        return lookup(key.trim()).is_none_or(|v| !set(rest).contains(&v));
    }
    if let Some((key, rest)) = term.split_once(" in ") {
        return lookup(key.trim()).is_some_and(|v| set(rest).contains(&v));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return lookup(k.trim()).as_deref() != Some(v.trim());
    }
    if let Some((k, v)) = term.split_once('=') {
        return lookup(k.trim()).as_deref() == Some(v.trim_start_matches('=').trim());
    }
    match term.strip_prefix('!') {
        Some(key) => lookup(key.trim()).is_none(),
        None => lookup(term).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_apiserver::{
        Kind,
        path::{parse_path, percent_decode},
    };

    #[test]
    fn paths_and_selectors() {
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/sys/leases/ctl").unwrap();
        assert_eq!(
            (t.kind, t.namespace.as_deref(), t.name.as_deref()),
            (Kind::Lease, Some("sys"), Some("ctl"))
        );
        let t = parse_path("/apis/switchyard.io/v1alpha2/nodeforwardingplans/node-a/status").unwrap();
        assert_eq!(t.subresource.as_deref(), Some("status"));
        assert_eq!(percent_decode("a%3Db%2Cc"), "a=b,c");
        let object = json!({"metadata": {"name": "n", "labels": {"x": "1", "view": "all"}}});
        assert!(matches_selectors(&object, Some("x=1"), Some("metadata.name=n")));
        assert!(!matches_selectors(&object, Some("x=2"), None));
        let cases = [
            ("x==1", true),
            ("x!=1", false),
            ("view in (all,zone-a)", true),
            ("view in (zone-a, zone-b)", false),
            ("view notin (zone-a)", true),
            ("missing notin (a)", true),
            ("x=1,view in (all,zone-a)", true),
            ("view in (all,zone-a),x=2", false),
            ("x", true),
            ("!x", false),
            ("!missing", true),
        ];
        for (selector, want) in cases {
            assert_eq!(
                matches_selectors(&object, Some(selector), None),
                want,
                "{selector}"
            );
        }
    }
}
