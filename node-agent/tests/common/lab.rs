//! Throwaway network namespaces for tests against the real kernel. Root only: when not root the tests
//! panic with a clear message, unless `SWITCHYARD_SKIP_LAB=1`, which makes them print a skip line
//! (the convention of `e2e/tests/common`). Nothing ever runs in the host's own namespace.
//!
//! ```text
//! Netns::new("apply") ─► ip netns add swyd-agent-<pid>-<n>-apply, lo up
//!   .sh("iptables-save -t nat") / .agent(["apply", …]) / .spawn_agent(["run", …])   (ip netns exec …)
//! drop ─► ip netns del   (every rule in it goes with it), its scratch directory removed
//! ```
//!
//! Shared by the test binaries through `#[path]`; each uses part of it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The agent binary under test.
pub const AGENT: &str = env!("CARGO_BIN_EXE_switchyard-agent");

/// True when kernel tests can run; false (after printing a skip line) when not root and
/// `SWITCHYARD_SKIP_LAB=1`; panics when not root otherwise.
pub fn lab_allowed(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("SWITCHYARD_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skip {test}: needs root for network namespaces (SWITCHYARD_SKIP_LAB=1)");
        return false;
    }
    panic!(
        "{test}: the kernel tests need root, iproute2 and iptables (they run in throwaway network \
         namespaces); run them as root, or set SWITCHYARD_SKIP_LAB=1 to skip them"
    );
}

/// Effective uid 0, from `/proc/self/status`.
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .and_then(|line| line.split_whitespace().nth(2))
        == Some("0")
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace deleted on drop, with a scratch directory.
pub struct Netns {
    pub name: String,
    pub dir: PathBuf,
    /// Holds `dir`: removed after the namespace, also when the test fails.
    _scratch: switchyard_test_support::scratch::TempDir,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("swyd-agent-{}-{n}-{tag}", std::process::id());
        let status = Command::new("ip").args(["netns", "add", &name]).status().unwrap();
        assert!(status.success(), "ip netns add {name}");
        let scratch = switchyard_test_support::scratch::dir(&name).unwrap();
        let netns = Self {
            dir: scratch.path().to_path_buf(),
            name,
            _scratch: scratch,
        };
        netns.sh("ip link set lo up");
        netns
    }

    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Runs a shell script inside; panics unless it succeeds; returns stdout.
    pub fn sh(&self, script: &str) -> String {
        let out = self.command("sh").args(["-c", script]).output().unwrap();
        assert!(
            out.status.success(),
            "{script}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the agent inside to completion.
    pub fn agent(&self, args: &[&str]) -> Output {
        self.command(AGENT).args(args).output().unwrap()
    }

    /// Starts the agent inside; its stderr goes to [`Netns::agent_log`] (a file, so a chatty agent
    /// can never block on a full pipe).
    pub fn spawn_agent(&self, args: &[&str]) -> Child {
        let log = std::fs::File::create(self.path("agent.log")).unwrap();
        self.command(AGENT)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// What the agent started by [`Netns::spawn_agent`] logged so far.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.path("agent.log")).unwrap_or_default()
    }

    /// `iptables-save` of filter and nat.
    pub fn save(&self) -> String {
        self.sh("iptables-save -t filter; iptables-save -t nat")
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Polls `check` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rules of `chain` in `iptables-save` output.
pub fn rules_in(save: &str, chain: &str) -> usize {
    save.lines()
        .filter(|l| l.starts_with(&format!("-A {chain} ")))
        .count()
}

/// Writes `text` atomically (so a polling agent never reads half a file).
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
