//! The node agent's NRI handler: turns the runtime's events into decisions with the pure
//! modules (`request`, `adjust`) and keeps the container registry.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use std::path::PathBuf;

use crate::config::{ConfigError, Enforcement, GpuBackend, NodeConfig};
use crate::gpu::{Backend, devices, sim};
use crate::nri::api::nri_api::{
    ConfigureRequest, Container, ContainerAdjustment, ContainerState as NriState, Event,
    PodSandbox, SynchronizeRequest,
};
use crate::nri::convert;
use crate::nri::service::{Handler, HandlerError, event_mask};
use crate::registry::{ContainerRecord, ContainerState, Registry};
use crate::runtime::pending::Pending;
use crate::throttle::controller::{ControllerLink, Running, ThrottleStats};
use gpushare_core::adjust::{self, AdjustOptions};
use gpushare_core::inventory::DeviceSet;
use gpushare_core::inventory::{Inventory, SimConfig, sim_inventory};
use gpushare_core::request::{self, ContainerRequest, RequestError, RequestRules};

/// Everything the handler derives from the configuration and the hardware.
#[derive(Debug, Serialize)]
pub struct AgentState {
    pub node_name: String,
    pub inventory: Inventory,
    pub devices: DeviceSet,
    #[serde(skip)]
    pub rules: RequestRules,
    #[serde(skip)]
    pub adjust: AdjustOptions,
    /// Simulated GPUs: where per-container declaration directories live, and how many CPU
    /// cores stand in for GPUs.
    #[serde(skip)]
    pub sim: Option<SimNode>,
    /// The in-container limiter's host files (`[limiter] enabled`).
    #[serde(skip)]
    pub limiter: Option<LimiterHost>,
    /// Quotas are configured (`[throttle] enabled`): GPU containers need the controller.
    #[serde(skip)]
    pub enforce_quotas: bool,
    /// Enforcement backend `mps`: the host directory holding one MPS pipe directory per GPU.
    #[serde(skip)]
    pub mps_pipe_root: Option<String>,
    /// `nri_confirm_grace_ms`: how long an NRI admission may stay unconfirmed by the runtime.
    #[serde(skip)]
    pub confirm_grace: Duration,
    /// `passthrough_namespaces`: their containers granted no GPU are left as created.
    #[serde(skip)]
    pub passthrough_namespaces: BTreeSet<String>,
    /// The cgroup filesystem (`[throttle] cgroup_root`), to kill a container created without
    /// the agent's adjustment where no controller runs (`--no-throttle`); `None` where it
    /// has no freezer hierarchy or cgroup2 mount.
    #[serde(skip)]
    pub cgroups: Option<crate::throttle::cgroup::CgroupFs>,
}

/// Where the in-container limiter's files live on the host.
#[derive(Debug, Clone)]
pub struct LimiterHost {
    /// The shipped library.
    pub library: PathBuf,
    /// One directory per GPU container: `limits.json`, `region`.
    pub dir: PathBuf,
    /// The `/etc/ld.so.preload` every GPU container gets.
    pub preload: PathBuf,
    /// Stand-in driver libraries (simulated GPUs only).
    pub driver_dir: Option<PathBuf>,
}

/// The stand-in driver libraries a simulated node mounts, by the names the toolkit uses.
const SIM_DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];

impl LimiterHost {
    /// Checks the library is installed and writes the preload file.
    fn prepare(cfg: &NodeConfig) -> Result<LimiterHost, NodeError> {
        let library = cfg.limiter.library.clone();
        if !library.is_file() {
            return Err(NodeError::LimiterLibrary { path: library });
        }
        let dir = cfg.throttle.state_dir.join("limiter");
        let preload = dir.join("ld.so.preload");
        std::fs::create_dir_all(&dir)
            .and_then(|_| {
                std::fs::write(
                    &preload,
                    format!("{}\n", gpushare_core::limiter::LIBRARY_PATH),
                )
            })
            .map_err(|source| NodeError::LimiterFiles {
                path: preload.clone(),
                source,
            })?;
        let driver_dir = match (&cfg.limiter.driver_dir, cfg.gpu_backend) {
            (Some(d), GpuBackend::Sim) => Some(d.clone()),
            _ => None,
        };
        Ok(LimiterHost {
            library,
            dir,
            preload,
            driver_dir,
        })
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Writes the container's limits (read-only) and a fresh region (shared by its
    /// processes), and says where they are. Nothing is left behind on failure.
    fn write(&self, id: &str, req: &ContainerRequest) -> Result<adjust::LimiterFiles, DecideError> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = self.container_dir(id);
        let limits = dir.join("limits.json");
        let region = dir.join("region");
        let written = (|| -> Result<(), (PathBuf, std::io::Error)> {
            std::fs::create_dir_all(&dir).map_err(|e| (dir.clone(), e))?;
            std::fs::write(&limits, adjust::limits_file(req).render())
                .and_then(|_| {
                    std::fs::set_permissions(&limits, std::fs::Permissions::from_mode(0o444))
                })
                .map_err(|e| (limits.clone(), e))?;
            std::fs::write(&region, gpushare_core::limiter::region_image())
                .and_then(|_| {
                    // Any user in the container may run CUDA processes; they all count here.
                    std::fs::set_permissions(&region, std::fs::Permissions::from_mode(0o666))
                })
                .map_err(|e| (region.clone(), e))?;
            Ok(())
        })();
        if let Err((path, source)) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DecideError::LimiterFiles { path, source });
        }
        let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
        Ok(adjust::LimiterFiles {
            library: s(&self.library),
            preload: s(&self.preload),
            limits: s(&limits),
            region: s(&region),
        })
    }

    fn remove(&self, id: &str) {
        let _ = std::fs::remove_dir_all(self.container_dir(id));
    }
}

/// Removes the per-container directories under `dir` (its subdirectories; files are left)
/// whose names are not in `keep`; returns how many. For containers removed while no agent
/// was there to see it.
fn sweep_container_dirs(dir: &std::path::Path, keep: &std::collections::HashSet<String>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().to_str().is_some_and(|n| keep.contains(n)))
        .filter(|e| std::fs::remove_dir_all(e.path()).is_ok())
        .count()
}

#[derive(Debug, Clone)]
pub struct SimNode {
    pub dir: std::path::PathBuf,
    pub ncpu: usize,
}

impl SimNode {
    pub fn container_dir(&self, id: &str) -> std::path::PathBuf {
        crate::throttle::source::SimSource::container_dir(&self.dir, id)
    }
}

impl AgentState {
    /// The default simulated node (4 × 15 GiB GPUs) with its device set synthesized in memory
    /// instead of discovered (no device nodes are created): the decision path without IO, for
    /// tests and benchmarks.
    pub fn in_memory(node_name: &str) -> AgentState {
        let node = |path: String, major: u64, minor: u64| gpushare_core::inventory::DeviceNode {
            path,
            major: major as i64,
            minor: minor as i64,
            file_mode: 0o666,
        };
        let gpus = sim_inventory(&SimConfig::default(), node_name);
        let devices = DeviceSet {
            gpus: gpus
                .iter()
                .map(|g| {
                    let path = format!("/dev/nvidia{}", g.minor);
                    (g.minor, node(path, sim::NVIDIA_MAJOR, g.minor as u64))
                })
                .collect(),
            ctl: Some(node(
                "/dev/nvidiactl".into(),
                sim::NVIDIA_MAJOR,
                sim::NVIDIACTL_MINOR,
            )),
            uvm: Some(node("/dev/nvidia-uvm".into(), sim::SIM_UVM_MAJOR, 0)),
            uvm_tools: Some(node("/dev/nvidia-uvm-tools".into(), sim::SIM_UVM_MAJOR, 1)),
        };
        AgentState {
            node_name: node_name.to_string(),
            inventory: Inventory::new(gpus),
            devices,
            rules: RequestRules::default(),
            adjust: AdjustOptions {
                cdi: false,
                memory_unit: gpushare_core::request::MemoryUnit::GiB,
            },
            sim: None,
            limiter: None,
            enforce_quotas: false,
            mps_pipe_root: None,
            confirm_grace: Duration::from_secs(60),
            passthrough_namespaces: BTreeSet::new(),
            cgroups: None,
        }
    }

