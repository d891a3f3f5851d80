//! Cluster e2e for the live agent: runs when `KUBECONFIG` points at a real API server (a bare
//! kube-apiserver + etcd is enough) and the test runs as root (network namespaces). Without
//! `KUBECONFIG` at build time it is ignored (e2e/build.rs: a summary shows it as not run; `make
//! e2e-cluster` runs it); without root it panics unless `SWITCHYARD_SKIP_LAB=1`.
//!
//! ```text
//! apply crds/, config/default/namespace.yaml and config/rbac/* (server-side apply, as kubectl would)
//! create Nodes <id>-a, <id>-b, a Service and its EndpointSlice ─► controller in process ─► plans
//! netns swyd-e2e-<id>: relay listener at the API server's own IP:port (bound from a setns thread,
//!   accepted and piped on host threads) ─► agent = `switchyard-lab agent run --node-name <id>-a`
//!   with a kubeconfig impersonating the agent's service account and its node name
//! checks: status appears and follows spec changes; agent identity: no spec writes (403), no status of
//!   another node (the admission policy), none without a node name; controller identity: no status
//! then, the controller stopped: a slice the agent cannot decode (issue 50) ─► last good copy stays
//!   programmed, status Degraded=True InvalidSlice naming the field, no watch failure in its log
//! cleanup: agent, relay, netns, controller, every object the test created
//! ```
//!
//! Identities are impersonated with the caller's credentials (`Impersonate-User`, `-Group`,
//! `-Extra-authentication.kubernetes.io%2fnode-name`), which is what a pod-bound service-account
//! token of a pod on that node authenticates as. The `switchyard-system` namespace is left in place
//! when the test created it: a bare API server has no namespace controller, so a deleted namespace
//! would stay Terminating and refuse the next run's service accounts.
//!
//! The API server must authorize with RBAC (`--authorization-mode=RBAC` or `Node,RBAC`; a bare
//! kube-apiserver defaults to AlwaysAllow) and have ValidatingAdmissionPolicy enabled (GA since
//! 1.30); the test checks the first up front and fails with that reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use cluster::{apply_crd, client_from_kubeconfig, composed, composition, repo, suffix, wait_for};
use futures::FutureExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::{Value, json};
use switchyard_api::conditions::{APPLIED, DEGRADED, reasons, status as cond};
use switchyard_api::names::AGENT_FIELD_MANAGER;
use switchyard_api::tolerant::Tolerant;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, NodeForwardingPlanStatus};
use switchyard_controller::Config;
use switchyard_controller::live::run::{Options, run};
use switchyard_e2e::relay::Relay;

const AGENT_SA: &str = "system:serviceaccount:switchyard-system:switchyard-agent";
const CONTROLLER_SA: &str = "system:serviceaccount:switchyard-system:switchyard-controller";
const SA_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:switchyard-system",
    "system:authenticated",
];
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
const FIELD_MANAGER: &str = "switchyard-e2e";
const WAIT: Duration = Duration::from_secs(60);

/// A client from `KUBECONFIG`, or `None` (with a skip line) without root under `SWITCHYARD_SKIP_LAB=1`.
async fn client_or_skip(test: &str) -> Option<Client> {
    if !switchyard_e2e::preflight::is_root() {
        if std::env::var("SWITCHYARD_SKIP_LAB").as_deref() == Ok("1") {
            eprintln!(
                "skip {test}: the agent runs in a network namespace, which needs root (SWITCHYARD_SKIP_LAB=1)"
            );
            return None;
        }
        panic!(
            "{test}: the agent runs in a network namespace and needs root and iproute2; run as root, or \
             set SWITCHYARD_SKIP_LAB=1 to skip it"
        );
    }
    Some(client_from_kubeconfig(test).await)
}

// === cleanup ===

type Undo = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// What the test must undo, registered as it goes, run in reverse order even after a failure.
#[derive(Default)]
struct Cleanup {
    undo: Mutex<Vec<(String, Undo)>>,
    netns: Mutex<Option<NetnsAgent>>,
}

