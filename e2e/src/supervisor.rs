//! Processes the lab runs inside its namespaces: argv ─► `ip netns exec <netns> argv…` ─► [`ChildHandle`].
//!
//! ```text
//! Lab::spawn_in ─► Supervisor::spawn ─► child (own process group, stdin /dev/null,
//!                                        stdout/stderr ─► <state>/logs/<n>-<label>.{stdout,stderr})
//!                      │ keeps a handle
//!                      ▼
//!               Supervisor::stop_all (teardown): SIGTERM, grace, SIGKILL, reap
//! ```
//!
//! Children get their own process group so a terminal's Ctrl-C reaches only the lab, which then stops
//! them in order. Anything a child leaves behind inside the namespace is killed by the teardown scan.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{
    command::{self, IP},
    error::{LabError, Result},
    registry::{self, LiveLab},
};

/// How often exit and log polling looks again.
const POLL: Duration = Duration::from_millis(10);

/// A process started by the lab. Cloning shares the same process.
#[derive(Clone, Debug)]
pub struct ChildHandle {
    inner: Arc<Supervised>,
}

#[derive(Debug)]
struct Supervised {
    lab: String,
    label: String,
    pid: u32,
    child: Mutex<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// Where a child's stdout goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stdout {
    /// To its log file.
    Log,
    /// To a pipe the caller reads (for a readiness line).
    Pipe,
}

/// Starts and stops the lab's processes.
#[derive(Debug)]
pub(crate) struct Supervisor {
    lab: String,
    logs: PathBuf,
    next: AtomicUsize,
    children: Mutex<Vec<ChildHandle>>,
}

impl Supervisor {
    /// A supervisor for lab `lab`, logging under `logs`.
    pub fn new(lab: &str, logs: PathBuf) -> Self {
        Supervisor {
            lab: lab.to_owned(),
            logs,
            next: AtomicUsize::new(0),
            children: Mutex::new(Vec::new()),
        }
    }

    /// Starts `argv` inside namespace `netns`.
    pub fn spawn(
        &self,
        netns: &str,
        label: &str,
        argv: &[String],
        stdout: Stdout,
    ) -> Result<(ChildHandle, Option<ChildStdout>)> {
        let entry = [IP.to_owned(), "netns".into(), "exec".into(), netns.to_owned()];
        self.spawn_entered(&entry, label, argv, stdout)
    }

