//! GPU inventory and device nodes: what GPUs this node has and which device nodes expose them.
//!
//! Backends: `sim` (GPUs described by the node config, device nodes created under the agent's
//! own dev root). The NVML backend reads the same [`GpuInfo`] from the driver.

pub mod devices;
pub mod nvml;
pub mod sim;

use serde::{Deserialize, Serialize};

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

/// The extended resources the device plugin advertises for `inv`, in the seed's form:
/// `(aliyun.com/gpu-core.percentage, "400")`, `(aliyun.com/gpu-count, "4")`,
/// `(aliyun.com/gpu-mem, "60")` for 4 GPUs × 15 GiB. Sorted by name.
pub fn capacity(inv: &Inventory, names: &crate::request::ResourceNames) -> Vec<(String, String)> {
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
        let inv = Inventory::new(sim::inventory(&sim::SimConfig::default(), "n"));
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
}
