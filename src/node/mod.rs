//! The node agent's NRI handler: turns the runtime's events into decisions with the pure
//! modules (`request`, `adjust`) and keeps the container registry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use serde::Serialize;

use crate::config::{Enforcement, GpuBackend, NodeConfig};
use crate::gpu::devices;
use crate::gpu::sim;
use crate::nri::api::nri_api::{
    ConfigureRequest, Container, ContainerAdjustment, ContainerState as NriState, Event,
    PodSandbox, SynchronizeRequest,
};
use crate::nri::convert;
use crate::nri::service::{Handler, HandlerError, event_mask};
use crate::registry::{ContainerRecord, ContainerState, Registry};
use crate::throttle::controller::{ControllerLink, ThrottleStats};
use gpushare_core::adjust::{self, AdjustOptions};
use gpushare_core::inventory::DeviceSet;
use gpushare_core::inventory::{Inventory, SimConfig, sim_inventory};
use gpushare_core::request::{self, ContainerRequest, RequestPolicy};

/// Everything the handler derives from the configuration and the hardware.
#[derive(Debug, Serialize)]
pub struct NodeState {
    pub node_name: String,
    pub inventory: Inventory,
    pub devices: DeviceSet,
    #[serde(skip)]
    pub policy: RequestPolicy,
    #[serde(skip)]
    pub adjust: AdjustOptions,
    /// Simulated GPUs: where per-container declaration directories live, and how many CPU
    /// cores stand in for GPUs.
    #[serde(skip)]
    pub sim: Option<SimNode>,
    /// Enforcement backend `mps`: the host directory holding one MPS pipe directory per GPU.
    #[serde(skip)]
    pub mps_pipe_root: Option<String>,
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

impl NodeState {
    /// The default simulated node (4 × 15 GiB GPUs) with its device set synthesized in memory
    /// instead of discovered (no device nodes are created): the decision path without IO, for
    /// tests and benchmarks.
    pub fn in_memory(node_name: &str) -> NodeState {
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
        NodeState {
            node_name: node_name.to_string(),
            inventory: Inventory::new(gpus),
            devices,
            policy: RequestPolicy::default(),
            adjust: AdjustOptions {
                cdi: false,
                memory_unit: gpushare_core::request::MemoryUnit::GiB,
            },
            sim: None,
            mps_pipe_root: None,
        }
    }

    /// Discovers (or, for `sim`, creates) the GPUs and their device nodes.
    pub fn init(cfg: &NodeConfig) -> anyhow::Result<NodeState> {
        cfg.validate()?;
        let node_name = cfg.node_name();
        let dev_root = cfg.dev_root();
        let inventory = match cfg.gpu_backend {
            GpuBackend::Sim => {
                let gpus = sim_inventory(&cfg.sim, &node_name);
                let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
                sim::create_device_nodes(&dev_root, &minors).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create simulated device nodes under dev_root {}: {e}",
                        dev_root.display()
                    )
                })?;
                Inventory::new(gpus)
            }
            GpuBackend::Nvml => {
                let nvml = crate::gpu::nvml::open(&cfg.nvml_library)?;
                Inventory::new(crate::gpu::nvml::inventory(&nvml)?)
            }
        };
        let devices = devices::discover(&dev_root, &cfg.proc_root.join("devices"))?;
        Ok(NodeState {
            node_name,
            inventory,
            devices,
            policy: RequestPolicy {
                names: cfg.resources.clone(),
                require_grant: cfg.require_grant,
            },
            adjust: AdjustOptions {
                cdi: cfg.cdi,
                memory_unit: cfg.resources.memory_unit,
            },
            sim: (cfg.gpu_backend == GpuBackend::Sim).then(|| SimNode {
                dir: sim_dir(cfg),
                ncpu: std::thread::available_parallelism().map_or(1, |n| n.get()),
            }),
            mps_pipe_root: (cfg.enforcement == Enforcement::Mps)
                .then(|| cfg.mps_pipe_root.to_string_lossy().into_owned()),
        })
    }
}

