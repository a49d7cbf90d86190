//! `gpushare scheduler`: the kube-scheduler extender (filter, prioritize, bind), served by
//! `scheduler::serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::config::LogConfig;
use gpushare_core::placement::{POLICIES, UnknownPolicy};
use gpushare_core::request::{MemoryUnit, ResourceNames};

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
    #[arg(long, default_value = "GiB", value_parser = clap::value_parser!(MemoryUnit))]
    pub memory_unit: MemoryUnit,
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

pub fn run(args: &SchedulerArgs) -> anyhow::Result<()> {
    super::logging::init(&LogConfig {
        level: args.log_level.clone(),
        ..Default::default()
    })?;
    if !POLICIES.contains(&args.policy.as_str()) {
        return Err(UnknownPolicy(args.policy.clone()).into());
    }
    let settings = crate::scheduler::Settings {
        policy: args.policy.clone(),
        names: ResourceNames {
            memory_unit: args.memory_unit,
            ..Default::default()
        },
        assume_ttl: Duration::from_secs(args.assume_ttl_secs),
    };
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(async {
        let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        tracing::info!(listen = %args.listen, policy = %args.policy, "gpushare scheduler extender serving");
        crate::scheduler::serve(client, listener, settings, super::shutdown_signal())
            .await
            .context("extender server")
    })
}
