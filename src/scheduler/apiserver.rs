//! The extender's API-server side: watches of nodes and pods feeding the cache, and the
//! [`Binder`] that annotates and binds pods.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::server::{ApiError, Binder, Extender};

/// Annotates and binds through the API server.
pub struct KubeBinder {
    pub client: kube::Client,
}

#[async_trait]
impl Binder for KubeBinder {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ApiError> {
        self.pods(namespace)
            .get(name)
            .await
            .map_err(|e| ApiError::GetPod {
                pod: format!("{namespace}/{name}"),
                source: e.into(),
            })
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<(), ApiError> {
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        self.pods(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| ApiError::Annotate {
                pod: format!("{namespace}/{name}"),
                source: e.into(),
            })
    }

    async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
    ) -> Result<(), ApiError> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                uid: (!uid.is_empty()).then(|| uid.to_string()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            },
        };
        self.pods(namespace)
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            )
            .await
            .map(|_| ())
            .map_err(|e| ApiError::Bind {
                pod: format!("{namespace}/{name}"),
                node: node.to_string(),
                source: e.into(),
            })
    }
}

impl KubeBinder {
    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// Keeps the cache's nodes current; never returns.
pub async fn watch_nodes(client: kube::Client, ext: Arc<Extender>) {
    let api = Api::<Node>::all(client);
    let mut seen: HashSet<String> = HashSet::new();
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(n)) => {
                seen.insert(n.metadata.name.clone().unwrap_or_default());
                ext.cluster
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_node(&n);
            }
            Ok(Event::InitDone) => {
                ext.cluster
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain_nodes(&seen);
                ext.synced_nodes.store(true, Ordering::Release);
                tracing::info!(nodes = seen.len(), "node cache synced");
            }
            Ok(Event::Apply(n)) => {
                ext.cluster
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_node(&n);
            }
            Ok(Event::Delete(n)) => {
                if let Some(name) = n.metadata.name.as_deref() {
                    ext.cluster
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove_node(name);
                }
            }
            Err(e) => {
                ext.metrics.watch_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("node watch: {e}");
            }
        }
    }
}

/// Keeps the cache's pod allocations current; never returns.
pub async fn watch_pods(client: kube::Client, ext: Arc<Extender>) {
    let api = Api::<Pod>::all(client);
    let mut seen: HashSet<String> = HashSet::new();
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        let c = || ext.cluster.lock().unwrap_or_else(|e| e.into_inner());
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(p)) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    seen.insert(uid);
                }
                c().observe_pod(&p);
            }
            Ok(Event::InitDone) => {
                c().retain_pods(&seen);
                ext.synced_pods.store(true, Ordering::Release);
                tracing::info!(pods = seen.len(), "pod cache synced");
            }
            Ok(Event::Apply(p)) => c().observe_pod(&p),
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    c().forget_pod(uid);
                }
            }
            Err(e) => {
                ext.metrics.watch_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("pod watch: {e}");
            }
        }
    }
}
