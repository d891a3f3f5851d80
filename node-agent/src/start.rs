//! Starts `switchyard-agent run`: picks the plan source and, for the API source, builds the client and
//! the status writer, then runs the one loop in [`crate::run`] on them (its [`RunIo`]). Also the one
//! read of a node's plan from the API server that `explain` makes.
//!
//! ```text
//! --plan-file F ─► FileSource ───────────────────────────────────────────┐
//! --node-name N ─► kube client (--kubeconfig | KUBECONFIG | in-cluster) ─┼─► run::run (cache first)
//!                    ├─► ApiSource (watch plan N and its views' slices) ─┤
//!                    └─► status_writer (SSA of N's status) ◄─ StatusSink ┘
//! ```
//!
//! Building the client reads files only; nothing talks to the API server before the loop has
//! applied the cached plan. A node with no plan cached that has only the kubelet's `kubernetes`
//! Service address first waits for the API server to answer there ([`bootstrap`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Api;

use crate::bootstrap;
use crate::error::Error;
use crate::metrics::LiveMetrics;
use crate::run::{RunConfig, RunIo, run};
use crate::source::api::ApiSource;
use crate::source::file::FileSource;
use crate::status_writer::{self, WriterConfig};
use crate::sync::Syncer;

/// Where the plan comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanFrom {
    /// A plan file, polled.
    File {
        /// The file.
        path: PathBuf,
        /// How often it is looked at.
        poll_interval: Duration,
    },
    /// The API server: this node's plan and its views' slices.
    Api {
        /// The kubeconfig; `None` infers (`KUBECONFIG`, then `~/.kube/config`, then in-cluster).
        kubeconfig: Option<PathBuf>,
        /// A status that changes only in progress (slices applied, sync time, counts) is written at
        /// most this often.
        status_progress_interval: Duration,
        /// With no plan cached and only the kubelet's `kubernetes` Service address to go by, how long
        /// to wait for the API server before exiting with what to configure (zero: wait forever).
        bootstrap_timeout: Duration,
    },
}

/// A Kubernetes client from a kubeconfig file, or inferred the way kubectl and client-go do.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    switchyard_process::client(kubeconfig)
        .await
        .map_err(Error::KubeConfig)
}

/// One read of `node`'s plan and its views' slices from the API server (for `explain` and `top`): the
/// same objects the agent watches, fetched once, with the backend its status says is in use.
pub async fn fetch_plan(
    client: kube::Client,
    node: &str,
) -> Result<
    (
        switchyard_api::NodeForwardingPlanSpec,
        Vec<crate::sync::SliceObject>,
        Option<switchyard_api::Backend>,
    ),
    Error,
> {
    use kube::api::{Api, ListParams};
    use switchyard_api::{ForwardingSlice, NodeForwardingPlan};
    let failed = |what: String| move |source: kube::Error| Error::FetchPlan { what, source };
    let mut plan = Api::<NodeForwardingPlan>::all(client.clone())
        .get(node)
        .await
        .map_err(failed(format!("nodeforwardingplan {node}")))?;
    let mut slices = Vec::new();
    if !plan.spec.views.is_empty() {
        let selector = switchyard_api::names::views_selector(plan.spec.views.iter().map(String::as_str));
        let listed = Api::<ForwardingSlice>::all(client)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(failed(format!("forwardingslices -l '{selector}'")))?;
        for mut object in listed.items {
            let name = object.metadata.name.clone().unwrap_or_default();
            // As the agent reads them: a /0 source range allows every source.
            object.spec.open_zero_source_ranges();
            slices.push((name, std::sync::Arc::new(object.spec)));
        }
    }
    plan.spec.open_zero_source_ranges();
    let in_use = plan.status.and_then(|status| status.backend);
    Ok((plan.spec, slices, in_use))
}

/// Runs the agent until `shutdown`: the loop over the chosen source (and, for the API, the status
/// writer).
pub async fn run_agent(
    config: RunConfig,
    from: PlanFrom,
    syncer: Syncer,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let metrics = LiveMetrics::default();
    match from {
        PlanFrom::File { path, poll_interval } => {
            let io = RunIo {
                source: Box::new(FileSource { path, poll_interval }),
                status: None,
                metrics,
            };
            run(config, syncer, io, shutdown, None).await
        }
        PlanFrom::Api {
            kubeconfig,
            status_progress_interval,
            bootstrap_timeout,
        } => {
            let client = client(kubeconfig.as_deref()).await?;
            let nothing_cached = config.cache_file.as_deref().is_none_or(|path| !path.exists());
            // A kubeconfig (flag or KUBECONFIG) names its own server: only in-cluster config goes
            // through the kubelet's address.
            let in_cluster = kubeconfig.is_none() && std::env::var_os("KUBECONFIG").is_none();
            let service_address = in_cluster
                .then(|| bootstrap::kubelet_service_address(|key| std::env::var(key).ok()))
                .flatten();
            if let (true, Some(address), false) =
                (nothing_cached, service_address, bootstrap_timeout.is_zero())
            {
                bootstrap::wait_for_api_server(&client, &address, bootstrap_timeout).await?;
            }
            let node = config.node_name.clone();
            let (sink, writer) = status_writer::spawn(
                Api::all(client.clone()),
                node.clone(),
                WriterConfig {
                    progress_interval: status_progress_interval,
                    ..WriterConfig::default()
                },
                metrics.clone(),
            );
            let io = RunIo {
                source: Box::new(ApiSource::new(client, &node)),
                status: Some(sink),
                metrics,
            };
            let result = run(config, syncer, io, shutdown, None).await;
            writer.abort();
            result
        }
    }
}
