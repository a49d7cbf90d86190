//! GPU inventory types: what GPUs a node has ([`Inventory`]), the device nodes a container
//! gets for them ([`DeviceNode`], [`DeviceSet`]), the simulated inventory ([`SimConfig`]) and
//! the capacity the device plugin advertises ([`capacity`]).
//!
//! Pure: the agent's backends (NVML, the simulated one) and device-node discovery fill these
//! types in; everything that decides from them reads only these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::request::ResourceNames;

/// One physical (or simulated) GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index as NVML and `nvidia-smi` number it.
    pub index: u32,
    /// NVML UUID, `GPU-xxxxxxxx-…`.
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
}

/// All GPUs of this node, ordered by index.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
}

impl Inventory {
    pub fn new(mut gpus: Vec<GpuInfo>) -> Self {
        gpus.sort_by_key(|g| g.index);
        Inventory { gpus }
    }

    pub fn get(&self, index: u32) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.index == index)
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Human form of the index range for error messages: `4 GPUs: 0-3`.
    pub fn describe(&self) -> String {
        match (self.gpus.first(), self.gpus.last()) {
            (Some(a), Some(b)) => format!("{} GPUs: {}-{}", self.gpus.len(), a.index, b.index),
            _ => "no GPUs".to_string(),
        }
    }
}

/// A character device node to expose in a container at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeviceNode {
    /// Path inside the container (always under `/dev`).
    pub path: String,
    pub major: i64,
    pub minor: i64,
    pub file_mode: u32,
}

/// The NVIDIA device nodes of this node.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceSet {
    /// `/dev/nvidia<minor>` by minor number.
    pub gpus: BTreeMap<u32, DeviceNode>,
    pub ctl: Option<DeviceNode>,
    pub uvm: Option<DeviceNode>,
    pub uvm_tools: Option<DeviceNode>,
}

/// `[sim]` section of the node config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Number of identical GPUs when `gpu` is empty.
    pub count: u32,
    /// Memory of each GPU when `gpu` is empty.
    pub memory_mib: u64,
    pub model: String,
    /// Explicit GPUs; overrides `count`/`memory_mib`.
    pub gpu: Vec<GpuInfo>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            count: 4,
            memory_mib: 15 * 1024,
            model: "gpushare-sim".into(),
            gpu: vec![],
        }
    }
}

/// Stable simulated UUID for GPU `index` on node `node`.
pub fn sim_uuid(node: &str, index: u32) -> String {
    // FNV-1a: stable across runs and releases, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!(
        "GPU-{:08x}-{:04x}-4000-8000-{:012x}",
        (h >> 32) as u32,
        (h >> 16) as u16,
        index as u64
    )
}

/// The simulated inventory described by `cfg` for node `node`.
pub fn sim_inventory(cfg: &SimConfig, node: &str) -> Vec<GpuInfo> {
    if !cfg.gpu.is_empty() {
        return cfg.gpu.clone();
    }
    (0..cfg.count)
        .map(|i| GpuInfo {
            index: i,
            uuid: sim_uuid(node, i),
            model: cfg.model.clone(),
            memory_mib: cfg.memory_mib,
            minor: i,
        })
        .collect()
}

/// The extended resources the device plugin advertises for `inv`, in the seed's form:
/// `(aliyun.com/gpu-core.percentage, "400")`, `(aliyun.com/gpu-count, "4")`,
/// `(aliyun.com/gpu-mem, "60")` for 4 GPUs × 15 GiB. Sorted by name.
pub fn capacity(inv: &Inventory, names: &ResourceNames) -> Vec<(String, String)> {
    let unit = names.memory_unit.mib();
    let mem: u64 = inv.gpus.iter().map(|g| g.memory_mib / unit).sum();
    let mut v = vec![
        (names.core.clone(), (inv.len() * 100).to_string()),
        (names.count.clone(), inv.len().to_string()),
        (names.memory.clone(), mem.to_string()),
    ];
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_of_four_15gib_gpus_matches_the_seed() {
        let inv = Inventory::new(sim_inventory(&SimConfig::default(), "n"));
        let cap = capacity(&inv, &Default::default());
        assert_eq!(
            cap,
            vec![
                (
                    "aliyun.com/gpu-core.percentage".to_string(),
                    "400".to_string()
                ),
                ("aliyun.com/gpu-count".to_string(), "4".to_string()),
                ("aliyun.com/gpu-mem".to_string(), "60".to_string()),
            ]
        );
        assert_eq!(inv.describe(), "4 GPUs: 0-3");
    }

    #[test]
    fn default_is_four_15gib_gpus_with_stable_uuids() {
        let inv = sim_inventory(&SimConfig::default(), "node-a");
        assert_eq!(inv.len(), 4);
        assert!(inv.iter().all(|g| g.memory_mib == 15360));
        assert_eq!(inv[2].minor, 2);
        assert_eq!(inv[1].uuid, sim_uuid("node-a", 1));
        assert_ne!(inv[1].uuid, sim_uuid("node-b", 1));
        assert_eq!(inv[1].uuid.len(), "GPU-".len() + 36);
    }
}
