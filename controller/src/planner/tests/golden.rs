//! Golden plans: the example cluster and small fixtures, snapshotted (insta), validated against the
//! generated CRD schema and the API crate's validation, with revisions re-derived from scratch.

use std::path::PathBuf;

use switchyard_api::{crd::validation_schema, revision, validate::validate};

use super::plan;
use crate::{
    config::Config,
    input::load_files,
    output::{Format, objects, render},
    planner::{
        NodePlan, Planner,
        fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, snapshot},
    },
};

fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

fn example_plans() -> Vec<NodePlan> {
    let loaded = load_files(&[repo("examples/cluster.yaml")]).unwrap();
    let config = Config::load(&repo("examples/controller-config.yaml")).unwrap();
    let planner = Planner::build(&loaded.snapshot, &config).unwrap();
    assert!(
        planner.diagnostics().warnings.is_empty(),
        "{:?}",
        planner.diagnostics().warnings
    );
    planner.all_plans()
}

/// Every object validates against the CRD's openAPIV3Schema and the API crate, and carries the revision
/// a from-scratch hash gives.
fn check_objects(plans: &[NodePlan]) {
    let schema = validation_schema();
    let spec_schema = &schema["properties"]["spec"];
    let validator = jsonschema::draft4::new(spec_schema).unwrap();
    for plan in plans {
        for object in objects(plan) {
            let value = serde_json::to_value(&object.spec).unwrap();
            let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
            assert!(
                errors.is_empty(),
                "{:?} violates the CRD schema: {errors:?}",
                object.metadata.name
            );
            let report = validate(&object.spec);
            assert!(report.is_clean(), "{:?}: {report:?}", object.metadata.name);
            assert_eq!(object.spec.revision, revision::compute(&object.spec).unwrap());
        }
    }
}

#[test]
fn example_cluster_plans() {
    let plans = example_plans();
    assert_eq!(plans.len(), 3);
    check_objects(&plans);
    insta::assert_snapshot!("example_cluster_yaml", render(&plans, Format::Yaml).unwrap());
    insta::assert_snapshot!("example_cluster_table", render(&plans, Format::Table).unwrap());
}

#[test]
fn the_schema_check_can_fail() {
    let plans = example_plans();
    let validator = jsonschema::draft4::new(&validation_schema()["properties"]["spec"]).unwrap();
    let mut value = serde_json::to_value(&plans[0].objects[0]).unwrap();
    value["services"][0]["port"] = serde_json::json!(70000);
    value["backend"] = serde_json::json!("ebpf");
    assert_eq!(validator.iter_errors(&value).count(), 2);
}

#[test]
fn small_fixture_plans() {
    let web = service("ns1", "web", "10.96.0.10", |s| {
        s.type_("LoadBalancer")
            .node_port("http", 80, 30010)
            .lb_ingress("203.0.113.10", None)
            .affinity(Some(600));
        s.spec_mut().external_traffic_policy = Some("Local".into());
        s.spec_mut().health_check_node_port = Some(32010);
        s.spec_mut().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    });
    let eps = slice(
        "ns1",
        "web",
        &[("http", 8080, "TCP")],
        vec![
            endpoint("10.244.1.5", "node-a"),
            endpoint("10.244.2.5", "node-b").conditions(false, true, true),
            endpoint("10.244.3.5", "node-c").zone_hints(&["zone-b"]),
        ],
    );
    let planner = plan(&snapshot(vec![web], vec![eps]));
    let plans = planner.all_plans();
    check_objects(&plans);
    insta::assert_snapshot!("small_fixture_yaml", render(&plans, Format::Yaml).unwrap());
}
