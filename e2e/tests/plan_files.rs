//! No false refusals (issue 45): every plan and slice exactly as the controller writes it — the live
//! objects it applies through the API server, and every file `switchyard-controller plan` prints (a
//! node's self-contained plan, or its live plan with its views' slices; YAML and JSON) — carries the
//! revision its content hashes to, so the agent's integrity check accepts each and reads what was
//! planned.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use switchyard_agent::planfile::parse_plan_text;
use switchyard_agent::sync::{Composition, LastGood, compose_plan};
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, revision};
use switchyard_controller::output::{Format, Written, composed_object, serialize, written_objects};
use switchyard_controller::{Config, input, planner::Planner};

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn example_planner() -> Planner {
    let config = Config::load(&repo("examples/controller-config.yaml")).unwrap();
    let loaded = input::load_files(&[repo("examples/cluster.yaml")]).unwrap();
    Planner::build(&loaded.snapshot, &config).unwrap()
}

#[test]
fn plans_and_slices_as_the_controller_writes_them_are_accepted() {
    let planner = example_planner();
    let written = written_objects(&planner);
    assert!(written.iter().any(|w| matches!(w, Written::Slice(_))));
    // The API path: each object through JSON, as the API server stores and serves it.
    for object in &written {
        let json = serde_json::to_string(object).unwrap();
        match object {
            Written::Plan(plan) => {
                let read: NodeForwardingPlan = serde_json::from_str(&json).unwrap();
                assert_eq!(read.spec, plan.spec);
                assert_eq!(revision::verify(&read.spec).unwrap(), Ok(()), "{json}");
            }
            Written::Slice(slice) => {
                let read: ForwardingSlice = serde_json::from_str(&json).unwrap();
                assert_eq!(read.spec, slice.spec);
                assert_eq!(revision::verify_slice(&read.spec).unwrap(), Ok(()), "{json}");
            }
        }
    }
    for node in planner.node_names() {
        let want = planner.composed(node).unwrap().unwrap().spec;
        // `plan --node N`: the self-contained plan.
        let composed = composed_object(&planner, node).unwrap().unwrap();
        // `plan --objects --node N`: its live plan and its views' slices.
        let views = planner.node_plan(node).unwrap().views;
        let objects: Vec<&Written> = written
            .iter()
            .filter(|w| match w {
                Written::Slice(slice) => views.contains(&slice.spec.view),
                Written::Plan(plan) => plan.metadata.name.as_deref() == Some(node),
            })
            .collect();
        for format in [Format::Yaml, Format::Json] {
            for (what, text) in [
                (
                    "plan --node",
                    serialize(std::slice::from_ref(&composed), format).unwrap(),
                ),
                ("plan --objects --node", serialize(&objects, format).unwrap()),
            ] {
                let file = parse_plan_text(&text)
                    .unwrap_or_else(|e| panic!("{node}: {what} -o {format:?} refused: {e}"));
                let slices: Vec<_> = file
                    .slices
                    .into_iter()
                    .map(|(name, spec)| (name, Arc::new(spec)))
                    .collect();
                let Composition::Ready { spec, failures, .. } =
                    compose_plan(&Arc::new(file.plan), &slices, &mut LastGood::default())
                else {
                    panic!("{node}: {what} -o {format:?} does not compose");
                };
                assert!(failures.is_empty(), "{node}: {what}: {failures:?}");
                assert_eq!(spec.services, want.services, "{node}: {what} -o {format:?}");
            }
        }
    }
}
