//! The container adjustment for a GPU container, as plain data (the NRI adapter turns it into
//! the protocol's `ContainerAdjustment`). Pure.

use serde::Serialize;

use crate::inventory::{DeviceNode, DeviceSet};
use crate::request::{ContainerRequest, MemoryUnit};

/// What to change in a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Adjustment {
    pub devices: Vec<DeviceNode>,
    pub env: Vec<(String, String)>,
    pub cdi_devices: Vec<String>,
    /// Bind mounts `(host source, container destination)`, read-write.
    pub mounts: Vec<(String, String)>,
    /// CPU set to pin the container to (simulated GPUs).
    pub cpuset: Option<String>,
}

/// Where MPS clients find the control daemon's pipes inside the container.
pub const MPS_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// Enforcement backend `mps`: the driver enforces the quotas. The container gets the
/// compute share as `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, its memory as
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (device ordinals as the container sees them: its
/// assigned GPUs are 0, 1, … in order), and the pipe directory of its GPU's MPS control
/// daemon, `<pipe_root>/<gpu index>`, mounted at [`MPS_PIPE_DIR`].
pub fn add_mps(adj: &mut Adjustment, req: &ContainerRequest, pipe_root: &str) {
    if let Some(core) = req.gpus.iter().map(|g| g.core_percent).min().flatten() {
        adj.env
            .push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), core.to_string()));
    }
    let limits: Vec<String> = req
        .gpus
        .iter()
        .enumerate()
        .map(|(ordinal, g)| format!("{ordinal}={}M", g.memory_mib))
        .collect();
    adj.env
        .push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(",")));
    adj.env
        .push(("CUDA_MPS_PIPE_DIRECTORY".into(), MPS_PIPE_DIR.into()));
    let root = pipe_root.trim_end_matches('/');
    adj.mounts
        .push((format!("{root}/{}", req.gpus[0].index), MPS_PIPE_DIR.into()));
}

/// The CPU core that stands in for simulated GPU `gpu_index` on a machine of `ncpu` cores.
pub fn sim_cpu(gpu_index: u32, ncpu: usize) -> usize {
    gpu_index as usize % ncpu.max(1)
}

/// Simulated GPUs: pin the container to the CPU core that stands in for its GPU
/// (`gpu index mod ncpu`) and mount its declaration directory (GPU memory in use, progress).
pub fn add_sim(
    adj: &mut Adjustment,
    gpu_index: u32,
    ncpu: usize,
    host_dir: &str,
    container_dir: &str,
) {
    adj.cpuset = Some(sim_cpu(gpu_index, ncpu).to_string());
    adj.mounts
        .push((host_dir.to_string(), container_dir.to_string()));
}

/// Node-level choices for the adjustment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdjustOptions {
    /// Also request NVIDIA's CDI devices (`nvidia.com/gpu=<index>`), for nodes with a CDI spec.
    pub cdi: bool,
    /// Unit of the memory resource, for the ACK-compatible variables.
    pub memory_unit: MemoryUnit,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdjustError {
    #[error("device node /dev/nvidia{minor} for GPU {index} is missing on this node")]
    MissingGpuNode { index: u32, minor: u32 },
    #[error("device node /dev/nvidiactl is missing on this node")]
    MissingCtl,
}

