//! `make demo-cluster`: the example cluster through a real API server (a cluster, or a bare
//! kube-apiserver) — the CRDs, the controller and one agent per lab node talking to it — shown with
//! `kubectl get nfp`, checked with real packets, changed, and removed again.
//!
//! ```text
//! KUBECONFIG ─► apply crds/ (server-side apply; removed at the end if this run created them)
//!   ─► first, before anything is created: the example's ClusterIPs inside the server's Service range
//!      (its ServiceCIDRs, else near the `kubernetes` Service) and held by no other Service, or a refusal
//!      that says so
//!   ─► the example's Nodes, Services, EndpointSlices (refused if any exists already: never someone else's)
//!   ─► controller (in this process) ─► NodeForwardingPlans + ForwardingSlices on the API server
//!   ─► lab: per node a relay at the API server's address inside the node's namespace ─►
//!        `switchyard-lab agent run --node-name <node> --kubeconfig $KUBECONFIG` ─► rules ─► status
//!   ─► `kubectl get nfp -o wide` (or the same columns from the objects, said so, without kubectl)
//!   ─► traffic checks ─► an EndpointSlice changes ─► plans, status and rules follow ─► checked again
//!   ─► everything created is deleted (objects, plans, slices, namespaces and CRDs it made), also when a
//!      step failed, the lab torn down
//! ```
//!
//! It runs its own controller, so it refuses a cluster that already holds NodeForwardingPlans (one
//! where Switchyard is installed): two controllers would fight over the same objects.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_api::{ForwardingSlice, NodeForwardingPlan};

use crate::checks::{Check, answered};
use crate::demo::{example_checks, run_checks};
use crate::error::{LabError, Result};
use crate::relay::Relay;
use crate::{ClusterDescription, Lab, LabOptions, Place};

/// The field manager of everything this demo writes.
const FIELD_MANAGER: &str = "switchyard-demo";
/// Where agents serve /metrics inside their node's namespace.
const AGENT_METRICS: &str = "127.0.0.1:10263";
/// How long plans get to be applied on every node.
const APPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// The CRD files, by object name.
/// Every CRD of crds/ by name (the controller watches ForwardingRollouts too: without their CRD that
/// watch fails and retries for as long as it runs).
fn crd_names() -> impl Iterator<Item = &'static str> {
    switchyard_api::crd::CRD_FILES
        .into_iter()
        .map(|file| file.trim_end_matches(".yaml"))
}

/// What `switchyard-lab demo-cluster` was asked.
#[derive(Debug, Clone)]
pub struct ClusterDemoOptions {
    /// The cluster description.
    pub cluster: PathBuf,
    /// The controller configuration.
    pub config: PathBuf,
    /// The kubeconfig (default: `$KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// The repository's `crds/` directory.
    pub crds: PathBuf,
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Api {
        what,
        // The API server's refusal in its own words, once: not the whole Status object (kube's error
        // carries it, and its chain would print it again for each cause).
        source: match source {
            kube::Error::Api(status) => {
                format!("{} ({}, HTTP {})", status.message, status.reason, status.code).into()
            }
            other => Box::new(other),
        },
    }
}

/// What this run created, so it removes exactly that.
#[derive(Default)]
struct Created {
    crds: Vec<String>,
    /// Namespaces of the example's objects that did not exist (a real API server refuses objects in
    /// a namespace that does not exist); deleted at the end like the rest.
    namespaces: Vec<String>,
    nodes: Vec<String>,
    services: Vec<(String, String)>,
    slices: Vec<(String, String)>,
    /// ForwardingSlices that were there before (left alone).
    foreign_slices: Vec<String>,
}

