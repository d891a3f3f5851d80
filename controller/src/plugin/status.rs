//! `kubectl switchyard status`: every node's plan as `kubectl get nfp -o wide` shows it, with the audit's
//! verdict per node, then the nodes that need a look: lagging, leaving, and Nodes without a plan.
//!
//! ```text
//! NodeForwardingPlans ─┬► audit::audit (current / reporting / lagging, what each misses) ─┐
//! ForwardingSlices ────┘                                                                   ├► rows ─► table
//! Nodes ───────────────────────────────────────────────► names without a plan ────────────┘
//! ```
//!
//! Pure: the command lists the objects, passes the time and prints [`table`].

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use switchyard_api::{NodeForwardingPlan, conditions};

use crate::audit::NodeAudit;

/// One node's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The plan's (and the node's) name.
    pub node: String,
    /// The backend the plan asks for.
    pub backend: String,
    /// The backend the agent says it uses, when it differs from the plan's.
    pub in_use: Option<String>,
    /// Service entries, endpoints and rules programmed (`<none>` before the first sync).
    pub services: String,
    /// Endpoints programmed.
    pub endpoints: String,
    /// The plan's revision.
    pub desired: String,
    /// The revision the agent applied last.
    pub observed: String,
    /// The `Applied` condition's status.
    pub applied: String,
    /// Rules (or IPVS virtual plus real servers).
    pub rules: String,
    /// Since the agent's last sync, as kubectl prints ages.
    pub last_sync: String,
    /// Why the node is leaving (empty while it serves).
    pub leaving: String,
    /// While leaving: the `Drained` condition's status.
    pub drained: String,
    /// The audit's verdict: current, reporting or lagging.
    pub state: &'static str,
    /// What is behind, in words (lagging nodes only).
    pub lag: Vec<String>,
}

/// What `status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// One row per plan, by name.
    pub rows: Vec<Row>,
    /// Nodes the API server has that no plan names (the controller has not planned them, or is down).
    pub unplanned: Vec<String>,
}

/// The rows of `plans`, judged by `audits` (one per plan, as `audit::audit` returns them), and the
/// `nodes` without a plan, at `now`.
pub fn status(plans: &[NodeForwardingPlan], audits: &[NodeAudit], nodes: &[Node], now: Timestamp) -> Status {
    let mut rows: Vec<Row> = plans
        .iter()
        .map(|plan| {
            let name = plan
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| plan.spec.node_name.clone());
            let audit = audits.iter().find(|a| a.node == name);
            row(plan, name, audit, now)
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    let planned: BTreeSet<&str> = rows.iter().map(|r| r.node.as_str()).collect();
    let unplanned = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .filter(|n| !planned.contains(n))
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Status { rows, unplanned }
}

fn row(plan: &NodeForwardingPlan, node: String, audit: Option<&NodeAudit>, now: Timestamp) -> Row {
    let status = plan.status.clone().unwrap_or_default();
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map_or_else(String::new, |c| c.status.clone())
    };
    let number = |n: Option<u64>| n.map_or_else(|| NONE.to_owned(), |n| n.to_string());
    let backend = plan.spec.backend.to_string();
    let in_use = status.backend.map(|b| b.to_string()).filter(|b| *b != backend);
    let (state, lag) = match audit {
        Some(a) if a.current => ("current", Vec::new()),
        Some(a) if a.reporting => ("reporting", Vec::new()),
        Some(a) => ("lagging", a.lag.clone()),
        None => ("lagging", vec!["not audited".to_owned()]),
    };
    let leaving = plan
        .spec
        .leaving
        .as_ref()
        .map(|l| l.reason.clone())
        .unwrap_or_default();
    Row {
        node,
        backend,
        in_use,
        services: number(status.services.map(u64::from)),
        endpoints: number(status.endpoints.map(u64::from)),
        desired: plan.spec.revision.clone(),
        observed: status
            .observed_revision
            .clone()
            .unwrap_or_else(|| NONE.to_owned()),
        applied: condition(conditions::APPLIED),
        rules: number(status.rules),
        last_sync: status
            .last_sync_time
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map_or_else(|| NONE.to_owned(), |t| age(t, now)),
        drained: if leaving.is_empty() {
            String::new()
        } else {
            condition(conditions::DRAINED)
        },
        leaving,
        state,
        lag,
    }
}

