//! The one error type of this crate.
//!
//! Variants are named after what failed. Add variants here as the edges grow (restore, netlink, status
//! writes); keep `metric_label` in step so failures can be counted by kind.

/// What failed in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tracer's model of `iptables-restore` rejected a payload, as the kernel would have.
    #[error("simulated iptables-restore failed at line {line}: {reason}")]
    SimulatedRestore {
        /// 1-based line of the payload (0 for the built-in jump rules).
        line: usize,
        /// Why.
        reason: String,
    },
    /// The tracer could not follow a packet through the modelled rules.
    #[error("tracing a packet: {0}")]
    TracePacket(String),
}

impl Error {
    /// A short, stable label for failure metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SimulatedRestore { .. } => "simulated_restore",
            Self::TracePacket(_) => "trace_packet",
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
