//! The syncer's decisions against the fake kernel: full at start, partial with exactly the changed
//! chains, failures that keep the old rules, rejected plans, skipped entries, views and slices, drift repairs,
//! restarts, conntrack cleanup, status conditions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use switchyard_agent::conntrack::{Flow, Tuple};
use switchyard_agent::iptables::names;
use switchyard_agent::sync::SyncResult;
use switchyard_agent::xtables::Table;
use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, status};
use switchyard_api::status::MAX_LISTED_FAILURES;
use switchyard_api::testing::{EntryExt, entry, ep, finish, live_plan, slice};
use switchyard_api::{IpFamily, NodeForwardingPlanStatus, Protocol, SyncMode};

use crate::fixtures::{Harness, base, declared, edit, fresh_state, ip};

fn condition<'a>(status: &'a NodeForwardingPlanStatus, type_: &str) -> (&'a str, &'a str) {
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"));
    (c.status.as_str(), c.reason.as_str())
}

fn transition(status: &NodeForwardingPlanStatus, type_: &str) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap()
}

fn mode(result: &SyncResult) -> SyncMode {
    match result {
        SyncResult::Applied { mode, .. } => *mode,
        other => panic!("not applied: {other:?}"),
    }
}

fn last_payload(h: &Harness) -> String {
    h.iptables.restores().last().unwrap().1.clone()
}

#[test]
fn a_failing_plan_cache_shows_as_degraded_until_a_write_works_again() {
    let mut h = Harness::new();
    h.sync(&base());
    h.syncer
        .set_cache_problem(Some("No space left on device (os error 28)".into()));
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::SYNCED));
    assert_eq!(
        condition(&s, DEGRADED),
        (status::TRUE, reasons::CACHE_WRITE_FAILED)
    );
    let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert!(
        degraded.message.contains("No space left on device"),
        "{}",
        degraded.message
    );
    h.syncer.set_cache_problem(None);
    assert_eq!(
        condition(&h.syncer.status(), DEGRADED),
        (status::FALSE, reasons::HEALTHY)
    );
}

#[test]
fn conntrack_sysctls_are_raised_after_full_syncs_and_one_that_cannot_be_set_shows_as_degraded() {
    use switchyard_agent::conntrack::settings::{TCP_TIMEOUT_CLOSE_WAIT, TCP_TIMEOUT_ESTABLISHED};
    let mut h = Harness::new();
    // /proc/sys read-only, as in an unprivileged container.
    h.sysctls.set_read_only(true);
    assert!(matches!(h.sync(&base()), SyncResult::Applied { .. }));
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::SYNCED));
    assert_eq!(
        condition(&s, DEGRADED),
        (status::TRUE, reasons::CONNTRACK_SYSCTL_FAILED)
    );
    let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
    assert!(
        degraded
            .message
            .contains("nf_conntrack_tcp_timeout_close_wait: cannot set 3600 (found 60)"),
        "{}",
        degraded.message
    );
    assert_eq!(h.syncer.metrics().conntrack_sysctl_failures.get(), 1);

    // A partial sync does not touch them; the next full sync (the full-sync period) sets them.
    h.sysctls.set_read_only(false);
    let changed = edit(&base(), "ns1/api:https", |e| e.port = 444);
    assert_eq!(mode(&h.sync(&changed)), SyncMode::Partial);
    assert_eq!(h.sysctls.values()[TCP_TIMEOUT_CLOSE_WAIT], "60");
    h.clock.advance(Duration::from_secs(3600));
    assert_eq!(mode(&h.syncer.resync_if_due().unwrap()), SyncMode::Full);
    assert_eq!(
        condition(&h.syncer.status(), DEGRADED),
        (status::FALSE, reasons::HEALTHY)
    );
    let values = h.sysctls.values();
    assert_eq!(values[TCP_TIMEOUT_CLOSE_WAIT], "3600");
    assert_eq!(
        values[TCP_TIMEOUT_ESTABLISHED], "432000",
        "the host's higher value stays"
    );

    // Someone lowers one: the next full sync puts it back.
    h.sysctls.put(TCP_TIMEOUT_CLOSE_WAIT, "60");
    h.clock.advance(Duration::from_secs(3600));
    h.syncer.resync_if_due().unwrap();
    assert_eq!(h.sysctls.values()[TCP_TIMEOUT_CLOSE_WAIT], "3600");
    assert_eq!(h.syncer.metrics().conntrack_sysctl_failures.get(), 1);
}

#[test]
fn the_first_sync_is_full_and_programs_chains_jump_rules_and_status() {
    let mut h = Harness::new();
    let spec = base();
    assert_eq!(mode(&h.sync(&spec)), SyncMode::Full);
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(dump.contains(&format!(":{}", names::CANARY)));
    assert!(
        dump.contains("-A PREROUTING -m comment --comment \"switchyard service portals\" -j SWYD-SERVICES"),
        "{dump}"
    );
    assert!(dump.contains("--to-destination 10.244.2.53:53"));
    assert_eq!(
        h.iptables.dump(IpFamily::IPv6).matches("SWYD-").count(),
        0,
        "no IPv6 in the plan"
    );

    let s = h.syncer.status();
    assert_eq!(s.observed_revision.as_deref(), Some(spec.revision.as_str()));
    assert_eq!(s.backend, Some(switchyard_api::Backend::Iptables));
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::SYNCED));
    assert_eq!(condition(&s, DEGRADED), (status::FALSE, reasons::HEALTHY));
    assert_eq!((s.services, s.endpoints), (Some(3), Some(5)));
    assert!(s.rules.unwrap() > 20);
    assert_eq!(s.last_sync_mode, Some(SyncMode::Full));
    assert_eq!(s.last_sync_time.as_deref(), Some("2026-01-01T00:00:00Z"));
    assert_eq!(s.drift_repairs, 0);
    assert!(s.failures.is_empty() && s.failures_total.is_none());
    assert!(h.syncer.healthy());
}

