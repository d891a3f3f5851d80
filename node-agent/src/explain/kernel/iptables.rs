//! `explain --kernel` on the iptables backend: the packet traced through the rules the kernel holds
//! (our part of `iptables-save`), and where they differ from the plan's on its path.
//!
//! ```text
//! iptables-save nat + filter ─► ours_of_save ─► kernel_tracer ─► trace(packet) ─► the outcome
//! plan_tracer(plan) + its trace ─────────────────────────────────┴─► drift(): the chains either trace
//!                                                                    went through, rule by rule
//! ```

use std::net::IpAddr;

use switchyard_api::{IpFamily, NodeForwardingPlanSpec};

use crate::error::Error;
use crate::explain::verdict::{outcome, plan_tracer};
use crate::explain::words::{Explanation, Outcome};
use crate::xtables::{Packet, Table, Trace, Tracer};

/// `--kernel`: traces the packet through the rules the kernel holds (`saves`: iptables-save of nat and
/// filter), makes that the outcome, and records where they differ from the plan's on this path.
pub fn compare_kernel(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    packet: &Packet,
    plan_trace: &Trace,
    local: &[IpAddr],
    saves: &[String],
) -> Result<(), Error> {
    let family = IpFamily::of(&packet.dest);
    // No chain of ours at all: the node is not programmed (never, or cleaned up); a rule-by-rule
    // comparison would list every rule of the plan as drift.
    if !saves
        .iter()
        .any(|save| save.lines().any(|line| line.starts_with(":SWYD-")))
    {
        explanation.drift = Some(vec![
            "no Switchyard rules on this host (no SWYD-* chain in iptables-save): its agent has not \
             programmed it, or `switchyard-agent cleanup` ran"
                .to_owned(),
        ]);
        explanation.outcome = Outcome::NotAService;
        return Ok(());
    }
    let installed = kernel_tracer(family, local, saves)?;
    let kernel_trace = installed.trace(packet)?;
    let plan = plan_tracer(spec, family, Some(local))?;
    explanation.drift = Some(drift(&plan, plan_trace, &installed, &kernel_trace));
    let entry = explanation
        .service
        .as_deref()
        .and_then(|name| spec.services.iter().find(|e| e.name == name));
    // What the node does is what its rules do, even where the plan has no such frontend (rules left
    // behind by someone).
    explanation.outcome = outcome(&kernel_trace, spec.backend, entry.map(AsRef::as_ref));
    Ok(())
}

