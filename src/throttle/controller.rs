//! The controller's IO side: a dedicated thread that, every period, takes the GPU containers
//! from the registry, samples them, runs each GPU's control law and carries the plan out by
//! freezing and thawing cgroups at the window boundaries; and that enforces memory quotas.
//!
//! Safety: it only ever touches cgroups of containers in the registry; a container that stops
//! or is removed is thawed and dropped at once; everything it froze is thawed when it stops,
//! when it panics (a drop guard), and — through the guardian process — when the agent is
//! killed outright.
//!
//! Every cgroupfs write goes through the cgroup layer ([`super::cgroup`]); time comes from an
//! injected [`Clock`], so the membership and period logic is unit-tested on a fake cgroupfs
//! with a fake clock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use super::cgroup::THROTTLED_CHILD;
use super::cgroup::{CgroupError, CgroupFs, ContainerCgroup};
use super::freezer::{Freezer, FreezerMode, Processes, SignalFreezer};
use super::source::{SampleSource, Tracked};
use crate::registry::{ContainerState, Registry};
use gpushare_core::control::{ComputePolicy, GpuLoop, Member, Params, Window};

/// Errors of starting the controller; each names the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("throttle state_dir {path}: {err}")]
    StateDir { path: PathBuf, err: io::Error },
    #[error("cannot write the guardian list {path}: {err}")]
    GuardianList { path: PathBuf, err: io::Error },
    #[error("cannot start the guardian {exe}: {err}")]
    Guardian { exe: PathBuf, err: io::Error },
    #[error("cannot start the controller thread: {err}")]
    Thread { err: io::Error },
}

/// Where the controller's time comes from: the real clock, or a fake in tests.
pub trait Clock: Send {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration);
    /// Sleeps for `d` or until `wake` is raised, whichever comes first; returns whether it
    /// was woken (and lowers the flag). Clocks of tests only sleep.
    fn sleep_or_wake(&self, d: Duration, wake: &Wake) -> bool {
        let _ = wake;
        self.sleep(d);
        false
    }
}

/// A flag the controller thread waits on between the steps of a period: raised when a
/// container is about to start, so that it is taken on at once.
#[derive(Debug, Default)]
pub struct Wake {
    raised: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Wake {
    pub fn raise(&self) {
        *self.raised.lock().expect("wake lock") = true;
        self.cv.notify_one();
    }

    /// Waits at most `d` for the flag; true (and the flag lowered) when it was raised.
    pub fn wait(&self, d: Duration) -> bool {
        let raised = self.raised.lock().expect("wake lock");
        let (mut raised, _) = self
            .cv
            .wait_timeout_while(raised, d, |r| !*r)
            .expect("wake lock");
        std::mem::replace(&mut *raised, false)
    }
}

/// [`Instant::now`] and [`std::thread::sleep`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }

    fn sleep_or_wake(&self, d: Duration, wake: &Wake) -> bool {
        wake.wait(d)
    }
}

/// What to do when a container holds more GPU memory than its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MemoryAction {
    /// SIGKILL the container's processes that hold GPU memory; log the event.
    #[default]
    Kill,
    /// Log and count only.
    Report,
}

/// `[throttle]` section of the node config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleConfig {
    pub enabled: bool,
    pub policy: ComputePolicy,
    /// Control period in milliseconds: each capped container runs once per period.
    pub period_ms: u64,
    pub memory_action: MemoryAction,
    /// cgroupfs root.
    pub cgroup_root: PathBuf,
    /// Agent state (sim memory declarations, guardian list).
    pub state_dir: PathBuf,
    /// MiB per process the memory backstop allows above the quota. NVML counts each
    /// process's CUDA context (hundreds of MiB on large GPUs), which the in-container limiter
    /// does not count, so without it a process the limiter kept inside its quota could be
    /// killed. Unset: the backend's default (`NodeConfig::throttle_config`: 768 with NVML,
    /// 0 with simulated GPUs, which have no contexts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_allowance_mib: Option<u64>,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            enabled: true,
            policy: ComputePolicy::Hard,
            period_ms: 100,
            memory_action: MemoryAction::Kill,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            state_dir: PathBuf::from("/run/gpushare"),
            context_allowance_mib: None,
        }
    }
}

/// Per-container numbers for the metrics endpoint.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ContainerStats {
    pub pod: String,
    pub container: String,
    pub gpu: u32,
    pub quota_percent: Option<u32>,
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub memory_limit_bytes: u64,
    pub throttled_seconds: f64,
    pub freezes: u64,
    pub memory_actions: u64,
}

#[derive(Debug, Default)]
pub struct ThrottleStats {
    pub containers: Mutex<BTreeMap<String, ContainerStats>>,
    /// Duration of the last control step (sampling + planning), seconds.
    pub loop_seconds: Mutex<f64>,
    /// Times the guardian died and was started again.
    pub guardian_restarts: std::sync::atomic::AtomicU64,
    /// Wall time spent in the sample source since start, nanoseconds (the sim source reads
    /// each sampled container's cgroup; NVML asks the driver once per GPU).
    pub sample_nanos: std::sync::atomic::AtomicU64,
}

/// What the NRI handler shares with the controller: containers to let go of at once.
#[derive(Debug)]
pub struct ControllerLink {
    fs: CgroupFs,
    released: Mutex<std::collections::HashSet<String>>,
    /// Bumped by every release, like the registry's generation.
    generation: std::sync::atomic::AtomicU64,
    /// Raised by [`ControllerLink::starting`].
    wake: Wake,
}

impl ControllerLink {
    pub fn new(fs: CgroupFs) -> Self {
        ControllerLink {
            fs,
            released: Mutex::new(Default::default()),
            generation: Default::default(),
            wake: Wake::default(),
        }
    }

    /// A registered container is about to start (NRI StartContainer, which containerd sends
    /// between `runc create` and `runc start`; the runtime wrapper's `start`): the controller
    /// ends its period at once and begins the next, so the container is taken on (its
    /// throttled child made, the guardian list written) and given the period's first window
    /// — not after up to a period at full speed. Its process (`runc init`, still waiting)
    /// stays in the container's cgroup, thawed, until the next period moves it into the
    /// throttled child: a move stalls the node's forks while it runs, runc's start among
    /// them. Does not wait for the controller.
    pub fn starting(&self) {
        self.wake.raise();
    }

    /// The container is stopping or gone: thaw it now (a frozen process cannot receive the
    /// runtime's SIGTERM) and never freeze it again.
    pub fn release(&self, id: &str, cgroups_path: &str) {
        self.released
            .lock()
            .expect("release lock")
            .insert(id.to_string());
        self.generation.fetch_add(1, Ordering::Release);
        if let Ok(cg) = throttled_child(&self.fs, cgroups_path)
            && cg.exists()
            && let Err(e) = cg.thaw()
        {
            tracing::warn!(container = %id, error = %e, "cannot thaw released container");
        }
    }

    /// Kills the container: it is released (thawed, never frozen again) and killed
    /// ([`kill_container`]). Returns how many processes were signalled.
    pub fn kill(&self, id: &str, cgroups_path: &str) -> Result<usize, String> {
        self.release(id, cgroups_path);
        kill_container(&self.fs, cgroups_path)
    }

    /// Whether the container cgroup at `cgroups_path` exists (`None`: the path is invalid).
    pub fn cgroup_exists(&self, cgroups_path: &str) -> Option<bool> {
        self.fs.container(cgroups_path).ok().map(|cg| cg.exists())
    }

    fn is_released(&self, id: &str) -> bool {
        self.released.lock().expect("release lock").contains(id)
    }
}

