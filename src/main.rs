//! `gpushare`: command-line entry only; the work lives in the library.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

use gpushare::config::{GpuBackend, LogFormat, NodeConfig};
use gpushare::node::{Node, NodeState};
use gpushare::nri::plugin::{self, Registration};

#[derive(Parser)]
#[command(
    name = "gpushare",
    version,
    about = "Shared-GPU scheduling for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent: the containerd/CRI-O NRI plugin.
    Node(NodeArgs),
    /// Print the node's GPU capacity as the device plugin advertises it.
    Capacity(NodeArgs),
    /// (Started by `gpushare node`.) Thaw the listed cgroups once the agent is gone.
    Guardian {
        #[arg(long)]
        list: PathBuf,
    },
    /// Replay a cluster trace through the placement policies and report GPU fragmentation.
    Simulate(gpushare::simulate::SimulateArgs),
    /// Show GPU allocation per node and GPU (like `kubectl inspect cgpu`).
    Inspect(gpushare::inspect::InspectArgs),
    /// The kube-scheduler extender: filter, prioritize and bind GPU-sharing pods.
    Scheduler(gpushare::scheduler::SchedulerArgs),
}

#[derive(Args, Clone)]
struct NodeArgs {
    /// TOML config file (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The runtime's NRI socket.
    #[arg(long)]
    nri_socket: Option<PathBuf>,
    #[arg(long, value_enum)]
    gpu_backend: Option<GpuBackend>,
    /// Where GPU device nodes live (sim: created there).
    #[arg(long)]
    dev_root: Option<PathBuf>,
    /// Number of simulated GPUs.
    #[arg(long)]
    sim_gpus: Option<u32>,
    /// Memory of each simulated GPU in MiB.
    #[arg(long)]
    sim_gpu_memory_mib: Option<u64>,
    #[arg(long)]
    plugin_name: Option<String>,
    /// Two digits.
    #[arg(long)]
    plugin_index: Option<String>,
    #[arg(long)]
    node_name: Option<String>,
    /// host:port for /healthz, /registry, /metrics.
    #[arg(long, alias = "metrics-addr")]
    status_listen: Option<String>,
    /// Compute-quota policy: hard or burst.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(gpushare_core::control::Policy::NAMES)
        .map(|s| s.parse::<gpushare_core::control::Policy>().expect("a listed name")))]
    throttle_policy: Option<gpushare_core::control::Policy>,
    /// Control period in milliseconds.
    #[arg(long)]
    throttle_period_ms: Option<u64>,
    /// Turn the throttling controller off.
    #[arg(long)]
    no_throttle: bool,
    /// Agent state directory (sim declarations, guardian list).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// cgroupfs root.
    #[arg(long)]
    cgroup_root: Option<PathBuf>,
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Also run the kubelet device plugin (memory, core, count resources) and publish the
    /// node's GPUs as the node annotation gpushare.io/gpus.
    #[arg(long)]
    device_plugin: bool,
    /// The kubelet's device-plugin directory (kubelet.sock and our sockets).
    #[arg(long)]
    device_plugin_dir: Option<PathBuf>,
    /// Advertise gpu-core.percentage: auto (node label ack.node.gpu.schedule=core_mem), true, false.
    #[arg(long, value_enum)]
    device_plugin_core: Option<gpushare::deviceplugin::CoreMode>,
    /// kubeconfig for the node annotation and labels (default: $KUBECONFIG, in-cluster,
    /// ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

