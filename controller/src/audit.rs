//! `switchyard-controller audit`: which nodes lag behind their plan or the current slices, and what each
//! one misses, from the objects alone (the API server's, or a `kubectl get nfp,fws -o yaml` dump).
//!
//! ```text
//! NodeForwardingPlans ─► per node: spec.revision vs status.observedRevision                  ─┐
//! ForwardingSlices ────► per view of the plan: complete set of packed slices + its Service       ├► NodeAudit
//!                         slices ─► digest (as the agent) vs status.observedSlices.digest; slices ─┘
//!                         written after the node's last sync are what it most likely misses
//! behind only by slices written in the last REPORT_GRACE ─► "reporting", not lagging
//! ```
//!
//! Why "reporting": an agent writes a new plan revision, a condition or a failure at once, but progress
//! alone (newer slices applied) at most every `--status-progress-interval` (1 minute), so that status
//! writes do not grow with churn times nodes. A node behind only by slices written within that window has
//! most likely applied them and not said so yet.
//!
//! Pure: the command lists the objects and prints [`table`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use switchyard_api::{
    ForwardingSlice, NodeForwardingPlan,
    compose::slices_digest,
    conditions::{APPLIED, status as cond},
    meta::written_at,
    slice::{expected_name, slice_name},
};

/// How long a node may be behind by newly written slices alone and count as reporting rather than
/// lagging: the agent's default status progress interval (60 s) plus time for a sync and its write.
pub const REPORT_GRACE: Duration = Duration::from_secs(75);

/// One node's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAudit {
    /// The node.
    pub node: String,
    /// The agent applied the current plan and the current slices of its views.
    pub current: bool,
    /// Not current, but behind only by slices written less than [`REPORT_GRACE`] ago (its agent
    /// reports progress at most once a minute).
    pub reporting: bool,
    /// What is behind, in words (empty when current).
    pub lag: Vec<String>,
    /// Slices the node most likely misses: those written after its last sync (name, written at).
    pub misses: Vec<(String, Option<Timestamp>)>,
    /// The agent's last sync, as it reported it.
    pub last_sync: Option<String>,
}

/// Audits every plan against the slices.
/// Audits every plan against the slices, at `now` (`None`: no node counts as reporting).
pub fn audit(
    plans: &[NodeForwardingPlan],
    slices: &[ForwardingSlice],
    now: Option<Timestamp>,
) -> Vec<NodeAudit> {
    let mut views = Views::default();
    for slice in slices {
        let Some(name) = slice.metadata.name.as_deref() else {
            continue;
        };
        if name != expected_name(&slice.spec) {
            continue;
        }
        if slice.spec.service.is_some() {
            views
                .services
                .entry(slice.spec.view.as_str())
                .or_default()
                .push((name, slice));
        } else {
            views
                .packed
                .entry(slice.spec.view.as_str())
                .or_default()
                .insert(slice.spec.index, slice);
        }
    }
    let mut out: Vec<NodeAudit> = plans.iter().map(|plan| audit_one(plan, &views, now)).collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// The latest time any object of a dump was written or synced: the dump is at least that recent.
pub fn newest_write(plans: &[NodeForwardingPlan], slices: &[ForwardingSlice]) -> Option<Timestamp> {
    let synced = plans.iter().filter_map(|p| {
        p.status
            .as_ref()?
            .last_sync_time
            .as_deref()?
            .parse::<Timestamp>()
            .ok()
    });
    let written = plans
        .iter()
        .map(|p| &p.metadata)
        .chain(slices.iter().map(|s| &s.metadata))
        .filter_map(written_at);
    synced.chain(written).max()
}

#[derive(Default)]
struct Views<'a> {
    /// Packed slices by view and index.
    packed: BTreeMap<&'a str, BTreeMap<u32, &'a ForwardingSlice>>,
    /// Service slices by view: (name, slice).
    services: BTreeMap<&'a str, Vec<(&'a str, &'a ForwardingSlice)>>,
}

fn audit_one(plan: &NodeForwardingPlan, views: &Views<'_>, now: Option<Timestamp>) -> NodeAudit {
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
        let Some(slices) = views.packed.get(view.as_str()) else {
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
        for (name, slice) in views.services.get(view.as_str()).into_iter().flatten() {
            current_slices.push((name.to_string(), slice));
        }
    }
    let other_lag = lag.len();
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
    let recent = |at: &Option<Timestamp>| {
        now.zip(*at)
            .is_some_and(|(now, at)| now.duration_since(at).unsigned_abs().le(&REPORT_GRACE))
    };
    let reporting =
        other_lag == 0 && !lag.is_empty() && !misses.is_empty() && misses.iter().all(|(_, at)| recent(at));
    NodeAudit {
        node,
        current: lag.is_empty(),
        reporting,
        lag,
        misses,
        last_sync: status.last_sync_time,
    }
}

