//! Partial syncs checked against the tracer's kernel model: applying a partial payload on top of the
//! previous state must give exactly the state a full sync would.

use std::collections::BTreeSet;

use switchyard_agent::iptables::{Ruleset, names};
use switchyard_agent::xtables::{Table, Tracer};
use switchyard_api::EntryKey;
use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};
use switchyard_api::{IpFamily, NodeForwardingPlanSpec, Protocol};

use crate::fixtures::{facts, local_addrs, render_all};

fn key(name: &str) -> EntryKey {
    EntryKey {
        name: name.into(),
        protocol: Protocol::TCP,
        family: IpFamily::IPv4,
    }
}

/// Endpoints on the node keep a SEP chain (hairpin) whose removal a partial sync must handle; the
/// others are DNATed inline by their policy chain.
fn before() -> NodeForwardingPlanSpec {
    plan(
        "node-a",
        vec![
            entry("ns/same:p80", "10.96.0.1", 80)
                .with(ep("10.244.2.1", 80))
                .with(ep("10.244.3.1", 80)),
            entry("ns/shrinks:p80", "10.96.0.2", 80)
                .with(ep("10.244.2.2", 80))
                .with(ep("10.244.3.2", 80))
                .with(ep("10.244.4.2", 80).on_node()),
            entry("ns/goes:p80", "10.96.0.3", 80)
                .lb_ip("203.0.113.3")
                .source_range("198.51.100.0/24")
                .with(ep("10.244.2.3", 80).on_node()),
        ],
    )
}

fn after() -> NodeForwardingPlanSpec {
    plan(
        "node-a",
        vec![
            entry("ns/same:p80", "10.96.0.1", 80)
                .with(ep("10.244.2.1", 80))
                .with(ep("10.244.3.1", 80)),
            entry("ns/shrinks:p80", "10.96.0.2", 80)
                .affinity(60)
                .with(ep("10.244.2.2", 80))
                .with(ep("10.244.3.2", 80)),
            entry("ns/new:p80", "10.96.0.4", 80)
                .node_port(30004)
                .with(ep("10.244.2.4", 80)),
        ],
    )
}

fn rulesets() -> (Ruleset, Ruleset) {
    (
        render_all(&before(), &facts(), IpFamily::IPv4),
        render_all(&after(), &facts(), IpFamily::IPv4),
    )
}

