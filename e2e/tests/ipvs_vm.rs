//! The IPVS backend on a real kernel: runs `e2e/ipvs-vm/run.sh`, which boots Debian's kernel in qemu
//! (software emulation) with this package's `switchyard-lab` binary and runs the IPVS scenarios inside
//! (schedulers, persistence, NodePort, eTP=Local, REJECT/DROP, graceful removal, drift, fallback to
//! iptables without ip_vs, backend switches, cleanup; IPVS → nftables and back under traffic and a switch
//! the verdict gate refuses: `switch.sh`). This machine's own kernel has no ip_vs.
//!
//! The script installs what it needs from Debian (root and apt access) and caches the kernel in
//! `~/.cache/switchyard/ipvs-vm`. Where it cannot be set up the test fails saying so, unless
//! `SWITCHYARD_SKIP_VM=1`, which turns it into a skip line.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Exit status of run.sh when the VM could not be set up (tools, kernel).
const SETUP_FAILED: i32 = 2;

#[test]
fn ipvs_scenarios_in_a_vm() {
    if std::env::var("SWITCHYARD_SKIP_VM").as_deref() == Ok("1") {
        eprintln!("skip ipvs_scenarios_in_a_vm: SWITCHYARD_SKIP_VM=1");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ipvs-vm/run.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .args(["--binary", env!("CARGO_BIN_EXE_switchyard-lab")])
        .output()
        .expect("run e2e/ipvs-vm/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let closing = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("ipvs-vm: "))
        .unwrap_or("ipvs-vm: no closing line");
    eprintln!("{closing} ({} s)", started.elapsed().as_secs());
    match out.status.code() {
        Some(0) => {}
        Some(SETUP_FAILED) => panic!(
            "the IPVS VM suite could not be set up (it needs root with apt access to Debian's mirrors, \
             or the tools installed and a kernel cached); set SWITCHYARD_SKIP_VM=1 to skip it.\n{stderr}"
        ),
        _ => panic!("the IPVS VM suite failed: {closing}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
    }
    assert!(
        closing.ends_with(" 0 failed") && !closing.starts_with("ipvs-vm: 0 passed"),
        "{closing}"
    );
}