/// Where simulated containers' declaration directories live.
pub fn sim_dir(cfg: &NodeConfig) -> std::path::PathBuf {
    cfg.throttle.state_dir.join("sim")
}

/// Counters for the status endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    pub creates_gpu: AtomicU64,
    pub creates_passthrough: AtomicU64,
    pub creates_refused: AtomicU64,
    pub syncs: AtomicU64,
    pub connected: AtomicBool,
    /// The registry was rebuilt from the runtime's Synchronize since the last connection.
    pub synced: AtomicBool,
}

/// The NRI handler of `gpushare node`.
pub struct Node {
    state: RwLock<Option<Arc<NodeState>>>,
    /// Set for a pre-installed plugin: its config arrives in `Configure`.
    config_from_runtime: bool,
    pub registry: Arc<Registry>,
    pub stats: Stats,
    /// Records gathered from a split Synchronize until its last chunk.
    sync_buf: Mutex<Vec<ContainerRecord>>,
    /// Called with the runtime's config text (pre-installed plugins), before it is applied.
    on_runtime_config: Box<dyn Fn(&NodeConfig) + Send + Sync>,
    /// The throttling controller, once running.
    throttle: std::sync::OnceLock<(Arc<ThrottleStats>, Arc<ControllerLink>)>,
}

impl Node {
    /// A node whose state is known now (external plugin).
    pub fn new(state: NodeState) -> Node {
        Node {
            state: RwLock::new(Some(Arc::new(state))),
            config_from_runtime: false,
            registry: Arc::new(Registry::new()),
            stats: Stats::default(),
            sync_buf: Mutex::new(vec![]),
            on_runtime_config: Box::new(|_| {}),
            throttle: Default::default(),
        }
    }

    /// A node that takes its configuration from the runtime's `Configure` (pre-installed).
    pub fn awaiting_config(on_config: impl Fn(&NodeConfig) + Send + Sync + 'static) -> Node {
        Node {
            state: RwLock::new(None),
            config_from_runtime: true,
            registry: Arc::new(Registry::new()),
            stats: Stats::default(),
            sync_buf: Mutex::new(vec![]),
            on_runtime_config: Box::new(on_config),
            throttle: Default::default(),
        }
    }

    /// Connects the running throttling controller.
    pub fn attach_controller(&self, stats: Arc<ThrottleStats>, link: Arc<ControllerLink>) {
        let _ = self.throttle.set((stats, link));
    }

    pub fn throttle_stats(&self) -> Option<Arc<ThrottleStats>> {
        self.throttle.get().map(|(s, _)| s.clone())
    }

    fn release(&self, id: &str) {
        if let (Some((_, link)), Some(rec)) = (self.throttle.get(), self.registry.get(id)) {
            link.release(id, &rec.cgroups_path);
        }
    }

    pub fn state(&self) -> Option<Arc<NodeState>> {
        self.state.read().expect("state lock").clone()
    }

    fn require_state(&self) -> Result<Arc<NodeState>, HandlerError> {
        self.state()
            .ok_or_else(|| HandlerError::internal("gpushare node is not configured yet"))
    }