/// Sends SIGKILL to every process of the container cgroup at `cgroups_path` and of every
/// cgroup below it (its throttled child, any it made itself), in rounds until one finds none
/// left unsignalled (at most 3: a process forked between a round's reading and its signals is
/// found by the next). Each through a pidfd, its membership checked. Returns how many
/// processes were signalled.
pub fn kill_container(fs: &CgroupFs, cgroups_path: &str) -> Result<usize, String> {
    let cg = fs.container(cgroups_path).map_err(|e| e.to_string())?;
    let mut signalled = std::collections::HashSet::new();
    for _ in 0..3 {
        let before = signalled.len();
        for c in cg.descendants().iter().chain([&cg]) {
            let err = |e: &dyn std::fmt::Display| format!("{}: {e}", c.freezer_dir().display());
            let pids = match c.pids() {
                Ok(p) => p,
                Err(crate::throttle::cgroup::CgroupError::NotFound { .. }) => continue,
                Err(e) => return Err(err(&e)),
            };
            for pid in pids {
                if !signalled.contains(&pid) && c.kill_member(pid).map_err(|e| err(&e))? {
                    signalled.insert(pid);
                }
            }
        }
        if signalled.len() == before {
            break;
        }
    }
    Ok(signalled.len())
}

/// The throttled child ([`THROTTLED_CHILD`], what the controller freezes) of the container
/// cgroup at `cgroups_path`.
pub fn throttled_child(fs: &CgroupFs, cgroups_path: &str) -> Result<ContainerCgroup, CgroupError> {
    Ok(fs.container(cgroups_path)?.throttled_child())
}

/// Moves the processes of `parent` into `child` (its workload into the throttled child).
fn sweep(parent: &ContainerCgroup, child: &ContainerCgroup) {
    let Ok(pids) = parent.pids() else { return };
    // A process may exit between the read and the write; that is fine.
    if let Err(e) = child.move_pids(&pids) {
        tracing::debug!(cgroup = %child.freezer_dir().display(), error = %e, "cannot move a process into the throttled child");
    }
}

/// Freezes or thaws one tracked container (a no-op when it already is so; never freezes one
/// that is released or not in the guardian list), and counts it in the stats.
fn set_frozen(
    h: &mut Handle,
    id: &str,
    frozen: bool,
    now: Instant,
    link: &ControllerLink,
    stats: &ThrottleStats,
) {
    if h.frozen == frozen || (frozen && (link.is_released(id) || !h.recorded)) {
        return;
    }
    let r = if frozen {
        h.freezer.freeze()
    } else {
        h.freezer.thaw()
    };
    match r {
        Ok(()) => {
            h.frozen = frozen;
            let mut stats = stats.containers.lock().expect("stats lock");
            let s = stats.entry(id.to_string()).or_default();
            if frozen {
                h.frozen_since = Some(now);
                s.freezes += 1;
            } else if let Some(since) = h.frozen_since.take() {
                s.throttled_seconds += now.duration_since(since).as_secs_f64();
            }
        }
        Err(e) => tracing::warn!(container = %id, error = %e, frozen, "freezer write failed"),
    }
}

struct Handle {
    cgroup: ContainerCgroup,
    /// Where the workload's processes are kept: `<container cgroup>/gpushare-throttled`
    /// (the container's own cgroup with the signal freezer).
    throttled: ContainerCgroup,
    /// What freezes them: the throttled child's cgroup freezer, or signals.
    freezer: Freezer,
    /// `throttled` is a child of `cgroup` (the cgroup freezer), into which processes are
    /// swept.
    own_child: bool,
    /// Every GPU it holds (a member of each one's loop).
    gpus: Vec<u32>,
    frozen: bool,
    frozen_since: Option<Instant>,
    /// When it was last sampled ([`IDLE_SAMPLE_EVERY`]).
    sampled_at: Option<Instant>,
    /// Which of the [`IDLE_SAMPLE_EVERY`] periods it is sampled in while idle (spreads the
    /// idle containers' samples over the periods).
    phase: u64,
    /// In the guardian list on disk: only then may it be frozen (a frozen cgroup the
    /// guardian does not know of could outlive the agent frozen).
    recorded: bool,
    /// Its windows in the last plan of each GPU it holds (in the order of `gpus`; the whole
    /// period until a plan holds it back), copied from the loops once a period so that the
    /// window boundaries look nothing up.
    windows: Vec<Vec<Window>>,
    /// Idle on every GPU it holds (as of the last plan), and on how many it is, while the
    /// plans are copied in.
    idle: bool,
    idle_on: usize,
    /// How many periods its last sample covers (charged that many times).
    covers: f64,
}

impl Handle {
    /// A container just taken on: thawed, not yet in the guardian list.
    fn new(
        cgroup: ContainerCgroup,
        throttled: ContainerCgroup,
        freezer: Freezer,
        gpus: Vec<u32>,
    ) -> Handle {
        Handle {
            windows: vec![vec![Window::WHOLE]; gpus.len()],
            own_child: throttled != cgroup,
            cgroup,
            throttled,
            freezer,
            gpus,
            frozen: false,
            frozen_since: None,
            sampled_at: None,
            phase: 0,
            recorded: false,
            idle: false,
            idle_on: 0,
            covers: 1.0,
        }
    }

    /// Thawed at fraction `t` of the period: only while every GPU it holds lets it run.
    fn runs_at(&self, t: f64) -> bool {
        self.windows
            .iter()
            .all(|ws| ws.iter().any(|w| w.contains(t)))
    }
}

/// Runs the controller until `stop` is set. Thaws everything it froze before returning.
pub struct Controller {
    cfg: ThrottleConfig,
    fs: CgroupFs,
    registry: Arc<Registry>,
    source: Box<dyn SampleSource>,
    clock: Box<dyn Clock>,
    pub stats: Arc<ThrottleStats>,
    loops: BTreeMap<u32, GpuLoop>,
    handles: HashMap<String, Handle>,
    guardian_list: Option<PathBuf>,
    /// The guardian process and how to start it again if it dies.
    guardian: Option<(PathBuf, super::guardian::Guardian)>,
    link: Arc<ControllerLink>,
    mode: FreezerMode,
    /// Periods run so far (idle containers are swept only every few periods).
    periods: u64,
    /// The registry's and the link's generations the tracked set was last built from, while
    /// nothing was left to retry: until either changes, a period skips the rebuild.
    synced: Option<(u64, u64)>,
    /// The window boundaries of the current period (kept to reuse its memory).
    boundaries: Vec<f64>,
}

/// Idle containers' processes are swept into the throttled child every this many periods
/// (busy ones every period, new ones on pickup). An idle container is never frozen, and one
/// that turns busy is swept from the next period on, so this only bounds how long a process
/// `exec`ed into an idle container stays outside the child.
const SWEEP_EVERY: u64 = 30;

/// With a source that reads each container ([`SampleSource::per_container`]: sim), idle
/// containers are sampled every this many periods (busy ones every period); what an idle
/// container used meanwhile is charged for every period its sample covers. A container that
/// wakes up is seen within this many periods.
const IDLE_SAMPLE_EVERY: u64 = 2;

/// Thaws every container a controller still holds when dropped (panics included).
struct ThawOnDrop<'a>(&'a mut HashMap<String, Handle>);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        for (id, h) in self.0.iter_mut() {
            if h.frozen {
                if let Err(e) = h.freezer.thaw() {
                    tracing::error!(container = %id, error = %e, "cannot thaw on exit");
                }
                h.frozen = false;
            }
        }
    }
}

