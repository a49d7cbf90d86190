//! `gpushare node` (the NRI plugin, throttling controller, device plugin and status endpoint,
//! as a systemd service or a pre-installed plugin the runtime starts) and `gpushare capacity`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use clap::builder::TypedValueParser as _;

use crate::config::{GpuBackend, LogFormat, NodeConfig};
use crate::gpu::Backend;
use crate::node::{AgentState, Node};
use crate::nri::plugin::{self, Registration};
use crate::throttle::controller::Running;
use crate::throttle::source::SampleSource;

#[derive(Args, Clone, Debug, Default)]
pub struct NodeArgs {
    /// TOML config file (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The runtime's NRI socket.
    #[arg(long)]
    pub nri_socket: Option<PathBuf>,
    /// Do not connect over NRI (runtimes without it: `gpushare runtime` / `gpushare hook`
    /// reach the agent on --runtime-socket).
    #[arg(long)]
    pub no_nri: bool,
    /// Serve the runtime-level modes' local API on this unix socket (`[runtime_api]`).
    #[arg(long)]
    pub runtime_socket: Option<PathBuf>,
    /// A runc state root to rebuild the registry from at start (repeatable;
    /// `[runtime_api] runc_roots`).
    #[arg(long)]
    pub runc_root: Vec<PathBuf>,
    /// A namespace whose containers granted no GPU keep their image's NVIDIA_* environment
    /// (repeatable; `passthrough_namespaces`): for the NVIDIA device plugin, DCGM exporter.
    #[arg(long)]
    pub passthrough_namespace: Vec<String>,
    #[arg(long, value_enum)]
    pub gpu_backend: Option<GpuBackend>,
    /// Where GPU device nodes live (sim: created there).
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// Number of simulated GPUs.
    #[arg(long)]
    pub sim_gpus: Option<u32>,
    /// Memory of each simulated GPU in MiB.
    #[arg(long)]
    pub sim_gpu_memory_mib: Option<u64>,
    #[arg(long)]
    pub plugin_name: Option<String>,
    /// Two digits.
    #[arg(long)]
    pub plugin_index: Option<String>,
    #[arg(long)]
    pub node_name: Option<String>,
    /// host:port for /healthz, /metrics.
    #[arg(long, alias = "metrics-addr")]
    pub status_listen: Option<String>,
    /// The root-only status socket (/registry, /inventory too); empty: off.
    #[arg(long)]
    pub status_socket: Option<PathBuf>,
    /// Compute-quota policy: hard or burst.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(gpushare_core::control::ComputePolicy::NAMES)
        .map(|s| s.parse::<gpushare_core::control::ComputePolicy>().expect("a listed name")))]
    pub throttle_policy: Option<gpushare_core::control::ComputePolicy>,
    /// Control period in milliseconds.
    #[arg(long)]
    pub throttle_period_ms: Option<u64>,
    /// Turn the throttling controller off.
    #[arg(long)]
    pub no_throttle: bool,
    /// The in-container limiter library on this host (`[limiter] library`).
    #[arg(long)]
    pub limiter_library: Option<PathBuf>,
    /// Do not inject the in-container limiter (`[limiter] enabled = false`).
    #[arg(long)]
    pub no_limiter: bool,
    /// Simulated GPUs: a directory with stand-in libcuda.so.1 / libnvidia-ml.so.1 to mount into
    /// GPU containers (`[limiter] driver_dir`).
    #[arg(long)]
    pub sim_driver_dir: Option<PathBuf>,
    /// Agent state directory (sim declarations, guardian list).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// cgroupfs root.
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Also run the kubelet device plugin (memory, core, count resources) and publish the
    /// node's GPUs as the node annotation gpushare.io/gpus.
    #[arg(long)]
    pub device_plugin: bool,
    /// The kubelet's device-plugin directory (kubelet.sock and our sockets).
    #[arg(long)]
    pub device_plugin_dir: Option<PathBuf>,
    /// Advertise gpu-core.percentage: auto (node label ack.node.gpu.schedule=core_mem), true, false.
    #[arg(long, value_enum)]
    pub device_plugin_core: Option<crate::deviceplugin::CoreMode>,
    /// kubeconfig for the node annotation and labels (default: $KUBECONFIG,
    /// ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

