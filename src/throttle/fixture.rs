//! Test fixtures of the throttle layer, in one place for its unit tests (`cgroup`,
//! `controller`) and the real-cgroup integration tests (`tests/throttle_real_cgroups.rs`):
//! tempdir trees laid out like cgroupfs, the root check of real-cgroup tests, and a busy
//! process to throttle. Not part of the agent's interface.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::cgroup::{CgroupFs, CgroupVersion};

/// Writes `content` to `path`, creating its parent directories (fake trees only).
pub fn put(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().expect("a file path")).expect("create fake directories");
    fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The content of `path`.
pub fn get(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `root` (a tempdir) laid out like a v1 cgroupfs (`freezer` and `cpuacct` hierarchies),
/// with `rels` as cgroups (see [`add_fake_cgroup`]).
pub fn fake_v1(root: &Path, rels: &[&str]) -> CgroupFs {
    fs::create_dir_all(root.join("freezer")).expect("create fake freezer");
    fs::create_dir_all(root.join("cpuacct")).expect("create fake cpuacct");
    let fs = CgroupFs::new(root, CgroupVersion::V1);
    for rel in rels {
        add_fake_cgroup(&fs, rel);
    }
    fs
}

/// `root` (a tempdir) laid out like a v2 cgroupfs (`cgroup.controllers` at the root), with
/// `rels` as cgroups (see [`add_fake_cgroup`]).
pub fn fake_v2(root: &Path, rels: &[&str]) -> CgroupFs {
    put(&root.join("cgroup.controllers"), "cpu memory\n");
    let fs = CgroupFs::new(root, CgroupVersion::V2);
    for rel in rels {
        add_fake_cgroup(&fs, rel);
    }
    fs
}

/// Adds cgroup `rel` to a fake tree with the plain files the kernel would give it (what a
/// `mkdir` on a real cgroupfs does): v1 `freezer/<rel>/{freezer.state,cgroup.procs}` and
/// `cpuacct/<rel>/cpuacct.usage`; v2 `<rel>/{cgroup.freeze,cgroup.events,cgroup.procs,
/// cpu.stat}`.
pub fn add_fake_cgroup(fs: &CgroupFs, rel: &str) {
    let freezer = fs.freezer_root().join(rel);
    put(&freezer.join("cgroup.procs"), "");
    match fs.version() {
        CgroupVersion::V1 => {
            put(&freezer.join("freezer.state"), "THAWED\n");
            put(&fs.cpu_root().join(rel).join("cpuacct.usage"), "0\n");
        }
        CgroupVersion::V2 => {
            put(&freezer.join("cgroup.freeze"), "0\n");
            put(&freezer.join("cgroup.events"), "populated 1\nfrozen 0\n");
            put(
                &freezer.join("cpu.stat"),
                "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
            );
        }
    }
}

/// Whether a real-cgroup test can run: true as root; in CI (`CI=true`) a missing root is a
/// failure, elsewhere the test says it skips.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("real-cgroup test needs root (CI=true)");
    }
    eprintln!("skipping: real-cgroup test needs root");
    false
}

/// A process that burns one CPU until killed.
pub fn busy_process() -> Child {
    Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a busy sh")
}

/// Moves `pid` into the real cgroup directory `dir` (test set-up, outside the layer).
pub fn enter(dir: &Path, pid: u32) {
    fs::write(dir.join("cgroup.procs"), pid.to_string())
        .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", dir.display()));
}