    /// The node's state for `inventory` (from `gpu::Backend::open`): discovers the device
    /// nodes (for `sim`, creates them first under the agent's own dev root).
    pub fn init(cfg: &NodeConfig, inventory: Inventory) -> Result<AgentState, NodeError> {
        cfg.validate()?;
        let node_name = cfg.node_name();
        let dev_root = cfg.dev_root();
        if cfg.gpu_backend == GpuBackend::Sim {
            let minors: Vec<u32> = inventory.gpus.iter().map(|g| g.minor).collect();
            sim::create_device_nodes(&dev_root, &minors).map_err(|source| {
                NodeError::SimDevices {
                    dev_root: dev_root.clone(),
                    source,
                }
            })?;
        }
        let devices = devices::discover(&dev_root, &cfg.proc_root.join("devices"))?;
        Ok(AgentState {
            node_name,
            inventory,
            devices,
            rules: RequestRules {
                names: cfg.resources.clone(),
                require_grant: cfg.require_grant,
            },
            adjust: AdjustOptions {
                cdi: cfg.cdi,
                memory_unit: cfg.resources.memory_unit,
            },
            sim: (cfg.gpu_backend == GpuBackend::Sim).then(|| SimNode {
                dir: cfg.sim_dir(),
                ncpu: std::thread::available_parallelism().map_or(1, |n| n.get()),
            }),
            limiter: if cfg.limiter.enabled {
                Some(LimiterHost::prepare(cfg)?)
            } else {
                None
            },
            enforce_quotas: cfg.throttle.enabled,
            mps_pipe_root: (cfg.enforcement == Enforcement::Mps)
                .then(|| cfg.mps_pipe_root.to_string_lossy().into_owned()),
            confirm_grace: Duration::from_millis(cfg.nri_confirm_grace_ms),
            passthrough_namespaces: cfg.passthrough_namespaces.iter().cloned().collect(),
            cgroups: crate::throttle::cgroup::CgroupFs::detect(&cfg.throttle.cgroup_root).ok(),
        })
    }
}

/// Why the node's state could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot create simulated device nodes under dev_root {}: {source}", dev_root.display())]
    SimDevices {
        dev_root: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Devices(#[from] devices::DeviceError),
    #[error(
        "limiter.library {} is not installed (install libgpushare_limiter.so there, or set [limiter] enabled = false to opt this node out)",
        path.display()
    )]
    LimiterLibrary { path: PathBuf },
    #[error("cannot write the limiter's files at {}: {source}", path.display())]
    LimiterFiles {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why a GPU container is not admitted: a refusal of what it asks (the runtime answers
/// InvalidArgument, and the message names the field and the value) or a fault of this node
/// (Internal).
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(
        "GPU {index} memory would be over-committed: {held_mib} MiB held by {containers} container(s) + {requested_mib} MiB requested > {total_mib} MiB"
    )]
    MemoryOverCommit {
        index: u32,
        held_mib: u64,
        containers: usize,
        requested_mib: u64,
        total_mib: u64,
    },
    #[error(
        "GPU {index} compute would be over-committed: {held}% held by {containers} container(s) + {requested}% requested > 100%"
    )]
    CoreOverCommit {
        index: u32,
        held: u32,
        containers: usize,
        requested: u32,
    },
    #[error(transparent)]
    Adjust(#[from] adjust::AdjustError),
    #[error("cannot create sim directory {}: {source}", path.display())]
    SimDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the limiter's files at {}: {source}", path.display())]
    LimiterFiles {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Running GPU containers this agent could not account (found at a resync with an
    /// assignment it cannot validate): what they hold is unknown, so nothing new is placed.
    #[error(
        "GPU containers are refused on this node while {count} running GPU container(s) cannot be accounted (container {first}: {reason}); remove or fix them"
    )]
    Unaccounted {
        count: usize,
        first: String,
        reason: String,
    },
    /// Fail closed: quotas are configured but cannot be enforced.
    #[error("GPU containers are refused on this node until its quotas can be enforced: {reason}")]
    EnforcementDown { reason: String },
    /// A variable that gpushare sets or clears appears more than once in the container's
    /// environment: the runtime would adjust the first and keep the later one, which then
    /// overrides the adjustment.
    #[error(
        "the container's environment (image or spec) sets {key} {count} times; gpushare adjusts {key} and refuses a container that repeats it, since a later copy would override the adjustment"
    )]
    RepeatedEnv { key: String, count: usize },
}

/// Why a GPU container was refused, as the label of the agent's
/// `gpushare_create_container_refused_total{reason}` ([`DecideError::reason`] indexes it).
pub const REFUSAL_REASONS: [&str; 7] = [
    "invalid_request",
    "memory_overcommit",
    "core_overcommit",
    "adjustment",
    "node_fault",
    "unaccounted_containers",
    "enforcement_down",
];

impl DecideError {
    /// Index into [`REFUSAL_REASONS`].
    pub fn reason(&self) -> usize {
        match self {
            DecideError::Request(_) | DecideError::RepeatedEnv { .. } => 0,
            DecideError::MemoryOverCommit { .. } => 1,
            DecideError::CoreOverCommit { .. } => 2,
            DecideError::Adjust(_) => 3,
            DecideError::SimDir { .. } | DecideError::LimiterFiles { .. } => 4,
            DecideError::Unaccounted { .. } => 5,
            DecideError::EnforcementDown { .. } => 6,
        }
    }

    /// A refusal of the request (as opposed to a fault of the node).
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            DecideError::SimDir { .. }
                | DecideError::LimiterFiles { .. }
                | DecideError::EnforcementDown { .. }
        )
    }
}

impl From<DecideError> for HandlerError {
    fn from(e: DecideError) -> Self {
        let msg = format!("gpushare: {e}");
        if e.is_refusal() {
            HandlerError::invalid(msg)
        } else {
            HandlerError::internal(msg)
        }
    }
}

/// Counters for the status endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    pub creates_gpu: AtomicU64,
    pub creates_passthrough: AtomicU64,
    /// Containers granted no GPU whose GPU-selecting environment was neutralized.
    pub creates_neutralized: AtomicU64,
    /// Containers granted no GPU in a `passthrough_namespaces` namespace whose GPU-selecting
    /// environment was kept.
    pub creates_exempt: AtomicU64,
    pub creates_refused: AtomicU64,
    /// `creates_refused` by reason ([`REFUSAL_REASONS`], same order).
    pub refused_by: [AtomicU64; REFUSAL_REASONS.len()],
    /// Containers found at a resync without the agent's adjustment, and killed: GPU
    /// containers without their device nodes, containers granted no GPU whose environment
    /// still selects GPUs.
    pub killed_unadjusted: AtomicU64,
    pub syncs: AtomicU64,
    pub connected: AtomicBool,
    /// The registry was rebuilt from the runtime's Synchronize since the last connection.
    pub synced: AtomicBool,
}

/// The running controller as the handler sees it.
struct Attached {
    stats: Arc<ThrottleStats>,
    link: Arc<ControllerLink>,
    alive: Arc<AtomicBool>,
}

/// What a pre-installed plugin does with the runtime's config and the backend it opened.
type OnRuntimeConfig = Box<dyn Fn(&NodeConfig, Backend) + Send + Sync>;

