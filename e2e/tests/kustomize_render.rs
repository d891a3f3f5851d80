//! The kustomize install surface under `config/`.
//!
//! Part (a) needs no tools: it parses every YAML file under `config/` and checks the invariants the
//! design depends on — least-privilege RBAC (docs/design.md §5), the admission policy that confines an agent
//! to its own node's plan status, what the agent DaemonSet and the controller Deployment must carry,
//! the controller configuration, the IPVS overlay, and that no kustomization reads a file outside its
//! own directory (kustomize's default load restrictions).
//!
//! Part (b) runs `kubectl kustomize` on `config/default` and `config/overlays/ipvs` and checks the
//! rendered objects. Without kubectl on PATH it prints a `skip:` line, unless
//! `SWITCHYARD_REQUIRE_KUBECTL=1`, which turns the skip into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Component, Path, PathBuf},
    process::Command,
};

use k8s_openapi::{
    DeepMerge as _,
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::{DaemonSet, Deployment},
        core::v1::{Container, PodSpec},
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_api::names::{GROUP, LABEL_BACKEND};
use switchyard_controller::Config;

const NAMESPACE: &str = "switchyard-system";
const CONTROLLER: &str = "switchyard-controller";
const AGENT: &str = "switchyard-agent";
const AGENT_IPVS: &str = "switchyard-agent-ipvs";
const LEADER_ELECTION: &str = "switchyard-controller-leader-election";
const POLICY: &str = "switchyard-agent-own-plan-status";
const NODE_POLICY: &str = "switchyard-controller-node-backend-label";
const CONFIG_MAP: &str = "switchyard-controller-config";
const PLANS: &str = "nodeforwardingplans";
const PLAN_STATUS: &str = "nodeforwardingplans/status";
const SLICES: &str = "forwardingslices";
const ROLLOUTS: &str = "forwardingrollouts";
const ROLLOUT_STATUS: &str = "forwardingrollouts/status";
/// The node label that moves a node from kube-proxy to Switchyard (config/overlays/beside-kube-proxy).
const PROXY_LABEL: &str = "switchyard.io/proxy";
/// Every generated CRD file, by the CRD's name (`<plural>.<group>`).
const CRDS: [&str; 3] = ["forwardingrollouts", "forwardingslices", "nodeforwardingplans"];
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const CONTROLLER_PORT: i32 = 10262;
const AGENT_PORT: i32 = 10263;
/// kube-proxy's metrics and healthz ports, the kubelet's healthz and API ports.
const TAKEN_PORTS: [i32; 4] = [10249, 10256, 10248, 10250];

fn repo_root() -> PathBuf {
    let mut root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    root.pop();
    root
}

// ---------------------------------------------------------------------------------------------------
// Loading config/ the way kustomize sees it
// ---------------------------------------------------------------------------------------------------

/// One YAML document and the file (relative to the repository root) it came from.
#[derive(Debug, Clone)]
struct Doc {
    file: PathBuf,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }

    fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone()).unwrap_or_else(|e| {
            panic!(
                "{}: {} {} does not fit the Kubernetes type: {e}",
                self.file.display(),
                self.kind(),
                self.name()
            )
        })
    }
}

/// Every kustomization under `config/` and the files each one uses, classified by use.
struct Tree {
    root: PathBuf,
    /// Kustomization directory (relative) → its parsed kustomization.yaml.
    kustomizations: BTreeMap<PathBuf, Value>,
    /// Documents of files listed under `resources:`.
    resources: Vec<Doc>,
    /// Documents of files listed under `patches:`.
    patches: Vec<Doc>,
    /// Files read by generators (relative paths).
    generator_files: BTreeSet<PathBuf>,
    /// Every problem found while resolving references.
    problems: Vec<String>,
}

fn parse_yaml(root: &Path, file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("{}: cannot read: {e}", file.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", file.display()));
    docs.into_iter().filter(|doc| !doc.is_null()).collect()
}

fn yaml_files(root: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir)).unwrap() {
            let entry = entry.unwrap();
            let rel = dir.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                stack.push(rel);
            } else if matches!(rel.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// `base/reference` resolved lexically; `None` when it climbs above the repository root.
fn resolve(base: &Path, reference: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.join(reference).components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Top-level kustomization fields this test understands. Anything else fails, so that a new field
/// that reads files cannot slip past the load-restriction check.
const KNOWN_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "components",
    "patches",
    "configMapGenerator",
    "images",
    "labels",
    "namePrefix",
    "nameSuffix",
];

/// Fields kustomize 5 deprecates (and that tempt people into `../` file references).
const DEPRECATED_FIELDS: &[&str] = &[
    "bases",
    "commonLabels",
    "patchesStrategicMerge",
    "patchesJson6902",
    "vars",
];

impl Tree {
    fn load() -> Self {
        let root = repo_root();
        let mut tree = Tree {
            kustomizations: BTreeMap::new(),
            resources: Vec::new(),
            patches: Vec::new(),
            generator_files: BTreeSet::new(),
            problems: Vec::new(),
            root,
        };
        for file in yaml_files(&tree.root, Path::new("config")) {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name == "kustomization.yml" || name == "Kustomization" {
                tree.problems.push(format!(
                    "{}: name kustomizations kustomization.yaml",
                    file.display()
                ));
            }
            if name == "kustomization.yaml" {
                let mut docs = parse_yaml(&tree.root, &file);
                assert_eq!(docs.len(), 1, "{}: one document expected", file.display());
                let dir = file.parent().unwrap().to_path_buf();
                tree.kustomizations.insert(dir, docs.remove(0));
            }
        }
        let kustomizations = tree.kustomizations.clone();
        for (dir, kustomization) in &kustomizations {
            tree.resolve_references(dir, kustomization);
        }
        tree
    }

    fn problem(&mut self, dir: &Path, text: String) {
        self.problems
            .push(format!("{}/kustomization.yaml: {text}", dir.display()));
    }

    /// A reference that must be a file inside `dir` itself (default load restrictions).
    fn local_file(&mut self, dir: &Path, reference: &str) -> Option<PathBuf> {
        match resolve(dir, reference) {
            Some(path) if path.starts_with(dir) && path != dir => {
                if self.root.join(&path).is_file() {
                    Some(path)
                } else {
                    self.problem(dir, format!("{reference}: no such file"));
                    None
                }
            }
            _ => {
                self.problem(
                    dir,
                    format!(
                        "{reference}: a file outside the kustomization directory (kustomize's default \
                         load restrictions refuse it; reference the other directory's kustomization instead)"
                    ),
                );
                None
            }
        }
    }

    fn resolve_references(&mut self, dir: &Path, kustomization: &Value) {
        let Some(fields) = kustomization.as_object() else {
            self.problem(dir, "not a mapping".into());
            return;
        };
        for key in fields.keys() {
            if DEPRECATED_FIELDS.contains(&key.as_str()) {
                self.problem(dir, format!("`{key}` is deprecated in kustomize 5"));
            } else if !KNOWN_FIELDS.contains(&key.as_str()) {
                self.problem(
                    dir,
                    format!("`{key}` is not known to this test: teach Tree::resolve_references"),
                );
            }
        }
        // A Component (config/components/*) is kustomize.config.k8s.io/v1alpha1, as kustomize 5 has it.
        let known = matches!(
            (
                kustomization["kind"].as_str(),
                kustomization["apiVersion"].as_str()
            ),
            (Some("Kustomization"), Some("kustomize.config.k8s.io/v1beta1"))
                | (Some("Component"), Some("kustomize.config.k8s.io/v1alpha1"))
        );
        if !known {
            self.problem(
                dir,
                "apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization (or v1alpha1 Component) \
                 expected"
                    .into(),
            );
        }
        for field in ["resources", "components"] {
            for reference in strings(&kustomization[field]) {
                if reference.contains("://") || reference.starts_with("github.com/") {
                    self.problem(dir, format!("{reference}: remote references are not allowed"));
                    continue;
                }
                let Some(path) = resolve(dir, &reference) else {
                    self.problem(dir, format!("{reference}: climbs above the repository"));
                    continue;
                };
                if self.root.join(&path).is_dir() {
                    // Another kustomization root: allowed anywhere under config/.
                    if !path.starts_with("config") {
                        self.problem(dir, format!("{reference}: a directory outside config/"));
                    } else if !self.root.join(&path).join("kustomization.yaml").is_file() {
                        self.problem(
                            dir,
                            format!("{reference}: a directory without kustomization.yaml"),
                        );
                    }
                } else if let Some(file) = self.local_file(dir, &reference) {
                    for value in parse_yaml(&self.root, &file) {
                        self.resources.push(Doc {
                            file: file.clone(),
                            value,
                        });
                    }
                }
            }
        }
        for patch in kustomization["patches"].as_array().cloned().unwrap_or_default() {
            if let Some(reference) = patch["path"].as_str()
                && let Some(file) = self.local_file(dir, reference)
            {
                for value in parse_yaml(&self.root, &file) {
                    self.patches.push(Doc {
                        file: file.clone(),
                        value,
                    });
                }
            }
        }
        for generator in kustomization["configMapGenerator"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let mut references = strings(&generator["files"])
                .into_iter()
                .map(|entry| entry.rsplit('=').next().unwrap_or_default().to_string())
                .collect::<Vec<_>>();
            references.extend(strings(&generator["envs"]));
            for reference in references {
                if let Some(file) = self.local_file(dir, &reference) {
                    self.generator_files.insert(file);
                }
            }
        }
    }

    /// The one resource of this kind and name (source files, before kustomize).
    fn resource(&self, kind: &str, name: &str) -> &Doc {
        let found: Vec<&Doc> = self
            .resources
            .iter()
            .filter(|doc| doc.kind() == kind && doc.name() == name)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected exactly one {kind} {name} among the resources under config/, found {}",
            found.len()
        );
        found[0]
    }

    fn patch(&self, file: &str) -> &Doc {
        self.patches
            .iter()
            .find(|doc| doc.file == Path::new(file))
            .unwrap_or_else(|| panic!("{file} is not used as a patch by any kustomization"))
    }

    fn kustomization(&self, dir: &str) -> &Value {
        self.kustomizations
            .get(Path::new(dir))
            .unwrap_or_else(|| panic!("{dir}/kustomization.yaml is missing"))
    }

    /// Kinds of all resources in the tree rooted at `dir` (following directory references).
    fn kinds_below(&self, dir: &Path, seen: &mut BTreeSet<PathBuf>) -> BTreeSet<String> {
        let mut kinds = BTreeSet::new();
        if !seen.insert(dir.to_path_buf()) {
            return kinds;
        }
        let Some(kustomization) = self.kustomizations.get(dir) else {
            return kinds;
        };
        for reference in strings(&kustomization["resources"]) {
            let Some(path) = resolve(dir, &reference) else {
                continue;
            };
            if self.root.join(&path).is_dir() {
                kinds.extend(self.kinds_below(&path, seen));
            } else {
                kinds.extend(
                    self.resources
                        .iter()
                        .filter(|doc| doc.file == path)
                        .map(|doc| doc.kind().to_string()),
                );
            }
        }
        kinds
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------------
// Small helpers over Kubernetes types
// ---------------------------------------------------------------------------------------------------

/// One permission: (API group, resource, verb, resource name if restricted).
type Grant = (String, String, String, Option<String>);

fn grants(rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        assert!(
            rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty),
            "no nonResourceURLs expected: {rule:?}"
        );
        let names: Vec<Option<String>> = match rule.resource_names.as_deref() {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                for verb in &rule.verbs {
                    for name in &names {
                        out.insert((group.clone(), resource.clone(), verb.clone(), name.clone()));
                    }
                }
            }
        }
    }
    out
}

