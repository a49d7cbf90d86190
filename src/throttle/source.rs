//! Sample sources: how much of its GPU each container used since the last sample, and how much
//! GPU memory it holds. One trait; `sim` derives both from the container's cgroup and a file
//! the container writes, NVML from the driver.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use super::cgroup::ContainerCgroup;

/// A container the controller tracks.
pub struct Tracked<'a> {
    pub id: &'a str,
    /// Every GPU the container holds.
    pub gpus: &'a [u32],
    /// The container's cgroup (CPU accounting covers its children).
    pub cgroup: &'a ContainerCgroup,
    /// The child the controller freezes, where the workload's processes live.
    pub throttled: &'a ContainerCgroup,
}

impl Tracked<'_> {
    /// Every process of the container, in its cgroup or the throttled child.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = self.cgroup.pids().unwrap_or_default();
        pids.extend(self.throttled.pids().unwrap_or_default());
        pids
    }
}

/// One round of samples.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    /// Share of its GPU, in [0, 1], since the previous sample (a container on several
    /// GPUs: the largest of its per-GPU shares).
    pub share: HashMap<String, f64>,
    /// Share of each GPU a container holds, where the source tells them apart (NVML); a
    /// container missing here used `share` of each of its GPUs.
    pub gpu_share: HashMap<(String, u32), f64>,
    /// GPU memory held, bytes.
    pub memory_bytes: HashMap<String, u64>,
    /// Host PIDs holding GPU memory, per container (the targets of the `kill` action).
    pub memory_pids: HashMap<String, Vec<u32>>,
}

pub trait SampleSource: Send {
    fn sample(&mut self, tracked: &[Tracked<'_>]) -> Sample;
    /// Whether a sample costs something per container tracked (sim: a read of its cgroup's
    /// CPU time) and covers the time since that container's own last sample, so that idle
    /// containers may be sampled every other period. NVML reads each GPU once, whatever the
    /// containers: every container is sampled every period.
    fn per_container(&self) -> bool {
        false
    }
}

/// Name of the file, in the directory the agent mounts into each sim container at
/// [`SIM_CONTAINER_DIR`], where the workload declares the GPU memory it uses (bytes).
pub const SIM_MEMORY_FILE: &str = "gpu-memory-bytes";
/// Where a sim container sees its declaration directory.
pub const SIM_CONTAINER_DIR: &str = "/var/run/gpushare";

/// Simulated GPUs: each sim GPU is one CPU core the agent pins its containers to, so a
/// container's share of the GPU is the share of that core its cgroup consumed; its GPU memory
/// is what it declares in `<state_dir>/<container id>/gpu-memory-bytes`.
pub struct SimSource {
    state_dir: PathBuf,
    last: HashMap<String, (u64, Instant)>,
    /// Each tracked container's CPU accounting file, kept open and read with `pread` (one
    /// syscall a sample instead of an open, a read and a close), with the cgroup directory
    /// it was opened in (a container's cgroup never moves, but its id could be reused).
    usage: HashMap<String, (PathBuf, std::fs::File)>,
    /// Samples taken: memory declarations are read every [`DECLARATION_EVERY`] samples.
    samples: u64,
}

/// Samples between two reads of the sim memory declarations (at the 100 ms period, once a
/// second: memory is the limiter's to enforce, this is the backstop).
const DECLARATION_EVERY: u64 = 10;

/// Reads a cgroupfs file from its start through an open handle into `buf`.
fn pread_str<'b>(file: &std::fs::File, buf: &'b mut [u8]) -> std::io::Result<&'b str> {
    use std::os::unix::fs::FileExt;
    let n = file.read_at(buf, 0)?;
    std::str::from_utf8(&buf[..n])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

impl SimSource {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        SimSource {
            state_dir: state_dir.into(),
            last: HashMap::new(),
            usage: HashMap::new(),
            samples: 0,
        }
    }

    /// Host directory mounted into container `id` (created by the agent at CreateContainer).
    pub fn container_dir(state_dir: &std::path::Path, id: &str) -> PathBuf {
        state_dir.join(id)
    }
}