/// Our part of `iptables-save` output (our chains, and built-in chain rules jumping into them) as a
/// restore payload the packet model reads; everything else in the tables is someone else's.
pub fn ours_of_save(save: &str) -> String {
    let mut out = String::new();
    for line in save.lines() {
        let ours = line.starts_with('*')
            || line == "COMMIT"
            || line.starts_with(":SWYD-")
            || line.starts_with("-A SWYD-")
            || (line.starts_with("-A ") && line.contains(" -j SWYD-"));
        if ours {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The packet model of what the kernel holds, from `iptables-save` of nat and filter.
pub fn kernel_tracer(family: IpFamily, local: &[IpAddr], saves: &[String]) -> Result<Tracer, Error> {
    let mut tracer = Tracer::empty(family, local);
    for save in saves {
        tracer.restore(&ours_of_save(save))?;
    }
    Ok(tracer)
}

/// Where the kernel's rules on the path differ from the plan's: the chains either trace went
/// through, compared rule by rule (first difference of each), and a different outcome.
pub fn drift(plan: &Tracer, plan_trace: &Trace, kernel: &Tracer, kernel_trace: &Trace) -> Vec<String> {
    let mut found = Vec::new();
    if plan_trace.verdicts() != kernel_trace.verdicts()
        || plan_trace.masquerade() != kernel_trace.masquerade()
    {
        found.push(format!(
            "the plan gives {} (masquerade {}), the kernel {} (masquerade {})",
            plan_trace.output(),
            plan_trace.masquerade(),
            kernel_trace.output(),
            kernel_trace.masquerade()
        ));
    }
    let mut chains: Vec<(Table, String)> = Vec::new();
    for branch in plan_trace.branches.iter().chain(&kernel_trace.branches) {
        for rule in &branch.rules {
            if let Some(chain) = rule.strip_prefix("-A ").and_then(|r| r.split(' ').next()) {
                for table in [Table::Nat, Table::Filter] {
                    let key = (table, chain.to_string());
                    if !chains.contains(&key) {
                        chains.push(key);
                    }
                }
            }
        }
    }
    for (table, chain) in chains {
        let (want, have) = (plan.chain_rules(table, &chain), kernel.chain_rules(table, &chain));
        let same = want.len() == have.len() && want.iter().zip(&have).all(|(w, h)| w.1 == h.1);
        if same {
            continue;
        }
        let meanings = |rules: &[(String, String)]| rules.iter().map(|r| r.1.clone()).collect::<Vec<_>>();
        let (want_m, have_m) = (meanings(&want), meanings(&have));
        match want.iter().zip(&have).position(|(w, h)| w.1 != h.1) {
            // One rule missing or one added, the rest the same: say which, not every shifted pair.
            Some(i) if want_m[i + 1..] == have_m[i..] => found.push(format!(
                "{table} {chain}: the kernel lacks rule {} `-A {chain} {}`",
                i + 1,
                want[i].0
            )),
            Some(i) if have_m[i + 1..] == want_m[i..] => found.push(format!(
                "{table} {chain}: the kernel has an extra rule {} `-A {chain} {}`",
                i + 1,
                have[i].0
            )),
            Some(i) => found.push(format!(
                "{table} {chain} rule {}: kernel `-A {chain} {}`, plan `-A {chain} {}`",
                i + 1,
                have[i].0,
                want[i].0
            )),
            None if have.len() > want.len() => found.push(format!(
                "{table} {chain}: the kernel has an extra rule `-A {chain} {}`",
                have[want.len()].0
            )),
            None => found.push(format!(
                "{table} {chain}: the kernel lacks the rule `-A {chain} {}`",
                want[have.len()].0
            )),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::{Destination, EXIT_FORWARDED, Source, explain};
    use switchyard_api::Protocol;
    use switchyard_api::testing::{EntryExt, entry, ep, plan};

    #[test]
    fn a_host_without_our_rules_is_said_to_be_unprogrammed_not_drifted() {
        let spec = plan(
            "node-a",
            vec![entry("ns1/web:http", "10.96.0.1", 80).with(ep("10.244.2.5", 8080))],
        );
        let dest = Destination::Address("10.96.0.1:80".parse().unwrap(), Protocol::TCP);
        let (mut explanation, packet, plan_trace) = explain(&spec, &dest, Source::Node, None).unwrap();
        let someone_elses = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
                             -A PREROUTING -j KUBE-SERVICES\nCOMMIT\n"
            .to_owned();
        compare_kernel(
            &spec,
            &mut explanation,
            &packet,
            &plan_trace,
            &[],
            &[someone_elses],
        )
        .unwrap();
        assert_eq!(explanation.outcome, Outcome::NotAService);
        let drift = explanation.drift.clone().unwrap();
        assert_eq!(drift.len(), 1, "{drift:?}");
        assert!(drift[0].contains("no Switchyard rules on this host"), "{drift:?}");
        assert!(explanation.text().contains("no Switchyard rules on this host"));
    }

    #[test]
    fn the_kernel_model_reads_iptables_save_spelling_and_drift_names_the_changed_rule() {
        let spec = plan(
            "node-a",
            vec![
                entry("ns1/web:http", "10.96.0.1", 80)
                    .with(ep("10.244.2.5", 8080))
                    .with(ep("10.244.3.5", 8080)),
            ],
        );
        let dest = Destination::Address("10.96.0.1:80".parse().unwrap(), Protocol::TCP);
        let source = Source::Address("10.244.1.9".parse().unwrap());
        let (explanation, packet, plan_trace) = explain(&spec, &dest, source, None).unwrap();
        assert_eq!(explanation.exit_code(), EXIT_FORWARDED);
        let plan = plan_tracer(&spec, IpFamily::IPv4, None).unwrap();
        // What iptables-save prints for those rules: other option order, /32, --set-xmark, more digits,
        // someone else's rule in a built-in chain.
        let svc = crate::iptables::names::cluster_policy_chain("ns1/web:http", "tcp");
        let saved = |last: &str| {
            plan.save(Table::Nat)
                .lines()
                .map(|line| {
                    line.replace("-j MARK --or-mark 0x4000", "-j MARK --set-xmark 0x4000/0x4000")
                        .replace("--probability 0.5000000000", "--probability 0.50000000000")
                        .replace("-d 10.96.0.1 ", "-d 10.96.0.1/32 ")
                        .replace("--to-destination 10.244.3.5:8080", last)
                })
                .chain(["-A PREROUTING -s 192.0.2.1/32 -j DROP".to_string()])
                .collect::<Vec<_>>()
                .join("\n")
        };
        let filter = plan.save(Table::Filter);
        let same = kernel_tracer(
            IpFamily::IPv4,
            &[],
            &[saved("--to-destination 10.244.3.5:8080"), filter.clone()],
        )
        .unwrap();
        let trace = same.trace(&packet).unwrap();
        assert_eq!(drift(&plan, &plan_trace, &same, &trace), Vec::<String>::new());

        let edited = kernel_tracer(
            IpFamily::IPv4,
            &[],
            &[saved("--to-destination 10.244.9.9:8080"), filter],
        )
        .unwrap();
        let trace = edited.trace(&packet).unwrap();
        let found = drift(&plan, &plan_trace, &edited, &trace);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].contains("the kernel 10.244.2.5:8080, 10.244.9.9:8080"),
            "{found:#?}"
        );
        assert!(
            found[1].starts_with(&format!("nat {svc} rule 3: kernel `")),
            "{found:#?}"
        );
        assert!(found[1].contains("10.244.9.9:8080"), "{found:#?}");
    }
}
