//! The one error type of the controller crate.

/// What failed in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    ReadFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A cluster dump could not be parsed.
    #[error("{path}: {message}")]
    ParseInput {
        /// The file.
        path: String,
        /// What and where (line/column or item index).
        message: String,
    },
    /// The configuration file is invalid.
    #[error("{path}: invalid configuration:\n  {}", problems.join("\n  "))]
    InvalidConfig {
        /// The file.
        path: String,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// A plan could not be serialised.
    #[error("serialising plans: {0}")]
    Serialize(String),
    /// The API crate failed (hashing, CRD generation).
    #[error(transparent)]
    Api(#[from] switchyard_api::Error),
}

impl Error {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ReadFile { .. } => "read_file",
            Self::ParseInput { .. } => "parse_input",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::Serialize(_) => "serialize",
            Self::Api(_) => "api",
        }
    }
}