impl Controller {
    pub fn new(
        cfg: ThrottleConfig,
        fs: CgroupFs,
        registry: Arc<Registry>,
        source: Box<dyn SampleSource>,
    ) -> Self {
        let link = Arc::new(ControllerLink::new(fs.clone()));
        Controller {
            cfg,
            fs,
            registry,
            source,
            clock: Box::new(SystemClock),
            stats: Arc::new(ThrottleStats::default()),
            loops: BTreeMap::new(),
            handles: HashMap::new(),
            boundaries: vec![],
            guardian_list: None,
            guardian: None,
            link,
            mode: FreezerMode::Cgroup,
            periods: 0,
            synced: None,
        }
    }

    /// Holds containers by `mode` (default: the cgroup freezer).
    pub fn with_freezer_mode(mut self, mode: FreezerMode) -> Self {
        self.mode = mode;
        self
    }

    /// The handle the NRI handler uses to release stopping containers.
    pub fn link(&self) -> Arc<ControllerLink> {
        self.link.clone()
    }

    /// Keeps the list of cgroups the controller may freeze in `path`, for the guardian.
    pub fn with_guardian_list(mut self, path: PathBuf) -> Self {
        self.guardian_list = Some(path);
        self
    }

    /// Watches `guardian` (started from `exe`) every period and starts it again if it dies.
    pub fn with_guardian(mut self, exe: PathBuf, guardian: super::guardian::Guardian) -> Self {
        self.guardian = Some((exe, guardian));
        self
    }

    /// The guardian is alive, or was started again. False when it died and cannot be
    /// started: nothing must stay frozen then.
    fn guardian_alive(&mut self) -> bool {
        let Some((exe, g)) = &mut self.guardian else {
            return true;
        };
        match g.child.try_wait() {
            Ok(None) => return true,
            Ok(Some(status)) => tracing::error!(%status, "the guardian died; starting it again"),
            Err(e) => tracing::error!(error = %e, "cannot check the guardian; starting it again"),
        }
        match super::guardian::spawn(exe, &g.list, g.leave.as_deref()) {
            Ok(new) => {
                *g = new;
                self.stats.guardian_restarts.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start the guardian again; the controller stops, thawing everything");
                false
            }
        }
    }

