//! The guardian: a small process the agent starts beside itself that thaws every cgroup the
//! controller may have frozen as soon as the agent is gone — however it went, SIGKILL
//! included. It holds the read end of a pipe whose write end only the agent has; when the
//! agent dies the kernel closes it, the guardian reads EOF, thaws the cgroups listed in the
//! controller's guardian list, and exits.

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

/// The guardian's main: wait for EOF on stdin (the agent's death), then thaw. Termination
/// signals are ignored until then: under systemd's `KillMode=control-group` the guardian is
/// signalled in the same instant as the agent, and must outlive it to thaw.
pub fn run(list: &Path) -> std::io::Result<()> {
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

/// Starts the guardian (`<exe> guardian --list LIST`) with a pipe on its stdin. Keep the
/// returned child alive for as long as the agent runs: dropping it does not close the pipe;
/// the agent's exit does.
pub fn spawn(exe: &Path, list: &Path) -> std::io::Result<Guardian> {
    let child = Command::new(exe)
        .arg("guardian")
        .arg("--list")
        .arg(list)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(Guardian {
        child,
        list: list.to_path_buf(),
    })
}

use std::os::unix::process::CommandExt as _;

pub struct Guardian {
    pub child: Child,
    pub list: PathBuf,
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
}
