//! The guardian: a small process that thaws every cgroup the controller may have frozen as
//! soon as the agent is gone — however it went, SIGKILL included. Two ways to run it:
//!
//! - **Started by the agent** (`gpushare guardian --list LIST`): it holds the read end of a
//!   pipe whose write end only the agent has; when the agent dies the kernel closes it, the
//!   guardian reads EOF, thaws the cgroups listed in the controller's guardian list, and exits.
//!   It first leaves the agent's cgroups for the root of every hierarchy (`--leave-cgroup
//!   <cgroup root>`): a kill of the agent's whole container (`runc kill --all` on a liveness
//!   restart, which freezes the container's cgroup and kills every process in it; a cgroup-v2
//!   `memory.oom.group` kill) then takes the agent and not the guardian, which thaws. Where the
//!   agent has a cgroup namespace of its own (cgroup v2, not privileged) it cannot leave.
//! - **Beside the agent, in a container of its own** (`gpushare guardian --watch STATE_DIR`,
//!   the chart's `guardian` container): the agent holds `STATE_DIR/agent.lock` exclusively for
//!   its life ([`StateLock`]); the guardian waits for a shared lock on it, which the kernel
//!   grants the moment the agent is gone, thaws the list, lets go, and waits for the next
//!   agent. It shares no cgroup with the agent, so no kill of the agent's container takes it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::freezer::thaw_entry;

/// Thaws everything listed (one per line) in `list`: freezer directories through the cgroup
/// layer, signal-frozen processes by `SIGCONT` (see [`thaw_entry`]). Returns how many it
/// thawed.
pub fn thaw_listed(list: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string(list) else {
        return 0;
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| match thaw_entry(l) {
            Ok(thawed) => thawed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot thaw a cgroup from the guardian list");
                false
            }
        })
        .count()
}