fn grant(group: &str, resource: &str, verbs: &[&str], name: Option<&str>) -> Vec<Grant> {
    verbs
        .iter()
        .map(|verb| {
            (
                group.to_string(),
                resource.to_string(),
                verb.to_string(),
                name.map(str::to_string),
            )
        })
        .collect()
}

fn verbs_on(grants: &BTreeSet<Grant>, group: &str, resource: &str) -> BTreeSet<String> {
    grants
        .iter()
        .filter(|(g, r, _, _)| g == group && r == resource)
        .map(|(_, _, verb, _)| verb.clone())
        .collect()
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_field_ref(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|env| env.name == name)
        .and_then(|env| env.value_from.as_ref())
        .and_then(|from| from.field_ref.as_ref())
        .map(|field| field.field_path.clone())
}

fn probe_target(probe: Option<&k8s_openapi::api::core::v1::Probe>) -> (String, IntOrString) {
    let get = probe.and_then(|p| p.http_get.as_ref()).expect("an httpGet probe");
    (get.path.clone().unwrap_or_default(), get.port.clone())
}

/// The port number a probe targets, resolving a named container port.
fn probe_port(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(port) => *port,
        IntOrString::String(name) => container
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
            .unwrap_or_else(|| panic!("no container port named {name}")),
    }
}