const NONE: &str = "<none>";

/// `then` as kubectl prints an age at `now`: `45s`, `3m12s`, `17m`, `5h3m`, `20h`, `3d4h`, `12d`.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{m}m{}s", s % 60),
        s if s < 3 * 3600 => format!("{m}m"),
        s if s < 8 * 3600 => format!("{h}h{}m", m % 60),
        s if s < 48 * 3600 => format!("{h}h"),
        s if s < 8 * 86_400 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

/// The table: one line per node (`wide`: also the revisions, the backend in use and the drain), then
/// what each lagging node misses, the leaving nodes, the Nodes without a plan, and a count.
pub fn table(status: &Status, wide: bool) -> String {
    let mut head = vec![
        "NODE",
        "STATE",
        "BACKEND",
        "SERVICES",
        "ENDPOINTS",
        "APPLIED",
        "RULES",
        "LAST SYNC",
        "LEAVING",
    ];
    if wide {
        head.extend(["IN USE", "DESIRED", "OBSERVED", "DRAINED"]);
    }
    let lines: Vec<Vec<String>> = status
        .rows
        .iter()
        .map(|r| {
            let mut line = vec![
                r.node.clone(),
                r.state.to_owned(),
                r.backend.clone(),
                r.services.clone(),
                r.endpoints.clone(),
                r.applied.clone(),
                r.rules.clone(),
                r.last_sync.clone(),
                r.leaving.clone(),
            ];
            if wide {
                line.extend([
                    r.in_use.clone().unwrap_or_else(|| r.backend.clone()),
                    r.desired.clone(),
                    r.observed.clone(),
                    r.drained.clone(),
                ]);
            }
            line
        })
        .collect();
    let mut out = columns(&head, &lines);
    let lagging: Vec<&Row> = status.rows.iter().filter(|r| r.state == "lagging").collect();
    for r in &lagging {
        out.push_str(&format!("\n{} lags:\n", r.node));
        for line in &r.lag {
            out.push_str(&format!("  {line}\n"));
        }
    }
    let leaving: Vec<&Row> = status.rows.iter().filter(|r| !r.leaving.is_empty()).collect();
    if !leaving.is_empty() {
        out.push_str("\nleaving (their agents fail kube-proxy's /healthz, so load balancers drain them):\n");
        for r in &leaving {
            let drained = if r.drained == conditions::status::TRUE {
                "drained"
            } else {
                "draining"
            };
            out.push_str(&format!("  {} ({}, {drained})\n", r.node, r.leaving));
        }
    }
    if !status.unplanned.is_empty() {
        out.push_str(&format!(
            "\nnodes without a plan (is the controller running?): {}\n",
            status.unplanned.join(", ")
        ));
    }
    let current = status.rows.iter().filter(|r| r.state == "current").count();
    let reporting = status.rows.iter().filter(|r| r.state == "reporting").count();
    // As the audit says it: reporting nodes are behind only by slices written in the last
    // audit::REPORT_GRACE, which their agents report at most once a minute.
    let reporting = if reporting > 0 {
        format!(", {reporting} reporting")
    } else {
        String::new()
    };
    out.push_str(&format!(
        "\n{current} of {} nodes current{reporting}, {} lagging, {} leaving\n",
        status.rows.len(),
        lagging.len(),
        leaving.len()
    ));
    out
}

