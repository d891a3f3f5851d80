//! The labs this process has up, for the signal handler: lab id ─► state directory + child pids.
//!
//! ```text
//! Lab::up ── create namespaces (lock held) ─► register ─┐
//! Supervisor::spawn ── spawn (lock held) ─► add pid     ├─► teardown_live_labs (signal): lock, kill pids,
//! ChildHandle reaps ── (lock held) ─► remove pid        │   delete namespaces, exit with the lock held
//! Lab::drop / keep ──────────────────► unregister ──────┘
//! ```
//!
//! Spawning and namespace creation happen under the lock, so once the signal handler holds it no
//! new process or namespace can appear behind its back. Pids leave the set only when reaped, so a
//! recorded pid never belongs to an unrelated process.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Mutex, MutexGuard},
};

use crate::state::LabState;

/// A lab this process has up.
#[derive(Debug)]
pub(crate) struct LiveLab {
    /// Its files (the manifest lists its namespaces).
    pub state: LabState,
    /// Processes it started that are not reaped yet.
    pub pids: BTreeSet<u32>,
}

static LIVE: Mutex<BTreeMap<String, LiveLab>> = Mutex::new(BTreeMap::new());

/// Locks the registry (a poisoned lock is still usable: every update leaves the map consistent).
pub(crate) fn lock() -> MutexGuard<'static, BTreeMap<String, LiveLab>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records a lab as up.
pub(crate) fn register(live: &mut BTreeMap<String, LiveLab>, state: &LabState) {
    live.insert(
        state.id().to_owned(),
        LiveLab {
            state: state.clone(),
            pids: BTreeSet::new(),
        },
    );
}