fn capabilities(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let caps = container
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .expect("capabilities");
    (
        caps.add.clone().unwrap_or_default().into_iter().collect(),
        caps.drop.clone().unwrap_or_default().into_iter().collect(),
    )
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn quantity(
    resources: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
) -> Option<String> {
    resources.and_then(|r| r.get(key)).map(|q| q.0.clone())
}

// ---------------------------------------------------------------------------------------------------
// (a) Structure, without kubectl
// ---------------------------------------------------------------------------------------------------

#[test]
fn every_yaml_file_under_config_parses_and_belongs_to_a_kustomization() {
    let tree = Tree::load();
    assert!(tree.problems.is_empty(), "{}", tree.problems.join("\n"));
    for dir in [
        "config/crd",
        "config/rbac",
        "config/controller",
        "config/agent",
        "config/default",
        "config/overlays/ipvs",
        "config/overlays/beside-kube-proxy",
    ] {
        tree.kustomization(dir);
    }
    let used: BTreeSet<PathBuf> = tree
        .resources
        .iter()
        .chain(&tree.patches)
        .map(|doc| doc.file.clone())
        .chain(tree.generator_files.iter().cloned())
        .chain(
            tree.kustomizations
                .keys()
                .map(|dir| dir.join("kustomization.yaml")),
        )
        .collect();
    // Files for Prometheus and promtool beside the monitoring component, not Kubernetes objects
    // (e2e/tests/monitoring.rs checks them).
    let not_objects = [
        Path::new("config/components/monitoring/prometheus-rules.yaml"),
        Path::new("config/components/monitoring/rules-test.yaml"),
    ];
    for file in yaml_files(&tree.root, Path::new("config")) {
        // Parses (panics with the file name otherwise) ...
        let docs = parse_yaml(&tree.root, &file);
        assert!(!docs.is_empty(), "{}: empty", file.display());
        if not_objects.contains(&file.as_path()) {
            assert!(
                docs.iter().all(|doc| doc.get("kind").is_none()),
                "{}",
                file.display()
            );
            continue;
        }
        // ... and is read by some kustomization.
        assert!(
            used.contains(&file),
            "{} is not referenced by any kustomization",
            file.display()
        );
    }
    for doc in &tree.resources {
        assert!(
            doc.value["apiVersion"].is_string() && !doc.kind().is_empty() && !doc.name().is_empty(),
            "{}: every resource needs apiVersion, kind and metadata.name",
            doc.file.display()
        );
        assert_known_fields(doc);
    }
}

#[test]
fn the_generated_crds_are_used_unchanged() {
    let tree = Tree::load();
    for plural in CRDS {
        let crd = tree.resource("CustomResourceDefinition", &format!("{plural}.{GROUP}"));
        let file = format!("{plural}.{GROUP}.yaml");
        assert_eq!(crd.file, Path::new("config/crd").join(&file));
        let copy = std::fs::read_to_string(tree.root.join(&crd.file)).unwrap();
        let original = std::fs::read_to_string(tree.root.join("crds").join(&file)).unwrap();
        assert!(
            copy == original,
            "config/crd and crds/ differ: run `make generate`"
        );
    }
    assert_eq!(
        strings(&tree.kustomization("config/crd")["resources"]),
        CRDS.iter()
            .map(|p| format!("{p}.{GROUP}.yaml"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn no_namespace_field_where_kustomize_would_stamp_it_on_cluster_scoped_policies() {
    // kustomize 5.5 does not know ValidatingAdmissionPolicy(Binding) is cluster-scoped; a
    // `namespace:` field above them would put a namespace on cluster-scoped objects.
    let tree = Tree::load();
    for (dir, kustomization) in &tree.kustomizations {
        let kinds = tree.kinds_below(dir, &mut BTreeSet::new());
        if kinds
            .iter()
            .any(|kind| kind.starts_with("ValidatingAdmissionPolicy"))
        {
            assert!(
                kustomization.get("namespace").is_none(),
                "{}/kustomization.yaml sets `namespace:` above the admission policy",
                dir.display()
            );
        }
    }
    // So every namespaced object must name the namespace itself.
    for doc in &tree.resources {
        let namespaced = matches!(
            doc.kind(),
            "ServiceAccount"
                | "Role"
                | "RoleBinding"
                | "ConfigMap"
                | "Deployment"
                | "DaemonSet"
                | "PodMonitor"
                | "PrometheusRule"
        );
        if namespaced {
            assert_eq!(
                doc.namespace(),
                Some(NAMESPACE),
                "{}: {} {}",
                doc.file.display(),
                doc.kind(),
                doc.name()
            );
        } else {
            assert_eq!(
                doc.namespace(),
                None,
                "{}: cluster-scoped {} {} must have no namespace",
                doc.file.display(),
                doc.kind(),
                doc.name()
            );
        }
    }
}

#[test]
fn controller_rbac_reads_inputs_writes_plan_and_slice_specs_and_nothing_else() {
    let tree = Tree::load();
    let role: ClusterRole = tree.resource("ClusterRole", CONTROLLER).typed();
    let have = grants(role.rules.as_deref().unwrap_or_default());
    let mut want: BTreeSet<Grant> = BTreeSet::new();
    want.extend(grant("", "services", &["get", "list", "watch"], None));
    want.extend(grant("", "nodes", &["get", "list", "watch"], None));
    want.extend(grant(
        "discovery.k8s.io",
        "endpointslices",
        &["get", "list", "watch"],
        None,
    ));
    want.extend(grant(
        "networking.k8s.io",
        "servicecidrs",
        &["get", "list", "watch"],
        None,
    ));
    for resource in [PLANS, SLICES] {
        want.extend(grant(
            GROUP,
            resource,
            &["get", "list", "watch", "create", "patch", "delete"],
            None,
        ));
    }
    want.extend(grant("events.k8s.io", "events", &["create", "patch"], None));
    want.extend(grant(GROUP, ROLLOUTS, &["get", "list", "watch"], None));
    want.extend(grant(GROUP, ROLLOUT_STATUS, &["patch"], None));
    want.extend(grant("", "nodes", &["patch"], None));
    assert!(
        verbs_on(&have, GROUP, PLAN_STATUS).is_empty(),
        "the controller must not write plan status"
    );
    assert!(
        !verbs_on(&have, "", "nodes").contains("create") && !verbs_on(&have, "", "nodes").contains("update"),
        "an apply to a Node that is gone must fail, not create it; nothing replaces a Node"
    );
    assert_eq!(have, want, "ClusterRole {CONTROLLER}");

    let lease: Role = tree.resource("Role", LEADER_ELECTION).typed();
    assert_eq!(lease.metadata.namespace.as_deref(), Some(NAMESPACE));
    let have = grants(lease.rules.as_deref().unwrap_or_default());
    let mut want: BTreeSet<Grant> = BTreeSet::new();
    want.extend(grant("coordination.k8s.io", "leases", &["create"], None));
    want.extend(grant(
        "coordination.k8s.io",
        "leases",
        &["get", "update"],
        Some(CONTROLLER),
    ));
    assert_eq!(have, want, "Role {LEADER_ELECTION}");

    let binding: ClusterRoleBinding = tree.resource("ClusterRoleBinding", CONTROLLER).typed();
    assert_eq!(
        (binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
        ("ClusterRole", CONTROLLER)
    );
    let binding: RoleBinding = tree.resource("RoleBinding", LEADER_ELECTION).typed();
    assert_eq!(
        (binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
        ("Role", LEADER_ELECTION)
    );
}

#[test]
fn agent_rbac_reads_plans_and_slices_and_writes_only_plan_status() {
    let tree = Tree::load();
    let role: ClusterRole = tree.resource("ClusterRole", AGENT).typed();
    let have = grants(role.rules.as_deref().unwrap_or_default());
    assert_eq!(
        verbs_on(&have, GROUP, PLANS),
        set(&["get", "list", "watch"]),
        "the agent may only read plans (no spec writes, no create or delete)"
    );
    assert_eq!(
        verbs_on(&have, GROUP, PLAN_STATUS),
        set(&["patch"]),
        "the agent writes status through the status subresource (server-side apply is a PATCH)"
    );
    assert_eq!(
        verbs_on(&have, GROUP, SLICES),
        set(&["get", "list", "watch"]),
        "the agent may only read slices"
    );
    let mut want: BTreeSet<Grant> = BTreeSet::new();
    want.extend(grant(GROUP, PLANS, &["get", "list", "watch"], None));
    want.extend(grant(GROUP, SLICES, &["get", "list", "watch"], None));
    want.extend(grant(GROUP, PLAN_STATUS, &["patch"], None));
    assert_eq!(have, want, "ClusterRole {AGENT} grants nothing else");

    let binding: ClusterRoleBinding = tree.resource("ClusterRoleBinding", AGENT).typed();
    assert_eq!(
        (binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
        ("ClusterRole", AGENT)
    );
}

#[test]
fn roles_are_bound_only_to_switchyard_service_accounts_and_use_no_wildcards() {
    let tree = Tree::load();
    let roles: Vec<&Doc> = tree
        .resources
        .iter()
        .filter(|doc| matches!(doc.kind(), "Role" | "ClusterRole"))
        .collect();
    let names: BTreeSet<(String, String)> = roles
        .iter()
        .map(|doc| (doc.kind().to_string(), doc.name().to_string()))
        .collect();
    assert_eq!(
        names,
        [
            ("ClusterRole", AGENT),
            ("ClusterRole", CONTROLLER),
            ("Role", LEADER_ELECTION)
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect(),
        "unexpected set of roles"
    );
    for doc in roles {
        let rules: Vec<PolicyRule> = serde_json::from_value(doc.value["rules"].clone()).unwrap();
        for rule in &rules {
            let all = rule
                .api_groups
                .iter()
                .flatten()
                .chain(rule.resources.iter().flatten())
                .chain(&rule.verbs);
            for item in all {
                assert!(
                    !item.contains('*'),
                    "{}: wildcard in {rule:?}",
                    doc.file.display()
                );
            }
        }
    }
    let service_accounts: BTreeSet<&str> = tree
        .resources
        .iter()
        .filter(|doc| doc.kind() == "ServiceAccount")
        .map(|doc| doc.name())
        .collect();
    assert_eq!(service_accounts, BTreeSet::from([AGENT, CONTROLLER]));
    let mut bound = BTreeSet::new();
    for doc in tree
        .resources
        .iter()
        .filter(|doc| matches!(doc.kind(), "RoleBinding" | "ClusterRoleBinding"))
    {
        let subjects = doc.value["subjects"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            subjects.len(),
            1,
            "{}: one subject per binding",
            doc.file.display()
        );
        let subject = &subjects[0];
        assert_eq!(subject["kind"], "ServiceAccount", "{}", doc.file.display());
        assert_eq!(subject["namespace"], NAMESPACE, "{}", doc.file.display());
        let account = subject["name"].as_str().unwrap();
        assert!(
            account == AGENT && doc.name() == AGENT
                || account == CONTROLLER && doc.name().starts_with(CONTROLLER),
            "{}: {} is bound to {account}",
            doc.file.display(),
            doc.name()
        );
        bound.insert(doc.value["roleRef"]["name"].as_str().unwrap().to_string());
    }
    assert_eq!(
        bound,
        set(&[AGENT, CONTROLLER, LEADER_ELECTION]),
        "every role is bound"
    );
}

#[test]
fn admission_policy_confines_the_agent_to_its_own_nodes_plan_status() {
    let tree = Tree::load();
    let policy: ValidatingAdmissionPolicy = tree.resource("ValidatingAdmissionPolicy", POLICY).typed();
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    assert!(spec.param_kind.is_none(), "no parameters");

    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("matchConstraints.resourceRules");
    assert_eq!(rules.len(), 1, "one resource rule");
    let rule = &rules[0];
    assert_eq!(rule.api_groups.as_deref(), Some(&[GROUP.to_string()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&[PLAN_STATUS.to_string()][..]));
    assert!(
        rule.operations.iter().flatten().any(|op| op == "UPDATE"),
        "PATCH and server-side apply reach admission as UPDATE"
    );

    // Only the agent's requests are judged; the username follows the ServiceAccount object.
    let account = tree.resource("ServiceAccount", AGENT);
    let username = format!(
        "system:serviceaccount:{}:{}",
        account.namespace().unwrap(),
        account.name()
    );
    let conditions = spec.match_conditions.unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.expression.contains("request.userInfo.username")
                && c.expression.contains(&format!("'{username}'"))),
        "a matchCondition on the agent's username {username}: {conditions:?}"
    );

    // The node name comes from the token, and the object's name must equal it.
    let variables: String = spec
        .variables
        .unwrap_or_default()
        .iter()
        .map(|v| v.expression.clone())
        .collect();
    let validations = spec.validations.unwrap_or_default();
    let expressions: String = validations
        .iter()
        .map(|v| v.expression.clone())
        .collect::<String>()
        + &variables;
    assert!(
        expressions.contains(&format!("request.userInfo.extra['{NODE_NAME_EXTRA}']")),
        "the policy reads the node name from userInfo.extra['{NODE_NAME_EXTRA}']"
    );
    assert!(
        expressions.contains(&format!("'{NODE_NAME_EXTRA}' in request.userInfo.extra")),
        "the policy checks that the node name is present before indexing"
    );
    assert!(
        expressions.contains("has(request.userInfo.extra)"),
        "a user without extras has no `extra` field: the policy guards with has() first"
    );
    assert!(
        validations
            .iter()
            .any(|v| v.expression.contains("object.metadata.name")),
        "a validation compares object.metadata.name with the node name"
    );
    for validation in &validations {
        assert!(
            validation.message.is_some() || validation.message_expression.is_some(),
            "every validation explains itself: {}",
            validation.expression
        );
        assert_eq!(validation.reason.as_deref(), Some("Forbidden"));
    }
    assert!(
        validations.iter().any(|v| v
            .message_expression
            .as_deref()
            .is_some_and(|m| m.contains("object.metadata.name"))),
        "the denial names the plan the agent tried to write"
    );

    let binding: ValidatingAdmissionPolicyBinding =
        tree.resource("ValidatingAdmissionPolicyBinding", POLICY).typed();
    let binding = binding.spec;
    assert_eq!(binding.policy_name, POLICY);
    assert_eq!(binding.validation_actions, vec!["Deny".to_string()]);
    assert!(binding.param_ref.is_none());
}

#[test]
fn admission_policy_lets_the_controller_change_only_the_backend_label_of_nodes() {
    let tree = Tree::load();
    let policy: ValidatingAdmissionPolicy = tree.resource("ValidatingAdmissionPolicy", NODE_POLICY).typed();
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    assert!(spec.param_kind.is_none(), "no parameters");
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("matchConstraints.resourceRules");
    assert_eq!(rules.len(), 1, "one resource rule");
    let rule = &rules[0];
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["nodes".to_string()][..]));
    assert_eq!(
        rule.operations.as_deref(),
        Some(&["UPDATE".to_string()][..]),
        "PATCH and server-side apply reach admission as UPDATE"
    );
    let account = tree.resource("ServiceAccount", CONTROLLER);
    let username = format!(
        "system:serviceaccount:{}:{}",
        account.namespace().unwrap(),
        account.name()
    );
    let conditions = spec.match_conditions.unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.expression.contains("request.userInfo.username")
                && c.expression.contains(&format!("'{username}'"))),
        "a matchCondition on the controller's username {username}: {conditions:?}"
    );
    let validations = spec.validations.unwrap_or_default();
    let all: String = validations.iter().map(|v| v.expression.clone()).collect();
    for needle in [
        format!("k == '{LABEL_BACKEND}'"),
        "object.metadata.labels".to_string(),
        "oldObject.metadata.labels".to_string(),
        "object.metadata.annotations == oldObject.metadata.annotations".to_string(),
        "object.metadata.finalizers == oldObject.metadata.finalizers".to_string(),
        "object.spec == oldObject.spec".to_string(),
        "has(oldObject.metadata.labels)".to_string(),
    ] {
        assert!(all.contains(&needle), "the validations check {needle}: {all}");
    }
    // Both directions of the labels: none added or changed, none removed.
    assert!(validations.iter().any(|v| {
        v.expression
            .trim_start()
            .starts_with("!has(object.metadata.labels)")
    }));
    assert!(validations.iter().any(|v| {
        v.expression
            .trim_start()
            .starts_with("!has(oldObject.metadata.labels)")
    }));
    for validation in &validations {
        assert!(
            validation.message.is_some() || validation.message_expression.is_some(),
            "every validation explains itself: {}",
            validation.expression
        );
        assert_eq!(validation.reason.as_deref(), Some("Forbidden"));
    }
    // The configured label is the one the policy allows.
    let config: Config = Config::load(&tree.root.join("config/controller/config.yaml")).unwrap();
    assert_eq!(config.backend_node_label, LABEL_BACKEND);

    let binding: ValidatingAdmissionPolicyBinding = tree
        .resource("ValidatingAdmissionPolicyBinding", NODE_POLICY)
        .typed();
    assert_eq!(binding.spec.policy_name, NODE_POLICY);
    assert_eq!(binding.spec.validation_actions, vec!["Deny".to_string()]);
}

#[test]
fn agent_daemonset_has_what_the_data_plane_needs_and_no_more() {
    let tree = Tree::load();
    let daemonset: DaemonSet = tree.resource("DaemonSet", AGENT).typed();
    let spec = daemonset.spec.expect("spec");
    let strategy = spec.update_strategy.expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.and_then(|r| r.max_unavailable),
        Some(IntOrString::Int(1))
    );
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    assert_eq!(pod.service_account_name.as_deref(), Some(AGENT));
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "tolerates every taint (runs on every node): {tolerations:?}"
    );

    let agent = container(&pod, "agent");
    assert_eq!(
        agent.image.as_deref(),
        Some(AGENT),
        "the image name config/default rewrites"
    );
    assert_eq!(
        agent.args.clone().unwrap_or_default(),
        [
            "run",
            "--node-name=$(NODE_NAME)",
            &format!("--metrics-bind=:{AGENT_PORT}"),
            "--state-dir=/var/lib/switchyard"
        ]
    );
    assert_eq!(
        env_field_ref(agent, "NODE_NAME").as_deref(),
        Some("spec.nodeName")
    );

    let security = agent.security_context.as_ref().expect("securityContext");
    assert_ne!(security.privileged, Some(true), "the agent is not privileged");
    let (add, drop) = capabilities(agent);
    assert_eq!(add, set(&["NET_ADMIN", "NET_RAW"]));
    assert!(drop.contains("ALL"));

    let (path, port) = probe_target(agent.liveness_probe.as_ref());
    assert_eq!((path.as_str(), probe_port(agent, &port)), ("/livez", AGENT_PORT));
    let (path, port) = probe_target(agent.readiness_probe.as_ref());
    assert_eq!((path.as_str(), probe_port(agent, &port)), ("/readyz", AGENT_PORT));

    let requests = agent.resources.as_ref().and_then(|r| r.requests.as_ref());
    assert_eq!(quantity(requests, "cpu").as_deref(), Some("20m"));
    assert_eq!(quantity(requests, "memory").as_deref(), Some("32Mi"));

    // Host paths: (mount path, host path, hostPath type, read-only).
    let volumes = pod.volumes.clone().unwrap_or_default();
    let host_mount = |mount_path: &str| {
        let mount = agent
            .volume_mounts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|m| m.mount_path == mount_path)
            .unwrap_or_else(|| panic!("the agent mounts {mount_path}"))
            .clone();
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.host_path.clone())
            .unwrap_or_else(|| panic!("{mount_path} comes from a hostPath volume"));
        (volume.path, volume.type_, mount.read_only.unwrap_or(false))
    };
    assert_eq!(
        host_mount("/run/xtables.lock"),
        (
            "/run/xtables.lock".to_string(),
            Some("FileOrCreate".to_string()),
            false
        )
    );
    let (path, _, read_only) = host_mount("/lib/modules");
    assert_eq!((path.as_str(), read_only), ("/lib/modules", true));
    assert_eq!(
        host_mount("/var/lib/switchyard"),
        (
            "/var/lib/switchyard".to_string(),
            Some("DirectoryOrCreate".to_string()),
            false
        )
    );
    let host_paths: Vec<_> = volumes.iter().filter_map(|v| v.host_path.as_ref()).collect();
    assert_eq!(host_paths.len(), 3, "no other host paths: {host_paths:?}");

    // Conntrack's sysctls: a one-shot privileged init container (/proc/sys is read-only to the agent).
    let init = pod.init_containers.clone().unwrap_or_default();
    assert_eq!(init.len(), 1, "{init:?}");
    let sysctls = &init[0];
    assert_eq!(sysctls.name, "conntrack-sysctls");
    assert_eq!(sysctls.image.as_deref(), Some(AGENT));
    assert_eq!(
        sysctls.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    // The agent image has no shell (mmdebstrap's extract variant: the agent's tools only), so the
    // command is the agent itself: it loads nf_conntrack and never fails the pod.
    let command = sysctls.command.clone().unwrap_or_default();
    assert_eq!(
        command,
        [
            "/usr/local/bin/switchyard-agent",
            "set-sysctls",
            "--load-module",
            "--never-fail"
        ],
        "{command:?}"
    );
    let mounts = sysctls.volume_mounts.clone().unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m.mount_path == "/lib/modules" && m.read_only == Some(true)),
        "it can modprobe from /lib/modules: {mounts:?}"
    );
}

