//! The controller's IO side: a dedicated thread that, every period, takes the GPU containers
//! from the registry, samples them, runs each GPU's control law and carries the plan out by
//! freezing and thawing cgroups at the window boundaries; and that enforces memory quotas.
//!
//! Safety: it only ever touches cgroups of containers in the registry; a container that stops
//! or is removed is thawed and dropped at once; everything it froze is thawed when it stops,
//! when it panics (a drop guard), and — through the guardian process — when the agent is
//! killed outright.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cgroup::{CgroupFs, ContainerCgroup};
use super::source::{SampleSource, Tracked};
use crate::registry::{ContainerState, Registry};
use gpushare_core::control::{GpuLoop, Member, Params, Plan, Policy};

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
    pub policy: Policy,
    /// Control period in milliseconds: each capped container runs once per period.
    pub period_ms: u64,
    pub memory_action: MemoryAction,
    /// cgroupfs root.
    pub cgroup_root: PathBuf,
    /// Agent state (sim memory declarations, guardian list).
    pub state_dir: PathBuf,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            enabled: true,
            policy: Policy::Hard,
            period_ms: 100,
            memory_action: MemoryAction::Kill,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            state_dir: PathBuf::from("/run/gpushare"),
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
}

/// What the NRI handler shares with the controller: containers to let go of at once.
#[derive(Debug)]
pub struct ControllerLink {
    fs: CgroupFs,
    released: Mutex<std::collections::HashSet<String>>,
}

impl ControllerLink {
    pub fn new(fs: CgroupFs) -> Self {
        ControllerLink {
            fs,
            released: Mutex::new(Default::default()),
        }
    }

    /// The container is stopping or gone: thaw it now (a frozen process cannot receive the
    /// runtime's SIGTERM) and never freeze it again.
    pub fn release(&self, id: &str, cgroups_path: &str) {
        self.released
            .lock()
            .expect("release lock")
            .insert(id.to_string());
        if let Ok(cg) = throttled_child(&self.fs, cgroups_path)
            && cg.exists()
            && let Err(e) = cg.thaw()
        {
            tracing::warn!(container = %id, error = %e, "cannot thaw released container");
        }
    }

    fn is_released(&self, id: &str) -> bool {
        self.released.lock().expect("release lock").contains(id)
    }
}

/// The controller freezes a child cgroup of the container's, not the container's own: a
/// frozen container cgroup makes the runtime refuse `exec` ("cannot exec in a paused
/// container"), which would break `kubectl exec` and exec probes of every throttled pod. The
/// workload's processes are swept into the child each period; processes started later by
/// `exec` run until the next sweep and are throttled from then on.
pub const THROTTLED_CHILD: &str = "gpushare-throttled";

/// The throttled child of the container cgroup at `cgroups_path`.
pub fn throttled_child(
    fs: &CgroupFs,
    cgroups_path: &str,
) -> Result<ContainerCgroup, super::cgroup::CgroupError> {
    let rel = CgroupFs::relative_path(cgroups_path)?;
    fs.container(&rel.join(THROTTLED_CHILD).to_string_lossy())
}

/// Moves the processes of `parent` (all, or those in `only`) into `child`.
fn sweep(parent: &ContainerCgroup, child: &ContainerCgroup, only: Option<&[u32]>) -> usize {
    let Ok(pids) = parent.pids() else { return 0 };
    let procs = child.freezer_dir().join("cgroup.procs");
    let mut moved = 0;
    for pid in pids {
        if only.is_some_and(|o| !o.contains(&pid)) {
            continue;
        }
        // A process may exit between the read and the write; that is fine.
        if std::fs::write(&procs, pid.to_string()).is_ok() {
            moved += 1;
        }
    }
    moved
}

struct Handle {
    cgroup: ContainerCgroup,
    /// What gets frozen: `<container cgroup>/gpushare-throttled`.
    throttled: ContainerCgroup,
    gpu: u32,
    frozen: bool,
    frozen_since: Option<Instant>,
}

/// Runs the controller until `stop` is set. Thaws everything it froze before returning.
pub struct Controller {
    cfg: ThrottleConfig,
    fs: CgroupFs,
    registry: Arc<Registry>,
    source: Box<dyn SampleSource>,
    pub stats: Arc<ThrottleStats>,
    loops: BTreeMap<u32, GpuLoop>,
    handles: HashMap<String, Handle>,
    guardian_list: Option<PathBuf>,
    link: Arc<ControllerLink>,
    /// Periods run so far (idle containers are sampled and swept only every few periods).
    periods: u64,
}

