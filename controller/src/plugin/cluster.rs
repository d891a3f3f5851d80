//! The plugin's one edge to the cluster: a client for the kubeconfig and context kubectl would use,
//! the reads each subcommand needs, and a command run in an agent pod.
//!
//! ```text
//! --kubeconfig / KUBECONFIG / ~/.kube/config (in a pod: its service account) + --context ─► Client
//! Client ─► plans, slices, nodes (status, audit) | one node's plan and its views' slices (plan)
//!        ─► the node's agent pod (agent_pod::agent_pod) ─► exec switchyard-agent … ─► stdout, stderr, exit code
//! ```
//!
//! Every failure is an [`Error`] in the API server's words (`nodes "x" not found`); nothing here waits
//! longer than the caller's timeout.

use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use switchyard_api::{ForwardingSlice, NodeForwardingPlan, names::views_selector};
use tokio::io::AsyncReadExt as _;

use super::agent_pod::{AGENT_CONTAINER, AGENT_SELECTOR, AgentPod, agent_pod};
use crate::error::Error;

/// A client as kubectl would build it: `kubeconfig` (else KUBECONFIG, else ~/.kube/config, else the
/// pod's service account), with `context` instead of the current one.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let connect = |e: &dyn std::error::Error| Error::Connect(chain(e));
    let file = match kubeconfig {
        Some(path) => Some(Kubeconfig::read_from(path).map_err(|e| connect(&e))?),
        None => Kubeconfig::read().ok(),
    };
    let config = match file {
        Some(file) => {
            if let Some(context) = context
                && !file.contexts.iter().any(|c| c.name == context)
            {
                let known: Vec<&str> = file.contexts.iter().map(|c| c.name.as_str()).collect();
                return Err(Error::NoSuchContext {
                    context: context.to_owned(),
                    known: if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    },
                });
            }
            let options = KubeConfigOptions {
                context: context.map(str::to_owned),
                ..KubeConfigOptions::default()
            };
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| connect(&e))?
        }
        None if context.is_some() => {
            return Err(Error::Connect(
                "--context needs a kubeconfig, and none was found (KUBECONFIG, ~/.kube/config)".to_owned(),
            ));
        }
        None => kube::Config::incluster().map_err(|e| {
            Error::Connect(format!(
                "no kubeconfig (KUBECONFIG, ~/.kube/config, --kubeconfig) and not in a pod: {}",
                chain(&e)
            ))
        })?,
    };
    Client::try_from(config).map_err(|e| Error::Connect(chain(&e)))
}

/// `error` and its causes, joined as kubectl joins them.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// A failed read of `what`, in the API server's words when it answered.
fn read_error(what: impl Into<String>, error: &kube::Error) -> Error {
    let (message, code) = match error {
        kube::Error::Api(status) => (status.message.clone(), status.code),
        other => (chain(other), 0),
    };
    Error::Read {
        what: what.into(),
        message,
        code,
    }
}

/// Every plan and slice (what an audit reads).
pub async fn plans_and_slices(
    client: &Client,
) -> Result<(Vec<NodeForwardingPlan>, Vec<ForwardingSlice>), Error> {
    let all = ListParams::default();
    let plans = Api::<NodeForwardingPlan>::all(client.clone())
        .list(&all)
        .await
        .map_err(|e| read_error("nodeforwardingplans", &e))?;
    let slices = Api::<ForwardingSlice>::all(client.clone())
        .list(&all)
        .await
        .map_err(|e| read_error("forwardingslices", &e))?;
    Ok((plans.items, slices.items))
}

/// Every plan, slice and Node (the Nodes' metadata only).
pub async fn everything(
    client: &Client,
) -> Result<(Vec<NodeForwardingPlan>, Vec<ForwardingSlice>, Vec<Node>), Error> {
    let all = ListParams::default();
    let (plans, slices) = plans_and_slices(client).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&all)
        .await
        .map_err(|e| read_error("nodes", &e))?;
    let nodes = nodes
        .items
        .into_iter()
        .map(|n| Node {
            metadata: n.metadata,
            ..Node::default()
        })
        .collect();
    Ok((plans, slices, nodes))
}

