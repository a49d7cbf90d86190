//! Simulated GPUs for machines without NVIDIA hardware: the inventory comes from the node
//! config and the device nodes are created under the agent's own dev root, with the real
//! NVIDIA major (195) so containers see exactly what they would on a GPU node.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::GpuInfo;

/// Major number of the NVIDIA character devices (`/dev/nvidia<N>`, `/dev/nvidiactl`).
pub const NVIDIA_MAJOR: u64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u64 = 255;
/// Major used for the simulated `nvidia-uvm` nodes (dynamic on real hosts).
pub const SIM_UVM_MAJOR: u64 = 511;

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
pub fn inventory(cfg: &SimConfig, node: &str) -> Vec<GpuInfo> {
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

fn mknod_char(path: &Path, major: u64, minor: u64) -> std::io::Result<()> {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    match std::fs::symlink_metadata(path) {
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(major, minor),
    )
    .map_err(std::io::Error::from)
}

/// Creates `nvidia<minor>` for each minor, `nvidiactl`, `nvidia-uvm` and `nvidia-uvm-tools`
/// under `dev_root` (needs root, like the agent itself).
pub fn create_device_nodes(dev_root: &Path, minors: &[u32]) -> std::io::Result<()> {
    std::fs::create_dir_all(dev_root)?;
    for &m in minors {
        mknod_char(&dev_root.join(format!("nvidia{m}")), NVIDIA_MAJOR, m as u64)?;
    }
    mknod_char(&dev_root.join("nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR)?;
    mknod_char(&dev_root.join("nvidia-uvm"), SIM_UVM_MAJOR, 0)?;
    mknod_char(&dev_root.join("nvidia-uvm-tools"), SIM_UVM_MAJOR, 1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_four_15gib_gpus_with_stable_uuids() {
        let inv = inventory(&SimConfig::default(), "node-a");
        assert_eq!(inv.len(), 4);
        assert!(inv.iter().all(|g| g.memory_mib == 15360));
        assert_eq!(inv[2].minor, 2);
        assert_eq!(inv[1].uuid, sim_uuid("node-a", 1));
        assert_ne!(inv[1].uuid, sim_uuid("node-b", 1));
        assert_eq!(inv[1].uuid.len(), "GPU-".len() + 36);
    }
}
