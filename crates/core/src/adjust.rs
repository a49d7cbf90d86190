//! The container adjustment for a GPU container, as plain data (the NRI adapter turns it into
//! the protocol's `ContainerAdjustment`). Pure.

use serde::{Deserialize, Serialize};

use crate::inventory::{DeviceNode, DeviceSet};
use crate::limiter::{self, GpuLimit, LimitsFile};
use crate::request::{ContainerRequest, MemoryUnit};

/// What to change in a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adjustment {
    pub devices: Vec<DeviceNode>,
    pub env: Vec<(String, String)>,
    /// Environment variables set to the empty string. (Not removed: NRI's adaptation in
    /// containerd 1.7 and 2.x — nri v0.8.0, v0.12.3 `adjustEnv` — drops a plugin's removal
    /// markers before the spec is adjusted, so a removal never reaches the container.)
    pub clear_env: Vec<String>,
    pub cdi_devices: Vec<String>,
    pub mounts: Vec<Mount>,
    /// CPU set to pin the container to (simulated GPUs).
    pub cpuset: Option<String>,
}

/// A bind mount of a host path into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: String,
    pub destination: String,
    pub read_only: bool,
}

impl Mount {
    pub fn rw(source: impl Into<String>, destination: impl Into<String>) -> Mount {
        Mount {
            source: source.into(),
            destination: destination.into(),
            read_only: false,
        }
    }

    pub fn ro(source: impl Into<String>, destination: impl Into<String>) -> Mount {
        Mount {
            read_only: true,
            ..Mount::rw(source, destination)
        }
    }
}

/// Variables with which an image or a pod selects GPUs from a runtime that reads the
/// environment (nvidia-container-runtime, the GPU Operator's default): only gpushare sets
/// them, from the kubelet's grant.
pub const DEVICE_SELECTING_ENV: [&str; 4] = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
];

fn env_key(kv: &str) -> &str {
    kv.split_once('=').map_or(kv, |(k, _)| k)
}

/// For a container granted no GPU: the adjustment that keeps a runtime which reads the
/// environment from giving it GPUs anyway — `NVIDIA_VISIBLE_DEVICES=void`, every other
/// `NVIDIA_*` variable and every `CUDA_MPS_*` variable removed — or `None` when its
/// environment (`KEY=VALUE` entries) has nothing such a runtime would act on. A CUDA image's
/// `CUDA_VERSION` alone counts: nvidia-container-runtime gives such "legacy" images every GPU
/// when `NVIDIA_VISIBLE_DEVICES` is unset.
pub fn neutralize_non_gpu(env: &[String]) -> Option<Adjustment> {
    let keys: Vec<&str> = env.iter().map(|kv| env_key(kv)).collect();
    let acts = |k: &str| {
        k.starts_with("NVIDIA_")
            || k.starts_with("CUDA_MPS_")
            || k == "CUDA_VERSION"
            || k == "NVIDIA_REQUIRE_CUDA"
    };
    if !keys.iter().any(|k| acts(k)) {
        return None;
    }
    let mut clear_env: Vec<String> = keys
        .iter()
        .filter(|k| {
            (k.starts_with("NVIDIA_") || k.starts_with("CUDA_MPS_"))
                && **k != "NVIDIA_VISIBLE_DEVICES"
        })
        .map(|k| k.to_string())
        .collect();
    clear_env.sort();
    clear_env.dedup();
    Some(Adjustment {
        env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "void".into())],
        clear_env,
        ..Adjustment::default()
    })
}

/// Whether a container granted no GPU selects no device from a runtime that reads the
/// environment, as [`neutralize_non_gpu`] leaves it: nothing such a runtime acts on, or every
/// copy of `NVIDIA_VISIBLE_DEVICES` is `void` and every copy of the other
/// [`DEVICE_SELECTING_ENV`] variables is empty (`false` for a container created while no agent
/// adjusted it, whose image's `NVIDIA_VISIBLE_DEVICES=all`, say, is still there). Other
/// `NVIDIA_*` variables (`NVIDIA_DRIVER_CAPABILITIES`, which a later NRI plugin may set) select
/// nothing beside `void`.
pub fn neutralized(env: &[String]) -> bool {
    fn values<'a>(env: &'a [String], key: &'a str) -> impl Iterator<Item = &'a str> {
        env.iter()
            .filter(move |kv| env_key(kv) == key)
            .map(|kv| kv.split_once('=').map_or("", |(_, v)| v))
    }
    neutralize_non_gpu(env).is_none()
        || (values(env, "NVIDIA_VISIBLE_DEVICES").next().is_some()
            && values(env, "NVIDIA_VISIBLE_DEVICES").all(|v| v == "void")
            && DEVICE_SELECTING_ENV
                .iter()
                .filter(|k| **k != "NVIDIA_VISIBLE_DEVICES")
                .all(|k| values(env, k).all(str::is_empty)))
}

