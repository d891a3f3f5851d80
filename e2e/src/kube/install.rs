//! Installing Switchyard on a cluster exactly as docs/install.md says: an overlay of `config/default` that
//! sets only image names and tags, the pull policy and `clusterCIDRs` ─► `kubectl apply -f crds/`,
//! the API-server ConfigMap, `kubectl apply -k <overlay>` ─► every node's plan Applied.
//!
//! ```text
//! <lab>/install/kustomization.yaml   resources: [<repo>/config/default]; images: tags; patches:
//!                                    imagePullPolicy; configMapGenerator (replace): config.yaml
//! <lab>/install/config.yaml          config/controller/config.yaml with the cluster's clusterCIDRs
//! ```

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::cluster::KubeCluster;
use crate::error::{LabError, Result};

/// What the overlay sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlay {
    /// The agent image (`name:tag`).
    pub agent_image: String,
    /// The controller image (`name:tag`).
    pub controller_image: String,
    /// `Never`, `IfNotPresent` or `Always`.
    pub pull_policy: String,
    /// The cluster's pod CIDRs.
    pub cluster_cidrs: Vec<String>,
}

/// The kustomization and controller configuration of `overlay`, for a directory that reaches
/// `config/default` as `base` (a relative path: kustomize refuses absolute ones in some versions).
pub fn overlay_files(overlay: &Overlay, base: &str, default_config: &str) -> Result<(String, String)> {
    let (agent_name, agent_tag) = split_image(&overlay.agent_image)?;
    let (controller_name, controller_tag) = split_image(&overlay.controller_image)?;
    let mut kustomization = format!(
        "# Switchyard as this cluster runs it: config/default with its images, pull policy and clusterCIDRs.\n\
         apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {base}\nimages:\n\
         - name: ghcr.io/switchyard/switchyard-agent\n  newName: {agent_name}\n  newTag: \"{agent_tag}\"\n\
         - name: ghcr.io/switchyard/switchyard-controller\n  newName: {controller_name}\n  newTag: \"{controller_tag}\"\n\
         configMapGenerator:\n- name: switchyard-controller-config\n  namespace: switchyard-system\n  behavior: replace\n  files:\n  - config.yaml\n\
         patches:\n"
    );
    for (kind, name) in [
        ("DaemonSet", "switchyard-agent"),
        ("Deployment", "switchyard-controller"),
    ] {
        let _ = write!(
            kustomization,
            "- target: {{kind: {kind}, name: {name}}}\n  patch: |-\n    \
             - {{op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: {}}}\n",
            overlay.pull_policy
        );
    }
    let config = replace_cluster_cidrs(default_config, &overlay.cluster_cidrs)?;
    Ok((kustomization, config))
}

fn split_image(image: &str) -> Result<(&str, &str)> {
    // NB: the tag follows the last colon after the last slash (a registry may carry a port).
    let slash = image.rfind('/').map_or(0, |at| at + 1);
    image[slash..]
        .rfind(':')
        .map(|at| (&image[..slash + at], &image[slash + at + 1..]))
        .ok_or_else(|| LabError::Refused(format!("image {image:?} has no tag")))
}

/// config/controller/config.yaml with its `clusterCIDRs:` list replaced.
fn replace_cluster_cidrs(config: &str, cidrs: &[String]) -> Result<String> {
    let mut out = String::new();
    let mut in_list = false;
    let mut replaced = false;
    for line in config.lines() {
        if line.starts_with("clusterCIDRs:") {
            out.push_str("clusterCIDRs:\n");
            for cidr in cidrs {
                let _ = writeln!(out, "- {cidr}");
            }
            in_list = true;
            replaced = true;
            continue;
        }
        if in_list && line.starts_with("- ") {
            continue;
        }
        in_list = false;
        out.push_str(line);
        out.push('\n');
    }
    if replaced {
        Ok(out)
    } else {
        Err(LabError::Refused(
            "config/controller/config.yaml has no clusterCIDRs: list".into(),
        ))
    }
}

