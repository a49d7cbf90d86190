//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`). The Go structs
//! carry no JSON tags, so the keys are the Go field names (PascalCase); the pod inside is an
//! ordinary Kubernetes object.

use std::collections::BTreeMap;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Node, Pod};

/// `v1.NodeList`.
pub type NodeList = List<Node>;
use serde::{Deserialize, Serialize};

/// Scores the extender returns are in [0, MAX_SCORE] (`extenderv1.MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// Arguments of `filter` and `prioritize`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    #[serde(default)]
    pub pod: Option<Pod>,
    /// Only when the extender is not `nodeCacheCapable`.
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// Only when the extender is `nodeCacheCapable`.
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

/// Result of `filter`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(default)]
    pub error: String,
}

/// One entry of `prioritize`'s answer (a bare JSON array of these).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// Arguments of `bind`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub node: String,
}

/// Result of `bind`: empty `Error` means bound.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    #[serde(default)]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_field_names() {
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"p","namespace":"default"}},"Nodes":null,"NodeNames":["n1","n2"]}"#,
        )
        .unwrap();
        assert_eq!(a.node_names.unwrap(), ["n1", "n2"]);
        assert_eq!(a.pod.unwrap().metadata.name.as_deref(), Some("p"));
        let r = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            failed_nodes: [("n2".to_string(), "why".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"NodeNames":["n1"],"FailedNodes":{"n2":"why"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let b: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"p","PodNamespace":"ns","PodUID":"u-1","Node":"n1"}"#,
        )
        .unwrap();
        assert_eq!((b.pod_uid.as_str(), b.node.as_str()), ("u-1", "n1"));
        assert_eq!(
            serde_json::to_string(&vec![HostPriority {
                host: "n1".into(),
                score: 10
            }])
            .unwrap(),
            r#"[{"Host":"n1","Score":10}]"#
        );
    }
}
