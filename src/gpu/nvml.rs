//! The NVML backend: GPU inventory and per-process samples from the driver's
//! `libnvidia-ml.so.1` (loaded at run time, so the agent builds and runs without it).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::throttle::cgroup::{CgroupFs, CgroupVersion};
use crate::throttle::pidmap::PidMap;
use crate::throttle::source::{Sample, SampleSource, Tracked};
use gpushare_core::inventory::GpuInfo;

/// Why NVML could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("nvml_library {library}: cannot initialize NVML: {source}")]
    Init {
        library: PathBuf,
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML: cannot read the GPU inventory: {0}")]
    Inventory(#[from] nvml_wrapper::error::NvmlError),
}

/// Opens NVML from `library` (a file name searched by the dynamic loader, or a path).
pub fn open(library: &Path) -> Result<Nvml, NvmlError> {
    Nvml::builder()
        .lib_path(OsStr::new(library))
        .init()
        .map_err(|source| NvmlError::Init {
            library: library.to_path_buf(),
            source,
        })
}

/// Every GPU NVML reports.
pub fn inventory(nvml: &Nvml) -> Result<Vec<GpuInfo>, NvmlError> {
    let n = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(n as usize);
    for index in 0..n {
        let d = nvml.device_by_index(index)?;
        gpus.push(GpuInfo {
            index,
            uuid: d.uuid()?,
            model: d.name()?,
            memory_mib: d.memory_info()?.total >> 20,
            minor: d.minor_number()?,
        });
    }
    Ok(gpus)
}

/// One process's samples on one GPU since the last round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    pub pid: u32,
    /// The GPU the sample was taken on.
    pub gpu: u32,
    /// SM utilization in percent over the driver's sample interval.
    pub sm_util: u32,
}

/// Aggregates per-process samples into per-container shares and memory: a process's share
/// is the mean of its samples; a container's is the sum over its processes.
pub fn aggregate(
    util: &[ProcessSample],
    memory: &[(u32, u64)],
    container_of: &mut dyn FnMut(u32) -> Option<String>,
) -> Sample {
    let mut per_pid: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
    for s in util {
        let e = per_pid.entry((s.pid, s.gpu)).or_default();
        e.0 += s.sm_util as u64;
        e.1 += 1;
    }
    let mut out = Sample::default();
    for ((pid, gpu), (sum, n)) in per_pid {
        if let Some(c) = container_of(pid) {
            *out.gpu_share.entry((c, gpu)).or_default() += sum as f64 / n as f64 / 100.0;
        }
    }
    for ((c, _), v) in out.gpu_share.iter_mut() {
        *v = v.clamp(0.0, 1.0);
        let s = out.share.entry(c.clone()).or_default();
        *s = s.max(*v);
    }
    for &(pid, bytes) in memory {
        if let Some(c) = container_of(pid) {
            *out.memory_bytes.entry(c.clone()).or_default() += bytes;
            out.memory_pids.entry(c).or_default().push(pid);
        }
    }
    out
}

/// Samples from NVML: `process_utilization_stats` since the last timestamp per GPU, and
/// `running_compute_processes` for memory; PIDs mapped to containers through
/// `/proc/PID/cgroup`.
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    pidmap: PidMap,
    last_ts: HashMap<u32, u64>,
    known: HashSet<String>,
}

impl NvmlSource {
    pub fn new(nvml: Arc<Nvml>, proc_root: PathBuf, version: CgroupVersion) -> Self {
        NvmlSource {
            nvml,
            pidmap: PidMap::new(proc_root, version),
            last_ts: HashMap::new(),
            known: HashSet::new(),
        }
    }
}

impl SampleSource for NvmlSource {
    fn sample(&mut self, tracked: &[Tracked<'_>]) -> Sample {
        // PID → container: by the container's cgroup path (processes in the throttled child
        // are below it, so they map too).
        let containers: HashMap<PathBuf, String> = tracked
            .iter()
            .filter_map(|t| {
                CgroupFs::relative_path(&t.cgroup.relative().to_string_lossy())
                    .ok()
                    .map(|p| (p, t.id.to_string()))
            })
            .collect();
        let ids: HashSet<String> = containers.values().cloned().collect();
        if ids != self.known {
            self.pidmap.invalidate();
            self.known = ids;
        }
        let gpus: HashSet<u32> = tracked
            .iter()
            .flat_map(|t| t.gpus.iter().copied())
            .collect();
        let mut util = vec![];
        let mut memory = vec![];
        for gpu in gpus {
            let Ok(dev) = self.nvml.device_by_index(gpu) else {
                tracing::warn!(gpu, "NVML: device not found");
                continue;
            };
            let since = self.last_ts.get(&gpu).copied();
            match dev.process_utilization_stats(since) {
                Ok(samples) => {
                    if let Some(ts) = samples.iter().map(|s| s.timestamp).max() {
                        self.last_ts.insert(gpu, ts);
                    }
                    util.extend(samples.iter().map(|s| ProcessSample {
                        pid: s.pid,
                        gpu,
                        sm_util: s.sm_util,
                    }));
                }
                Err(e) => tracing::debug!(gpu, error = %e, "NVML: no process utilization"),
            }
            if let Ok(procs) = dev.running_compute_processes() {
                memory.extend(procs.iter().filter_map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some((p.pid, b)),
                    UsedGpuMemory::Unavailable => None,
                }));
            }
        }
        let live: HashSet<u32> = util
            .iter()
            .map(|s| s.pid)
            .chain(memory.iter().map(|m| m.0))
            .collect();
        self.pidmap.retain(&live);
        let pidmap = &mut self.pidmap;
        aggregate(&util, &memory, &mut |pid| {
            pidmap.container_of(pid, &containers)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, gpu: u32, sm_util: u32) -> ProcessSample {
        ProcessSample { pid, gpu, sm_util }
    }

    #[test]
    fn aggregates_processes_into_containers() {
        let util = [
            sample(10, 0, 20),
            sample(10, 0, 40),
            sample(11, 0, 10),
            sample(99, 0, 90),
        ];
        let memory = [(10, 1 << 30), (11, 1 << 29), (99, 1 << 20)];
        let mut map = |pid: u32| match pid {
            10 | 11 => Some("a".to_string()),
            _ => None,
        };
        let s = aggregate(&util, &memory, &mut map);
        assert!((s.share["a"] - 0.4).abs() < 1e-9, "{s:?}");
        assert_eq!(s.memory_bytes["a"], (1 << 30) + (1 << 29));
        let mut pids = s.memory_pids["a"].clone();
        pids.sort();
        assert_eq!(pids, [10, 11]);
        assert_eq!(s.share.len(), 1, "processes outside containers are ignored");
    }

    #[test]
    fn a_container_on_two_gpus_gets_a_share_of_each() {
        let util = [sample(10, 0, 20), sample(10, 1, 60), sample(11, 1, 10)];
        let mut map = |pid: u32| (pid < 20).then(|| "a".to_string());
        let s = aggregate(&util, &[], &mut map);
        assert!(
            (s.gpu_share[&("a".to_string(), 0)] - 0.2).abs() < 1e-9,
            "{s:?}"
        );
        assert!(
            (s.gpu_share[&("a".to_string(), 1)] - 0.7).abs() < 1e-9,
            "{s:?}"
        );
        assert!(
            (s.share["a"] - 0.7).abs() < 1e-9,
            "the larger of the two: {s:?}"
        );
    }

    #[test]
    fn missing_library_names_it() {
        let e = open(Path::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
    }
}
