//! `switchyard-controller audit`: which nodes lag behind their plan or the current slices, and what each
//! one misses, from the objects alone (the API server's, or a `kubectl get nfp,fws -o yaml` dump).
//!
//! ```text
//! NodeForwardingPlans ─► per node: spec.revision vs status.observedRevision                  ─┐
//! ForwardingSlices ────► per view of the plan: complete set of slices ─► digest (as the agent) ├► NodeAudit
//!                         vs status.observedSlices.digest; slices written after the node's    ─┘
//!                         last sync are what it most likely misses
//! ```
//!
//! Pure: the command lists the objects and prints [`table`].

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    compose::slices_digest,
    conditions::{APPLIED, status as cond},
    meta::written_at,
    slice::slice_name,
};

/// One node's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAudit {
    /// The node.
    pub node: String,
    /// The agent applied the current plan and the current slices of its views.
    pub current: bool,
    /// What is behind, in words (empty when current).
    pub lag: Vec<String>,
    /// Slices the node most likely misses: those written after its last sync (name, written at).
    pub misses: Vec<(String, Option<Timestamp>)>,
    /// The agent's last sync, as it reported it.
    pub last_sync: Option<String>,
}

/// Audits every plan against the slices.
pub fn audit(plans: &[NodeForwardingPlan], slices: &[ForwardingSlice]) -> Vec<NodeAudit> {
    let mut by_view: BTreeMap<&str, BTreeMap<u32, &ForwardingSlice>> = BTreeMap::new();
    for slice in slices {
        let Some(name) = slice.metadata.name.as_deref() else {
            continue;
        };
        if name == slice_name(&slice.spec.view, slice.spec.index) {
            by_view
                .entry(slice.spec.view.as_str())
                .or_default()
                .insert(slice.spec.index, slice);
        }
    }
    let mut out: Vec<NodeAudit> = plans.iter().map(|plan| audit_one(plan, &by_view)).collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

fn audit_one(
    plan: &NodeForwardingPlan,
    by_view: &BTreeMap<&str, BTreeMap<u32, &ForwardingSlice>>,
) -> NodeAudit {
    let node = plan
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| plan.spec.node_name.clone());
    let status = plan.status.clone().unwrap_or_default();
    let mut lag = Vec::new();
    match status.observed_revision.as_deref() {
        None => lag.push("has applied nothing yet".to_string()),
        Some(observed) if observed != plan.spec.revision => lag.push(format!(
            "applied plan revision {observed}, the plan is at {}",
            plan.spec.revision
        )),
        Some(_) => {}
    }
    let applied = status
        .conditions
        .iter()
        .find(|c| c.type_ == APPLIED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    match &applied {
        Some((s, _, _)) if s == cond::TRUE => {}
        Some((_, reason, message)) => lag.push(format!("Applied is not True ({reason}: {message})")),
        None => lag.push("reports no Applied condition".to_string()),
    }
    let mut current_slices: Vec<(String, &ForwardingSlice)> = Vec::new();
    for view in &plan.spec.views {
        let Some(slices) = by_view.get(view.as_str()) else {
            lag.push(format!(
                "view {view} has no slices in the API (the controller has not written it)"
            ));
            continue;
        };
        let count = slices
            .get(&0)
            .map_or(0, |s| s.spec.count)
            .min(switchyard_api::slice::MAX_SLICES_PER_VIEW);
        for index in 0..count {
            match slices.get(&index) {
                Some(s) if s.spec.count == count => current_slices.push((slice_name(view, index), s)),
                _ => lag.push(format!(
                    "view {view} is incomplete in the API (slice {} missing or from another layout)",
                    slice_name(view, index)
                )),
            }
        }
    }
    let mut misses = Vec::new();
    if !plan.spec.views.is_empty() {
        let want = slices_digest(
            current_slices
                .iter()
                .map(|(name, s)| (name.as_str(), s.spec.revision.as_str())),
        );
        let have = status.observed_slices.as_ref().map(|o| o.digest.as_str());
        if have != Some(want.as_str()) {
            let applied_count = status.observed_slices.as_ref().map_or(0, |o| o.count);
            lag.push(format!(
                "applied slices digest {} ({applied_count} slices), the current {} slices give {want}",
                have.unwrap_or("<none>"),
                current_slices.len()
            ));
            let since = status
                .last_sync_time
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok());
            for (name, slice) in &current_slices {
                let at = written_at(&slice.metadata);
                if since.is_none() || at.zip(since).is_some_and(|(at, since)| at > since) {
                    misses.push((name.clone(), at));
                }
            }
        }
    }
    NodeAudit {
        node,
        current: lag.is_empty(),
        lag,
        misses,
        last_sync: status.last_sync_time,
    }
}