#[test]
fn an_endpoint_change_is_a_partial_sync_of_exactly_that_service() {
    let mut h = Harness::new();
    // On this node: its endpoint keeps a SEP chain (hairpin), which the change replaces.
    let before = edit(&base(), "ns1/web:http", |e| e.endpoints[1].on_node = true);
    h.sync(&before);
    let saves = h.iptables.saves();
    let after = edit(&before, "ns1/web:http", |e| {
        e.endpoints[1].ip = "10.244.3.99".into()
    });
    let result = h.sync(&after);
    assert_eq!(mode(&result), SyncMode::Partial);

    let payload = last_payload(&h);
    let web = |ep: &str| names::endpoint_chain("ns1/web:http", "tcp", ep);
    let want: BTreeSet<String> = [
        names::cluster_policy_chain("ns1/web:http", "tcp"),
        names::external_chain("ns1/web:http", "tcp"),
        web("10.244.3.99:8080"),
        web("10.244.3.5:8080"),
    ]
    .into_iter()
    .collect();
    let got: BTreeSet<String> = declared(&payload).into_iter().collect();
    assert_eq!(
        got, want,
        "only web's chains (and its stale SEP; 10.244.2.5 is DNATed inline):\n{payload}"
    );
    assert!(payload.contains(&format!("-X {}\n", web("10.244.3.5:8080"))));
    assert!(
        !payload.contains("*filter"),
        "nothing changed in filter:\n{payload}"
    );
    assert_eq!(h.iptables.saves(), saves, "a partial sync needs no iptables-save");
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&after));
    assert_eq!(h.syncer.status().last_sync_mode, Some(SyncMode::Partial));
}

#[test]
fn removed_services_lose_their_chains_in_a_partial_sync() {
    let mut h = Harness::new();
    let before = base();
    h.sync(&before);
    let mut after = before.clone();
    after.services.retain(|e| e.name != "ns1/api:https");
    finish(&mut after);
    assert_eq!(mode(&h.sync(&after)), SyncMode::Partial);
    let gone = names::cluster_policy_chain("ns1/api:https", "tcp");
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(!dump.contains(&gone), "{dump}");
    assert_eq!(dump, fresh_state(&after));
    let payload = last_payload(&h);
    assert!(payload.contains(&format!("-X {gone}\n")));
    assert!(
        payload.contains(":SWYD-SERVICES - [0:0]"),
        "its frontend rule left SWYD-SERVICES"
    );
}

#[test]
fn a_restore_failure_keeps_the_old_rules_reports_and_retries_full_with_backoff() {
    let mut h = Harness::new();
    let a = base();
    h.sync(&a);
    let kept = h.iptables.dump(IpFamily::IPv4);
    let b = edit(&a, "ns1/api:https", |e| e.endpoints[0].port = 9443);

    h.iptables
        .fail_next_restore(None, "RULE_APPEND failed (Invalid argument)");
    let SyncResult::Failed { message } = h.sync(&b) else {
        panic!()
    };
    assert!(message.contains("RULE_APPEND failed"), "{message}");
    assert_eq!(h.iptables.dump(IpFamily::IPv4), kept, "the old rules stay");
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::FALSE, reasons::APPLY_FAILED));
    assert_eq!(condition(&s, DEGRADED), (status::TRUE, reasons::APPLY_FAILED));
    assert_eq!(s.observed_revision.as_deref(), Some(a.revision.as_str()));
    assert!(s.conditions[0].message.contains("RULE_APPEND failed"));
    assert!(
        s.conditions[0].message.contains("the refused line: *nat"),
        "the status names the refused payload line: {}",
        s.conditions[0].message
    );
    assert_eq!(h.syncer.metrics().sync_failures.get(), 1);
    assert_eq!(
        h.syncer
            .metrics()
            .restore_failures
            .get_or_create(&switchyard_agent::sync::KindLabel {
                kind: "iptables_restore".into()
            })
            .get(),
        1
    );

    // Retried after 1 s, then 2 s, then 4 s while it keeps failing.
    for delay in [1, 2, 4] {
        assert!(!h.syncer.retry_due());
        h.clock.advance(Duration::from_millis(delay * 1000 - 1));
        assert!(!h.syncer.retry_due(), "not before {delay}s");
        h.clock.advance(Duration::from_millis(1));
        assert!(h.syncer.retry_due(), "due after {delay}s");
        if delay < 4 {
            h.iptables.fail_next_restore(None, "still failing");
            assert!(matches!(h.sync(&b), SyncResult::Failed { .. }));
        }
    }
    assert!(h.syncer.healthy(), "7 s of failures is within the health timeout");
    assert_eq!(mode(&h.sync(&b)), SyncMode::Full, "the retry is a full sync");
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&b));
    assert!(!h.syncer.retry_due());
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::TRUE, reasons::SYNCED)
    );
}

#[test]
fn a_long_failure_makes_the_proxy_unhealthy() {
    let mut h = Harness::new();
    h.sync(&base());
    h.iptables.fail_next_restore(None, "nope");
    h.sync(&edit(&base(), "ns1/api:https", |e| e.port = 444));
    assert!(h.syncer.healthy());
    h.clock.advance(Duration::from_secs(61));
    assert!(!h.syncer.healthy());
}