    /// Starts `argv` behind `entry`, a command that enters somewhere and runs the rest (`ip netns exec
    /// NS`, `nsenter -t PID -m -n --`, …); an empty `entry` runs it here.
    pub fn spawn_entered(
        &self,
        entry: &[String],
        label: &str,
        argv: &[String],
        stdout: Stdout,
    ) -> Result<(ChildHandle, Option<ChildStdout>)> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let stem = format!("{seq:03}-{}", sanitize(label));
        let stdout_path = self.logs.join(format!("{stem}.stdout"));
        let stderr_path = self.logs.join(format!("{stem}.stderr"));
        let mut all = entry.iter().chain(argv);
        let Some(program) = all.next() else {
            return Err(LabError::Refused(format!("{label}: an empty command line")));
        };
        let mut cmd = Command::new(program);
        cmd.args(all)
            .process_group(0)
            .stdin(Stdio::null())
            .stderr(create(&stderr_path)?);
        match stdout {
            Stdout::Log => cmd.stdout(create(&stdout_path)?),
            Stdout::Pipe => cmd.stdout(Stdio::piped()),
        };
        // NB: spawn and record the pid under the registry lock, so a signal teardown sees every child.
        let mut live = registry::lock();
        let mut child = cmd.spawn().map_err(|source| LabError::Spawn {
            command: command::describe(&cmd),
            source,
        })?;
        if let Some(lab) = live.get_mut(&self.lab) {
            lab.pids.insert(child.id());
        }
        drop(live);
        let pipe = child.stdout.take();
        let handle = ChildHandle {
            inner: Arc::new(Supervised {
                lab: self.lab.clone(),
                label: label.to_owned(),
                pid: child.id(),
                child: Mutex::new(child),
                stdout: stdout_path,
                stderr: stderr_path,
            }),
        };
        self.lock().push(handle.clone());
        Ok((handle, pipe))
    }

    /// Stops every child: SIGTERM, up to `grace` to exit, then SIGKILL; all are reaped.
    pub fn stop_all(&self, grace: Duration) {
        let children = std::mem::take(&mut *self.lock());
        for child in &children {
            child.signal(Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        for child in &children {
            child.wait_until(deadline);
        }
        for child in &children {
            child.kill_and_reap();
        }
    }

    /// Forgets every child without stopping it (the lab is kept).
    pub fn detach_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, Vec<ChildHandle>> {
        self.children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ChildHandle {
    /// What the lab called it.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// Its stdout log (empty for processes whose stdout the lab reads itself).
    pub fn stdout_path(&self) -> &Path {
        &self.inner.stdout
    }

    /// Its stderr log.
    pub fn stderr_path(&self) -> &Path {
        &self.inner.stderr
    }

    /// Everything it wrote to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.inner.stdout).unwrap_or_default()
    }

    /// Everything it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.inner.stderr).unwrap_or_default()
    }

    /// Its exit status, if it has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut live = registry::lock();
        let status = self.lock().try_wait().ok().flatten();
        if status.is_some() {
            self.forget_pid(&mut live);
        }
        status
    }

    /// True while it runs.
    pub fn is_running(&self) -> bool {
        self.exit_status().is_none()
    }

    /// Stops it: SIGTERM, up to `grace` to exit, then SIGKILL.
    pub fn stop(&self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::SIGTERM);
        self.wait_until(Instant::now() + grace)
            .or_else(|| self.kill_and_reap())
    }

    /// Kills it and every process of its group with SIGKILL at once (as the kubelet kills a pod's
    /// container: no chance to clean up), then reaps it.
    pub fn kill_group(&self) -> Option<ExitStatus> {
        {
            let _live = registry::lock();
            let mut child = self.lock();
            if let (Ok(None), Ok(pid)) = (child.try_wait(), i32::try_from(self.pid())) {
                // The child leads its own process group (spawned with process_group(0)).
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        self.kill_and_reap()
    }

    /// Waits until its stdout or stderr contains `needle` (e.g. an agent's "applied" log line).
    ///
    /// Fails early when it exits first, or after `timeout`.
    pub fn wait_for_output(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stdout().contains(needle) || self.stderr().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.exit_status() {
                return Err(self.exited_early(status));
            }
            if Instant::now() >= deadline {
                return Err(LabError::Timeout {
                    what: format!("{:?} in the output of {}", needle, self.label()),
                    waited_ms: timeout.as_millis(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Reads the first line of `pipe` (its stdout) and checks it is `expected`, within `timeout`.
    pub(crate) fn await_line(&self, pipe: ChildStdout, expected: &str, timeout: Duration) -> Result<()> {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(pipe).read_line(&mut line).map(|_| line);
            let _ = sender.send(read);
        });
        match receiver.recv_timeout(timeout) {
            Ok(Ok(line)) if line.trim_end() == expected => Ok(()),
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // NB: EOF or a wrong line: the process failed; give it a moment to be reapable.
                let status = self.wait_until(Instant::now() + Duration::from_secs(1));
                let status = status.map_or_else(|| "still running".to_owned(), |s| s.to_string());
                Err(LabError::ExitedEarly {
                    what: self.label().to_owned(),
                    status,
                    stderr: tail(&self.stderr()),
                })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(LabError::Timeout {
                what: format!("{} to print {expected:?}", self.label()),
                waited_ms: timeout.as_millis(),
            }),
        }
    }

    fn exited_early(&self, status: ExitStatus) -> LabError {
        LabError::ExitedEarly {
            what: self.label().to_owned(),
            status: status.to_string(),
            stderr: tail(&self.stderr()),
        }
    }

    fn signal(&self, signal: Signal) {
        // NB: check and signal under the locks, so the pid cannot be reaped (and reused) in between.
        let mut live = registry::lock();
        let mut child = self.lock();
        match child.try_wait() {
            Ok(None) => {
                if let Ok(pid) = i32::try_from(self.pid()) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
                }
            }
            Ok(Some(_)) => {
                drop(child);
                self.forget_pid(&mut live);
            }
            Err(_) => {}
        }
    }

    fn wait_until(&self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    fn kill_and_reap(&self) -> Option<ExitStatus> {
        let mut live = registry::lock();
        let mut child = self.lock();
        let _ = child.kill();
        let status = child.wait().ok();
        drop(child);
        self.forget_pid(&mut live);
        status
    }

    fn forget_pid(&self, live: &mut BTreeMap<String, LiveLab>) {
        if let Some(lab) = live.get_mut(&self.inner.lab) {
            lab.pids.remove(&self.inner.pid);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Child> {
        self.inner
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn create(path: &Path) -> Result<File> {
    File::create(path).map_err(|source| LabError::File {
        action: "creating",
        path: path.to_path_buf(),
        source,
    })
}

fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect()
}

/// The last lines of a log, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