/// Runs the demo against the API server the kubeconfig names; returns how many checks failed.
pub fn run(options: &ClusterDemoOptions, lab_options: LabOptions) -> Result<usize> {
    let description = ClusterDescription::from_file(&options.cluster)?;
    let config = switchyard_controller::Config::load(&options.config)
        .map_err(|e| LabError::ParseDescription(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| LabError::Socket {
            what: "starting the async runtime".into(),
            source,
        })?;
    let kubeconfig = options.kubeconfig.clone();
    let (client, targets) = rt.block_on(connect(&kubeconfig))?;
    println!(
        "== API server {} (kubeconfig {})",
        targets[0],
        kubeconfig.display()
    );
    // Before anything is created: an example that cannot fit this API server stops here, saying why.
    rt.block_on(check_fits(&client, &description))?;
    let mut created = Created::default();
    let outcome = rt
        .block_on(install(&client, options, &description, &mut created))
        .and_then(|()| {
            demo(
                &rt,
                &client,
                &description,
                config,
                &kubeconfig,
                &targets,
                lab_options,
            )
        });
    println!("\n== Removing what the demo created");
    rt.block_on(remove(&client, &created));
    outcome
}

async fn connect(kubeconfig: &Path) -> Result<(Client, Vec<SocketAddr>)> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| LabError::ParseDescription(format!("{}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| LabError::ParseDescription(format!("{}: {e}", kubeconfig.display())))?;
    let url = config.cluster_url.clone();
    let host = url
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_string();
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") { 80 } else { 443 });
    let mut targets: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|source| LabError::Socket {
            what: format!("resolving the API server {host}"),
            source,
        })?
        .collect();
    targets.sort();
    targets.dedup();
    if targets.is_empty() {
        return Err(LabError::ParseDescription(format!(
            "the API server {host} resolves to nothing"
        )));
    }
    let client = Client::try_from(config).map_err(api_error("building a client"))?;
    Ok((client, targets))
}

/// The example's ClusterIPs, with the Service of each.
fn cluster_ips(description: &ClusterDescription) -> Vec<(IpAddr, String)> {
    let mut out = Vec::new();
    for service in &description.services {
        let (namespace, name) = namespaced(&service.metadata);
        let Some(spec) = &service.spec else { continue };
        let texts = spec
            .cluster_ips
            .clone()
            .filter(|ips| !ips.is_empty())
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default();
        out.extend(
            texts
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .map(|ip| (ip, format!("{namespace}/{name}"))),
        );
    }
    out
}

/// Whether the example fits this API server: its ClusterIPs inside the server's Service range (its
/// ServiceCIDRs; without that API, near the `kubernetes` Service's address), and none held by another
/// Service. A real API server refuses a Service whose ClusterIP it cannot allocate, which a run would
/// only learn halfway through creating the example.
async fn check_fits(client: &Client, description: &ClusterDescription) -> Result<()> {
    let wanted = cluster_ips(description);
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());
    let ranges: Vec<IpNet> = match cidrs.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|c| c.spec.as_ref()?.cidrs.as_ref())
            .flatten()
            .filter_map(|c| c.parse().ok())
            .collect(),
        // An API server before ServiceCIDRs (Kubernetes 1.33): the `kubernetes` Service below.
        Err(_) => Vec::new(),
    };
    let services: Api<Service> = Api::all(client.clone());
    let existing = services
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing Services"))?;
    let range = if ranges.is_empty() {
        let kubernetes = existing
            .items
            .iter()
            .find(|s| {
                s.metadata.name.as_deref() == Some("kubernetes") && namespaced(&s.metadata).0 == "default"
            })
            .and_then(|s| s.spec.as_ref()?.cluster_ip.as_deref()?.parse::<IpAddr>().ok());
        match kubernetes {
            Some(ip) => ServiceRange::Near(ip),
            None => ServiceRange::Unknown,
        }
    } else {
        ServiceRange::Cidrs(ranges)
    };
    let taken: Vec<(IpAddr, String)> = existing
        .items
        .iter()
        .filter_map(|s| {
            let ip = s.spec.as_ref()?.cluster_ip.as_deref()?.parse::<IpAddr>().ok()?;
            Some((
                ip,
                format!("{}/{}", namespaced(&s.metadata).0, namespaced(&s.metadata).1),
            ))
        })
        .collect();
    match fits(&wanted, &range, &taken) {
        Ok(note) => {
            println!("== {note}");
            Ok(())
        }
        Err(why) => Err(LabError::Refused(format!("{why}; nothing was created"))),
    }
}