/// The audit as text: one line per node, then what each lagging node misses, then a summary.
pub fn table(audits: &[NodeAudit]) -> String {
    let mut out = String::new();
    let width = audits.iter().map(|a| a.node.len()).max().unwrap_or(4).max(4);
    out.push_str(&format!("{:<width$}   {:<7}   LAST SYNC\n", "NODE", "STATE"));
    for a in audits {
        out.push_str(&format!(
            "{:<width$}   {:<7}   {}\n",
            a.node,
            if a.current { "current" } else { "lagging" },
            a.last_sync.as_deref().unwrap_or("<none>")
        ));
    }
    for a in audits.iter().filter(|a| !a.current) {
        out.push_str(&format!("\n{}:\n", a.node));
        for line in &a.lag {
            out.push_str(&format!("  {line}\n"));
        }
        if !a.misses.is_empty() {
            out.push_str("  slices written after its last sync:\n");
            for (name, at) in &a.misses {
                let at = at.map_or_else(|| "unknown time".to_string(), |t| t.to_string());
                out.push_str(&format!("    {name} (written {at})\n"));
            }
        }
    }
    let current = audits.iter().filter(|a| a.current).count();
    out.push_str(&format!("\n{current} of {} nodes current\n", audits.len()));
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use switchyard_api::{
        NodeForwardingPlanStatus, ObservedSlices, PlanCondition,
        testing::{EntryExt, entry, ep, live_plan, slice},
    };

    use super::*;
    use crate::output::{plan_object, slice_object};

    fn slices() -> Vec<ForwardingSlice> {
        let (n0, s0) = slice(
            "all",
            0,
            2,
            vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.5", 80))],
        );
        let (n1, s1) = slice("all", 1, 2, vec![]);
        let (n2, s2) = slice("zone-a", 0, 1, vec![]);
        let mut objects = vec![
            slice_object(&n0, s0),
            slice_object(&n1, s1),
            slice_object(&n2, s2),
        ];
        for (i, o) in objects.iter_mut().enumerate() {
            o.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("switchyard-controller".into()),
                time: Some(Time(format!("2026-01-01T00:00:0{i}Z").parse().unwrap())),
                ..Default::default()
            }]);
        }
        objects
    }

    fn plan(observed_digest: Option<String>, last_sync: &str) -> NodeForwardingPlan {
        let spec = live_plan("node-a", &["all", "zone-a"], vec![]);
        let mut object = plan_object("node-a", None, spec.clone());
        object.status = Some(NodeForwardingPlanStatus {
            observed_revision: Some(spec.revision.clone()),
            observed_slices: observed_digest.map(|digest| ObservedSlices { count: 3, digest }),
            conditions: vec![PlanCondition {
                type_: APPLIED.into(),
                status: "True".into(),
                reason: "Synced".into(),
                message: String::new(),
                last_transition_time: None,
            }],
            last_sync_time: Some(last_sync.into()),
            ..Default::default()
        });
        object
    }

    #[test]
    fn a_node_that_applied_the_current_slices_is_current() {
        let slices = slices();
        let digest = slices_digest(
            slices
                .iter()
                .map(|s| (s.metadata.name.as_deref().unwrap(), s.spec.revision.as_str())),
        );
        let audits = audit(&[plan(Some(digest), "2026-01-01T00:00:09Z")], &slices);
        assert!(audits[0].current, "{:?}", audits[0]);
        assert!(table(&audits).contains("1 of 1 nodes current"));
    }

    #[test]
    fn a_lagging_node_names_the_slices_written_after_its_last_sync() {
        let audits = audit(
            &[plan(Some("000000000000".into()), "2026-01-01T00:00:01Z")],
            &slices(),
        );
        let a = &audits[0];
        assert!(!a.current);
        assert!(
            a.lag
                .iter()
                .any(|l| l.contains("applied slices digest 000000000000")),
            "{a:?}"
        );
        let missed: Vec<&str> = a.misses.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(missed, ["zone-a-0000"], "only the slice written after 00:00:01");
        let text = table(&audits);
        assert!(text.contains("lagging") && text.contains("zone-a-0000"), "{text}");
    }

    #[test]
    fn an_unapplied_plan_or_an_incomplete_view_is_lag() {
        let mut p = plan(None, "2026-01-01T00:00:01Z");
        p.status.as_mut().unwrap().observed_revision = Some("old".into());
        let mut s = slices();
        s.remove(1);
        let a = &audit(&[p], &s)[0];
        assert!(
            a.lag.iter().any(|l| l.contains("applied plan revision old")),
            "{a:?}"
        );
        assert!(a.lag.iter().any(|l| l.contains("all-0001")), "{a:?}");
    }
}
