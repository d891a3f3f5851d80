//! The cluster description: YAML text ─► typed Nodes, Services and EndpointSlices.
//!
//! ```text
//! cluster.yaml (multi-document YAML or a v1 List, e.g. `kubectl get svc,endpointslices,nodes -A -o yaml`)
//!     │ serde-saphyr, documents dispatched on `kind`; other kinds are ignored
//!     ▼
//! ClusterDescription { nodes, services, endpoint_slices, source }
//!     ├─► layout::Layout::plan  (what namespaces, links, pods and routes the lab builds)
//!     └─► the planner hook      (the same objects the offline planner reads)
//! ```

use std::path::Path;

use k8s_openapi::api::{core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice};
use serde::Deserialize;

use crate::error::{LabError, Result};

/// The Kubernetes objects a lab is built from.
#[derive(Clone, Debug, Default)]
pub struct ClusterDescription {
    /// v1 Nodes: name, InternalIP, podCIDR and zone label become lab nodes.
    pub nodes: Vec<Node>,
    /// v1 Services: their cluster, external and load-balancer IPs get client routes.
    pub services: Vec<Service>,
    /// discovery.k8s.io/v1 EndpointSlices: every endpoint becomes a pod serving the slice's ports.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// The YAML text the objects were read from, for the planner.
    pub source: String,
}

/// One YAML document, dispatched on its `kind`.
#[derive(Deserialize)]
#[serde(tag = "kind")]
enum Document {
    Node(Box<Node>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    List {
        #[serde(default)]
        items: Vec<Document>,
    },
    #[serde(other)]
    Other,
}

impl ClusterDescription {
    /// Reads and parses a cluster description file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| LabError::ReadDescription {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses multi-document YAML (or a v1 List) holding Nodes, Services and EndpointSlices.
    ///
    /// Documents of other kinds are ignored, so a wider `kubectl get … -o yaml` dump is accepted.
    pub fn from_yaml(text: &str) -> Result<Self> {
        // NB: strict booleans, so an unquoted `no` label value stays a string.
        let options = serde_saphyr::options! { strict_booleans: true };
        let documents: Vec<Document> = serde_saphyr::from_multiple_with_options(text, options)
            .map_err(|error| LabError::ParseDescription(error.to_string()))?;
        let mut description = ClusterDescription {
            source: text.to_owned(),
            ..ClusterDescription::default()
        };
        for document in documents {
            description.add(document);
        }
        Ok(description)
    }

    fn add(&mut self, document: Document) {
        match document {
            Document::Node(node) => self.nodes.push(*node),
            Document::Service(service) => self.services.push(*service),
            Document::EndpointSlice(slice) => self.endpoint_slices.push(*slice),
            Document::List { items } => items.into_iter().for_each(|item| self.add(item)),
            Document::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n1, labels: {flag: no}}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ignored}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s1, namespace: default}
  addressType: IPv4
  endpoints: [{addresses: ["10.0.0.1"]}]
"#;

    #[test]
    fn reads_a_list_and_ignores_other_kinds() {
        let description = ClusterDescription::from_yaml(LIST).unwrap();
        assert_eq!(description.nodes.len(), 1);
        assert_eq!(description.endpoint_slices.len(), 1);
        let labels = description.nodes[0].metadata.labels.clone().unwrap();
        assert_eq!(labels["flag"], "no");
    }

    #[test]
    fn reads_the_example_cluster() {
        let text = include_str!("../testdata/cluster.yaml");
        let description = ClusterDescription::from_yaml(text).unwrap();
        assert_eq!(description.nodes.len(), 3);
        assert!(!description.services.is_empty());
        assert!(!description.endpoint_slices.is_empty());
    }

    #[test]
    fn rejects_a_wrong_api_version() {
        let error = ClusterDescription::from_yaml("apiVersion: v2\nkind: Node\nmetadata: {name: x}\n");
        assert!(matches!(error, Err(LabError::ParseDescription(_))));
    }
}
