//! The switch gate: before the agent switches backends, every frontend of the plan must get the same
//! verdict from the new backend's rules as from the old one's; otherwise the switch is refused and the
//! old backend keeps forwarding.
//!
//! ```text
//! spec, skip, from, to ─► per valid entry (cached while the entry and the header stay the same):
//!   one-entry spec ─► model::verdicts(from) vs model::verdicts(to) ─► differences
//! none ─► Ok: switch          some ─► Err(Refused): the first few, how many, which Services
//! ```
//!
//! Entries are judged one at a time, so a plan of many Services costs one small render per entry and a
//! change re-judges only the entries it touched (an unchanged entry is the same `Arc` in the composed
//! plan). Frontends two entries claim are judged for each, as each entry's own.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use switchyard_api::{Backend, NodeForwardingPlanSpec, ServicePlan};

use super::frontends::{Frontend, of_entry};
use super::model;
use super::verdict::Verdict;

/// How many differences a refusal names.
pub const MAX_NAMED: usize = 3;

/// One frontend whose verdict a switch would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The frontend.
    pub frontend: Frontend,
    /// Its verdict under the backend in use.
    pub before: Verdict,
    /// Its verdict under the backend the plan asks for.
    pub after: Verdict,
}

/// A refused switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The backend in use (it stays).
    pub from: Backend,
    /// The backend the plan asks for.
    pub to: Backend,
    /// The first differences, in plan order.
    pub named: Vec<Difference>,
    /// Every frontend that differs.
    pub frontends: usize,
    /// The Services (`namespace/name`) they belong to.
    pub services: BTreeSet<String>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let services: Vec<&str> = self.services.iter().take(MAX_NAMED).map(String::as_str).collect();
        let more = self.services.len().saturating_sub(services.len());
        write!(
            f,
            "switching to {} would forward {} frontend(s) of {} Service(s) ({}{}) differently than {}, which \
             stays in use: ",
            self.to,
            self.frontends,
            self.services.len(),
            services.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            self.from,
        )?;
        let named: Vec<String> = self
            .named
            .iter()
            .map(|d| {
                format!(
                    "{}: {} {} / {} {}",
                    d.frontend, self.from, d.before, self.to, d.after
                )
            })
            .collect();
        f.write_str(&named.join("; "))
    }
}

struct Judged {
    entry: Arc<ServicePlan>,
    from: Backend,
    to: Backend,
    differences: Vec<Difference>,
}

/// The gate, with what it judged last.
#[derive(Default)]
pub struct SwitchGate {
    /// The header the cache was judged with (node IPs, pod CIDRs, cluster settings).
    header: String,
    /// By the address of the entry's `Arc` (kept alive beside it, so the address is not reused).
    judged: HashMap<usize, Judged>,
}

impl std::fmt::Debug for SwitchGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchGate")
            .field("judged", &self.judged.len())
            .finish_non_exhaustive()
    }
}

/// What of the spec besides its entries a verdict depends on.
fn header_of(spec: &NodeForwardingPlanSpec) -> (String, NodeForwardingPlanSpec) {
    let key = format!("{:?}|{:?}|{:?}", spec.node_ips, spec.pod_cidrs, spec.cluster);
    let header = NodeForwardingPlanSpec {
        node_name: spec.node_name.clone(),
        zone: spec.zone.clone(),
        node_ips: spec.node_ips.clone(),
        pod_cidrs: spec.pod_cidrs.clone(),
        backend: spec.backend,
        cluster: spec.cluster.clone(),
        leaving: None,
        revision: spec.revision.clone(),
        views: Vec::new(),
        endpoints_on_node: Vec::new(),
        summary: Default::default(),
        local_endpoints: Vec::new(),
        overrides: Vec::new(),
        services: Vec::new(),
    };
    (key, header)
}

/// The frontends of `entry` whose verdict differs between `from` and `to`.
fn judge(
    header: &NodeForwardingPlanSpec,
    entry: &Arc<ServicePlan>,
    from: Backend,
    to: Backend,
) -> Vec<Difference> {
    let mut one = header.clone();
    one.services = vec![Arc::clone(entry)];
    let frontends = of_entry(&one, entry);
    let before = model::verdicts(&one, from, &frontends);
    let after = model::verdicts(&one, to, &frontends);
    frontends
        .into_iter()
        .zip(before.into_iter().zip(after))
        .filter(|(_, (before, after))| !before.agrees(after))
        .map(|(frontend, (before, after))| Difference {
            frontend,
            before,
            after,
        })
        .collect()
}

