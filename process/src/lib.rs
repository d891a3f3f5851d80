//! Process edges the controller and the agent share, written once.
//!
//! ```text
//! --kubeconfig FILE ─► read ─► config ─┐
//! KUBECONFIG / ~/.kube/config / pod ───┴─► kube::Client      (failures said once, in our words)
//! ```

mod client;
mod error;

pub use client::client;
pub use error::Error;
