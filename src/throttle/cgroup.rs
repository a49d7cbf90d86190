//! Freeze/thaw and CPU accounting of a container's cgroup, on cgroup v1 and v2.
//!
//! In the style of youki's libcgroups: every operation goes through a path derived from an
//! injectable root (`/sys/fs/cgroup` in production, a tempdir in tests), and every error
//! names the path and the data involved. This layer makes every cgroupfs write of the
//! throttle controller and of `gpushare run`: freeze, thaw, moving processes
//! (`cgroup.procs`), creating the controller's [`THROTTLED_CHILD`] and creating and removing
//! a run's own cgroup. It creates exactly two kinds of cgroup: the throttled child
//! ([`ContainerCgroup::create_throttled_child`], one `mkdir` below an existing container
//! cgroup) and a run cgroup ([`CgroupFs::create_run_cgroup`], one `mkdir` per hierarchy at
//! the top level, named by `gpushare run`), and removes only a run cgroup and its throttled
//! child ([`ContainerCgroup::remove`]); files are opened for writing without `O_CREAT`, so a
//! missing cgroup is an error naming its directory.
//!
//! Layout:
//! - v1: the freezer directory is `root/freezer/<rel>`, the CPU accounting directory
//!   `root/cpuacct/<rel>` (or `root/cpu,cpuacct/<rel>` where that is how it is mounted);
//! - v2: both are `root/<rel>` (`cgroup.freeze`, `cgroup.events` and `cpu.stat` are core
//!   files, present without enabling any controller).
//!
//! `<rel>` is the container's `cgroups_path` as containerd passes it in NRI, normalized by
//! [`CgroupFs::relative_path`]: cgroupfs form (`/kubepods/burstable/pod<uid>/<cid>`) or the
//! systemd form (`kubepods-burstable-pod<uid>.slice:cri-containerd:<cid>`) expanded as runc
//! does.

use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// Which cgroup hierarchy layout a [`CgroupFs`] drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    /// Legacy: one hierarchy per controller (`freezer`, `cpuacct`, ...).
    V1,
    /// Unified hierarchy.
    V2,
}

/// Errors of the cgroup layer; each names the path (and data) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("invalid cgroups path {value:?}: {reason}")]
    InvalidPath { value: String, reason: &'static str },
    #[error("cgroup {path} does not exist")]
    NotFound { path: PathBuf },
    #[error("no cgroup v2 (cgroup.controllers) nor v1 freezer hierarchy at {path}")]
    UnknownLayout { path: PathBuf },
    #[error("failed to read {path}: {err}")]
    Read { path: PathBuf, err: io::Error },
    #[error("failed to write {data} to {path}: {err}")]
    Write {
        data: String,
        path: PathBuf,
        err: io::Error,
    },
    #[error("failed to parse {path}: unexpected content {data:?}")]
    Parse { path: PathBuf, data: String },
    #[error("failed to create cgroup {path}: {err}")]
    Create { path: PathBuf, err: io::Error },
    #[error("failed to remove cgroup {path}: {err}")]
    Remove { path: PathBuf, err: io::Error },
}

/// The child cgroup the controller freezes, below a container's own cgroup: a frozen
/// container cgroup makes the runtime refuse `exec` ("cannot exec in a paused container"),
/// which would break `kubectl exec` and exec probes of every throttled pod. The workload's
/// processes are moved into the child each period; processes started later by `exec` run
/// until the next move and are throttled from then on.
pub const THROTTLED_CHILD: &str = "gpushare-throttled";

impl CgroupVersion {
    /// The freezer's control file and what it takes to freeze and to thaw.
    fn freezer_file(self) -> (&'static str, &'static str, &'static str) {
        match self {
            CgroupVersion::V1 => ("freezer.state", "FROZEN", "THAWED"),
            CgroupVersion::V2 => ("cgroup.freeze", "1", "0"),
        }
    }
}

/// A cgroup filesystem mounted at `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFs {
    root: PathBuf,
    version: CgroupVersion,
}

impl CgroupFs {
    pub fn new(root: impl Into<PathBuf>, version: CgroupVersion) -> Self {
        Self {
            root: root.into(),
            version,
        }
    }

    /// v2 if `root/cgroup.controllers` exists (a unified mount), else v1 if `root/freezer`
    /// is a directory, else an error naming `root`. A hybrid host (v1 controllers plus
    /// `root/unified`) is v1: the freezer is a v1 controller there.
    pub fn detect(root: &Path) -> Result<Self, CgroupError> {
        if root.join("cgroup.controllers").is_file() {
            Ok(Self::new(root, CgroupVersion::V2))
        } else if root.join("freezer").is_dir() {
            Ok(Self::new(root, CgroupVersion::V1))
        } else {
            Err(CgroupError::UnknownLayout {
                path: root.to_path_buf(),
            })
        }
    }

    /// Like [`detect`](Self::detect) but without requiring a freezer: v2 if
    /// `root/cgroup.controllers` exists, else v1 if `root` has a freezer or a CPU accounting
    /// hierarchy. For `gpushare run`, which falls back to signals where there is no freezer;
    /// the node agent fails closed through [`detect`](Self::detect) instead.
    pub fn detect_layout(root: &Path) -> Result<Self, CgroupError> {
        let v1 = Self::new(root, CgroupVersion::V1);
        match Self::detect(root) {
            Err(CgroupError::UnknownLayout { .. }) if v1.cpu_root().is_dir() => Ok(v1),
            detected => detected,
        }
    }

    /// Creates the top-level cgroup `name` for `gpushare run` — v1: in the freezer and the
    /// CPU accounting hierarchies (where each exists), v2: one directory — and returns it.
    /// Where v1 has no freezer hierarchy, the returned cgroup's freezer directory is its CPU
    /// accounting one: its `cgroup.procs` lists the processes and
    /// [`can_freeze`](ContainerCgroup::can_freeze) is false. An existing cgroup of that name
    /// (left by a run that was killed) is reused. On failure nothing stays created.
    pub fn create_run_cgroup(&self, name: &str) -> Result<ContainerCgroup, CgroupError> {
        let cg = self.container(name)?;
        if cg.rel.components().count() != 1 {
            return Err(CgroupError::InvalidPath {
                value: name.to_string(),
                reason: "a run cgroup is one top-level name",
            });
        }
        let mut dirs = vec![];
        if cg.freezer_dir != cg.cpu_dir || self.version == CgroupVersion::V2 {
            dirs.push(cg.freezer_dir.clone());
        }
        if !dirs.contains(&cg.cpu_dir) && cg.cpu_dir.parent().is_some_and(Path::is_dir) {
            dirs.push(cg.cpu_dir.clone());
        }
        let mut made: Vec<&PathBuf> = vec![];
        for dir in &dirs {
            match fs::create_dir(dir) {
                Ok(()) => made.push(dir),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => {
                    for dir in made {
                        let _ = fs::remove_dir(dir);
                    }
                    return Err(CgroupError::Create {
                        path: dir.clone(),
                        err,
                    });
                }
            }
        }
        if dirs.is_empty() {
            return Err(CgroupError::UnknownLayout {
                path: self.root.clone(),
            });
        }
        Ok(cg)
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root of the hierarchy that holds the freezer: `root/freezer` (v1) or `root` (v2).
    pub fn freezer_root(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.root.join("freezer"),
            CgroupVersion::V2 => self.root.clone(),
        }
    }