/// Where an API server allocates ClusterIPs, as far as it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceRange {
    /// Its ServiceCIDRs.
    Cidrs(Vec<IpNet>),
    /// Only the `kubernetes` Service's address is known (the first of the range).
    Near(IpAddr),
    /// Neither.
    Unknown,
}

/// What the example needs from the range, said before anything is created: `Ok` with a line to print,
/// or why it cannot fit.
pub fn fits(
    wanted: &[(IpAddr, String)],
    range: &ServiceRange,
    taken: &[(IpAddr, String)],
) -> std::result::Result<String, String> {
    // kubeadm's default range: what the `kubernetes` Service's address suggests when nothing else says.
    let near = |ip: IpAddr| IpNet::new(ip, if ip.is_ipv4() { 12 } else { 108 }).map(|n| n.trunc());
    let outside: Vec<String> = wanted
        .iter()
        .filter(|(ip, _)| match range {
            ServiceRange::Cidrs(cidrs) => !cidrs.iter().any(|c| c.contains(ip)),
            ServiceRange::Near(kubernetes) => near(*kubernetes).is_ok_and(|n| !n.contains(ip)),
            ServiceRange::Unknown => false,
        })
        .map(|(ip, service)| format!("{ip} ({service})"))
        .collect();
    let said = match range {
        ServiceRange::Cidrs(cidrs) => {
            let cidrs: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
            format!("this API server's Service range is {}", cidrs.join(", "))
        }
        ServiceRange::Near(ip) => format!(
            "this API server shows no ServiceCIDR; its `kubernetes` Service is at {ip}, so its range is taken \
             to be the /12 around it (kubeadm's default size)"
        ),
        ServiceRange::Unknown => {
            "this API server shows neither a ServiceCIDR nor the `kubernetes` Service".into()
        }
    };
    if !outside.is_empty() {
        return Err(format!(
            "the example cannot fit: {said}, and the example's Services need ClusterIPs outside it: {}. Use an \
             API server whose range holds 10.96.0.0/16 (kind's and kubeadm's defaults both do: \
             --service-cluster-ip-range), or change those addresses in examples/cluster.yaml",
            outside.join(", ")
        ));
    }
    let held: Vec<String> = wanted
        .iter()
        .filter_map(|(ip, service)| {
            let (_, holder) = taken.iter().find(|(t, _)| t == ip)?;
            Some(format!(
                "{ip} (the example's {service}) is held by Service {holder}"
            ))
        })
        .collect();
    if !held.is_empty() {
        return Err(format!("the example cannot fit: {}", held.join("; ")));
    }
    Ok(format!("The example's {} ClusterIPs fit: {said}", wanted.len()))
}

/// Server-side apply of one object as this demo.
async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(drop)
    .map_err(api_error(format!("applying {name}")))
}

/// Server-side apply of an object's status (the status subresource), when it has one.
async fn apply_status<K, S>(
    api: &Api<K>,
    name: &str,
    kind: &str,
    api_version: &str,
    status: &Option<S>,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let Some(status) = status else {
        return Ok(());
    };
    let patch = serde_json::json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "status": status});
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(drop)
    .map_err(api_error(format!("writing the status of {kind} {name}")))
}

/// Refuses an object someone else already has (this demo never takes over what it did not make).
async fn ensure_absent<K>(api: &Api<K>, what: &str, name: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api
        .get_opt(name)
        .await
        .map_err(api_error(format!("reading {what} {name}")))?
    {
        None => Ok(()),
        Some(_) => Err(LabError::Refused(format!(
            "{what} {name} already exists on this API server; the demo creates its own and leaves others alone"
        ))),
    }
}