/// The audit as text: one line per node, then what each lagging node misses, then a summary.
pub fn table(audits: &[NodeAudit]) -> String {
    let mut out = String::new();
    let width = audits.iter().map(|a| a.node.len()).max().unwrap_or(4).max(4);
    out.push_str(&format!("{:<width$}   {:<9}   LAST SYNC\n", "NODE", "STATE"));
    for a in audits {
        out.push_str(&format!(
            "{:<width$}   {:<9}   {}\n",
            a.node,
            if a.current {
                "current"
            } else if a.reporting {
                "reporting"
            } else {
                "lagging"
            },
            a.last_sync.as_deref().unwrap_or("<none>")
        ));
    }
    for a in audits.iter().filter(|a| !a.current && !a.reporting) {
        out.push_str(&format!("\n{}:\n", a.node));
        for line in &a.lag {
            out.push_str(&format!("  {line}\n"));
        }
        if !a.misses.is_empty() {
            out.push_str("  slices written after its last sync:\n");
            for (name, at) in &a.misses {
                // A dump without write times (`plan --objects`, a hand-made file) has nothing to say there.
                match at {
                    Some(at) => out.push_str(&format!("    {name} (written {at})\n")),
                    None => out.push_str(&format!("    {name}\n")),
                }
            }
        }
    }
    let current = audits.iter().filter(|a| a.current).count();
    let reporting = audits.iter().filter(|a| a.reporting).count();
    out.push_str(&format!("\n{current} of {} nodes current", audits.len()));
    if reporting > 0 {
        out.push_str(&format!(
            ", {reporting} reporting (behind only by slices written in the last {} s: agents report \
             progress at most once a minute)",
            REPORT_GRACE.as_secs()
        ));
    }
    out.push('\n');
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
        let audits = audit(&[plan(Some(digest), "2026-01-01T00:00:09Z")], &slices, None);
        assert!(audits[0].current, "{:?}", audits[0]);
        assert!(table(&audits).contains("1 of 1 nodes current"));
    }

    #[test]
    fn a_lagging_node_names_the_slices_written_after_its_last_sync() {
        let audits = audit(
            &[plan(Some("000000000000".into()), "2026-01-01T00:00:01Z")],
            &slices(),
            Some("2026-01-01T00:05:00Z".parse().unwrap()),
        );
        let a = &audits[0];
        assert!(
            !a.current && !a.reporting,
            "the missed slice was written minutes ago"
        );
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
    fn service_slices_count_and_a_node_behind_only_by_fresh_slices_is_reporting() {
        let mut slices = slices();
        let (name, spec) = switchyard_api::testing::service_slice(
            "all",
            0,
            2,
            "ns/a",
            vec![entry("ns/a", "10.96.0.1", 80).with(ep("10.244.1.6", 80))],
        );
        let mut own = slice_object(&name, spec);
        own.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("switchyard-controller".into()),
            time: Some(Time("2026-01-01T00:01:00Z".parse().unwrap())),
            ..Default::default()
        }]);
        let without = slices_digest(
            slices
                .iter()
                .map(|s| (s.metadata.name.as_deref().unwrap(), s.spec.revision.as_str())),
        );
        slices.push(own);
        let with = slices_digest(
            slices
                .iter()
                .map(|s| (s.metadata.name.as_deref().unwrap(), s.spec.revision.as_str())),
        );
        let current = audit(&[plan(Some(with), "2026-01-01T00:01:05Z")], &slices, None);
        assert!(current[0].current, "{:?}", current[0]);
        type Case = (&'static str, &'static str, bool);
        let cases: [Case; 3] = [
            (
                "30 s after the Service slice was written",
                "2026-01-01T00:01:30Z",
                true,
            ),
            ("75 s after", "2026-01-01T00:02:15Z", true),
            ("two minutes after", "2026-01-01T00:03:00Z", false),
        ];
        for (name, now, reporting) in cases {
            let audits = audit(
                &[plan(Some(without.clone()), "2026-01-01T00:00:30Z")],
                &slices,
                Some(now.parse().unwrap()),
            );
            let a = &audits[0];
            assert!(!a.current, "{name}");
            assert_eq!(a.reporting, reporting, "{name}: {a:?}");
            let missed: Vec<&str> = a.misses.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(missed, ["all.ns.a"], "{name}");
            let text = table(&audits);
            let state = if reporting { "reporting" } else { "lagging" };
            assert!(text.contains(state), "{name}: {text}");
        }
        assert_eq!(
            newest_write(&[plan(None, "2026-01-01T00:00:30Z")], &slices),
            Some("2026-01-01T00:01:00Z".parse().unwrap())
        );
    }

    #[test]
    fn a_slice_without_a_write_time_is_listed_without_one() {
        // What `plan --objects` prints carries no managedFields and no creationTimestamp.
        let mut slices = slices();
        for slice in &mut slices {
            slice.metadata.managed_fields = None;
            slice.metadata.creation_timestamp = None;
        }
        let mut p = plan(Some("000000000000".into()), "2026-01-01T00:00:01Z");
        p.status.as_mut().unwrap().last_sync_time = None;
        let text = table(&audit(&[p], &slices, None));
        assert!(text.contains("    all-0000\n"), "{text}");
        assert!(
            !text.contains("unknown time") && !text.contains("(written"),
            "{text}"
        );
    }

    #[test]
    fn an_unapplied_plan_or_an_incomplete_view_is_lag() {
        let mut p = plan(None, "2026-01-01T00:00:01Z");
        p.status.as_mut().unwrap().observed_revision = Some("old".into());
        let mut s = slices();
        s.remove(1);
        let a = &audit(&[p], &s, None)[0];
        assert!(
            a.lag.iter().any(|l| l.contains("applied plan revision old")),
            "{a:?}"
        );
        assert!(a.lag.iter().any(|l| l.contains("all-0001")), "{a:?}");
    }
}