#[test]
fn an_invalid_plan_is_rejected_whole_and_the_last_good_rules_stay() {
    let mut h = Harness::new();
    let a = base();
    h.sync(&a);
    let kept = h.iptables.dump(IpFamily::IPv4);
    let mut b = edit(&a, "ns1/api:https", |e| e.port = 444);
    b.node_ips = vec!["not-an-ip".into()];
    finish(&mut b);
    let SyncResult::Rejected { reason, message } = h.sync(&b) else {
        panic!()
    };
    assert_eq!(reason, reasons::INVALID_PLAN);
    assert!(message.contains("spec.nodeIPs[0]"), "{message}");
    assert_eq!(h.iptables.dump(IpFamily::IPv4), kept);
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::FALSE, reasons::INVALID_PLAN));
    assert_eq!(condition(&s, DEGRADED), (status::TRUE, reasons::INVALID_PLAN));
    assert_eq!(s.observed_revision.as_deref(), Some(a.revision.as_str()));
    assert!(
        !h.syncer.retry_due(),
        "a rejected plan is not retried; a new one is awaited"
    );

    // The periodic full sync re-applies the last good plan and keeps the rejection visible.
    h.clock.advance(Duration::from_secs(3600));
    assert!(matches!(
        h.syncer.resync_if_due(),
        Some(SyncResult::Applied {
            mode: SyncMode::Full,
            ..
        })
    ));
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::FALSE, reasons::INVALID_PLAN)
    );
}

#[test]
fn a_bad_entry_is_skipped_and_reported_while_the_rest_applies() {
    let mut h = Harness::new();
    let spec = edit(&base(), "ns1/api:https", |e| e.cluster_ip = "10.96.0.999".into());
    assert_eq!(mode(&h.sync(&spec)), SyncMode::Full);
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(!dump.contains(&names::cluster_policy_chain("ns1/api:https", "tcp")));
    assert!(dump.contains(&names::cluster_policy_chain("ns1/web:http", "tcp")));
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::PARTIALLY_APPLIED));
    assert_eq!(
        condition(&s, DEGRADED),
        (status::TRUE, reasons::PARTIALLY_APPLIED)
    );
    assert_eq!(s.failures.len(), 1);
    assert_eq!(s.failures[0].service, "ns1/api:https TCP IPv4");
    assert!(
        s.failures[0].reason.contains("clusterIP"),
        "{}",
        s.failures[0].reason
    );
    assert_eq!(s.failures_total, Some(1));
    assert_eq!(s.services, Some(2));
}

#[test]
fn an_entry_the_kernel_refuses_is_left_out_and_reported_while_the_rest_applies() {
    let mut h = Harness::new();
    let spec = base();
    // Every rule of ns1/api carries its name in a comment; the kernel refuses the first one.
    h.iptables.refuse_lines_containing(Some("ns1/api:https"));
    let SyncResult::Applied { mode: first, .. } = h.sync(&spec) else {
        panic!("the other entries are applied")
    };
    assert_eq!(first, SyncMode::Full);
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(!dump.contains(&names::cluster_policy_chain("ns1/api:https", "tcp")));
    assert!(dump.contains(&names::cluster_policy_chain("ns1/web:http", "tcp")));
    assert!(dump.contains("--to-destination 10.244.2.53:53"));
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::PARTIALLY_APPLIED));
    assert_eq!(s.failures.len(), 1);
    assert_eq!(s.failures[0].service, "ns1/api:https TCP IPv4");
    assert!(
        s.failures[0].reason.contains("refused by the kernel")
            && s.failures[0].reason.contains("the refused line: -A SWYD-"),
        "{}",
        s.failures[0].reason
    );

    assert_eq!(
        s.services,
        Some(2),
        "the refused entry is not counted as programmed"
    );

    // An edit elsewhere stays a partial sync: the unchanged refused entry is not offered again.
    let restores = h.iptables.restores().len();
    let next = edit(&spec, "ns1/web:http", |e| e.endpoints[0].port = 9090);
    assert_eq!(mode(&h.sync(&next)), SyncMode::Partial);
    assert_eq!(
        h.iptables.restores().len(),
        restores + 1,
        "one restore, none refused"
    );
    assert!(
        h.iptables
            .dump(IpFamily::IPv4)
            .contains("--to-destination 10.244.2.5:9090")
    );
    assert_eq!(h.syncer.status().failures.len(), 1);

    // Once the kernel takes it, the failure clears and the entry is programmed.
    h.iptables.refuse_lines_containing(None);
    let again = edit(&next, "ns1/api:https", |e| e.endpoints[0].port = 9443);
    assert!(matches!(h.sync(&again), SyncResult::Applied { .. }));
    assert!(h.syncer.status().failures.is_empty());
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&again));
}

#[test]
fn a_host_wide_refusal_is_not_mistaken_for_one_entry() {
    let mut h = Harness::new();
    // A rule no entry owns (the masquerade rule) cannot be isolated: the sync fails, nothing changes.
    h.iptables.refuse_lines_containing(Some("MASQUERADE"));
    assert!(matches!(h.sync(&base()), SyncResult::Failed { .. }));
    assert!(
        !h.iptables
            .dump(IpFamily::IPv4)
            .contains(&names::cluster_policy_chain("ns1/web:http", "tcp"))
    );
}

#[test]
fn failures_are_capped_but_counted() {
    let mut h = Harness::new();
    let mut spec = base();
    for i in 0..15 {
        let mut bad =
            entry(&format!("bad/s{i:02}:p"), &format!("10.96.1.{i}"), 80).with(ep("10.244.2.1", 80));
        bad.endpoints[0].port = 0;
        spec.services.push(bad.into());
    }
    finish(&mut spec);
    h.sync(&spec);
    let s = h.syncer.status();
    assert_eq!(s.failures.len(), MAX_LISTED_FAILURES);
    assert_eq!(s.failures_total, Some(15));
}