/// The plan of `node` and the slices of its views. A node without a plan is told apart from a node
/// that does not exist: the Node is read then, and its 404 said as the API server says it.
pub async fn node_plan(
    client: &Client,
    node: &str,
) -> Result<(NodeForwardingPlan, Vec<ForwardingSlice>), Error> {
    let what = format!("the NodeForwardingPlan of node {node}");
    let plan = Api::<NodeForwardingPlan>::all(client.clone())
        .get_opt(node)
        .await
        .map_err(|e| read_error(&what, &e))?;
    let Some(plan) = plan else {
        Api::<Node>::all(client.clone())
            .get_metadata(node)
            .await
            .map_err(|e| read_error(format!("node {node}"), &e))?;
        return Err(Error::Read {
            what,
            message: format!(
                "node {node} has no NodeForwardingPlan yet: is the switchyard controller running? \
                 (kubectl get nodeforwardingplans lists the planned nodes)"
            ),
            code: 404,
        });
    };
    let slices = if plan.spec.views.is_empty() {
        Vec::new()
    } else {
        let selector = views_selector(plan.spec.views.iter().map(String::as_str));
        Api::<ForwardingSlice>::all(client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| read_error("forwardingslices", &e))?
            .items
    };
    Ok((plan, slices))
}

/// The agent pod of `node` in `namespace`, after checking that the Node exists (an unknown node is
/// said as such, not as a missing pod).
pub async fn node_agent_pod(client: &Client, namespace: &str, node: &str) -> Result<AgentPod, Error> {
    Api::<Node>::all(client.clone())
        .get_metadata(node)
        .await
        .map_err(|e| read_error(format!("node {node}"), &e))?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(
            &ListParams::default()
                .labels(AGENT_SELECTOR)
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .map_err(|e| read_error(format!("the agent pods in namespace {namespace}"), &e))?;
    agent_pod(node, namespace, &pods.items)
}

/// What a command in a pod printed, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
    /// Its exit code (0 on success).
    pub exit_code: u8,
}

/// Runs `command` in the agent container of `pod` and collects what it printed.
pub async fn exec(client: &Client, namespace: &str, pod: &str, command: Vec<String>) -> Result<Ran, Error> {
    let failed = |cause: String| Error::Exec {
        pod: format!("{namespace}/{pod}"),
        cause,
    };
    let params = AttachParams::default()
        .container(AGENT_CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let mut process = Api::<Pod>::namespaced(client.clone(), namespace)
        .exec(pod, command, &params)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(status) => failed(status.message.clone()),
            other => failed(chain(other)),
        })?;
    let status = process.take_status();
    let (mut out, mut err) = (process.stdout(), process.stderr());
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let read_out = async {
        match out.as_mut() {
            Some(out) => out.read_to_end(&mut stdout).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let read_err = async {
        match err.as_mut() {
            Some(err) => err.read_to_end(&mut stderr).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let (a, b) = tokio::join!(read_out, read_err);
    a.and(b).map_err(|e| failed(format!("reading its output: {e}")))?;
    let status = match status {
        Some(status) => status.await,
        None => None,
    };
    process.join().await.map_err(|e| failed(chain(&e)))?;
    Ok(Ran {
        stdout,
        stderr,
        exit_code: exit_code(status.as_ref()).map_err(failed)?,
    })
}

/// The exit code the API server reports for an exec: `Success` is 0, `NonZeroExitCode` carries it in
/// its causes; any other failure (the container gone, the command not found) is an error.
fn exit_code(status: Option<&Status>) -> Result<u8, String> {
    let Some(status) = status else {
        return Err("the API server closed the stream without an exit status".to_owned());
    };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let code = status
        .details
        .as_ref()
        .filter(|_| status.reason.as_deref() == Some("NonZeroExitCode"))
        .and_then(|d| d.causes.as_deref())
        .and_then(|causes| causes.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.parse::<u8>().ok());
    code.ok_or_else(|| {
        status
            .message
            .clone()
            .unwrap_or_else(|| "the command failed".to_owned())
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    use super::*;

    fn status(outcome: &str, reason: &str, message: &str, exit: Option<&str>) -> Status {
        Status {
            status: Some(outcome.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            details: exit.map(|code| StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".to_owned()),
                    message: Some(code.to_owned()),
                    field: None,
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        }
    }

    #[test]
    fn exit_codes_come_from_the_exec_status() {
        let nonzero = status(
            "Failure",
            "NonZeroExitCode",
            "command terminated with non-zero exit code: exit status 3",
            Some("3"),
        );
        let gone = status(
            "Failure",
            "InternalError",
            "container not found (\"agent\")",
            None,
        );
        assert_eq!(exit_code(Some(&status("Success", "", "", None))), Ok(0));
        assert_eq!(exit_code(Some(&nonzero)), Ok(3));
        assert_eq!(
            exit_code(Some(&gone)),
            Err("container not found (\"agent\")".to_owned())
        );
        assert!(exit_code(None).is_err());
    }
}