/// Reads a sim memory declaration: a decimal number of bytes. The container writes the
/// file, so it is opened without following symlinks (a link to `/dev/zero` or a host file
/// is ignored), only a regular file is read, and at most 32 bytes of it.
pub fn read_declaration(path: &std::path::Path) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::with_capacity(32);
    file.take(32).read_to_end(&mut buf).ok()?;
    std::str::from_utf8(&buf).ok()?.trim().parse().ok()
}

impl SimSource {
    /// The container's CPU time, through its kept-open accounting file (opened on first use,
    /// dropped and opened again when a read fails).
    fn cpu_usage(&mut self, t: &Tracked<'_>) -> Option<u64> {
        let dir = t.cgroup.cpu_dir();
        let fresh = match self.usage.get(t.id) {
            Some((d, _)) if d.as_os_str() == dir.as_os_str() => false,
            _ => {
                let (_, path) = t.cgroup.cpu_usage_file();
                let file = std::fs::File::open(&path).ok()?;
                self.usage
                    .insert(t.id.to_string(), (dir.to_path_buf(), file));
                true
            }
        };
        let mut buf = [0u8; 1024];
        match pread_str(&self.usage[t.id].1, &mut buf) {
            Ok(data) => t.cgroup.cpu_usage_from(data),
            Err(_) => {
                self.usage.remove(t.id);
                if fresh { None } else { self.cpu_usage(t) }
            }
        }
    }
}

impl SampleSource for SimSource {
    fn per_container(&self) -> bool {
        true
    }

    fn sample(&mut self, tracked: &[Tracked<'_>]) -> Sample {
        let now = Instant::now();
        let mut out = Sample::default();
        let declarations = self.samples.is_multiple_of(DECLARATION_EVERY);
        self.samples += 1;
        if declarations {
            // Containers not sampled this round keep their baseline; forget long-gone ones
            // (not sampled for 30 s) and close their files, every few samples.
            self.last
                .retain(|_, (_, at)| now.duration_since(*at) < std::time::Duration::from_secs(30));
            let last = &self.last;
            self.usage.retain(|id, _| last.contains_key(id));
        }
        for t in tracked {
            let Some(cpu) = self.cpu_usage(t) else {
                continue;
            };
            match self.last.get_mut(t.id) {
                Some((prev_cpu, prev_at)) => {
                    let wall = now.duration_since(*prev_at).as_nanos() as f64;
                    if wall > 0.0 {
                        let share = cpu.saturating_sub(*prev_cpu) as f64 / wall;
                        out.share.insert(t.id.to_string(), share.clamp(0.0, 1.0));
                    }
                    (*prev_cpu, *prev_at) = (cpu, now);
                }
                None => {
                    self.last.insert(t.id.to_string(), (cpu, now));
                }
            }
            if !declarations {
                continue;
            }
            let file = Self::container_dir(&self.state_dir, t.id).join(SIM_MEMORY_FILE);
            if let Some(bytes) = read_declaration(&file) {
                out.memory_bytes.insert(t.id.to_string(), bytes);
                if bytes > 0 {
                    out.memory_pids.insert(t.id.to_string(), t.pids());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::read_declaration;

    #[test]
    fn a_declaration_is_a_small_regular_file_not_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("gpu-memory-bytes");
        std::fs::write(&f, "1048576\n").unwrap();
        assert_eq!(read_declaration(&f), Some(1 << 20));
        // A symlink to a device that never ends, or to a host file: ignored, at once.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert_eq!(read_declaration(&link), None);
        let host = dir.path().join("host");
        std::fs::write(&host, "42").unwrap();
        std::os::unix::fs::symlink(&host, dir.path().join("hostlink")).unwrap();
        assert_eq!(read_declaration(&dir.path().join("hostlink")), None);
        // A FIFO nobody writes: not a regular file, no wait.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(read_declaration(&fifo), None);
        // A huge file: only its first 32 bytes are read (and they are not a number).
        std::fs::write(&f, "1".repeat(1 << 20)).unwrap();
        assert_eq!(read_declaration(&f), None);
    }
}
