//! What the planner says about its input: warnings for objects (or parts of objects) it could not use,
//! and notes for objects it skips by design (headless, ExternalName, another proxy's).

use std::fmt;

/// An object, or part of one, the planner could not use. The rest of the input is still planned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Warning {
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: &'static str,
    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub object: String,
    /// What was wrong and what was skipped.
    pub reason: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.object, self.reason)
    }
}

/// Why a Service is not proxied although nothing is wrong with it (kube-proxy skips the same ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// `clusterIP: None` (or empty).
    Headless,
    /// `type: ExternalName`.
    ExternalName,
    /// Labelled `service.kubernetes.io/service-proxy-name` with another proxy's name.
    OtherProxy,
    /// Labelled `service.kubernetes.io/headless` (any value), though it has a ClusterIP.
    HeadlessLabel,
    /// An EndpointSlice labelled `service.kubernetes.io/headless`: its endpoints are not used.
    SliceHeadlessLabel,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Headless => "headless (clusterIP: None): not forwarded",
            Self::ExternalName => "type ExternalName: a DNS name, not forwarded",
            Self::OtherProxy => {
                "labelled service.kubernetes.io/service-proxy-name for another proxy: not forwarded"
            }
            Self::HeadlessLabel => {
                "labelled service.kubernetes.io/headless: not forwarded, as kube-proxy does (remove the label to forward it)"
            }
            Self::SliceHeadlessLabel => {
                "EndpointSlice labelled service.kubernetes.io/headless: its endpoints are not used, as kube-proxy does"
            }
        })
    }
}

/// Warnings and skips collected while planning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// Invalid input, sorted.
    pub warnings: Vec<Warning>,
    /// Services (and EndpointSlices, for [`SkipReason::SliceHeadlessLabel`]) skipped by design:
    /// (`namespace/name`, reason), sorted.
    pub skipped: Vec<(String, SkipReason)>,
}

impl Diagnostics {
    pub(crate) fn warn(&mut self, kind: &'static str, object: &str, reason: impl Into<String>) {
        self.warnings.push(Warning {
            kind,
            object: object.to_string(),
            reason: reason.into(),
        });
    }

    pub(crate) fn sort(&mut self) {
        self.warnings.sort();
        self.warnings.dedup();
        self.skipped.sort();
    }
}
