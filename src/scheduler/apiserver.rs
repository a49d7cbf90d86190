//! The extender's API-server side: watches of nodes and pods feeding the cache, and the
//! [`Binder`] that annotates and binds pods.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::server::{Annotations, ApiError, Binder, Extender};
use crate::kubeobjects::PodKey;

/// Annotates and binds through the API server.
pub struct KubeBinder {
    pub client: kube::Client,
}

#[async_trait]
impl Binder for KubeBinder {
    async fn get_pod(&self, pod: &PodKey) -> Result<Pod, ApiError> {
        self.pods(pod).get(&pod.name).await.map_err(|e| match e {
            kube::Error::Api(s) if s.is_not_found() => ApiError::PodGone { pod: pod.clone() },
            e => ApiError::GetPod {
                pod: pod.clone(),
                source: e.into(),
            },
        })
    }

    async fn bind(
        &self,
        pod: &PodKey,
        uid: &str,
        node: &str,
        annotations: &Annotations,
    ) -> Result<(), ApiError> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: (!uid.is_empty()).then(|| uid.to_string()),
                annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            },
        };
        self.pods(pod)
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                &pod.name,
                &PostParams::default(),
                &binding,
            )
            .await
            .map(|_| ())
            .map_err(|e| ApiError::Bind {
                pod: pod.clone(),
                node: node.to_string(),
                source: e.into(),
            })
    }
}

impl KubeBinder {
    /// The pods of `pod`'s namespace.
    fn pods(&self, pod: &PodKey) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &pod.namespace)
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
        node_event(&ext, &mut seen, ev);
    }
}

/// One event of the node watch. The nodes of a list (at start, and after a watch restart)
/// are taken without rebuilding the engine, which is rebuilt once when the list is complete:
/// a rebuild per listed node re-applies every allocation each time, O(nodes²) for a start.
fn node_event(ext: &Extender, seen: &mut HashSet<String>, ev: Result<Event<Node>, watcher::Error>) {
    if matches!(
        ev,
        Ok(Event::InitApply(_) | Event::Apply(_) | Event::Delete(_))
    ) {
        ext.metrics.node_events.fetch_add(1, Ordering::Relaxed);
    }
    let c = || ext.cluster.lock().unwrap_or_else(|e| e.into_inner());
    match ev {
        Ok(Event::Init) => seen.clear(),
        Ok(Event::InitApply(n)) => {
            seen.insert(n.metadata.name.clone().unwrap_or_default());
            c().set_node_deferred(&n);
        }
        Ok(Event::InitDone) => {
            c().retain_nodes(seen);
            ext.synced_nodes.store(true, Ordering::Release);
            tracing::info!(nodes = seen.len(), "node cache synced");
        }
        Ok(Event::Apply(n)) => c().set_node(&n),
        Ok(Event::Delete(n)) => {
            if let Some(name) = n.metadata.name.as_deref() {
                c().remove_node(name);
            }
        }
        Err(e) => {
            ext.metrics.watch_restarts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("node watch: {e}");
        }
    }
}

/// The pods whose resources count: bound and not terminated. A pending pod reaches the
/// extender in the filter request itself, and a reservation nobody binds expires
/// ([`super::cache::Cluster::expire_assumed`]); a pod leaving the selection (terminated, or
/// deleted) comes as a deletion. Selecting on the API server leaves out every pending pod's
/// events (half of a pod's events when each pod is created, then bound), which the server
/// would otherwise encode and this process decode.
pub const POD_WATCH_FIELDS: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// Keeps the cache's pod allocations current; never returns.
pub async fn watch_pods(client: kube::Client, ext: Arc<Extender>) {
    let api = Api::<Pod>::all(client);
    let mut seen: HashSet<String> = HashSet::new();
    let mut stream = watcher::watcher(api, watcher::Config::default().fields(POD_WATCH_FIELDS))
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        if matches!(
            ev,
            Ok(Event::InitApply(_) | Event::Apply(_) | Event::Delete(_))
        ) {
            ext.metrics.pod_events.fetch_add(1, Ordering::Relaxed);
        }
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
                {
                    let mut c = c();
                    c.retain_pods(&seen);
                    c.pods_listed();
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus};

    use crate::scheduler::cache::Cluster;
    use crate::scheduler::server::tests::OnePod;

    fn node(name: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.annotations = Some(
            [(
                NODE_GPUS_ANNOTATION.to_string(),
                NodeGpus::uniform(2, "sim", 15360).to_json(),
            )]
            .into(),
        );
        n
    }

    #[test]
    fn a_listed_cluster_is_built_once() {
        let cluster = Cluster::new(
            "gpushare",
            gpushare_core::request::ResourceNames::default(),
            std::time::Duration::from_secs(60),
        );
        let ext = Extender::new(cluster, Arc::new(OnePod));
        let rebuilds = || ext.cluster.lock().unwrap().rebuilds();
        let before = rebuilds();
        let mut seen = HashSet::new();
        node_event(&ext, &mut seen, Ok(Event::Init));
        for i in 0..100 {
            node_event(
                &ext,
                &mut seen,
                Ok(Event::InitApply(node(&format!("n{i}")))),
            );
        }
        assert_eq!(rebuilds(), before, "nothing rebuilt while the list comes");
        assert!(!ext.synced_nodes.load(Ordering::Acquire));
        node_event(&ext, &mut seen, Ok(Event::InitDone));
        assert_eq!(rebuilds(), before + 1, "one rebuild for the whole list");
        assert!(ext.synced_nodes.load(Ordering::Acquire));
        assert_eq!(ext.cluster.lock().unwrap().engine().nodes().len(), 100);
        // After the list, each change is taken at once.
        node_event(&ext, &mut seen, Ok(Event::Apply(node("n100"))));
        assert_eq!(rebuilds(), before + 2);
        assert_eq!(ext.cluster.lock().unwrap().engine().nodes().len(), 101);
        // A relist that no longer has n0 and n100 drops them, in one rebuild.
        node_event(&ext, &mut seen, Ok(Event::Init));
        for i in 1..100 {
            node_event(
                &ext,
                &mut seen,
                Ok(Event::InitApply(node(&format!("n{i}")))),
            );
        }
        node_event(&ext, &mut seen, Ok(Event::InitDone));
        assert_eq!(rebuilds(), before + 3);
        assert_eq!(ext.cluster.lock().unwrap().engine().nodes().len(), 99);
    }
}