impl Cleanup {
    fn later(&self, what: impl Into<String>, undo: impl std::future::Future<Output = ()> + Send + 'static) {
        self.undo.lock().unwrap().push((what.into(), Box::pin(undo)));
    }

    fn delete<K>(&self, api: Api<K>, name: &str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let name = name.to_string();
        self.later(format!("delete {name}"), async move {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        });
    }

    async fn run(&self) {
        drop(self.netns.lock().unwrap().take());
        let undo: Vec<(String, Undo)> = std::mem::take(&mut *self.undo.lock().unwrap());
        for (what, undo) in undo.into_iter().rev() {
            if tokio::time::timeout(Duration::from_secs(30), undo).await.is_err() {
                eprintln!("cleanup: timed out: {what}");
            }
        }
    }
}

// === applying the repository's YAML ===

/// Server-side applies every document of `file`; objects that did not exist before are deleted at
/// the end (namespaces excepted, see the module docs).
async fn apply_file(client: &Client, file: &str, cleanup: &Cleanup) {
    let text = std::fs::read_to_string(repo(file)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let api_version = doc["apiVersion"].as_str().unwrap();
        let kind = doc["kind"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{file}: {kind} is not served: {e}"));
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let existed = api.get_opt(&name).await.unwrap().is_some();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("{file}: applying {kind} {name}: {e}"));
        if !existed && kind != "Namespace" {
            cleanup.delete(api, &name);
        }
    }
}

// === identities ===

/// A client acting as `user` (impersonation with the caller's credentials).
async fn client_as(user: &str, node: Option<&str>) -> Client {
    let mut config = kube::Config::infer().await.unwrap();
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(SA_GROUPS.iter().map(|g| g.to_string()).collect());
    config.auth_info.impersonate_user_extra =
        node.map(|n| HashMap::from([(NODE_NAME_EXTRA.to_string(), vec![n.to_string()])]));
    Client::try_from(config).unwrap()
}

/// The caller's kubeconfig with the current context's user impersonating the agent on `node`.
fn agent_kubeconfig(node: &str) -> String {
    let mut kubeconfig = kube::config::Kubeconfig::read().unwrap();
    let current = kubeconfig.current_context.clone().expect("a current context");
    let context = kubeconfig
        .contexts
        .iter_mut()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_mut())
        .expect("the current context");
    let user = match &context.user {
        Some(user) => user.clone(),
        None => {
            context.user = Some("switchyard-e2e-agent".into());
            kubeconfig.auth_infos.push(kube::config::NamedAuthInfo {
                name: "switchyard-e2e-agent".into(),
                auth_info: Some(Default::default()),
                other: Default::default(),
            });
            "switchyard-e2e-agent".into()
        }
    };
    let named = kubeconfig
        .auth_infos
        .iter_mut()
        .find(|a| a.name == user)
        .expect("the current user");
    let info = named.auth_info.get_or_insert_with(Default::default);
    info.impersonate = Some(AGENT_SA.into());
    info.impersonate_groups = Some(SA_GROUPS.iter().map(|g| g.to_string()).collect());
    info.impersonate_user_extra = Some(HashMap::from([(
        NODE_NAME_EXTRA.to_string(),
        vec![node.to_string()],
    )]));
    // JSON is YAML; kube and kubectl read it.
    serde_json::to_string_pretty(&kubeconfig).unwrap()
}

