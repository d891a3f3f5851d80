//! Golden output: the example cluster and a small fixture, snapshotted (insta) as what each node forwards
//! (composed plans) and as the objects the controller writes (slices and plans); every object validated
//! against its generated CRD schema and the API crate's validation, with revisions re-derived from scratch.

use std::path::PathBuf;

use switchyard_api::{
    crd::{slice_validation_schema, validation_schema},
    revision,
    validate::{validate, validate_slice},
};

use super::{all_objects, plan};
use crate::{
    config::Config,
    input::load_files,
    output::{Format, composed_object, composed_table, objects_table, serialize, written_objects},
    planner::{
        Planner,
        fixtures::{EndpointExt, ServiceExt, endpoint, service, slice, snapshot},
    },
};

fn repo(path: &str) -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    p.pop();
    p.push(path);
    p
}

fn example_planner() -> Planner {
    let loaded = load_files(&[repo("examples/cluster.yaml")]).unwrap();
    let config = Config::load(&repo("examples/controller-config.yaml")).unwrap();
    let planner = Planner::build(&loaded.snapshot, &config).unwrap();
    assert!(
        planner.diagnostics().warnings.is_empty(),
        "{:?}",
        planner.diagnostics().warnings
    );
    planner
}

fn validator(schema: serde_json::Value) -> jsonschema::Validator {
    jsonschema::draft4::new(&schema["properties"]["spec"]).unwrap()
}

/// Every object validates against its CRD's openAPIV3Schema and the API crate, and carries the
/// revision a from-scratch hash gives; every composed plan too, and it equals the oracle.
fn check_objects(planner: &Planner) {
    let plans = validator(validation_schema());
    let slices = validator(slice_validation_schema());
    let (slice_specs, plan_specs) = all_objects(planner);
    for (name, spec) in &slice_specs {
        let value = serde_json::to_value(spec).unwrap();
        let errors: Vec<String> = slices.iter_errors(&value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{name} violates the CRD schema: {errors:?}");
        assert!(
            validate_slice(spec).is_clean(),
            "{name}: {:?}",
            validate_slice(spec)
        );
        assert_eq!(spec.revision, revision::compute_slice(spec).unwrap(), "{name}");
    }
    let composed: Vec<_> = planner
        .node_names()
        .map(|n| composed_object(planner, n).unwrap().unwrap().spec)
        .collect();
    for spec in plan_specs.iter().chain(&composed) {
        let value = serde_json::to_value(spec).unwrap();
        let errors: Vec<String> = plans.iter_errors(&value).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{} violates the CRD schema: {errors:?}",
            spec.node_name
        );
        let report = validate(spec);
        assert!(report.is_clean(), "{}: {report:?}", spec.node_name);
        assert_eq!(spec.revision, revision::compute(spec).unwrap());
    }
    for node in planner.node_names() {
        super::spec_of(planner, node);
    }
}

fn composed_yaml(planner: &Planner) -> String {
    let composed: Vec<_> = planner
        .node_names()
        .map(|n| composed_object(planner, n).unwrap().unwrap())
        .collect();
    serialize(&composed, Format::Yaml).unwrap()
}

#[test]
fn example_cluster() {
    let planner = example_planner();
    assert_eq!(planner.node_names().count(), 3);
    check_objects(&planner);
    insta::assert_snapshot!("example_cluster_yaml", composed_yaml(&planner));
    let composed: Vec<_> = planner
        .node_names()
        .map(|n| composed_object(&planner, n).unwrap().unwrap())
        .collect();
    insta::assert_snapshot!("example_cluster_table", composed_table(&planner, &composed, true));
    let objects = written_objects(&planner);
    insta::assert_snapshot!(
        "example_cluster_objects_yaml",
        serialize(&objects, Format::Yaml).unwrap()
    );
    insta::assert_snapshot!("example_cluster_objects_table", objects_table(&objects, false));
}

#[test]
fn the_schema_check_can_fail() {
    let planner = example_planner();
    let plans = validator(validation_schema());
    let mut value = serde_json::to_value(composed_object(&planner, "node-a").unwrap().unwrap().spec).unwrap();
    value["services"][0]["port"] = serde_json::json!(70000);
    value["backend"] = serde_json::json!("ebpf");
    assert_eq!(plans.iter_errors(&value).count(), 2);
    let slices = super::all_objects(&planner).0;
    let mut value = serde_json::to_value(&slices[0].1).unwrap();
    value["count"] = serde_json::json!(0);
    assert_eq!(
        validator(slice_validation_schema()).iter_errors(&value).count(),
        1
    );
}

#[test]
fn small_fixture() {
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
    check_objects(&planner);
    insta::assert_snapshot!("small_fixture_yaml", composed_yaml(&planner));
    let objects = written_objects(&planner);
    insta::assert_snapshot!(
        "small_fixture_objects_yaml",
        serialize(&objects, Format::Yaml).unwrap()
    );
}