/// The NRI handler of `gpushare node`.
pub struct Node {
    state: RwLock<Option<Arc<AgentState>>>,
    /// Set for a pre-installed plugin: its config arrives in `Configure`.
    config_from_runtime: bool,
    pub registry: Arc<Registry>,
    pub stats: Stats,
    /// Records gathered from a split Synchronize until its last chunk.
    sync_buf: Mutex<Vec<ContainerRecord>>,
    /// Every container id a split Synchronize listed, until its last chunk.
    sync_ids: Mutex<std::collections::HashSet<String>>,
    /// Containers of a split Synchronize that could not be accounted, until its last chunk.
    sync_unaccounted: Mutex<BTreeMap<String, String>>,
    /// Containers found at a resync without their adjustment before they started (containerd
    /// makes a container's task, its cgroup and first process, only at its start): killed at
    /// their StartContainer, by id, with what they lack.
    kill_at_start: Mutex<BTreeMap<String, String>>,
    /// Running GPU containers that could not be accounted (id → why): while any is left,
    /// new GPU containers are refused.
    pub unaccounted: Mutex<BTreeMap<String, String>>,
    /// Called with the runtime's config (pre-installed plugins) and the GPU backend it opened,
    /// once the node's state is set up from it.
    on_runtime_config: OnRuntimeConfig,
    /// The throttling controller, once running.
    throttle: std::sync::OnceLock<Attached>,
    /// Why the quotas cannot be enforced on this node (the controller could not start); GPU
    /// containers are refused with it.
    enforcement_down: RwLock<Option<String>>,
    /// GPU containers admitted over NRI that the runtime has not confirmed yet
    /// ([`Node::release_unconfirmed`]).
    unconfirmed: Pending,
    /// Held from a GPU container's over-commit check to its registration: the runtime-level
    /// modes' local API admits containers concurrently.
    admitting: Mutex<()>,
    /// Set where containers are adjusted over NRI ([`Node::require_nri`]): while the runtime
    /// is not connected and synchronized, it creates containers without the adjustment.
    nri_required: AtomicBool,
    /// Told when what the device plugin advertises may have changed (NRI up or down).
    pub advertise_changed: Arc<tokio::sync::Notify>,
}

impl Node {
    /// A node whose state is known now (external plugin).
    pub fn new(state: AgentState) -> Node {
        Node::with(Some(state), Box::new(|_, _| {}))
    }

    /// A node that takes its configuration from the runtime's `Configure` (pre-installed).
    pub fn awaiting_config(
        on_config: impl Fn(&NodeConfig, Backend) + Send + Sync + 'static,
    ) -> Node {
        Node::with(None, Box::new(on_config))
    }

    /// `state` now, or (`None`) from the runtime's `Configure`, handed to `on_runtime_config`.
    fn with(state: Option<AgentState>, on_runtime_config: OnRuntimeConfig) -> Node {
        Node {
            config_from_runtime: state.is_none(),
            state: RwLock::new(state.map(Arc::new)),
            registry: Arc::new(Registry::new()),
            stats: Stats::default(),
            sync_buf: Mutex::new(vec![]),
            sync_ids: Default::default(),
            sync_unaccounted: Default::default(),
            kill_at_start: Default::default(),
            unaccounted: Default::default(),
            on_runtime_config,
            throttle: Default::default(),
            enforcement_down: RwLock::new(None),
            unconfirmed: Pending::new(Duration::from_secs(60)),
            admitting: Mutex::new(()),
            nri_required: AtomicBool::new(false),
            advertise_changed: Default::default(),
        }
    }

    /// Connects the running throttling controller.
    pub fn attach_controller(&self, running: &Running) {
        self.attach(
            running.stats.clone(),
            running.link.clone(),
            running.alive.clone(),
        );
    }

    /// Connects a controller by its parts: its statistics, its release link and the flag that
    /// says it runs.
    pub fn attach(
        &self,
        stats: Arc<ThrottleStats>,
        link: Arc<ControllerLink>,
        alive: Arc<AtomicBool>,
    ) {
        let _ = self.throttle.set(Attached { stats, link, alive });
    }

    /// The controller could not start: from now on GPU containers are refused with `reason`.
    pub fn enforcement_failed(&self, reason: impl Into<String>) {
        *self.enforcement_down.write().expect("enforcement lock") = Some(reason.into());
    }

    pub fn throttle_stats(&self) -> Option<Arc<ThrottleStats>> {
        self.throttle.get().map(|a| a.stats.clone())
    }

    /// The GPU containers admitted over NRI more than `nri_confirm_grace_ms` before `now`
    /// that the runtime has not confirmed since (no PostCreateContainer, StartContainer,
    /// StopContainer, RemoveContainer or Synchronize naming them) and that have no cgroup:
    /// taken off the books, as if removed. CRI-O sends no NRI event when the OCI runtime's
    /// `create` fails after NRI admitted the container (its undo covers only failures before
    /// the runtime is called), so without this their GPU share stayed committed until the
    /// agent restarted. A container whose cgroup exists is kept (the runtime did create it);
    /// one whose cgroup cannot be looked at (no throttling controller, no cgroups path) is
    /// kept too: a phantom share wastes capacity, a wrong release would over-commit the GPU.
    /// Returns the ids released.
    pub fn release_unconfirmed(&self, now: Instant) -> Vec<String> {
        if self.unconfirmed.is_empty() {
            return Vec::new();
        }
        let Some(state) = self.state() else {
            return Vec::new();
        };
        let mut released = Vec::new();
        for id in self.unconfirmed.due_after(now, state.confirm_grace) {
            self.unconfirmed.settled(&id);
            let Some(rec) = self.registry.get(&id) else {
                continue;
            };
            let created = match (self.throttle.get(), rec.cgroups_path.is_empty()) {
                (Some(a), false) => a.link.cgroup_exists(&rec.cgroups_path).unwrap_or(true),
                _ => true,
            };
            if created {
                tracing::info!(%id, "unconfirmed by the runtime, but its cgroup exists: kept");
                continue;
            }
            tracing::warn!(%id, pod = %format!("{}/{}", rec.pod_namespace, rec.pod_name), grace = ?state.confirm_grace, "admitted over NRI, never created by the runtime (no event, no cgroup): released");
            self.remove_container(&PodSandbox::default(), &crate::runtime::api::by_id(&id));
            released.push(id);
        }
        released
    }

    /// Whether any NRI admission waits for the runtime's confirmation.
    pub fn has_unconfirmed(&self) -> bool {
        !self.unconfirmed.is_empty()
    }

    fn release(&self, id: &str) {
        if let (Some(a), Some(rec)) = (self.throttle.get(), self.registry.get(id)) {
            a.link.release(id, &rec.cgroups_path);
        }
    }

    /// Fail closed: with quotas configured (`[throttle] enabled`), a GPU container is admitted
    /// only while the controller that holds it to them runs.
    fn check_enforcement(&self, state: &AgentState) -> Result<(), DecideError> {
        if !state.enforce_quotas {
            return Ok(());
        }
        if let Some(reason) = self
            .enforcement_down
            .read()
            .expect("enforcement lock")
            .clone()
        {
            return Err(DecideError::EnforcementDown { reason });
        }
        match self.throttle.get() {
            Some(a) if a.alive.load(Ordering::Acquire) => Ok(()),
            Some(_) => Err(DecideError::EnforcementDown {
                reason: "the throttling controller has stopped".into(),
            }),
            None => Err(DecideError::EnforcementDown {
                reason: "the throttling controller has not started".into(),
            }),
        }
    }

    /// Why GPU containers would be refused now for lack of enforcement (`None`: they
    /// would not be, or quotas are not enforced on this node).
    pub fn enforcement_problem(&self) -> Option<String> {
        let state = self.state()?;
        self.check_enforcement(&state).err().map(|e| e.to_string())
    }

    /// Containers are adjusted over NRI here: GPUs are advertised only while the runtime is
    /// connected and synchronized ([`Node::advertised_unhealthy`]).
    pub fn require_nri(&self) {
        self.nri_required.store(true, Ordering::Release);
    }

    /// The GPUs the device plugin should advertise as unhealthy: those `unhealthy` names,
    /// and all of `all` while quotas cannot be enforced, or while the runtime that must
    /// adjust GPU containers over NRI is not connected and synchronized ([`Node::require_nri`])
    /// — so kubelet stops admitting GPU pods here (allocatable drops to 0) instead of them
    /// failing at creation, or worse, running unthrottled (a runtime creates containers
    /// without a plugin that is not connected).
    pub fn advertised_unhealthy(
        &self,
        unhealthy: crate::gpu::health::Unhealthy,
        all: &[u32],
    ) -> crate::gpu::health::Unhealthy {
        let nri_down = (self.nri_required.load(Ordering::Acquire)
            && !self.stats.synced.load(Ordering::Acquire))
        .then(|| {
            "the runtime is not connected over NRI: it would create GPU containers without gpushare's adjustment".to_string()
        });
        match self.enforcement_problem().or(nri_down) {
            None => unhealthy,
            Some(reason) => {
                tracing::warn!(%reason, "advertising every GPU unhealthy while quotas cannot be enforced");
                all.iter().copied().collect()
            }
        }
    }