/// The status-only server-side apply the agent does, as `client`, on plan `name`.
async fn write_status_as(client: &Client, name: &str, revision: &str) -> Result<(), kube::Error> {
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let status = NodeForwardingPlanStatus {
        observed_revision: Some(revision.into()),
        ..Default::default()
    };
    let body = switchyard_agent::status_writer::apply_body(name, &status);
    plans
        .patch_status(
            name,
            &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(drop)
}

/// The identity checks mean something only when the API server authorizes with RBAC; a bare
/// kube-apiserver started without `--authorization-mode` allows everything. Fail with that reason
/// rather than with a puzzling "want a denial" later.
async fn require_rbac_authorizer(agent: &Client) {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("switchyard.io".into()),
                resource: Some("nodeforwardingplans".into()),
                verb: Some("patch".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(agent.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SelfSubjectAccessReview as the agent");
    let allowed = answer.status.is_some_and(|s| s.allowed);
    assert!(
        !allowed,
        "the API server lets the agent's service account patch plan specs: it does not authorize \
         with RBAC (a bare kube-apiserver defaults to --authorization-mode=AlwaysAllow); start it \
         with --authorization-mode=Node,RBAC (or RBAC) to run the least-privilege checks"
    );
}

fn denied(result: Result<(), kube::Error>, what: &str) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => *e,
        other => panic!("{what}: want a denial (403/422), got {other:?}"),
    }
}

// === the agent in a network namespace ===

/// The namespace, its relay and the agent in it; all gone on drop.
struct NetnsAgent {
    name: String,
    relay: Option<Relay>,
    agent: Option<Child>,
    dir: switchyard_test_support::scratch::TempDir,
}

impl NetnsAgent {
    fn ip(&self, args: &[&str]) {
        let status = Command::new("ip")
            .args(["-n", &self.name])
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "ip -n {} {args:?}", self.name);
    }

    /// `GET path` on the agent's metrics port, from inside the namespace.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let path = path.to_string();
        switchyard_e2e::netns::in_netns(&self.name, move || {
            let mut stream = TcpStream::connect("127.0.0.1:10263").ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(stream, "GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").ok()?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).ok()?;
            let code = answer.split_whitespace().nth(1)?.parse().ok()?;
            let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
            Some((code, body))
        })
        .ok()
        .flatten()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}

impl Drop for NetnsAgent {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let pid = nix::unistd::Pid::from_raw(agent.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..100 {
                if agent.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = agent.kill();
            let _ = agent.wait();
        }
        drop(self.relay.take());
        let problems = switchyard_e2e::netns::delete_all(std::slice::from_ref(&self.name));
        if !problems.is_empty() {
            eprintln!("cleanup: {problems:?}");
        }
    }
}

