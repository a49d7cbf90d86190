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
        // GPUs NVML sampled this period: some process's utilization came back, so a
        // container that had none there used none. (No samples at all, NVML's NotFound, may
        // only mean its sampling interval did not end within the period: nothing is known.)
        let mut sampled: HashSet<u32> = HashSet::new();
        for gpu in gpus {
            let Ok(dev) = self.nvml.device_by_index(gpu) else {
                tracing::warn!(gpu, "NVML: device not found");
                continue;
            };
            let since = self.last_ts.get(&gpu).copied();
            match dev.process_utilization_stats(since) {
                Ok(samples) => {
                    if !samples.is_empty() {
                        sampled.insert(gpu);
                    }
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
        let mut sample = aggregate(&util, &memory, &mut |pid| {
            pidmap.container_of(pid, &containers)
        });
        idle_where_sampled(
            &mut sample,
            tracked.iter().map(|t| (t.id, t.gpus)),
            &sampled,
        );
        sample
    }
}

/// NVML reports only processes that used a GPU: a tracked container none of whose
/// processes did, on GPUs NVML sampled (`sampled`: others' processes came back), used 0 of
/// them. Without this it would never be measured, so the control law would never see it idle
/// (it kept its first window, at least `fresh_window`, and under `burst` the others could not
/// take its unused time). A container with a GPU not sampled stays unmeasured (state kept).
pub fn idle_where_sampled<'a>(
    sample: &mut Sample,
    tracked: impl IntoIterator<Item = (&'a str, &'a [u32])>,
    sampled: &HashSet<u32>,
) {
    for (id, gpus) in tracked {
        if gpus.is_empty() || !gpus.iter().all(|g| sampled.contains(g)) {
            continue;
        }
        for &g in gpus {
            sample.gpu_share.entry((id.to_string(), g)).or_insert(0.0);
        }
        sample.share.entry(id.to_string()).or_insert(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, gpu: u32, sm_util: u32) -> ProcessSample {
        ProcessSample { pid, gpu, sm_util }
    }

    /// A tracked container with no process in NVML's report of a sampled GPU used none of
    /// it; on a GPU whose utilization is unknown it stays unmeasured; a measured one keeps
    /// its share. And what that does: under `burst`, the busy neighbour of a container that
    /// runs nothing on the GPU gets the whole period once the quiet one counts as idle,
    /// which it never did unmeasured.
    #[test]
    fn containers_nvml_does_not_list_are_idle_on_sampled_gpus() {
        use gpushare_core::control::{ComputePolicy, GpuLoop, Member, Params};
        let mut sample = Sample::default();
        sample.share.insert("busy".into(), 0.7);
        sample.gpu_share.insert(("busy".into(), 0), 0.7);
        let (g0, g1, both): (&[u32], &[u32], &[u32]) = (&[0], &[1], &[0, 1]);
        idle_where_sampled(
            &mut sample,
            [
                ("busy", g0),
                ("quiet", g0),
                ("unknown", g1),
                ("split", both),
            ],
            &HashSet::from([0]),
        );
        assert_eq!(sample.share.get("busy"), Some(&0.7));
        assert_eq!(sample.share.get("quiet"), Some(&0.0));
        assert_eq!(sample.gpu_share.get(&("quiet".to_string(), 0)), Some(&0.0));
        assert_eq!(sample.share.get("unknown"), None);
        assert_eq!(sample.share.get("split"), None, "one of its GPUs unknown");

        let params = Params {
            policy: ComputePolicy::Burst,
            ..Params::default()
        };
        let run = |measure_quiet: bool| {
            let mut lp = GpuLoop::new(params);
            lp.set_members(&[
                Member {
                    id: "busy".into(),
                    quota: Some(0.5),
                },
                Member {
                    id: "quiet".into(),
                    quota: Some(0.5),
                },
            ]);
            for _ in 0..20 {
                lp.step_by(|id| match id {
                    "busy" => Some((1.0, 1.0)),
                    _ => measure_quiet.then_some((0.0, 1.0)),
                });
            }
            let plan = lp.plan();
            plan.windows["busy"]
                .iter()
                .map(|w| w.end - w.start)
                .sum::<f64>()
        };
        let (unmeasured, measured) = (run(false), run(true));
        assert!(
            unmeasured < 0.9,
            "unmeasured: the quiet one keeps its window ({unmeasured})"
        );
        assert!(
            measured > 0.99,
            "measured idle: the busy one gets the period ({measured})"
        );
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
