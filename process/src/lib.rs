//! Process edges the controller and the agent share, written once.
//!
//! ```text
//! --kubeconfig FILE ─► read ─► config ─┐
//! KUBECONFIG / ~/.kube/config / pod ───┴─► kube::Client      (failures said once, in our words)
//! --log-format, RUST_LOG ───────────────► tracing subscriber on stderr
//! --metrics-bind ":PORT" ───────────────► [::]:PORT (both families) ─► /healthz /readyz /metrics
//! SIGTERM | SIGINT ─────────────────────► the shutdown future
//! state files (plan cache, status, …) ──► one fsync'd atomic write
//! every command's end ──────────────────► one table of exit codes (exit)
//! ```

mod atomic;
pub mod bounded;
mod client;
mod error;
pub mod exit;
pub mod http;
mod logging;
mod signals;

pub use atomic::{write_atomic, write_atomic_bytes};
pub use bounded::bounded;
pub use client::client;
pub use error::Error;
pub use logging::{LogFormat, init_logging, init_logging_at};
pub use signals::shutdown_signal;
