//! Log set-up for both binaries: `--log-format text|json` to standard error, `RUST_LOG` filters.
//!
//! ```text
//! RUST_LOG (default "info" for `run`, "warn" for one-shot commands) ─► EnvFilter ─► fmt (text, colour only at a terminal) | json ─► stderr
//! ```

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Installs the global subscriber for a long-running command (`run`: progress is worth a line). A
/// second call (an embedding binary, tests) keeps the first.
pub fn init_logging(format: LogFormat) {
    init_logging_at(format, "info");
}

/// Installs the global subscriber with `default` as the level when `RUST_LOG` is not set: `warn` for a
/// one-shot command, whose output is its answer and whose progress is nobody's business.
pub fn init_logging_at(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in a file or journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
