//! Shutdown on SIGTERM (the kubelet stopping the pod) or SIGINT (Ctrl-C).
//!
//! ```text
//! shutdown_signal() ─► both handlers installed now (an error now, not a silent never) ─► future
//!                      future completes at the first SIGTERM or SIGINT, and logs which
//! ```

use std::future::Future;

use crate::Error;

/// Installs the handlers now and returns a future that completes at the first SIGTERM or SIGINT.
///
/// Installed before the work starts, so a signal that arrives during start-up is not lost.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>, Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sigterm_completes_the_future_and_does_not_kill_the_process() {
        let stop = shutdown_signal().unwrap();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::time::timeout(std::time::Duration::from_secs(10), stop)
            .await
            .expect("SIGTERM completes the shutdown future");
    }
}
