//! How gpushare reads Kubernetes Node and Pod objects, in one place for the scheduler's cache
//! (`scheduler::cache`) and `gpushare inspect` (`inspect::build`): a node's GPUs (annotation `gpushare.io/gpus`) and labels; a pod's
//! key, whether it still holds what it was given, its node, its containers in pod order with
//! when each runs, and its assignment (`gpushare.io/assignment`). Pure: what each caller makes of a missing or unreadable value
//! (a refusal, a warning) stays with the caller.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Node, Pod};

use gpushare_core::request::lifecycle::ContainerRole;
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus, NodeGpusError};
use gpushare_core::request::{ASSIGNMENT_ANNOTATION, Assignment, RequestError};

/// Where Kubernetes puts an object that names no namespace.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A pod's `namespace/name`; ordered by namespace, then name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pod's key; a pod without `metadata.namespace` is in [`DEFAULT_NAMESPACE`].
pub fn pod_key(pod: &Pod) -> PodKey {
    PodKey {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

/// Whether the pod still holds what it was given (phase not Succeeded/Failed).
pub fn is_active(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The node the pod is bound to (`spec.nodeName`, when set and not empty).
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The pod's containers in pod order (`spec.initContainers`, then `spec.containers`), each
/// with when it runs: an init container with `restartPolicy: Always` is a sidecar.
pub fn pod_containers(pod: &Pod) -> impl Iterator<Item = (ContainerRole, &Container)> {
    let spec = pod.spec.as_ref();
    let init = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten());
    let app = spec.into_iter().flat_map(|s| s.containers.iter());
    init.map(|c| {
        let role = if c.restart_policy.as_deref() == Some("Always") {
            ContainerRole::Sidecar
        } else {
            ContainerRole::Init
        };
        (role, c)
    })
    .chain(app.map(|c| (ContainerRole::App, c)))
}

/// The names of the pod's containers in pod order, each with when it runs.
pub fn container_roles(pod: &Pod) -> Vec<(&str, ContainerRole)> {
    pod_containers(pod)
        .map(|(role, c)| (c.name.as_str(), role))
        .collect()
}

/// The pod's `gpushare.io/assignment`: `None` without the annotation.
pub fn pod_assignment(pod: &Pod) -> Option<Result<Assignment, RequestError>> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
        .map(|raw| Assignment::parse(raw))
}

/// The GPUs the node agent published (`gpushare.io/gpus`): `None` without the annotation.
pub fn node_gpus(node: &Node) -> Option<Result<NodeGpus, NodeGpusError>> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_GPUS_ANNOTATION))
        .map(|raw| NodeGpus::parse(raw))
}

/// One label of the node.
pub fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Every label of the node.
pub fn node_labels(node: &Node) -> HashMap<String, String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn pods_without_a_namespace_are_in_default() {
        let mut p = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(pod_key(&p).to_string(), "default/p");
        p.metadata.namespace = Some("ml".into());
        assert_eq!(pod_key(&p).to_string(), "ml/p");
        assert!(is_active(&p));
        assert_eq!(pod_node(&p), None);
        assert!(pod_assignment(&p).is_none());
        p.spec = Some(PodSpec {
            node_name: Some(String::new()),
            ..Default::default()
        });
        assert_eq!(pod_node(&p), None);
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert!(!is_active(&p));
    }

    #[test]
    fn init_containers_come_first_and_restartable_ones_are_sidecars() {
        let c = |name: &str, restart: Option<&str>| Container {
            name: name.into(),
            restart_policy: restart.map(str::to_string),
            ..Default::default()
        };
        let p = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    c("prep", None),
                    c("proxy", Some("Always")),
                    c("warm", None),
                ]),
                containers: vec![c("main", None)],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            container_roles(&p),
            [
                ("prep", ContainerRole::Init),
                ("proxy", ContainerRole::Sidecar),
                ("warm", ContainerRole::Init),
                ("main", ContainerRole::App),
            ]
        );
        assert!(container_roles(&Pod::default()).is_empty());
    }
}