/// Idle containers are sampled every this many periods (busy ones every period).
const IDLE_SAMPLE_EVERY: u64 = 5;
/// Idle containers' processes are swept into the throttled child every this many periods
/// (busy ones every period, new ones on pickup).
const SWEEP_EVERY: u64 = 10;

/// Thaws every container a controller still holds when dropped (panics included).
struct ThawOnDrop<'a>(&'a mut HashMap<String, Handle>);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        for (id, h) in self.0.iter_mut() {
            if h.frozen {
                if let Err(e) = h.throttled.thaw() {
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
            stats: Arc::new(ThrottleStats::default()),
            loops: BTreeMap::new(),
            handles: HashMap::new(),
            guardian_list: None,
            link,
            periods: 0,
        }
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

    fn params(&self) -> Params {
        Params {
            policy: self.cfg.policy,
            ..Params::default()
        }
    }

    /// Brings the tracked set in line with the registry: new GPU containers are picked up,
    /// stopped or removed ones are thawed and dropped.
    fn sync_members(&mut self) {
        let records = self.registry.snapshot();
        let mut want: HashMap<String, (u32, Option<f64>, String)> = HashMap::new();
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
                    g.index,
                    g.core_percent.map(|c| c as f64 / 100.0),
                    r.cgroups_path.clone(),
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
                && let Err(e) = h.throttled.thaw()
            {
                tracing::warn!(container = %id, error = %e, "cannot thaw departing container");
            }
            changed = true;
            false
        });
        for (id, (gpu, _, path)) in &want {
            if self.handles.contains_key(id) {
                continue;
            }
            match (self.fs.container(path), throttled_child(&self.fs, path)) {
                (Ok(cgroup), Ok(throttled)) if cgroup.exists() => {
                    if let Err(e) = std::fs::create_dir_all(throttled.freezer_dir()) {
                        tracing::warn!(container = %id, error = %e, "cannot create the throttled child cgroup");
                        continue;
                    }
                    self.handles.insert(
                        id.clone(),
                        Handle {
                            cgroup,
                            throttled,
                            gpu: *gpu,
                            frozen: false,
                            frozen_since: None,
                        },
                    );
                    changed = true;
                }
                (Ok(_), Ok(_)) => {} // not created yet; next period
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(container = %id, error = %e, "cannot resolve cgroup")
                }
            }
        }
        if changed {
            self.write_guardian_list();
        }
        let params = self.params();
        let mut per_gpu: BTreeMap<u32, Vec<Member>> = BTreeMap::new();
        for (id, (gpu, quota, _)) in &want {
            if self.handles.contains_key(id) {
                per_gpu.entry(*gpu).or_default().push(Member {
                    id: id.clone(),
                    quota: *quota,
                });
            }
        }
        self.loops.retain(|g, _| per_gpu.contains_key(g));
        for (gpu, members) in per_gpu {
            self.loops
                .entry(gpu)
                .or_insert_with(|| GpuLoop::new(params))
                .set_members(&members);
        }
    }

    fn write_guardian_list(&self) {
        let Some(path) = &self.guardian_list else {
            return;
        };
        let text: String = self
            .handles
            .values()
            .map(|h| format!("{}\n", h.throttled.freezer_dir().display()))
            .collect();
        let tmp = path.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path)) {
            tracing::error!(path = %path.display(), error = %e, "cannot write the guardian list");
        }
    }

    fn set_frozen(&mut self, id: &str, frozen: bool, now: Instant) {
        let Some(h) = self.handles.get_mut(id) else {
            return;
        };
        if h.frozen == frozen || (frozen && self.link.is_released(id)) {
            return;
        }
        let r = if frozen {
            h.throttled.freeze()
        } else {
            h.throttled.thaw()
        };
        match r {
            Ok(()) => {
                h.frozen = frozen;
                let mut stats = self.stats.containers.lock().expect("stats lock");
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

    fn enforce_memory(&mut self, sample: &super::source::Sample) {
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
            if *used <= limit {
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
            let pids = sample.memory_pids.get(id).cloned().unwrap_or_default();
            match self.cfg.memory_action {
                MemoryAction::Kill => {
                    // A frozen process cannot die; let it run so SIGKILL lands.
                    self.set_frozen(id, false, Instant::now());
                    for pid in &pids {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(*pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
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

    /// One period: sample, plan, and carry the plan out until `deadline`.
    fn period(&mut self, start: Instant, period: Duration, stop: &AtomicBool) {
        let before: usize = self.handles.len();
        self.sync_members();
        let n = self.periods;
        self.periods += 1;
        let loops = &self.loops;
        let idle = |id: &str, gpu: u32| loops.get(&gpu).is_some_and(|lp| lp.is_idle(id));
        // Busy containers are swept every period (a process started by `exec` is throttled
        // from the next period on); idle ones, which are never frozen, less often.
        let sweep_all = n.is_multiple_of(SWEEP_EVERY) || self.handles.len() != before;
        for (id, h) in &self.handles {
            if sweep_all || !idle(id, h.gpu) {
                sweep(&h.cgroup, &h.throttled, None);
            }
        }
        let tracked: Vec<Tracked<'_>> = self
            .handles
            .iter()
            .filter(|(id, h)| n.is_multiple_of(IDLE_SAMPLE_EVERY) || !idle(id, h.gpu))
            .map(|(id, h)| Tracked {
                id,
                gpu: h.gpu,
                cgroup: &h.cgroup,
                throttled: &h.throttled,
            })
            .collect();
        let sample = self.source.sample(&tracked);
        drop(tracked);
        {
            let mut stats = self.stats.containers.lock().expect("stats lock");
            for (id, share) in &sample.share {
                if let Some(s) = stats.get_mut(id) {
                    s.utilization = *share;
                }
            }
        }
        self.enforce_memory(&sample);
        let plans: Vec<Plan> = self
            .loops
            .values_mut()
            .map(|lp| lp.step(&sample.share))
            .collect();
        *self.stats.loop_seconds.lock().expect("stats lock") = start.elapsed().as_secs_f64();

        let mut boundaries: Vec<f64> = plans.iter().flat_map(Plan::boundaries).collect();
        boundaries.sort_by(f64::total_cmp);
        boundaries.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
        let ids: Vec<String> = self.handles.keys().cloned().collect();
        for t in boundaries {
            let at = start + period.mul_f64(t);
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            // Thaw first, then freeze, so a hand-over between two containers never leaves
            // the GPU idle longer than needed.
            let mut freeze = vec![];
            for id in &ids {
                let runs = plans
                    .iter()
                    .any(|p| p.windows.contains_key(id) && p.runs_at(id, t + 1e-9));
                if runs {
                    self.set_frozen(id, false, now);
                } else {
                    freeze.push(id);
                }
            }
            for id in freeze {
                self.set_frozen(id, true, now);
            }
        }
        let end = start + period;
        if let Some(wait) = end.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// Runs until `stop` is set; thaws everything on the way out, including on panic.
    pub fn run(mut self, stop: Arc<AtomicBool>) {
        let period = Duration::from_millis(self.cfg.period_ms.max(10));
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let start = next;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.period(start, period, &stop)
            }));
            if result.is_err() {
                tracing::error!("controller period panicked; thawing everything");
                let _guard = ThawOnDrop(&mut self.handles);
            }
            // Periods are back to back; after a stall, start afresh rather than catch up.
            next = (start + period).max(Instant::now());
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
    _guardian: Option<super::guardian::Guardian>,
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
/// guardian list, starts the guardian, then runs the loop.
pub fn start(
    cfg: &ThrottleConfig,
    registry: Arc<Registry>,
    source: Box<dyn SampleSource>,
    guardian_exe: Option<&std::path::Path>,
) -> anyhow::Result<Running> {
    let fs = CgroupFs::detect(&cfg.cgroup_root)?;
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| anyhow::anyhow!("throttle state_dir {}: {e}", cfg.state_dir.display()))?;
    let list = cfg.state_dir.join("guardian.list");
    let thawed = super::guardian::thaw_listed(&list);
    if thawed > 0 {
        tracing::warn!(thawed, "thawed cgroups an earlier agent left frozen");
    }
    let _ = std::fs::remove_file(&list);
    let guardian = match guardian_exe {
        Some(exe) => Some(super::guardian::spawn(exe, &list)?),
        None => None,
    };
    let controller = Controller::new(cfg.clone(), fs, registry, source).with_guardian_list(list);
    let stats = controller.stats.clone();
    let link = controller.link();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("gpushare-throttle".into())
        .spawn(move || controller.run(s))?;
    tracing::info!(policy = ?cfg.policy, period_ms = cfg.period_ms, cgroups = %cfg.cgroup_root.display(), "throttling controller running");
    Ok(Running {
        stop,
        thread: Some(thread),
        stats,
        link,
        _guardian: guardian,
    })
}