async fn install(
    client: &Client,
    options: &ClusterDemoOptions,
    description: &ClusterDescription,
    created: &mut Created,
) -> Result<()> {
    println!("== Applying crds/ (server-side apply)");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in crd_names() {
        let existed = crds
            .get_opt(name)
            .await
            .map_err(api_error("reading the CRDs"))?
            .is_some();
        let path = options.crds.join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&path).map_err(|source| LabError::File {
            action: "reading",
            path: path.clone(),
            source,
        })?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
            .map_err(|e| LabError::ParseDescription(format!("{}: {e}", path.display())))?;
        apply(&crds, name, &crd).await?;
        if !existed {
            created.crds.push(name.to_string());
        }
    }
    wait(Duration::from_secs(30), "the CRDs to be established", || async {
        for name in crd_names() {
            let established = crds
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|crd| crd.status)
                .is_some_and(|status| {
                    status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if !established {
                return false;
            }
        }
        true
    })
    .await?;
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let existing = plans
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing plans"))?;
    if let Some(plan) = existing.items.first() {
        return Err(LabError::Refused(format!(
            "this API server already holds NodeForwardingPlans (e.g. {}): Switchyard runs here, and the \
             demo's own controller would fight it",
            plan.metadata.name.as_deref().unwrap_or_default()
        )));
    }

    let slices: Api<ForwardingSlice> = Api::all(client.clone());
    created.foreign_slices = slices
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing ForwardingSlices"))?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();

    println!("== Creating the example's Nodes, Services and EndpointSlices");
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &description.nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        ensure_absent(&nodes, "Node", &name).await?;
        apply(&nodes, &name, &clean(node)).await?;
        created.nodes.push(name.clone());
        // A create drops `status`; a kubelet would write the addresses, here the demo does.
        apply_status(&nodes, &name, "Node", "v1", &node.status).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let wanted: std::collections::BTreeSet<String> = description
        .services
        .iter()
        .map(|service| namespaced(&service.metadata).0)
        .chain(
            description
                .endpoint_slices
                .iter()
                .map(|slice| namespaced(&slice.metadata).0),
        )
        .collect();
    for namespace in wanted {
        let exists = namespaces
            .get_opt(&namespace)
            .await
            .map_err(api_error(format!("reading namespace {namespace}")))?
            .is_some();
        if !exists {
            let object = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.clone()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            apply(&namespaces, &namespace, &object).await?;
            created.namespaces.push(namespace);
        }
    }
    for service in &description.services {
        let (namespace, name) = namespaced(&service.metadata);
        let api: Api<Service> = Api::namespaced(client.clone(), &namespace);
        ensure_absent(&api, "Service", &format!("{namespace}/{name}")).await?;
        apply(&api, &name, &clean(service)).await?;
        created.services.push((namespace, name.clone()));
        // LoadBalancer ingress IPs, as a cloud controller would write them.
        apply_status(&api, &name, "Service", "v1", &service.status).await?;
    }
    for slice in &description.endpoint_slices {
        let (namespace, name) = namespaced(&slice.metadata);
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
        ensure_absent(&api, "EndpointSlice", &format!("{namespace}/{name}")).await?;
        apply(&api, &name, &clean(slice)).await?;
        created.slices.push((namespace, name));
    }
    Ok(())
}

/// An object as one applies it: no server-owned metadata.
fn clean<K: Resource + Clone>(object: &K) -> K {
    let mut object = object.clone();
    let meta = object.meta_mut();
    meta.resource_version = None;
    meta.uid = None;
    meta.managed_fields = None;
    meta.creation_timestamp = None;
    object
}

fn namespaced(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

async fn wait<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        if Instant::now() > deadline {
            return Err(LabError::Timeout {
                what: what.to_string(),
                waited_ms: timeout.as_millis(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn demo(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    description: &ClusterDescription,
    config: switchyard_controller::Config,
    kubeconfig: &Path,
    targets: &[SocketAddr],
    lab_options: LabOptions,
) -> Result<usize> {
    println!("== Starting the controller (in this process) against the API server");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = {
        let client = client.clone();
        let options = switchyard_controller::live::run::Options::new(config);
        rt.spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = switchyard_controller::live::run::run(client, options, shutdown, None).await {
                eprintln!("controller: {error}");
            }
        })
    };
    let result = with_lab(rt, client, description, kubeconfig, targets, lab_options);
    let _ = stop.send(());
    let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), controller).await });
    result
}