/// Starts the agent for `node` in a new namespace, reaching the API server through a relay.
async fn start_agent(id: &str, node: &str) -> NetnsAgent {
    let name = format!("swyd-e2e-{id}");
    let dir = switchyard_test_support::scratch::dir(&name).unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    switchyard_e2e::netns::add_all(std::slice::from_ref(&name)).unwrap();
    let mut netns = NetnsAgent {
        name,
        relay: None,
        agent: None,
        dir,
    };
    netns.ip(&["link", "set", "lo", "up"]);

    // The API server as the kubeconfig names it: the same addresses inside the namespace, so the
    // agent's kubeconfig (and the server certificate's SANs) need no change.
    let url = kube::Config::infer().await.unwrap().cluster_url;
    let host = url.host().unwrap().trim_matches(['[', ']']).to_string();
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") { 80 } else { 443 });
    let mut targets: Vec<SocketAddr> = (host.as_str(), port).to_socket_addrs().unwrap().collect();
    targets.sort();
    targets.dedup();
    assert!(!targets.is_empty(), "{host} resolves to nothing");
    for target in &targets {
        if !target.ip().is_loopback() {
            let prefix = if target.is_ipv4() { 32 } else { 128 };
            netns.ip(&["addr", "add", &format!("{}/{prefix}", target.ip()), "dev", "lo"]);
        }
    }
    netns.relay = Some(Relay::start(&netns.name, &targets).unwrap());

    let kubeconfig = netns.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, agent_kubeconfig(node)).unwrap();
    let log = std::fs::File::create(netns.dir.path().join("agent.log")).unwrap();
    let agent = Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns.name,
            env!("CARGO_BIN_EXE_switchyard-lab"),
            "agent",
            "run",
        ])
        .args(["--node-name", node])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--state-dir")
        .arg(netns.dir.path().join("state"))
        .args(["--metrics-bind", "127.0.0.1:10263"])
        .args(["--resync-period", "5s", "--min-sync-interval", "0s"])
        // The suite reads progress from the status; the default writes it at most once a minute.
        .args(["--status-progress-interval", "1s"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    netns.agent = Some(agent);
    netns
}

fn path_of(path: &Path) -> String {
    path.display().to_string()
}

// === the test ===

struct Names {
    id: String,
    ns: String,
    node_a: String,
    node_b: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    not(kubeconfig),
    ignore = "needs a real API server: set KUBECONFIG, or SWITCHYARD_K8S_BIN for `make unit` / `make e2e-cluster` to start one"
)]
async fn agent_reports_status_with_least_privilege_in_a_real_cluster() {
    let test = "agent_reports_status_with_least_privilege_in_a_real_cluster";
    let Some(client) = client_or_skip(test).await else {
        return;
    };
    let id = suffix();
    let names = Names {
        ns: format!("swyd-e2e-agent-{id}"),
        node_a: format!("swyd-{id}-a"),
        node_b: format!("swyd-{id}-b"),
        id,
    };
    let cleanup = Cleanup::default();
    let outcome = std::panic::AssertUnwindSafe(scenario(&client, &names, &cleanup))
        .catch_unwind()
        .await;
    if outcome.is_err()
        && let Some(netns) = cleanup.netns.lock().unwrap().as_ref()
    {
        eprintln!(
            "--- agent log ({}) ---\n{}",
            path_of(netns.dir.path()),
            netns.log()
        );
    }
    cleanup.run().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(client: &Client, names: &Names, cleanup: &Cleanup) {
    apply_crd(client, FIELD_MANAGER).await;
    apply_file(client, "config/default/namespace.yaml", cleanup).await;
    for file in [
        "config/rbac/service_accounts.yaml",
        "config/rbac/controller_role.yaml",
        "config/rbac/controller_leader_election_role.yaml",
        "config/rbac/agent_role.yaml",
        "config/rbac/agent_status_policy.yaml",
    ] {
        apply_file(client, file, cleanup).await;
    }

    // Cluster objects: two nodes, a Service with one endpoint.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": names.ns}})).unwrap(),
        )
        .await
        .unwrap();
    cleanup.delete(namespaces, &names.ns);
    let nodes: Api<Node> = Api::all(client.clone());
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    for (i, name) in [&names.node_a, &names.node_b].into_iter().enumerate() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": format!("10.244.{}.0/24", i + 1), "podCIDRs": [format!("10.244.{}.0/24", i + 1)]},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        // Plans are deleted after the node (the controller is stopped by then).
        cleanup.delete(plans.clone(), name);
        cleanup.delete(nodes.clone(), name);
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("192.168.10.{}", 11 + i)}]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    let services: Api<Service> = Api::namespaced(client.clone(), &names.ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &names.ns);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}], "selector": {"app": "web"}},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slice = |ips: &[&str]| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": ips.iter().map(|ip| json!({
                "addresses": [ip], "nodeName": names.node_b, "conditions": {"ready": true}
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    };
    slices
        .create(&PostParams::default(), &slice(&["10.244.2.5"]))
        .await
        .unwrap();

    // The controller, in process.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let options = Options::new(Config {
        min_plan_interval: Duration::from_millis(200),
        ..Config::default()
    });
    let controller = tokio::spawn(run(
        client.clone(),
        options,
        async {
            let _ = stop_rx.await;
        },
        None,
    ));
    // Stopped by the cleanup, or earlier by the scenario (a hand edit it must not restore at once).
    let controller = std::sync::Arc::new(Mutex::new(Some((stop_tx, controller))));
    let stop_controller = {
        let controller = std::sync::Arc::clone(&controller);
        move || async move {
            let running = controller.lock().unwrap().take();
            if let Some((stop, task)) = running {
                let _ = stop.send(());
                let _ = task.await;
            }
        }
    };
    cleanup.later("stop the controller", stop_controller.clone()());
    for node in [&names.node_a, &names.node_b] {
        let ns = names.ns.clone();
        wait_for(WAIT, "the plans and their views' slices", || {
            let ns = ns.clone();
            async move {
                composed(client, node)
                    .await?
                    .services
                    .iter()
                    .any(|s| s.name.starts_with(&format!("{ns}/")))
                    .then_some(())
            }
        })
        .await;
    }

    // The agent of node a, in its namespace.
    let netns = start_agent(&names.id, &names.node_a).await;
    *cleanup.netns.lock().unwrap() = Some(netns);
    // Current: the agent reports the plan's revision and the digest of the current slices of its views.
    let observed_current = || {
        let plans = plans.clone();
        let node = names.node_a.clone();
        async move {
            let plan = plans.get(&node).await.ok()?;
            let status = plan.status?;
            let applied = status
                .conditions
                .iter()
                .any(|c| c.type_ == APPLIED && c.status == cond::TRUE);
            let want = composition(client, &node).await?.slices?.digest;
            let have = status.observed_slices?.digest;
            (status.observed_revision.as_deref() == Some(plan.spec.revision.as_str())
                && applied
                && have == want)
                .then_some(format!("{}/{want}", plan.spec.revision))
        }
    };
    let first = wait_for(WAIT, "the agent's status on its plan", observed_current).await;
    let ready = {
        let guard = cleanup.netns.lock().unwrap();
        guard.as_ref().and_then(|n| n.get("/readyz"))
    };
    assert_eq!(ready.map(|(code, _)| code), Some(200), "the agent is ready");
    let health = {
        let guard = cleanup.netns.lock().unwrap();
        guard.as_ref().and_then(|n| n.get("/healthz"))
    };
    let (code, body) = health.expect("/healthz answers");
    assert_eq!(code, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["nodeName"], names.node_a.as_str());

    // The agent identity: reads its plan, but cannot change a spec (RBAC: 403).
    let agent = client_as(AGENT_SA, Some(&names.node_a)).await;
    require_rbac_authorizer(&agent).await;
    let agent_plans: Api<NodeForwardingPlan> = Api::all(agent.clone());
    agent_plans
        .get(&names.node_a)
        .await
        .expect("the agent may read its plan");
    let edit = json!({"spec": {"cluster": {"masqueradeAll": true}}});
    let result = agent_plans
        .patch(&names.node_a, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .map(drop);
    assert_eq!(denied(result, "agent spec patch").code, 403);
    let mut object = plans.get(&names.node_a).await.unwrap();
    object.metadata.managed_fields = None;
    object.metadata.resource_version = None;
    object.status = None;
    object.spec.cluster.masquerade_all = !object.spec.cluster.masquerade_all;
    let result = agent_plans
        .patch(
            &names.node_a,
            &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map(drop);
    assert_eq!(denied(result, "agent spec apply").code, 403);
    // Slices: the agent may read them, never write them.
    let agent_slices: Api<ForwardingSlice> = Api::all(agent.clone());
    let listed = agent_slices
        .list(&ListParams::default().labels("switchyard.io/view=all"))
        .await
        .expect("the agent may list slices");
    let mut forged = listed.items.first().cloned().expect("view all has a slice");
    forged.metadata.managed_fields = None;
    forged.metadata.resource_version = None;
    forged.spec.entries.clear();
    let name = forged.metadata.name.clone().unwrap();
    let result = agent_slices
        .patch(
            &name,
            &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
            &Patch::Apply(&forged),
        )
        .await
        .map(drop);
    assert_eq!(denied(result, "agent slice apply").code, 403);
    let result = agent_slices.delete(&name, &Default::default()).await.map(drop);
    assert_eq!(denied(result, "agent slice delete").code, 403);

    // … and cannot write another node's status: the admission policy (which takes effect a moment
    // after it is created, so ask until it answers).
    let refusal = wait_for(WAIT, "the admission policy to deny another node's status", || {
        let agent = agent.clone();
        let other = names.node_b.clone();
        async move {
            match write_status_as(&agent, &other, "forged").await {
                Ok(()) => None,
                result => Some(denied(result, "status of another node")),
            }
        }
    })
    .await;
    assert!(
        refusal.message.contains("may write only the status"),
        "{refusal:?}"
    );
    // Without a node name in its credentials it may write no status at all.
    let anonymous = client_as(AGENT_SA, None).await;
    let refusal = denied(
        write_status_as(&anonymous, &names.node_a, "forged").await,
        "status without a node name",
    );
    assert!(refusal.message.contains("carries no node name"), "{refusal:?}");

    // The controller identity: reads plans and slices, never writes status (RBAC: 403).
    let controller = client_as(CONTROLLER_SA, None).await;
    Api::<NodeForwardingPlan>::all(controller.clone())
        .get(&names.node_a)
        .await
        .expect("the controller may read plans");
    Api::<ForwardingSlice>::all(controller.clone())
        .list(&ListParams::default())
        .await
        .expect("the controller may list slices");
    let refusal = denied(
        write_status_as(&controller, &names.node_a, "forged").await,
        "controller status write",
    );
    assert_eq!(refusal.code, 403, "{refusal:?}");

    // Status tracks slice changes (with the policy in force, so the agent's own writes pass it): the new
    // endpoint is on node b, so node a's plan stays as it is and only a slice changes.
    slices
        .replace("web-1", &PostParams::default(), &{
            let mut s = slice(&["10.244.2.5", "10.244.2.6"]);
            s.metadata.resource_version = slices.get("web-1").await.unwrap().metadata.resource_version;
            s
        })
        .await
        .unwrap();
    let second = wait_for(WAIT, "the status to follow the new spec", || {
        let observed = observed_current();
        let first = first.clone();
        async move { observed.await.filter(|revision| *revision != first) }
    })
    .await;
    let plan = plans.get(&names.node_a).await.unwrap();
    assert!(second.starts_with(&plan.spec.revision), "{second}");
    assert!(
        composed(client, &names.node_a)
            .await
            .unwrap()
            .services
            .iter()
            .any(|s| s.name.starts_with(&format!("{}/", names.ns)) && s.endpoints.len() == 2),
        "the new endpoint is in what the agent applied"
    );

    // A slice the agent cannot decode (issue 50): `spec.index` past u32 (the CRD bounds it below only,
    // so the API server accepts it) and an unknown field (pruned by the server). The controller is
    // stopped first: it would restore the slice at once. The agent keeps the last good copy
    // programmed, its status says why, and its slice watch never fails.
    stop_controller().await;
    let before = plans.get(&names.node_a).await.unwrap().status.unwrap();
    // Its answer is read tolerantly: the plain type cannot read it either.
    let fws: Api<Tolerant<ForwardingSlice>> = Api::all(client.clone());
    let edit = json!({"spec": {"index": 4_294_967_296_u64, "someFutureField": true}});
    fws.patch("all-0000", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let status = wait_for(WAIT, "InvalidSlice in the agent's status", || {
        let plans = plans.clone();
        let node = names.node_a.clone();
        async move {
            let status = plans.get(&node).await.ok()?.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == DEGRADED && c.reason == reasons::INVALID_SLICE)
                .then_some(status)
        }
    })
    .await;
    let failure = status
        .failures
        .iter()
        .find(|f| f.service == "ForwardingSlice all-0000")
        .unwrap_or_else(|| panic!("{:?}", status.failures));
    assert!(
        failure
            .reason
            .contains("cannot be read: spec.index: 4294967296 is out of range")
            && failure.reason.contains("last good revision"),
        "{failure:?}"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == APPLIED && c.status == cond::TRUE),
        "{status:?}"
    );
    assert_eq!(
        status.observed_slices, before.observed_slices,
        "the last good copy stays what is programmed"
    );
    let log = cleanup
        .netns
        .lock()
        .unwrap()
        .as_ref()
        .map(NetnsAgent::log)
        .unwrap_or_default();
    assert!(!log.contains("watch failed"), "a watch failed:\n{log}");
    eprintln!("agent status after an undecodable slice: {failure:?}");
}
