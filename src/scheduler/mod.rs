//! `gpushare scheduler`: the kube-scheduler extender (filter, prioritize, bind over HTTP JSON,
//! `nodeCacheCapable`), fed by watches of nodes and pods, placing with the placement engine.
//!
//! - [`wire`] — the extender v1 wire types (Go field names);
//! - [`podreq`] — what a pod asks for, and its assignment;
//! - [`cache`] — nodes and allocations (assumed until seen bound), pure; Node and Pod objects
//!   are read through [`crate::kubeobjects`], as `gpushare inspect` reads them;
//! - [`server`] — the HTTP handlers, bind (refusals and API faults as distinct error types),
//!   metrics (through [`crate::metrics`]);
//! - [`apiserver`] — the watches and the API-server binder.

pub mod apiserver;
pub mod cache;
pub mod podreq;
pub mod server;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_core::request::ResourceNames;

/// What the extender needs besides the API server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Node-ranking policy (one of `placement::POLICIES`).
    pub policy: String,
    pub names: ResourceNames,
    /// How long an assumed allocation is held when its pod is never seen bound.
    pub assume_ttl: Duration,
    /// Only pods with one of these `schedulerName`s are bound.
    pub scheduler_names: Vec<String>,
    /// Filter answers only this many fitting nodes, the policy's best (0: all of them).
    pub filter_best: usize,
    /// Mutual TLS for the HTTP endpoint (`None`: plain HTTP, loopback tests only).
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

/// Serves the extender on `listener` until `shutdown` completes: the watches of nodes and
/// pods feed the cache, assumed allocations expire, HTTP answers filter, prioritize and bind.
pub async fn serve(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut cluster = cache::Cluster::new(&settings.policy, settings.names, settings.assume_ttl);
    cluster.set_filter_best(settings.filter_best);
    let binder = Arc::new(apiserver::KubeBinder {
        client: client.clone(),
    });
    let ext = Arc::new(
        server::Extender::new(cluster, binder).with_scheduler_names(settings.scheduler_names),
    );
    tokio::spawn(supervise("nodes", ext.clone(), |e| &e.synced_nodes, {
        let (client, ext) = (client.clone(), ext.clone());
        move || apiserver::watch_nodes(client.clone(), ext.clone())
    }));
    tokio::spawn(supervise("pods", ext.clone(), |e| &e.synced_pods, {
        let (client, ext) = (client.clone(), ext.clone());
        move || apiserver::watch_pods(client.clone(), ext.clone())
    }));
    tokio::spawn(ext.clone().warm());
    let expiry = ext.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let gone = expiry
                .cluster
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .expire_assumed(Instant::now());
            for pod in gone {
                expiry
                    .metrics
                    .assumed_expired
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%pod, "assumed allocation expired: the pod was never seen bound");
            }
        }
    });
    // Without TLS (a loopback --listen, tests) every connection is kube-scheduler's: no
    // cap per address below the global one.
    let mut limits = crate::http::Limits::default();
    if settings.tls.is_none() {
        limits.max_per_peer = usize::MAX;
    }
    crate::http::serve_tls(
        listener,
        server::router(ext),
        limits,
        settings.tls,
        shutdown,
    )
    .await
}

/// Runs a watch for ever: if it ends or panics (bad input must never leave the cache silently
/// frozen while `/healthz` says ok), the cache is marked unsynced — filter and bind answer
/// with an error, `/healthz` fails — and the watch starts again, re-listing.
async fn supervise<F, Fut>(
    what: &'static str,
    ext: Arc<server::Extender>,
    synced: fn(&server::Extender) -> &std::sync::atomic::AtomicBool,
    watch: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let outcome = tokio::spawn(watch()).await;
        match &outcome {
            Ok(()) => tracing::error!(watch = what, "watch ended; starting it again"),
            Err(e) => {
                tracing::error!(watch = what, error = %e, "watch panicked; starting it again")
            }
        }
        synced(&ext).store(false, Ordering::Release);
        ext.metrics.watch_restarts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[tokio::test]
    async fn a_watch_that_panics_is_started_again_and_the_cache_is_unsynced_meanwhile() {
        let cluster = cache::Cluster::new(
            "gpushare",
            gpushare_core::request::ResourceNames::default(),
            Duration::from_secs(60),
        );
        struct NoApi;
        #[async_trait::async_trait]
        impl server::Binder for NoApi {
            async fn get_pod(
                &self,
                pod: &crate::kubeobjects::PodKey,
            ) -> Result<k8s_openapi::api::core::v1::Pod, server::ApiError> {
                Err(server::ApiError::GetPod {
                    pod: pod.clone(),
                    source: "no API".into(),
                })
            }
            async fn bind(
                &self,
                _: &crate::kubeobjects::PodKey,
                _: &str,
                _: &str,
                _: &server::Annotations,
            ) -> Result<(), server::ApiError> {
                Ok(())
            }
        }
        let ext = Arc::new(server::Extender::new(cluster, Arc::new(NoApi)));
        let runs = Arc::new(AtomicU32::new(0));
        let task = tokio::spawn(supervise("nodes", ext.clone(), |e| &e.synced_nodes, {
            let (runs, ext) = (runs.clone(), ext.clone());
            move || {
                let (runs, ext) = (runs.clone(), ext.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    ext.synced_nodes.store(true, Ordering::Release);
                    panic!("a node annotation the watch could not take");
                }
            }
        }));
        // Started again after its 1 s pause (bounded wait: the tests share the CPUs).
        let t0 = std::time::Instant::now();
        while runs.load(Ordering::SeqCst) < 2 && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(runs.load(Ordering::SeqCst) >= 2, "not started again");
        assert!(ext.metrics.watch_restarts.load(Ordering::Relaxed) >= 1);
        // Between runs the cache counts as unsynced.
        while ext.synced_nodes.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
        assert!(!ext.synced_nodes.load(Ordering::Acquire));
    }
}