#[test]
fn an_incomplete_view_is_not_applied_and_an_invalid_slice_keeps_its_last_good_copy() {
    let mut h = Harness::new();
    let live = Arc::new(live_plan("node-a", &["all"], vec![]));
    let part = |index: u32, ip: &str| {
        let (name, spec) = slice(
            "all",
            index,
            2,
            vec![entry(&format!("ns2/s{index}:p"), &format!("10.96.0.2{index}"), 80).with(ep(ip, 80))],
        );
        (name, Arc::new(spec))
    };
    let SyncResult::Rejected { reason, message } = h.syncer.sync(&live, &[part(0, "10.244.2.20")]) else {
        panic!()
    };
    assert_eq!(reason, reasons::INCOMPLETE_VIEW);
    assert!(
        message.contains("slice all-0001 of view all is missing"),
        "{message}"
    );
    assert!(
        !h.iptables.dump(IpFamily::IPv4).contains("SWYD-"),
        "nothing applied"
    );
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::FALSE, reasons::INCOMPLETE_VIEW)
    );

    let complete = [part(0, "10.244.2.20"), part(1, "10.244.2.21")];
    let result = h.syncer.sync(&live, &complete);
    assert_eq!(mode(&result), SyncMode::Full);
    let s = h.syncer.status();
    assert_eq!(s.observed_revision.as_deref(), Some(live.revision.as_str()));
    assert_eq!(s.observed_slices.as_ref().map(|o| o.count), Some(2));
    assert_eq!(s.services, Some(2));
    assert!(
        h.iptables
            .dump(IpFamily::IPv4)
            .contains("--to-destination 10.244.2.21:80")
    );

    // A newer all-0001 that fails validation: its last good copy stays in use, and the status says so.
    let mut broken = (*part(1, "10.244.2.99").1).clone();
    broken.index = 7;
    broken.revision = "broken000000".into();
    let result = h.syncer.sync(
        &live,
        &[part(0, "10.244.2.20"), ("all-0001".into(), Arc::new(broken))],
    );
    assert!(matches!(result, SyncResult::Applied { .. }), "{result:?}");
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(
        dump.contains("10.244.2.21:80") && !dump.contains("10.244.2.99"),
        "{dump}"
    );
    let s = h.syncer.status();
    assert_eq!(condition(&s, DEGRADED), (status::TRUE, reasons::INVALID_SLICE));
    assert!(
        s.failures
            .iter()
            .any(|f| f.service == "ForwardingSlice all-0001" && f.reason.contains("last good revision")),
        "{:?}",
        s.failures
    );
}

#[test]
fn an_entry_in_two_slices_of_a_view_is_a_reported_conflict_the_first_slice_wins() {
    let mut h = Harness::new();
    let live = Arc::new(live_plan("node-a", &["all"], vec![]));
    let part = |index: u32, ip: &str| {
        let (name, spec) = slice(
            "all",
            index,
            2,
            vec![entry("ns2/dup:p", "10.96.0.30", 80).with(ep(ip, 80))],
        );
        (name, Arc::new(spec))
    };
    let result = h
        .syncer
        .sync(&live, &[part(1, "10.244.2.31"), part(0, "10.244.2.30")]);
    assert!(matches!(result, SyncResult::Applied { .. }), "{result:?}");
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(
        dump.contains("10.244.2.30:80") && !dump.contains("10.244.2.31"),
        "{dump}"
    );
    let s = h.syncer.status();
    assert!(
        s.failures
            .iter()
            .any(|f| f.reason.contains("all-0000 and all-0001")),
        "{:?}",
        s.failures
    );
    assert_eq!(condition(&s, DEGRADED), (status::TRUE, reasons::INVALID_SLICE));
}

#[test]
fn a_flushed_chain_is_detected_and_repaired_as_drift() {
    let mut h = Harness::new();
    let spec = base();
    h.sync(&spec);
    assert_eq!(h.syncer.check_drift(), None, "no drift right after a sync");
    let restores = h.iptables.restores().len();
    assert_eq!(
        h.iptables.restores().len(),
        restores,
        "a clean check restores nothing"
    );

    assert!(
        h.iptables
            .flush_chain(IpFamily::IPv4, Table::Nat, names::SERVICES)
    );
    let Some(SyncResult::Applied { mode, drift, .. }) = h.syncer.check_drift() else {
        panic!()
    };
    assert_eq!(mode, SyncMode::Full);
    assert!(drift.unwrap().contains("SWYD-SERVICES has 0 rules"));
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&spec));
    assert_eq!(h.syncer.status().drift_repairs, 1);
    assert_eq!(h.syncer.check_drift(), None);
}

#[test]
fn a_failed_drift_repair_is_retried_with_backoff_until_it_succeeds() {
    let mut h = Harness::new();
    let spec = base();
    h.sync(&spec);
    assert!(
        h.iptables
            .flush_chain(IpFamily::IPv4, Table::Nat, names::SERVICES)
    );
    h.iptables
        .fail_next_restore(None, "RULE_APPEND failed (Invalid argument)");
    assert!(matches!(h.syncer.check_drift(), Some(SyncResult::Failed { .. })));
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::FALSE, reasons::APPLY_FAILED)
    );
    assert_eq!(h.syncer.check_drift(), None, "the retry owns the repair now");
    assert_eq!(h.syncer.resync_if_due(), None);
    assert_eq!(h.syncer.retry_reapply_if_due(), None, "not before the backoff");

    h.clock.advance(Duration::from_secs(1));
    h.iptables.fail_next_restore(None, "still failing");
    assert!(matches!(
        h.syncer.retry_reapply_if_due(),
        Some(SyncResult::Failed { .. })
    ));
    assert_eq!(h.syncer.retry_reapply_if_due(), None, "the backoff doubled");
    h.clock.advance(Duration::from_secs(2));
    let Some(SyncResult::Applied { mode, drift, .. }) = h.syncer.retry_reapply_if_due() else {
        panic!("the retry succeeds")
    };
    assert_eq!(mode, SyncMode::Full);
    assert!(drift.unwrap().contains("SWYD-SERVICES has 0 rules"));
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&spec));
    assert_eq!(h.syncer.status().drift_repairs, 1);
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::TRUE, reasons::SYNCED)
    );
    assert_eq!(h.syncer.retry_reapply_if_due(), None, "nothing left to retry");
}

