//! What an agent found when it checked the backend it switched to: the block of its plan's status a
//! `ForwardingRollout`'s gates read ([`crate::rollout::RolloutGates`]).
//!
//! ```text
//! agent, after a sync with another backend than the last one verified (and at start):
//!   the kernel's rules compared with the plan for every frontend ─► kernel
//!   TCP connects from the node to a sample of ClusterIP frontends with endpoints ─► probes
//!   then every few seconds for a while: refusals the plan does not explain ─► refused
//!   ─► status.verification ─► controller: the rollout's gates
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;

/// The most examples a verification lists per check.
pub const MAX_EXAMPLES: usize = 5;

/// One verification of the backend in use.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// The backend verified.
    pub backend: Backend,
    /// The plan revision it was verified with.
    #[schemars(length(max = 64))]
    pub revision: String,
    /// When (RFC 3339).
    pub at: String,
    /// The kernel's rules compared with the plan, frontend by frontend.
    pub kernel: KernelCheck,
    /// Connections from the node to some of its frontends (absent: none to probe, or probing is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<ProbeCheck>,
    /// Refusals since the verification that the plan does not explain (absent until first counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<RefusedCheck>,
}

impl Verification {
    /// Every check it made passed (refusals are judged by the gate, against a baseline).
    pub fn passed(&self) -> bool {
        self.kernel.passed() && self.probes.as_ref().is_none_or(ProbeCheck::passed)
    }
}

/// The kernel's rules against the plan.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelCheck {
    /// Frontends compared.
    pub frontends: u32,
    /// Frontends whose kernel rules differ from the plan's.
    pub mismatches: u32,
    /// Some of them, with how they differ.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub examples: Vec<String>,
    /// Why the kernel could not be read, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub error: Option<String>,
}

impl KernelCheck {
    /// Read, and no frontend differs.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.mismatches == 0
    }
}

/// TCP connects from the node.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeCheck {
    /// Frontends probed.
    pub sampled: u32,
    /// Probes that failed.
    pub failed: u32,
    /// Some of them (`ns/svc:port 10.96.0.10:80: connection refused`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub examples: Vec<String>,
}

impl ProbeCheck {
    /// No probe failed.
    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

/// Refusals counted by the kernel since the verification, that the plan does not explain: a REJECT of
/// a Service port with endpoints, a DROP of one with local endpoints.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedCheck {
    /// How many.
    pub unexpected: u64,
    /// Where (`ns/svc:port no-endpoints +3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub examples: Vec<String>,
    /// When they were last counted (RFC 3339).
    pub checked_at: String,
}