    /// Takes time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Box<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn params(&self) -> Params {
        Params {
            policy: self.cfg.policy,
            ..Params::default()
        }
    }

    /// Brings the tracked set in line with the registry: new GPU containers are picked up,
    /// stopped or removed ones are thawed and dropped.
    fn sync_members(&mut self) {
        // Read before the snapshot: a change after this read shows as a new generation next
        // period.
        let generations = (
            self.registry.generation(),
            self.link.generation.load(Ordering::Acquire),
        );
        if self.synced == Some(generations) {
            return;
        }
        let records = self.registry.snapshot();
        // id → (every GPU with its compute quota, cgroup path, PID)
        type Want = (Vec<(u32, Option<f64>)>, String, u32);
        let mut want: HashMap<String, Want> = HashMap::new();
        let mut stats = self.stats.containers.lock().expect("stats lock");
        {
            // Forget releases of containers the registry no longer has.
            let ids: std::collections::HashSet<&str> =
                records.iter().map(|r| r.id.as_str()).collect();
            self.link
                .released
                .lock()
                .expect("release lock")
                .retain(|id| ids.contains(id.as_str()));
        }
        for r in &records {
            if r.state == ContainerState::Stopped || self.link.is_released(&r.id) {
                continue;
            }
            let Some(g) = r.gpus.first() else { continue };
            want.insert(
                r.id.clone(),
                (
                    r.gpus
                        .iter()
                        .map(|g| (g.index, g.core_percent.map(|c| c as f64 / 100.0)))
                        .collect(),
                    r.cgroups_path.clone(),
                    r.pid,
                ),
            );
            let s = stats.entry(r.id.clone()).or_default();
            s.pod = format!("{}/{}", r.pod_namespace, r.pod_name);
            s.container = r.container_name.clone();
            s.gpu = g.index;
            s.quota_percent = g.core_percent;
            s.memory_limit_bytes = r.gpus.iter().map(|g| g.memory_mib).sum::<u64>() << 20;
        }
        stats.retain(|id, _| want.contains_key(id));
        drop(stats);

        let mut changed = false;
        self.handles.retain(|id, h| {
            if want.contains_key(id) {
                return true;
            }
            if h.frozen
                && let Err(e) = h.freezer.thaw()
            {
                tracing::warn!(container = %id, error = %e, "cannot thaw departing container");
            }
            changed = true;
            false
        });
        for (id, (gpus, path, pid)) in &want {
            if self.handles.contains_key(id) {
                continue;
            }
            let gpus: Vec<u32> = gpus.iter().map(|(g, _)| *g).collect();
            if let FreezerMode::Signals { proc_root } = &self.mode {
                let handle = match self.fs.container(path) {
                    Ok(cgroup) if cgroup.exists() => Some(Handle::new(
                        cgroup.clone(),
                        cgroup.clone(),
                        Freezer::Signals(SignalFreezer::new(Processes::Cgroup(cgroup))),
                        gpus,
                    )),
                    // No cgroup at all: the process tree of the registered PID.
                    Ok(cgroup) if *pid > 0 => Some(Handle::new(
                        cgroup.clone(),
                        cgroup,
                        Freezer::Signals(SignalFreezer::new(Processes::Tree {
                            proc_root: proc_root.clone(),
                            root: *pid,
                        })),
                        gpus,
                    )),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!(container = %id, error = %e, "cannot resolve cgroup");
                        None
                    }
                };
                if let Some(handle) = handle {
                    self.handles.insert(id.clone(), handle);
                    changed = true;
                }
                continue;
            }
            match self.fs.container(path) {
                Ok(cgroup) if cgroup.exists() => {
                    let throttled = match cgroup.create_throttled_child() {
                        Ok(throttled) => throttled,
                        Err(e) => {
                            tracing::warn!(container = %id, error = %e, "cannot create the throttled child cgroup");
                            continue;
                        }
                    };
                    let freezer = Freezer::Cgroup(throttled.clone());
                    let mut handle = Handle::new(cgroup, throttled, freezer, gpus);
                    handle.phase = self.handles.len() as u64;
                    self.handles.insert(id.clone(), handle);
                    changed = true;
                }
                Ok(_) => {} // not created yet; next period
                Err(e) => tracing::warn!(container = %id, error = %e, "cannot resolve cgroup"),
            }
        }
        let unrecorded = self.handles.values().any(|h| !h.recorded);
        let mut complete = want.keys().all(|id| self.handles.contains_key(id));
        if changed || unrecorded {
            match self.write_guardian_list() {
                Ok(()) => self.handles.values_mut().for_each(|h| h.recorded = true),
                // Those not recorded yet are left thawed until the list can be written.
                Err(e) => {
                    complete = false;
                    tracing::error!(error = %e, "cannot write the guardian list; new containers are not throttled until it can be")
                }
            }
        }
        // A container whose cgroup is not there yet, or not in the guardian list, is tried
        // again next period.
        self.synced = complete.then_some(generations);
        let params = self.params();
        let mut per_gpu: BTreeMap<u32, Vec<Member>> = BTreeMap::new();
        // A container on several GPUs is a member of each GPU's loop, with that GPU's quota.
        for (id, (gpus, _, _)) in &want {
            if self.handles.contains_key(id) {
                for (gpu, quota) in gpus {
                    per_gpu.entry(*gpu).or_default().push(Member {
                        id: id.clone(),
                        quota: *quota,
                    });
                }
            }
        }
        self.loops.retain(|g, _| per_gpu.contains_key(g));
        for (gpu, members) in per_gpu {
            self.loops
                .entry(gpu)
                .or_insert_with(|| GpuLoop::new(params))
                .set_members(&members);
        }
        self.copy_schedules(&mut vec![]);
    }

    /// Copies each loop's last plan into the handles of its members (their windows on that
    /// GPU, and whether they are idle on every GPU they hold), and collects the window
    /// boundaries in [0, 1) into `boundaries` (0 included, unsorted) where there is a plan.
    fn copy_schedules(&mut self, boundaries: &mut Vec<f64>) {
        for h in self.handles.values_mut() {
            h.idle_on = 0;
        }
        for (gpu, lp) in &self.loops {
            for (id, idle, ws) in lp.schedule() {
                boundaries.extend(ws.iter().flat_map(Window::edges));
                let Some(h) = self.handles.get_mut(id) else {
                    continue;
                };
                if let Some(i) = h.gpus.iter().position(|g| g == gpu) {
                    h.windows[i].clear();
                    h.windows[i].extend_from_slice(ws);
                    h.idle_on += usize::from(idle);
                }
            }
        }
        for h in self.handles.values_mut() {
            h.idle = h.idle_on == h.gpus.len();
        }
        if !self.loops.is_empty() {
            boundaries.push(0.0);
        }
    }

    /// Replaces the guardian list (controller state under `state_dir`, not cgroupfs) with the
    /// throttled children of the tracked containers.
    fn write_guardian_list(&self) -> Result<(), ControllerError> {
        let Some(path) = &self.guardian_list else {
            return Ok(());
        };
        let text: String = self
            .handles
            .values()
            .map(|h| format!("{}\n", h.freezer.guardian_entry()))
            .collect();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|err| ControllerError::GuardianList {
                path: path.clone(),
                err,
            })
    }

    fn set_frozen(&mut self, id: &str, frozen: bool, now: Instant) {
        if let Some(h) = self.handles.get_mut(id) {
            set_frozen(h, id, frozen, now, &self.link, &self.stats);
        }
    }

    fn enforce_memory(&mut self, sample: &super::source::Sample) {
        if sample.memory_bytes.is_empty() {
            return;
        }
        let limits: HashMap<String, u64> = self
            .stats
            .containers
            .lock()
            .expect("stats lock")
            .iter()
            .map(|(id, s)| (id.clone(), s.memory_limit_bytes))
            .collect();
        for (id, used) in &sample.memory_bytes {
            let limit = limits.get(id).copied().unwrap_or(u64::MAX);
            {
                let mut stats = self.stats.containers.lock().expect("stats lock");
                if let Some(s) = stats.get_mut(id) {
                    s.memory_used_bytes = *used;
                }
            }
            let pids = sample.memory_pids.get(id).cloned().unwrap_or_default();
            let allowance =
                (self.cfg.context_allowance_mib.unwrap_or(0) * pids.len().max(1) as u64) << 20;
            if *used <= limit.saturating_add(allowance) {
                continue;
            }
            let rec = self.registry.get(id);
            let (pod, container) = rec
                .map(|r| {
                    (
                        format!("{}/{}", r.pod_namespace, r.pod_name),
                        r.container_name,
                    )
                })
                .unwrap_or_default();
            match self.cfg.memory_action {
                MemoryAction::Kill => {
                    // A frozen process cannot die; let it run so SIGKILL lands.
                    let now = self.clock.now();
                    self.set_frozen(id, false, now);
                    // Only members of the container's cgroups, through pidfds: a PID that
                    // was reused since the sample is never signalled.
                    if let Some(h) = self.handles.get(id) {
                        for pid in &pids {
                            let sent = h.throttled.kill_member(*pid).unwrap_or(false)
                                || h.cgroup.kill_member(*pid).unwrap_or(false);
                            if !sent {
                                tracing::debug!(container = %id, pid, "not a member any more; not signalled");
                            }
                        }
                    }
                    tracing::warn!(%pod, %container, id = %id, used_bytes = used, limit_bytes = limit, ?pids, action = "kill", "GPU memory over quota");
                }
                MemoryAction::Report => {
                    tracing::warn!(%pod, %container, id = %id, used_bytes = used, limit_bytes = limit, action = "report", "GPU memory over quota");
                }
            }
            if let Some(s) = self
                .stats
                .containers
                .lock()
                .expect("stats lock")
                .get_mut(id)
            {
                s.memory_actions += 1;
            }
        }
    }

    /// One period: sample, plan, and carry the plan out until `start + period`. Returns
    /// early (true) when a container is starting ([`ControllerLink::starting`]): the next
    /// period then begins at once, with `woken` set.
    fn period(&mut self, start: Instant, period: Duration, stop: &AtomicBool, woken: bool) -> bool {
        let before: usize = self.handles.len();
        // A period begun for a starting container takes it on (its throttled child, the
        // guardian list, its window first in the plan) but leaves its processes where they
        // are until the next period: moving a process between cgroups write-locks the
        // kernel's cgroup threadgroup lock, which stalls every fork and exit on the node —
        // runc's own, in the middle of the container's start. Meanwhile they run thawed in
        // the container's cgroup, whose CPU time is charged to the container as always.
        let known: HashSet<String> = if woken {
            self.handles.keys().cloned().collect()
        } else {
            HashSet::new()
        };
        self.sync_members();
        let n = self.periods;
        self.periods += 1;
        // Idle (on every GPU it holds) is as of the last plan, copied into each handle.
        // Busy containers are swept every period (a process started by `exec` is throttled
        // from the next period on); idle ones, which are not frozen, less often. What an idle
        // one uses is charged to its debt (sampled every period, or every IDLE_SAMPLE_EVERY
        // with a sim source, each sample charged for the periods it covers).
        let sweep_all = n.is_multiple_of(SWEEP_EVERY) || (self.handles.len() != before && !woken);
        for (id, h) in &self.handles {
            if woken && !known.contains(id) {
                continue;
            }
            if h.own_child && (sweep_all || !h.idle) {
                sweep(&h.cgroup, &h.throttled);
            }
        }
        // Idle containers every IDLE_SAMPLE_EVERY periods, where a sample reads each one;
        // each sample covers the periods since the last one (charged that many times).
        let spread = self.source.per_container();
        let now = self.clock.now();
        let sampled_now =
            |h: &Handle| !spread || (n + h.phase).is_multiple_of(IDLE_SAMPLE_EVERY) || !h.idle;
        for h in self.handles.values_mut() {
            if !sampled_now(h) {
                continue;
            }
            h.covers = 1.0;
            if let Some(at) = h.sampled_at {
                let k = (now.saturating_duration_since(at).as_secs_f64() / period.as_secs_f64())
                    .round();
                if k >= 2.0 {
                    h.covers = k.min(IDLE_SAMPLE_EVERY as f64);
                }
            }
            h.sampled_at = Some(now);
        }
        let tracked: Vec<Tracked<'_>> = self
            .handles
            .iter()
            .filter(|(_, h)| sampled_now(h))
            .map(|(id, h)| Tracked {
                id,
                gpus: &h.gpus,
                cgroup: &h.cgroup,
                throttled: &h.throttled,
            })
            .collect();
        let sampling = Instant::now();
        let sample = self.source.sample(&tracked);
        self.stats.sample_nanos.fetch_add(
            sampling.elapsed().as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        drop(tracked);
        if !sample.share.is_empty() {
            let mut stats = self.stats.containers.lock().expect("stats lock");
            for (id, share) in &sample.share {
                if let Some(s) = stats.get_mut(id) {
                    s.utilization = *share;
                }
            }
        }
        self.enforce_memory(&sample);
        // Each GPU's loop gets what its members used of that GPU, and for how many periods.
        let by_gpu = !sample.gpu_share.is_empty();
        let handles = &self.handles;
        for (gpu, lp) in self.loops.iter_mut() {
            lp.step_by(|id| {
                let share = if by_gpu {
                    sample
                        .gpu_share
                        .get(&(id.to_string(), *gpu))
                        .or_else(|| sample.share.get(id))
                } else {
                    sample.share.get(id)
                };
                share.map(|&s| (s, handles.get(id).map_or(1.0, |h| h.covers)))
            });
        }
        let mut boundaries = std::mem::take(&mut self.boundaries);
        boundaries.clear();
        self.copy_schedules(&mut boundaries);
        *self.stats.loop_seconds.lock().expect("stats lock") =
            self.clock.now().duration_since(start).as_secs_f64();

        boundaries.sort_by(f64::total_cmp);
        boundaries.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
        let woke = self.carry_out(start, period, stop, &boundaries);
        self.boundaries = boundaries;
        if let Some(woke) = woke {
            return woke;
        }
        let end = start + period;
        if let Some(wait) = end.checked_duration_since(self.clock.now()) {
            return self.clock.sleep_or_wake(wait, &self.link.wake);
        }
        false
    }

    /// Thaws and freezes the containers at each window boundary of the period (fractions of
    /// it, sorted). Returns early where a container is starting (`Some(true)`) or the
    /// controller stops (`Some(false)`).
    fn carry_out(
        &mut self,
        start: Instant,
        period: Duration,
        stop: &AtomicBool,
        boundaries: &[f64],
    ) -> Option<bool> {
        for &t in boundaries {
            let at = start + period.mul_f64(t);
            if let Some(wait) = at.checked_duration_since(self.clock.now())
                && self.clock.sleep_or_wake(wait, &self.link.wake)
            {
                return Some(true);
            }
            if stop.load(Ordering::Relaxed) {
                return Some(false);
            }
            let now = self.clock.now();
            // Thaw first, then freeze, so a hand-over between two containers never leaves
            // the GPU idle longer than needed.
            let (link, stats) = (&*self.link, &*self.stats);
            let at = t + 1e-9;
            for (id, h) in self.handles.iter_mut() {
                if h.runs_at(at) {
                    set_frozen(h, id, false, now, link, stats);
                }
            }
            for (id, h) in self.handles.iter_mut() {
                if !h.runs_at(at) {
                    set_frozen(h, id, true, now, link, stats);
                }
            }
        }
        None
    }

    /// Runs until `stop` is set; thaws everything on the way out, including on panic.
    pub fn run(mut self, stop: Arc<AtomicBool>) {
        let period = Duration::from_millis(self.cfg.period_ms.max(10));
        let mut next = self.clock.now();
        let mut woken = false;
        while !stop.load(Ordering::Relaxed) {
            if !self.guardian_alive() {
                break;
            }
            let start = next;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.period(start, period, &stop, woken)
            }));
            woken = match result {
                Ok(woken) => woken,
                Err(_) => {
                    tracing::error!("controller period panicked; thawing everything");
                    let _guard = ThawOnDrop(&mut self.handles);
                    false
                }
            };
            // Periods are back to back; after a stall, start afresh rather than catch up; a
            // container starting cuts the period short.
            next = if woken {
                self.clock.now()
            } else {
                (start + period).max(self.clock.now())
            };
        }
        let _guard = ThawOnDrop(&mut self.handles);
        tracing::info!("controller stopped; all containers thawed");
    }
}