#[test]
fn a_rejected_plan_does_not_cancel_a_pending_repair_retry() {
    let mut h = Harness::new();
    let spec = base();
    h.sync(&spec);
    assert!(
        h.iptables
            .flush_chain(IpFamily::IPv4, Table::Nat, names::SERVICES)
    );
    h.iptables.fail_next_restore(None, "nope");
    assert!(matches!(h.syncer.check_drift(), Some(SyncResult::Failed { .. })));
    // A plan whose views' slices have not arrived yet is rejected.
    let live = live_plan("node-a", &["all"], vec![]);
    assert!(matches!(
        h.syncer.sync_plan(&Arc::new(live)),
        SyncResult::Rejected { .. }
    ));
    h.clock.advance(Duration::from_secs(1));
    assert!(
        matches!(h.syncer.retry_reapply_if_due(), Some(SyncResult::Applied { .. })),
        "the repair is still retried"
    );
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&spec));
    assert_eq!(
        condition(&h.syncer.status(), APPLIED),
        (status::FALSE, reasons::INCOMPLETE_VIEW),
        "and the rejection stays visible"
    );
}

#[test]
fn a_new_plan_supersedes_a_pending_repair_retry() {
    let mut h = Harness::new();
    let a = base();
    h.sync(&a);
    h.iptables.fail_next_restore(None, "nope");
    h.clock.advance(Duration::from_secs(3601));
    assert!(matches!(
        h.syncer.resync_if_due(),
        Some(SyncResult::Failed { .. })
    ));
    let b = edit(&a, "ns1/api:https", |e| e.endpoints[0].port = 9443);
    assert_eq!(mode(&h.sync(&b)), SyncMode::Full);
    h.clock.advance(Duration::from_secs(60));
    assert_eq!(h.syncer.retry_reapply_if_due(), None);
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&b));
}

#[test]
fn a_deleted_jump_rule_is_detected_and_repaired_as_drift() {
    let mut h = Harness::new();
    let spec = base();
    h.sync(&spec);
    assert!(
        h.iptables
            .remove_jump(IpFamily::IPv4, Table::Nat, "PREROUTING", names::SERVICES)
    );
    let Some(SyncResult::Applied { drift, .. }) = h.syncer.check_drift() else {
        panic!()
    };
    assert!(
        drift
            .unwrap()
            .contains("jump PREROUTING -> SWYD-SERVICES is missing")
    );
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&spec));
    assert_eq!(h.syncer.status().drift_repairs, 1);
}

#[test]
fn a_missing_canary_turns_a_partial_sync_into_a_full_repair() {
    let mut h = Harness::new();
    let spec = base();
    h.sync(&spec);
    // A firewall reload wiped every chain of ours (and the jumps into them).
    for chain in h.iptables.kernel(IpFamily::IPv4).unwrap().chain_names(Table::Nat) {
        if chain.starts_with(names::PREFIX) {
            h.iptables.remove_chain(IpFamily::IPv4, Table::Nat, &chain);
        }
    }
    let next = edit(&spec, "ns1/api:https", |e| {
        e.endpoints[0].ip = "10.244.2.7".into()
    });
    let Some(SyncResult::Applied { mode, drift, .. }) = Some(h.sync(&next)) else {
        panic!()
    };
    assert_eq!(mode, SyncMode::Full);
    assert!(drift.unwrap().contains("SWYD-CANARY missing"));
    assert_eq!(h.iptables.dump(IpFamily::IPv4), fresh_state(&next));
    assert_eq!(h.syncer.status().drift_repairs, 1);
}

#[test]
fn a_restart_reuses_the_rules_without_flushing_and_leaves_others_alone() {
    let first = {
        let mut h = Harness::new();
        h.iptables
            .restore_text(
                IpFamily::IPv4,
                "*nat\n:DOCKER - [0:0]\n-A DOCKER -j RETURN\nCOMMIT\n",
            )
            .unwrap();
        h.iptables
            .insert_rule(IpFamily::IPv4, Table::Nat, "PREROUTING", &["-j", "DOCKER"])
            .unwrap();
        h.sync(&base());
        h.iptables
    };
    let before = first.dump(IpFamily::IPv4);
    let restores = first.restores().len();

    // A new agent process on the same kernel, same plan.
    let mut h = Harness::on(first.clone());
    assert_eq!(mode(&h.sync(&base())), SyncMode::Full);
    assert_eq!(
        first.dump(IpFamily::IPv4),
        before,
        "same rules, nothing duplicated or lost"
    );
    let payload = last_payload(&h);
    assert_eq!(first.restores().len(), restores + 1, "one atomic restore");
    assert!(
        !payload
            .lines()
            .any(|l| l.starts_with("-F") || l.starts_with("-X")),
        "nothing flushed or deleted outside the transaction:\n{payload}"
    );
    assert!(before.contains("-A DOCKER -j RETURN") && before.contains("-A PREROUTING -j DOCKER"));
    assert_eq!(
        before.matches("-j SWYD-SERVICES").count(),
        4,
        "nat PREROUTING and OUTPUT, filter FORWARD and OUTPUT, once each:\n{before}"
    );

    // A restart with a changed plan removes chains the previous process left (read with iptables-save).
    let mut h = Harness::on(first.clone());
    let mut smaller = base();
    smaller.services.retain(|e| e.name != "ns1/api:https");
    finish(&mut smaller);
    h.sync(&smaller);
    assert_eq!(
        first
            .dump(IpFamily::IPv4)
            .replace("-A DOCKER -j RETURN\n", "")
            .replace("-A PREROUTING -j DOCKER\n", "")
            .replace(":DOCKER\n", ""),
        fresh_state(&smaller)
    );
}

