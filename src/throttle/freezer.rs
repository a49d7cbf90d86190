//! What the controller freezes and thaws for one container: its throttled child cgroup
//! (the cgroup freezer), or — where no cgroup freezer is writable (v1 without the freezer
//! hierarchy, v2 without `cgroup.freeze`, a read-only cgroupfs) — its processes, stopped
//! with `SIGSTOP` and continued with `SIGCONT`. Only `gpushare run` uses the signal
//! fallback; the node agent fails closed without a freezer.
//!
//! The signal freezer is weaker than the cgroup one, and says so: a process forked between
//! listing and stopping runs until the next period; a process that leaves the tree (a
//! daemon reparented to init) escapes when the processes come from the tree rather than a
//! cgroup; and a program that handles `SIGCONT` notices. The processes come from the run's
//! cgroup (`cgroup.procs`) when one could be created, else from the process tree of the
//! command (`/proc/*/stat` parent links).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpushare_core::procstat;

use super::cgroup::{CgroupError, ContainerCgroup, thaw_dir};

/// How the controller holds containers out of their windows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FreezerMode {
    /// The cgroup freezer of each container's throttled child (the node agent).
    #[default]
    Cgroup,
    /// `SIGSTOP`/`SIGCONT` of each container's processes: those of its cgroup where it
    /// exists, else the process tree of its registered PID under `proc_root`.
    Signals { proc_root: PathBuf },
}

/// Errors of freezing and thawing.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("cannot send {signal} to process {pid}: {err}")]
    Signal {
        pid: u32,
        signal: &'static str,
        err: io::Error,
    },
}

/// One container's freezer.
#[derive(Clone)]
pub enum Freezer {
    /// v1 `freezer.state` / v2 `cgroup.freeze` of this cgroup.
    Cgroup(ContainerCgroup),
    /// `SIGSTOP`/`SIGCONT` of these processes.
    Signals(SignalFreezer),
}

impl Freezer {
    pub fn freeze(&self) -> Result<(), FreezeError> {
        match self {
            Freezer::Cgroup(cg) => Ok(cg.freeze()?),
            Freezer::Signals(s) => s.signal_all(true),
        }
    }

    pub fn thaw(&self) -> Result<(), FreezeError> {
        match self {
            Freezer::Cgroup(cg) => Ok(cg.thaw()?),
            Freezer::Signals(s) => s.signal_all(false),
        }
    }

    /// Its line in the guardian list: the freezer directory (absolute), or
    /// `sigcont-cgroup <dir>` / `sigcont-tree <pid> <proc_root>` (see [`thaw_entry`]).
    pub fn guardian_entry(&self) -> String {
        match self {
            Freezer::Cgroup(cg) => cg.freezer_dir().display().to_string(),
            Freezer::Signals(s) => match &s.processes {
                Processes::Cgroup(cg) => format!("sigcont-cgroup {}", cg.freezer_dir().display()),
                Processes::Listed(dir) => format!("sigcont-cgroup {}", dir.display()),
                Processes::Tree { proc_root, root } => {
                    format!("sigcont-tree {root} {}", proc_root.display())
                }
            },
        }
    }
}

/// Thaws what one guardian-list line names (see [`Freezer::guardian_entry`]); Ok(true) when
/// it wrote a thaw or sent a `SIGCONT`.
pub fn thaw_entry(line: &str) -> Result<bool, FreezeError> {
    let processes = if let Some(dir) = line.strip_prefix("sigcont-cgroup ") {
        Processes::Listed(PathBuf::from(dir))
    } else if let Some(rest) = line.strip_prefix("sigcont-tree ") {
        let (pid, proc_root) = rest.split_once(' ').unwrap_or((rest, "/proc"));
        let Ok(root) = pid.parse() else {
            return Ok(false);
        };
        Processes::Tree {
            proc_root: proc_root.into(),
            root,
        }
    } else {
        return Ok(thaw_dir(Path::new(line))?);
    };
    let f = SignalFreezer::new(processes);
    f.signal_all(false)?;
    Ok(true)
}