#[test]
fn controller_deployment_is_leader_elected_and_locked_down() {
    let tree = Tree::load();
    let deployment: Deployment = tree.resource("Deployment", CONTROLLER).typed();
    let spec = deployment.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(CONTROLLER));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_ne!(pod.host_network, Some(true));

    let spread_across_nodes = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .is_some_and(|anti| {
            let preferred = anti
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .map(|w| &w.pod_affinity_term);
            let required = anti
                .required_during_scheduling_ignored_during_execution
                .iter()
                .flatten();
            preferred
                .chain(required)
                .any(|term| term.topology_key == "kubernetes.io/hostname")
        })
        || pod
            .topology_spread_constraints
            .iter()
            .flatten()
            .any(|c| c.topology_key == "kubernetes.io/hostname");
    assert!(spread_across_nodes, "the two replicas are spread across nodes");

    let pod_security = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert!(pod_security.run_as_user.is_some_and(|uid| uid != 0));
    assert_eq!(
        pod_security.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );

    let controller = container(&pod, "controller");
    assert_eq!(
        controller.image.as_deref(),
        Some(CONTROLLER),
        "the image name config/default rewrites"
    );
    assert_eq!(
        controller.args.clone().unwrap_or_default(),
        [
            "run",
            "--config=/etc/switchyard/config.yaml",
            "--leader-elect",
            &format!("--metrics-bind=:{CONTROLLER_PORT}")
        ]
    );
    assert_eq!(
        env_field_ref(controller, "POD_NAME").as_deref(),
        Some("metadata.name")
    );
    assert_eq!(
        env_field_ref(controller, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    let security = controller.security_context.as_ref().expect("securityContext");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_ne!(security.privileged, Some(true));
    let (add, drop) = capabilities(controller);
    assert!(add.is_empty());
    assert_eq!(drop, set(&["ALL"]));

    let (path, port) = probe_target(controller.liveness_probe.as_ref());
    assert_eq!(
        (path.as_str(), probe_port(controller, &port)),
        ("/healthz", CONTROLLER_PORT)
    );
    let (path, port) = probe_target(controller.readiness_probe.as_ref());
    assert_eq!(
        (path.as_str(), probe_port(controller, &port)),
        ("/readyz", CONTROLLER_PORT)
    );

    let resources = controller.resources.as_ref().expect("resources");
    for key in ["cpu", "memory"] {
        assert!(
            quantity(resources.requests.as_ref(), key).is_some(),
            "request {key}"
        );
        assert!(quantity(resources.limits.as_ref(), key).is_some(), "limit {key}");
    }

    // The config file the args name is the ConfigMap generated from config/controller/config.yaml.
    let mount = controller
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|m| m.mount_path == "/etc/switchyard")
        .expect("the configuration is mounted at /etc/switchyard");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.config_map.as_ref())
        .expect("from a ConfigMap");
    assert_eq!(volume.name, CONFIG_MAP);
    let generators = tree.kustomization("config/controller")["configMapGenerator"].clone();
    let generator = generators
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["name"] == CONFIG_MAP)
        .expect("config/controller generates the ConfigMap");
    assert_eq!(strings(&generator["files"]), vec!["config.yaml".to_string()]);
}

