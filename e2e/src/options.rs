//! How a lab is built: options ─► `Layout::plan` (addresses, gateway) and `Lab::up` (paths, deadlines).
//!
//! [`LabOptions::default`] is the lab described in the design: the external client at
//! `192.168.10.200/24` on the fabric, routed through the first node, state under `/tmp/switchyard-lab`,
//! backends served by the `switchyard-lab` binary found next to the running executable.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

/// Where lab state (manifests, logs, plans) lives unless `SWITCHYARD_LAB_DIR` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/tmp/switchyard-lab";
/// The binary that serves backends, unless `SWITCHYARD_LAB_BIN` names another.
pub const LAB_BINARY_NAME: &str = "switchyard-lab";

/// Options for [`crate::Lab::up_with`].
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// The `switchyard-lab` binary whose `serve` subcommand runs in every pod.
    pub lab_binary: PathBuf,
    /// The external client's address on the fabric (outside every pod CIDR).
    pub client_ip: Ipv4Addr,
    /// The fabric subnet's prefix length; node InternalIPs and the client must share that subnet.
    pub fabric_prefix_len: u8,
    /// The node the client routes service, external and load-balancer IPs through (default: the first).
    pub client_gateway: Option<String>,
    /// An outside load balancer's address on the fabric: the lab then has a `<id>-balancer` namespace
    /// there (for `Lab::start_balancer`); none by default.
    pub balancer_ip: Option<Ipv4Addr>,
    /// Directory holding one sub-directory per lab (manifest, logs, plans).
    pub state_dir: PathBuf,
    /// How long `up` waits for every backend to report ready.
    pub ready_timeout: Duration,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            lab_binary: locate_lab_binary(),
            client_ip: Ipv4Addr::new(192, 168, 10, 200),
            fabric_prefix_len: 24,
            client_gateway: None,
            balancer_ip: None,
            state_dir: default_state_dir(),
            ready_timeout: Duration::from_secs(10),
        }
    }
}

impl LabOptions {
    /// Default options with an explicit `switchyard-lab` binary (tests pass
    /// `env!("CARGO_BIN_EXE_switchyard-lab")`).
    pub fn with_binary(lab_binary: impl Into<PathBuf>) -> Self {
        LabOptions {
            lab_binary: lab_binary.into(),
            ..LabOptions::default()
        }
    }
}

/// `$SWITCHYARD_LAB_DIR`, else [`DEFAULT_STATE_DIR`].
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// Finds the `switchyard-lab` binary: `$SWITCHYARD_LAB_BIN`; the running executable if it is that
/// binary; else a `switchyard-lab` beside it or one directory up (integration tests run from
/// `target/<profile>/deps/`).
pub fn locate_lab_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHYARD_LAB_BIN") {
        return PathBuf::from(path);
    }
    let Ok(exe) = std::env::current_exe() else {
        return PathBuf::from(LAB_BINARY_NAME);
    };
    if exe.file_name().is_some_and(|name| name == LAB_BINARY_NAME) {
        return exe;
    }
    let beside = |dir: Option<&Path>| {
        dir.map(|dir| dir.join(LAB_BINARY_NAME))
            .filter(|path| path.is_file())
    };
    let dir = exe.parent();
    beside(dir)
        .or_else(|| beside(dir.and_then(Path::parent)))
        .unwrap_or_else(|| PathBuf::from(LAB_BINARY_NAME))
}