/// Where a [`SignalFreezer`] finds its processes.
#[derive(Debug, Clone)]
pub enum Processes {
    /// `cgroup.procs` of the cgroup (the run's cgroup, with no freezer).
    Cgroup(ContainerCgroup),
    /// `cgroup.procs` in this directory (the guardian knows only the path).
    Listed(PathBuf),
    /// `root` and its descendants, by the parent links in `proc_root/*/stat`.
    Tree { proc_root: PathBuf, root: u32 },
}

impl Processes {
    /// The processes now (empty when the cgroup or the tree is gone).
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Processes::Cgroup(cg) => cg.pids().unwrap_or_default(),
            Processes::Listed(dir) => std::fs::read_to_string(dir.join("cgroup.procs"))
                .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
                .unwrap_or_default(),
            Processes::Tree { proc_root, root } => process_tree(proc_root, *root),
        }
    }
}

/// `root` (if it exists) and every descendant, from the parent PID (4th field) of each
/// `proc_root/<pid>/stat`. Processes that vanish during the walk are skipped.
pub fn process_tree(proc_root: &Path, root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut alive = BTreeSet::new();
    for entry in std::fs::read_dir(proc_root).into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(ppid) = procstat::ppid(&stat) else {
            continue;
        };
        alive.insert(pid);
        children.entry(ppid).or_default().push(pid);
    }
    if !alive.contains(&root) {
        return vec![];
    }
    let mut out = vec![root];
    let mut at = 0;
    while at < out.len() {
        if let Some(kids) = children.get(&out[at]) {
            out.extend(
                kids.iter()
                    .filter(|k| !out.contains(k))
                    .copied()
                    .collect::<Vec<_>>(),
            );
        }
        at += 1;
    }
    out
}

/// Sends the stop/continue signals: the real `kill(2)`, or a recorder in tests.
pub trait Signaller: Send + Sync {
    /// `SIGSTOP` (`stop`) or `SIGCONT` to `pid`.
    fn send(&self, pid: u32, stop: bool) -> io::Result<()>;
}

/// `kill(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kill;

impl Signaller for Kill {
    fn send(&self, pid: u32, stop: bool) -> io::Result<()> {
        use nix::sys::signal::{Signal, kill};
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let pid = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        kill(nix::unistd::Pid::from_raw(pid), signal).map_err(io::Error::from)
    }
}

/// Holds processes out of their window by `SIGSTOP` and lets them run by `SIGCONT`.
#[derive(Clone)]
pub struct SignalFreezer {
    processes: Processes,
    signaller: Arc<dyn Signaller>,
}

impl SignalFreezer {
    pub fn new(processes: Processes) -> Self {
        Self::with_signaller(processes, Arc::new(Kill))
    }

    pub fn with_signaller(processes: Processes, signaller: Arc<dyn Signaller>) -> Self {
        SignalFreezer {
            processes,
            signaller,
        }
    }