#[test]
fn the_periodic_full_sync_rewrites_everything() {
    let mut h = Harness::new();
    h.sync(&base());
    assert_eq!(h.syncer.resync_if_due(), None);
    h.clock.advance(Duration::from_secs(3599));
    assert_eq!(h.syncer.resync_if_due(), None);
    h.clock.advance(Duration::from_secs(1));
    assert_eq!(mode(&h.syncer.resync_if_due().unwrap()), SyncMode::Full);
    assert_eq!(h.syncer.resync_if_due(), None);
}

#[test]
fn dual_stack_plans_program_both_families() {
    let mut h = Harness::new();
    let mut spec = base();
    spec.services.push(
        entry("ns1/web:http", "fd00:10:96::1", 80)
            .with(ep("fd00:10:244:2::5", 8080))
            .into(),
    );
    spec.node_ips.push("fd00:192:168:10::11".into());
    finish(&mut spec);
    h.sync(&spec);
    let v6 = h.iptables.dump(IpFamily::IPv6);
    assert!(v6.contains("--to-destination [fd00:10:244:2::5]:8080"), "{v6}");
    assert!(
        v6.contains("-A PREROUTING -m comment --comment \"switchyard service portals\" -j SWYD-SERVICES")
    );
    assert!(!h.iptables.dump(IpFamily::IPv4).contains("fd00"));
}

#[test]
fn a_dual_stack_sync_failing_in_one_family_says_which_one_has_the_new_rules() {
    let mut h = Harness::new();
    let mut spec = base();
    spec.services.push(
        entry("ns1/web:http", "fd00:10:96::1", 80)
            .with(ep("fd00:10:244:2::5", 8080))
            .into(),
    );
    spec.node_ips.push("fd00:192:168:10::11".into());
    finish(&mut spec);
    h.iptables
        .fail_next_restore(Some(IpFamily::IPv6), "ip6tables-restore: out of memory");
    let SyncResult::Failed { message } = h.sync(&spec) else {
        panic!("the IPv6 restore failed")
    };
    assert!(
        message.contains("out of memory") && message.contains("IPv4 already has the new rules"),
        "{message}"
    );
    assert!(
        h.iptables
            .dump(IpFamily::IPv4)
            .contains(&names::cluster_policy_chain("ns1/web:http", "tcp"))
    );
    // The retry programs both.
    h.clock.advance(Duration::from_secs(1));
    assert!(matches!(h.sync(&spec), SyncResult::Applied { .. }));
    assert!(
        h.iptables
            .dump(IpFamily::IPv6)
            .contains("--to-destination [fd00:10:244:2::5]:8080")
    );
}

fn udp_flow(client: &str, dst: &str, dport: u16, endpoint: &str) -> Flow {
    Flow {
        original: Tuple {
            src: ip(client),
            dst: ip(dst),
            sport: 41000,
            dport,
        },
        reply: Tuple {
            src: ip(endpoint),
            dst: ip(client),
            sport: 53,
            dport: 41000,
        },
    }
}

fn cleared(h: &Harness, reason: &str) -> u64 {
    h.syncer
        .metrics()
        .conntrack_cleared
        .get_or_create(&switchyard_agent::sync::metrics::ReasonLabel {
            reason: reason.into(),
        })
        .get()
}

#[test]
fn udp_endpoint_changes_clean_stale_conntrack_entries() {
    let mut h = Harness::new();
    let to_gone = udp_flow("10.244.1.9", "10.96.0.10", 53, "10.244.3.53");
    let to_kept = udp_flow("10.244.1.8", "10.96.0.10", 53, "10.244.2.53");
    let elsewhere = udp_flow("10.244.1.7", "10.96.0.99", 53, "10.244.3.53");
    h.sync(&base());
    for flow in [to_gone, to_kept, elsewhere] {
        h.conntrack.add(flow);
    }
    let lists = h.conntrack.lists();

    // A TCP change does not look at conntrack at all.
    let tcp = edit(&base(), "ns1/api:https", |e| {
        e.endpoints[0].ip = "10.244.2.7".into()
    });
    h.sync(&tcp);
    assert_eq!(h.conntrack.lists(), lists);

    // dns loses 10.244.3.53: flows it answered are deleted, the others stay.
    let udp = edit(&tcp, "kube-system/dns:dns", |e| {
        e.endpoints.retain(|ep| ep.ip != "10.244.3.53");
    });
    h.sync(&udp);
    assert_eq!(h.conntrack.flows(), vec![to_kept, elsewhere]);
    assert_eq!(cleared(&h, "udp-stale"), 1);
    assert_eq!(h.syncer.status().conntrack_flows_cleared, 1);

    // A failing conntrack is logged and counted, never fatal.
    h.conntrack.set_failing(true);
    let again = edit(&udp, "kube-system/dns:dns", |e| e.endpoints[0].port = 5353);
    assert!(matches!(h.sync(&again), SyncResult::Applied { .. }));
    assert_eq!(h.syncer.metrics().conntrack_failures.get(), 1);
}

