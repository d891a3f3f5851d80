//! The one error type of this crate.

/// What failed in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CRD could not be serialised to YAML.
    #[error("serialising the CRD to YAML: {0}")]
    SerializeCrd(String),
    /// A plan could not be serialised to JSON (for hashing or size accounting).
    #[error("serialising a plan to JSON: {0}")]
    SerializePlan(#[from] serde_json::Error),
}