/// Builds the adjustment: the assigned GPUs' device nodes only, the control and uvm nodes,
/// and the environment. Fails, changing nothing, when a needed device node is missing.
pub fn build(
    req: &ContainerRequest,
    devices: &DeviceSet,
    opts: &AdjustOptions,
) -> Result<Adjustment, AdjustError> {
    let mut adj = Adjustment::default();
    for g in &req.gpus {
        let node = devices
            .gpus
            .get(&g.minor)
            .ok_or(AdjustError::MissingGpuNode {
                index: g.index,
                minor: g.minor,
            })?;
        adj.devices.push(node.clone());
    }
    adj.devices
        .push(devices.ctl.clone().ok_or(AdjustError::MissingCtl)?);
    adj.devices.extend(devices.uvm.iter().cloned());
    adj.devices.extend(devices.uvm_tools.iter().cloned());

    let join = |f: &dyn Fn(&crate::request::AssignedGpu) -> String| {
        req.gpus.iter().map(f).collect::<Vec<_>>().join(",")
    };
    let unit = opts.memory_unit.mib();
    let mut env = vec![
        (
            "NVIDIA_VISIBLE_DEVICES".to_string(),
            join(&|g| g.uuid.clone()),
        ),
        (
            "GPUSHARE_GPU_INDEX".to_string(),
            join(&|g| g.index.to_string()),
        ),
        ("GPUSHARE_GPU_UUID".to_string(), join(&|g| g.uuid.clone())),
        (
            "GPUSHARE_GPU_MEMORY_MIB".to_string(),
            req.memory_mib().to_string(),
        ),
    ];
    if req.gpus.iter().all(|g| g.core_percent.is_some()) {
        let core: u32 = req.gpus.iter().filter_map(|g| g.core_percent).sum();
        env.push(("GPUSHARE_GPU_CORE_PERCENT".to_string(), core.to_string()));
    }
    env.extend([
        (
            "ALIYUN_COM_GPU_MEM_IDX".to_string(),
            join(&|g| g.index.to_string()),
        ),
        (
            "ALIYUN_COM_GPU_MEM_CONTAINER".to_string(),
            (req.memory_mib() / unit).to_string(),
        ),
        (
            "ALIYUN_COM_GPU_MEM_DEV".to_string(),
            (req.gpus[0].gpu_memory_mib / unit).to_string(),
        ),
    ]);
    adj.env = env;
    if opts.cdi {
        adj.cdi_devices = req
            .gpus
            .iter()
            .map(|g| format!("nvidia.com/gpu={}", g.index))
            .collect();
    }
    Ok(adj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::AssignedGpu;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn node(path: &str, major: i64, minor: i64) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            major,
            minor,
            file_mode: 0o666,
        }
    }

    fn devset(n: u32) -> DeviceSet {
        DeviceSet {
            gpus: (0..n)
                .map(|m| (m, node(&format!("/dev/nvidia{m}"), 195, m as i64)))
                .collect::<BTreeMap<_, _>>(),
            ctl: Some(node("/dev/nvidiactl", 195, 255)),
            uvm: Some(node("/dev/nvidia-uvm", 508, 0)),
            uvm_tools: Some(node("/dev/nvidia-uvm-tools", 508, 1)),
        }
    }

    fn grant(index: u32, mem: u64, core: Option<u32>) -> AssignedGpu {
        AssignedGpu {
            index,
            uuid: format!("GPU-{index}"),
            minor: index,
            memory_mib: mem,
            gpu_memory_mib: 15360,
            core_percent: core,
        }
    }

    const OPTS: AdjustOptions = AdjustOptions {
        cdi: false,
        memory_unit: MemoryUnit::GiB,
    };

    #[test]
    fn only_the_assigned_gpu_and_the_shared_nodes() {
        let req = ContainerRequest {
            gpus: vec![grant(1, 2048, Some(30))],
        };
        let adj = build(&req, &devset(4), &OPTS).unwrap();
        let paths: Vec<&str> = adj.devices.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia1",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools"
            ]
        );
        let env: BTreeMap<_, _> = adj.env.iter().cloned().collect();
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-1");
        assert_eq!(env["GPUSHARE_GPU_MEMORY_MIB"], "2048");
        assert_eq!(env["GPUSHARE_GPU_CORE_PERCENT"], "30");
        assert_eq!(env["ALIYUN_COM_GPU_MEM_IDX"], "1");
        assert_eq!(env["ALIYUN_COM_GPU_MEM_CONTAINER"], "2");
        assert_eq!(env["ALIYUN_COM_GPU_MEM_DEV"], "15");
        assert!(adj.cdi_devices.is_empty());
    }

    #[test]
    fn memory_only_has_no_core_variable_and_cdi_is_optional() {
        let req = ContainerRequest {
            gpus: vec![grant(3, 1024, None)],
        };
        let adj = build(&req, &devset(4), &AdjustOptions { cdi: true, ..OPTS }).unwrap();
        assert!(
            !adj.env
                .iter()
                .any(|(k, _)| k == "GPUSHARE_GPU_CORE_PERCENT")
        );
        assert_eq!(adj.cdi_devices, ["nvidia.com/gpu=3"]);
    }

    #[test]
    fn missing_nodes_fail_without_partial_result() {
        let req = ContainerRequest {
            gpus: vec![grant(5, 1024, None)],
        };
        assert_eq!(
            build(&req, &devset(4), &OPTS),
            Err(AdjustError::MissingGpuNode { index: 5, minor: 5 })
        );
        let mut d = devset(4);
        d.ctl = None;
        let req = ContainerRequest {
            gpus: vec![grant(0, 1024, None)],
        };
        assert_eq!(build(&req, &d, &OPTS), Err(AdjustError::MissingCtl));
    }

    #[test]
    fn mps_env_and_pipe_mount() {
        let req = ContainerRequest {
            gpus: vec![grant(2, 2048, Some(30))],
        };
        let mut adj = build(&req, &devset(4), &OPTS).unwrap();
        add_mps(&mut adj, &req, "/run/gpushare/mps/");
        let env: BTreeMap<_, _> = adj.env.iter().cloned().collect();
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=2048M");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
        assert_eq!(
            adj.mounts,
            [(
                "/run/gpushare/mps/2".to_string(),
                "/tmp/nvidia-mps".to_string()
            )]
        );
    }

    proptest! {
        /// For any subset of GPUs, exactly those GPU nodes are injected, never another.
        #[test]
        fn injects_exactly_the_assigned_gpus(mask in 1u8..16) {
            let gpus: Vec<AssignedGpu> = (0..4).filter(|i| mask & (1 << i) != 0).map(|i| grant(i, 1024, Some(10))).collect();
            let want: Vec<String> = gpus.iter().map(|g| format!("/dev/nvidia{}", g.minor)).collect();
            let adj = build(&ContainerRequest { gpus }, &devset(4), &OPTS).unwrap();
            let got: Vec<String> = adj.devices.iter().map(|d| d.path.clone())
                .filter(|p| p.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
