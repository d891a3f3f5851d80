//! The gates, as the controller reads them from a node's plan status: did the switch happen and pass
//! its agent's verification, and does the node keep passing while it bakes. Pure: a plan view in, a
//! verdict out.
//!
//! ```text
//! Switching: plan asks for the target? applied by the agent? ─ no ─► Pending (until switchTimeout)
//!              │ refused (BackendSwitchRefused: verdicts differ) ─► Failed { gate: verdicts }
//!              │ fell back (BackendFallback: the target cannot run) ─► Failed { gate: backend }
//!              │ ApplyFailed ─► Failed { gate: applied }
//!              ▼ backend in use = target, verification of it since the switch
//!            kernel, probes (as the rollout's gates ask) ─► Verified { baseline } | Failed
//! Baking:    backend still the target, Applied, no drift repaired since the baseline, the latest
//!            verification still passing, no refusal the plan does not explain since the baseline
//! ```

use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, status as cond};
use switchyard_api::rollout::{GateBaseline, RolloutGates};
use switchyard_api::verification::Verification;
use switchyard_api::{Backend, NodeForwardingPlanStatus, PlanCondition};

use super::world::{PlanView, World};

/// Gate names, as Events and messages say them.
pub mod names {
    /// The agent refused the switch: another verdict under the target's rendering.
    pub const VERDICTS: &str = "verdicts";
    /// The target backend cannot run on the node.
    pub const BACKEND: &str = "backend";
    /// Applied, without drift.
    pub const APPLIED: &str = "applied";
    /// The kernel agrees with the plan.
    pub const KERNEL: &str = "kernel";
    /// TCP connects from the node.
    pub const PROBES: &str = "probes";
    /// No refusal the plan does not explain.
    pub const REFUSED: &str = "refusedConnections";
    /// No verified switch within `switchTimeoutSeconds`.
    pub const TIMEOUT: &str = "switchTimeout";
}

/// A gate that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFailure {
    /// Which gate ([`names`]).
    pub gate: &'static str,
    /// Why, in words.
    pub why: String,
}

impl GateFailure {
    fn new(gate: &'static str, why: impl Into<String>) -> Self {
        Self {
            gate,
            why: why.into(),
        }
    }
}

/// Where a switching node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchCheck {
    /// Not there yet: what it waits for.
    Pending(String),
    /// Switched and verified; the counters the bake compares against.
    Verified(GateBaseline),
    /// A gate failed.
    Failed(GateFailure),
}

fn condition<'a>(status: &'a NodeForwardingPlanStatus, kind: &str) -> Option<&'a PlanCondition> {
    status.conditions.iter().find(|c| c.type_ == kind)
}

/// Why the backend in use is not the target, when the agent said it will not be.
fn refused(status: &NodeForwardingPlanStatus, target: Backend) -> Option<GateFailure> {
    let degraded = condition(status, DEGRADED).filter(|c| c.status == cond::TRUE)?;
    let why = status
        .backend_reason
        .clone()
        .unwrap_or_else(|| degraded.message.clone());
    match degraded.reason.as_str() {
        reasons::BACKEND_SWITCH_REFUSED => Some(GateFailure::new(names::VERDICTS, why)),
        reasons::BACKEND_FALLBACK => Some(GateFailure::new(
            names::BACKEND,
            format!("{target} cannot run on the node: {why}"),
        )),
        _ => None,
    }
}

/// The verification's own checks, as the gates ask.
fn verified(verification: &Verification, gates: &RolloutGates) -> Result<(), GateFailure> {
    let kernel = &verification.kernel;
    if gates.kernel && !kernel.passed() {
        let why = match &kernel.error {
            Some(error) => format!("the kernel could not be compared with the plan: {error}"),
            None => format!(
                "{} of {} frontends differ from the plan: {}",
                kernel.mismatches,
                kernel.frontends,
                kernel.examples.join("; ")
            ),
        };
        return Err(GateFailure::new(names::KERNEL, why));
    }
    if gates.probes
        && let Some(probes) = &verification.probes
        && !probes.passed()
    {
        return Err(GateFailure::new(
            names::PROBES,
            format!(
                "{} of {} connections from the node failed: {}",
                probes.failed,
                probes.sampled,
                probes.examples.join("; ")
            ),
        ));
    }
    Ok(())
}