    /// Validates one container and builds its adjustment; `None` for non-GPU containers.
    pub fn decide(
        &self,
        state: &NodeState,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<(ContainerRequest, adjust::Adjustment)>, String> {
        let req = request::container_request(
            &pod.annotations,
            &ctr.name,
            &ctr.annotations,
            &state.inventory,
            &state.policy,
        )
        .map_err(|e| e.to_string())?;
        let Some(req) = req else { return Ok(None) };
        for g in &req.gpus {
            let gpu = state.inventory.get(g.index).expect("validated index");
            let c = self.registry.committed(g.index, &ctr.id);
            if c.memory_mib + g.memory_mib > gpu.memory_mib {
                return Err(format!(
                    "GPU {} memory would be over-committed: {} MiB held by {} container(s) + {} MiB requested > {} MiB",
                    g.index, c.memory_mib, c.containers, g.memory_mib, gpu.memory_mib
                ));
            }
            if let Some(core) = g.core_percent
                && c.core_percent + core > 100
            {
                return Err(format!(
                    "GPU {} compute would be over-committed: {}% held by {} container(s) + {}% requested > 100%",
                    g.index, c.core_percent, c.containers, core
                ));
            }
        }
        let mut adj =
            adjust::build(&req, &state.devices, &state.adjust).map_err(|e| e.to_string())?;
        if let Some(root) = &state.mps_pipe_root {
            adjust::add_mps(&mut adj, &req, root);
        }
        if let Some(sim) = &state.sim {
            let dir = sim.container_dir(&ctr.id);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create sim directory {}: {e}", dir.display()))?;
            adjust::add_sim(
                &mut adj,
                req.gpus[0].index,
                sim.ncpu,
                &dir.to_string_lossy(),
                crate::throttle::source::SIM_CONTAINER_DIR,
            );
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
        if self.config_from_runtime {
            let cfg = NodeConfig::from_toml(&req.config, "from the runtime's plugin config")
                .map_err(|e| HandlerError::invalid(e.to_string()))?;
            (self.on_runtime_config)(&cfg);
            let state =
                NodeState::init(&cfg).map_err(|e| HandlerError::invalid(format!("{e:#}")))?;
            tracing::info!(gpus = state.inventory.len(), "configured from the runtime");
            *self.state.write().expect("state lock") = Some(Arc::new(state));
        }
        Ok(event_mask(&[
            Event::CREATE_CONTAINER,
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
                &state.policy,
            ) {
                Ok(Some(req)) => buf.push(Node::record(pod, ctr, req)),
                Ok(None) => {}
                // Created before a config change, say; it keeps running, but we cannot
                // account it.
                Err(e) => {
                    tracing::warn!(container = %ctr.id, error = %e, "cannot account running container")
                }
            }
        }
        if !req.more {
            let records = std::mem::take(&mut *buf);
            tracing::info!(
                containers = records.len(),
                "registry rebuilt from runtime state"
            );
            self.registry.replace_all(records);
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
            self.stats.synced.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<ContainerAdjustment>, HandlerError> {
        if !has_gpu_hint(pod, ctr) {
            self.stats
                .creates_passthrough
                .fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let span = tracing::info_span!("create", pod = %format!("{}/{}", pod.namespace, pod.name), container = %ctr.name, id = %ctr.id);
        let _g = span.enter();
        let started = Instant::now();
        let state = self.require_state()?;
        match self.decide(&state, pod, ctr) {
            Ok(None) => {
                self.stats
                    .creates_passthrough
                    .fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Ok(Some((req, adj))) => {
                let gpus: Vec<u32> = req.gpus.iter().map(|g| g.index).collect();
                self.registry.upsert(Node::record(pod, ctr, req));
                self.stats.creates_gpu.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    ?gpus,
                    micros = started.elapsed().as_micros() as u64,
                    "GPU container admitted"
                );
                Ok(Some(convert::adjustment(&adj)))
            }
            Err(msg) => {
                self.stats.creates_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %msg, "GPU container refused");
                Err(HandlerError::invalid(format!("gpushare: {msg}")))
            }
        }
    }

    fn start_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.registry.set_state(&ctr.id, ContainerState::Running);
    }

    fn update_container(&self, _pod: &PodSandbox, _ctr: &Container) -> Result<(), HandlerError> {
        Ok(())
    }

    fn stop_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.registry.set_state(&ctr.id, ContainerState::Stopped);
        self.release(&ctr.id);
    }

    fn remove_container(&self, _pod: &PodSandbox, ctr: &Container) {
        self.release(&ctr.id);
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
        }
        self.stats.connected.store(up, Ordering::Relaxed);
    }
}
