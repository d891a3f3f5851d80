//! Lab lifecycle: teardown is complete (on drop, on failure, after keep), labs run side by side, the
//! host namespace is never changed, and supervised processes run inside lab namespaces.

#[cfg(test)] // NB: marks the helpers as test code for clippy's allow-*-in-tests.
mod common;

use std::{path::Path, time::Duration};

use common::{EXAMPLE, TIMEOUT, example_lab, lab_allowed, lab_of, namespaces_of, options, sa};
use switchyard_e2e::{ClusterDescription, Lab, LabError, Place, Proto, teardown};

#[test]
fn a_lab_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Lab>();
}

#[test]
fn dropping_a_lab_removes_its_namespaces_processes_and_state() {
    let Some(lab) = example_lab("dropping_a_lab_removes_its_namespaces_processes_and_state") else {
        return;
    };
    let id = lab.id().to_owned();
    let state_dir = lab.state_dir().to_path_buf();
    assert_eq!(namespaces_of(&id).len(), lab.layout().all_netns().len());
    let pids: Vec<u32> = lab.servers().iter().map(|server| server.pid()).collect();
    assert_eq!(pids.len(), 6);
    let agent = lab
        .spawn_in(
            &Place::node("node-b"),
            &["sh".into(), "-c".into(), "echo started; exec sleep 600".into()],
        )
        .unwrap();
    agent.wait_for_output("started", TIMEOUT).unwrap();
    drop(lab);
    assert_eq!(namespaces_of(&id), Vec::<String>::new());
    for pid in pids.iter().chain([&agent.pid()]) {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} survived"
        );
    }
    assert!(!agent.is_running());
    assert!(!state_dir.exists(), "{} survived", state_dir.display());
}

#[test]
fn a_failed_bring_up_removes_what_it_created() {
    if !lab_allowed("a_failed_bring_up_removes_what_it_created") {
        return;
    }
    let mut options = options();
    options.lab_binary = "/nonexistent/switchyard-lab".into();
    let description = ClusterDescription::from_yaml(EXAMPLE).unwrap();
    let error = Lab::up_with(description, options).unwrap_err();
    let LabError::BringUp { lab, source } = &error else {
        panic!("unexpected error {error}");
    };
    assert!(matches!(**source, LabError::ExitedEarly { .. }), "{error}");
    assert_eq!(namespaces_of(lab), Vec::<String>::new());
}

#[test]
fn two_labs_run_side_by_side() {
    let Some(first) = example_lab("two_labs_run_side_by_side") else {
        return;
    };
    let renamed = EXAMPLE.replace("name: web-", "name: alt-");
    let second = lab_of("two_labs_run_side_by_side", &renamed).unwrap();
    assert_ne!(first.id(), second.id());
    let dst = sa("10.244.2.10:8080");
    let from_first = first
        .probe(&Place::pod("web-a1"), Proto::Tcp, dst, TIMEOUT)
        .unwrap();
    let from_second = second
        .probe(&Place::pod("alt-a1"), Proto::Tcp, dst, TIMEOUT)
        .unwrap();
    assert_eq!(from_first.pod(), Some("web-b1"), "{from_first}");
    assert_eq!(from_second.pod(), Some("alt-b1"), "{from_second}");
    let second_id = second.id().to_owned();
    drop(second);
    assert!(namespaces_of(&second_id).is_empty());
    let still = first
        .probe(&Place::Client, Proto::Tcp, sa("192.168.10.12:9000"), TIMEOUT)
        .unwrap();
    assert_eq!(still.pod(), Some("hostnet-b"), "{still}");
}

#[test]
fn the_host_namespace_is_unchanged() {
    if !lab_allowed("the_host_namespace_is_unchanged") {
        return;
    }
    let before = common::host_snapshot();
    let lab = example_lab("the_host_namespace_is_unchanged").unwrap();
    let during = common::host_snapshot();
    let result = lab
        .probe(&Place::pod("web-a1"), Proto::Tcp, sa("10.244.2.10:8080"), TIMEOUT)
        .unwrap();
    assert!(result.is_answered(), "{result}");
    drop(lab);
    let after = common::host_snapshot();
    assert_eq!(before, during, "the host changed while the lab was up");
    assert_eq!(before, after, "the host changed after the lab was removed");
}

#[test]
fn a_kept_lab_survives_until_down() {
    let Some(lab) = example_lab("a_kept_lab_survives_until_down") else {
        return;
    };
    let state_dir = options().state_dir;
    let id = lab.keep().unwrap();
    assert!(!namespaces_of(&id).is_empty());
    let report = teardown::gc(&state_dir, false);
    assert!(
        report.skipped.iter().any(|(skipped, _)| skipped == &id),
        "gc without --all must leave a kept lab whose processes run alone: {report:?}"
    );
    let netns = format!("{id}-client");
    let answered = switchyard_e2e::probe(&netns, Proto::Tcp, sa("192.168.10.12:9000"), TIMEOUT);
    assert_eq!(answered.pod(), Some("hostnet-b"), "{answered}");
    teardown::down(&state_dir, &id).unwrap();
    assert!(namespaces_of(&id).is_empty());
    assert!(matches!(
        teardown::down(&state_dir, &id),
        Err(LabError::NoSuchLab(_))
    ));
}