    /// The root of the hierarchy that holds CPU accounting: `root/cpuacct`, or
    /// `root/cpu,cpuacct` / `root/cpuacct,cpu` when only a co-mount exists (v1); `root` (v2).
    pub fn cpu_root(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"]
                .iter()
                .map(|name| self.root.join(name))
                .find(|dir| dir.is_dir())
                .unwrap_or_else(|| self.root.join("cpuacct")),
            CgroupVersion::V2 => self.root.clone(),
        }
    }

    /// The cgroup of a container, from its NRI/OCI `cgroups_path` (see
    /// [`relative_path`](Self::relative_path)). Does not check that it exists.
    /// Where v1 has no freezer hierarchy (only [`detect_layout`](Self::detect_layout) gives
    /// such a `CgroupFs`), its "freezer directory" is its CPU accounting one: where its
    /// processes are listed; it cannot freeze.
    pub fn container(&self, cgroups_path: &str) -> Result<ContainerCgroup, CgroupError> {
        let rel = Self::relative_path(cgroups_path)?;
        let cpu_dir = self.cpu_root().join(&rel);
        let freezer_root = self.freezer_root();
        let freezer_dir = match self.version {
            CgroupVersion::V1 if !freezer_root.is_dir() && self.cpu_root().is_dir() => {
                cpu_dir.clone()
            }
            _ => freezer_root.join(&rel),
        };
        Ok(ContainerCgroup {
            version: self.version,
            freezer_dir,
            cpu_dir,
            rel,
        })
    }

    /// Normalizes an NRI/OCI `cgroupsPath` to a path relative to a hierarchy's root.
    ///
    /// - cgroupfs form `/a/b/c` or `a/b/c`: empty and `.` components are dropped;
    /// - systemd form `slice:prefix:name` (anything not starting with `/` that contains a
    ///   `:`), expanded like runc: the slice `a-b-c.slice` becomes
    ///   `a.slice/a-b.slice/a-b-c.slice` (empty slice: `system.slice`; `-.slice`: the root),
    ///   the unit is `prefix-name.scope`, or `name` itself when it ends in `.slice`.
    ///
    /// Rejects (with the value in the error) empty input, NUL bytes, any `..` component,
    /// and anything that resolves to the root itself, so the result is never absolute,
    /// never empty and never leaves the root (lexically; cgroupfs has no symlinks below a
    /// hierarchy's root).
    pub fn relative_path(cgroups_path: &str) -> Result<PathBuf, CgroupError> {
        let invalid = |reason| CgroupError::InvalidPath {
            value: cgroups_path.to_string(),
            reason,
        };
        if cgroups_path.trim().is_empty() {
            return Err(invalid("empty"));
        }
        if cgroups_path.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        let joined = if !cgroups_path.starts_with('/') && cgroups_path.contains(':') {
            expand_systemd(cgroups_path).map_err(invalid)?
        } else {
            cgroups_path.to_string()
        };
        let mut rel = PathBuf::new();
        for part in joined.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(invalid("contains a \"..\" component")),
                part => rel.push(part),
            }
        }
        if rel.as_os_str().is_empty() {
            return Err(invalid("resolves to the cgroup root"));
        }
        debug_assert!(rel.components().all(|c| matches!(c, Component::Normal(_))));
        Ok(rel)
    }
}

/// `slice:prefix:name` → `a.slice/a-b.slice/<unit>`, as runc's systemd driver places it.
fn expand_systemd(value: &str) -> Result<String, &'static str> {
    let parts: Vec<&str> = value.split(':').collect();
    let [slice, prefix, name] = parts[..] else {
        return Err("systemd form must be \"slice:prefix:name\"");
    };
    if [slice, prefix, name].iter().any(|p| p.contains('/')) {
        return Err("systemd slice, prefix and name must not contain '/'");
    }
    if name.is_empty() {
        return Err("systemd unit name is empty");
    }
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let mut path = expand_slice(slice)?;
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else {
        format!("{prefix}-{name}.scope")
    };
    if !path.is_empty() {
        path.push('/');
    }
    path.push_str(&unit);
    Ok(path)
}

/// runc's `ExpandSlice`: `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`, `-.slice` → ``.
fn expand_slice(slice: &str) -> Result<String, &'static str> {
    const SUFFIX: &str = ".slice";
    let Some(stem) = slice.strip_suffix(SUFFIX) else {
        return Err("systemd slice must end in \".slice\"");
    };
    if stem == "-" {
        return Ok(String::new());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for component in stem.split('-') {
        if component.is_empty() {
            return Err("systemd slice has an empty component");
        }
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&prefix);
        path.push_str(component);
        path.push_str(SUFFIX);
        prefix.push_str(component);
        prefix.push('-');
    }
    Ok(path)
}

/// One container's cgroup (its freezer and CPU accounting directories).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroup {
    version: CgroupVersion,
    rel: PathBuf,
    freezer_dir: PathBuf,
    cpu_dir: PathBuf,
}