    pub fn state(&self) -> Option<Arc<AgentState>> {
        self.state.read().expect("state lock").clone()
    }

    fn require_state(&self) -> Result<Arc<AgentState>, HandlerError> {
        self.state()
            .ok_or_else(|| HandlerError::internal("gpushare node is not configured yet"))
    }

    /// Validates one container and builds its adjustment; `None` for non-GPU containers.
    pub fn decide(
        &self,
        state: &AgentState,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<(ContainerRequest, adjust::Adjustment)>, DecideError> {
        let req = request::container_request(
            &pod.annotations,
            &ctr.name,
            &ctr.annotations,
            &state.inventory,
            &state.rules,
        )?;
        let Some(req) = req else { return Ok(None) };
        self.check_enforcement(state)?;
        {
            let unaccounted = self.unaccounted.lock().expect("unaccounted lock");
            if let Some((first, reason)) = unaccounted.iter().find(|(id, _)| **id != ctr.id) {
                return Err(DecideError::Unaccounted {
                    count: unaccounted.len(),
                    first: first.clone(),
                    reason: reason.clone(),
                });
            }
        }
        for g in &req.gpus {
            let gpu = state.inventory.get(g.index).expect("validated index");
            let c = self.registry.committed(g.index, &ctr.id);
            // Checked: a sum that does not fit is over-committed too.
            if c.memory_mib
                .checked_add(g.memory_mib)
                .is_none_or(|total| total > gpu.memory_mib)
            {
                return Err(DecideError::MemoryOverCommit {
                    index: g.index,
                    held_mib: c.memory_mib,
                    containers: c.containers,
                    requested_mib: g.memory_mib,
                    total_mib: gpu.memory_mib,
                });
            }
            if let Some(core) = g.core_percent
                && c.core_percent
                    .checked_add(core)
                    .is_none_or(|total| total > 100)
            {
                return Err(DecideError::CoreOverCommit {
                    index: g.index,
                    held: c.core_percent,
                    containers: c.containers,
                    requested: core,
                });
            }
        }
        let mut adj = adjust::build(&req, &state.devices, &state.adjust)?;
        if let Some(root) = &state.mps_pipe_root {
            adjust::add_mps(&mut adj, &req, root);
        }
        if let Some(sim) = &state.sim {
            let dir = sim.container_dir(&ctr.id);
            std::fs::create_dir_all(&dir).map_err(|source| DecideError::SimDir {
                path: dir.clone(),
                source,
            })?;
            adjust::add_sim(
                &mut adj,
                req.gpus[0].index,
                sim.ncpu,
                &dir.to_string_lossy(),
                crate::throttle::source::SIM_CONTAINER_DIR,
            );
        }
        // Last: the only step that writes files, undone by itself on failure.
        if let Some(limiter) = &state.limiter {
            let files = limiter.write(&ctr.id, &req).inspect_err(|_| {
                if let Some(sim) = &state.sim {
                    let _ = std::fs::remove_dir_all(sim.container_dir(&ctr.id));
                }
            })?;
            adjust::add_limiter(&mut adj, &files);
            if let Some(dir) = &limiter.driver_dir {
                adjust::add_driver_libraries(
                    &mut adj,
                    &dir.to_string_lossy(),
                    &SIM_DRIVER_LIBRARIES,
                );
            }
        }
        Ok(Some((req, adj)))
    }

    fn record(pod: &PodSandbox, ctr: &Container, req: ContainerRequest) -> ContainerRecord {
        let state = match ctr.state.enum_value() {
            Ok(NriState::CONTAINER_CREATED) => ContainerState::Created,
            Ok(NriState::CONTAINER_RUNNING) | Ok(NriState::CONTAINER_PAUSED) => {
                ContainerState::Running
            }
            Ok(NriState::CONTAINER_STOPPED) => ContainerState::Stopped,
            _ => ContainerState::Unknown,
        };
        ContainerRecord {
            id: ctr.id.clone(),
            pod_namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            pod_uid: pod.uid.clone(),
            container_name: ctr.name.clone(),
            cgroups_path: ctr
                .linux
                .as_ref()
                .map(|l| l.cgroups_path.clone())
                .unwrap_or_default(),
            pid: ctr.pid,
            state,
            gpus: req.gpus,
        }
    }
}

impl Node {
    /// A GPU container found at a resync without its adjustment (`missing` says what it
    /// lacks): killed, so that it is created again — through this agent — by whoever restarts
    /// it (kubelet). Killed, it is on the books as stopped (the runtime reports its exit as a
    /// StopContainer soon after) and holds no share; if it cannot be killed (neither a
    /// controller nor a cgroup filesystem here, or the kill fails) it stays on the books as
    /// unaccounted, and new GPU containers are refused until it is gone. One not started yet
    /// is killed at its start.
    fn kill_unadjusted(&self, rec: &mut ContainerRecord, missing: &str) {
        if rec.state == ContainerState::Created {
            self.kill_at_start(&rec.id, missing);
            return;
        }
        let pod = format!("{}/{}", rec.pod_namespace, rec.pod_name);
        let (id, name) = (&rec.id, &rec.container_name);
        match self.kill_unseen(id, &rec.cgroups_path, &pod, name, missing) {
            Ok(()) => rec.state = ContainerState::Stopped,
            Err(why) => {
                self.sync_unaccounted
                    .lock()
                    .expect("sync lock")
                    .insert(id.clone(), why);
            }
        }
    }

    /// A container found at a resync without its adjustment before it started is killed at
    /// its start (it has no process, and on containerd no cgroup, before).
    fn kill_at_start(&self, id: &str, missing: &str) {
        tracing::warn!(%id, %missing, "container created without this agent's adjustment, not started yet: it is killed at its start");
        self.kill_at_start
            .lock()
            .expect("kill lock")
            .insert(id.to_string(), missing.to_string());
    }

    /// The kill [`Node::kill_at_start`] deferred for container `id`, taken off the list (at
    /// its start, stop or removal).
    fn take_kill_at_start(&self, id: &str) -> Option<String> {
        self.kill_at_start.lock().expect("kill lock").remove(id)
    }

    /// Kills container `id` (of `pod`, named `name`), found without the adjustment this agent
    /// gives every container it sees created (`missing` says what it lacks). `Err`: why it
    /// could not be, as the caller puts it on the unaccounted list (new GPU containers are
    /// refused, naming it, until it is gone).
    fn kill_unseen(
        &self,
        id: &str,
        cgroups_path: &str,
        pod: &str,
        name: &str,
        missing: &str,
    ) -> Result<(), String> {
        let outcome = match (
            self.throttle.get(),
            self.state().and_then(|s| s.cgroups.clone()),
        ) {
            (Some(a), _) => a.link.kill(id, cgroups_path),
            (None, Some(fs)) => crate::throttle::controller::kill_container(&fs, cgroups_path),
            (None, None) => Err(
                "no throttling controller runs on this node, and no cgroup filesystem was found"
                    .into(),
            ),
        };
        match outcome {
            Ok(signalled) => {
                self.stats.killed_unadjusted.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%pod, container = %name, %id, %missing, signalled, "container created without this agent's adjustment: killed, to be created again through the agent");
                Ok(())
            }
            Err(why) => {
                tracing::error!(%pod, container = %name, %id, %missing, error = %why, "container created without this agent's adjustment cannot be killed; refusing new GPU containers until it is gone");
                Err(format!(
                    "created without the agent's adjustment ({missing}) and cannot be killed: {why}"
                ))
            }
        }
    }

