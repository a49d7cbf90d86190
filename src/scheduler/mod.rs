//! `gpushare scheduler`: the kube-scheduler extender (filter, prioritize, bind over HTTP JSON,
//! `nodeCacheCapable`), fed by watches of nodes and pods, placing with the placement engine.
//!
//! - [`wire`] — the extender v1 wire types (Go field names);
//! - [`podreq`] — what a pod asks for, and its assignment;
//! - [`cache`] — nodes and allocations (assumed until seen bound), pure;
//! - [`server`] — the HTTP handlers, bind, metrics;
//! - [`kube`] — the watches and the API-server binder.

pub mod cache;
pub mod kube;
pub mod podreq;
pub mod server;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use gpushare_core::placement::{POLICIES, UnknownPolicy};
use gpushare_core::request::ResourceNames;

#[derive(Args, Debug, Clone)]
pub struct SchedulerArgs {
    /// Address of the extender's HTTP endpoint (filter, prioritize, bind, healthz, metrics).
    #[arg(long, default_value = "127.0.0.1:39999")]
    pub listen: SocketAddr,
    /// Kubeconfig (default: $KUBECONFIG, in-cluster, ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Node-ranking policy: gpushare, fgd, bestfit, binpack, spread. The GPU inside a node
    /// follows the node's `ack.node.gpu.placement` label when set.
    #[arg(long, default_value = "gpushare")]
    pub policy: String,
    /// Seconds an assumed allocation is held when its pod is never seen bound.
    #[arg(long, default_value_t = 300)]
    pub assume_ttl_secs: u64,
    /// Unit of the memory resource: GiB or MiB.
    #[arg(long, default_value = "GiB")]
    pub memory_unit: String,
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

pub fn main(args: &SchedulerArgs) -> anyhow::Result<()> {
    crate::logging::init(&crate::config::LogConfig {
        level: args.log_level.clone(),
        ..Default::default()
    })?;
    if !POLICIES.contains(&args.policy.as_str()) {
        return Err(UnknownPolicy(args.policy.clone()).into());
    }
    let names = ResourceNames {
        memory_unit: match args.memory_unit.as_str() {
            "GiB" => gpushare_core::request::MemoryUnit::GiB,
            "MiB" => gpushare_core::request::MemoryUnit::MiB,
            other => anyhow::bail!("--memory-unit {other:?} is not GiB or MiB"),
        },
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(run(args.clone(), names))
}

async fn run(args: SchedulerArgs, names: ResourceNames) -> anyhow::Result<()> {
    let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
    let cluster = cache::Cluster::new(
        &args.policy,
        names,
        Duration::from_secs(args.assume_ttl_secs),
    );
    let binder = Arc::new(kube::KubeBinder {
        client: client.clone(),
    });
    let ext = Arc::new(server::Extender::new(cluster, binder));
    tokio::spawn(kube::watch_nodes(client.clone(), ext.clone()));
    tokio::spawn(kube::watch_pods(client, ext.clone()));
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, policy = %args.policy, "gpushare scheduler extender serving");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    axum::serve(listener, server::router(ext))
        .with_graceful_shutdown(shutdown)
        .await
        .context("extender server")?;
    Ok(())
}