/// A running controller: stop it (thawing everything) with [`Running::stop`].
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<ThrottleStats>,
    pub link: Arc<ControllerLink>,
    /// True while the controller thread runs (false once it has ended, however it ended).
    pub alive: Arc<AtomicBool>,
    /// The state directory's lock: one agent (or `gpushare run`) per state directory.
    _lock: super::guardian::StateLock,
}

impl Running {
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the controller thread for `registry`: thaws whatever an earlier agent left in its
/// guardian list, starts the guardian (which leaves the agent's cgroups), then runs the loop.
pub fn start(
    cfg: &ThrottleConfig,
    registry: Arc<Registry>,
    source: Box<dyn SampleSource>,
    guardian_exe: Option<&Path>,
) -> Result<Running, ControllerError> {
    let fs = CgroupFs::detect(&cfg.cgroup_root)?;
    let guardian = guardian_exe.map(|exe| GuardianLaunch {
        exe,
        leave_cgroup: Some(&cfg.cgroup_root),
    });
    start_with(cfg, fs, FreezerMode::Cgroup, registry, source, guardian)
}

/// How to start the guardian: our own binary, and the cgroup root it leaves the agent's
/// cgroups for (None: it stays where it starts, as `gpushare run`'s does).
#[derive(Clone, Copy)]
pub struct GuardianLaunch<'a> {
    pub exe: &'a Path,
    pub leave_cgroup: Option<&'a Path>,
}

