//! The agent's side of its Node object: publishes the GPU inventory as the node annotation
//! `gpushare.io/gpus` (at start, whenever GPU health changes, and whenever someone else
//! changes it), and — with `device_plugin.core = auto` — follows the node label
//! `ack.node.gpu.schedule` to decide whether the core resource is advertised.
//!
//! One watch on the node (field selector `metadata.name=<node>`), not a poll, so thousands of
//! nodes cost the API server little. Failing to reach the API server is logged and retried
//! with backoff; it never stops the NRI plugin or the device plugin.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use tokio::sync::watch;

use super::resource::Unhealthy;
use crate::backoff::Backoff;
use gpushare_core::inventory::Inventory;
use gpushare_core::placement::model::{SCHEDULE_LABEL, ScheduleMode};
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus};

/// Field manager named in our patches.
pub const FIELD_MANAGER: &str = "gpushare-node";

/// How to reach the API server.
#[derive(Clone)]
pub enum KubeAccess {
    /// `crate::kubeclient::client`: this kubeconfig, else `$KUBECONFIG`, `~/.kube/config`,
    /// in-cluster.
    Config(Option<PathBuf>),
    /// A ready client (tests: a mock API server).
    Client(kube::Client),
}

/// What the sync works with.
pub struct NodeSync {
    pub node_name: String,
    pub inventory: Inventory,
    pub health: watch::Receiver<Unhealthy>,
    /// With `core = auto`: set to whether the node is labelled `ack.node.gpu.schedule=core_mem`.
    pub core: Option<watch::Sender<bool>>,
    /// Longest wait between retries against the API server.
    pub retry_max: Duration,
}

/// Whether the node's labels ask for the core resource. An unknown label value is an error
/// (the caller logs it and treats the node as not `core_mem`).
pub fn core_from_labels(
    labels: &BTreeMap<String, String>,
) -> Result<bool, gpushare_core::placement::model::LabelError> {
    match labels.get(SCHEDULE_LABEL) {
        None => Ok(false),
        Some(v) => Ok(ScheduleMode::parse(v)?.shares_with_core()),
    }
}

/// Whether the node already carries `desired` (compared as data, not text).
pub fn annotation_is_current(current: Option<&str>, desired: &NodeGpus) -> bool {
    current
        .and_then(|raw| NodeGpus::parse(raw).ok())
        .is_some_and(|c| c == *desired)
}

/// The merge patch that sets the annotation.
pub fn annotation_patch(desired: &NodeGpus) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { NODE_GPUS_ANNOTATION: desired.to_json() } } })
}