/// Whether gpushare sets or clears variable `key` in some container: `NVIDIA_*`,
/// `CUDA_MPS_*`, `GPUSHARE_*` and the ACK-compatible `ALIYUN_COM_GPU_*`.
pub fn is_gpu_env(key: &str) -> bool {
    ["NVIDIA_", "CUDA_MPS_", "GPUSHARE_", "ALIYUN_COM_GPU_"]
        .iter()
        .any(|p| key.starts_with(p))
}

/// The first variable gpushare adjusts ([`is_gpu_env`]) that the environment (`KEY=VALUE`
/// entries) holds more than once, with its count. NRI applies an adjustment to the first
/// entry of a key only (`AdjustEnv`; a later entry then overwrites it), so a container whose
/// image or spec repeats such a key could keep, say, `NVIDIA_VISIBLE_DEVICES=all` past
/// `void`: the NRI plugin refuses it instead. (The runtime-level modes write the spec
/// themselves and remove every copy.)
pub fn repeated_gpu_env(env: &[String]) -> Option<(&str, usize)> {
    let mut keys: Vec<&str> = env
        .iter()
        .map(|kv| env_key(kv))
        .filter(|k| is_gpu_env(k))
        .collect();
    keys.sort_unstable();
    keys.chunk_by(|a, b| a == b)
        .find(|run| run.len() > 1)
        .map(|run| (run[0], run.len()))
}

/// For a GPU container: device-selecting variables other than the ones gpushare sets, and
/// (unless the MPS backend sets them) `CUDA_MPS_*` variables, cleared, so that
/// an image's `NVIDIA_MIG_CONFIG_DEVICES=all` or a pod's `CUDA_MPS_PIPE_DIRECTORY` cannot
/// reach beyond the grant.
pub fn strip_foreign_selectors(adj: &mut Adjustment, env: &[String]) {
    let set: std::collections::HashSet<&str> = adj.env.iter().map(|(k, _)| k.as_str()).collect();
    let mut remove: Vec<String> = env
        .iter()
        .map(|kv| env_key(kv))
        .filter(|k| !set.contains(k))
        .filter(|k| DEVICE_SELECTING_ENV.contains(k) || k.starts_with("CUDA_MPS_"))
        .map(str::to_string)
        .collect();
    remove.sort();
    remove.dedup();
    adj.clear_env.extend(remove);
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
    adj.mounts.push(Mount::rw(
        format!("{root}/{}", req.gpus[0].index),
        MPS_PIPE_DIR,
    ));
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
    adj.mounts.push(Mount::rw(host_dir, container_dir));
}

/// Host paths of what the in-container limiter needs, for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterFiles {
    /// The shipped `libgpushare_limiter.so`.
    pub library: String,
    /// A file whose one line is [`limiter::LIBRARY_PATH`].
    pub preload: String,
    /// This container's limits ([`limits_file`] rendered), read-only to it.
    pub limits: String,
    /// This container's accounting region, shared by its processes.
    pub region: String,
}

/// The in-container limiter: the library, `/etc/ld.so.preload` naming it and the limits,
/// all read-only (nothing a container sets or writes widens its quota), and the region its
/// processes share, read-write.
pub fn add_limiter(adj: &mut Adjustment, files: &LimiterFiles) {
    adj.mounts.extend([
        Mount::ro(&files.library, limiter::LIBRARY_PATH),
        Mount::ro(&files.preload, limiter::PRELOAD_PATH),
        Mount::ro(&files.limits, limiter::LIMITS_PATH),
        Mount::rw(&files.region, limiter::REGION_PATH),
    ]);
}

/// Where the NVIDIA container toolkit puts the driver's user-space libraries, and so where a
/// simulated node mounts its stand-ins (`libcuda.so.1`, `libnvidia-ml.so.1`).
pub const DRIVER_LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// Simulated GPUs: the stand-in driver libraries, mounted read-only the way the toolkit
/// mounts the real ones (`host_dir/<name>` at `DRIVER_LIB_DIR/<name>`).
pub fn add_driver_libraries(adj: &mut Adjustment, host_dir: &str, names: &[&str]) {
    let dir = host_dir.trim_end_matches('/');
    adj.mounts.extend(
        names
            .iter()
            .map(|n| Mount::ro(format!("{dir}/{n}"), format!("{DRIVER_LIB_DIR}/{n}"))),
    );
}