/// How the install went.
#[derive(Clone, Debug)]
pub struct Installed {
    /// The overlay directory.
    pub overlay: PathBuf,
    /// From `kubectl apply -k` to every node's plan Applied.
    pub applied_after: Duration,
}

/// Writes the overlay under the cluster's directory and installs Switchyard as docs/install.md says;
/// returns once every Ready node's plan reports its current revision Applied.
pub fn install(
    cluster: &KubeCluster,
    repo: &Path,
    overlay: &Overlay,
    timeout: Duration,
) -> Result<Installed> {
    let dir = write_overlay(cluster, repo, overlay)?;
    let crds = repo.join("crds").display().to_string();
    cluster.kubectl(&["apply", "--server-side", "-f", &crds])?;
    let namespace = repo.join("config/default/namespace.yaml").display().to_string();
    cluster.kubectl(&["apply", "-f", &namespace])?;
    apiserver_configmap(cluster)?;
    let started = Instant::now();
    cluster.kubectl(&["apply", "-k", &dir.display().to_string()])?;
    wait_all_applied(cluster, timeout)?;
    Ok(Installed {
        overlay: dir,
        applied_after: started.elapsed(),
    })
}

/// `<lab>/install/`: the overlay (kustomization.yaml and config.yaml).
pub fn write_overlay(cluster: &KubeCluster, repo: &Path, overlay: &Overlay) -> Result<PathBuf> {
    write_overlay_of(cluster, repo, overlay, "config/default", "install")
}

/// `<lab>/<name>/`: the same overlay of another of the repository's kustomizations (`base`, relative to
/// the repository: `config/overlays/beside-kube-proxy`).
pub fn write_overlay_of(
    cluster: &KubeCluster,
    repo: &Path,
    overlay: &Overlay,
    base: &str,
    name: &str,
) -> Result<PathBuf> {
    let dir = cluster.dir().join(name);
    let default_config = read(&repo.join("config/controller/config.yaml"))?;
    let base = relative(&dir, &repo.join(base));
    let (kustomization, config) = overlay_files(overlay, &base, &default_config)?;
    std::fs::create_dir_all(&dir).map_err(|source| LabError::File {
        action: "creating",
        path: dir.clone(),
        source,
    })?;
    for (name, text) in [("kustomization.yaml", kustomization), ("config.yaml", config)] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| LabError::File {
            action: "writing",
            path,
            source,
        })?;
    }
    Ok(dir)
}

/// The `switchyard-apiserver` ConfigMap (config/README.md, "Reaching the API server").
pub fn apiserver_configmap(cluster: &KubeCluster) -> Result<()> {
    let address = cluster.apiserver_address();
    let yaml = cluster.kubectl(&[
        "-n",
        "switchyard-system",
        "create",
        "configmap",
        "switchyard-apiserver",
        &format!("--from-literal=KUBERNETES_SERVICE_HOST={}", address.ip()),
        &format!("--from-literal=KUBERNETES_SERVICE_PORT={}", address.port()),
        "--dry-run=client",
        "-o",
        "yaml",
    ])?;
    cluster.kubectl_stdin(&["apply", "-f", "-"], &yaml).map(drop)
}

