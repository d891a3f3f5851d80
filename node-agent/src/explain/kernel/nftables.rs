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
use crate::nftables::model::{Key, SetId, TableState};
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
    let family = IpFamily::of(&packet.dest);
    if found.is_none() {
        explanation.outcome = Outcome::NotAService;
    }
    let expected = crate::nftables::render(
        spec,
        facts,
        family,
        &switchyard_api::validate::validate(spec).bad_entries(),
    );
    let local = node_ips(spec).contains(&packet.dest);
    let drift = drift(&expected, found, packet, local);
    if found.is_none() {
        explanation.drift = Some(drift);
        return;
    }
    explanation.steps.push(
        "kernel (nftables): the elements for this frontend and the chains they lead to were read back and \
         compared with the plan; the outcome shown is the plan's"
            .to_string(),
    );
    explanation.drift = Some(drift);
}

/// The elements on `packet`'s path (keyed by its frontend, or by its NodePort when `local`: the
/// destination is a node address), as (set, key, value), sorted: looked up, not searched, so a caller
/// may ask for every frontend of a large table.
fn on_path(state: &TableState, packet: &Packet, local: bool) -> Vec<(String, Key, String)> {
    let (dest, proto, port) = (packet.dest, packet.protocol, packet.dest_port);
    let mut list = Vec::new();
    for (id, elements) in &state.elements {
        let mut keys = vec![Key::Frontend(dest, proto, port)];
        if local {
            keys.push(Key::Port(proto, port));
        }
        match id {
            SetId::FastEps(n) => keys.extend((0..*n).map(|slot| Key::FrontendSlot(dest, proto, port, slot))),
            SetId::FastNpEps(n) if local => keys.extend((0..*n).map(|slot| Key::PortSlot(proto, port, slot))),
            _ => {}
        }
        for key in keys {
            if let Some(claim) = elements.get(&key) {
                list.push((id.name(), key, claim.value.to_string()));
            }
        }
    }
    list.sort();
    list
}

/// Where the kernel's table (`found`; `None`: there is none) differs from the plan's (`expected`) on
/// `packet`'s path: the elements keyed by its frontend (or its NodePort, when `local`) and the chains
/// they lead to.
pub fn drift(expected: &TableState, found: Option<&TableState>, packet: &Packet, local: bool) -> Vec<String> {
    let Some(found) = found else {
        return vec![format!(
            "table {} switchyard is missing: no rule of ours sees this packet",
            crate::nftables::model::family_keyword(expected.family)
        )];
    };
    let (want, have) = (on_path(expected, packet, local), on_path(found, packet, local));
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
        match (summary(expected), summary(found)) {
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
    drift
}
