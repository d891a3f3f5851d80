//! Turning the plan objects of a node (one, or a sharded set) into the one spec to apply.
//!
//! ```text
//! [primary, shard-1, …, shard-(n-1)] ─► assemble() ─┬─► Ready(spec): primary's header + every shard's entries
//!                                                    └─► Incomplete(why): keep the current rules, report it
//! ```
//!
//! The primary (shard index 0, named after the node) lists the revision of every other shard; the set is
//! applied only when every shard is present and carries exactly the listed revision, so a half-written
//! update (the controller rewrites one shard, then the primary) is never applied.

use std::sync::Arc;

use switchyard_api::NodeForwardingPlanSpec;

/// The result of assembling a node's plan objects.
#[derive(Debug, Clone, PartialEq)]
pub enum Assembly {
    /// The spec to apply; its `revision` is the primary's (covering every shard).
    Ready(Arc<NodeForwardingPlanSpec>),
    /// Not a complete, consistent set (yet).
    Incomplete(String),
}

/// Assembles `objects` (in any order). A single object without shard info is used as it is.
pub fn assemble(objects: &[Arc<NodeForwardingPlanSpec>]) -> Assembly {
    let primaries: Vec<&Arc<NodeForwardingPlanSpec>> = objects
        .iter()
        .filter(|o| o.shard.as_ref().is_none_or(|s| s.index == 0))
        .collect();
    let primary = match primaries.as_slice() {
        [] if objects.is_empty() => return Assembly::Incomplete("no plan object".into()),
        [] => return Assembly::Incomplete("the primary shard (index 0) is missing".into()),
        [one] => *one,
        _ => return Assembly::Incomplete(format!("{} primary objects, want one", primaries.len())),
    };
    let Some(shard) = &primary.shard else {
        return if objects.len() == 1 {
            Assembly::Ready(Arc::clone(primary))
        } else {
            Assembly::Incomplete(format!(
                "{} objects but the primary has no shard info",
                objects.len()
            ))
        };
    };
    let count = shard.count as usize;
    if shard.members.len() + 1 != count {
        return Assembly::Incomplete(format!(
            "the primary lists {} shard revisions for {count} shards",
            shard.members.len()
        ));
    }
    let mut parts: Vec<Option<&Arc<NodeForwardingPlanSpec>>> = vec![None; count];
    for object in objects {
        let Some(info) = &object.shard else { continue };
        if info.index == 0 {
            continue;
        }
        let index = info.index as usize;
        if object.node_name != primary.node_name {
            return Assembly::Incomplete(format!(
                "shard {index} is for node {}, not {}",
                object.node_name, primary.node_name
            ));
        }
        if info.count != shard.count || index >= count {
            return Assembly::Incomplete(format!(
                "shard {index} says {} shards, the primary {count}",
                info.count
            ));
        }
        let want = &shard.members[index - 1];
        if &object.revision != want {
            return Assembly::Incomplete(format!(
                "shard {index} has revision {}, the primary lists {want}",
                object.revision
            ));
        }
        if parts[index].replace(object).is_some() {
            return Assembly::Incomplete(format!("shard {index} appears twice"));
        }
    }
    if let Some(missing) = (1..count).find(|i| parts[*i].is_none()) {
        return Assembly::Incomplete(format!("shard {missing} of {count} is missing"));
    }
    let mut spec = NodeForwardingPlanSpec::clone(primary);
    for part in parts.into_iter().flatten() {
        spec.services.extend(part.services.iter().cloned());
    }
    spec.services.sort_by(|a, b| a.key().cmp(&b.key()));
    Assembly::Ready(Arc::new(spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::ShardInfo;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    fn shards() -> Vec<NodeForwardingPlanSpec> {
        let mut one = plan(
            "node-a",
            vec![entry("ns/b:p", "10.96.0.2", 80).with(ep("10.244.2.2", 80))],
        );
        one.shard = Some(ShardInfo {
            index: 1,
            count: 2,
            members: vec![],
        });
        one.revision = "rev-one".into();
        let mut primary = plan(
            "node-a",
            vec![entry("ns/a:p", "10.96.0.1", 80).with(ep("10.244.2.1", 80))],
        );
        primary.shard = Some(ShardInfo {
            index: 0,
            count: 2,
            members: vec!["rev-one".into()],
        });
        primary.revision = "rev-primary".into();
        vec![one, primary]
    }

    fn arcs(specs: Vec<NodeForwardingPlanSpec>) -> Vec<Arc<NodeForwardingPlanSpec>> {
        specs.into_iter().map(Arc::new).collect()
    }

    #[test]
    fn a_complete_set_merges_under_the_primary_header() {
        let Assembly::Ready(spec) = assemble(&arcs(shards())) else {
            panic!()
        };
        assert_eq!(spec.revision, "rev-primary");
        let names: Vec<&str> = spec.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["ns/a:p", "ns/b:p"]);
        assert!(switchyard_api::validate::validate(&spec).is_clean());
    }

    #[test]
    fn a_single_unsharded_object_is_used_as_is() {
        let object = Arc::new(plan("node-a", vec![]));
        assert_eq!(assemble(std::slice::from_ref(&object)), Assembly::Ready(object));
    }

    #[test]
    fn incomplete_or_inconsistent_sets_are_not_applied() {
        type Mutate = fn(&mut Vec<NodeForwardingPlanSpec>);
        let cases: Vec<(&str, Mutate, &str)> = vec![
            ("missing shard", |s| drop(s.remove(0)), "shard 1 of 2 is missing"),
            (
                "stale shard",
                |s| s[0].revision = "old".into(),
                "has revision old",
            ),
            (
                "no primary",
                |s| drop(s.remove(1)),
                "primary shard (index 0) is missing",
            ),
            (
                "other node",
                |s| s[0].node_name = "node-b".into(),
                "is for node node-b",
            ),
            (
                "count mismatch",
                |s| s[0].shard.as_mut().unwrap().count = 3,
                "says 3 shards",
            ),
            ("duplicate", |s| s.push(s[0].clone()), "appears twice"),
            ("empty", |s| s.clear(), "no plan object"),
        ];
        for (name, mutate, want) in cases {
            let mut objects = shards();
            mutate(&mut objects);
            match assemble(&arcs(objects)) {
                Assembly::Incomplete(why) => assert!(why.contains(want), "{name}: {why}"),
                ready => panic!("{name}: {ready:?}"),
            }
        }
    }
}