/// Waits until every Ready node has a plan whose Applied condition is True for its current
/// revision.
pub fn wait_all_applied(cluster: &KubeCluster, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let nodes = ready_nodes(cluster)?;
        let plans = cluster.kubectl(&[
            "get",
            "nfp",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.revision} {.status.observedRevision} \
             {.status.conditions[?(@.type==\"Applied\")].status}{\"\\n\"}{end}",
        ]);
        let applied: Vec<String> = plans
            .as_deref()
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                (words.len() == 4 && words[1] == words[2] && words[3] == "True").then(|| words[0].to_owned())
            })
            .collect();
        if !nodes.is_empty() && nodes.iter().all(|node| applied.contains(node)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LabError::Timeout {
                what: format!(
                    "every node's plan to be Applied (nodes {nodes:?}, plans: {plans:?}); the agents:\n{}",
                    agents_report(cluster)
                ),
                waited_ms: timeout.as_millis(),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What a failed wait shows about the agents: their pods, their containers' states and their last
/// log lines (the init container's too), so that a timeout says why and not only that.
fn agents_report(cluster: &KubeCluster) -> String {
    let mut report = String::new();
    let namespace = ["-n", "switchyard-system"];
    let pods = cluster.kubectl(&[
        namespace[0],
        namespace[1],
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=agent",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} \
         init={.status.initContainerStatuses[*].state} main={.status.containerStatuses[*].state}{\"\\n\"}{end}",
    ]);
    let names: Vec<String> = match &pods {
        Ok(text) => {
            report.push_str(text);
            text.lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        }
        Err(error) => {
            report.push_str(&format!("listing the agent pods failed: {error}\n"));
            Vec::new()
        }
    };
    for what in [
        &["get", "daemonsets", "-o", "wide"][..],
        &["get", "events", "--sort-by=.lastTimestamp"][..],
    ] {
        let text = cluster
            .kubectl(&[&namespace[..], what].concat())
            .unwrap_or_else(|error| format!("(kubectl failed: {error})"));
        report.push_str(&text);
    }
    for name in names {
        for container in ["conntrack-sysctls", "agent"] {
            let logs = cluster
                .kubectl(&[
                    namespace[0],
                    namespace[1],
                    "logs",
                    &name,
                    "-c",
                    container,
                    "--tail=15",
                ])
                .unwrap_or_else(|error| format!("(no logs: {error})"));
            report.push_str(&format!("--- {name} {container}:\n{logs}\n"));
        }
    }
    report
}

fn ready_nodes(cluster: &KubeCluster) -> Result<Vec<String>> {
    let out = cluster.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .filter_map(|line| line.strip_suffix("=True").map(str::to_owned))
        .collect())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| LabError::File {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })
}

/// `to` relative to directory `from` (both absolute).
fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|part| part.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlay_sets_images_pull_policy_and_cluster_cidrs_only() {
        let overlay = Overlay {
            agent_image: "localhost:5000/switchyard-agent:dev".into(),
            controller_image: "ghcr.io/switchyard/switchyard-controller:0.1.0".into(),
            pull_policy: "Never".into(),
            cluster_cidrs: vec!["10.244.0.0/16".into()],
        };
        let config = "# head\nclusterCIDRs:\n- 10.1.0.0/16\n- fd00::/48\nmasqueradeAll: false\n";
        let (kustomization, config) = overlay_files(&overlay, "../../config/default", config).unwrap();
        assert_eq!(
            config,
            "# head\nclusterCIDRs:\n- 10.244.0.0/16\nmasqueradeAll: false\n"
        );
        let parsed: serde_json::Value = serde_saphyr::from_str(&kustomization).unwrap();
        assert_eq!(parsed["resources"][0], "../../config/default");
        assert_eq!(parsed["images"][0]["newName"], "localhost:5000/switchyard-agent");
        assert_eq!(parsed["images"][0]["newTag"], "dev");
        assert_eq!(parsed["configMapGenerator"][0]["behavior"], "replace");
        assert_eq!(parsed["patches"].as_array().unwrap().len(), 2);
        assert!(kustomization.contains("value: Never"));
    }

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        assert_eq!(
            relative(
                Path::new("/tmp/lab/x/install"),
                Path::new("/work/main/config/default")
            ),
            "../../../../work/main/config/default"
        );
        assert_eq!(relative(Path::new("/a/b"), Path::new("/a/c")), "../c");
    }

    #[test]
    fn an_image_without_a_tag_is_refused() {
        assert!(split_image("localhost:5000/agent").is_err());
        assert_eq!(split_image("a/b:1").unwrap(), ("a/b", "1"));
    }
}