impl ContainerCgroup {
    /// Asks the kernel to freeze the cgroup; does not wait (see [`wait_frozen`](Self::wait_frozen)).
    /// v1: `FROZEN` to `freezer.state`; v2: `1` to `cgroup.freeze`.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        let (file, frozen, _) = self.version.freezer_file();
        write_file(&self.freezer_dir, file, frozen)
    }

    /// Thaws the cgroup (also from v1's transient `FREEZING`).
    /// v1: `THAWED` to `freezer.state`; v2: `0` to `cgroup.freeze`.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        thaw_at(self.version, &self.freezer_dir)
    }

    /// Whether the cgroup is frozen or being frozen. v1: `freezer.state` is `FROZEN` or
    /// `FREEZING` (which includes a freeze inherited from an ancestor); v2: `cgroup.freeze`
    /// is `1` or `cgroup.events` says `frozen 1`.
    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        match self.version {
            CgroupVersion::V1 => {
                let state = self.v1_state()?;
                Ok(state == "FROZEN" || state == "FREEZING")
            }
            CgroupVersion::V2 => {
                let (path, data) = read_file(&self.freezer_dir, "cgroup.freeze")?;
                match data.trim() {
                    "1" => Ok(true),
                    "0" => self.v2_events_frozen(),
                    _ => Err(CgroupError::Parse { path, data }),
                }
            }
        }
    }

    /// Polls until the freeze is complete (v1: `freezer.state` is `FROZEN`; v2:
    /// `cgroup.events` has `frozen 1`), with short sleeps. `Ok(false)` on timeout.
    pub fn wait_frozen(&self, timeout: Duration) -> Result<bool, CgroupError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(200);
        loop {
            let frozen = match self.version {
                CgroupVersion::V1 => self.v1_state()? == "FROZEN",
                CgroupVersion::V2 => self.v2_events_frozen()?,
            };
            if frozen {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Cumulative CPU time of the cgroup in nanoseconds. v1: `cpuacct.usage`; v2: `cpu.stat`
    /// `usage_usec` × 1000.
    pub fn cpu_usage_ns(&self) -> Result<u64, CgroupError> {
        let (name, _) = self.cpu_usage_file();
        let (path, data) = read_file(&self.cpu_dir, name)?;
        self.parse_cpu_usage(path, data)
    }

    /// The file [`cpu_usage_ns`](Self::cpu_usage_ns) reads, and its path, for a caller that
    /// keeps it open and reads it again with `pread` at offset 0 (cgroupfs files are made
    /// anew on every read from the start).
    pub fn cpu_usage_file(&self) -> (&'static str, PathBuf) {
        let name = match self.version {
            CgroupVersion::V1 => "cpuacct.usage",
            CgroupVersion::V2 => "cpu.stat",
        };
        (name, self.cpu_dir.join(name))
    }

    /// The CPU time, ns, in what [`cpu_usage_file`](Self::cpu_usage_file) read (`None`: not
    /// what it holds; [`parse_cpu_usage`](Self::parse_cpu_usage) says why).
    pub fn cpu_usage_from(&self, data: &str) -> Option<u64> {
        match self.version {
            CgroupVersion::V1 => data.trim().parse().ok(),
            CgroupVersion::V2 => flat_keyed(data, "usage_usec")
                .and_then(|v| v.parse::<u64>().ok())
                .and_then(|usec| usec.checked_mul(1000)),
        }
    }

    /// The CPU time, ns, in what [`cpu_usage_file`](Self::cpu_usage_file) read.
    pub fn parse_cpu_usage(&self, path: PathBuf, data: String) -> Result<u64, CgroupError> {
        self.cpu_usage_from(&data)
            .ok_or(CgroupError::Parse { path, data })
    }

    /// PIDs (thread-group ids) in the cgroup itself, from `cgroup.procs` of the freezer
    /// directory; processes of sub-cgroups are not included.
    /// Sends SIGKILL to process `pid` only if it is a member of this cgroup, with no window
    /// for PID reuse: the process is pinned with a pidfd first, its membership checked
    /// after, and the signal sent through the pidfd — so a process that exited and whose
    /// PID went to someone else (on the host) is never signalled. Returns whether a signal
    /// was sent.
    pub fn kill_member(&self, pid: u32) -> std::io::Result<bool> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: plain syscalls; the returned descriptor is owned below.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as i32, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(nix::libc::ESRCH) => Ok(false),
                _ => Err(e),
            };
        }
        // SAFETY: `fd` is a fresh descriptor from pidfd_open, owned from here on.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if !self.pids().unwrap_or_default().contains(&pid) {
            return Ok(false);
        }
        use std::os::fd::AsRawFd;
        // SAFETY: signal through the pidfd pinned above.
        let r = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                nix::libc::SIGKILL,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(nix::libc::ESRCH) => Ok(false),
                _ => Err(e),
            };
        }
        Ok(true)
    }

    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let (path, data) = read_file(&self.freezer_dir, "cgroup.procs")?;
        data.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.parse().map_err(|_| CgroupError::Parse {
                    path: path.clone(),
                    data: l.to_string(),
                })
            })
            .collect()
    }

    /// Moves each of `pids` into this cgroup (one write of the PID to `cgroup.procs` of the
    /// freezer directory each). A process that exits before its write (`ESRCH`) is skipped;
    /// any other failure does not stop the others and the first one is returned once all
    /// were tried. Ok: how many were moved.
    pub fn move_pids(&self, pids: &[u32]) -> Result<usize, CgroupError> {
        let mut moved = 0;
        let mut first_err = None;
        for pid in pids {
            match write_file(&self.freezer_dir, "cgroup.procs", &pid.to_string()) {
                Ok(()) => moved += 1,
                Err(CgroupError::Write { err, .. }) if err.raw_os_error() == Some(libc::ESRCH) => {}
                Err(err) => {
                    first_err.get_or_insert(err);
                }
            }
        }
        first_err.map_or(Ok(moved), Err)
    }

    /// The controller's [`THROTTLED_CHILD`] of this cgroup (freezer and CPU accounting
    /// directories one level down). Does not check that it exists.
    pub fn throttled_child(&self) -> ContainerCgroup {
        ContainerCgroup {
            version: self.version,
            rel: self.rel.join(THROTTLED_CHILD),
            freezer_dir: self.freezer_dir.join(THROTTLED_CHILD),
            cpu_dir: self.cpu_dir.join(THROTTLED_CHILD),
        }
    }

    /// Creates the [`THROTTLED_CHILD`] in the freezer hierarchy (v1: `freezer/<rel>/…`; v2:
    /// `<rel>/…`) — the only cgroup this layer ever creates — and returns it. One `mkdir`:
    /// an existing child is fine, a missing container cgroup is [`CgroupError::NotFound`]
    /// and nothing is created then.
    pub fn create_throttled_child(&self) -> Result<ContainerCgroup, CgroupError> {
        let child = self.throttled_child();
        match fs::create_dir(&child.freezer_dir) {
            Ok(()) => Ok(child),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(child),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(CgroupError::NotFound {
                path: self.freezer_dir.clone(),
            }),
            Err(err) => Err(CgroupError::Create {
                path: child.freezer_dir,
                err,
            }),
        }
    }

    /// Whether this cgroup has a freezer file to write (v1 `freezer.state`, v2
    /// `cgroup.freeze`; missing where v1 has no freezer hierarchy or the v2 kernel has no
    /// freezer).
    pub fn can_freeze(&self) -> bool {
        let (file, _, _) = self.version.freezer_file();
        self.freezer_dir.join(file).is_file()
    }

    /// The `cgroup.procs` files a process writes its PID to, to join this cgroup in every
    /// hierarchy it spans (v1: freezer and CPU accounting; v2: one).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.freezer_dir.join("cgroup.procs")];
        if self.cpu_dir != self.freezer_dir && self.cpu_dir.is_dir() {
            files.push(self.cpu_dir.join("cgroup.procs"));
        }
        files
    }

    /// Removes this cgroup and its [`THROTTLED_CHILD`] (a run cgroup, once its processes are
    /// gone): `rmdir` of the child, then of the directory in each hierarchy. The kernel
    /// refuses (`EBUSY`) while an exiting process is still being reaped, so that is retried
    /// for up to `patience`; an already missing directory is fine.
    pub fn remove(&self, patience: Duration) -> Result<(), CgroupError> {
        let mut dirs = vec![
            self.freezer_dir.join(THROTTLED_CHILD),
            self.freezer_dir.clone(),
        ];
        if self.cpu_dir != self.freezer_dir {
            dirs.push(self.cpu_dir.clone());
        }
        let deadline = Instant::now() + patience;
        for dir in dirs {
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => break,
                    Err(err)
                        if err.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(err) => return Err(CgroupError::Remove { path: dir, err }),
                }
            }
        }
        Ok(())
    }

    /// Every cgroup below this one in the freezer hierarchy (the throttled child, and any a
    /// container made itself: systemd or a nested runtime inside it), at most 16 levels down
    /// and 4,096 in all; none when it is gone.
    pub fn descendants(&self) -> Vec<ContainerCgroup> {
        let mut out = Vec::new();
        // Paths below this cgroup, and how deep.
        let mut stack = vec![(PathBuf::new(), 0usize)];
        while let Some((sub, depth)) = stack.pop() {
            if depth >= 16 || out.len() >= 4096 {
                continue;
            }
            let Ok(entries) = fs::read_dir(self.freezer_dir.join(&sub)) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let child = sub.join(e.file_name());
                out.push(ContainerCgroup {
                    version: self.version,
                    rel: self.rel.join(&child),
                    freezer_dir: self.freezer_dir.join(&child),
                    cpu_dir: self.cpu_dir.join(&child),
                });
                stack.push((child, depth + 1));
            }
        }
        out
    }

    /// Whether the freezer directory exists.
    pub fn exists(&self) -> bool {
        self.freezer_dir.is_dir()
    }

    pub fn freezer_dir(&self) -> &Path {
        &self.freezer_dir
    }

    pub fn cpu_dir(&self) -> &Path {
        &self.cpu_dir
    }

    /// The normalized relative path (as [`CgroupFs::relative_path`] gives).
    pub fn relative(&self) -> &Path {
        &self.rel
    }

    fn v1_state(&self) -> Result<String, CgroupError> {
        let (_, data) = read_file(&self.freezer_dir, "freezer.state")?;
        Ok(data.trim().to_string())
    }

    fn v2_events_frozen(&self) -> Result<bool, CgroupError> {
        let (path, data) = read_file(&self.freezer_dir, "cgroup.events")?;
        match flat_keyed(&data, "frozen") {
            Some("1") => Ok(true),
            Some("0") => Ok(false),
            // Kernels before 5.2 have no freezer: nothing is ever frozen.
            None if data.contains("populated") => Ok(false),
            _ => Err(CgroupError::Parse { path, data }),
        }
    }
}

