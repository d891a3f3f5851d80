//! The Kubernetes client: from the file `--kubeconfig` names, else inferred as kubectl and client-go
//! do (KUBECONFIG, ~/.kube/config, the pod's service account). kube's errors nest every cause and
//! repeat the last one; what reaches the user names what was tried and the cause once.

use std::path::Path;

use crate::Error;

/// A client from `kubeconfig`, or inferred when it is `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let failed = |error: kube::config::KubeconfigError| Error::Kubeconfig {
                path: path.to_path_buf(),
                cause: innermost(&error),
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(failed)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(failed)?
        }
        None => kube::Config::infer()
            .await
            .map_err(|error| no_client_config(&error))?,
    };
    // Which address was taken (flag, KUBECONFIG, or the pod's environment: the kubelet's or the
    // switchyard-apiserver ConfigMap's) is the first thing to know when the API server is not reached.
    tracing::info!(server = %config.cluster_url, "the API server");
    kube::Client::try_from(config).map_err(|error| Error::Client {
        cause: innermost(&error),
    })
}

fn no_client_config(error: &kube::config::InferConfigError) -> Error {
    let tried = match std::env::var("KUBECONFIG").ok().filter(|v| !v.is_empty()) {
        Some(list) => format!("KUBECONFIG={list}"),
        None => "~/.kube/config (KUBECONFIG is empty or not set)".to_owned(),
    };
    Error::NoClientConfig {
        pod: if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            "the in-cluster configuration could not be read"
        } else {
            "not running in a pod"
        },
        tried,
        cause: innermost(error),
    }
}

/// The last cause of an error chain: the one that says what actually failed.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_file_is_named_with_its_cause_once() {
        let Err(error) = client(Some(Path::new("/nonexistent/kubeconfig"))).await else {
            panic!("a client from a missing file");
        };
        let text = error.to_string();
        assert!(
            text.starts_with("the kubeconfig /nonexistent/kubeconfig could not be used (check it, or pass another with --kubeconfig): "),
            "{text}"
        );
        assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
        assert!(!text.contains("\"\""), "{text}");
    }

    #[tokio::test]
    async fn a_kubeconfig_that_is_not_one_says_so() {
        let dir = switchyard_test_support::scratch::dir("process-kubeconfig").unwrap();
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, "this: [is not a kubeconfig").unwrap();
        let Err(error) = client(Some(&file)).await else {
            panic!("a client from a file that is not a kubeconfig");
        };
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("the kubeconfig {} could not be used", file.display())),
            "{text}"
        );
        assert!(text.contains("failed to parse kubeconfig YAML"), "{text}");
    }

    #[test]
    fn the_innermost_cause_is_the_last_of_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let outer = kube::config::KubeconfigError::ReadConfig(io, "/x".into());
        assert_eq!(innermost(&outer), "gone");
    }
}