/// Connects (retrying with backoff) and runs [`run_with_client`].
pub async fn run(sync: NodeSync, access: KubeAccess) {
    let client = match access {
        KubeAccess::Client(c) => c,
        KubeAccess::Config(path) => {
            let mut backoff = Backoff::new(Duration::from_secs(1), sync.retry_max);
            loop {
                match crate::kubeclient::client(path.as_deref()).await {
                    Ok(c) => break c,
                    Err(e) => {
                        let wait = backoff.next_wait();
                        tracing::warn!(
                            node = %sync.node_name,
                            error = %format!("{e:#}"),
                            retry_in = ?wait,
                            "cannot reach the API server: node annotation gpushare.io/gpus not published, node labels not read"
                        );
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    };
    run_with_client(sync, client).await
}

/// The admission policies that narrow what a node agent and a pod may write; without them an
/// agent's identity may edit every node, and pods may forge their assignment.
pub const REQUIRED_POLICIES: [&str; 2] = ["gpushare-node-scope", "gpushare-pod-annotations"];

/// Checks once that the admission policies are installed, loudly when they are not.
pub async fn check_admission_policies(client: kube::Client) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client);
    for name in REQUIRED_POLICIES {
        match api.get_opt(name).await {
            Ok(Some(_)) => tracing::info!(policy = name, "admission policy installed"),
            Ok(None) => tracing::error!(
                policy = name,
                "admission policy NOT installed: this agent's identity can edit every node, and pods can forge gpushare.io/assignment; kubectl apply -f install/admission-policy.yaml"
            ),
            Err(e) => {
                tracing::warn!(policy = name, error = %e, "cannot check that the admission policy is installed")
            }
        }
    }
}

/// Watches the node and keeps its annotation current; runs until the task is dropped.
pub async fn run_with_client(mut sync: NodeSync, client: kube::Client) {
    tokio::spawn(check_admission_policies(client.clone()));
    let name = sync.node_name.clone();
    let api: Api<Node> = Api::all(client);
    let mut nodes = kube::runtime::watcher::watch_object(api.clone(), &name)
        .default_backoff()
        .boxed();
    let mut backoff = Backoff::new(Duration::from_secs(1), sync.retry_max);
    let mut need_patch = true;
    let mut retry_at = tokio::time::Instant::now();
    let mut health_open = true;
    loop {
        tokio::select! {
            event = nodes.next() => match event {
                None => {
                    tracing::warn!(node = %name, "node watch ended");
                    return;
                }
                Some(Ok(Some(node))) => {
                    follow_labels(&sync, &node);
                    let current = node
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(NODE_GPUS_ANNOTATION))
                        .map(String::as_str);
                    let desired = desired(&sync);
                    if !annotation_is_current(current, &desired) && !need_patch {
                        tracing::info!(node = %name, current = current.unwrap_or("<none>"), "node annotation gpushare.io/gpus is not ours; publishing again");
                        need_patch = true;
                        retry_at = tokio::time::Instant::now();
                    }
                }
                Some(Ok(None)) => tracing::warn!(node = %name, "node not found (is --node-name right?)"),
                Some(Err(e)) => tracing::warn!(node = %name, error = %e, "watching the node failed; retrying"),
            },
            changed = sync.health.changed(), if health_open => {
                if changed.is_err() {
                    health_open = false;
                } else {
                    need_patch = true;
                    retry_at = tokio::time::Instant::now();
                }
            }
            _ = tokio::time::sleep_until(retry_at), if need_patch => {
                let desired = desired(&sync);
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                match api.patch(&name, &params, &Patch::Merge(annotation_patch(&desired))).await {
                    Ok(_) => {
                        tracing::info!(
                            node = %name,
                            gpus = desired.gpus.len(),
                            unhealthy = desired.gpus.iter().filter(|g| !g.healthy).count(),
                            "published node annotation gpushare.io/gpus"
                        );
                        need_patch = false;
                        backoff.reset();
                    }
                    Err(e) => {
                        let wait = backoff.next_wait();
                        tracing::warn!(node = %name, error = %e, retry_in = ?wait, "cannot publish node annotation gpushare.io/gpus");
                        retry_at = tokio::time::Instant::now() + wait;
                    }
                }
            }
        }
    }
}

fn desired(sync: &NodeSync) -> NodeGpus {
    let unhealthy: Vec<u32> = sync.health.borrow().iter().copied().collect();
    NodeGpus::from_inventory(&sync.inventory, &unhealthy)
}

fn follow_labels(sync: &NodeSync, node: &Node) {
    let Some(core) = &sync.core else { return };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let on = core_from_labels(labels).unwrap_or_else(|e| {
        tracing::warn!(node = %sync.node_name, error = %e, "core resource not advertised");
        false
    });
    core.send_if_modified(|v| {
        if *v == on {
            return false;
        }
        tracing::info!(
            node = %sync.node_name,
            label = SCHEDULE_LABEL,
            value = labels.get(SCHEDULE_LABEL).map_or("<none>", String::as_str),
            core = on,
            "node schedule label changed"
        );
        *v = on;
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::inventory::{SimConfig, sim_inventory};

    #[test]
    fn only_core_mem_asks_for_the_core_resource() {
        let l = |v: &str| BTreeMap::from([(SCHEDULE_LABEL.to_string(), v.to_string())]);
        assert!(core_from_labels(&l("core_mem")).unwrap());
        for v in ["cgpu", "share", "default"] {
            assert!(!core_from_labels(&l(v)).unwrap(), "{v}");
        }
        assert!(!core_from_labels(&BTreeMap::new()).unwrap());
        let e = core_from_labels(&l("mps")).unwrap_err();
        assert!(e.to_string().contains("\"mps\""), "{e}");
    }

    #[test]
    fn annotation_compares_as_data_and_patch_sets_it() {
        let inv = Inventory::new(sim_inventory(&SimConfig::default(), "n1"));
        let desired = NodeGpus::from_inventory(&inv, &[]);
        let raw = desired.to_json();
        assert!(annotation_is_current(Some(&raw), &desired));
        let pretty = serde_json::to_string_pretty(&desired).unwrap();
        assert!(annotation_is_current(Some(&pretty), &desired));
        assert!(!annotation_is_current(None, &desired));
        assert!(!annotation_is_current(Some("garbage"), &desired));
        let sick = NodeGpus::from_inventory(&inv, &[2]);
        assert!(!annotation_is_current(Some(&raw), &sick));
        let patch = annotation_patch(&desired);
        assert_eq!(patch["metadata"]["annotations"][NODE_GPUS_ANNOTATION], raw);
    }
}
