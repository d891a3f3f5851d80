//! The controller's logs as a service manager sees them: plain text when stderr is not a terminal.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let dir = switchyard_test_support::scratch::dir("logs-test").unwrap();
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    // An API server nobody answers: the controller logs and retries until it is stopped.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {token: x}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-controller"))
        .args(["run", "--metrics-bind", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait().unwrap();
    let mut logs = String::new();
    child.stderr.take().unwrap().read_to_string(&mut logs).unwrap();
    assert!(logs.contains("INFO"), "no log lines:\n{logs}");
    assert!(!logs.contains('\u{1b}'), "colour codes in piped logs:\n{logs:?}");
}