    /// Signals every process; a process that is gone (`ESRCH`) is skipped, other failures do
    /// not stop the others and the first is returned. A stop looks twice, so that a child
    /// forked while the first round was being stopped is stopped too.
    fn signal_all(&self, stop: bool) -> Result<(), FreezeError> {
        let mut done = BTreeSet::new();
        let mut first_err = None;
        for _ in 0..if stop { 2 } else { 1 } {
            for pid in self.processes.pids() {
                if !done.insert(pid) {
                    continue;
                }
                match self.signaller.send(pid, stop) {
                    Ok(()) => {}
                    Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(err) => {
                        first_err.get_or_insert(FreezeError::Signal {
                            pid,
                            signal: if stop { "SIGSTOP" } else { "SIGCONT" },
                            err,
                        });
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::cgroup::{CgroupFs, CgroupVersion};
    use crate::throttle::fixture::put;
    use std::sync::Mutex;

    /// Records `(pid, stop)` instead of signalling; fails for the PIDs in `fail`.
    #[derive(Default)]
    struct Recorder {
        sent: Mutex<Vec<(u32, bool)>>,
        fail: Vec<u32>,
    }

    impl Signaller for Recorder {
        fn send(&self, pid: u32, stop: bool) -> io::Result<()> {
            if self.fail.contains(&pid) {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            if pid == 99 {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            self.sent.lock().unwrap().push((pid, stop));
            Ok(())
        }
    }

    /// A fake `/proc` with `(pid, comm, ppid)` entries.
    fn fake_proc(dir: &Path, procs: &[(u32, &str, u32)]) {
        for (pid, comm, ppid) in procs {
            put(
                &dir.join(pid.to_string()).join("stat"),
                &format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n"),
            );
        }
        put(&dir.join("self/stat"), "not a pid dir");
        put(&dir.join("meminfo"), "MemTotal: 1 kB\n");
    }

    #[test]
    fn process_tree_follows_parent_links() {
        let tmp = tempfile::tempdir().unwrap();
        fake_proc(
            tmp.path(),
            &[
                (1, "init", 0),
                (10, "sh", 1),
                (11, "busy (x) y", 10),
                (12, "sleep", 11),
                (13, "other", 1),
                (14, "sub", 12),
            ],
        );
        let mut tree = process_tree(tmp.path(), 10);
        tree.sort();
        assert_eq!(tree, [10, 11, 12, 14]);
        assert_eq!(process_tree(tmp.path(), 13), [13]);
        assert_eq!(process_tree(tmp.path(), 77), Vec::<u32>::new());
        assert_eq!(
            process_tree(&tmp.path().join("nope"), 10),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn signal_freezer_stops_and_continues_the_tree_or_the_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        fake_proc(
            &proc_root,
            &[
                (1, "init", 0),
                (10, "sh", 1),
                (11, "busy", 10),
                (99, "gone", 10),
            ],
        );
        let rec = Arc::new(Recorder::default());
        let tree = Freezer::Signals(SignalFreezer::with_signaller(
            Processes::Tree {
                proc_root: proc_root.clone(),
                root: 10,
            },
            rec.clone(),
        ));
        tree.freeze().unwrap();
        tree.thaw().unwrap();
        assert_eq!(
            *rec.sent.lock().unwrap(),
            [(10, true), (11, true), (10, false), (11, false)],
            "each once per freeze; a vanished process (ESRCH) is skipped"
        );
        assert_eq!(
            tree.guardian_entry(),
            format!("sigcont-tree 10 {}", proc_root.display())
        );

        // From the run cgroup's cgroup.procs (v2 without cgroup.freeze).
        let fs = CgroupFs::new(tmp.path().join("cg"), CgroupVersion::V2);
        std::fs::create_dir_all(fs.root()).unwrap();
        let cg = fs.create_run_cgroup("gpushare-run-1").unwrap();
        assert!(!cg.can_freeze());
        put(&cg.freezer_dir().join("cgroup.procs"), "21\n22\n");
        let rec = Arc::new(Recorder {
            fail: vec![21],
            ..Default::default()
        });
        let f = Freezer::Signals(SignalFreezer::with_signaller(
            Processes::Cgroup(cg.clone()),
            rec.clone(),
        ));
        let err = f.freeze().unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot send SIGSTOP to process 21: Operation not permitted (os error 1)"
        );
        assert_eq!(
            *rec.sent.lock().unwrap(),
            [(22, true)],
            "the others still stopped"
        );
        assert_eq!(
            f.guardian_entry(),
            format!("sigcont-cgroup {}", cg.freezer_dir().display())
        );
    }

    #[test]
    fn guardian_entries_thaw_cgroups_and_continue_real_processes() {
        // A cgroup freezer line is a directory, as before.
        let tmp = tempfile::tempdir().unwrap();
        put(&tmp.path().join("v1/freezer.state"), "FROZEN");
        assert!(thaw_entry(&tmp.path().join("v1").display().to_string()).unwrap());
        assert!(!thaw_entry("sigcont-tree x /proc").unwrap());

        // A real stopped process is continued by its tree entry and its cgroup entry.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            procstat::state(&stat).unwrap()
        };
        let f = Freezer::Signals(SignalFreezer::new(Processes::Tree {
            proc_root: "/proc".into(),
            root: pid,
        }));
        f.freeze().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state() != 'T' && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(state(), 'T', "stopped");
        assert!(thaw_entry(&f.guardian_entry()).unwrap());
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state() == 'T' && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_ne!(state(), 'T', "continued");
        put(&tmp.path().join("cg/cgroup.procs"), &format!("{pid}\n"));
        f.freeze().unwrap();
        let line = format!("sigcont-cgroup {}", tmp.path().join("cg").display());
        assert!(thaw_entry(&line).unwrap());
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state() == 'T' && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_ne!(state(), 'T', "continued from the cgroup entry");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