#[test]
fn controller_configuration_is_accepted_by_the_controller() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("config/controller/config.yaml")).unwrap();
    let config = Config::parse(&text).unwrap_or_else(|problems| {
        panic!(
            "config/controller/config.yaml is invalid:\n{}",
            problems.join("\n")
        )
    });
    assert!(
        !config.cluster_cidrs.is_empty(),
        "clusterCIDRs placeholder is set"
    );
    assert_eq!(
        config.backend_node_label, LABEL_BACKEND,
        "the IPVS overlay selects nodes by the label the controller reads"
    );
}

#[test]
fn ports_do_not_collide_with_kube_proxy_or_the_kubelet() {
    for port in [CONTROLLER_PORT, AGENT_PORT] {
        assert!(!TAKEN_PORTS.contains(&port), "{port}");
    }
    assert_ne!(CONTROLLER_PORT, AGENT_PORT);
}

/// kube-proxy's health port is the agent's too (cloud load balancers probe it), and nothing probes it
/// for liveness: kube-proxy holds it during a migration, and it fails on purpose while a node leaves.
#[test]
fn the_agent_declares_kube_proxys_health_port_and_never_probes_it() {
    let tree = Tree::load();
    let daemonset: DaemonSet = tree.resource("DaemonSet", AGENT).typed();
    let pod = daemonset.spec.expect("spec").template.spec.expect("pod spec");
    let agent = container(&pod, "agent");
    let ports: Vec<(Option<&str>, i32, Option<i32>)> = agent
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.container_port, p.host_port))
        .collect();
    assert!(
        ports.contains(&(Some("healthz"), 10256, Some(10256))),
        "{ports:?}"
    );
    for probe in [
        &agent.liveness_probe,
        &agent.readiness_probe,
        &agent.startup_probe,
    ] {
        let Some(probe) = probe else { continue };
        let (_, port) = probe_target(Some(probe));
        assert_eq!(probe_port(agent, &port), AGENT_PORT, "{probe:?}");
    }
}

