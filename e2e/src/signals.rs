//! Interrupts: SIGINT/SIGTERM ─► tear down every lab this process has up ─► exit 130/143.
//!
//! A background thread runs a small tokio runtime that waits for the signals (tokio installs real
//! handlers process-wide, so this works whatever other threads exist, test harness included). Labs
//! register themselves while they are up (see `registry`).

use std::sync::OnceLock;

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    error::{LabError, Result},
    registry, teardown,
};

static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Installs the teardown-on-signal handler once per process; later calls return the first outcome.
pub fn install_teardown_on_signal() -> Result<()> {
    INSTALLED
        .get_or_init(|| {
            let (ready, installed) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("lab-signals".into())
                .spawn(move || wait_and_tear_down(&ready))
                .map_err(|error| error.to_string())?;
            installed
                .recv()
                .map_err(|_| "the signal thread ended before installing its handlers".to_owned())?
        })
        .clone()
        .map_err(LabError::Signals)
}

fn wait_and_tear_down(ready: &std::sync::mpsc::Sender<std::result::Result<(), String>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(error.to_string()));
            return;
        }
    };
    let code = runtime.block_on(async {
        let handlers =
            signal(SignalKind::interrupt()).and_then(|int| Ok((int, signal(SignalKind::terminate())?)));
        let (mut interrupt, mut terminate) = match handlers {
            Ok(handlers) => handlers,
            Err(error) => {
                let _ = ready.send(Err(error.to_string()));
                return None;
            }
        };
        let _ = ready.send(Ok(()));
        tokio::select! {
            _ = interrupt.recv() => Some(130),
            _ = terminate.recv() => Some(143),
        }
    });
    let Some(code) = code else { return };
    eprintln!("switchyard-lab: interrupted, tearing down");
    // NB: the registry stays locked until exit, so no lab thread spawns or creates anything meanwhile.
    let mut live = registry::lock();
    for problem in teardown::teardown_live_labs(&mut live) {
        eprintln!("switchyard-lab: {problem}");
    }
    std::process::exit(code);
}
