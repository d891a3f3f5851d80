//! Fuzzing the controller's readers of untrusted input (harness: `fuzz/harness.rs`, corpus: `fuzz/corpus/`):
//!
//! ```text
//! controller_config text ─► Config::parse (what Config::load reads from --config)
//! cluster_dump      text ─► input::load_text (what `plan -f` and `audit -f` read) ─► Planner::build
//!                          ─► diagnostics, snapshot_problems, every node's composed plan, the written
//!                             objects ─► audit of the dump's plans against its slices
//! ```
//!
//! Each must return, Ok or Err, on any input; a panic or a hang fails the test and lands in the corpus.
//! `SWITCHYARD_FUZZ_SECONDS=60 cargo test -p switchyard-controller --test fuzz -- --nocapture
//! --test-threads=1` runs each for a minute.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../fuzz/harness.rs"]
mod harness;

use harness::{Entry, Target, fuzz};
use switchyard_controller::config::Config;
use switchyard_controller::input::{Loaded, load_text};
use switchyard_controller::planner::{Planner, snapshot_problems};
use switchyard_controller::{audit, output};

fn controller_config(text: &str) {
    let _ = Config::parse(text);
}

/// What `plan -f DUMP` and `audit -f DUMP` do with a dump, short of printing.
fn cluster_dump(text: &str) {
    let mut loaded = Loaded::default();
    if load_text("fuzz", text, &mut loaded).is_err() {
        return;
    }
    let audits = audit::audit(&loaded.plans, &loaded.forwarding_slices, None);
    let _ = audit::table(&audits);
    let config =
        Config::parse("clusterCIDRs: [10.244.0.0/16, fd00:10:244::/56]\nnodePortRange: 30000-32767\n")
            .unwrap();
    let Ok(planner) = Planner::build(&loaded.snapshot, &config) else {
        return;
    };
    let _ = planner.diagnostics();
    let _ = snapshot_problems(&loaded.snapshot, &config);
    let nodes: Vec<String> = planner.node_names().map(str::to_string).collect();
    for node in &nodes {
        let _ = output::composed_object(&planner, node);
    }
    let _ = output::written_objects(&planner);
}

#[test]
fn fuzz_controller_config() {
    fuzz(&Target {
        name: "controller_config",
        entry: Entry::Text(controller_config),
    });
}

#[test]
fn fuzz_cluster_dump() {
    fuzz(&Target {
        name: "cluster_dump",
        entry: Entry::Text(cluster_dump),
    });
}