    /// A container granted no GPU, found at a resync with an environment that selects GPUs
    /// from a runtime that reads it (created while no agent ran, so nothing set
    /// `NVIDIA_VISIBLE_DEVICES=void`): killed, to be created again through the agent (at its
    /// start if it has not started), unless it is stopped, passed through (as at its
    /// creation: [`Node::passes_through`]), or the agent's own container.
    fn kill_unneutralized(&self, pod: &PodSandbox, ctr: &Container) {
        let state = ctr.state.enum_value();
        if matches!(state, Ok(NriState::CONTAINER_STOPPED))
            || adjust::neutralized(&ctr.env)
            || self.passes_through(pod, ctr)
            || own_container(ctr)
        {
            return;
        }
        let visible = ctr
            .env
            .iter()
            .find_map(|kv| kv.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .map_or("unset".to_string(), |v| format!("{v:?}"));
        let missing = format!("granted no GPU, its NVIDIA_VISIBLE_DEVICES {visible} and not void");
        if matches!(state, Ok(NriState::CONTAINER_CREATED)) {
            self.kill_at_start(&ctr.id, &missing);
            return;
        }
        let cgroups_path = ctr.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        let pod = format!("{}/{}", pod.namespace, pod.name);
        if let Err(why) = self.kill_unseen(&ctr.id, cgroups_path, &pod, &ctr.name, &missing) {
            self.sync_unaccounted
                .lock()
                .expect("sync lock")
                .insert(ctr.id.clone(), why);
        }
    }

    /// Whether container `ctr` of `pod` is left as created: granted no GPU, in a
    /// `passthrough_namespaces` namespace.
    fn passes_through(&self, pod: &PodSandbox, ctr: &Container) -> bool {
        !has_gpu_hint(pod, ctr)
            && self
                .state()
                .is_some_and(|s| s.passthrough_namespaces.contains(&pod.namespace))
    }

    /// The decision on a container being created, as plain data (`None`: leave it as it
    /// is): what NRI's CreateContainer answers with, and the runtime-level modes
    /// (`gpushare runtime`, `gpushare hook`) through the local API — one decision, one
    /// registry, the same messages.
    pub fn admit(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<adjust::Adjustment>, HandlerError> {
        if !has_gpu_hint(pod, ctr) {
            return Ok(self.no_gpu(pod, ctr));
        }
        let span = tracing::info_span!("create", pod = %format!("{}/{}", pod.namespace, pod.name), container = %ctr.name, id = %ctr.id);
        let _g = span.enter();
        let started = Instant::now();
        let state = self.require_state()?;
        let admitting = self.admitting.lock().unwrap_or_else(|e| e.into_inner());
        match self.decide(&state, pod, ctr) {
            Ok(None) => Ok(self.no_gpu(pod, ctr)),
            Ok(Some((req, mut adj))) => {
                adjust::strip_foreign_selectors(&mut adj, &ctr.env);
                let gpus: Vec<u32> = req.gpus.iter().map(|g| g.index).collect();
                self.registry.upsert(Node::record(pod, ctr, req));
                drop(admitting);
                self.stats.creates_gpu.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    ?gpus,
                    micros = started.elapsed().as_micros() as u64,
                    "GPU container admitted"
                );
                Ok(Some(adj))
            }
            Err(e) => {
                self.count_refusal(&e);
                tracing::warn!(error = %e, refusal = e.is_refusal(), "GPU container refused");
                Err(e.into())
            }
        }
    }

    /// Counts a refused creation, in all and under its reason.
    fn count_refusal(&self, e: &DecideError) {
        self.stats.creates_refused.fetch_add(1, Ordering::Relaxed);
        self.stats.refused_by[e.reason()].fetch_add(1, Ordering::Relaxed);
    }

    /// A container granted no GPU: passed through unchanged, unless its environment would
    /// make a runtime that reads it (nvidia-container-runtime) give it GPUs and it is not in
    /// a `passthrough_namespaces` namespace.
    fn no_gpu(&self, pod: &PodSandbox, ctr: &Container) -> Option<adjust::Adjustment> {
        match adjust::neutralize_non_gpu(&ctr.env) {
            Some(_) if self.passes_through(pod, ctr) => {
                self.stats.creates_exempt.fetch_add(1, Ordering::Relaxed);
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %ctr.name, id = %ctr.id, "no GPU granted, in a passthrough namespace: its NVIDIA_* environment is kept");
                None
            }
            None => {
                self.stats
                    .creates_passthrough
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
            Some(adj) => {
                self.stats
                    .creates_neutralized
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(container = %ctr.name, id = %ctr.id, cleared = ?adj.clear_env, "no GPU granted: NVIDIA_VISIBLE_DEVICES=void");
                Some(adj)
            }
        }
    }
}

/// What a GPU container lacks of the adjustment this agent gives every GPU container it
/// admits (`None`: it has it): the device node of each GPU it was assigned. A pod cannot
/// add device nodes itself, so a GPU container without them was created while no agent was
/// there to adjust it — the runtime skips a plugin that is gone, even in the middle of a
/// creation — and runs without its limiter (and, on a runtime that reads
/// `NVIDIA_VISIBLE_DEVICES` from the image, maybe with every GPU).
fn missing_adjustment(
    state: &AgentState,
    ctr: &Container,
    rec: &ContainerRecord,
) -> Option<String> {
    let has: std::collections::HashSet<&str> = ctr
        .linux
        .as_ref()
        .map(|l| l.devices.iter().map(|d| d.path.as_str()).collect())
        .unwrap_or_default();
    let missing: Vec<&str> = rec
        .gpus
        .iter()
        .filter_map(|g| state.devices.gpus.get(&g.minor))
        .map(|node| node.path.as_str())
        .filter(|path| !has.contains(path))
        .collect();
    (!missing.is_empty()).then(|| format!("no device node {}", missing.join(", ")))
}

/// Whether `ctr` is the container this agent runs in, or another of its pod's (the chart's
/// agent asks the NVIDIA runtime for every GPU, for NVML, and is created while no agent runs).
/// Found by any of:
/// - its cgroup is the agent's (`/proc/self/cgroup` names the container id);
/// - its pod sandbox is the agent's: the runtime bind-mounts `/etc/hostname` from the
///   sandbox's directory, named by its id (`/proc/self/mountinfo`);
/// - where a cgroup namespace shows the agent only `/`: its first process shares the agent's
///   mount namespace (every container has one of its own).
fn own_container(ctr: &Container) -> bool {
    static OWN: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (cgroups, mounts) = OWN.get_or_init(|| {
        let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
        (read("/proc/self/cgroup"), read("/proc/self/mountinfo"))
    });
    in_cgroup_of(&ctr.id, cgroups)
        || hostname_from_sandbox(&ctr.pod_sandbox_id, mounts)
        || (cgroup_namespaced(cgroups) && shares_mount_namespace(ctr.pid))
}

/// Whether `/proc/PID/mountinfo` text `mounts` has `/etc/hostname` bind-mounted from a file
/// of pod sandbox `sandbox` (containerd: `…/sandboxes/<id>/hostname`; CRI-O:
/// `…/overlay-containers/<id>/userdata/hostname`).
fn hostname_from_sandbox(sandbox: &str, mounts: &str) -> bool {
    !sandbox.is_empty()
        && mounts.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 4 && f[4] == "/etc/hostname" && f[3].split('/').any(|c| c == sandbox)
        })
}

/// Whether process `pid` (in the agent's PID namespace: the host's, in the chart) is in the
/// agent's mount namespace. `false` when either cannot be read (another container's process
/// without CAP_SYS_PTRACE, say).
fn shares_mount_namespace(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    pid > 0 && ns(&pid.to_string()).is_some_and(|theirs| ns("self") == Some(theirs))
}

/// The cgroup paths of `/proc/PID/cgroup` text `cgroups` (`ID:CONTROLLERS:PATH` lines).
fn cgroup_paths(cgroups: &str) -> impl Iterator<Item = &str> {
    cgroups.lines().filter_map(|l| l.splitn(3, ':').nth(2))
}

/// Whether `/proc/PID/cgroup` text `cgroups` shows only cgroup roots (a cgroup namespace).
fn cgroup_namespaced(cgroups: &str) -> bool {
    cgroup_paths(cgroups).all(|path| path == "/")
}

/// Whether `/proc/PID/cgroup` text `cgroups` places the process in container `id`'s cgroup:
/// a path component is the id (cgroupfs driver: `…/pod<uid>/<id>`) or has it between `-`,
/// `.` or `:` (systemd driver: `…/cri-containerd-<id>.scope`, `crio-<id>.scope`).
fn in_cgroup_of(id: &str, cgroups: &str) -> bool {
    !id.is_empty()
        && cgroup_paths(cgroups)
            .flat_map(|path| path.split('/'))
            .any(|c| c.split(['-', '.', ':']).any(|t| t == id))
}

fn has_gpu_hint(pod: &PodSandbox, ctr: &Container) -> bool {
    pod.annotations.contains_key(request::ASSIGNMENT_ANNOTATION)
        || ctr
            .annotations
            .keys()
            .any(|k| k.starts_with("gpushare.io/granted-"))
}