#[test]
fn udp_flows_to_an_endpoint_now_serving_on_another_port_go_in_one_batch_and_terminating_ones_stay() {
    let mut h = Harness::new();
    h.sync(&base());
    // 40 clients hold a flow to 10.244.2.53:53, one to 10.244.3.53:53.
    let old_port: Vec<Flow> = (0..40u16)
        .map(|i| {
            let mut flow = udp_flow(&format!("10.244.1.{}", 10 + i), "10.96.0.10", 53, "10.244.2.53");
            flow.original.sport += i;
            flow.reply.dport = flow.original.sport;
            flow
        })
        .collect();
    let to_terminating = udp_flow("10.244.1.9", "10.96.0.10", 53, "10.244.3.53");
    for flow in old_port.iter().chain([&to_terminating]) {
        h.conntrack.add(*flow);
    }
    let lists = h.conntrack.lists();

    // The same address now serves on 5353 (a changed targetPort); the other endpoint terminates.
    let moved = edit(&base(), "kube-system/dns:dns", |e| {
        e.endpoints[0].port = 5353;
        e.endpoints[1].terminating = true;
    });
    assert!(matches!(h.sync(&moved), SyncResult::Applied { .. }));
    assert_eq!(
        h.conntrack.flows(),
        vec![to_terminating],
        "the terminating endpoint drains"
    );
    assert_eq!(h.conntrack.lists(), lists + 1, "the UDP table listed once");
    let filters = h.conntrack.cleared();
    assert_eq!(filters.len(), 1, "one filter for every client: {filters:?}");
    assert_eq!(
        (filters[0].endpoint, filters[0].endpoint_port),
        (ip("10.244.2.53"), Some(53))
    );
    assert_eq!(cleared(&h, "udp-stale"), 40);
    assert_eq!(cleared(&h, "endpoint-removed"), 0);
    assert_eq!(h.syncer.status().conntrack_flows_cleared, 40);
}

#[test]
fn udp_flows_of_an_entry_whose_endpoints_all_turned_unready_are_cleared() {
    // kubernetes#139628: still listed (unreadyIPs), so nothing "left"; no endpoint serves either.
    let mut h = Harness::new();
    h.sync(&base());
    let to_a = udp_flow("10.244.1.9", "10.96.0.10", 53, "10.244.2.53");
    let to_b = udp_flow("10.244.1.8", "10.96.0.10", 53, "10.244.3.53");
    let tcp = tcp_flow("10.244.1.7", "10.96.0.1", 80, "10.244.2.5", 8080);
    h.conntrack.add(to_a);
    h.conntrack.add(to_b);
    h.conntrack.add_tracked(Protocol::TCP, tcp);
    let unready = edit(&base(), "kube-system/dns:dns", |e| {
        e.unready_ips = e.endpoints.drain(..).map(|ep| ep.ip).collect();
        e.has_endpoints = false;
    });
    assert!(matches!(h.sync(&unready), SyncResult::Applied { .. }));
    assert_eq!(h.conntrack.flows(), vec![]);
    assert_eq!(h.conntrack.tracked(), vec![(Protocol::TCP, tcp)]);
    assert_eq!(cleared(&h, "udp-stale"), 2);
    assert_eq!(h.syncer.status().conntrack_flows_cleared, 2);
}

fn tcp_flow(client: &str, dst: &str, dport: u16, endpoint: &str, endpoint_port: u16) -> Flow {
    let mut flow = udp_flow(client, dst, dport, endpoint);
    flow.reply.sport = endpoint_port;
    flow
}

#[test]
fn connections_of_an_endpoint_that_left_are_cleared_and_draining_ones_are_not() {
    let mut h = Harness::new();
    h.sync(&base());
    let to_5 = tcp_flow("10.244.1.9", "10.96.0.1", 80, "10.244.2.5", 8080);
    let node_port_to_5 = tcp_flow("10.244.1.9", "192.168.10.11", 30080, "10.244.2.5", 8080);
    let to_other = tcp_flow("10.244.1.8", "10.96.0.1", 80, "10.244.3.5", 8080);
    let direct_to_5 = tcp_flow("10.244.1.7", "10.244.2.5", 8080, "10.244.2.5", 8080);
    for flow in [to_5, node_port_to_5, to_other, direct_to_5] {
        h.conntrack.add_tracked(Protocol::TCP, flow);
    }

    // 10.244.2.5 terminates: serving, then past serving (unready). Its connections drain.
    let serving = edit(&base(), "ns1/web:http", |e| e.endpoints[0].terminating = true);
    h.sync(&serving);
    let unready = edit(&serving, "ns1/web:http", |e| {
        e.endpoints.remove(0);
        e.unready_ips = vec!["10.244.2.5".into()];
    });
    h.sync(&unready);
    assert_eq!(h.conntrack.cleared(), vec![], "nothing left the Service yet");
    assert_eq!(h.conntrack.tracked().len(), 4);

    // Gone from the slice: its flows through the ClusterIP and the NodePort go, the rest stay.
    let gone = edit(&unready, "ns1/web:http", |e| e.unready_ips.clear());
    assert!(matches!(h.sync(&gone), SyncResult::Applied { .. }));
    assert_eq!(
        h.conntrack
            .tracked()
            .into_iter()
            .map(|(_, flow)| flow)
            .collect::<Vec<_>>(),
        vec![to_other, direct_to_5]
    );
    assert_eq!(h.syncer.status().conntrack_flows_cleared, 2);
    assert_eq!(cleared(&h, "endpoint-removed"), 2);
    assert_eq!(cleared(&h, "udp-stale"), 0);

    // Opted out: an endpoint that leaves keeps its connections.
    let kept = edit(&gone, "ns1/web:http", |e| e.keep_connections = true);
    h.sync(&kept);
    let filters = h.conntrack.cleared().len();
    let left = edit(&kept, "ns1/web:http", |e| e.endpoints.clear());
    h.sync(&left);
    assert_eq!(h.conntrack.cleared().len(), filters);
    assert_eq!(h.conntrack.tracked().len(), 2);
}