fn with_lab(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    description: &ClusterDescription,
    kubeconfig: &Path,
    targets: &[SocketAddr],
    lab_options: LabOptions,
) -> Result<usize> {
    println!(
        "== Bringing up the lab: {} nodes, their pods and an external client (network namespaces)",
        description.nodes.len()
    );
    let lab = Lab::up_with(description.clone(), lab_options)?;
    for cidr in ["203.0.113.0/24", "10.96.0.0/16"] {
        if let Ok(net) = cidr.parse::<Ipv4Net>() {
            lab.client_route_via(net, "node-a")?;
        }
    }
    let state = lab.state_dir().join("cluster-demo");
    let mut relays = Vec::new();
    for node in lab.nodes() {
        let netns = lab.netns(&Place::node(&node.name))?.to_string();
        // The agent's kubeconfig names the API server's own address: the same address answers inside
        // the node's namespace, through the relay.
        for target in targets.iter().filter(|t| !t.ip().is_loopback()) {
            let prefix = if target.is_ipv4() { 32 } else { 128 };
            crate::command::ip(
                &[
                    "-n",
                    &netns,
                    "addr",
                    "add",
                    &format!("{}/{prefix}", target.ip()),
                    "dev",
                    "lo",
                ],
                None,
            )?;
        }
        relays.push(Relay::start(&netns, targets)?);
        let dir = state.join(&node.name);
        std::fs::create_dir_all(&dir).map_err(|source| LabError::File {
            action: "creating",
            path: dir.clone(),
            source,
        })?;
        let argv: Vec<String> = [
            lab.options().lab_binary.display().to_string(),
            "agent".into(),
            "run".into(),
            "--node-name".into(),
            node.name.clone(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--state-dir".into(),
            dir.display().to_string(),
            "--metrics-bind".into(),
            AGENT_METRICS.into(),
            "--min-sync-interval".into(),
            "100ms".into(),
            "--status-progress-interval".into(),
            "1s".into(),
        ]
        .into();
        lab.spawn_in(&Place::node(&node.name), &argv)?;
    }
    let nodes: Vec<String> = lab.nodes().iter().map(|n| n.name.clone()).collect();
    rt.block_on(wait_applied(client, &nodes, None))?;
    print_plans(rt, client, "every node's plan, applied by its agent")?;
    println!("\n== Traffic checks (real packets through each node's rules)\n");
    let mut failed = run_checks(&lab, &example_checks())?;

    println!("\n== A change: checkout-new-1 becomes ready in EndpointSlice default/checkout-r1s2t");
    let before = rt.block_on(revisions(client, &nodes))?;
    rt.block_on(make_checkout_new_ready(client))?;
    rt.block_on(wait_applied(client, &nodes, Some(&before)))?;
    print_plans(rt, client, "the plans after the change, applied")?;
    let check = Check::tcp(
        "checkout now goes to its ready pod",
        Place::pod("nginx-pod-3"),
        "10.96.0.70:80",
        5,
        answered(&["checkout-new-1"]),
    );
    println!();
    failed += run_checks(&lab, std::slice::from_ref(&check))?;
    drop(relays);
    lab.down()?;
    Ok(failed)
}

/// Each node's (plan revision, slices digest) as its status reports it.
async fn revisions(client: &Client, nodes: &[String]) -> Result<Vec<(Option<String>, Option<String>)>> {
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let mut out = Vec::new();
    for node in nodes {
        let plan = plans
            .get_opt(node)
            .await
            .map_err(api_error(format!("reading plan {node}")))?;
        let status = plan.and_then(|p| p.status);
        out.push((
            status.as_ref().and_then(|s| s.observed_revision.clone()),
            status.and_then(|s| s.observed_slices.map(|o| o.digest)),
        ));
    }
    Ok(out)
}

/// Waits until every node's status says its plan (and the slices of its views) are applied, and,
/// with `changed_from`, that this differs from that earlier state on at least one node.
async fn wait_applied(
    client: &Client,
    nodes: &[String],
    changed_from: Option<&[(Option<String>, Option<String>)]>,
) -> Result<()> {
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let slices: Api<ForwardingSlice> = Api::all(client.clone());
    wait(APPLY_TIMEOUT, "every node to apply its plan", || async {
        let Ok(current) = revisions(client, nodes).await else {
            return false;
        };
        if changed_from.is_some_and(|before| before == current.as_slice()) {
            return false;
        }
        let Ok(slice_list) = slices.list(&ListParams::default()).await else {
            return false;
        };
        let specs: Vec<_> = slice_list
            .items
            .into_iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap_or_default(),
                    std::sync::Arc::new(s.spec),
                )
            })
            .collect();
        for node in nodes {
            let Ok(Some(plan)) = plans.get_opt(node).await else {
                return false;
            };
            let spec = std::sync::Arc::new(plan.spec.clone());
            let want = match switchyard_agent::sync::compose_plan(
                &spec,
                &specs,
                &mut switchyard_agent::sync::LastGood::default(),
            ) {
                switchyard_agent::sync::Composition::Ready { slices, .. } => slices.map(|s| s.digest),
                switchyard_agent::sync::Composition::Incomplete(_) => return false,
            };
            let Some(status) = plan.status else {
                return false;
            };
            if !crate::deployed::reports_applied(&status, &spec.revision, want.as_deref()) {
                return false;
            }
        }
        true
    })
    .await
}