/// Thaws every frozen cgroup at or below `rel` in the freezer hierarchy (start-up safety:
/// the agent thaws whatever an earlier instance may have left frozen). Parents are thawed
/// before their children, and a cgroup that disappears during the walk is skipped. Returns
/// how many cgroups it wrote a thaw to. `rel` must be relative without `..` (an empty `rel`
/// means the whole hierarchy; the root cgroup itself is never frozen and is skipped); a
/// missing `rel` is [`CgroupError::NotFound`].
pub fn thaw_all_below(fs: &CgroupFs, rel: &Path) -> Result<usize, CgroupError> {
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(CgroupError::InvalidPath {
            value: rel.display().to_string(),
            reason: "must be relative, without \"..\"",
        });
    }
    let top = fs.freezer_root().join(rel);
    if !top.is_dir() {
        return Err(CgroupError::NotFound { path: top });
    }
    let mut thawed = 0;
    let mut stack = vec![(top, rel.as_os_str().is_empty())];
    while let Some((dir, is_root)) = stack.pop() {
        if !is_root {
            match thaw_if_frozen(fs.version(), &dir) {
                Ok(true) => {
                    tracing::info!(cgroup = %dir.display(), "thawed a cgroup left frozen");
                    thawed += 1;
                }
                Ok(false) => {}
                Err(CgroupError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(CgroupError::Read { path: dir, err }),
        };
        let mut children = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|err| CgroupError::Read {
                path: dir.clone(),
                err,
            })?;
            // `file_type` does not follow symlinks: only real sub-cgroups are walked.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                children.push(entry.path());
            }
        }
        children.sort();
        stack.extend(children.into_iter().rev().map(|d| (d, false)));
    }
    Ok(thawed)
}

/// Thaws `dir` if it is frozen; Ok(true) if it wrote a thaw. A directory without the freezer
/// file (v2 before kernel 5.2, or a non-cgroup directory in a test tree) is not frozen.
fn thaw_if_frozen(version: CgroupVersion, dir: &Path) -> Result<bool, CgroupError> {
    let (file, _, _) = version.freezer_file();
    let (path, state) = match read_file(dir, file) {
        Ok(read) => read,
        Err(CgroupError::Read { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
            return Ok(false);
        }
        Err(err) => return Err(err),
    };
    let frozen = match (version, state.trim()) {
        (CgroupVersion::V1, s) => matches!(s, "FROZEN" | "FREEZING"),
        (CgroupVersion::V2, "0") => false,
        (CgroupVersion::V2, "1") => true,
        (CgroupVersion::V2, _) => return Err(CgroupError::Parse { path, data: state }),
    };
    if frozen {
        thaw_at(version, dir)?;
    }
    Ok(frozen)
}

/// Thaws the freezer cgroup at the absolute `dir`, its version told by its files
/// (`freezer.state`: v1, `cgroup.freeze`: v2): for the guardian, which knows only the
/// directories the controller may have frozen. The thaw is written whatever the state;
/// Ok(true) when it was, Ok(false) when `dir` has neither file (the cgroup is gone, or v2
/// without a freezer).
pub fn thaw_dir(dir: &Path) -> Result<bool, CgroupError> {
    let version = if dir.join("freezer.state").exists() {
        CgroupVersion::V1
    } else if dir.join("cgroup.freeze").exists() {
        CgroupVersion::V2
    } else {
        return Ok(false);
    };
    thaw_at(version, dir)?;
    Ok(true)
}

/// The one thaw write: v1 `THAWED` to `freezer.state`, v2 `0` to `cgroup.freeze`.
fn thaw_at(version: CgroupVersion, dir: &Path) -> Result<(), CgroupError> {
    let (file, _, thawed) = version.freezer_file();
    write_file(dir, file, thawed)
}

/// The value of `key` in a flat-keyed file (`key value` lines: `cpu.stat`, `cgroup.events`).
fn flat_keyed<'a>(data: &'a str, key: &str) -> Option<&'a str> {
    data.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()).flatten()
    })
}

/// Reads `dir/file`; `NotFound` names `dir` when the cgroup itself is missing.
fn read_file(dir: &Path, file: &str) -> Result<(PathBuf, String), CgroupError> {
    let path = dir.join(file);
    match fs::read_to_string(&path) {
        Ok(data) => Ok((path, data)),
        Err(err) if err.kind() == io::ErrorKind::NotFound && !dir.is_dir() => {
            Err(CgroupError::NotFound {
                path: dir.to_path_buf(),
            })
        }
        Err(err) => Err(CgroupError::Read { path, err }),
    }
}