impl Handler for Node {
    fn configure(&self, req: &ConfigureRequest) -> Result<i32, HandlerError> {
        tracing::info!(
            runtime = %req.runtime_name,
            version = %req.runtime_version,
            nri = %req.NRI_version,
            "configure"
        );
        // A new session: forget a split Synchronize that an earlier connection left unfinished.
        self.sync_buf.lock().expect("sync lock").clear();
        self.sync_unaccounted.lock().expect("sync lock").clear();
        if self.config_from_runtime {
            let cfg = NodeConfig::from_toml(&req.config, "from the runtime's plugin config")
                .map_err(|e| HandlerError::invalid(e.to_string()))?;
            let backend = Backend::open(&cfg)
                .map_err(|e| HandlerError::invalid(format!("gpu_backend: {e}")))?;
            let state = AgentState::init(&cfg, backend.inventory.clone())
                .map_err(|e| HandlerError::invalid(e.to_string()))?;
            (self.on_runtime_config)(&cfg, backend);
            tracing::info!(gpus = state.inventory.len(), "configured from the runtime");
            *self.state.write().expect("state lock") = Some(Arc::new(state));
        }
        Ok(event_mask(&[
            Event::CREATE_CONTAINER,
            Event::POST_CREATE_CONTAINER,
            Event::START_CONTAINER,
            Event::UPDATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::REMOVE_CONTAINER,
        ]))
    }