/// [`start`] on a cgroupfs the caller detected, holding containers by `mode`
/// (`gpushare run`, which falls back to signals where no freezer is writable).
pub fn start_with(
    cfg: &ThrottleConfig,
    fs: CgroupFs,
    mode: FreezerMode,
    registry: Arc<Registry>,
    source: Box<dyn SampleSource>,
    guardian: Option<GuardianLaunch>,
) -> Result<Running, ControllerError> {
    std::fs::create_dir_all(&cfg.state_dir).map_err(|err| ControllerError::StateDir {
        path: cfg.state_dir.clone(),
        err,
    })?;
    let lock = super::guardian::StateLock::take(&cfg.state_dir).map_err(|err| {
        ControllerError::StateDir {
            path: cfg.state_dir.clone(),
            err,
        }
    })?;
    let list = cfg.state_dir.join("guardian.list");
    let thawed = super::guardian::thaw_listed(&list);
    if thawed > 0 {
        tracing::warn!(thawed, "thawed cgroups an earlier agent left frozen");
    }
    let _ = std::fs::remove_file(&list);
    let started = match guardian {
        Some(g) => Some((
            g.exe,
            super::guardian::spawn(g.exe, &list, g.leave_cgroup).map_err(|err| {
                ControllerError::Guardian {
                    exe: g.exe.to_path_buf(),
                    err,
                }
            })?,
        )),
        None => None,
    };
    let mut controller = Controller::new(cfg.clone(), fs, registry, source)
        .with_guardian_list(list)
        .with_freezer_mode(mode);
    if let Some((exe, g)) = started {
        controller = controller.with_guardian(exe.to_path_buf(), g);
    }
    let stats = controller.stats.clone();
    let link = controller.link();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let alive = Arc::new(AtomicBool::new(true));
    let flag = alive.clone();
    let thread = std::thread::Builder::new()
        .name("gpushare-throttle".into())
        .spawn(move || {
            /// Clears the flag however the thread ends (return or panic).
            struct Ended(Arc<AtomicBool>);
            impl Drop for Ended {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let _ended = Ended(flag);
            controller.run(s)
        })
        .map_err(|err| ControllerError::Thread { err })?;
    tracing::info!(policy = ?cfg.policy, period_ms = cfg.period_ms, cgroups = %cfg.cgroup_root.display(), "throttling controller running");
    Ok(Running {
        stop,
        thread: Some(thread),
        stats,
        link,
        alive,
        _lock: lock,
    })
}

#[cfg(test)]
mod tests {
    //! The membership and period logic on a tempdir laid out like cgroupfs, with a fake
    //! sample source and a fake clock (no root, no real time).

    use super::*;
    use crate::registry::ContainerRecord;
    use crate::throttle::cgroup::CgroupVersion;
    use crate::throttle::fixture::{add_fake_cgroup, fake_v1, fake_v2, get, put};
    use crate::throttle::source::Sample;
    use gpushare_core::request::AssignedGpu;

    const PERIOD: Duration = Duration::from_millis(100);

    /// Time that moves only when the controller sleeps; `on_sleep` sees each sleep's number
    /// (from 1), after the time moved.
    struct FakeClock {
        now: Arc<Mutex<Instant>>,
        sleeps: Arc<Mutex<usize>>,
        on_sleep: Box<dyn Fn(usize) + Send>,
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            *self.now.lock().unwrap()
        }

        fn sleep(&self, d: Duration) {
            *self.now.lock().unwrap() += d;
            let n = {
                let mut sleeps = self.sleeps.lock().unwrap();
                *sleeps += 1;
                *sleeps
            };
            (self.on_sleep)(n);
        }
    }

    /// Reports the shares it is told, for the containers it is asked about, and records who
    /// was asked each round.
    #[derive(Clone, Default)]
    struct FakeSource {
        share: Arc<Mutex<HashMap<String, f64>>>,
        memory: Arc<Mutex<HashMap<String, u64>>>,
        asked: Arc<Mutex<Vec<Vec<String>>>>,
        /// What [`SampleSource::per_container`] answers.
        per_container: Arc<std::sync::atomic::AtomicBool>,
    }

    impl SampleSource for FakeSource {
        fn per_container(&self) -> bool {
            self.per_container.load(Ordering::Relaxed)
        }

        fn sample(&mut self, tracked: &[Tracked<'_>]) -> Sample {
            let share = self.share.lock().unwrap();
            let mut ids: Vec<String> = tracked.iter().map(|t| t.id.to_string()).collect();
            ids.sort();
            let mut out = Sample::default();
            for id in &ids {
                if let Some(s) = share.get(id) {
                    out.share.insert(id.clone(), *s);
                }
                if let Some(m) = self.memory.lock().unwrap().get(id) {
                    out.memory_bytes.insert(id.clone(), *m);
                }
            }
            self.asked.lock().unwrap().push(ids);
            out
        }
    }

    struct Harness {
        tmp: tempfile::TempDir,
        fs: CgroupFs,
        registry: Arc<Registry>,
        source: FakeSource,
        now: Arc<Mutex<Instant>>,
        ctl: Controller,
    }

    impl Harness {
        /// A controller (hard policy) over a fake cgroupfs of `version` with cgroups `rels`
        /// and their throttled children (as the kernel would populate them once the
        /// controller creates them), keeping its guardian list in the tempdir.
        fn new(version: CgroupVersion, rels: &[&str]) -> Harness {
            Self::with_clock(version, rels, |_| {})
        }

        fn with_clock(
            version: CgroupVersion,
            rels: &[&str],
            on_sleep: impl Fn(usize) + Send + 'static,
        ) -> Harness {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("cgroup");
            let fs = match version {
                CgroupVersion::V1 => fake_v1(&root, rels),
                CgroupVersion::V2 => fake_v2(&root, rels),
            };
            for rel in rels {
                add_fake_cgroup(&fs, &format!("{rel}/{THROTTLED_CHILD}"));
            }
            let registry = Arc::new(Registry::new());
            let source = FakeSource::default();
            let now = Arc::new(Mutex::new(Instant::now()));
            let clock = FakeClock {
                now: now.clone(),
                sleeps: Arc::default(),
                on_sleep: Box::new(on_sleep),
            };
            let cfg = ThrottleConfig {
                cgroup_root: root,
                state_dir: tmp.path().to_path_buf(),
                ..ThrottleConfig::default()
            };
            let ctl = Controller::new(cfg, fs.clone(), registry.clone(), Box::new(source.clone()))
                .with_guardian_list(tmp.path().join("guardian.list"))
                .with_clock(Box::new(clock));
            Harness {
                tmp,
                fs,
                registry,
                source,
                now,
                ctl,
            }
        }

        /// Registers container `id` in cgroup `/<rel>` on `gpu` with `quota` % of it,
        /// using `share` of it.
        fn add(&self, id: &str, rel: &str, gpu: u32, quota: Option<u32>, share: f64) {
            self.registry.upsert(ContainerRecord {
                id: id.into(),
                pod_namespace: "ns".into(),
                pod_name: format!("pod-{id}"),
                pod_uid: format!("uid-{id}"),
                container_name: "main".into(),
                cgroups_path: format!("/{rel}"),
                pid: 1,
                state: ContainerState::Running,
                gpus: vec![AssignedGpu {
                    index: gpu,
                    uuid: format!("GPU-{gpu}"),
                    minor: gpu,
                    memory_mib: 1024,
                    gpu_memory_mib: 15360,
                    core_percent: quota,
                }],
            });
            self.source
                .share
                .lock()
                .unwrap()
                .insert(id.to_string(), share);
        }

        /// Registers container `id` holding several GPUs (index, quota %), using `share`.
        fn add_multi(&self, id: &str, rel: &str, gpus: &[(u32, Option<u32>)], share: f64) {
            self.add(id, rel, gpus[0].0, gpus[0].1, share);
            let mut rec = self.registry.get(id).unwrap();
            rec.gpus = gpus
                .iter()
                .map(|&(index, core)| AssignedGpu {
                    index,
                    uuid: format!("GPU-{index}"),
                    minor: index,
                    memory_mib: 1024,
                    gpu_memory_mib: 15360,
                    core_percent: core,
                })
                .collect();
            self.registry.upsert(rec);
        }

        /// Runs `n` periods back to back, as [`Controller::run`] does.
        fn periods(&mut self, n: usize) {
            for _ in 0..n {
                let start = *self.now.lock().unwrap();
                self.ctl
                    .period(start, PERIOD, &AtomicBool::new(false), false);
            }
        }

        fn cgroup(&self, rel: &str) -> ContainerCgroup {
            self.fs.container(rel).unwrap()
        }

        /// The freezer file of the throttled child of `rel`.
        fn child_freezer(&self, rel: &str) -> String {
            get(&freezer_file(&self.cgroup(rel).throttled_child()))
        }

        fn stats(&self, id: &str) -> Option<ContainerStats> {
            self.ctl.stats.containers.lock().unwrap().get(id).cloned()
        }

        fn guardian_list(&self) -> String {
            get(&self.tmp.path().join("guardian.list"))
        }
    }

    const A: &str = "kubepods/pod1/a";
    const B: &str = "kubepods/pod2/b";

    /// The freezer file of `cg` (v1 `freezer.state`, v2 `cgroup.freeze`).
    fn freezer_file(cg: &ContainerCgroup) -> PathBuf {
        let file = match cg.freezer_dir().join("freezer.state").exists() {
            true => "freezer.state",
            false => "cgroup.freeze",
        };
        cg.freezer_dir().join(file)
    }

    /// What the fake freezer file holds when frozen and thawed, per version.
    fn states(version: CgroupVersion) -> (&'static str, &'static str) {
        match version {
            CgroupVersion::V1 => ("FROZEN", "THAWED"),
            CgroupVersion::V2 => ("1", "0"),
        }
    }

    #[test]
    fn registered_container_gets_its_throttled_child_and_its_processes() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (frozen, thawed) = states(version);
            let mut h = Harness::new(version, &[]);
            // Registered before its cgroup exists: nothing is created, it waits.
            h.add("a", A, 0, Some(50), 0.5);
            h.periods(1);
            assert!(!h.fs.freezer_root().join("kubepods").exists());
            assert!(h.stats("a").is_some(), "a registered container has stats");

            add_fake_cgroup(&h.fs, A);
            put(&h.cgroup(A).freezer_dir().join("cgroup.procs"), "4242\n");
            let child = h.cgroup(A).throttled_child();
            h.periods(1);
            assert!(child.freezer_dir().is_dir(), "{version:?}: child created");
            assert_eq!(
                h.guardian_list(),
                format!("{}\n", child.freezer_dir().display())
            );
            // The kernel populates the new cgroup; from then on the container's processes
            // are moved into it and it is frozen out of its window.
            add_fake_cgroup(&h.fs, &format!("{A}/{THROTTLED_CHILD}"));
            h.periods(1);
            assert_eq!(get(&child.freezer_dir().join("cgroup.procs")), "4242");
            assert_eq!(h.child_freezer(A), frozen);
            // The container's own cgroup is never frozen (exec keeps working).
            assert_eq!(get(&freezer_file(&h.cgroup(A))), format!("{thawed}\n"));
        }
    }

    #[test]
    fn a_starting_container_is_taken_on_at_once_and_its_processes_moved_a_period_later() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (frozen, _) = states(version);
            let mut h = Harness::new(version, &[]);
            h.add("a", A, 0, Some(30), 0.3);
            h.periods(1);
            // `runc create` made the cgroup (with `runc init` in it); NRI StartContainer cut
            // the period short.
            add_fake_cgroup(&h.fs, A);
            add_fake_cgroup(&h.fs, &format!("{A}/{THROTTLED_CHILD}"));
            put(&h.cgroup(A).freezer_dir().join("cgroup.procs"), "4242\n");
            let child = h.cgroup(A).throttled_child();
            let procs = child.freezer_dir().join("cgroup.procs");
            let start = *h.now.lock().unwrap();
            h.ctl.period(start, PERIOD, &AtomicBool::new(false), true);
            // Taken on: in the guardian list, planned (its window first, the child frozen
            // after it); `runc init` left in the container's cgroup, which is never frozen:
            // no cgroup move and no freeze during the start.
            assert_eq!(
                h.guardian_list(),
                format!("{}\n", child.freezer_dir().display())
            );
            assert_eq!(h.child_freezer(A), frozen);
            assert_ne!(get(&procs), "4242", "{version:?}: moved during the start");
            // The next period moves it.
            h.periods(1);
            assert_eq!(get(&procs), "4242", "{version:?}");
        }
    }

    #[test]
    fn capped_container_is_frozen_and_thawed_per_the_plan() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (frozen, thawed) = states(version);
            let mut h = Harness::new(version, &[A]);
            h.add("a", A, 0, Some(30), 0.3);
            let t0 = *h.now.lock().unwrap();
            h.periods(1);
            // Thawed in [0, 30 ms), frozen for the rest of the period.
            assert_eq!(h.child_freezer(A), frozen, "{version:?}");
            assert_eq!(*h.now.lock().unwrap() - t0, PERIOD);
            assert_eq!(h.stats("a").unwrap().freezes, 1);
            h.periods(1);
            assert_eq!(h.child_freezer(A), frozen);
            let s = h.stats("a").unwrap();
            assert_eq!(s.freezes, 2);
            // Frozen from 30 ms to the next period's start.
            assert!((s.throttled_seconds - 0.07).abs() < 1e-6, "{s:?}");
            assert_eq!((s.quota_percent, s.utilization), (Some(30), 0.3));

            // An uncapped container is never frozen.
            let mut h = Harness::new(version, &[A]);
            h.add("a", A, 0, None, 1.0);
            h.periods(3);
            assert_eq!(h.child_freezer(A).trim(), thawed);
            assert_eq!(h.stats("a").unwrap().freezes, 0);
        }
    }

    #[test]
    fn a_container_on_two_gpus_is_held_to_both_quotas() {
        let mut h = Harness::new(CgroupVersion::V1, &[A]);
        h.add_multi("a", A, &[(0, Some(30)), (1, Some(50))], 0.3);
        h.periods(2);
        // A member of both GPUs' loops, each with that GPU's quota …
        for (gpu, q) in [(0, 0.3), (1, 0.5)] {
            let members: Vec<_> = h.ctl.loops[&gpu].members().collect();
            assert_eq!(members, [("a", Some(q))], "GPU {gpu}");
        }
        // … and thawed only while both let it run: 30 ms of each 100 ms period.
        let s = h.stats("a").unwrap();
        assert!((s.throttled_seconds - 0.07).abs() < 1e-6, "{s:?}");
        assert_eq!(s.memory_limit_bytes, 2048 << 20);
    }

    #[test]
    fn unregistered_or_released_container_is_thawed_and_dropped() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (frozen, thawed) = states(version);
            let mut h = Harness::new(version, &[A, B]);
            h.add("a", A, 0, Some(30), 0.3);
            h.add("b", B, 1, Some(30), 0.3);
            h.periods(1);
            assert_eq!(h.child_freezer(A), frozen);
            assert_eq!(h.child_freezer(B), frozen);

            h.registry.remove("a");
            h.periods(1);
            assert_eq!(h.child_freezer(A), thawed, "{version:?}");
            assert!(h.stats("a").is_none());
            let b_child = h.cgroup(B).throttled_child();
            assert_eq!(
                h.guardian_list(),
                format!("{}\n", b_child.freezer_dir().display())
            );

            // Released by the NRI handler (stopping): thawed at once, never frozen again.
            h.ctl.link().release("b", &format!("/{B}"));
            assert_eq!(h.child_freezer(B), thawed);
            h.periods(2);
            assert_eq!(h.child_freezer(B), thawed);
            assert!(h.stats("b").is_none());
            assert_eq!(h.guardian_list(), "");
        }
    }

    #[test]
    fn idle_container_is_left_thawed_sampled_every_period_and_swept_less_often() {
        let (frozen, thawed) = states(CgroupVersion::V1);
        let mut h = Harness::new(CgroupVersion::V1, &[A]);
        h.add("a", A, 0, Some(30), 0.0);
        let procs = h.cgroup(A).freezer_dir().join("cgroup.procs");
        let child_procs = h
            .cgroup(A)
            .throttled_child()
            .freezer_dir()
            .join("cgroup.procs");
        put(&procs, "11\n");
        // New containers count as busy: held to the quota until three low samples.
        h.periods(2);
        assert_eq!(h.child_freezer(A), frozen);
        h.periods(1);
        assert_eq!(h.child_freezer(A), thawed, "idle: left thawed");
        assert_eq!(h.stats("a").unwrap().freezes, 2);
        // Idle, it is still sampled every period (what it uses is charged to its debt)
        // but swept only every SWEEP_EVERY periods.
        put(&procs, "22\n");
        let n = SWEEP_EVERY as usize;
        h.periods(n - 3);
        let asked: Vec<usize> = h
            .source
            .asked
            .lock()
            .unwrap()
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(asked, vec![1; n]);
        assert_eq!(get(&child_procs), "11", "not swept since period 0");
        h.periods(1);
        assert_eq!(get(&child_procs), "22", "swept in period SWEEP_EVERY");
        assert_eq!(h.child_freezer(A), thawed);
        assert_eq!(h.stats("a").unwrap().freezes, 2);
    }

    /// Where a sample reads each container (sim), idle containers are sampled every other
    /// period, busy ones every period.
    #[test]
    fn with_a_per_container_source_idle_containers_are_sampled_every_other_period() {
        let mut h = Harness::new(CgroupVersion::V1, &[A, B]);
        h.source.per_container.store(true, Ordering::Relaxed);
        h.add("a", A, 0, Some(30), 0.0);
        h.add("b", B, 0, Some(30), 0.3);
        // New containers count as busy until three low samples.
        h.periods(4);
        h.source.asked.lock().unwrap().clear();
        h.periods(6);
        let asked = h.source.asked.lock().unwrap().clone();
        let count = |id: &str| {
            asked
                .iter()
                .filter(|ids| ids.iter().any(|i| i == id))
                .count()
        };
        assert_eq!((count("a"), count("b")), (3, 6), "{asked:?}");
        // It wakes up: seen within two periods, and busy again it is sampled every period.
        h.source.share.lock().unwrap().insert("a".into(), 1.0);
        h.periods(2);
        h.source.asked.lock().unwrap().clear();
        h.periods(4);
        let asked = h.source.asked.lock().unwrap().clone();
        assert!(asked.iter().all(|ids| ids.len() == 2), "{asked:?}");
    }

    #[test]
    fn an_idle_container_that_wakes_up_pays_back_what_it_took() {
        let (frozen, thawed) = states(CgroupVersion::V1);
        let mut h = Harness::new(CgroupVersion::V1, &[A]);
        h.add("a", A, 0, Some(10), 0.0);
        h.periods(4);
        assert_eq!(h.child_freezer(A), thawed, "idle: left thawed");
        // Unthrottled, it took the whole GPU for a period: it is frozen for the whole of
        // the next periods until that is paid back (0.9 periods of debt at 10 % a period),
        // not merely put back on its 10 % window.
        h.source.share.lock().unwrap().insert("a".into(), 1.0);
        h.periods(1);
        assert_eq!(h.child_freezer(A), frozen);
        h.source.share.lock().unwrap().insert("a".into(), 0.0);
        let freezes = h.stats("a").unwrap().freezes;
        h.periods(4);
        assert_eq!(h.child_freezer(A), frozen);
        // Never thawed since (a 10 % window would thaw and freeze it every period).
        assert_eq!(h.stats("a").unwrap().freezes, freezes);
    }

    #[test]
    fn nothing_is_frozen_that_the_guardian_list_does_not_hold() {
        let (frozen, thawed) = states(CgroupVersion::V1);
        let mut h = Harness::new(CgroupVersion::V1, &[A]);
        // The list cannot be written (a directory is in its way).
        std::fs::create_dir(h.tmp.path().join("guardian.list")).unwrap();
        h.add("a", A, 0, Some(30), 1.0);
        h.periods(3);
        assert_eq!(
            h.child_freezer(A).trim(),
            thawed,
            "frozen without being recorded"
        );
        assert_eq!(h.stats("a").map_or(0, |s| s.freezes), 0);
        // Once it can be written, the container is recorded and throttled.
        std::fs::remove_dir(h.tmp.path().join("guardian.list")).unwrap();
        h.periods(1);
        assert!(
            h.guardian_list().contains("pod1/a"),
            "{}",
            h.guardian_list()
        );
        assert_eq!(h.child_freezer(A), frozen);
    }

    #[test]
    fn a_dead_guardian_is_started_again_and_one_that_cannot_start_stops_the_controller() {
        let h = Harness::new(CgroupVersion::V1, &[A]);
        let list = h.tmp.path().join("guardian.list");
        // `true guardian --list …` exits at once: it is started again every check.
        let g = super::super::guardian::spawn(Path::new("/bin/true"), &list, None).unwrap();
        wait_exited(g.child.id());
        let mut ctl = h.ctl.with_guardian(PathBuf::from("/bin/true"), g);
        assert!(ctl.guardian_alive());
        assert_eq!(ctl.stats.guardian_restarts.load(Ordering::Relaxed), 1);
        let g = super::super::guardian::spawn(Path::new("/bin/true"), &list, None).unwrap();
        wait_exited(g.child.id());
        let mut ctl = ctl.with_guardian(PathBuf::from("/nonexistent/gpushare"), g);
        assert!(!ctl.guardian_alive(), "a guardian that cannot start");
    }

    /// Waits (10 s at most) until child `pid` has exited and is not yet reaped: a fixed sleep
    /// is too short on a loaded host, where `/bin/true` may not have run yet.
    fn wait_exited(pid: u32) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if gpushare_core::procstat::state(&stat) == Some('Z') {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} still running: {stat}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn stop_thaws_everything_it_froze() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let (frozen, thawed) = states(version);
            let stop = Arc::new(AtomicBool::new(false));
            // The children's freezer files, and what they held when the stop came.
            let files = Arc::new(Mutex::new(Vec::<PathBuf>::new()));
            let seen = Arc::new(Mutex::new(Vec::<String>::new()));
            let (stop_in, files_in, seen_in) = (stop.clone(), files.clone(), seen.clone());
            let h = Harness::with_clock(version, &[A, B], move |n| {
                // Each period sleeps to its start, to the ends of the two windows (30 and
                // 40 ms) and to its end: stop at the end of the second, both frozen.
                if n == 8 {
                    *seen_in.lock().unwrap() =
                        files_in.lock().unwrap().iter().map(|f| get(f)).collect();
                    stop_in.store(true, Ordering::Relaxed);
                }
            });
            *files.lock().unwrap() = [A, B]
                .map(|rel| freezer_file(&h.cgroup(rel).throttled_child()))
                .to_vec();
            h.add("a", A, 0, Some(30), 0.3);
            h.add("b", B, 1, Some(40), 0.4);
            let stats = h.ctl.stats.clone();
            h.ctl.run(stop);
            assert_eq!(*seen.lock().unwrap(), [frozen, frozen], "{version:?}");
            for file in files.lock().unwrap().iter() {
                assert_eq!(get(file), thawed, "{version:?}");
            }
            let stats = stats.containers.lock().unwrap();
            assert_eq!((stats["a"].freezes, stats["b"].freezes), (2, 2));
        }
    }

    #[test]
    fn memory_over_quota_is_reported_and_counted() {
        let mut h = Harness::new(CgroupVersion::V2, &[A]);
        h.ctl.cfg.memory_action = MemoryAction::Report;
        h.add("a", A, 0, None, 0.5);
        h.source
            .memory
            .lock()
            .unwrap()
            .insert("a".into(), 512 << 20);
        h.periods(1);
        let s = h.stats("a").unwrap();
        assert_eq!(s.pod, "ns/pod-a");
        assert_eq!(
            (s.memory_limit_bytes, s.memory_used_bytes),
            (1024 << 20, 512 << 20)
        );
        assert_eq!(s.memory_actions, 0);
        h.source
            .memory
            .lock()
            .unwrap()
            .insert("a".into(), 2048 << 20);
        h.periods(2);
        let s = h.stats("a").unwrap();
        assert_eq!((s.memory_used_bytes, s.memory_actions), (2048 << 20, 2));
        assert_eq!(
            h.child_freezer(A).trim(),
            "0",
            "report only: nothing frozen"
        );
    }

    /// The backstop leaves room for what NVML counts and the limiter does not (contexts).
    #[test]
    fn memory_within_the_context_allowance_is_left_alone() {
        let mut h = Harness::new(CgroupVersion::V2, &[A]);
        h.ctl.cfg.memory_action = MemoryAction::Report;
        h.ctl.cfg.context_allowance_mib = Some(512);
        h.add("a", A, 0, None, 0.5);
        h.source
            .memory
            .lock()
            .unwrap()
            .insert("a".into(), (1024 + 500) << 20);
        h.periods(1);
        assert_eq!(h.stats("a").unwrap().memory_actions, 0);
        h.source
            .memory
            .lock()
            .unwrap()
            .insert("a".into(), (1024 + 513) << 20);
        h.periods(1);
        assert_eq!(h.stats("a").unwrap().memory_actions, 1);
    }
}
