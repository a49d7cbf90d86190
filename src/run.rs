//! `gpushare run`: one command under a GPU quota on this machine, without Kubernetes.
//!
//! The command gets its own cgroup (`gpushare-run-<pid>`: v1 in the freezer and CPU
//! accounting hierarchies, v2 one directory), joined before `exec`, and is registered like a
//! container with the node agent's registry, controller and sample source, so it is held by
//! the production code: the same control law, the same freezer, the same memory action, the
//! guardian (a SIGKILLed `gpushare run` leaves nothing frozen). Where no cgroup freezer is
//! writable the controller holds it by `SIGSTOP`/`SIGCONT` instead
//! ([`crate::throttle::freezer`]).
//!
//! Flag validation is pure ([`RunRequest::validate`]); everything else is the IO around it.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{GpuBackend, NodeConfig};
use crate::gpu::{Backend, BackendError};
use crate::registry::{ContainerRecord, ContainerState, Registry};
use crate::throttle::cgroup::{CgroupError, CgroupFs, CgroupVersion, ContainerCgroup};
use crate::throttle::controller::{ControllerError, GuardianLaunch, start_with};
use crate::throttle::freezer::FreezerMode;
use crate::throttle::source::SimSource;
use gpushare_core::control::ComputePolicy;
use gpushare_core::inventory::Inventory;
use gpushare_core::request::{AssignedGpu, RequestError, parse_memory_mib, validate_core_percent};

/// Environment variable naming the run's sim directory, where the command may declare the
/// GPU memory it uses in `gpu-memory-bytes` (what a sim container sees at
/// `/var/run/gpushare`).
pub const SIM_DIR_ENV: &str = "GPUSHARE_SIM_DIR";

/// Errors of `gpushare run`; each names the flag, path or command concerned.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("--gpu {gpu} does not exist on this node ({available})")]
    NoSuchGpu { gpu: u32, available: String },
    #[error("--memory {value} exceeds the memory of GPU {gpu} ({gpu_mib} MiB)")]
    MemoryExceeds {
        value: String,
        gpu: u32,
        gpu_mib: u64,
    },
    #[error("no command given (put it after --)")]
    NoCommand,
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("cannot create {path}: {err}")]
    StateDir { path: PathBuf, err: io::Error },
    #[error(transparent)]
    Controller(#[from] ControllerError),
    #[error("cannot start {command:?}: {err}")]
    Spawn { command: String, err: io::Error },
    #[error("waiting for {command:?}: {err}")]
    Wait { command: String, err: io::Error },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(
        "limiter.library {} is not installed (give --limiter-library, or --no-limiter to run without the in-container limiter)",
        path.display()
    )]
    LimiterLibrary { path: PathBuf },
}

/// The validated flags: one GPU, its memory quota and (optionally) its compute quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunRequest {
    pub gpu: u32,
    pub memory_mib: u64,
    pub core_percent: Option<u32>,
}

impl RunRequest {
    /// What the command gets of GPU `info`, as a container's assignment would say it (for the
    /// controller's registry and the limiter's limits).
    pub fn assigned(&self, info: &gpushare_core::inventory::GpuInfo) -> AssignedGpu {
        AssignedGpu {
            index: info.index,
            uuid: info.uuid.clone(),
            minor: info.minor,
            memory_mib: self.memory_mib,
            gpu_memory_mib: info.memory_mib,
            core_percent: self.core_percent,
        }
    }

    /// Checks `--gpu`, `--memory` and `--core` against `inventory`; errors name the flag and
    /// the value (`--core 33 is not a multiple of 5`).
    pub fn validate(
        gpu: u32,
        memory: &str,
        core: Option<i64>,
        inventory: &Inventory,
    ) -> Result<RunRequest, RunError> {
        let core_percent = core
            .map(|c| validate_core_percent("--core", c))
            .transpose()?;
        let memory_mib = parse_memory_mib("--memory", memory)?;
        let info = inventory.get(gpu).ok_or_else(|| RunError::NoSuchGpu {
            gpu,
            available: inventory.describe(),
        })?;
        if memory_mib > info.memory_mib {
            return Err(RunError::MemoryExceeds {
                value: memory.trim().to_string(),
                gpu,
                gpu_mib: info.memory_mib,
            });
        }
        Ok(RunRequest {
            gpu,
            memory_mib,
            core_percent,
        })
    }
}