    fn synchronize(&self, req: &SynchronizeRequest) -> Result<(), HandlerError> {
        let state = self.require_state()?;
        let pods: HashMap<&str, &PodSandbox> =
            req.pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let mut buf = self.sync_buf.lock().expect("sync lock");
        self.sync_ids
            .lock()
            .expect("sync lock")
            .extend(req.containers.iter().map(|c| c.id.clone()));
        for ctr in &req.containers {
            let Some(pod) = pods.get(ctr.pod_sandbox_id.as_str()) else {
                tracing::warn!(container = %ctr.id, pod = %ctr.pod_sandbox_id, "synchronized container without its pod");
                continue;
            };
            match request::container_request(
                &pod.annotations,
                &ctr.name,
                &ctr.annotations,
                &state.inventory,
                &state.rules,
            ) {
                Ok(Some(req)) => {
                    let mut rec = Node::record(pod, ctr, req);
                    if rec.state != ContainerState::Stopped
                        && let Some(missing) = missing_adjustment(&state, ctr, &rec)
                    {
                        self.kill_unadjusted(&mut rec, &missing);
                    }
                    buf.push(rec)
                }
                Ok(None) => self.kill_unneutralized(pod, ctr),
                // Created before a config change, say; it keeps running and holds GPU
                // memory and time we cannot account: it stays on the books as
                // unaccounted, and nothing new is placed until it is gone.
                Err(e) => {
                    tracing::error!(container = %ctr.id, error = %e, "cannot account a running GPU container; refusing new GPU containers until it is gone");
                    self.sync_unaccounted
                        .lock()
                        .expect("sync lock")
                        .insert(ctr.id.clone(), e.to_string());
                }
            }
        }
        if !req.more {
            *self.unaccounted.lock().expect("unaccounted lock") =
                std::mem::take(&mut *self.sync_unaccounted.lock().expect("sync lock"));
            let records = std::mem::take(&mut *buf);
            tracing::info!(
                containers = records.len(),
                "registry rebuilt from runtime state"
            );
            // The directories of containers gone while no agent saw them (removed while it
            // was away or disconnected): neither the runtime nor the registry knows them.
            {
                let _admitting = self.admitting.lock().unwrap_or_else(|e| e.into_inner());
                let mut keep = std::mem::take(&mut *self.sync_ids.lock().expect("sync lock"));
                keep.extend(self.registry.snapshot().into_iter().map(|r| r.id));
                let dirs = [
                    state.limiter.as_ref().map(|l| l.dir.clone()),
                    state.sim.as_ref().map(|s| s.dir.clone()),
                ];
                for dir in dirs.into_iter().flatten() {
                    let swept = sweep_container_dirs(&dir, &keep);
                    if swept > 0 {
                        tracing::info!(dir = %dir.display(), swept, "removed the directories of containers gone while the agent was away");
                    }
                }
            }
            self.registry.replace_all(records);
            // The runtime's own list: what it did not create is gone from the books now.
            self.unconfirmed.clear();
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
            self.stats.synced.store(true, Ordering::Release);
            self.advertise_changed.notify_one();
        }
        Ok(())
    }

    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<ContainerAdjustment>, HandlerError> {
        // NRI adjusts the first copy of a variable only (`AdjustEnv`), and a later copy in the
        // spec then overrides it: a container repeating one that gpushare sets or clears is
        // refused. (The runtime-level modes write the spec themselves, every copy included.)
        if let Some((key, count)) = adjust::repeated_gpu_env(&ctr.env)
            && !self.passes_through(pod, ctr)
        {
            let e = DecideError::RepeatedEnv {
                key: key.to_string(),
                count,
            };
            self.count_refusal(&e);
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %ctr.name, id = %ctr.id, error = %e, "container refused");
            return Err(e.into());
        }
        let adj = self.admit(pod, ctr)?;
        if adj.is_some() && self.registry.get(&ctr.id).is_some() {
            self.unconfirmed.admitted(&ctr.id, Instant::now());
        }
        Ok(adj.map(|adj| convert::adjustment(&adj)))
    }

    fn post_create_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.unconfirmed.settled(&ctr.id);
    }

    fn start_container(&self, pod: &PodSandbox, ctr: &Container) {
        self.unconfirmed.settled(&ctr.id);
        if let Some(missing) = self.take_kill_at_start(&ctr.id) {
            let cgroups_path = ctr.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
            let who = format!("{}/{}", pod.namespace, pod.name);
            match self.kill_unseen(&ctr.id, cgroups_path, &who, &ctr.name, &missing) {
                Ok(()) => {
                    self.registry.set_state(&ctr.id, ContainerState::Stopped);
                    return;
                }
                Err(why) => {
                    self.unaccounted
                        .lock()
                        .expect("unaccounted lock")
                        .insert(ctr.id.clone(), why);
                }
            }
        }
        self.registry.set_state(&ctr.id, ContainerState::Running);
        // Between `runc create` and `runc start`: the controller takes it on now.
        if let Some(a) = self.throttle.get()
            && self.registry.get(&ctr.id).is_some()
        {
            a.link.starting();
        }
    }

    fn update_container(&self, _pod: &PodSandbox, _ctr: &Container) -> Result<(), HandlerError> {
        Ok(())
    }

    fn stop_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.unconfirmed.settled(&ctr.id);
        self.take_kill_at_start(&ctr.id);
        self.registry.set_state(&ctr.id, ContainerState::Stopped);
        self.release(&ctr.id);
        self.unaccounted
            .lock()
            .expect("unaccounted lock")
            .remove(&ctr.id);
    }

    fn remove_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.unconfirmed.settled(&ctr.id);
        self.take_kill_at_start(&ctr.id);
        self.release(&ctr.id);
        self.unaccounted
            .lock()
            .expect("unaccounted lock")
            .remove(&ctr.id);
        if let Some(limiter) = self.state().and_then(|s| s.limiter.clone()) {
            limiter.remove(&ctr.id);
        }
        if let Some(sim) = self.state().and_then(|s| s.sim.clone()) {
            let _ = std::fs::remove_dir_all(sim.container_dir(&ctr.id));
        }
        if self.registry.remove(&ctr.id).is_some() {
            tracing::info!(id = %ctr.id, "GPU container removed");
        }
    }

    fn connected(&self, up: bool) {
        // A new connection starts with a Synchronize (which may even finish before the
        // registration call returns); from a disconnect until then the registry may be stale,
        // and the agent is not ready.
        if !up {
            self.stats.synced.store(false, Ordering::Release);
            self.advertise_changed.notify_one();
        }
        self.stats.connected.store(up, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::request::ASSIGNMENT_ANNOTATION;
    use gpushare_core::request::limits::{GRANTED_CORE_ANNOTATION, GRANTED_MEM_ANNOTATION};

    /// The agent's own container is found in its `/proc/self/cgroup` under both cgroup
    /// drivers and both cgroup versions; another container's id, or a part of one, is not.
    #[test]
    fn the_agents_own_container_is_found_in_its_cgroup() {
        let id = "4f2d0c7e9a1b";
        let cgroupfs = format!(
            "12:freezer:/kubepods/besteffort/pod0b9e-11/{id}\n11:cpuacct,cpu:/kubepods/besteffort/pod0b9e-11/{id}\n"
        );
        let systemd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b9e_11.slice/cri-containerd-{id}.scope\n"
        );
        let crio = format!("0::/kubepods.slice/crio-{id}.scope\n");
        for text in [&cgroupfs, &systemd, &crio] {
            assert!(in_cgroup_of(id, text), "{text}");
            assert!(!in_cgroup_of("4f2d0c7e", text), "a prefix: {text}");
            assert!(!in_cgroup_of("9d81aa03", text), "{text}");
            assert!(!in_cgroup_of("", text), "{text}");
        }
        assert!(!in_cgroup_of(id, "0::/system.slice/gpushare.service\n"));
    }

    /// The agent's own pod is the one whose sandbox directory its `/etc/hostname` comes from;
    /// the shm mounts of every sandbox, which a host's mount table lists, do not count. A
    /// cgroup namespace shows only roots.
    #[test]
    fn the_agents_own_pod_is_found_in_its_mounts() {
        let sb = "9a1f33c2e0b4";
        let containerd = format!(
            "1200 1100 254:1 /var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{sb}/hostname /etc/hostname rw,relatime - ext4 /dev/vda1 rw\n"
        );
        let crio = format!(
            "88 70 0:25 /containers/storage/overlay-containers/{sb}/userdata/hostname /etc/hostname rw,nosuid - tmpfs tmpfs rw\n"
        );
        let host = format!(
            "310 25 0:61 / /run/containerd/io.containerd.grpc.v1.cri/sandboxes/{sb}/shm rw - tmpfs shm rw\n"
        );
        assert!(hostname_from_sandbox(sb, &containerd));
        assert!(hostname_from_sandbox(sb, &crio));
        assert!(!hostname_from_sandbox(sb, &host), "a host's shm mount");
        assert!(!hostname_from_sandbox("77aa", &containerd));
        assert!(!hostname_from_sandbox("", &containerd));
        assert!(cgroup_namespaced("0::/\n"));
        assert!(cgroup_namespaced("12:freezer:/\n11:cpu,cpuacct:/\n0::/\n"));
        assert!(!cgroup_namespaced("0::/system.slice/gpushare.service\n"));
    }

    /// Where the agent's cgroup names no container (a cgroup namespace: `0::/`), its own
    /// container is the one whose process shares its mount namespace; a process in another
    /// mount namespace (as every other container's is) is not.
    #[test]
    fn the_agents_own_container_shares_its_mount_namespace() {
        let mut here = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(shares_mount_namespace(here.id()));
        assert!(!shares_mount_namespace(0));
        assert!(!shares_mount_namespace(u32::MAX));
        here.kill().unwrap();
        here.wait().unwrap();
        match std::process::Command::new("unshare")
            .args(["--mount", "sleep", "30"])
            .spawn()
        {
            Ok(mut other) => {
                // unshare execs sleep once it has its own mount namespace.
                let pid = other.id();
                let deadline = Instant::now() + Duration::from_secs(5);
                while std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|e| !e.to_string_lossy().contains("sleep"))
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let status = other.try_wait().unwrap();
                if status.is_none() {
                    assert!(!shares_mount_namespace(pid), "a mount namespace of its own");
                    other.kill().unwrap();
                }
                other.wait().unwrap();
                if status.is_some() && std::env::var_os("CI").is_some() {
                    panic!("unshare --mount failed in CI (needs root): {status:?}");
                } else if status.is_some() {
                    eprintln!(
                        "skipped the other-namespace half: unshare --mount failed (not root?)"
                    );
                }
            }
            Err(e) if std::env::var_os("CI").is_some() => panic!("cannot run unshare: {e}"),
            Err(e) => eprintln!("skipped the other-namespace half: cannot run unshare: {e}"),
        }
    }

    /// A pod with an init container `prep` (10 GiB, 60 %) and an app container `main`
    /// (8 GiB, 50 %) on GPU 0 of 15 GiB: the scheduler placed it for the larger, since the
    /// two never run together.
    fn staged_pod() -> PodSandbox {
        let assignment = r#"{"version":1,"containers":{"prep":[{"gpuIndex":0,"memoryMiB":10240,"corePercent":60}],"main":[{"gpuIndex":0,"memoryMiB":8192,"corePercent":50}]}}"#;
        PodSandbox {
            id: "sb".into(),
            name: "staged".into(),
            uid: "uid-staged".into(),
            namespace: "default".into(),
            annotations: [(ASSIGNMENT_ANNOTATION.to_string(), assignment.to_string())].into(),
            ..Default::default()
        }
    }

    /// A container as containerd presents it, with kubelet's grant.
    fn ctr(id: &str, name: &str, mem: &str, core: &str, state: NriState) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: "sb".into(),
            name: name.into(),
            annotations: [
                (GRANTED_MEM_ANNOTATION.to_string(), mem.to_string()),
                (GRANTED_CORE_ANNOTATION.to_string(), core.to_string()),
            ]
            .into(),
            state: state.into(),
            ..Default::default()
        }
    }

    /// NRI adjusts the first entry of a variable only (`AdjustEnv`) and a later copy
    /// overrides it: a container repeating a variable gpushare sets or clears is refused at
    /// NRI's CreateContainer, with or without a GPU, and nothing is registered.
    #[test]
    fn a_repeated_gpu_variable_is_refused() {
        let node = Node::new(AgentState::in_memory("n"));
        let pod = staged_pod();
        let mut plain = ctr("c-plain", "plain", "", "", NriState::CONTAINER_CREATED);
        plain.annotations.clear();
        plain.env = vec![
            "NVIDIA_VISIBLE_DEVICES=all".into(),
            "PATH=/bin".into(),
            "NVIDIA_VISIBLE_DEVICES=all".into(),
        ];
        let e = format!("{:?}", node.create_container(&pod, &plain).unwrap_err());
        assert!(e.contains("sets NVIDIA_VISIBLE_DEVICES 2 times"), "{e}");
        // Once, it is neutralized as before.
        plain.env.pop();
        let adj = node
            .create_container(&pod, &plain)
            .unwrap()
            .expect("adjusted");
        assert!(format!("{adj:?}").contains("void"), "{adj:?}");

        let mut main = ctr("c-main", "main", "8", "50", NriState::CONTAINER_CREATED);
        main.env = vec!["GPUSHARE_GPU_UUID=a".into(), "GPUSHARE_GPU_UUID=b".into()];
        let e = format!("{:?}", node.create_container(&pod, &main).unwrap_err());
        assert!(e.contains("sets GPUSHARE_GPU_UUID 2 times"), "{e}");
        assert!(node.registry.snapshot().is_empty());
        assert_eq!(node.stats.refused_by[0].load(Ordering::Relaxed), 2);
    }

    /// Where GPU containers are adjusted over NRI, every GPU is advertised unhealthy until
    /// the runtime has connected and synchronized, and again once it disconnects.
    #[test]
    fn gpus_are_advertised_only_while_nri_is_up() {
        let node = Node::new(AgentState::in_memory("n"));
        let all = [0, 1, 2, 3];
        let sick = crate::gpu::health::Unhealthy::from([2]);
        assert_eq!(
            node.advertised_unhealthy(sick.clone(), &all),
            sick,
            "NRI not required"
        );
        node.require_nri();
        assert_eq!(node.advertised_unhealthy(sick.clone(), &all).len(), 4);
        node.synchronize(&SynchronizeRequest::default()).unwrap();
        assert_eq!(node.advertised_unhealthy(sick.clone(), &all), sick);
        node.connected(false);
        assert_eq!(node.advertised_unhealthy(sick.clone(), &all).len(), 4);
        node.connected(true);
        assert_eq!(
            node.advertised_unhealthy(sick.clone(), &all).len(),
            4,
            "connected, not yet synchronized"
        );
        node.synchronize(&SynchronizeRequest::default()).unwrap();
        assert_eq!(node.advertised_unhealthy(sick.clone(), &all), sick);
    }

    /// A Synchronize removes the limiter and sim directories of containers that neither the
    /// runtime nor the registry knows (removed while the agent was away), and nothing else.
    #[test]
    fn a_synchronize_sweeps_the_directories_of_containers_gone_meanwhile() {
        let root = tempfile::tempdir().unwrap();
        let mut state = AgentState::in_memory("n");
        let (lim, sim) = (root.path().join("limiter"), root.path().join("sim"));
        state.limiter = Some(LimiterHost {
            library: root.path().join("lib.so"),
            dir: lim.clone(),
            preload: lim.join("ld.so.preload"),
            driver_dir: None,
        });
        state.sim = Some(SimNode {
            dir: sim.clone(),
            ncpu: 1,
        });
        for d in [&lim, &sim] {
            for id in ["c-main", "gone", "known"] {
                std::fs::create_dir_all(d.join(id)).unwrap();
            }
            std::fs::write(d.join("ld.so.preload"), "x").unwrap();
        }
        let node = Node::new(state);
        let pod = staged_pod();
        let mut known = ctr("known", "main", "8", "50", NriState::CONTAINER_RUNNING);
        known.pod_sandbox_id = "elsewhere".into();
        node.registry.upsert(Node::record(
            &pod,
            &known,
            request::container_request(
                &pod.annotations,
                "main",
                &known.annotations,
                &node.state().unwrap().inventory,
                &node.state().unwrap().rules,
            )
            .unwrap()
            .unwrap(),
        ));
        node.synchronize(&SynchronizeRequest {
            pods: vec![pod.clone()],
            containers: vec![ctr(
                "c-main",
                "main",
                "8",
                "50",
                NriState::CONTAINER_RUNNING,
            )],
            more: false,
            ..Default::default()
        })
        .unwrap();
        for d in [&lim, &sim] {
            assert!(d.join("c-main").is_dir(), "listed by the runtime");
            assert!(d.join("known").is_dir(), "in the registry");
            assert!(!d.join("gone").exists(), "gone: swept");
            assert!(d.join("ld.so.preload").is_file(), "files are left");
        }
    }

    /// The runtime-level modes admit containers concurrently (the local API): the
    /// over-commit check and the registration are one step, so GPU 0 (15 GiB) takes one of
    /// eight 8 GiB containers asking at once, never two.
    #[test]
    fn concurrent_admissions_never_over_commit() {
        for _round in 0..20 {
            let node = Arc::new(Node::new(AgentState::in_memory("n")));
            let barrier = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let (node, barrier) = (node.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let assignment = r#"{"version":1,"containers":{"main":[{"gpuIndex":0,"memoryMiB":8192,"corePercent":10}]}}"#;
                        let pod = PodSandbox {
                            id: format!("sb{i}"),
                            name: format!("p{i}"),
                            uid: format!("uid-{i}"),
                            namespace: "default".into(),
                            annotations: [(
                                ASSIGNMENT_ANNOTATION.to_string(),
                                assignment.to_string(),
                            )]
                            .into(),
                            ..Default::default()
                        };
                        let mut c = ctr(&format!("c{i}"), "main", "8", "10", NriState::CONTAINER_CREATED);
                        c.pod_sandbox_id = pod.id.clone();
                        barrier.wait();
                        node.admit(&pod, &c).is_ok()
                    })
                })
                .collect();
            let admitted = threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|&ok| ok)
                .count();
            assert_eq!(admitted, 1);
            assert_eq!(node.registry.committed(0, "").memory_mib, 8192);
        }
    }

    /// containerd sends NRI StopContainer when a task exits by itself (its CRI exit handler,
    /// `WithContainerExit`): a finished init container is then stopped in the registry and
    /// its share no longer counts, so the app container after it is admitted. While the
    /// init container runs, the same app container would over-commit the GPU.
    #[test]
    fn a_finished_init_container_does_not_hold_its_share() {
        let node = Node::new(AgentState::in_memory("n"));
        let pod = staged_pod();
        let prep = ctr("c-prep", "prep", "10", "60", NriState::CONTAINER_CREATED);
        let main = ctr("c-main", "main", "8", "50", NriState::CONTAINER_CREATED);
        assert!(node.create_container(&pod, &prep).unwrap().is_some());
        node.start_container(&pod, &prep);
        let e = node.create_container(&pod, &main).unwrap_err();
        assert!(format!("{e:?}").contains("over-committed"), "{e:?}");
        // Counted once, under the reason the message gives.
        let by: Vec<u64> = node
            .stats
            .refused_by
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        let want = if format!("{e:?}").contains("memory") {
            1
        } else {
            2
        };
        assert_eq!(by.iter().sum::<u64>(), 1, "{by:?}");
        assert_eq!(by[want], 1, "{REFUSAL_REASONS:?} {by:?}");
        node.stop_container(&pod, &prep);
        assert_eq!(node.registry.committed(0, "").memory_mib, 0);
        assert!(node.create_container(&pod, &main).unwrap().is_some());
        let c = node.registry.committed(0, "");
        assert_eq!((c.memory_mib, c.core_percent), (8192, 50));

        // After a reconnection: Synchronize lists the exited init container as stopped.
        let node = Node::new(AgentState::in_memory("n"));
        node.synchronize(&SynchronizeRequest {
            pods: vec![pod.clone()],
            containers: vec![ctr(
                "c-prep",
                "prep",
                "10",
                "60",
                NriState::CONTAINER_STOPPED,
            )],
            more: false,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(node.registry.snapshot().len(), 1);
        assert!(node.create_container(&pod, &main).unwrap().is_some());
    }

    /// CRI-O sends no NRI event when the OCI runtime's `create` fails after NRI admitted the
    /// container: once the grace has passed, an unconfirmed GPU container without a cgroup is
    /// released; one the runtime confirmed, or whose cgroup exists, stays.
    #[test]
    fn an_admission_the_runtime_never_created_is_released() {
        use crate::nri::api::nri_api::LinuxContainer;
        use crate::throttle::cgroup::{CgroupFs, CgroupVersion};
        let mut state = AgentState::in_memory("n");
        state.confirm_grace = Duration::from_secs(5);
        let node = Node::new(state);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("freezer/k8s/kept")).unwrap();
        let fs = CgroupFs::new(root.path(), CgroupVersion::V1);
        node.attach(
            Arc::new(ThrottleStats::default()),
            Arc::new(ControllerLink::new(fs)),
            Arc::new(AtomicBool::new(true)),
        );
        let assignment = r#"{"version":1,"containers":{"failed":[{"gpuIndex":0,"memoryMiB":2048,"corePercent":10}],"kept":[{"gpuIndex":0,"memoryMiB":2048,"corePercent":10}],"confirmed":[{"gpuIndex":0,"memoryMiB":2048,"corePercent":10}]}}"#;
        let pod = PodSandbox {
            annotations: [(ASSIGNMENT_ANNOTATION.to_string(), assignment.to_string())].into(),
            ..staged_pod()
        };
        let with_cgroup = |id: &str| {
            let mut c = ctr(id, id, "2", "10", NriState::CONTAINER_CREATED);
            c.linux = Some(LinuxContainer {
                cgroups_path: format!("/k8s/{id}"),
                ..Default::default()
            })
            .into();
            c
        };
        let t0 = Instant::now();
        for id in ["failed", "kept", "confirmed"] {
            assert!(
                node.create_container(&pod, &with_cgroup(id))
                    .unwrap()
                    .is_some()
            );
        }
        node.post_create_container(&pod, &with_cgroup("confirmed"));
        assert!(node.release_unconfirmed(t0).is_empty(), "within the grace");
        let later = Instant::now() + Duration::from_secs(5);
        assert_eq!(node.release_unconfirmed(later), vec!["failed".to_string()]);
        let mut ids: Vec<String> = node.registry.snapshot().into_iter().map(|r| r.id).collect();
        ids.sort();
        assert_eq!(ids, vec!["confirmed", "kept"]);
        assert!(!node.has_unconfirmed(), "each looked at once");
        assert!(node.release_unconfirmed(later).is_empty());
    }
}