impl NodeConfig {
    /// The config file (or the defaults) with the flags given on the command line on top.
    pub fn from_args(args: &NodeArgs) -> anyhow::Result<NodeConfig> {
        let mut cfg = match &args.config {
            Some(p) => NodeConfig::load(p)?,
            None => NodeConfig::default(),
        };
        cfg.apply(args);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Overrides what `args` sets.
    pub fn apply(&mut self, args: &NodeArgs) {
        fn set<T: Clone>(dst: &mut T, flag: &Option<T>) {
            if let Some(v) = flag {
                *dst = v.clone();
            }
        }
        set(&mut self.nri_socket, &args.nri_socket);
        if args.no_nri {
            self.nri = false;
        }
        if let Some(socket) = &args.runtime_socket {
            self.runtime_api.enabled = true;
            self.runtime_api.socket = socket.clone();
        }
        if !args.runc_root.is_empty() {
            self.runtime_api.runc_roots = args.runc_root.clone();
        }
        if !args.passthrough_namespace.is_empty() {
            self.passthrough_namespaces = args.passthrough_namespace.clone();
        }
        set(&mut self.gpu_backend, &args.gpu_backend);
        set(&mut self.sim.count, &args.sim_gpus);
        set(&mut self.sim.memory_mib, &args.sim_gpu_memory_mib);
        set(&mut self.plugin_name, &args.plugin_name);
        set(&mut self.plugin_index, &args.plugin_index);
        set(&mut self.node_name, &args.node_name);
        set(&mut self.log.format, &args.log_format);
        set(&mut self.throttle.policy, &args.throttle_policy);
        set(&mut self.throttle.period_ms, &args.throttle_period_ms);
        set(&mut self.throttle.state_dir, &args.state_dir);
        set(&mut self.throttle.cgroup_root, &args.cgroup_root);
        set(&mut self.device_plugin.dir, &args.device_plugin_dir);
        set(&mut self.device_plugin.core, &args.device_plugin_core);
        if args.dev_root.is_some() {
            self.dev_root = args.dev_root.clone();
        }
        if args.status_listen.is_some() {
            self.status_listen = args.status_listen.clone();
        }
        set(&mut self.status_socket, &args.status_socket);
        if args.log_file.is_some() {
            self.log.file = args.log_file.clone();
        }
        if args.kubeconfig.is_some() {
            self.kubernetes.kubeconfig = args.kubeconfig.clone();
        }
        set(&mut self.limiter.library, &args.limiter_library);
        if args.sim_driver_dir.is_some() {
            self.limiter.driver_dir = args.sim_driver_dir.clone();
        }
        self.limiter.enabled &= !args.no_limiter;
        self.throttle.enabled &= !args.no_throttle;
        self.device_plugin.enabled |= args.device_plugin;
    }
}

/// `gpushare capacity`: the extended resources the device plugin advertises for this node.
pub fn capacity(args: &NodeArgs) -> anyhow::Result<()> {
    let cfg = NodeConfig::from_args(args)?;
    let backend = Backend::open(&cfg)?;
    for (name, value) in gpushare_core::inventory::capacity(&backend.inventory, &cfg.resources) {
        println!("{name}: \"{value}\"");
    }
    Ok(())
}

/// `gpushare node`: the external NRI plugin until SIGTERM/SIGINT.
pub fn run(args: &NodeArgs) -> anyhow::Result<()> {
    let cfg = NodeConfig::from_args(args)?;
    super::logging::init(&cfg.log)?;
    // First thing, before anything that can fail: an earlier agent (crash-looping, say)
    // may have left cgroups frozen.
    let list = cfg.throttle.state_dir.join("guardian.list");
    let thawed = crate::throttle::guardian::thaw_listed(&list);
    if thawed > 0 {
        tracing::warn!(thawed, list = %list.display(), "thawed cgroups an earlier agent left frozen");
    }
    set_nice(cfg.nice);
    let rt = super::runtime()?;
    rt.block_on(async move {
        let backend = Backend::open(&cfg)?;
        let state = AgentState::init(&cfg, backend.inventory.clone())?;
        tracing::info!(
            node = %state.node_name,
            gpus = state.inventory.len(),
            backend = ?cfg.gpu_backend,
            dev_root = %cfg.dev_root().display(),
            "gpushare node starting"
        );
        let gpus = (state.node_name.clone(), state.inventory.clone());
        let node = Arc::new(Node::new(state));
        if cfg.nri {
            node.require_nri();
        }
        let Backend { source, health, .. } = backend;
        let controller = start_controller(&cfg, &node, source)?;
        if let Some(addr) = cfg.status_listen.clone() {
            let n = node.clone();
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("status_listen {addr}"))?;
            drop(listener);
            tokio::spawn(async move {
                if let Err(e) = crate::status::serve(&addr, n).await {
                    tracing::error!(error = %e, "status endpoint failed");
                }
            });
        }
        if !cfg.status_socket.as_os_str().is_empty() {
            let listener = crate::runtime::api::bind("status", &cfg.status_socket)?;
            tracing::info!(path = %cfg.status_socket.display(), "status socket listening");
            tokio::spawn(crate::status::serve_socket_on(listener, node.clone()));
        }
        // Started last: nothing after it can fail and leave its sockets behind.
        let device_plugin = cfg.device_plugin.enabled.then(|| {
            crate::deviceplugin::Agent::start(
                &cfg.device_plugin,
                crate::deviceplugin::Settings::new(&cfg.device_plugin.dir),
                &cfg.resources,
                &gpus.0,
                &gpus.1,
                Some(crate::deviceplugin::KubeAccess::Config(
                    cfg.kubernetes.kubeconfig.clone(),
                )),
            )
        });
        // GPU health (NVML or the sim file) → the device plugin's devices and the node
        // annotation.
        // While quotas cannot be enforced every GPU is advertised unhealthy.
        let health_task = device_plugin.as_ref().map(|dp| {
            let plugins = dp.plugins_handle();
            let all: Vec<u32> = gpus.1.gpus.iter().map(|g| g.index).collect();
            let node = node.clone();
            let wake = node.advertise_changed.clone();
            tokio::spawn(crate::gpu::health::poll(
                health,
                HEALTH_PERIOD,
                wake,
                move |u| plugins.set_unhealthy(node.advertised_unhealthy(u, &all)),
            ))
        });
        let reg = Registration {
            name: cfg.plugin_name.clone(),
            index: cfg.plugin_index.clone(),
        };
        let socket = cfg.nri_socket.clone();
        let api = cfg.runtime_api.enabled.then(|| cfg.runtime_api.clone());
        let runtime_api = async {
            match api {
                Some(api) => serve_runtime_api(&api, cfg.nri, node.clone()).await,
                None => std::future::pending().await,
            }
        };
        if cfg.nri {
            tokio::spawn(release_unconfirmed(node.clone()));
        }
        let nri = async {
            if cfg.nri {
                plugin::run_external(&socket, reg, node.clone()).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = nri => {}
            r = runtime_api => r?,
            _ = super::shutdown_signal() => tracing::info!("shutting down"),
        }
        if let Some(t) = health_task {
            t.abort();
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

/// The runtime-level modes' local API; without NRI, the registry is first rebuilt from
/// runc's state and the agent is ready once it listens. Returns only on a failure to start.
async fn serve_runtime_api(
    api: &crate::config::RuntimeApiConfig,
    nri: bool,
    node: Arc<Node>,
) -> anyhow::Result<()> {
    use crate::nri::service::Handler;
    use crate::runtime::pending::Pending;
    let listener = crate::runtime::api::bind("runtime_api", &api.socket)?;
    let pending = Arc::new(Pending::new(Duration::from_millis(api.hook_grace_ms)));
    if !nri {
        let (runc, roots) = (api.runc.clone(), api.runc_roots.clone());
        let n = node.clone();
        let read =
            tokio::task::spawn_blocking(move || crate::runtime::resync::resync(&n, &runc, &roots))
                .await??;
        tracing::info!(containers = read, roots = ?api.runc_roots, "registry rebuilt from runc's state");
        node.connected(true);
    }
    if !api.runc_roots.is_empty() {
        tokio::spawn(sweep_unstarted(api.clone(), node.clone(), pending.clone()));
    }
    tracing::info!(socket = %api.socket.display(), "runtime API listening");
    crate::runtime::api::serve(listener, node, pending).await;
    Ok(())
}

/// Every quarter of the grace period (0.25 to 10 s): releases the precreate hook's
/// containers that never reached runc (`runtime::pending`).
async fn sweep_unstarted(
    api: crate::config::RuntimeApiConfig,
    node: Arc<Node>,
    pending: Arc<crate::runtime::pending::Pending>,
) {
    let period = (pending.grace() / 4).clamp(Duration::from_millis(250), Duration::from_secs(10));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if pending.due(std::time::Instant::now()).is_empty() {
            continue;
        }
        let (node, pending, api) = (node.clone(), pending.clone(), api.clone());
        let swept = tokio::task::spawn_blocking(move || {
            crate::runtime::resync::sweep(
                &node,
                &pending,
                &api.runc,
                &api.runc_roots,
                std::time::Instant::now(),
            )
        })
        .await;
        if let Ok(Err(e)) = swept {
            tracing::warn!(error = %e, "cannot look for the precreate hook's containers in runc's state");
        }
    }
}

/// Every second: GPU containers admitted over NRI that the runtime never created are
/// released once `nri_confirm_grace_ms` has passed (`Node::release_unconfirmed`).
async fn release_unconfirmed(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !node.has_unconfirmed() {
            continue;
        }
        let n = node.clone();
        let _ =
            tokio::task::spawn_blocking(move || n.release_unconfirmed(std::time::Instant::now()))
                .await;
    }
}

/// How often GPU health is read.
const HEALTH_PERIOD: Duration = Duration::from_secs(5);

/// Starts the throttling controller for `node` when enabled, sampling from `source`.
fn start_controller(
    cfg: &NodeConfig,
    node: &Arc<Node>,
    source: Box<dyn SampleSource>,
) -> anyhow::Result<Option<Running>> {
    if !cfg.throttle.enabled {
        tracing::warn!("throttling controller disabled: quotas are not enforced");
        return Ok(None);
    }
    let exe = std::env::current_exe().context("cannot find our own executable for the guardian")?;
    let running = crate::throttle::controller::start(
        &cfg.throttle_config(),
        node.registry.clone(),
        source,
        Some(&exe),
    )?;
    node.attach_controller(&running);
    Ok(Some(running))
}

/// The pre-installed plugin: the runtime started us with no arguments, an empty environment
/// and its socket on fd `fd`; the configuration arrives in `Configure`.
/// Sets this thread's niceness (`nice`, 0: unchanged), before any other thread exists: on
/// Linux niceness is per thread and threads inherit it, so every thread of the agent and the
/// guardian it starts get it. A failure (no CAP_SYS_NICE) is logged, not fatal.
fn set_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    if !(-20..=19).contains(&nice) {
        tracing::warn!(nice, "nice is outside -20..19; left unchanged");
        return;
    }
    // SAFETY: setpriority on the calling thread (who = 0) with a checked value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc == 0 {
        tracing::info!(nice, "CPU priority set");
    } else {
        tracing::warn!(nice, error = %std::io::Error::last_os_error(), "cannot set the agent's CPU priority");
    }
}

pub fn run_preinstalled(fd: &str) -> anyhow::Result<()> {
    let fd: i32 = fd
        .parse()
        .with_context(|| format!("NRI_PLUGIN_SOCKET {fd:?} is not a file descriptor number"))?;
    // The runtime's socket must not leak into processes we start (the guardian): they would
    // keep the connection open after we die.
    // SAFETY: fcntl on an fd number only sets a flag.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let name = std::env::var("NRI_PLUGIN_NAME").unwrap_or_else(|_| "gpushare".into());
    let index = std::env::var("NRI_PLUGIN_IDX").unwrap_or_else(|_| "10".into());
    super::logging::init(&Default::default())?;
    // Its config arrives over NRI after its threads exist: the default niceness, always.
    set_nice(NodeConfig::default().nice);
    let rt = super::runtime()?;
    rt.block_on(async move {
        let status_started = std::sync::Mutex::new(false);
        let socket_started = std::sync::Mutex::new(false);
        let node = Arc::new_cyclic(|weak: &std::sync::Weak<Node>| {
            let weak = weak.clone();
            Node::awaiting_config(move |cfg: &NodeConfig, backend: Backend| {
                super::logging::reconfigure(&cfg.log);
                let mut started = status_started.lock().expect("status lock");
                let mut started_socket = socket_started.lock().expect("status lock");
                if !*started && let Some(node) = weak.upgrade() {
                    match start_controller(cfg, &node, backend.source) {
                        // Runs for the life of the process; the guardian covers its end.
                        Ok(running) => std::mem::forget(running),
                        Err(e) => {
                            let reason = format!("the throttling controller cannot start: {e:#}");
                            tracing::error!(%reason, "GPU containers will be refused");
                            node.enforcement_failed(reason);
                        }
                    }
                }
                if let (Some(addr), false, Some(node)) =
                    (cfg.status_listen.clone(), *started, weak.upgrade())
                {
                    *started = true;
                    tokio::spawn(async move {
                        if let Err(e) = crate::status::serve(&addr, node).await {
                            tracing::error!(error = %e, "status endpoint failed");
                        }
                    });
                }
                if !*started_socket
                    && !cfg.status_socket.as_os_str().is_empty()
                    && let Some(node) = weak.upgrade()
                {
                    *started_socket = true;
                    let path = cfg.status_socket.clone();
                    tokio::spawn(async move {
                        if let Err(e) = crate::status::serve_socket(&path, node).await {
                            tracing::error!(error = %e, "status socket failed");
                        }
                    });
                }
            })
        });
        tokio::spawn(release_unconfirmed(node.clone()));
        let reason = plugin::run_preinstalled(fd, Registration { name, index }, node).await?;
        tracing::info!(%reason, "runtime closed the plugin connection; exiting");
        Ok(())
    })
}