/// How the quota was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HeldBy {
    /// The cgroup freezer (v1 `freezer.state`, v2 `cgroup.freeze`).
    Freezer,
    /// `SIGSTOP`/`SIGCONT` of the process tree (no writable cgroup freezer).
    Signals,
}

/// What `gpushare run` prints at exit (`--json`: this object).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub command: Vec<String>,
    pub backend: GpuBackend,
    pub gpu: u32,
    pub policy: ComputePolicy,
    /// Compute quota, percent of the GPU (none: memory quota only).
    pub quota_core_percent: Option<u32>,
    pub quota_memory_mib: u64,
    /// Mean share of the GPU over the run, percent, from the controller's per-period
    /// samples; none when nothing could be measured (no cgroup with the sim backend).
    pub achieved_percent: Option<f64>,
    pub peak_memory_mib: f64,
    pub run_seconds: f64,
    pub held_by: HeldBy,
    /// Why the signal fallback holds it, when it does.
    pub fallback_reason: Option<String>,
    pub freezes: u64,
    pub throttled_seconds: f64,
    /// The cgroup the command ran in (removed at exit).
    pub cgroup: Option<PathBuf>,
    /// The command's exit status: its code, or 128 + the signal that killed it.
    pub exit_status: i32,
    pub signal: Option<i32>,
}

/// The exit status a shell would report: the code, or 128 + the signal.
pub fn exit_status_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// The limiter's view for the command, set up in the child between fork and exec: a private
/// mount namespace in which the run's limits and region sit where the shipped library reads
/// them (`/etc/gpushare/limits.json`, `/var/run/gpushare/region`); nothing else on the host
/// sees them. Paths are computed before the fork.
pub struct LimiterMounts {
    /// `(source directory, target directory)` bind mounts.
    binds: Vec<(CString, CString)>,
}

