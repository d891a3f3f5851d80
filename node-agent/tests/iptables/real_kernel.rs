//! The payloads against the real `iptables-restore`, inside a network namespace of its own
//! (`unshare --net`), so nothing on the host is touched. Needs root: without it the test fails with a
//! clear message, or prints a skip line when `SWITCHYARD_SKIP_LAB=1` (see `lab`).
//!
//! The partial sync is checked against the tracer's model: after full(A), the jump rules and
//! partial(B), the kernel must hold exactly the chains, and per chain the number of rules, that the
//! model holds.

use std::collections::BTreeMap;
use std::process::Command;

use switchyard_agent::iptables::{jump_rules, names};
use switchyard_agent::xtables::Tracer;
use switchyard_api::IpFamily;
use switchyard_api::testing::{EntryExt, entry, ep, finish};

use crate::fixtures::{everything, facts, local_addrs, render_all};
use crate::lab::lab_allowed;

/// Rules per chain (built-in chains included), from `iptables-save`-style text (the kernel's or the
/// model's dump).
fn rule_counts(save: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut table = String::new();
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split(' ').next()) {
            counts.entry(format!("{table} {chain}")).or_insert(0);
        } else if let Some(chain) = line.strip_prefix("-A ").and_then(|l| l.split(' ').next()) {
            *counts.entry(format!("{table} {chain}")).or_insert(0) += 1;
        }
    }
    counts
}

fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

#[test]
fn real_iptables_restore_accepts_full_and_partial_payloads() {
    if !lab_allowed("real_iptables_restore_accepts_full_and_partial_payloads") {
        return;
    }
    let old = render_all(&everything(), &facts(), IpFamily::IPv4);
    let mut changed_spec = everything();
    changed_spec.services.retain(|s| s.name != "ns3/lb:p80");
    changed_spec.services.push(
        entry("ns99/new:p80", "10.96.0.99", 80)
            .node_port(30099)
            .with(ep("10.244.2.99", 80))
            .into(),
    );
    for service in changed_spec
        .services
        .iter_mut()
        .filter(|s| s.name == "ns1/multi:p80")
    {
        std::sync::Arc::make_mut(service).endpoints.pop();
    }
    finish(&mut changed_spec);
    let new = render_all(&changed_spec, &facts(), IpFamily::IPv4);
    let partial = new.partial_payload(
        &new.changed_since(&old.digest()),
        &new.stale_chains(old.digest().nat_chains()),
    );
    let v6 = render_all(&everything(), &facts(), IpFamily::IPv6);

    let scratch = switchyard_test_support::scratch::dir("iptables").unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("old"), old.full_payload()).unwrap();
    std::fs::write(dir.join("partial"), &partial).unwrap();
    std::fs::write(dir.join("v6"), v6.full_payload()).unwrap();
    let mut script = String::from("set -e\n");
    script += &format!("iptables-restore --noflush --counters < {}/old\n", dir.display());
    for jump in jump_rules(IpFamily::IPv4) {
        let args: Vec<String> = jump.args.iter().map(|a| shell_quote(a)).collect();
        let (table, chain, args) = (jump.table, jump.chain, args.join(" "));
        script += &format!(
            "iptables -t {table} -C {chain} {args} 2>/dev/null || iptables -t {table} -I {chain} {args}\n"
        );
    }
    script += &format!(
        "iptables-restore --noflush --counters < {}/partial\n",
        dir.display()
    );
    script += &format!("ip6tables-restore --noflush --counters < {}/v6\n", dir.display());
    script += "iptables-save -t filter; iptables-save -t nat\n";
    let output = Command::new("unshare")
        .args(["--net", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stderr: {}\nscript:\n{script}",
        String::from_utf8_lossy(&output.stderr)
    );

    let mut model = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    model.restore(&partial).unwrap();
    // A fresh namespace's built-in chains hold only our jump rules, like the model's.
    let want = rule_counts(&model.dump());
    let got = rule_counts(&stdout);
    assert_eq!(got, want, "kernel:\n{stdout}");
    assert!(
        got["nat SWYD-SERVICES"] > 10 && got["filter INPUT"] == 3,
        "{got:#?}"
    );
    let gone = names::firewall_chain("ns3/lb:p80", "tcp");
    assert!(!stdout.contains(&gone), "stale {gone} survived:\n{stdout}");
}
