//! The node's GPUs as the agent finds them. [`Backend::open`] is the one place that turns
//! the configured backend (`sim` or `nvml`) into the inventory and the throttling
//! controller's sample source and the GPUs' health probe ([`health`]); device-node discovery
//! is [`devices`]. The inventory types
//! themselves are pure and live in `gpushare_core::inventory`.

pub mod devices;
pub mod health;
pub mod nvml;
pub mod sim;

use std::sync::Arc;

use gpushare_core::inventory::{Inventory, sim_inventory};

use health::{HealthProbe, NvmlHealth, SimHealth};

use crate::config::{GpuBackend, NodeConfig};
use crate::throttle::cgroup::{CgroupError, CgroupFs};
use crate::throttle::source::{SampleSource, SimSource};

/// The configured GPU backend, opened: what GPUs there are and where their per-container
/// samples come from.
pub struct Backend {
    pub kind: GpuBackend,
    pub inventory: Inventory,
    /// Per-container GPU share and memory for the throttling controller.
    pub source: Box<dyn SampleSource>,
    /// Which GPUs are unhealthy (for the device plugin and the node annotation).
    pub health: Box<dyn HealthProbe>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Nvml(#[from] nvml::NvmlError),
    /// NVML maps processes to containers through `/proc/PID/cgroup`, which needs the cgroup
    /// layout.
    #[error("NVML sample source: {0}")]
    Cgroup(#[from] CgroupError),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind)
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// Opens `cfg.gpu_backend`. Creates nothing: the simulated backend's device nodes are
    /// made by the node agent when it starts (`node::AgentState::init`).
    pub fn open(cfg: &NodeConfig) -> Result<Backend, BackendError> {
        match cfg.gpu_backend {
            GpuBackend::Sim => Ok(Backend {
                kind: GpuBackend::Sim,
                inventory: Inventory::new(sim_inventory(&cfg.sim, &cfg.node_name())),
                source: Box::new(SimSource::new(cfg.sim_dir())),
                health: Box::new(SimHealth::new(cfg.sim_dir())),
            }),
            GpuBackend::Nvml => {
                let handle = Arc::new(nvml::open(&cfg.nvml_library)?);
                let inventory = Inventory::new(nvml::inventory(&handle)?);
                let version = CgroupFs::detect(&cfg.throttle.cgroup_root)?.version();
                let indexes = inventory.gpus.iter().map(|g| g.index).collect();
                Ok(Backend {
                    kind: GpuBackend::Nvml,
                    inventory,
                    source: Box::new(nvml::NvmlSource::new(
                        handle.clone(),
                        cfg.proc_root.clone(),
                        version,
                    )),
                    health: Box::new(NvmlHealth::new(handle, indexes)),
                })
            }
        }
    }
}
