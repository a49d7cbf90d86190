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
    let cluster = cache::Cluster::new(&settings.policy, settings.names, settings.assume_ttl);
    let binder = Arc::new(apiserver::KubeBinder {
        client: client.clone(),
    });
    let ext = Arc::new(
        server::Extender::new(cluster, binder).with_scheduler_names(settings.scheduler_names),
    );
    tokio::spawn(apiserver::watch_nodes(client.clone(), ext.clone()));
    tokio::spawn(apiserver::watch_pods(client, ext.clone()));
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
    crate::http::serve_tls(
        listener,
        server::router(ext),
        crate::http::Limits::default(),
        settings.tls,
        shutdown,
    )
    .await
}