fn declared(payload: &str) -> BTreeSet<String> {
    payload
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn changed_and_stale_are_computed_from_two_rulesets() {
    let (old, new) = rulesets();
    assert_eq!(
        new.changed_since(&old.digest()),
        BTreeSet::from([key("ns/new:p80"), key("ns/shrinks:p80")])
    );
    assert!(new.changed_since(&new.digest()).is_empty());
    assert_eq!(new.changed_since(&Default::default()).len(), new.services().len());
    let stale = new.stale_chains(old.digest().nat_chains());
    let goes = |f: fn(&str, &str) -> String| f("ns/goes:p80", "tcp");
    let mut want = vec![
        goes(names::cluster_policy_chain),
        goes(names::external_chain),
        goes(names::firewall_chain),
        names::endpoint_chain("ns/goes:p80", "tcp", "10.244.2.3:80"),
        names::endpoint_chain("ns/shrinks:p80", "tcp", "10.244.4.2:80"),
    ];
    want.sort();
    assert_eq!(stale, want);
}

#[test]
fn partial_payload_writes_only_changed_services_and_deletes_stale_chains() {
    let (old, new) = rulesets();
    let changed = new.changed_since(&old.digest());
    let stale = new.stale_chains(old.digest().nat_chains());
    let partial = new.partial_payload(&changed, &stale);

    let declared = declared(&partial);
    let same = names::cluster_policy_chain("ns/same:p80", "tcp");
    assert!(
        !declared.contains(&same),
        "unchanged service rewritten:\n{partial}"
    );
    assert!(!partial.contains(&format!("-A {same} ")));
    for group in new.services().iter().filter(|s| changed.contains(&s.key)) {
        for chain in &group.chains {
            assert!(
                declared.contains(&chain.name),
                "{} missing:\n{partial}",
                chain.name
            );
        }
    }
    for chain in &stale {
        assert!(
            declared.contains(chain),
            "stale {chain} must be declared (flushed) first"
        );
        assert!(
            partial.contains(&format!("-X {chain}\n")),
            "stale {chain} not deleted"
        );
    }
    assert!(
        !declared.contains(names::CANARY),
        "partial syncs must not recreate the canary"
    );
    // The filter table is always written whole.
    let filter = |payload: &str| {
        payload
            .split("*nat")
            .next()
            .unwrap()
            .replace(&format!(":{} - [0:0]\n", names::CANARY), "")
    };
    assert_eq!(filter(&partial), filter(&new.full_payload()));
    // Deletions come after every rule, so nothing still refers to a deleted chain.
    let lines: Vec<&str> = partial.lines().collect();
    let last_rule = lines.iter().rposition(|l| l.starts_with("-A ")).unwrap();
    let first_delete = lines.iter().position(|l| l.starts_with("-X ")).unwrap();
    assert!(first_delete > last_rule);
}

#[test]
fn partial_sync_on_the_old_state_equals_a_full_sync() {
    let (old, new) = rulesets();
    let changed = new.changed_since(&old.digest());
    let stale = new.stale_chains(old.digest().nat_chains());

    let mut kernel = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    kernel.restore(&new.partial_payload(&changed, &stale)).unwrap();
    let fresh = Tracer::from_ruleset(&new, &local_addrs()).unwrap();
    assert_eq!(kernel.dump(), fresh.dump());

    // A full sync that removes the stale chains gets there too; one that does not leaves them behind.
    let mut kernel = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    kernel.restore(&new.full_payload_removing(&stale)).unwrap();
    assert_eq!(kernel.dump(), fresh.dump());
    let mut kernel = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    kernel.restore(&new.full_payload()).unwrap();
    assert_ne!(kernel.dump(), fresh.dump());
}

#[test]
fn a_partial_sync_missing_a_changed_service_is_caught() {
    let (old, new) = rulesets();
    let stale = new.stale_chains(old.digest().nat_chains());
    let incomplete = BTreeSet::from([key("ns/new:p80")]);
    let mut kernel = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    // The old SVC chain of ns/shrinks still jumps to its removed endpoint's chain, so deleting that
    // chain fails, as it would in the kernel.
    let err = kernel
        .restore(&new.partial_payload(&incomplete, &stale))
        .unwrap_err();
    assert!(err.to_string().contains("still referenced"), "{err}");
}

#[test]
fn full_payload_declares_every_owned_chain() {
    let (_, new) = rulesets();
    let payload = new.full_payload();
    let (filter, nat) = payload.split_once("*nat").unwrap();
    let chains = new.chains();
    assert_eq!(declared(filter), chains[&Table::Filter]);
    assert_eq!(declared(nat), chains[&Table::Nat]);
    assert!(chains[&Table::Filter].contains(names::CANARY) && chains[&Table::Nat].contains(names::CANARY));
    assert!(!payload.contains("-X "));
    assert_eq!(payload.matches("COMMIT\n").count(), 2);
}

#[test]
fn a_missing_canary_survives_partial_syncs_until_a_full_one() {
    let (old, new) = rulesets();
    let mut kernel = Tracer::from_ruleset(&old, &local_addrs()).unwrap();
    // Someone deletes our canary (a firewall reload would delete everything).
    kernel
        .restore(&format!("*nat\n-X {}\nCOMMIT\n", names::CANARY))
        .unwrap();
    kernel
        .restore(&new.partial_payload(&new.changed_since(&old.digest()), &[]))
        .unwrap();
    assert!(!kernel.has_chain(Table::Nat, names::CANARY));
    kernel.restore(&new.full_payload()).unwrap();
    assert!(kernel.has_chain(Table::Nat, names::CANARY) && kernel.has_chain(Table::Filter, names::CANARY));
}

#[test]
fn stale_lists_cannot_delete_chains_in_use_or_not_ours() {
    let (_, new) = rulesets();
    let in_use = names::cluster_policy_chain("ns/same:p80", "tcp");
    let existing = [
        "KUBE-SVC-NUKIZ6OKUXPJNT4C".to_string(),
        names::SERVICES.to_string(),
        in_use.clone(),
        "SWYD-SEP-AAAAAAAAAAAAAAAA".to_string(),
    ];
    assert_eq!(new.stale_chains(&existing), ["SWYD-SEP-AAAAAAAAAAAAAAAA"]);
    let partial = new.partial_payload(&BTreeSet::new(), &existing);
    assert!(!partial.contains("-X KUBE") && !partial.contains(&format!("-X {in_use}")));
    assert!(!partial.contains(&format!("-X {}", names::SERVICES)));
    assert!(partial.contains("-X SWYD-SEP-AAAAAAAAAAAAAAAA\n"));
}
