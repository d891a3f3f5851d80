//! Which agent pod answers for a node, and whether it can: `explain` and `top` run `switchyard-agent`
//! inside it (it has the node's kernel), so a pod that is not running is said plainly, never waited on.
//!
//! ```text
//! pods of the agent DaemonSet (label selector, namespace) ─► the one on the node (spec.nodeName)
//!   ─► none: NoAgentPod (is the DaemonSet scheduled there?)
//!   ─► being deleted, not Running, or its `agent` container not running: AgentPodNotRunning (its words:
//!      phase, the container's waiting reason and message)
//!   ─► running but not Ready: the pod, with a warning (explain still answers from the node's kernel)
//! ```
//!
//! Pure: the command lists the pods and execs.

use k8s_openapi::api::core::v1::Pod;

use crate::error::Error;

/// The label selector of the agent DaemonSet's pods (config/agent/daemonset.yaml).
pub const AGENT_SELECTOR: &str = "app.kubernetes.io/name=switchyard,app.kubernetes.io/component=agent";
/// The container that runs `switchyard-agent`.
pub const AGENT_CONTAINER: &str = "agent";
/// Where the image has the binary.
pub const AGENT_BINARY: &str = "/usr/local/bin/switchyard-agent";

/// The pod to exec in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    /// Its name.
    pub name: String,
    /// Why it is not Ready, when it is not (a warning: exec still works).
    pub not_ready: Option<String>,
}

/// The agent pod of `node` among `pods` (those of `namespace` matching [`AGENT_SELECTOR`]).
pub fn agent_pod(node: &str, namespace: &str, pods: &[Pod]) -> Result<AgentPod, Error> {
    let on_node: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .collect();
    // A rolling update may briefly show the old pod (terminating) and the new one: prefer a live one.
    let pod = on_node
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .or_else(|| on_node.first())
        .ok_or_else(|| Error::NoAgentPod {
            node: node.to_owned(),
            namespace: namespace.to_owned(),
            selector: AGENT_SELECTOR.to_owned(),
        })?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let not_running = |why: String| Error::AgentPodNotRunning {
        pod: format!("{namespace}/{name}"),
        node: node.to_owned(),
        why,
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(not_running("it is being deleted".to_owned()));
    }
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Unknown".to_owned());
    let container = status
        .container_statuses
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|c| c.name == AGENT_CONTAINER);
    let state = container.and_then(|c| c.state.as_ref());
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or("Waiting");
        let message = waiting
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Err(not_running(format!(
            "phase {phase}, container {AGENT_CONTAINER} waiting: {reason}{message}"
        )));
    }
    if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
        let reason = terminated.reason.as_deref().unwrap_or("Terminated");
        return Err(not_running(format!(
            "phase {phase}, container {AGENT_CONTAINER} terminated: {reason} (exit code {})",
            terminated.exit_code
        )));
    }
    if phase != "Running" || state.and_then(|s| s.running.as_ref()).is_none() {
        let why = status
            .conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status != "True")
            .and_then(|c| c.message.clone())
            .map_or_else(|| format!("phase {phase}"), |m| format!("phase {phase}: {m}"));
        return Err(not_running(why));
    }
    let not_ready = container.filter(|c| !c.ready).map(|_| {
        status
            .conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.message.clone())
            .unwrap_or_else(|| {
                format!(
                    "container {AGENT_CONTAINER} is not ready (its /readyz fails: has it applied its plan?)"
                )
            })
    });
    Ok(AgentPod { name, not_ready })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    /// A pod on `node` whose agent container is in `state` (None: no container status yet).
    fn pod(name: &str, node: &str, phase: &str, state: Option<ContainerState>, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_owned()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                container_statuses: state.map(|state| {
                    vec![ContainerStatus {
                        name: AGENT_CONTAINER.to_owned(),
                        ready,
                        state: Some(state),
                        ..ContainerStatus::default()
                    }]
                }),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".to_owned(),
                    status: if phase == "Pending" { "False" } else { "True" }.to_owned(),
                    message: (phase == "Pending").then(|| "0/2 nodes are available".to_owned()),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn running() -> Option<ContainerState> {
        Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        })
    }

    fn waiting(reason: &str, message: &str) -> Option<ContainerState> {
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
            }),
            ..ContainerState::default()
        })
    }

    #[test]
    fn the_node_s_pod_is_chosen_or_what_is_wrong_with_it_is_said() {
        let terminated = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some("Error".to_owned()),
                exit_code: 2,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        });
        let mut leaving = pod("agent-old", "node-a", "Running", running(), true);
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        // (what, pods, node, Ok(pod name, warns) or Err(words the error has))
        type Case = (
            &'static str,
            Vec<Pod>,
            &'static str,
            Result<(&'static str, bool), &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "the pod on the node, ready",
                vec![
                    pod("agent-b", "node-b", "Running", running(), true),
                    pod("agent-a", "node-a", "Running", running(), true),
                ],
                "node-a",
                Ok(("agent-a", false)),
            ),
            (
                "running but not ready: a warning",
                vec![pod("agent-a", "node-a", "Running", running(), false)],
                "node-a",
                Ok(("agent-a", true)),
            ),
            (
                "the live pod beside a terminating one",
                vec![
                    leaving.clone(),
                    pod("agent-new", "node-a", "Running", running(), true),
                ],
                "node-a",
                Ok(("agent-new", false)),
            ),
            (
                "only a terminating pod",
                vec![leaving],
                "node-a",
                Err("it is being deleted"),
            ),
            (
                "no pod on the node",
                vec![pod("agent-b", "node-b", "Running", running(), true)],
                "node-a",
                Err("no switchyard agent pod on node node-a in namespace switchyard-system"),
            ),
            (
                "image not pulled",
                vec![pod(
                    "agent-a",
                    "node-a",
                    "Pending",
                    waiting("ImagePullBackOff", "Back-off pulling image \"nope\""),
                    false,
                )],
                "node-a",
                Err("waiting: ImagePullBackOff: Back-off pulling image \"nope\""),
            ),
            (
                "crashed",
                vec![pod("agent-a", "node-a", "Running", terminated, false)],
                "node-a",
                Err("terminated: Error (exit code 2)"),
            ),
            (
                "not scheduled yet",
                vec![pod("agent-a", "node-a", "Pending", None, false)],
                "node-a",
                Err("phase Pending: 0/2 nodes are available"),
            ),
        ];
        for (what, pods, node, want) in cases {
            let got = agent_pod(node, "switchyard-system", &pods);
            match (got, want) {
                (Ok(pod), Ok((name, warns))) => {
                    assert_eq!(
                        (pod.name.as_str(), pod.not_ready.is_some()),
                        (name, warns),
                        "{what}"
                    );
                }
                (Err(error), Err(words)) => {
                    let text = error.to_string();
                    assert!(text.contains(words), "{what}: {text}");
                    assert!(text.contains(node), "{what}: names the node: {text}");
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }
}
