//! `gpushare inspect`: what is allocated to whom, per node and GPU — the view operators know
//! from `kubectl inspect cgpu`. One list of nodes and one of pods, then `inspect::build` and
//! `inspect::render`.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::inspect;
use gpushare_core::request::limits::{MemoryUnit, ResourceNames};

/// Command-line arguments of `gpushare inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Per node and GPU: model, UUID, health, and the pods holding shares.
    #[arg(short, long)]
    pub details: bool,
    /// Print the same data as JSON (memory always in MiB).
    #[arg(long, conflicts_with = "details")]
    pub json: bool,
    /// Unit memory is shown in: GiB or MiB.
    #[arg(long, default_value = "GiB", value_parser = clap::value_parser!(MemoryUnit))]
    pub unit: MemoryUnit,
    /// Unit of the GPU-memory resource aliyun.com/gpu-mem (GiB or MiB), as the scheduler's
    /// --memory-unit; used for nodes whose GPUs are inferred from their allocatable memory.
    #[arg(long, default_value = "GiB", value_parser = clap::value_parser!(MemoryUnit))]
    pub memory_unit: MemoryUnit,
    #[command(flatten)]
    pub resources: super::scheduler::ResourceNameArgs,
    /// Only these nodes (default: every GPU node).
    #[arg(value_name = "NODE")]
    pub nodes: Vec<String>,
}

impl InspectArgs {
    pub fn resource_names(&self) -> anyhow::Result<ResourceNames> {
        self.resources.names(self.memory_unit)
    }
}

/// `gpushare inspect`: fetch, build, print to stdout; warnings go to stderr (table mode).
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (nodes, pods) = rt.block_on(async {
        let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
        Ok::<_, anyhow::Error>(inspect::fetch(client).await?)
    })?;
    let view = inspect::build(&nodes, &pods, &args.resource_names()?, &args.nodes)?;
    let out = if args.json {
        inspect::render::json(&view)
    } else if args.details {
        inspect::render::details(&view, args.unit)
    } else {
        inspect::render::table(&view, args.unit)
    };
    print!("{out}");
    if !args.json && !args.details {
        for w in inspect::render::all_warnings(&view) {
            eprintln!("warning: {w}");
        }
    }
    Ok(())
}