impl NodeArgs {
    fn config(&self) -> anyhow::Result<NodeConfig> {
        let mut cfg = match &self.config {
            Some(p) => NodeConfig::load(p)?,
            None => NodeConfig::default(),
        };
        if let Some(v) = &self.nri_socket {
            cfg.nri_socket = v.clone();
        }
        if let Some(v) = self.gpu_backend {
            cfg.gpu_backend = v;
        }
        if let Some(v) = &self.dev_root {
            cfg.dev_root = Some(v.clone());
        }
        if let Some(v) = self.sim_gpus {
            cfg.sim.count = v;
        }
        if let Some(v) = self.sim_gpu_memory_mib {
            cfg.sim.memory_mib = v;
        }
        if let Some(v) = &self.plugin_name {
            cfg.plugin_name = v.clone();
        }
        if let Some(v) = &self.plugin_index {
            cfg.plugin_index = v.clone();
        }
        if let Some(v) = &self.node_name {
            cfg.node_name = v.clone();
        }
        if let Some(v) = &self.status_listen {
            cfg.status_listen = Some(v.clone());
        }
        if let Some(v) = self.log_format {
            cfg.log.format = v;
        }
        if let Some(v) = &self.log_file {
            cfg.log.file = Some(v.clone());
        }
        if let Some(v) = self.throttle_policy {
            cfg.throttle.policy = v;
        }
        if let Some(v) = self.throttle_period_ms {
            cfg.throttle.period_ms = v;
        }
        if self.no_throttle {
            cfg.throttle.enabled = false;
        }
        if let Some(v) = &self.state_dir {
            cfg.throttle.state_dir = v.clone();
        }
        if let Some(v) = &self.cgroup_root {
            cfg.throttle.cgroup_root = v.clone();
        }
        if self.device_plugin {
            cfg.device_plugin.enabled = true;
        }
        if let Some(v) = &self.device_plugin_dir {
            cfg.device_plugin.dir = v.clone();
        }
        if let Some(v) = self.device_plugin_core {
            cfg.device_plugin.core = v;
        }
        if let Some(v) = &self.kubeconfig {
            cfg.kubernetes.kubeconfig = Some(v.clone());
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

fn main() -> anyhow::Result<()> {
    // A pre-installed NRI plugin is started by the runtime with no arguments, an empty
    // environment and its socket on the fd named by NRI_PLUGIN_SOCKET.
    if let Ok(fd) = std::env::var("NRI_PLUGIN_SOCKET")
        && std::env::args().len() == 1
    {
        return run_preinstalled(&fd);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Node(args) => run_node(args.config()?),
        Command::Capacity(args) => {
            let cfg = args.config()?;
            let inv = match cfg.gpu_backend {
                GpuBackend::Sim => gpushare_core::inventory::Inventory::new(
                    gpushare_core::inventory::sim_inventory(&cfg.sim, &cfg.node_name()),
                ),
                GpuBackend::Nvml => {
                    anyhow::bail!("capacity: gpu_backend nvml is not part of this build yet")
                }
            };
            for (name, value) in gpushare_core::inventory::capacity(&inv, &cfg.resources) {
                println!("{name}: \"{value}\"");
            }
            Ok(())
        }
        Command::Guardian { list } => Ok(gpushare::throttle::guardian::run(&list)?),
        Command::Simulate(args) => gpushare::simulate::main(&args),
        Command::Inspect(args) => gpushare::inspect::main(&args),
        Command::Scheduler(args) => gpushare::scheduler::main(&args),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_node(cfg: NodeConfig) -> anyhow::Result<()> {
    gpushare::logging::init(&cfg.log)?;
    let rt = runtime()?;
    rt.block_on(async move {
        let state = NodeState::init(&cfg)?;
        tracing::info!(
            node = %state.node_name,
            gpus = state.inventory.len(),
            backend = ?cfg.gpu_backend,
            dev_root = %cfg.dev_root().display(),
            "gpushare node starting"
        );
        let gpus = (state.node_name.clone(), state.inventory.clone());
        let node = Arc::new(Node::new(state));
        let controller = start_controller(&cfg, &node)?;
        if let Some(addr) = cfg.status_listen.clone() {
            let n = node.clone();
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("status_listen {addr}"))?;
            drop(listener);
            tokio::spawn(async move {
                if let Err(e) = gpushare::status::serve(&addr, n).await {
                    tracing::error!(error = %e, "status endpoint failed");
                }
            });
        }
        // Started last: nothing after it can fail and leave its sockets behind.
        let device_plugin = cfg.device_plugin.enabled.then(|| {
            gpushare::deviceplugin::Agent::start(
                &cfg.device_plugin,
                gpushare::deviceplugin::Settings::new(&cfg.device_plugin.dir),
                &cfg.resources,
                &gpus.0,
                &gpus.1,
                Some(gpushare::deviceplugin::KubeAccess::Config(
                    cfg.kubernetes.kubeconfig.clone(),
                )),
            )
        });
        let reg = Registration {
            name: cfg.plugin_name.clone(),
            index: cfg.plugin_index.clone(),
        };
        let socket = cfg.nri_socket.clone();
        tokio::select! {
            _ = plugin::run_external(&socket, reg, node) => {}
            _ = shutdown_signal() => tracing::info!("shutting down"),
        }
        if let Some(dp) = device_plugin {
            dp.shutdown().await;
        }
        if let Some(c) = controller {
            c.stop();
        }
        Ok(())
    })
}

/// Starts the throttling controller for `node` when enabled.
fn start_controller(
    cfg: &NodeConfig,
    node: &Arc<Node>,
) -> anyhow::Result<Option<gpushare::throttle::controller::Running>> {
    if !cfg.throttle.enabled {
        tracing::warn!("throttling controller disabled: quotas are not enforced");
        return Ok(None);
    }
    let source: Box<dyn gpushare::throttle::source::SampleSource> = match cfg.gpu_backend {
        GpuBackend::Sim => Box::new(gpushare::throttle::source::SimSource::new(
            gpushare::node::sim_dir(cfg),
        )),
        GpuBackend::Nvml => {
            anyhow::bail!("throttle: the NVML sample source is not part of this build yet")
        }
    };
    let exe = std::env::current_exe().context("cannot find our own executable for the guardian")?;
    let running = gpushare::throttle::controller::start(
        &cfg.throttle,
        node.registry.clone(),
        source,
        Some(&exe),
    )?;
    node.attach_controller(running.stats.clone(), running.link.clone());
    Ok(Some(running))
}

fn run_preinstalled(fd: &str) -> anyhow::Result<()> {
    let fd: i32 = fd
        .parse()
        .with_context(|| format!("NRI_PLUGIN_SOCKET {fd:?} is not a file descriptor number"))?;
    // The runtime's socket must not leak into processes we start (the guardian): they would
    // keep the connection open after we die.
    // SAFETY: fcntl on an fd number only sets a flag.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let name = std::env::var("NRI_PLUGIN_NAME").unwrap_or_else(|_| "gpushare".into());
    let index = std::env::var("NRI_PLUGIN_IDX").unwrap_or_else(|_| "10".into());
    gpushare::logging::init(&Default::default())?;
    let rt = runtime()?;
    rt.block_on(async move {
        let status_started = std::sync::Mutex::new(false);
        let node = Arc::new_cyclic(|weak: &std::sync::Weak<Node>| {
            let weak = weak.clone();
            Node::awaiting_config(move |cfg: &NodeConfig| {
                gpushare::logging::reconfigure(&cfg.log);
                let mut started = status_started.lock().expect("status lock");
                if !*started
                    && let Some(node) = weak.upgrade()
                {
                    match start_controller(cfg, &node) {
                        // Runs for the life of the process; the guardian covers its end.
                        Ok(running) => std::mem::forget(running),
                        Err(e) => tracing::error!(error = %format!("{e:#}"), "cannot start the throttling controller"),
                    }
                }
                if let (Some(addr), false, Some(node)) =
                    (cfg.status_listen.clone(), *started, weak.upgrade())
                {
                    *started = true;
                    tokio::spawn(async move {
                        if let Err(e) = gpushare::status::serve(&addr, node).await {
                            tracing::error!(error = %e, "status endpoint failed");
                        }
                    });
                }
            })
        });
        let reason = plugin::run_preinstalled(fd, Registration { name, index }, node).await?;
        tracing::info!(%reason, "runtime closed the plugin connection; exiting");
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