/// What the limiter enforces for `req`: each assigned GPU's memory quota, in the order the
/// container sees its GPUs.
pub fn limits_file(req: &ContainerRequest) -> LimitsFile {
    LimitsFile::new(
        req.gpus
            .iter()
            .map(|g| GpuLimit {
                index: g.index,
                uuid: g.uuid.clone(),
                // A share is at most its GPU's memory (and the parsers cap a quota at
                // MAX_MEMORY_MIB), so this is exact; saturating rather than shifting bits
                // out all the same, so that no value ever turns into a small quota.
                memory_limit_bytes: g.memory_mib.saturating_mul(1 << 20),
            })
            .collect(),
    )
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
        let core: u32 = req
            .gpus
            .iter()
            .filter_map(|g| g.core_percent)
            .fold(0, u32::saturating_add);
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

    #[test]
    fn a_repeated_gpu_variable_is_found() {
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            repeated_gpu_env(&env(&[
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "HOME=/",
                "NVIDIA_VISIBLE_DEVICES=all",
            ])),
            Some(("NVIDIA_VISIBLE_DEVICES", 2))
        );
        assert_eq!(
            repeated_gpu_env(&env(&[
                "GPUSHARE_GPU_UUID=a",
                "X=1",
                "GPUSHARE_GPU_UUID",
                "GPUSHARE_GPU_UUID=b"
            ])),
            Some(("GPUSHARE_GPU_UUID", 3))
        );
        assert_eq!(
            repeated_gpu_env(&env(&[
                "CUDA_MPS_PIPE_DIRECTORY=/a",
                "CUDA_MPS_PIPE_DIRECTORY=/b"
            ])),
            Some(("CUDA_MPS_PIPE_DIRECTORY", 2))
        );
        // Other repeated variables, and each GPU variable once, are left alone.
        assert_eq!(
            repeated_gpu_env(&env(&[
                "PATH=/a",
                "PATH=/b",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=all",
                "ALIYUN_COM_GPU_MEM_IDX=0",
                "CUDA_VERSION=12",
                "CUDA_VERSION=12",
            ])),
            None
        );
    }

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
            [Mount::rw("/run/gpushare/mps/2", "/tmp/nvidia-mps")]
        );
    }

    #[test]
    fn the_limiter_is_mounted_read_only_but_its_region() {
        let mut adj = Adjustment::default();
        add_limiter(
            &mut adj,
            &LimiterFiles {
                library: "/opt/lib.so".into(),
                preload: "/run/g/preload".into(),
                limits: "/run/g/c1/limits.json".into(),
                region: "/run/g/c1/region".into(),
            },
        );
        assert_eq!(
            adj.mounts,
            [
                Mount::ro("/opt/lib.so", "/usr/lib/gpushare/libgpushare_limiter.so"),
                Mount::ro("/run/g/preload", "/etc/ld.so.preload"),
                Mount::ro("/run/g/c1/limits.json", "/etc/gpushare/limits.json"),
                Mount::rw("/run/g/c1/region", "/var/run/gpushare/region"),
            ]
        );
        add_driver_libraries(&mut adj, "/drv/", &["libcuda.so.1"]);
        assert_eq!(
            adj.mounts[4],
            Mount::ro(
                "/drv/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            )
        );
    }

    #[test]
    fn limits_follow_the_assigned_gpus() {
        let req = ContainerRequest {
            gpus: vec![AssignedGpu {
                index: 2,
                uuid: "GPU-00000000-0000-4000-8000-000000000002".into(),
                minor: 2,
                memory_mib: 2048,
                gpu_memory_mib: 15360,
                core_percent: Some(30),
            }],
        };
        let f = limits_file(&req);
        assert_eq!(f.gpus[0].memory_limit_bytes, 2 << 30);
        assert_eq!(LimitsFile::parse(&f.render()).unwrap(), f);
    }

    /// Hardening item 7: MiB → bytes never wraps (a value the request parser cannot produce
    /// saturates rather than turning into a small quota).
    #[test]
    fn bytes_of_a_huge_quota_saturate() {
        let mut req = ContainerRequest {
            gpus: vec![grant(0, u64::MAX / 2, None), grant(1, 1 << 44, None)],
        };
        let f = limits_file(&req);
        assert_eq!(f.gpus[0].memory_limit_bytes, u64::MAX);
        assert_eq!(f.gpus[1].memory_limit_bytes, u64::MAX);
        req.gpus[1].memory_mib = u64::MAX;
        assert_eq!(req.memory_mib(), u64::MAX);
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
    #[test]
    fn a_container_adjusted_for_no_gpu_is_told_from_one_created_unadjusted() {
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(neutralized(&env(&["PATH=/bin"])), "nothing to neutralize");
        for unadjusted in [
            &["NVIDIA_VISIBLE_DEVICES=all"][..],
            &["CUDA_VERSION=12.4.1"],
            &["NVIDIA_VISIBLE_DEVICES=none"],
            &[
                "NVIDIA_VISIBLE_DEVICES=void",
                "NVIDIA_MIG_CONFIG_DEVICES=all",
            ],
            &["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all"],
            &["NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY=/tmp"],
        ] {
            assert!(!neutralized(&env(unadjusted)), "{unadjusted:?}");
        }
        for adjusted in [
            &["NVIDIA_VISIBLE_DEVICES=void"][..],
            &["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=void"],
            // A later NRI plugin's capabilities select no device beside void.
            &[
                "NVIDIA_VISIBLE_DEVICES=void",
                "NVIDIA_DRIVER_CAPABILITIES=all",
            ],
            &[
                "NVIDIA_VISIBLE_DEVICES=void",
                "NVIDIA_DRIVER_CAPABILITIES=",
                "CUDA_MPS_PIPE_DIRECTORY=",
            ],
        ] {
            assert!(neutralized(&env(adjusted)), "{adjusted:?}");
        }
        // What neutralize_non_gpu's adjustment leaves, as NRI applies it (the first copy set,
        // cleared variables set empty), is neutralized.
        let image = env(&[
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "CUDA_VERSION=12.4.1",
        ]);
        let adj = neutralize_non_gpu(&image).unwrap();
        let applied: Vec<String> = image
            .iter()
            .map(|kv| {
                let k = env_key(kv);
                match adj.env.iter().find(|(key, _)| key == k) {
                    Some((key, v)) => format!("{key}={v}"),
                    None if adj.clear_env.iter().any(|c| c == k) => format!("{k}="),
                    None => kv.clone(),
                }
            })
            .collect();
        assert!(neutralized(&applied), "{applied:?}");
    }

    #[test]
    fn a_container_without_a_gpu_gets_no_gpu_from_its_environment() {
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(neutralize_non_gpu(&env(&["PATH=/bin", "HOME=/"])), None);
        let adj = neutralize_non_gpu(&env(&[
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "NVIDIA_MIG_CONFIG_DEVICES=all",
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/mps",
            "CUDA_VERSION=12.4.1",
        ]))
        .unwrap();
        assert_eq!(
            adj.env,
            [("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string())]
        );
        assert_eq!(
            adj.clear_env,
            [
                "CUDA_MPS_PIPE_DIRECTORY",
                "NVIDIA_DRIVER_CAPABILITIES",
                "NVIDIA_MIG_CONFIG_DEVICES"
            ]
        );
        assert!(adj.devices.is_empty() && adj.mounts.is_empty());
        // A legacy CUDA image (CUDA_VERSION, no NVIDIA_VISIBLE_DEVICES) gets every GPU from
        // nvidia-container-runtime: it is voided too.
        let adj = neutralize_non_gpu(&env(&["CUDA_VERSION=11.8.0"])).unwrap();
        assert_eq!(adj.env[0].1, "void");
        assert!(adj.clear_env.is_empty());
    }

    #[test]
    fn a_gpu_container_keeps_only_the_selectors_gpushare_sets() {
        let req = ContainerRequest {
            gpus: vec![grant(0, 2048, Some(30))],
        };
        let mut adj = build(&req, &devset(2), &OPTS).unwrap();
        let env: Vec<String> = [
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_MIG_MONITOR_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        strip_foreign_selectors(&mut adj, &env);
        assert_eq!(
            adj.clear_env,
            [
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                "NVIDIA_MIG_MONITOR_DEVICES"
            ]
        );
        // The MPS backend sets its own CUDA_MPS_* variables: those stay.
        let mut adj = build(&req, &devset(2), &OPTS).unwrap();
        add_mps(&mut adj, &req, "/run/mps");
        strip_foreign_selectors(&mut adj, &env);
        assert_eq!(adj.clear_env, ["NVIDIA_MIG_MONITOR_DEVICES"]);
    }
}