/// An exclusive lock on a state directory (`<dir>/agent.lock`, `flock`), held for the life
/// of the process: two agents on one state directory would freeze the same cgroups and
/// overwrite each other's guardian list.
pub struct StateLock(#[allow(dead_code)] std::fs::File);

/// How long [`StateLock::take`] waits for the lock: a watching guardian ([`watch`]) holds a
/// shared lock on it for a moment at a time while no agent does.
const STATE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// `flock(file, op)`: false when it would block (with `LOCK_NB`, where a signal's interruption
/// is retried) or a signal interrupted the wait (without).
fn flock(file: &std::fs::File, op: i32) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { nix::libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(false),
            std::io::ErrorKind::Interrupted if op & nix::libc::LOCK_NB != 0 => {}
            std::io::ErrorKind::Interrupted => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Opens (creating) a state directory's `agent.lock`, without truncating it.
fn open_lock(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = dir.join("agent.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?;
    Ok((path, file))
}

impl StateLock {
    pub fn take(dir: &Path) -> std::io::Result<StateLock> {
        use std::io::Write;
        std::fs::create_dir_all(dir)?;
        let (path, mut file) = open_lock(dir)?;
        let t0 = std::time::Instant::now();
        let mut taken = flock(&file, nix::libc::LOCK_EX | nix::libc::LOCK_NB)?;
        while !taken && t0.elapsed() < STATE_LOCK_WAIT {
            std::thread::sleep(std::time::Duration::from_millis(10));
            taken = flock(&file, nix::libc::LOCK_EX | nix::libc::LOCK_NB)?;
        }
        if !taken {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!(
                    "{} is held by another gpushare process (pid {}); one agent per state directory",
                    path.display(),
                    holder.trim()
                ),
            ));
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(StateLock(file))
    }
}

/// The hierarchy directory under `root` (a cgroupfs as the agent sees it) of one line of
/// `/proc/self/cgroup` (`ID:CONTROLLERS:PATH`), and the cgroup path there; None for a line
/// that names no hierarchy we find.
fn hierarchy_of(root: &Path, line: &str) -> Option<(PathBuf, String)> {
    let mut parts = line.splitn(3, ':');
    let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
    let dir = if id == "0" && ctrls.is_empty() {
        // The unified hierarchy: the root itself (v2), or `unified` beside the v1 ones.
        [root.to_path_buf(), root.join("unified")]
            .into_iter()
            .find(|d| d.join("cgroup.controllers").is_file())?
    } else {
        let name = ctrls.strip_prefix("name=").unwrap_or(ctrls);
        // Co-mounted controllers are one directory (`cpu,cpuacct`), often also linked by
        // each controller's name.
        std::iter::once(name)
            .chain(name.split(','))
            .map(|n| root.join(n))
            .find(|d| d.join("cgroup.procs").is_file())?
    };
    Some((dir, path.to_string()))
}

/// Moves this process to the root cgroup of every hierarchy under `root` it is not there
/// already in (`0` written to the root's `cgroup.procs`). Returns each hierarchy directory it
/// tried and the outcome: a container whose cgroup namespace hides the root (cgroup v2) is
/// refused there, and the guardian then stays where it was.
pub fn leave_cgroups(root: &Path) -> Vec<(PathBuf, std::io::Result<()>)> {
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    own.lines()
        .filter_map(|l| hierarchy_of(root, l))
        .filter(|(_, path)| path != "/")
        .map(|(dir, _)| {
            let r = std::fs::write(dir.join("cgroup.procs"), "0\n");
            (dir, r)
        })
        .collect()
}

/// The guardian's main: wait for EOF on stdin (the agent's death), then thaw. Termination
/// signals are ignored until then: under systemd's `KillMode=control-group` the guardian is
/// signalled in the same instant as the agent, and must outlive it to thaw. With `leave`
/// (the cgroup root), it first leaves the agent's cgroups ([`leave_cgroups`]).
pub fn run(list: &Path, leave: Option<&Path>) -> std::io::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: setting a signal to SIG_IGN installs no handler code.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    for (dir, r) in leave.map(leave_cgroups).unwrap_or_default() {
        if let Err(e) = r {
            eprintln!(
                "gpushare guardian: cannot leave the agent's cgroup in {} ({e}): a kill of the agent's whole container takes the guardian too",
                dir.display()
            );
        }
    }
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let n = thaw_listed(list);
    // Quiet when nothing was frozen: `gpushare run` ends this way every time.
    if n > 0 {
        eprintln!(
            "gpushare guardian: agent gone, thawed {n} cgroup(s) from {}",
            list.display()
        );
    }
    Ok(())
}

/// Set by a termination signal in [`watch`].
static TERMINATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The watching guardian's main (`gpushare guardian --watch DIR`, see the module docs): for
/// as long as it runs, each time no agent holds `DIR/agent.lock` it thaws what
/// `DIR/guardian.list` names (once per agent gone). A termination signal (SIGTERM, SIGINT,
/// SIGHUP) ends it once no agent holds the lock and it has thawed: the pod's deletion signals
/// the agent and the guardian in the same instant, and the guardian must outlive the agent.
pub fn watch(dir: &Path) -> std::io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    extern "C" fn on_signal(_: nix::libc::c_int) {
        TERMINATING.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    // No SA_RESTART: a signal interrupts the blocking flock, and the loop looks at the flag.
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { sigaction(sig, &action) }?;
    }
    let terminating = || TERMINATING.load(std::sync::atomic::Ordering::SeqCst);
    let (lock, file) = open_lock(dir)?;
    let list = dir.join("guardian.list");
    eprintln!(
        "gpushare guardian: watching {} (thaws {} whenever no agent holds it)",
        lock.display(),
        list.display()
    );
    let mut agent_seen = false;
    loop {
        if !flock(&file, nix::libc::LOCK_SH | nix::libc::LOCK_NB)? {
            // An agent holds it: wait until it is gone (a signal interrupts the wait).
            agent_seen = true;
            if !flock(&file, nix::libc::LOCK_SH)? {
                continue;
            }
        }
        let n = thaw_listed(&list);
        if agent_seen {
            eprintln!(
                "gpushare guardian: agent gone, thawed {n} cgroup(s) from {}",
                list.display()
            );
        } else if n > 0 {
            eprintln!(
                "gpushare guardian: no agent yet, thawed {n} cgroup(s) an earlier one left in {}",
                list.display()
            );
        }
        agent_seen = false;
        flock(&file, nix::libc::LOCK_UN)?;
        // Until the next agent holds the lock (it retries while this holds it for a moment).
        loop {
            if terminating() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            if !flock(&file, nix::libc::LOCK_SH | nix::libc::LOCK_NB)? {
                break;
            }
            flock(&file, nix::libc::LOCK_UN)?;
        }
    }
}