#[test]
fn a_change_that_removes_many_endpoints_lists_the_table_once_and_runs_only_filters_that_match() {
    let mut h = Harness::new();
    let endpoints = |subnet: u8| {
        (10..20)
            .map(|host| ep(&format!("10.244.{subnet}.{host}"), 8080))
            .collect::<Vec<_>>()
    };
    let old = edit(&base(), "ns1/web:http", |e| e.endpoints = endpoints(2));
    h.sync(&old);
    let busy = tcp_flow("10.244.1.9", "10.96.0.1", 80, "10.244.2.12", 8080);
    let other = tcp_flow("10.244.1.8", "10.96.0.1", 80, "10.244.3.5", 8080);
    h.conntrack.add_tracked(Protocol::TCP, busy);
    h.conntrack.add_tracked(Protocol::TCP, other);
    let lists = h.conntrack.lists();

    // All ten endpoints replaced: 20 filters (ClusterIP and NodePort each), one of which matches.
    let new = edit(&old, "ns1/web:http", |e| e.endpoints = endpoints(4));
    assert!(matches!(h.sync(&new), SyncResult::Applied { .. }));
    assert_eq!(h.conntrack.lists(), lists + 1, "one TCP listing");
    let run = h.conntrack.cleared();
    assert_eq!(run.len(), 1, "{run:?}");
    assert_eq!(run[0].endpoint, ip("10.244.2.12"));
    assert_eq!(run[0].frontend, Some(ip("10.96.0.1")));
    assert_eq!(
        h.conntrack.tracked(),
        vec![(Protocol::TCP, other)],
        "only the removed endpoint's flow went"
    );
    assert_eq!(h.syncer.status().conntrack_flows_cleared, 1);
}

#[test]
fn transition_times_move_only_when_a_condition_flips() {
    let mut h = Harness::new();
    let a = base();
    h.sync(&a);
    let t0 = transition(&h.syncer.status(), APPLIED);
    assert_eq!(t0, "2026-01-01T00:00:00Z");

    h.clock.advance(Duration::from_secs(10));
    let b = edit(&a, "ns1/api:https", |e| e.port = 444);
    h.sync(&b);
    assert_eq!(transition(&h.syncer.status(), APPLIED), t0, "still True");

    h.clock.advance(Duration::from_secs(10));
    h.iptables.fail_next_restore(None, "boom");
    h.sync(&edit(&b, "ns1/api:https", |e| e.port = 445));
    let s = h.syncer.status();
    assert_eq!(transition(&s, APPLIED), "2026-01-01T00:00:20Z");
    assert_eq!(transition(&s, DEGRADED), "2026-01-01T00:00:20Z");

    h.clock.advance(Duration::from_secs(10));
    let mut invalid = b.clone();
    invalid.revision.clear();
    h.sync(&invalid);
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::FALSE, reasons::INVALID_PLAN));
    assert_eq!(
        transition(&s, APPLIED),
        "2026-01-01T00:00:20Z",
        "False → False keeps the time"
    );

    h.clock.advance(Duration::from_secs(10));
    h.sync(&b);
    let s = h.syncer.status();
    assert_eq!(transition(&s, APPLIED), "2026-01-01T00:00:40Z");
    assert_eq!(s.last_sync_time.as_deref(), Some("2026-01-01T00:00:40Z"));
}

#[test]
fn health_check_failures_show_in_status_without_failing_the_sync() {
    let mut h = Harness::new();
    h.sync(&base());
    h.syncer.set_extra_failures(vec![switchyard_api::ServiceFailure {
        service: "ns1/web".into(),
        reason: "health check node port 32000: Address in use".into(),
    }]);
    let s = h.syncer.status();
    assert_eq!(condition(&s, APPLIED), (status::TRUE, reasons::SYNCED));
    assert_eq!(
        condition(&s, DEGRADED),
        (status::TRUE, reasons::PARTIALLY_APPLIED)
    );
    assert_eq!(s.failures_total, Some(1));
    h.syncer.set_extra_failures(vec![]);
    assert_eq!(
        condition(&h.syncer.status(), DEGRADED),
        (status::FALSE, reasons::HEALTHY)
    );
}

#[test]
fn a_plan_for_another_backend_falls_back_to_iptables_and_says_so() {
    let mut h = Harness::new();
    let mut spec = base();
    spec.backend = switchyard_api::Backend::Ipvs;
    finish(&mut spec);
    h.sync(&spec);
    let s = h.syncer.status();
    assert_eq!(s.backend, Some(switchyard_api::Backend::Iptables));
    assert!(s.backend_reason.as_deref().unwrap().contains("asks for ipvs"));
    assert_eq!(condition(&s, DEGRADED), (status::TRUE, reasons::BACKEND_FALLBACK));
}

#[test]
fn crossing_the_large_cluster_threshold_rewrites_every_service_in_a_full_sync() {
    use switchyard_agent::iptables::render::LARGE_CLUSTER_ENDPOINTS;
    let mut h = Harness::new();
    // base() has 5 endpoints; single-endpoint entries fill it up to exactly the threshold.
    let mut small = base();
    for i in 0..LARGE_CLUSTER_ENDPOINTS - 5 {
        let (hi, lo) = (i / 250, i % 250 + 1);
        let name = format!("ns2/s{i}:p");
        let filler = entry(&name, &format!("10.97.{hi}.{lo}"), 80).with(ep(&format!("10.245.{hi}.{lo}"), 80));
        small.services.push(Arc::new(filler));
    }
    finish(&mut small);
    assert_eq!(mode(&h.sync(&small)), SyncMode::Full);
    let dns_pick = "\"kube-system/dns:dns -> 10.244.2.53:53\"";
    assert!(h.iptables.dump(IpFamily::IPv4).contains(dns_pick));

    // One more endpoint of one Service: every Service's per-endpoint comments go, so no partial sync.
    let large = edit(&small, "ns1/web:http", |e| {
        e.endpoints.push(ep("10.244.4.5", 8080))
    });
    assert_eq!(mode(&h.sync(&large)), SyncMode::Full);
    let dump = h.iptables.dump(IpFamily::IPv4);
    assert!(!dump.contains(dns_pick), "unchanged dns lost its comments too");
    assert!(
        dump.contains("\"kube-system/dns:dns cluster IP\""),
        "frontends keep theirs"
    );
    assert_eq!(fresh_state(&large), dump, "the same as a fresh full sync");
}