/// Writes `data` to the existing `dir/file` in one `write(2)`; never creates anything.
fn write_file(dir: &Path, file: &str, data: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    let result = fs::OpenOptions::new()
        .write(true)
        .create(false)
        .truncate(true)
        .open(&path)
        .and_then(|mut f| f.write_all(data.as_bytes()));
    match result {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound && !dir.is_dir() => {
            Err(CgroupError::NotFound {
                path: dir.to_path_buf(),
            })
        }
        Err(err) => Err(CgroupError::Write {
            data: data.to_string(),
            path,
            err,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::process::Child;

    use proptest::prelude::*;
    use tempfile::TempDir;

    use crate::throttle::fixture::{self, busy_process, enter, get, put, require_root};
    use crate::throttle::pidmap::PidMap;

    const REL: &str = "kubepods/burstable/pod1/abc";
    const NRI_PATH: &str = "/kubepods/burstable/pod1/abc";

    fn fake_v1(rels: &[&str]) -> (TempDir, CgroupFs) {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fixture::fake_v1(tmp.path(), rels);
        (tmp, fs)
    }

    #[test]
    fn sigkill_reaches_members_only() {
        let (_tmp, fs) = fake_v1(&[REL]);
        let cg = fs.container(NRI_PATH).unwrap();
        let mut member = busy_process();
        let mut outsider = busy_process();
        put(
            &cg.freezer_dir().join("cgroup.procs"),
            &format!("{}\n", member.id()),
        );
        // A PID that is not (or no longer) in the container is never signalled.
        assert!(!cg.kill_member(outsider.id()).unwrap());
        assert!(outsider.try_wait().unwrap().is_none(), "outsider killed");
        assert!(cg.kill_member(member.id()).unwrap());
        let status = member.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        // Gone: nothing to signal, no error.
        let _ = member.try_wait();
        assert!(!cg.kill_member(member.id()).unwrap_or(false));
        outsider.kill().unwrap();
        outsider.wait().unwrap();
    }

    fn fake_v2(rels: &[&str]) -> (TempDir, CgroupFs) {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fixture::fake_v2(tmp.path(), rels);
        (tmp, fs)
    }

    fn rel(s: &str) -> PathBuf {
        CgroupFs::relative_path(s).unwrap()
    }

    #[test]
    fn relative_path_cgroupfs_form() {
        assert_eq!(rel(NRI_PATH), PathBuf::from(REL));
        assert_eq!(rel(REL), PathBuf::from(REL));
        assert_eq!(rel("//a/./b/"), PathBuf::from("a/b"));
        assert_eq!(
            rel("/gpushare-e2e/gpushare-try.X/poduid-gpod/0123abcd"),
            PathBuf::from("gpushare-e2e/gpushare-try.X/poduid-gpod/0123abcd")
        );
        // A leading '/' means cgroupfs form even with a ':' inside.
        assert_eq!(rel("/a/b:c"), PathBuf::from("a/b:c"));
    }

    #[test]
    fn relative_path_systemd_form_is_expanded_like_runc() {
        assert_eq!(
            rel("kubepods-burstable-pod1.slice:cri-containerd:abc"),
            PathBuf::from(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            rel("kubepods-pod2.slice:cri-containerd:def"),
            PathBuf::from("kubepods.slice/kubepods-pod2.slice/cri-containerd-def.scope")
        );
        assert_eq!(
            rel(":cri-containerd:abc"),
            PathBuf::from("system.slice/cri-containerd-abc.scope")
        );
        assert_eq!(rel("-.slice:runc:abc"), PathBuf::from("runc-abc.scope"));
        assert_eq!(
            rel("machine.slice:ignored:my-sub.slice"),
            PathBuf::from("machine.slice/my-sub.slice")
        );
    }

    #[test]
    fn relative_path_rejections_name_the_value() {
        for bad in [
            "",
            "   ",
            "/",
            "//./",
            "../x",
            "a/../../b",
            "a/../b",
            "/a/..",
            "..",
            "a\0b",
            "a:b",
            "a:b:c:d",
            "foo:p:n",
            ".slice:p:n",
            "a--b.slice:p:n",
            "-a.slice:p:n",
            "a/b.slice:p:n",
            "a.slice:p/q:n",
            "a.slice:p:../../x",
            "a.slice:p:",
        ] {
            let err = CgroupFs::relative_path(bad).expect_err(bad);
            assert!(
                matches!(err, CgroupError::InvalidPath { .. }),
                "{bad:?}: {err}"
            );
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn detect_layouts() {
        let (_t1, v1) = fake_v1(&[]);
        let got = CgroupFs::detect(v1.root()).unwrap();
        assert_eq!(got.version(), CgroupVersion::V1);
        assert_eq!(got.root(), v1.root());
        let (_t2, v2) = fake_v2(&[]);
        assert_eq!(
            CgroupFs::detect(v2.root()).unwrap().version(),
            CgroupVersion::V2
        );
        let empty = tempfile::tempdir().unwrap();
        let err = CgroupFs::detect(empty.path()).unwrap_err();
        assert!(matches!(err, CgroupError::UnknownLayout { .. }));
        assert!(
            err.to_string()
                .contains(&empty.path().display().to_string())
        );
    }

    #[test]
    fn container_dirs() {
        let (_t, v1) = fake_v1(&[REL]);
        let cg = v1.container(NRI_PATH).unwrap();
        assert_eq!(cg.freezer_dir(), v1.root().join("freezer").join(REL));
        assert_eq!(cg.cpu_dir(), v1.root().join("cpuacct").join(REL));
        assert_eq!(cg.relative(), Path::new(REL));
        assert!(cg.exists());
        let (_t, v2) = fake_v2(&[REL]);
        let cg = v2.container(REL).unwrap();
        assert_eq!(cg.freezer_dir(), v2.root().join(REL));
        assert_eq!(cg.cpu_dir(), v2.root().join(REL));
        assert!(v2.container("../etc").is_err());
    }

    #[test]
    fn v1_cpuacct_comounted_with_cpu() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        put(
            &root.join("freezer").join(REL).join("freezer.state"),
            "THAWED\n",
        );
        put(
            &root.join("cpu,cpuacct").join(REL).join("cpuacct.usage"),
            "123456789\n",
        );
        let fs = CgroupFs::new(root, CgroupVersion::V1);
        let cg = fs.container(NRI_PATH).unwrap();
        assert_eq!(cg.cpu_dir(), root.join("cpu,cpuacct").join(REL));
        assert_eq!(cg.cpu_usage_ns().unwrap(), 123_456_789);
    }

    #[test]
    fn v1_freeze_thaw_write_freezer_state() {
        let (_t, fs) = fake_v1(&[REL]);
        let cg = fs.container(NRI_PATH).unwrap();
        let state = cg.freezer_dir().join("freezer.state");
        assert!(!cg.is_frozen().unwrap());
        cg.freeze().unwrap();
        assert_eq!(get(&state), "FROZEN");
        assert!(cg.is_frozen().unwrap());
        assert!(cg.wait_frozen(Duration::from_millis(10)).unwrap());
        cg.thaw().unwrap();
        assert_eq!(get(&state), "THAWED");
        assert!(!cg.is_frozen().unwrap());
        // The kernel may report FREEZING for a while: it counts as frozen, is not yet
        // complete, and thaw works from it (the longer old content is truncated).
        put(&state, "FREEZING\n");
        assert!(cg.is_frozen().unwrap());
        let t = Instant::now();
        assert!(!cg.wait_frozen(Duration::from_millis(30)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(30));
        cg.thaw().unwrap();
        assert_eq!(get(&state), "THAWED");
        // Nothing else was written to.
        assert_eq!(get(&cg.freezer_dir().join("cgroup.procs")), "");
    }

    #[test]
    fn v2_freeze_thaw_write_cgroup_freeze() {
        let (_t, fs) = fake_v2(&[REL]);
        let cg = fs.container(NRI_PATH).unwrap();
        let freeze = cg.freezer_dir().join("cgroup.freeze");
        let events = cg.freezer_dir().join("cgroup.events");
        assert!(!cg.is_frozen().unwrap());
        cg.freeze().unwrap();
        assert_eq!(get(&freeze), "1");
        assert!(cg.is_frozen().unwrap());
        // Requested but not complete until cgroup.events says so.
        assert!(!cg.wait_frozen(Duration::from_millis(20)).unwrap());
        put(&events, "populated 1\nfrozen 1\n");
        assert!(cg.wait_frozen(Duration::from_millis(20)).unwrap());
        cg.thaw().unwrap();
        assert_eq!(get(&freeze), "0");
        // Frozen through an ancestor: cgroup.freeze 0 but events frozen 1.
        assert!(cg.is_frozen().unwrap());
        put(&events, "populated 1\nfrozen 0\n");
        assert!(!cg.is_frozen().unwrap());
        put(&freeze, "bogus\n");
        assert!(matches!(cg.is_frozen(), Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn missing_cgroup_is_an_error_naming_it_and_nothing_is_created() {
        for (_t, fs) in [fake_v1(&["other"]), fake_v2(&["other"])] {
            let cg = fs.container("/kubepods/gone/abc").unwrap();
            assert!(!cg.exists());
            let results = [
                cg.freeze().err(),
                cg.thaw().err(),
                cg.is_frozen().err(),
                cg.wait_frozen(Duration::from_millis(1)).err(),
                cg.cpu_usage_ns().err(),
                cg.pids().err(),
            ];
            for err in results {
                let err = err.expect("missing cgroup must fail");
                assert!(matches!(err, CgroupError::NotFound { .. }), "{err}");
                assert!(
                    err.to_string().contains("kubepods/gone/abc"),
                    "error must name the path: {err}"
                );
            }
            assert!(!cg.freezer_dir().exists());
            assert!(!cg.freezer_dir().parent().unwrap().exists());
            assert!(!cg.cpu_dir().exists());
        }
    }

    #[test]
    fn missing_file_in_existing_cgroup_is_a_write_error_with_data_and_path() {
        let (_t, fs) = fake_v1(&[REL]);
        let cg = fs.container(REL).unwrap();
        fs::remove_file(cg.freezer_dir().join("freezer.state")).unwrap();
        let err = cg.freeze().unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CgroupError::Write { .. }), "{msg}");
        assert!(
            msg.contains("FROZEN") && msg.contains("freezer.state"),
            "{msg}"
        );
        assert!(!cg.freezer_dir().join("freezer.state").exists());
    }

    #[test]
    fn cpu_usage_both_versions() {
        let (_t, fs) = fake_v1(&[REL]);
        let cg = fs.container(REL).unwrap();
        put(&cg.cpu_dir().join("cpuacct.usage"), "987654321012\n");
        assert_eq!(cg.cpu_usage_ns().unwrap(), 987_654_321_012);
        put(&cg.cpu_dir().join("cpuacct.usage"), "n/a\n");
        let err = cg.cpu_usage_ns().unwrap_err();
        assert!(matches!(err, CgroupError::Parse { .. }));
        assert!(err.to_string().contains("cpuacct.usage"));

        let (_t, fs) = fake_v2(&[REL]);
        let cg = fs.container(REL).unwrap();
        put(
            &cg.cpu_dir().join("cpu.stat"),
            "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n",
        );
        assert_eq!(cg.cpu_usage_ns().unwrap(), 1_234_567_000);
        put(&cg.cpu_dir().join("cpu.stat"), "user_usec 1\n");
        assert!(matches!(cg.cpu_usage_ns(), Err(CgroupError::Parse { .. })));
        put(
            &cg.cpu_dir().join("cpu.stat"),
            &format!("usage_usec {}\n", u64::MAX),
        );
        assert!(matches!(cg.cpu_usage_ns(), Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn pids_from_cgroup_procs() {
        let (_t, fs) = fake_v1(&[REL]);
        let cg = fs.container(REL).unwrap();
        put(&cg.freezer_dir().join("cgroup.procs"), "12\n345\n\n6789\n");
        assert_eq!(cg.pids().unwrap(), vec![12, 345, 6789]);
        put(&cg.freezer_dir().join("cgroup.procs"), "12\nx\n");
        assert!(matches!(cg.pids(), Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn throttled_child_is_created_once_and_only_below_an_existing_cgroup() {
        for (_t, fs) in [fake_v1(&[REL]), fake_v2(&[REL])] {
            let cg = fs.container(NRI_PATH).unwrap();
            let want = cg.freezer_dir().join(THROTTLED_CHILD);
            assert_eq!(cg.throttled_child().freezer_dir(), want);
            assert_eq!(
                cg.throttled_child().relative(),
                Path::new(REL).join(THROTTLED_CHILD)
            );
            assert!(!want.exists());
            let child = cg.create_throttled_child().unwrap();
            assert!(want.is_dir());
            assert_eq!(child, cg.throttled_child());
            // Again: the existing child is fine.
            assert_eq!(cg.create_throttled_child().unwrap(), child);

            let gone = fs.container("/kubepods/gone/abc").unwrap();
            let err = gone.create_throttled_child().unwrap_err();
            assert!(matches!(err, CgroupError::NotFound { .. }), "{err}");
            assert!(err.to_string().contains("kubepods/gone/abc"), "{err}");
            assert!(!fs.freezer_root().join("kubepods/gone").exists());
        }
    }

    #[test]
    fn run_cgroup_is_created_in_each_hierarchy_and_removed() {
        let patience = Duration::from_millis(100);
        // v1 with freezer and cpuacct; v2.
        for (_t, fs) in [fake_v1(&[]), fake_v2(&[])] {
            let cg = fs.create_run_cgroup("gpushare-run-7").unwrap();
            assert_eq!(cg.freezer_dir(), fs.freezer_root().join("gpushare-run-7"));
            assert_eq!(cg.cpu_dir(), fs.cpu_root().join("gpushare-run-7"));
            assert!(cg.freezer_dir().is_dir() && cg.cpu_dir().is_dir());
            let want = match fs.version() {
                CgroupVersion::V1 => vec![
                    cg.freezer_dir().join("cgroup.procs"),
                    cg.cpu_dir().join("cgroup.procs"),
                ],
                CgroupVersion::V2 => vec![cg.freezer_dir().join("cgroup.procs")],
            };
            assert_eq!(cg.procs_files(), want);
            // A fake tree's mkdir makes no files: no freezer file, until the kernel's appears.
            assert!(!cg.can_freeze());
            let file = match fs.version() {
                CgroupVersion::V1 => "freezer.state",
                CgroupVersion::V2 => "cgroup.freeze",
            };
            put(&cg.freezer_dir().join(file), "");
            assert!(cg.can_freeze());
            fs::remove_file(cg.freezer_dir().join(file)).unwrap();
            // Reused when it exists; its throttled child goes with it.
            assert_eq!(fs.create_run_cgroup("gpushare-run-7").unwrap(), cg);
            cg.create_throttled_child().unwrap();
            cg.remove(patience).unwrap();
            assert!(!cg.freezer_dir().exists() && !cg.cpu_dir().exists());
            cg.remove(patience).unwrap();
        }
        // v1 without a freezer hierarchy: the processes live in cpuacct.
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("cpuacct")).unwrap();
        assert!(CgroupFs::detect(tmp.path()).is_err());
        let fs = CgroupFs::detect_layout(tmp.path()).unwrap();
        assert_eq!(fs.version(), CgroupVersion::V1);
        let cg = fs.create_run_cgroup("gpushare-run-8").unwrap();
        assert_eq!(cg.freezer_dir(), cg.cpu_dir());
        assert_eq!(cg.procs_files(), vec![cg.cpu_dir().join("cgroup.procs")]);
        assert!(
            !fs.freezer_root().exists(),
            "no freezer hierarchy is made up"
        );
        cg.remove(patience).unwrap();
        assert!(!cg.cpu_dir().exists());
        // Names: one top-level component; an unusable root names the root.
        for bad in ["a/b", "..", ""] {
            assert!(fs.create_run_cgroup(bad).is_err(), "{bad}");
        }
        let none = CgroupFs::new(tmp.path().join("nope"), CgroupVersion::V2);
        let err = none.create_run_cgroup("gpushare-run-9").unwrap_err();
        assert!(matches!(err, CgroupError::Create { .. }), "{err}");
        assert!(err.to_string().contains("nope/gpushare-run-9"), "{err}");
        assert!(CgroupFs::detect_layout(&tmp.path().join("nope")).is_err());
        // Not empty (a fake tree's files stand in for a process): refused, named.
        let cg = fs.create_run_cgroup("gpushare-run-10").unwrap();
        put(&cg.cpu_dir().join("x"), "");
        let err = cg.remove(patience).unwrap_err();
        assert!(matches!(err, CgroupError::Remove { .. }), "{err}");
        assert!(err.to_string().contains("gpushare-run-10"), "{err}");
    }

    #[test]
    fn move_pids_writes_each_pid_to_cgroup_procs() {
        let (_t, fs) = fake_v1(&[REL]);
        let cg = fs.container(REL).unwrap();
        let child = cg.create_throttled_child().unwrap();
        let procs = child.freezer_dir().join("cgroup.procs");
        // A plain file stands in for cgroup.procs (O_CREAT is never used).
        put(&procs, "");
        assert_eq!(child.move_pids(&[41, 42]).unwrap(), 2);
        assert_eq!(get(&procs), "42", "one write per PID, the last one stays");
        assert_eq!(child.move_pids(&[]).unwrap(), 0);

        fs::remove_file(&procs).unwrap();
        let err = child.move_pids(&[7]).unwrap_err();
        assert!(matches!(err, CgroupError::Write { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains('7') && msg.contains("cgroup.procs"), "{msg}");
        assert!(!procs.exists());
    }

    #[test]
    fn thaw_dir_tells_the_version_from_the_files() {
        let (_t1, v1) = fake_v1(&[REL]);
        let (_t2, v2) = fake_v2(&[REL]);
        let d1 = v1.container(REL).unwrap().freezer_dir().to_path_buf();
        let d2 = v2.container(REL).unwrap().freezer_dir().to_path_buf();
        put(&d1.join("freezer.state"), "FROZEN\n");
        put(&d2.join("cgroup.freeze"), "1\n");
        assert!(thaw_dir(&d1).unwrap());
        assert!(thaw_dir(&d2).unwrap());
        assert_eq!(get(&d1.join("freezer.state")), "THAWED");
        assert_eq!(get(&d2.join("cgroup.freeze")), "0");
        assert!(!thaw_dir(&d1.join("nope")).unwrap());
        assert!(!d1.join("nope").exists());
    }

    #[test]
    fn thaw_all_below_v1_tree() {
        let rels = [
            "kubepods",
            "kubepods/pod1",
            "kubepods/pod1/a",
            "kubepods/pod1/b",
            "kubepods/pod2/c",
            "kubepods/pod2/c/sub",
            "other/d",
        ];
        let (_t, fs) = fake_v1(&rels);
        let state = |r: &str| fs.root().join("freezer").join(r).join("freezer.state");
        put(&state("kubepods/pod1/a"), "FROZEN\n");
        put(&state("kubepods/pod2/c"), "FREEZING\n");
        put(&state("kubepods/pod2/c/sub"), "FROZEN\n");
        put(&state("other/d"), "FROZEN\n");
        assert_eq!(thaw_all_below(&fs, Path::new("kubepods")).unwrap(), 3);
        for r in &rels[..6] {
            assert_eq!(get(&state(r)).trim(), "THAWED", "{r}");
        }
        assert_eq!(get(&state("other/d")), "FROZEN\n", "outside rel: untouched");
        assert_eq!(thaw_all_below(&fs, Path::new("kubepods")).unwrap(), 0);
        // The whole hierarchy (the root cgroup itself has no freezer.state and is skipped).
        assert_eq!(thaw_all_below(&fs, Path::new("")).unwrap(), 1);
        assert_eq!(get(&state("other/d")), "THAWED");
        // A frozen rel itself counts.
        put(&state("kubepods/pod1"), "FROZEN\n");
        assert_eq!(thaw_all_below(&fs, Path::new("kubepods/pod1")).unwrap(), 1);

        let err = thaw_all_below(&fs, Path::new("nope")).unwrap_err();
        assert!(matches!(err, CgroupError::NotFound { .. }));
        assert!(err.to_string().contains("nope"));
        assert!(!fs.root().join("freezer/nope").exists());
        for bad in ["../x", "/kubepods", "kubepods/../other"] {
            assert!(matches!(
                thaw_all_below(&fs, Path::new(bad)),
                Err(CgroupError::InvalidPath { .. })
            ));
        }
    }

    #[test]
    fn thaw_all_below_v2_tree() {
        let rels = ["kubepods", "kubepods/pod1/a", "kubepods/pod1/b", "x"];
        let (_t, fs) = fake_v2(&rels);
        let freeze = |r: &str| fs.root().join(r).join("cgroup.freeze");
        put(&freeze("kubepods/pod1/a"), "1\n");
        put(&freeze("kubepods/pod1/b"), "1\n");
        put(&freeze("x"), "1\n");
        // "kubepods/pod1" is a plain directory without cgroup files: not frozen, walked.
        assert!(!fs.root().join("kubepods/pod1/cgroup.freeze").exists());
        assert_eq!(thaw_all_below(&fs, Path::new("kubepods")).unwrap(), 2);
        assert_eq!(get(&freeze("kubepods/pod1/a")), "0");
        assert_eq!(get(&freeze("kubepods/pod1/b")), "0");
        assert_eq!(get(&freeze("x")), "1\n");
    }

    proptest! {
        #[test]
        fn relative_path_never_escapes(s in "[a-z./:\\-]{0,24}|\\PC{0,24}") {
            if let Ok(p) = CgroupFs::relative_path(&s) {
                prop_assert!(!p.as_os_str().is_empty());
                prop_assert!(p.is_relative());
                prop_assert!(p.components().all(|c| matches!(c, Component::Normal(_))), "{:?} -> {:?}", s, p);
                let root = Path::new("/sys/fs/cgroup/freezer");
                prop_assert!(root.join(&p).starts_with(root));
                prop_assert!(root.join(&p) != root);
            }
        }

        #[test]
        fn relative_path_of_components(parts in proptest::collection::vec("[a-z0-9.\\-]{1,8}", 1..6)) {
            let s = format!("/{}", parts.join("/"));
            let res = CgroupFs::relative_path(&s);
            if parts.iter().any(|p| p == "..") {
                prop_assert!(res.is_err());
            } else if let Ok(p) = res {
                let kept: Vec<&str> = parts.iter().map(String::as_str).filter(|p| *p != ".").collect();
                prop_assert_eq!(p, PathBuf::from(kept.join("/")));
            } else {
                prop_assert!(parts.iter().all(|p| p == "."));
            }
        }
    }

    // ---- Real hierarchy (root only) ----

    /// Cleans up a real-cgroup test even when an assertion fails: thaws, kills the busy
    /// process, removes the cgroups (children first) and unmounts.
    #[derive(Default)]
    struct RealGuard {
        thaw: Vec<(PathBuf, &'static str)>,
        child: Option<Child>,
        dirs: Vec<PathBuf>,
        mount: Option<PathBuf>,
        _tmp: Option<TempDir>,
    }

    impl RealGuard {
        fn mkdir(&mut self, dir: PathBuf) {
            fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            self.dirs.push(dir);
        }
    }

    impl Drop for RealGuard {
        fn drop(&mut self) {
            for (file, data) in &self.thaw {
                let _ = fs::write(file, data);
            }
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            for dir in self.dirs.iter().rev() {
                // rmdir fails with EBUSY until the killed process has left the cgroup.
                for _ in 0..100 {
                    match fs::remove_dir(dir) {
                        Ok(()) => break,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                        Err(_) => thread::sleep(Duration::from_millis(20)),
                    }
                }
                if dir.exists() {
                    eprintln!("warning: could not remove {}", dir.display());
                }
            }
            if let Some(mount) = self.mount.take() {
                let c = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                    eprintln!(
                        "warning: umount {}: {}",
                        mount.display(),
                        io::Error::last_os_error()
                    );
                }
            }
        }
    }

    fn start_busy(guard: &mut RealGuard) -> u32 {
        let child = busy_process();
        let pid = child.id();
        guard.child = Some(child);
        pid
    }

    fn growth_ns(cg: &ContainerCgroup, over: Duration) -> u64 {
        let before = cg.cpu_usage_ns().unwrap();
        thread::sleep(over);
        cg.cpu_usage_ns().unwrap() - before
    }

    /// CPU growth of a cgroup just reported frozen. The kernel may account CPU time used
    /// before the freeze a little after `frozen` shows (seen on v2 under a VM's steal: 7 ms
    /// in the first 200 ms window, none after), so a first window over `idle` is followed by a
    /// second, and that one is returned: a cgroup that still runs grows in both.
    fn frozen_growth_ns(cg: &ContainerCgroup, over: Duration, idle: u64) -> u64 {
        let first = growth_ns(cg, over);
        if first < idle {
            return first;
        }
        let second = growth_ns(cg, over);
        eprintln!("frozen: {first} ns accounted in the first {over:?}, then {second} ns");
        second
    }

    /// The common part of the v1 and v2 real tests: `cg` holds (only) the busy `pid`, and
    /// `sub` is an empty sub-cgroup of it in the freezer hierarchy.
    fn exercise_real(fs: &CgroupFs, cgroups_path: &str, pid: u32, sub: &Path) {
        let cg = fs.container(cgroups_path).unwrap();
        let window = Duration::from_millis(200);
        let busy = 20_000_000; // 20 ms of CPU in 200 ms: running (2 shared cores)
        let idle = 1_000_000; // 1 ms: stopped
        assert!(cg.exists());
        assert_eq!(cg.pids().unwrap(), vec![pid]);
        assert!(!cg.is_frozen().unwrap());
        let g = growth_ns(&cg, window);
        assert!(g > busy, "running: only {g} ns in {window:?}");

        let t = Instant::now();
        cg.freeze().unwrap();
        assert!(cg.is_frozen().unwrap());
        assert!(
            cg.wait_frozen(Duration::from_secs(5)).unwrap(),
            "not frozen in 5 s"
        );
        eprintln!(
            "{:?}: first freeze complete after {:?}",
            fs.version(),
            t.elapsed()
        );
        let g = frozen_growth_ns(&cg, window, idle);
        assert!(g < idle, "frozen: still {g} ns in {window:?}");

        let t = Instant::now();
        cg.thaw().unwrap();
        let thaw_call = t.elapsed();
        assert!(!cg.is_frozen().unwrap());
        let g = growth_ns(&cg, window);
        assert!(g > busy, "thawed: only {g} ns in {window:?}");
        eprintln!("{:?}: thaw write took {thaw_call:?}", fs.version());

        // Freeze latency over a few duty cycles.
        let mut lat = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            cg.freeze().unwrap();
            assert!(cg.wait_frozen(Duration::from_secs(5)).unwrap());
            lat.push(t.elapsed());
            thread::sleep(Duration::from_millis(5));
            cg.thaw().unwrap();
            thread::sleep(Duration::from_millis(5));
        }
        lat.sort();
        eprintln!(
            "{:?}: freeze→frozen latency over 20 cycles: min {:?}, median {:?}, max {:?}",
            fs.version(),
            lat[0],
            lat[10],
            lat[19]
        );

        // Host PID → container, also from a sub-cgroup of the container's cgroup.
        let containers: HashMap<PathBuf, String> = HashMap::from([(
            CgroupFs::relative_path(cgroups_path).unwrap(),
            "cid-real".to_string(),
        )]);
        let mut map = PidMap::new("/proc", fs.version());
        assert_eq!(
            map.container_of(pid, &containers).as_deref(),
            Some("cid-real")
        );
        assert_eq!(map.container_of(std::process::id(), &containers), None);
        enter(sub, pid);
        assert_eq!(cg.pids().unwrap(), Vec::<u32>::new());
        map.invalidate();
        assert_eq!(
            map.container_of(pid, &containers).as_deref(),
            Some("cid-real")
        );

        // Freezing the container's cgroup freezes its sub-cgroups' processes too.
        cg.freeze().unwrap();
        assert!(cg.wait_frozen(Duration::from_secs(5)).unwrap());
        let g = frozen_growth_ns(&cg, window, idle);
        assert!(g < idle, "frozen parent: sub-cgroup still ran {g} ns");

        // Start-up safety: thaw_all_below finds it.
        let rel = CgroupFs::relative_path(cgroups_path).unwrap();
        assert_eq!(thaw_all_below(fs, &rel).unwrap(), 1);
        assert!(!cg.is_frozen().unwrap());
        let g = growth_ns(&cg, window);
        assert!(g > busy, "thawed by thaw_all_below: only {g} ns");
    }

    #[test]
    fn real_cgroup_v1_freeze_thaw_cpu_and_pidmap() {
        if !require_root() {
            return;
        }
        let root = Path::new("/sys/fs/cgroup");
        if !root.join("freezer/cgroup.procs").is_file() {
            eprintln!("skipping: no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer");
            return;
        }
        let fs = CgroupFs::new(root, CgroupVersion::V1);
        let name = format!("gpushare-test-{}", std::process::id());
        let mut guard = RealGuard::default();
        let freezer = fs.freezer_root().join(&name);
        let cpu = fs.cpu_root().join(&name);
        guard.mkdir(freezer.clone());
        guard.thaw.push((freezer.join("freezer.state"), "THAWED"));
        let sub = freezer.join("sub");
        guard.mkdir(sub.clone());
        guard.thaw.insert(0, (sub.join("freezer.state"), "THAWED"));
        guard.mkdir(cpu.clone());
        let pid = start_busy(&mut guard);
        enter(&freezer, pid);
        enter(&cpu, pid);
        exercise_real(&fs, &format!("/{name}"), pid, &sub);
    }

    #[test]
    fn real_cgroup_v2_freeze_thaw_cpu_and_pidmap() {
        if !require_root() {
            return;
        }
        let mut guard = RealGuard::default();
        let tmp = tempfile::tempdir().unwrap();
        let mnt = tmp.path().to_path_buf();
        guard._tmp = Some(tmp);
        let target = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated strings; no data argument.
        let rc = unsafe {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"cgroup2".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            eprintln!(
                "skipping v2: cannot mount cgroup2: {}",
                io::Error::last_os_error()
            );
            return;
        }
        guard.mount = Some(mnt.clone());
        let fs = CgroupFs::detect(&mnt).unwrap();
        assert_eq!(fs.version(), CgroupVersion::V2);
        let name = format!("gpushare-test-v2-{}", std::process::id());
        let dir = mnt.join(&name);
        guard.mkdir(dir.clone());
        if !dir.join("cgroup.freeze").is_file() {
            eprintln!("skipping v2: no cgroup.freeze (kernel < 5.2)");
            return;
        }
        guard.thaw.push((dir.join("cgroup.freeze"), "0"));
        let sub = dir.join("sub");
        guard.mkdir(sub.clone());
        guard.thaw.insert(0, (sub.join("cgroup.freeze"), "0"));
        let pid = start_busy(&mut guard);
        enter(&dir, pid);
        exercise_real(&fs, &name, pid, &sub);
    }
}