async fn make_checkout_new_ready(client: &Client) -> Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let mut slice = api
        .get("checkout-r1s2t")
        .await
        .map_err(api_error("reading EndpointSlice default/checkout-r1s2t"))?;
    for endpoint in slice.endpoints.iter_mut().flatten() {
        if endpoint.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some("checkout-new-1") {
            endpoint.conditions = Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            });
        }
    }
    apply(&api, "checkout-r1s2t", &clean(&slice)).await
}

/// `kubectl get nfp -o wide` when kubectl is installed; otherwise the same columns from the objects,
/// titled as such.
fn print_plans(rt: &tokio::runtime::Runtime, client: &Client, what: &str) -> Result<()> {
    let kubectl = std::process::Command::new("kubectl")
        .args(["get", "nodeforwardingplans", "-o", "wide"])
        .output();
    match kubectl {
        Ok(out) if out.status.success() => {
            println!("\n== {what}: kubectl get nodeforwardingplans -o wide\n");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
        _ => {
            let plans: Api<kube::api::DynamicObject> = Api::all_with(
                client.clone(),
                &kube::api::ApiResource::erase::<NodeForwardingPlan>(&()),
            );
            let list = rt
                .block_on(plans.list(&ListParams::default()))
                .map_err(api_error("listing plans"))?;
            let objects: Vec<serde_json::Value> = list
                .items
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect();
            println!(
                "\n== {what}: kubectl is not installed here, so the columns of `kubectl get nfp -o wide` \
                 from the API server's objects\n"
            );
            print!("{}", switchyard_controller::output::table(&objects, true));
        }
    }
    Ok(())
}

/// Deletes what this run created, most dependent first; reports what it could not.
async fn remove(client: &Client, created: &Created) {
    let params = DeleteParams::default();
    let plans: Api<NodeForwardingPlan> = Api::all(client.clone());
    let slices: Api<ForwardingSlice> = Api::all(client.clone());
    // The controller made these for the demo's nodes (a bare API server has no garbage collector to
    // follow their Node owner references).
    for node in &created.nodes {
        report(
            plans.delete(node, &params).await.map(drop),
            &format!("plan {node}"),
        );
    }
    if !created.nodes.is_empty()
        && let Ok(list) = slices.list(&ListParams::default()).await
    {
        for slice in list.items {
            let name = slice.metadata.name.unwrap_or_default();
            if created.foreign_slices.contains(&name) {
                continue;
            }
            report(
                slices.delete(&name, &params).await.map(drop),
                &format!("ForwardingSlice {name}"),
            );
        }
    }
    for (namespace, name) in &created.slices {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        report(
            api.delete(name, &params).await.map(drop),
            &format!("EndpointSlice {namespace}/{name}"),
        );
    }
    for (namespace, name) in &created.services {
        let api: Api<Service> = Api::namespaced(client.clone(), namespace);
        report(
            api.delete(name, &params).await.map(drop),
            &format!("Service {namespace}/{name}"),
        );
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in &created.namespaces {
        report(
            namespaces.delete(name, &params).await.map(drop),
            &format!("namespace {name}"),
        );
        // NB: a bare kube-apiserver has no namespace controller, so a deleted namespace would stay
        // Terminating (and refuse the next run's objects). The demo made it and removed what it put in
        // it: when nothing finalizes it within 30 s, the demo does, as the namespace controller would.
        let gone = wait(Duration::from_secs(30), "the namespace to go", || async {
            matches!(namespaces.get_opt(name).await, Ok(None))
        })
        .await;
        if gone.is_err() {
            let finalized = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::core::v1::NamespaceSpec {
                    finalizers: Some(Vec::new()),
                }),
                ..Namespace::default()
            };
            report(
                namespaces
                    .replace_subresource("finalize", name, &kube::api::PostParams::default(), &finalized)
                    .await
                    .map(drop),
                &format!("namespace {name} (finalized: no namespace controller)"),
            );
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for name in &created.nodes {
        report(
            nodes.delete(name, &params).await.map(drop),
            &format!("Node {name}"),
        );
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &created.crds {
        report(crds.delete(name, &params).await.map(drop), &format!("CRD {name}"));
    }
}

fn report(result: std::result::Result<(), kube::Error>, what: &str) {
    match result {
        Ok(()) => println!("deleted {what}"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => eprintln!("could not delete {what}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_example_fits_kinds_and_kubeadms_default_ranges_and_says_plainly_when_it_cannot() {
        let description = ClusterDescription::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml"),
        )
        .unwrap();
        let wanted = cluster_ips(&description);
        assert!(wanted.len() >= 9, "{wanted:?}");
        let kind = ServiceRange::Cidrs(vec!["10.96.0.0/16".parse().unwrap()]);
        let kubeadm = ServiceRange::Cidrs(vec!["10.96.0.0/12".parse().unwrap()]);
        let kube_dns = [(ip("10.96.0.10"), "kube-system/kube-dns".to_string())];
        for range in [&kind, &kubeadm, &ServiceRange::Near(ip("10.96.0.1"))] {
            let note = fits(&wanted, range, &kube_dns).unwrap_or_else(|e| panic!("{range:?}: {e}"));
            assert!(note.contains("ClusterIPs fit"), "{note}");
        }
        let small = ServiceRange::Cidrs(vec!["10.100.0.0/16".parse().unwrap()]);
        let why = fits(&wanted, &small, &[]).unwrap_err();
        assert!(
            why.starts_with("the example cannot fit: this API server's Service range is 10.100.0.0/16"),
            "{why}"
        );
        assert!(why.contains("10.96.0.80 (default/apache)"), "{why}");
        let why = fits(&wanted, &kind, &[(ip("10.96.0.53"), "kube-system/dns".into())]).unwrap_err();
        assert!(why.contains("10.96.0.53 (the example's "), "{why}");
        assert!(why.contains("is held by Service kube-system/dns"), "{why}");
        let why = fits(&wanted, &ServiceRange::Near(ip("10.128.0.1")), &[]).unwrap_err();
        assert!(why.contains("its `kubernetes` Service is at 10.128.0.1"), "{why}");
    }
}
