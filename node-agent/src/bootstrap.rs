//! The first contact with the API server on a node that has nothing to forward yet.
//!
//! ```text
//! run --node-name N, no cached plan ─► KUBERNETES_SERVICE_HOST/PORT the kubelet's own?
//!     │ no (the switchyard-apiserver ConfigMap overrides them, or a kubeconfig) ─► the usual start
//!     ▼ yes: the client talks to the `kubernetes` Service's ClusterIP, which only a proxy programs
//! GET /version, retried ─ answered ─────────────────────────────────────────────► the usual start
//!     └ not answered within --api-bootstrap-timeout ─► Error::ReachApiServer: what is missing
//!       (the ConfigMap) and how to add it, on stderr and in /dev/termination-log (pod status)
//! ```
//!
//! On such a node (a new node of a cluster without kube-proxy) the agent could wait forever: the
//! address it was given is one that only its own rules would make reachable. With no plan cached
//! there are no rules to keep, so it exits, and the kubelet shows why in the pod's status
//! (`kubectl describe pod`: Last State, Message) and restarts it, which is also what picks up a
//! ConfigMap created since. A node with a cached plan never exits for this: it has rules to keep.

use std::time::Duration;

use crate::error::Error;

/// Where the kubelet writes a container's termination message from (its default
/// `terminationMessagePath`).
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The API server address the kubelet injected, when nothing overrides it: `KUBERNETES_SERVICE_HOST`
/// and `_PORT` equal to the address in `KUBERNETES_PORT` (`tcp://10.96.0.1:443`, which the kubelet
/// derives from the `kubernetes` Service and the ConfigMap does not set). `None` outside a pod or
/// when the ConfigMap gave another address.
pub fn kubelet_service_address(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let host = env("KUBERNETES_SERVICE_HOST")?;
    let port = env("KUBERNETES_SERVICE_PORT")?;
    let link = env("KUBERNETES_PORT")?;
    let injected = link.strip_prefix("tcp://")?;
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    (injected == address).then_some(address)
}

/// What the agent says when the `kubernetes` Service's ClusterIP does not answer and it has no plan.
pub fn unreachable_advice(address: &str, waited: Duration) -> String {
    format!(
        "no answer from the API server at {address} within {}s. That is the `kubernetes` Service's \
         ClusterIP, which only a Service proxy makes reachable, and this node has none yet (no cached \
         plan; no kube-proxy?). Tell the agent the API server's real address: kubectl -n \
         switchyard-system create configmap switchyard-apiserver \
         --from-literal=KUBERNETES_SERVICE_HOST=<address> --from-literal=KUBERNETES_SERVICE_PORT=<port> \
         (config/README.md, \"Reaching the API server\"); this pod picks it up when it restarts",
        waited.as_secs()
    )
}

/// Asks `/version` until the API server answers or `timeout` has passed. Any HTTP answer counts,
/// an error status too (401, 429, 503: the server is reachable, so the ConfigMap is not what is
/// missing, and the usual start retries those); only a connection that cannot be made or answered
/// in time does not.
pub async fn wait_for_api_server(
    client: &kube::Client,
    address: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut said = false;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let attempt =
            tokio::time::timeout(left.min(Duration::from_secs(3)), client.apiserver_version()).await;
        let failure = match attempt {
            Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => return Ok(()),
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no answer within 3 s".to_owned(),
        };
        if !said {
            tracing::warn!(%address, error = %failure, "the API server does not answer yet; retrying");
            said = true;
        }
        if tokio::time::Instant::now() + Duration::from_millis(500) >= deadline {
            return Err(Error::ReachApiServer(unreachable_advice(address, timeout)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Writes `message` where the kubelet reads a container's termination message, if that file exists
/// (it does in a pod; on a host the agent never creates it).
pub fn write_termination_message(message: &str) {
    let path = std::path::Path::new(TERMINATION_LOG);
    if path.exists() {
        // The kubelet keeps at most 4096 bytes.
        let cut: String = message.chars().take(4000).collect();
        if let Err(error) = std::fs::write(path, cut) {
            tracing::debug!(%error, "cannot write the termination message");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| map.get(key).cloned()
    }

    #[test]
    fn the_kubelets_own_address_is_recognised_and_an_override_or_a_host_is_not() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: [Case<'_>; 5] = [
            (
                "kubelet values only",
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("KUBERNETES_SERVICE_PORT", "443"),
                    ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
                ],
                Some("10.96.0.1:443"),
            ),
            (
                "IPv6 ClusterIP",
                &[
                    ("KUBERNETES_SERVICE_HOST", "fd00:10:96::1"),
                    ("KUBERNETES_SERVICE_PORT", "443"),
                    ("KUBERNETES_PORT", "tcp://[fd00:10:96::1]:443"),
                ],
                Some("[fd00:10:96::1]:443"),
            ),
            (
                "the ConfigMap overrides host and port",
                &[
                    ("KUBERNETES_SERVICE_HOST", "192.168.30.10"),
                    ("KUBERNETES_SERVICE_PORT", "6443"),
                    ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
                ],
                None,
            ),
            (
                "the ConfigMap overrides the port only",
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("KUBERNETES_SERVICE_PORT", "6443"),
                    ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
                ],
                None,
            ),
            ("not in a pod", &[], None),
        ];
        for (name, vars, want) in cases {
            assert_eq!(kubelet_service_address(env(vars)).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn the_advice_names_the_address_the_configmap_and_the_restart() {
        let advice = unreachable_advice("10.96.0.1:443", Duration::from_secs(25));
        for needle in [
            "10.96.0.1:443",
            "within 25s",
            "configmap switchyard-apiserver",
            "KUBERNETES_SERVICE_HOST=<address>",
            "when it restarts",
        ] {
            assert!(advice.contains(needle), "{needle:?} in {advice}");
        }
    }
}