fn unexpected_refusals(verification: Option<&Verification>) -> u64 {
    verification
        .and_then(|v| v.refused.as_ref())
        .map_or(0, |r| r.unexpected)
}

/// A switching node (its label set to `target` at `since`).
pub fn switched(
    world: &World,
    gates: &RolloutGates,
    target: Backend,
    plan: Option<&PlanView>,
    since: Option<&str>,
) -> SwitchCheck {
    let waited = world.elapsed(since);
    let pending = |why: String| {
        if waited.as_secs() >= i64::from(gates.switch_timeout_seconds) {
            SwitchCheck::Failed(GateFailure::new(
                names::TIMEOUT,
                format!("not switched within {} s: {why}", gates.switch_timeout_seconds),
            ))
        } else {
            SwitchCheck::Pending(why)
        }
    };
    let Some(plan) = plan else {
        return pending("the node has no plan".into());
    };
    if plan.backend != target {
        return pending(format!("its plan still asks for {}", plan.backend));
    }
    let Some(status) = &plan.status else {
        return pending("its agent has reported nothing".into());
    };
    if status.observed_revision.as_deref() != Some(plan.revision.as_str()) {
        if gates.applied
            && let Some(applied) = condition(status, APPLIED)
            && applied.status == cond::FALSE
            && applied.reason == reasons::APPLY_FAILED
        {
            return SwitchCheck::Failed(GateFailure::new(
                names::APPLIED,
                format!("{target} could not program the plan: {}", applied.message),
            ));
        }
        return pending(format!(
            "its agent has not applied revision {} yet",
            plan.revision
        ));
    }
    if status.backend != Some(target) {
        if let Some(failure) = refused(status, target) {
            return SwitchCheck::Failed(failure);
        }
        return pending(format!(
            "its agent still uses {}",
            status.backend.map_or("nothing".to_owned(), |b| b.to_string())
        ));
    }
    let verification = status
        .verification
        .as_ref()
        .filter(|v| v.backend == target && World::not_before(&v.at, since));
    let Some(verification) = verification else {
        return pending(format!("waiting for its agent to verify {target}"));
    };
    if let Err(failure) = verified(verification, gates) {
        return SwitchCheck::Failed(failure);
    }
    SwitchCheck::Verified(GateBaseline {
        drift_repairs: status.drift_repairs,
        unexpected_refusals: unexpected_refusals(Some(verification)),
    })
}

/// A baking node: `Err` names the first gate that no longer holds. A node without a plan or status
/// (being recreated) is given the benefit of the doubt until its agent reports.
pub fn baking(
    gates: &RolloutGates,
    target: Backend,
    plan: Option<&PlanView>,
    baseline: &GateBaseline,
) -> Result<(), GateFailure> {
    let Some(status) = plan.and_then(|p| p.status.as_ref()) else {
        return Ok(());
    };
    if status.backend != Some(target) {
        return Err(refused(status, target).unwrap_or_else(|| {
            GateFailure::new(
                names::BACKEND,
                format!(
                    "the agent went back to {}",
                    status.backend.map_or("nothing".to_owned(), |b| b.to_string())
                ),
            )
        }));
    }
    if gates.applied {
        if let Some(applied) = condition(status, APPLIED).filter(|c| c.status != cond::TRUE) {
            return Err(GateFailure::new(
                names::APPLIED,
                format!(
                    "Applied is {} ({}): {}",
                    applied.status, applied.reason, applied.message
                ),
            ));
        }
        if status.drift_repairs > baseline.drift_repairs {
            return Err(GateFailure::new(
                names::APPLIED,
                format!(
                    "the agent repaired drift {} times while the node baked: the kernel lost rules it had programmed",
                    status.drift_repairs - baseline.drift_repairs
                ),
            ));
        }
    }
    let verification = status.verification.as_ref().filter(|v| v.backend == target);
    if let Some(verification) = verification {
        verified(verification, gates)?;
    }
    let refusals = unexpected_refusals(verification);
    if gates.refused_connections && refusals > baseline.unexpected_refusals {
        let examples = verification
            .and_then(|v| v.refused.as_ref())
            .map(|r| r.examples.join("; "))
            .unwrap_or_default();
        return Err(GateFailure::new(
            names::REFUSED,
            format!(
                "{} connections refused that the plan does not refuse: {examples}",
                refusals - baseline.unexpected_refusals
            ),
        ));
    }
    Ok(())
}