impl SwitchGate {
    /// Judges a switch of `spec` (without the entries in `skip`) from `from` to `to`.
    pub fn check(
        &mut self,
        spec: &NodeForwardingPlanSpec,
        skip: &HashSet<usize>,
        from: Backend,
        to: Backend,
    ) -> Result<(), Refused> {
        let (key, header) = header_of(spec);
        if key != self.header {
            self.judged.clear();
            self.header = key;
        }
        let mut judged = HashMap::with_capacity(spec.services.len());
        let mut refused = Refused {
            from,
            to,
            named: Vec::new(),
            frontends: 0,
            services: BTreeSet::new(),
        };
        for (index, entry) in spec.services.iter().enumerate() {
            if skip.contains(&index) {
                continue;
            }
            let pointer = Arc::as_ptr(entry) as usize;
            let cached = self
                .judged
                .remove(&pointer)
                .filter(|j| Arc::ptr_eq(&j.entry, entry) && j.from == from && j.to == to);
            let done = cached.unwrap_or_else(|| Judged {
                entry: Arc::clone(entry),
                from,
                to,
                differences: judge(&header, entry, from, to),
            });
            if !done.differences.is_empty() {
                refused.frontends += done.differences.len();
                refused.services.insert(entry.service_key().to_string());
                let room = MAX_NAMED.saturating_sub(refused.named.len());
                refused.named.extend(done.differences.iter().take(room).cloned());
            }
            judged.insert(pointer, done);
        }
        self.judged = judged;
        if refused.frontends == 0 {
            Ok(())
        } else {
            Err(refused)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::testing::{EndpointExt, EntryExt, entry, ep, plan};

    fn weighted(name: &str, ip: &str) -> ServicePlan {
        entry(name, ip, 80)
            .with(ep("10.244.2.1", 8080).weight(3))
            .with(ep("10.244.3.1", 8080))
    }

    #[test]
    fn a_switch_is_judged_by_every_frontends_verdict() {
        let plain = entry("ns/plain:http", "10.96.0.1", 80).with(ep("10.244.2.1", 8080));
        /// Frontends that differ and the Services named, or `None`: the switch passes.
        type Want = Option<(usize, &'static [&'static str])>;
        let cases: [(&str, Vec<ServicePlan>, Backend, Backend, Want); 5] = [
            (
                "plain services switch",
                vec![plain.clone()],
                Backend::Ipvs,
                Backend::Nftables,
                None,
            ),
            (
                "weights change the spread",
                vec![plain.clone(), weighted("ns/w:http", "10.96.0.2")],
                Backend::Ipvs,
                Backend::Nftables,
                Some((1, &["ns/w"])),
            ),
            (
                "the way back too",
                vec![weighted("ns/w:http", "10.96.0.2")],
                Backend::Iptables,
                Backend::Ipvs,
                Some((1, &["ns/w"])),
            ),
            (
                "weights do not matter between iptables and nftables",
                vec![weighted("ns/w:http", "10.96.0.2")],
                Backend::Iptables,
                Backend::Nftables,
                None,
            ),
            (
                "every Service is counted",
                vec![
                    weighted("ns/a:http", "10.96.0.2"),
                    weighted("ns/b:http", "10.96.0.3").node_port(30080),
                    weighted("ns/c:http", "10.96.0.4"),
                    weighted("ns/d:http", "10.96.0.5"),
                ],
                Backend::Ipvs,
                Backend::Iptables,
                Some((5, &["ns/a", "ns/b", "ns/c", "ns/d"])),
            ),
        ];
        for (name, entries, from, to, want) in cases {
            let spec = plan("node-a", entries);
            let got = SwitchGate::default().check(&spec, &HashSet::new(), from, to);
            match (got, want) {
                (Ok(()), None) => {}
                (Err(refused), Some((frontends, services))) => {
                    assert_eq!(refused.frontends, frontends, "{name}: {refused}");
                    let listed: Vec<&str> = refused.services.iter().map(String::as_str).collect();
                    assert_eq!(listed, services, "{name}");
                    assert!(refused.named.len() <= MAX_NAMED, "{name}");
                }
                (got, want) => panic!("{name}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_refusal_names_the_frontends_and_both_verdicts() {
        let spec = plan("node-a", vec![weighted("ns/w:http", "10.96.0.2")]);
        let refused = SwitchGate::default()
            .check(&spec, &HashSet::new(), Backend::Ipvs, Backend::Nftables)
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "switching to nftables would forward 1 frontend(s) of 1 Service(s) (ns/w) differently than ipvs, \
             which stays in use: ns/w:http 10.96.0.2:80/tcp: ipvs forwards to 10.244.2.1:8080 75.0%, \
             10.244.3.1:8080 25.0% / nftables forwards to 10.244.2.1:8080 50.0%, 10.244.3.1:8080 50.0%"
        );
    }

    #[test]
    fn skipped_entries_are_not_judged_and_unchanged_ones_are_not_judged_again() {
        let mut spec = plan(
            "node-a",
            vec![
                weighted("ns/a:http", "10.96.0.2"),
                entry("ns/b:http", "10.96.0.3", 80).with(ep("10.244.2.1", 8080)),
            ],
        );
        let mut gate = SwitchGate::default();
        assert!(
            gate.check(&spec, &HashSet::from([0]), Backend::Ipvs, Backend::Nftables)
                .is_ok()
        );
        assert!(
            gate.check(&spec, &HashSet::new(), Backend::Ipvs, Backend::Nftables)
                .is_err()
        );
        assert_eq!(gate.judged.len(), 2);
        // The weighted entry without weights: judged afresh, the other kept.
        let kept = Arc::as_ptr(&spec.services[1]) as usize;
        spec.services[0] = Arc::new(entry("ns/a:http", "10.96.0.2", 80).with(ep("10.244.2.1", 8080)));
        assert!(
            gate.check(&spec, &HashSet::new(), Backend::Ipvs, Backend::Nftables)
                .is_ok()
        );
        assert!(gate.judged.contains_key(&kept));
        assert_eq!(gate.judged.len(), 2, "the replaced entry is forgotten");
    }
}
