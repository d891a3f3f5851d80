//! The fields of the plan status a sync fills in, as pure pieces ([`crate::sync::Syncer::status`] puts
//! them together; the type is `switchyard_api::status`, the writers are [`crate::status_writer`] and
//! `planfile::write_status_file`): conditions that keep their transition time, entry failures in the
//! status' capped form, and short messages.
//!
//! ```text
//! outcome of the last attempt ─► set_condition(Applied | Degraded, status, reason, message, now)
//!                                  (lastTransitionTime moves only when status flips)
//! validate::Report ─► entry_failures() ─► cap_failures() ─► status.failures (≤ 10) + failuresTotal
//! ```

use switchyard_api::status::MAX_LISTED_FAILURES;
use switchyard_api::validate::Report;
use switchyard_api::{NodeForwardingPlanSpec, PlanCondition, ServiceFailure};

/// Longest condition message (the CRD allows 1024).
pub const MAX_MESSAGE: usize = 1024;
/// Longest failure reason (the CRD allows 512).
pub const MAX_REASON: usize = 512;
/// Longest entry name a failure lists (a valid one is at most 191 bytes: three 63-byte DNS labels).
pub const MAX_LABEL_NAME: usize = 256;

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut with `…`.
pub fn short(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Sets condition `type_`, adding it if missing. `lastTransitionTime` becomes `now` only when the
/// status changes (or the condition is new); reason and message are always updated.
pub fn set_condition(
    conditions: &mut Vec<PlanCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &str,
) {
    let message = short(message, MAX_MESSAGE);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(condition) => {
            if condition.status != status {
                condition.status = status.to_string();
                condition.last_transition_time = Some(now.to_string());
            }
            condition.reason = reason.to_string();
            condition.message = message;
        }
        None => conditions.push(PlanCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time: Some(now.to_string()),
        }),
    }
}

/// The entry's name as status lists it: `ns/svc:port TCP IPv4`.
pub fn entry_label(spec: &NodeForwardingPlanSpec, index: usize) -> String {
    match spec.services.get(index) {
        // A valid name is at most 191 bytes; an invalid one may be anything, cut here.
        Some(entry) => format!(
            "{} {:?} {:?}",
            short(&entry.name, MAX_LABEL_NAME),
            entry.protocol,
            entry.family
        ),
        None => format!("spec.services[{index}]"),
    }
}

/// One failure per skipped entry, its problems joined.
pub fn entry_failures(spec: &NodeForwardingPlanSpec, report: &Report) -> Vec<ServiceFailure> {
    report
        .entries
        .iter()
        .map(|(index, problems)| ServiceFailure {
            service: entry_label(spec, *index),
            reason: short(
                &problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
                MAX_REASON,
            ),
        })
        .collect()
}

/// The first [`MAX_LISTED_FAILURES`] failures and the total (`None` when there are none).
pub fn cap_failures(mut all: Vec<ServiceFailure>) -> (Vec<ServiceFailure>, Option<u32>) {
    let total = all.len();
    all.truncate(MAX_LISTED_FAILURES);
    (all, (total > 0).then_some(total as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::conditions::{APPLIED, reasons, status};
    use switchyard_api::testing::{EntryExt, entry, ep, plan};
    use switchyard_api::validate::validate;

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            APPLIED,
            status::TRUE,
            reasons::SYNCED,
            "ok",
            "t1",
        );
        set_condition(
            &mut conditions,
            APPLIED,
            status::TRUE,
            reasons::PARTIALLY_APPLIED,
            "some",
            "t2",
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time.as_deref(), Some("t1"));
        assert_eq!(conditions[0].reason, reasons::PARTIALLY_APPLIED);
        set_condition(
            &mut conditions,
            APPLIED,
            status::FALSE,
            reasons::APPLY_FAILED,
            "no",
            "t3",
        );
        assert_eq!(conditions[0].last_transition_time.as_deref(), Some("t3"));
        set_condition(
            &mut conditions,
            APPLIED,
            status::FALSE,
            reasons::INVALID_PLAN,
            "bad",
            "t4",
        );
        assert_eq!(conditions[0].last_transition_time.as_deref(), Some("t3"));
        assert_eq!(conditions[0].message, "bad");
    }

    #[test]
    fn failures_are_capped_with_a_total() {
        let mut services: Vec<_> = (0..12)
            .map(|i| {
                entry(&format!("ns/s{i:02}:p"), &format!("10.96.0.{}", i + 1), 80).with(ep("10.244.2.1", 80))
            })
            .collect();
        for s in &mut services {
            s.cluster_ip = "not-an-ip".into();
        }
        let spec = plan("node-a", services);
        let all = entry_failures(&spec, &validate(&spec));
        assert_eq!(all.len(), 12);
        assert_eq!(all[0].service, "ns/s00:p TCP IPv4");
        assert!(all[0].reason.contains("clusterIP"), "{}", all[0].reason);
        let (listed, total) = cap_failures(all);
        assert_eq!((listed.len(), total), (MAX_LISTED_FAILURES, Some(12)));
        assert_eq!(cap_failures(vec![]), (vec![], None));
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        assert_eq!(short("abc", 10), "abc");
        let cut = short(&"é".repeat(100), 11);
        assert!(cut.len() <= 11 && cut.ends_with('…'), "{cut}");
    }
}