/// The header and the lines as `kubectl get` aligns them ([`crate::output`]'s aligner).
fn columns(head: &[&str], lines: &[Vec<String>]) -> String {
    let mut rows = vec![head.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
    rows.extend(lines.iter().cloned());
    crate::output::align(rows)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use switchyard_api::{Backend, Leaving, NodeForwardingPlanStatus, PlanCondition};

    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn plan(name: &str, observed: Option<&str>, applied: &str) -> NodeForwardingPlan {
        let mut spec = switchyard_api::testing::plan(name, Vec::new());
        spec.revision = "r2".to_owned();
        spec.backend = Backend::Nftables;
        NodeForwardingPlan {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: observed.map(|o| NodeForwardingPlanStatus {
                observed_revision: Some(o.to_owned()),
                backend: Some(Backend::Iptables),
                services: Some(12),
                endpoints: Some(30),
                rules: Some(210),
                last_sync_time: Some("2026-12-07T10:00:00Z".to_owned()),
                conditions: vec![PlanCondition {
                    type_: conditions::APPLIED.to_owned(),
                    status: applied.to_owned(),
                    reason: "Synced".to_owned(),
                    message: String::new(),
                    last_transition_time: None,
                }],
                ..NodeForwardingPlanStatus::default()
            }),
        }
    }

    fn audited(node: &str, current: bool, lag: &[&str]) -> NodeAudit {
        NodeAudit {
            node: node.to_owned(),
            current,
            reporting: false,
            lag: lag.iter().map(|l| (*l).to_owned()).collect(),
            misses: Vec::new(),
            last_sync: None,
        }
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let now = at("2026-12-07T12:00:00Z");
        // (then, expected)
        let cases = [
            ("2026-12-07T11:59:15Z", "45s"),
            ("2026-12-07T11:56:48Z", "3m12s"),
            ("2026-12-07T11:43:00Z", "17m"),
            ("2026-12-07T06:57:00Z", "5h3m"),
            ("2026-12-06T16:00:00Z", "20h"),
            ("2026-12-04T08:00:00Z", "3d4h"),
            ("2026-11-25T12:00:00Z", "12d"),
            ("2026-12-07T12:00:09Z", "0s"),
        ];
        for (then, want) in cases {
            assert_eq!(age(at(then), now), want, "{then}");
        }
    }

    #[test]
    fn lagging_leaving_and_unplanned_nodes_are_named_under_the_table() {
        let mut leaving = plan("node-c", Some("r2"), "True");
        leaving.spec.leaving = Some(Leaving {
            reason: "taint:ToBeDeletedByClusterAutoscaler".to_owned(),
            since: None,
            drain_grace_seconds: 600,
        });
        let plans = [
            plan("node-b", Some("r1"), "True"),
            plan("node-a", Some("r2"), "True"),
            leaving,
        ];
        let audits = [
            audited("node-a", true, &[]),
            audited("node-b", false, &["applied plan revision r1, the plan is at r2"]),
            audited("node-c", true, &[]),
        ];
        let nodes = [node("node-a"), node("node-b"), node("node-c"), node("node-d")];
        let status = status(&plans, &audits, &nodes, at("2026-12-07T10:05:00Z"));
        assert_eq!(status.unplanned, ["node-d"]);
        let rows: Vec<(&str, &str)> = status.rows.iter().map(|r| (r.node.as_str(), r.state)).collect();
        assert_eq!(
            rows,
            [
                ("node-a", "current"),
                ("node-b", "lagging"),
                ("node-c", "current")
            ]
        );
        let text = table(&status, true);
        insta::assert_snapshot!(text);
    }

    #[test]
    fn a_plan_never_synced_shows_none_and_is_lagging_without_an_audit() {
        let status = status(&[plan("node-a", None, "")], &[], &[], at("2026-12-07T10:05:00Z"));
        let row = &status.rows[0];
        assert_eq!(
            (
                row.services.as_str(),
                row.observed.as_str(),
                row.last_sync.as_str(),
                row.state
            ),
            ("<none>", "<none>", "<none>", "lagging")
        );
        assert!(table(&status, false).contains("0 of 1 nodes current, 1 lagging, 0 leaving"));
    }
}
