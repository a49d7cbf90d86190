//! The guardian: a small process the agent starts beside itself that thaws every cgroup the
//! controller may have frozen as soon as the agent is gone — however it went, SIGKILL
//! included. It holds the read end of a pipe whose write end only the agent has; when the
//! agent dies the kernel closes it, the guardian reads EOF, thaws the cgroups listed in the
//! controller's guardian list, and exits.
//!
//! Started by the agent, it first leaves the agent's cgroups for the root of every hierarchy
//! (`--leave-cgroup <cgroup root>`): a kill of the agent's whole container (`runc kill --all`
//! on a liveness restart, which freezes the container's cgroup and kills every process in it;
//! a cgroup-v2 `memory.oom.group` kill) then takes the agent and not the guardian, which thaws.

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

impl StateLock {
    pub fn take(dir: &Path) -> std::io::Result<StateLock> {
        use std::io::Write;
        std::fs::create_dir_all(dir)?;
        let path = dir.join("agent.lock");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own.
        if unsafe { nix::libc::flock(file.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB) }
            != 0
        {
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