#[test]
fn supervised_and_one_shot_commands_run_inside_the_namespace() {
    let Some(lab) = example_lab("supervised_and_one_shot_commands_run_inside_the_namespace") else {
        return;
    };
    let out = lab
        .exec_in(
            &Place::node("node-a"),
            &[
                "ip".into(),
                "-o".into(),
                "-4".into(),
                "addr".into(),
                "show".into(),
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("192.168.10.11/24"), "{text}");
    let script = "ip -o -4 addr show dev eth0; echo to-stderr >&2; exec sleep 600";
    let child = lab
        .spawn_in(&Place::pod("web-b1"), &["sh".into(), "-c".into(), script.into()])
        .unwrap();
    child.wait_for_output("to-stderr", TIMEOUT).unwrap();
    assert!(child.stdout().contains("10.244.2.10/32"), "{}", child.stdout());
    assert!(child.is_running());
    assert!(child.stop(Duration::from_secs(1)).is_some());
    assert!(!child.is_running());
    let quitter = lab.spawn_in(&Place::Client, &["false".into()]).unwrap();
    let error = quitter.wait_for_output("never", TIMEOUT).unwrap_err();
    assert!(matches!(error, LabError::ExitedEarly { .. }), "{error}");
    let plans = lab.plans_dir().unwrap();
    let config = switchyard_controller::Config::parse("clusterCIDRs: [10.244.0.0/16]\n").unwrap();
    let planned = lab.write_plans(&plans, lab.description(), &config).unwrap();
    assert_eq!(planned.len(), 3);
    // Each file holds the node's live plan and its views' slices; composed, it is a valid plan.
    let first = switchyard_agent::planfile::read_plan_file(&planned[0]).unwrap();
    assert_eq!(first.plan.node_name, "node-a");
    assert!(!first.plan.views.is_empty() && !first.slices.is_empty());
    let composed = match switchyard_agent::sync::compose_plan(
        &first.plan,
        &first.slices,
        &mut switchyard_agent::sync::LastGood::default(),
    ) {
        switchyard_agent::sync::Composition::Ready { spec, .. } => spec,
        incomplete => panic!("{incomplete:?}"),
    };
    assert!(switchyard_api::validate::validate(&composed).is_clean());
    let written = lab
        .write_plans_with(&plans, |description, node| {
            Ok(format!("node: {} of {}\n", node.name, description.nodes.len()))
        })
        .unwrap();
    assert_eq!(written.len(), 3);
    assert_eq!(
        std::fs::read_to_string(&written[1]).unwrap(),
        "node: node-b of 3\n"
    );
    assert!(matches!(
        lab.netns(&Place::node("node-z")),
        Err(LabError::UnknownPlace { .. })
    ));
}

#[test]
fn a_lab_left_by_a_killed_run_is_removed_by_the_next_gc_and_a_live_one_never() {
    use std::io::BufRead;
    if !lab_allowed("a_lab_left_by_a_killed_run_is_removed_by_the_next_gc_and_a_live_one_never") {
        return;
    }
    let state_dir = switchyard_test_support::scratch::dir("lab-gc").unwrap();
    let cluster = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/cluster.yaml");
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-lab"))
        .arg("--state-dir")
        .arg(state_dir.path())
        .arg("up")
        .arg("--cluster")
        .arg(&cluster)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(run.stdout.take().unwrap());
    let id = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|line| Some(line.strip_prefix("lab ")?.split_once(" is up")?.0.to_owned()))
        .expect("the run says its lab is up");
    let serving: Vec<i32> = switchyard_e2e::netns::pids_in(&namespaces_of(&id))
        .into_values()
        .flatten()
        .collect();
    assert!(!serving.is_empty(), "the lab's backends run");

    let report = teardown::gc(state_dir.path(), false);
    assert!(report.removed.is_empty(), "{report:?}");
    assert!(
        report
            .skipped
            .iter()
            .any(|(skipped, why)| skipped == &id && why.contains("in use")),
        "a lab whose run is alive stays: {report:?}"
    );

    // SIGKILL: no destructor, no signal handler; the namespaces and their processes stay behind.
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(!namespaces_of(&id).is_empty());

    let report = teardown::gc(state_dir.path(), false);
    assert_eq!(report.removed, vec![id.clone()], "{report:?}");
    assert!(report.problems.is_empty(), "{report:?}");
    assert_eq!(namespaces_of(&id), Vec::<String>::new());
    // Their parent was killed: whoever adopted them reaps them when it likes, so a zombie counts as gone.
    let running = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| Some(stat.rsplit_once(") ")?.1.starts_with('Z')))
            .is_some_and(|zombie| !zombie)
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    while serving.iter().any(running) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<&i32> = serving.iter().filter(|pid| running(pid)).collect();
    assert!(survivors.is_empty(), "processes survived: {survivors:?}");
    assert!(!state_dir.path().join(&id).exists());
}
