//! Simulated GPUs for machines without NVIDIA hardware: the inventory comes from the node
//! config (`gpushare_core::inventory::sim_inventory`) and the device nodes are created under the agent's own dev root, with the real
//! NVIDIA major (195) so containers see exactly what they would on a GPU node.

use std::path::Path;

/// Major number of the NVIDIA character devices (`/dev/nvidia<N>`, `/dev/nvidiactl`).
pub const NVIDIA_MAJOR: u64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u64 = 255;
/// Major used for the simulated `nvidia-uvm` nodes (dynamic on real hosts).
pub const SIM_UVM_MAJOR: u64 = 511;

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