/// Starts the guardian (`<exe> guardian --list LIST [--leave-cgroup ROOT]`) with a pipe on its
/// stdin. Keep the returned child alive for as long as the agent runs: dropping it does not
/// close the pipe; the agent's exit does.
pub fn spawn(exe: &Path, list: &Path, leave: Option<&Path>) -> std::io::Result<Guardian> {
    let mut cmd = Command::new(exe);
    cmd.arg("guardian").arg("--list").arg(list);
    if let Some(root) = leave {
        cmd.arg("--leave-cgroup").arg(root);
    }
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Guardian {
        child,
        list: list.to_path_buf(),
        leave: leave.map(Path::to_path_buf),
    })
}

use std::os::unix::process::CommandExt as _;

pub struct Guardian {
    pub child: Child,
    pub list: PathBuf,
    /// The cgroup root it leaves the agent's cgroups for (the agent's guardian), if any.
    pub leave: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::fixture::{get, put};

    #[test]
    fn thaws_v1_and_v2_dirs_from_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("v1");
        let v2 = dir.path().join("v2");
        put(&v1.join("freezer.state"), "FROZEN");
        put(&v2.join("cgroup.freeze"), "1");
        let list = dir.path().join("list");
        put(
            &list,
            &format!("{}\n{}\n/nonexistent/x\n", v1.display(), v2.display()),
        );
        assert_eq!(thaw_listed(&list), 2);
        assert_eq!(get(&v1.join("freezer.state")), "THAWED");
        assert_eq!(get(&v2.join("cgroup.freeze")), "0");
        assert_eq!(thaw_listed(&dir.path().join("missing")), 0);
    }

    #[test]
    fn each_line_of_proc_self_cgroup_finds_its_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["cpu,cpuacct", "freezer", "systemd", "unified"] {
            put(&root.join(d).join("cgroup.procs"), "");
        }
        put(&root.join("unified/cgroup.controllers"), "");
        let of = |line: &str| hierarchy_of(root, line);
        assert_eq!(
            of("4:cpu,cpuacct:/kubepods/pod1/c1"),
            Some((root.join("cpu,cpuacct"), "/kubepods/pod1/c1".into()))
        );
        assert_eq!(
            of("7:freezer:/kubepods/pod1/c1"),
            Some((root.join("freezer"), "/kubepods/pod1/c1".into()))
        );
        assert_eq!(
            of("1:name=systemd:/system.slice/x"),
            Some((root.join("systemd"), "/system.slice/x".into()))
        );
        assert_eq!(
            of("0::/system.slice/x"),
            Some((root.join("unified"), "/system.slice/x".into()))
        );
        // A hierarchy not mounted under the root, and a line that is not one.
        assert_eq!(of("9:net_cls,net_prio:/x"), None);
        assert_eq!(of("garbage"), None);
        // Pure v2: the root itself.
        let v2 = tempfile::tempdir().unwrap();
        put(&v2.path().join("cgroup.controllers"), "");
        assert_eq!(
            hierarchy_of(v2.path(), "0::/a/b"),
            Some((v2.path().to_path_buf(), "/a/b".into()))
        );
    }
}
