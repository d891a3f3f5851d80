//! `explain --kernel` on the nftables backend: the elements keyed by the packet's frontend and the
//! chains they lead to, as our table holds them, against what the plan renders.
//!
//! ```text
//! nft list table (TableState) ─┬─► elements on the packet's path ─► missing, extra, different ─► drift
//! render(plan) (TableState) ───┘   chains they goto ─► rule count and digest ──────────────────┘
//! ```

use switchyard_api::{IpFamily, NodeForwardingPlanSpec};

use crate::backend::HostFacts;
use crate::explain::question::node_ips;
use crate::explain::words::{Explanation, Outcome};
use crate::xtables::Packet;

/// `--kernel` with the nftables backend: compares what the plan renders with what our table holds, for
/// the elements keyed by this packet's frontend (ClusterIP, external or LB address and port, or its
/// NodePort) and the chains they jump to. The outcome stays the plan's (there is no nftables packet
/// model yet); `found` is `None` when the table is missing, and then nothing of ours touches the packet.
pub fn compare_kernel(
    spec: &NodeForwardingPlanSpec,
    explanation: &mut Explanation,
    packet: &Packet,
    facts: &HostFacts,
    found: Option<&crate::nftables::model::TableState>,
) {
    use crate::nftables::model::{Key, TableState};
    let family = IpFamily::of(&packet.dest);
    let Some(found) = found else {
        explanation.drift = Some(vec![format!(
            "table {} switchyard is missing: no rule of ours sees this packet",
            crate::nftables::model::family_keyword(family)
        )]);
        explanation.outcome = Outcome::NotAService;
        return;
    };
    let expected = crate::nftables::render(
        spec,
        facts,
        family,
        &switchyard_api::validate::validate(spec).bad_entries(),
    );
    let local = node_ips(spec).contains(&packet.dest);
    let on_path = |key: &Key| match *key {
        Key::Frontend(ip, proto, port) | Key::FrontendSlot(ip, proto, port, _) => {
            ip == packet.dest && proto == packet.protocol && port == packet.dest_port
        }
        Key::Port(proto, port) | Key::PortSlot(proto, port, _) => {
            local && proto == packet.protocol && port == packet.dest_port
        }
        Key::Addr(_) | Key::Hairpin(..) => false,
    };
    let elements = |state: &TableState| {
        let mut list: Vec<(String, Key, String)> = state
            .elements
            .iter()
            .flat_map(|(id, elements)| {
                elements
                    .iter()
                    .filter(|(key, _)| on_path(key))
                    .map(move |(key, claim)| (id.name(), *key, claim.value.to_string()))
            })
            .collect();
        list.sort();
        list
    };
    let (want, have) = (elements(&expected), elements(found));
    let mut drift = Vec::new();
    let mut chains: Vec<String> = Vec::new();
    for (set, key, value) in &want {
        if let Some(chain) = value.strip_prefix("goto ") {
            chains.push(chain.to_string());
        }
        match have.iter().find(|(s, k, _)| s == set && k == key) {
            None => drift.push(format!("{set}: the kernel lacks the element {key} : {value}")),
            Some((_, _, kernel)) if kernel != value => {
                drift.push(format!("{set} element {key}: kernel `{kernel}`, plan `{value}`"))
            }
            Some(_) => {}
        }
    }
    for (set, key, value) in &have {
        if !want.iter().any(|(s, k, _)| s == set && k == key) {
            drift.push(format!("{set}: the kernel has an extra element {key} : {value}"));
        }
    }
    for chain in chains {
        let summary = |state: &TableState| state.chains.get(&chain).map(|c| c.summary());
        match (summary(&expected), summary(found)) {
            (Some(_), None) => drift.push(format!("chain {chain} is missing from the kernel")),
            (Some(want), Some(have)) if want != have => drift.push(format!(
                "chain {chain}: the kernel holds {} rules (digest {}), the plan {} (digest {})",
                have.0,
                have.1.unwrap_or_default(),
                want.0,
                want.1.unwrap_or_default()
            )),
            _ => {}
        }
    }
    explanation.steps.push(
        "kernel (nftables): the elements for this frontend and the chains they lead to were read back and \
         compared with the plan; the outcome shown is the plan's"
            .to_string(),
    );
    explanation.drift = Some(drift);
}