#[test]
fn default_installs_everything_and_sets_both_images() {
    let tree = Tree::load();
    let default = tree.kustomization("config/default");
    let resources = strings(&default["resources"]);
    for base in ["../crd", "../rbac", "../controller", "../agent"] {
        assert!(
            resources.iter().any(|r| r == base),
            "config/default includes {base}"
        );
    }
    let namespace = tree.resource("Namespace", NAMESPACE);
    assert_eq!(namespace.file, Path::new("config/default/namespace.yaml"));
    assert_eq!(
        namespace.value["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
        "the agent needs hostNetwork, hostPath and NET_ADMIN"
    );
    let images = images(default);
    for name in [CONTROLLER, AGENT] {
        let (new_name, tag) = images
            .get(name)
            .unwrap_or_else(|| panic!("config/default sets the {name} image"));
        assert!(
            new_name.ends_with(name) && !tag.is_empty(),
            "{name}: {new_name}:{tag}"
        );
    }
}

fn images(kustomization: &Value) -> BTreeMap<String, (String, String)> {
    kustomization["images"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|image| {
            (
                image["name"].as_str().unwrap_or_default().to_string(),
                (
                    image["newName"].as_str().unwrap_or_default().to_string(),
                    image["newTag"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn ipvs_overlay_gives_ipvs_nodes_their_own_agent() {
    let tree = Tree::load();
    let overlay = tree.kustomization("config/overlays/ipvs");
    let resources = strings(&overlay["resources"]);
    assert!(resources.iter().any(|r| r == "../../default"));
    assert_eq!(
        images(overlay).get(AGENT),
        images(tree.kustomization("config/default")).get(AGENT),
        "the overlay's agent image must equal config/default's"
    );

    // The copy of the agent for IPVS nodes.
    let ipvs = tree.kustomization("config/overlays/ipvs/agent-ipvs");
    assert_eq!(strings(&ipvs["resources"]), vec!["../../../agent".to_string()]);
    assert_eq!(ipvs["nameSuffix"], "-ipvs");
    let patch = tree.patch("config/overlays/ipvs/agent-ipvs/ipvs-agent.yaml");
    let mut daemonset: DaemonSet = tree.resource("DaemonSet", AGENT).typed();
    daemonset.merge_from(patch.typed());
    let pod = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    assert_eq!(
        pod.node_selector
            .clone()
            .unwrap_or_default()
            .get(LABEL_BACKEND)
            .map(String::as_str),
        Some("ipvs")
    );
    let patch_pod = &patch.value["spec"]["template"]["spec"];
    let caps: Vec<String> = strings(&patch_pod["containers"][0]["securityContext"]["capabilities"]["add"]);
    assert_eq!(
        caps.into_iter().collect::<BTreeSet<_>>(),
        set(&["NET_ADMIN", "NET_RAW", "SYS_MODULE"]),
        "the IPVS agent keeps NET_ADMIN and NET_RAW and adds SYS_MODULE"
    );
    let init = &patch_pod["initContainers"][0];
    assert_eq!(init["image"], AGENT);
    let mounts = init["volumeMounts"].as_array().cloned().unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"] == "/lib/modules" && m["readOnly"] == true),
        "the IPVS setup container can modprobe from /lib/modules"
    );
    let command = strings(&init["command"]);
    assert_eq!(
        command.first().map(String::as_str),
        Some("/usr/local/bin/switchyard-agent"),
        "the image has no shell: {command:?}"
    );
    assert!(
        command.iter().any(|a| a == "--ipvs") && command.iter().any(|a| a == "--never-fail"),
        "loads IPVS's modules, sets its sysctls and never blocks the agent: {command:?}"
    );
    let instance = &patch.value["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"];
    assert_eq!(
        instance, AGENT_IPVS,
        "its own selector, not overlapping the default agent's"
    );

    // The default agent stays off IPVS nodes.
    let skip = tree.patch("config/overlays/ipvs/agent-skip-ipvs-nodes.yaml");
    let term = &skip.value["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term["key"], LABEL_BACKEND);
    assert_eq!(term["operator"], "NotIn");
    assert_eq!(strings(&term["values"]), vec!["ipvs".to_string()]);
}

#[test]
fn beside_kube_proxy_overlay_runs_the_agent_only_on_labelled_nodes() {
    let tree = Tree::load();
    let overlay = tree.kustomization("config/overlays/beside-kube-proxy");
    assert_eq!(strings(&overlay["resources"]), vec!["../../default".to_string()]);
    let patch = tree.patch("config/overlays/beside-kube-proxy/agent-on-migrated-nodes.yaml");
    assert_eq!(patch.name(), AGENT);
    let selector = &patch.value["spec"]["template"]["spec"]["nodeSelector"];
    assert_eq!(
        selector.as_object().map(|m| m.len()),
        Some(1),
        "the patch adds one key (kustomize merges it into the DaemonSet's nodeSelector: the rendered \
         test checks kubernetes.io/os stays)"
    );
    assert_eq!(selector[PROXY_LABEL], "switchyard");
    // The guide that goes with it names the same label for kube-proxy's DaemonSet.
    let guide = std::fs::read_to_string(tree.root.join("docs/migration.md")).unwrap();
    assert!(
        guide.contains(&format!("key: {PROXY_LABEL}")) && guide.contains("config/overlays/beside-kube-proxy"),
        "docs/migration.md gives kube-proxy the opposite affinity"
    );
}

// ---------------------------------------------------------------------------------------------------
// (b) Rendered output, with kubectl
// ---------------------------------------------------------------------------------------------------

/// `kubectl kustomize <dir>` parsed, or `None` (after a `skip:` line) without kubectl.
fn kustomize(test: &str, dir: &str) -> Option<Vec<Doc>> {
    let root = repo_root();
    let output = match Command::new("kubectl")
        .args(["kustomize", dir])
        .current_dir(&root)
        .output()
    {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var("SWITCHYARD_REQUIRE_KUBECTL").as_deref() == Ok("1") {
                panic!("{test}: kubectl is not on PATH (SWITCHYARD_REQUIRE_KUBECTL=1)");
            }
            eprintln!("skip: {test}: kubectl is not on PATH, `kubectl kustomize {dir}` not checked");
            return None;
        }
        Err(error) => panic!("{test}: running kubectl: {error}"),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    Some(
        docs.into_iter()
            .filter(|doc| !doc.is_null())
            .map(|value| Doc {
                file: PathBuf::from(format!("<kubectl kustomize {dir}>")),
                value,
            })
            .collect(),
    )
}

const NAMESPACED: &[&str] = &[
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Deployment",
    "DaemonSet",
];

/// (kind, name, namespace) of everything `config/default` must render; the ConfigMap's name is
/// a prefix (kustomize appends a content hash).
fn expected_default() -> BTreeSet<(String, String, Option<String>)> {
    let ns = Some(NAMESPACE.to_string());
    let crd = format!("{PLANS}.{GROUP}");
    let slice_crd = format!("{SLICES}.{GROUP}");
    let rollout_crd = format!("{ROLLOUTS}.{GROUP}");
    [
        ("Namespace", NAMESPACE, None),
        ("CustomResourceDefinition", crd.as_str(), None),
        ("CustomResourceDefinition", slice_crd.as_str(), None),
        ("CustomResourceDefinition", rollout_crd.as_str(), None),
        ("ServiceAccount", CONTROLLER, ns.clone()),
        ("ServiceAccount", AGENT, ns.clone()),
        ("ClusterRole", CONTROLLER, None),
        ("ClusterRole", AGENT, None),
        ("ClusterRoleBinding", CONTROLLER, None),
        ("ClusterRoleBinding", AGENT, None),
        ("Role", LEADER_ELECTION, ns.clone()),
        ("RoleBinding", LEADER_ELECTION, ns.clone()),
        ("ConfigMap", CONFIG_MAP, ns.clone()),
        ("Deployment", CONTROLLER, ns.clone()),
        ("DaemonSet", AGENT, ns.clone()),
        ("ValidatingAdmissionPolicy", POLICY, None),
        ("ValidatingAdmissionPolicyBinding", POLICY, None),
        ("ValidatingAdmissionPolicy", NODE_POLICY, None),
        ("ValidatingAdmissionPolicyBinding", NODE_POLICY, None),
    ]
    .into_iter()
    .map(|(kind, name, ns)| (kind.to_string(), name.to_string(), ns))
    .collect()
}

/// Checks the rendered set of objects and returns them by (kind, name).
fn check_rendered(
    docs: &[Doc],
    want: &BTreeSet<(String, String, Option<String>)>,
) -> BTreeMap<(String, String), Doc> {
    let mut have = BTreeSet::new();
    let mut by_name = BTreeMap::new();
    let mut config_map = None;
    for doc in docs {
        let kind = doc.kind().to_string();
        let mut name = doc.name().to_string();
        if kind == "ConfigMap" {
            let hash = name
                .strip_prefix(&format!("{CONFIG_MAP}-"))
                .unwrap_or_else(|| panic!("unexpected ConfigMap {name}"));
            assert!(!hash.is_empty());
            config_map = Some(doc.name().to_string());
            name = CONFIG_MAP.to_string();
        }
        let namespace = doc.namespace().map(str::to_string);
        if NAMESPACED.contains(&kind.as_str()) {
            assert_eq!(namespace.as_deref(), Some(NAMESPACE), "{kind} {name}");
        } else {
            assert_eq!(namespace, None, "cluster-scoped {kind} {name} has a namespace");
        }
        assert!(
            have.insert((kind.clone(), name.clone(), namespace)),
            "{kind} {name} rendered twice"
        );
        assert_known_fields(doc);
        by_name.insert((kind, name), doc.clone());
    }
    assert_eq!(&have, want, "rendered objects");

    // The Deployment mounts the generated ConfigMap (with its hash), and images are rewritten.
    let deployment: Deployment = by_name[&("Deployment".to_string(), CONTROLLER.to_string())].typed();
    let pod = deployment.spec.and_then(|s| s.template.spec).unwrap();
    let volume_names: Vec<String> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
        .collect();
    assert_eq!(volume_names, vec![config_map.expect("a generated ConfigMap")]);
    let image = container(&pod, "controller").image.clone().unwrap_or_default();
    assert!(
        image.contains(&format!("/{CONTROLLER}:")),
        "controller image {image}"
    );

    // The rendered CRDs are the generated ones (kustomize only adds labels).
    for plural in CRDS {
        let mut crd = by_name[&(
            "CustomResourceDefinition".to_string(),
            format!("{plural}.{GROUP}"),
        )]
            .value
            .clone();
        crd["metadata"].as_object_mut().unwrap().remove("labels");
        let generated = parse_yaml(&repo_root(), Path::new(&format!("crds/{plural}.{GROUP}.yaml")));
        if let Some(path) = first_difference(&crd, &generated[0], "") {
            panic!("the rendered CRD {plural} differs from crds/ at {path}");
        }
    }
    by_name
}

/// Fails when `doc` has a field its Kubernetes type does not know (a typo such as `readonly` would
/// otherwise be dropped silently by the API server): it must survive a round trip through the type.
fn assert_round_trips<T: DeserializeOwned + serde::Serialize>(doc: &Doc) {
    let typed: T = doc.typed();
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(path) = first_difference(&doc.value, &back, "") {
        panic!(
            "{} {}: `{path}` is not a field of the Kubernetes type (or has the wrong shape)",
            doc.kind(),
            doc.name()
        );
    }
}

fn assert_known_fields(doc: &Doc) {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    match doc.kind() {
        "Namespace" => assert_round_trips::<Namespace>(doc),
        "ServiceAccount" => assert_round_trips::<ServiceAccount>(doc),
        "ConfigMap" => assert_round_trips::<ConfigMap>(doc),
        "ClusterRole" => assert_round_trips::<ClusterRole>(doc),
        "ClusterRoleBinding" => assert_round_trips::<ClusterRoleBinding>(doc),
        "Role" => assert_round_trips::<Role>(doc),
        "RoleBinding" => assert_round_trips::<RoleBinding>(doc),
        "Deployment" => assert_round_trips::<Deployment>(doc),
        "DaemonSet" => assert_round_trips::<DaemonSet>(doc),
        "ValidatingAdmissionPolicy" => assert_round_trips::<ValidatingAdmissionPolicy>(doc),
        "ValidatingAdmissionPolicyBinding" => assert_round_trips::<ValidatingAdmissionPolicyBinding>(doc),
        "CustomResourceDefinition" => assert_round_trips::<CustomResourceDefinition>(doc),
        // The Prometheus Operator's kinds have no type here: the fields the monitoring component
        // uses, from the Operator's CRDs (monitoring.coreos.com/v1); a PrometheusRule's groups are
        // promtool's to check (tests/monitoring.rs).
        "PodMonitor" => assert_fields_within(
            doc,
            &[
                "spec.selector.matchLabels.*",
                "spec.podMetricsEndpoints[].port",
                "spec.podMetricsEndpoints[].path",
                "spec.podMetricsEndpoints[].interval",
                "spec.podMetricsEndpoints[].honorLabels",
                "spec.podMetricsEndpoints[].relabelings[].sourceLabels[]",
                "spec.podMetricsEndpoints[].relabelings[].targetLabel",
            ],
        ),
        "PrometheusRule" => assert_fields_within(doc, &["spec.groups[]*"]),
        other => panic!("no type for kind {other}: teach assert_known_fields"),
    }
}

/// Fails when `doc` has a field outside apiVersion, kind, metadata's name, namespace and labels, and
/// `allowed` (paths with `[]` for list items, `.*` for any key of a map of strings, a trailing `*` for
/// anything below).
fn assert_fields_within(doc: &Doc, allowed: &[&str]) {
    fn leaves(value: &Value, at: String, into: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    let path = if at.is_empty() {
                        key.clone()
                    } else {
                        format!("{at}.{key}")
                    };
                    leaves(value, path, into);
                }
            }
            Value::Array(items) => {
                for item in items {
                    leaves(item, format!("{at}[]"), into);
                }
            }
            _ => into.push(at),
        }
    }
    let mut paths = Vec::new();
    leaves(&doc.value, String::new(), &mut paths);
    let base = [
        "apiVersion",
        "kind",
        "metadata.name",
        "metadata.namespace",
        "metadata.labels.*",
    ];
    for path in paths {
        let known = base.iter().chain(allowed).any(|pattern| {
            if let Some(prefix) = pattern.strip_suffix(".*") {
                path.strip_prefix(prefix)
                    .is_some_and(|rest| rest.len() > 1 && rest.starts_with('.'))
            } else if let Some(prefix) = pattern.strip_suffix('*') {
                path.starts_with(prefix)
            } else {
                path == *pattern
            }
        });
        assert!(
            known,
            "{} {}: `{path}` is not a field this test knows",
            doc.kind(),
            doc.name()
        );
    }
}

/// Where two JSON values first differ (numbers compared by value: kustomize writes `31.0` as `31`).
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| match (a.get(key), b.get(key)) {
                (Some(x), Some(y)) => first_difference(x, y, &format!("{at}.{key}")),
                _ => Some(format!("{at}.{key}")),
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}[{i}]"))),
        (Value::Number(a), Value::Number(b)) => (a.as_f64() != b.as_f64()).then(|| at.to_string()),
        _ => (a != b).then(|| at.to_string()),
    }
}

fn agent_image(by_name: &BTreeMap<(String, String), Doc>, name: &str) -> (DaemonSet, String) {
    let daemonset: DaemonSet = by_name[&("DaemonSet".to_string(), name.to_string())].typed();
    let pod = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .unwrap();
    let image = container(pod, "agent").image.clone().unwrap_or_default();
    assert!(image.contains(&format!("/{AGENT}:")), "{name} image {image}");
    (daemonset, image)
}

#[test]
fn kubectl_kustomize_renders_config_default() {
    let Some(docs) = kustomize("kubectl_kustomize_renders_config_default", "config/default") else {
        return;
    };
    let by_name = check_rendered(&docs, &expected_default());
    let (daemonset, _) = agent_image(&by_name, AGENT);
    let pod = daemonset.spec.and_then(|s| s.template.spec).unwrap();
    assert!(
        pod.affinity.is_none(),
        "without the overlay the agent runs on every node"
    );
}

#[test]
fn kubectl_kustomize_renders_config_overlays_ipvs() {
    let Some(docs) = kustomize(
        "kubectl_kustomize_renders_config_overlays_ipvs",
        "config/overlays/ipvs",
    ) else {
        return;
    };
    let mut want = expected_default();
    want.insert((
        "DaemonSet".to_string(),
        AGENT_IPVS.to_string(),
        Some(NAMESPACE.to_string()),
    ));
    let by_name = check_rendered(&docs, &want);
    let (default_agent, default_image) = agent_image(&by_name, AGENT);
    let (ipvs_agent, ipvs_image) = agent_image(&by_name, AGENT_IPVS);
    assert_eq!(default_image, ipvs_image, "both agents run the same image");

    // The default agent avoids ipvs nodes; the IPVS agent runs only there.
    let default_spec = default_agent.spec.unwrap();
    let default_pod = default_spec.template.spec.clone().unwrap();
    let terms = default_pod
        .affinity
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .expect("the default agent has a required node affinity")
        .node_selector_terms;
    assert!(terms.iter().all(|term| {
        term.match_expressions.iter().flatten().any(|e| {
            e.key == LABEL_BACKEND
                && e.operator == "NotIn"
                && e.values.as_deref() == Some(&["ipvs".to_string()][..])
        })
    }));
    let ipvs_spec = ipvs_agent.spec.unwrap();
    let ipvs_pod = ipvs_spec.template.spec.clone().unwrap();
    assert!(
        ipvs_pod.affinity.is_none(),
        "the NotIn patch must not reach the IPVS agent"
    );
    assert_eq!(
        ipvs_pod
            .node_selector
            .clone()
            .unwrap_or_default()
            .get(LABEL_BACKEND)
            .map(String::as_str),
        Some("ipvs")
    );
    assert_eq!(
        ipvs_pod.service_account_name.as_deref(),
        Some(AGENT),
        "same identity as the default agent"
    );
    let (add, _) = capabilities(container(&ipvs_pod, "agent"));
    assert_eq!(add, set(&["NET_ADMIN", "NET_RAW", "SYS_MODULE"]));
    let init = ipvs_pod.init_containers.clone().unwrap_or_default();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["ipvs-setup", "conntrack-sysctls"],
        "the patch's comes first"
    );
    assert!(
        init.iter()
            .all(|c| c.image.as_deref() == Some(ipvs_image.as_str()))
    );
    // No shell in the image: the IPVS setup is the agent's own command, and never fails the pod.
    let setup = init[0].command.clone().unwrap_or_default();
    assert_eq!(
        setup,
        [
            "/usr/local/bin/switchyard-agent",
            "set-sysctls",
            "--ipvs",
            "--load-module",
            "--never-fail"
        ],
        "{setup:?}"
    );

    // Neither DaemonSet's selector matches the other's pods.
    let labels = |spec: &k8s_openapi::api::apps::v1::DaemonSetSpec| {
        spec.template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    };
    let selects = |spec: &k8s_openapi::api::apps::v1::DaemonSetSpec, labels: &BTreeMap<String, String>| {
        spec.selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(&default_spec, &labels(&default_spec)));
    assert!(selects(&ipvs_spec, &labels(&ipvs_spec)));
    assert!(!selects(&default_spec, &labels(&ipvs_spec)), "selectors overlap");
    assert!(!selects(&ipvs_spec, &labels(&default_spec)), "selectors overlap");
}

#[test]
fn kubectl_kustomize_renders_config_overlays_beside_kube_proxy() {
    let Some(docs) = kustomize(
        "kubectl_kustomize_renders_config_overlays_beside_kube_proxy",
        "config/overlays/beside-kube-proxy",
    ) else {
        return;
    };
    let by_name = check_rendered(&docs, &expected_default());
    let (daemonset, _) = agent_image(&by_name, AGENT);
    let selector = daemonset
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.node_selector)
        .unwrap_or_default();
    assert_eq!(
        selector,
        BTreeMap::from([
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            (PROXY_LABEL.to_string(), "switchyard".to_string()),
        ])
    );
}