impl LimiterMounts {
    /// In the child: unshare the mount namespace, keep our mounts private, bind. Only
    /// async-signal-safe system calls.
    ///
    /// # Safety
    /// Call only between fork and exec.
    unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated paths built before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for (source, target) in &self.binds {
                if libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// Injects the in-container limiter into the command: `LD_PRELOAD=<library>` (the operator
/// runs `gpushare run`, so its environment is trusted here, unlike a pod's) and the run's
/// limits (`request` on `gpu`) and a fresh region under `state_dir`, mounted where the
/// library reads them by [`LimiterMounts`].
pub fn inject_limiter(
    cmd: &mut Command,
    library: &Path,
    request: &RunRequest,
    gpu: &gpushare_core::inventory::GpuInfo,
    state_dir: &Path,
) -> Result<LimiterMounts, RunError> {
    use gpushare_core::limiter::{LIMITS_PATH, REGION_PATH, region_image};
    if !library.is_file() {
        return Err(RunError::LimiterLibrary {
            path: library.to_path_buf(),
        });
    }
    let limits = gpushare_core::adjust::limits_file(&gpushare_core::request::ContainerRequest {
        gpus: vec![request.assigned(gpu)],
    });
    let mut binds = vec![];
    for (target, content) in [
        (LIMITS_PATH, limits.render().into_bytes()),
        (REGION_PATH, region_image()),
    ] {
        let target = Path::new(target);
        let (dir, file) = (
            target.parent().expect("absolute path"),
            target.file_name().expect("file path"),
        );
        let source = state_dir
            .join("limiter")
            .join(dir.strip_prefix("/").unwrap_or(dir));
        let write = std::fs::create_dir_all(&source)
            .and_then(|_| std::fs::write(source.join(file), &content))
            .and_then(|_| std::fs::create_dir_all(dir));
        write.map_err(|err| RunError::StateDir {
            path: source.clone(),
            err,
        })?;
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL");
        binds.push((c(&source), c(dir)));
    }
    cmd.env("LD_PRELOAD", library);
    Ok(LimiterMounts { binds })
}

/// What is set up before the command starts; torn down by [`Prepared::cleanup`].
struct Prepared {
    fs: CgroupFs,
    cgroup: Option<ContainerCgroup>,
    held_by: HeldBy,
    fallback_reason: Option<String>,
    state_dir: PathBuf,
}

impl Prepared {
    /// Creates the run's cgroup and decides how it is held. Never fails: where no cgroup
    /// can be created the process tree is held by signals.
    fn cgroup(root: &Path, name: &str, state_dir: PathBuf) -> Prepared {
        let (fs, created) = match CgroupFs::detect_layout(root) {
            Ok(fs) => {
                let created = fs.create_run_cgroup(name);
                (fs, created)
            }
            // The controller still needs a layout; nothing exists under it, so the run is
            // held through its process tree.
            Err(e) => (CgroupFs::new(root, CgroupVersion::V2), Err(e)),
        };
        match created {
            Ok(cg) if cg.can_freeze() => Prepared {
                fs,
                cgroup: Some(cg),
                held_by: HeldBy::Freezer,
                fallback_reason: None,
                state_dir,
            },
            Ok(cg) => Prepared {
                fallback_reason: Some(format!(
                    "no cgroup freezer in {}",
                    cg.freezer_dir().display()
                )),
                fs,
                cgroup: Some(cg),
                held_by: HeldBy::Signals,
                state_dir,
            },
            Err(e) => Prepared {
                fs,
                cgroup: None,
                held_by: HeldBy::Signals,
                fallback_reason: Some(format!("no cgroup for the command: {e}")),
                state_dir,
            },
        }
    }

    /// Kills what the command left in its cgroup, removes the cgroup and the state
    /// directory (sim directory, guardian list). Errors are reported, not fatal.
    fn cleanup(&self) {
        if let Some(cg) = &self.cgroup {
            for dir in [cg.clone(), cg.throttled_child()] {
                for pid in dir.pids().unwrap_or_default() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            if let Err(e) = cg.remove(Duration::from_secs(3)) {
                eprintln!("gpushare run: {e}");
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.state_dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            eprintln!(
                "gpushare run: cannot remove {}: {e}",
                self.state_dir.display()
            );
        }
    }
}

/// The signal `gpushare run` received last (forwarded to the command), 0 if none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP are caught (handlers, reset by `exec` in the child) and
/// forwarded to the command, so that `gpushare run` outlives it and cleans up.
fn catch_signals() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(record_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// Decimal digits of `n` into `buf`; the number of bytes (no allocation: runs after fork).
fn decimal(mut n: u32, buf: &mut [u8; 12]) -> usize {
    let mut tmp = [0u8; 12];
    let mut len = 0;
    loop {
        tmp[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = tmp[len - 1 - i];
    }
    len
}

/// Runs `argv` under `request` on the machine described by `cfg` (policy `policy`), with the
/// guardian `guardian_exe` (our own binary) watching; returns the report once the command
/// has exited and everything is torn down. `on_fallback` is told why, when the signal
/// fallback holds the command.
pub fn run(
    cfg: &NodeConfig,
    backend: Backend,
    request: &RunRequest,
    policy: ComputePolicy,
    argv: &[OsString],
    guardian_exe: Option<&Path>,
    on_fallback: impl FnOnce(&str),
) -> Result<RunReport, RunError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(RunError::NoCommand);
    };
    let command: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let name = format!("gpushare-run-{}", std::process::id());
    let mut throttle = cfg.throttle_config();
    throttle.policy = policy;
    // Our own state directory: never the agent's guardian list or sim directories.
    throttle.state_dir = cfg.throttle.state_dir.join(&name);
    let info = backend
        .inventory
        .get(request.gpu)
        .cloned()
        .ok_or_else(|| RunError::NoSuchGpu {
            gpu: request.gpu,
            available: backend.inventory.describe(),
        })?;

    let prepared = Prepared::cgroup(&throttle.cgroup_root, &name, throttle.state_dir.clone());
    if let Some(reason) = &prepared.fallback_reason {
        on_fallback(reason);
    }
    let result = run_prepared(
        &prepared,
        &throttle,
        backend,
        &info,
        request,
        argv,
        program,
        args,
        &name,
        guardian_exe,
        cfg.limiter.enabled.then_some(cfg.limiter.library.as_path()),
    );
    prepared.cleanup();
    let (status, stats, run_seconds) = result?;
    Ok(RunReport {
        command,
        backend: cfg.gpu_backend,
        gpu: request.gpu,
        policy,
        quota_core_percent: request.core_percent,
        quota_memory_mib: request.memory_mib,
        achieved_percent: stats.achieved().map(|s| s * 100.0),
        peak_memory_mib: stats.peak_memory_bytes as f64 / (1u64 << 20) as f64,
        run_seconds,
        held_by: prepared.held_by,
        fallback_reason: prepared.fallback_reason.clone(),
        freezes: stats.freezes,
        throttled_seconds: stats.throttled_seconds,
        cgroup: prepared
            .cgroup
            .as_ref()
            .map(|c| c.freezer_dir().to_path_buf()),
        exit_status: exit_status_code(status),
        signal: status.signal(),
    })
}

/// What the run's polls of the controller's stats gathered.
#[derive(Debug, Default)]
struct Observed {
    /// Utilization per poll, from the first measured one on.
    shares: Vec<f64>,
    peak_memory_bytes: u64,
    freezes: u64,
    throttled_seconds: f64,
}

impl Observed {
    fn achieved(&self) -> Option<f64> {
        (!self.shares.is_empty())
            .then(|| self.shares.iter().sum::<f64>() / self.shares.len() as f64)
    }
}

#[allow(clippy::too_many_arguments)]
fn run_prepared(
    prepared: &Prepared,
    throttle: &crate::throttle::controller::ThrottleConfig,
    backend: Backend,
    info: &gpushare_core::inventory::GpuInfo,
    request: &RunRequest,
    argv: &[OsString],
    program: &OsString,
    args: &[OsString],
    name: &str,
    guardian_exe: Option<&Path>,
    limiter: Option<&Path>,
) -> Result<(ExitStatus, Observed, f64), RunError> {
    let command_name = program.to_string_lossy().into_owned();
    let sim_dir = SimSource::container_dir(&throttle.state_dir.join("sim"), name);
    let mut cmd = Command::new(program);
    cmd.args(args);
    let mut pin = None;
    if backend.kind == GpuBackend::Sim {
        std::fs::create_dir_all(&sim_dir).map_err(|err| RunError::StateDir {
            path: sim_dir.clone(),
            err,
        })?;
        cmd.env(SIM_DIR_ENV, &sim_dir);
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        pin = Some(gpushare_core::adjust::sim_cpu(request.gpu, ncpu));
    }
    let limiter = match limiter {
        Some(library) => Some(inject_limiter(
            &mut cmd,
            library,
            request,
            info,
            &throttle.state_dir,
        )?),
        None => None,
    };

    let registry = Arc::new(Registry::new());
    let mode = match prepared.held_by {
        HeldBy::Freezer => FreezerMode::Cgroup,
        HeldBy::Signals => FreezerMode::Signals {
            proc_root: PathBuf::from("/proc"),
        },
    };
    let controller = start_with(
        throttle,
        prepared.fs.clone(),
        mode,
        registry.clone(),
        backend.source,
        guardian_exe.map(|exe| GuardianLaunch {
            exe,
            leave_cgroup: None,
        }),
    )?;

    // Joined in the child between fork and exec: only async-signal-safe calls on paths
    // computed here.
    let join: Vec<CString> = prepared
        .cgroup
        .iter()
        .flat_map(ContainerCgroup::procs_files)
        .map(|p| CString::new(p.as_os_str().as_bytes()).expect("cgroupfs paths have no NUL"))
        .collect();
    // SAFETY: the closure calls only async-signal-safe functions (sched_setaffinity, unshare,
    // mount, getpid, open, write, close) and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(cpu) = pin {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(mounts) = &limiter {
                mounts.enter()?;
            }
            let mut buf = [0u8; 12];
            let len = decimal(libc::getpid() as u32, &mut buf);
            for path in &join {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, buf.as_ptr().cast(), len);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if written < 0 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    catch_signals();
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(err) => {
            controller.stop();
            return Err(RunError::Spawn {
                command: argv
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                err,
            });
        }
    };
    registry.upsert(ContainerRecord {
        id: name.to_string(),
        pod_namespace: "local".into(),
        pod_name: name.to_string(),
        pod_uid: String::new(),
        container_name: command_name.clone(),
        cgroups_path: format!("/{name}"),
        pid: child.id(),
        state: ContainerState::Running,
        gpus: vec![request.assigned(info)],
    });

    let poll = Duration::from_millis(throttle.period_ms.max(10));
    let mut observed = Observed::default();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(err) => break Err(err),
        }
        let sig = RECEIVED.swap(0, Ordering::Relaxed);
        if sig != 0 {
            // Delivered once the controller lets it run (within a period).
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        if let Some(s) = controller
            .stats
            .containers
            .lock()
            .expect("stats lock")
            .get(name)
        {
            if s.utilization > 0.0 || !observed.shares.is_empty() {
                observed.shares.push(s.utilization);
            }
            observed.peak_memory_bytes = observed.peak_memory_bytes.max(s.memory_used_bytes);
            observed.freezes = s.freezes;
            observed.throttled_seconds = s.throttled_seconds;
        }
        std::thread::sleep(poll);
    };
    let run_seconds = started.elapsed().as_secs_f64();
    registry.remove(name);
    controller.stop();
    let status = status.map_err(|err| RunError::Wait {
        command: command_name,
        err,
    })?;
    Ok((status, observed, run_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::inventory::{SimConfig, sim_inventory};

    fn inventory() -> Inventory {
        Inventory::new(sim_inventory(&SimConfig::default(), "node"))
    }

    #[test]
    fn flags_are_validated_and_errors_name_flag_and_value() {
        let inv = inventory();
        assert_eq!(inv.describe(), "4 GPUs: 0-3");
        let ok = RunRequest::validate(0, "2GiB", Some(30), &inv).unwrap();
        assert_eq!(
            ok,
            RunRequest {
                gpu: 0,
                memory_mib: 2048,
                core_percent: Some(30)
            }
        );
        assert_eq!(
            RunRequest::validate(3, "2048MiB", None, &inv).unwrap(),
            RunRequest {
                gpu: 3,
                memory_mib: 2048,
                core_percent: None
            }
        );
        let err = |gpu, mem, core| {
            RunRequest::validate(gpu, mem, core, &inv)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(err(0, "2GiB", Some(33)), "--core 33 is not a multiple of 5");
        assert_eq!(err(0, "2GiB", Some(0)), "--core 0 is not in [5, 100]");
        assert_eq!(err(0, "2GiB", Some(105)), "--core 105 is not in [5, 100]");
        assert_eq!(
            err(7, "2GiB", Some(30)),
            "--gpu 7 does not exist on this node (4 GPUs: 0-3)"
        );
        assert_eq!(
            err(0, "20GiB", Some(30)),
            "--memory 20GiB exceeds the memory of GPU 0 (15360 MiB)"
        );
        assert_eq!(
            err(0, "2GB", Some(30)),
            "--memory \"2GB\" is not a memory size like 2GiB or 2048MiB"
        );
        assert_eq!(err(0, "0MiB", None), "--memory 0 must be positive");
    }

    #[test]
    fn exit_status_is_the_code_or_128_plus_the_signal() {
        assert_eq!(exit_status_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_status_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_status_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_status_code(ExitStatus::from_raw(15)), 143);
    }

    #[test]
    fn decimal_writes_digits_without_allocating() {
        let mut buf = [0u8; 12];
        for n in [0u32, 7, 10, 4242, u32::MAX] {
            let len = decimal(n, &mut buf);
            assert_eq!(&buf[..len], n.to_string().as_bytes());
        }
    }

    #[test]
    fn observed_mean_starts_at_the_first_measurement() {
        let o = Observed::default();
        assert_eq!(o.achieved(), None);
        let o = Observed {
            shares: vec![0.2, 0.4],
            ..Default::default()
        };
        assert!((o.achieved().unwrap() - 0.3).abs() < 1e-12);
    }
}