#[test]
fn kubectl_kustomize_renders_config_default_with_the_monitoring_component() {
    // An overlay as docs/install.md shows it, in target/ (relative paths: kustomize's load rules).
    let dir = repo_root().join("target/kustomize-monitoring");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n\
         - ../../config/default\ncomponents:\n- ../../config/components/monitoring\n",
    )
    .unwrap();
    let Some(docs) = kustomize(
        "kubectl_kustomize_renders_config_default_with_the_monitoring_component",
        "target/kustomize-monitoring",
    ) else {
        return;
    };
    let kinds: Vec<(String, String)> = docs
        .iter()
        .map(|doc| (doc.kind().to_owned(), doc.name().to_owned()))
        .collect();
    for (kind, name) in [
        ("PodMonitor", "switchyard-agent"),
        ("PodMonitor", "switchyard-controller"),
        ("PrometheusRule", "switchyard"),
        ("DaemonSet", AGENT),
    ] {
        assert!(
            kinds.iter().any(|(k, n)| k == kind && n == name),
            "{kind} {name} not rendered: {kinds:?}"
        );
    }
    let dashboard = docs
        .iter()
        .find(|doc| doc.kind() == "ConfigMap" && doc.name().starts_with("switchyard-grafana-dashboard"))
        .expect("the dashboard's ConfigMap");
    assert_eq!(dashboard.value["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(dashboard.value["metadata"]["namespace"], NAMESPACE);
    let json = dashboard.value["data"]["switchyard.json"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(json).is_ok());
    for doc in docs
        .iter()
        .filter(|doc| matches!(doc.kind(), "PodMonitor" | "PrometheusRule"))
    {
        assert_eq!(doc.namespace(), Some(NAMESPACE), "{} {}", doc.kind(), doc.name());
    }
}
