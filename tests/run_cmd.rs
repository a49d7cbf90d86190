//! `gpushare run` end to end (root; real cgroups): the built binary runs a busy loop under
//! a 30 % quota on simulated GPU 0 and reports it as JSON; exit statuses pass through; the
//! run's cgroup is gone afterwards; bad flags are refused before anything is created.
//! Outside CI (`CI=true`) it skips, saying why, when not root.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

const BIN: &str = env!("CARGO_BIN_EXE_gpushare");
/// A busy loop of builtins for about 6 s (the `sleep` only times it).
const BUSY_6S: &str = "sleep 6 & p=$!; while kill -0 $p 2>/dev/null; do :; done";

/// One run at a time: the cgroup listings compare before and after, and a concurrent busy
/// loop would skew the measured utilization.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn needs_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("tests/run_cmd.rs needs root (CI=true)");
    }
    eprintln!("skipping: gpushare run needs root to create cgroups");
    false
}

/// What a root test holds while it runs: the one-at-a-time lock and a state directory; `None`
/// (the test skips) when not root.
fn as_root() -> Option<(MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !needs_root() {
        return None;
    }
    Some((one_at_a_time(), tempfile::tempdir().unwrap()))
}

/// `gpushare run --gpu-backend sim FLAGS -- sh -c SCRIPT`.
fn run_sh(flags: &[&str], script: &str, state_dir: &Path) -> Output {
    let mut args = vec!["--gpu-backend", "sim"];
    args.extend(flags);
    args.extend(["--", "sh", "-c", script]);
    run(&args, state_dir)
}

/// The run's config: its state (guardian list, sim directory) in a tempdir, the limiter built
/// by the workspace.
fn write_config(state_dir: &Path) -> std::path::PathBuf {
    let config = state_dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[limiter]\nlibrary = {:?}\n[throttle]\nstate_dir = {:?}\n",
            built("libgpushare_limiter.so"),
            state_dir.join("state")
        ),
    )
    .unwrap();
    config
}

fn run(args: &[&str], state_dir: &Path) -> Output {
    let config = write_config(state_dir);
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--config"]).arg(&config).args(args);
    let out = cmd.output().expect("run the gpushare binary");
    eprintln!(
        "gpushare run {args:?}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A file the workspace build put beside the gpushare binary (`cargo build --workspace`), or
/// in its `deps/` (`cargo test --workspace` builds the limiter and the fake driver there
/// without copying them up); the probe binaries are always beside it.
/// The newer of `target/<profile>/NAME` and `deps/NAME`: a copy left by an earlier
/// `cargo build` must not shadow the one this `cargo test` just rebuilt.
fn built(name: &str) -> std::path::PathBuf {
    let dir = Path::new(BIN).parent().unwrap();
    let found = [dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p);
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not built in {}: run `cargo test --workspace` (or `cargo build --workspace`)",
            dir.display()
        )
    })
}

/// `gpushare-run-*` cgroups in the v1 freezer and cpuacct hierarchies, or v2.
fn run_cgroups() -> Vec<String> {
    [
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup",
    ]
    .iter()
    .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
    .map(|e| e.path().display().to_string())
    .filter(|p| p.contains("gpushare-run-"))
    .collect()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn run_holds_a_busy_loop_to_30_percent_as_root() {
    let Some((_one, tmp)) = as_root() else {
        return;
    };
    let before = run_cgroups();
    let out = run_sh(
        &["--gpu", "0", "--memory", "1GiB", "--core", "30", "--json"],
        BUSY_6S,
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(0));
    let r = json(&out);
    assert_eq!(r["quota_core_percent"], 30);
    assert_eq!(r["quota_memory_mib"], 1024);
    assert_eq!(r["gpu"], 0);
    assert_eq!(r["policy"], "hard");
    assert_eq!(r["exit_status"], 0);
    let achieved = r["achieved_percent"].as_f64().expect("measured");
    let cgroup = r["cgroup"].as_str().expect("a cgroup").to_string();
    eprintln!(
        "achieved {achieved:.1} % of a 30 % quota over {:.1} s, held by {}, {} freezes",
        r["run_seconds"], r["held_by"], r["freezes"]
    );
    assert_eq!(r["held_by"], "freezer");
    assert!(
        (achieved - 30.0).abs() <= 7.0,
        "achieved {achieved:.1} % is not within 30 ± 7"
    );
    assert!(!Path::new(&cgroup).exists(), "{cgroup} removed");
    assert_eq!(run_cgroups(), before, "no run cgroup left");
    assert!(
        std::fs::read_dir(tmp.path().join("state"))
            .unwrap()
            .next()
            .is_none(),
        "the run's state directory is removed"
    );
}

#[test]
fn run_passes_the_exit_status_through_as_root() {
    let Some((_one, tmp)) = as_root() else {
        return;
    };
    let before = run_cgroups();
    let out = run_sh(
        &["--gpu", "1", "--memory", "512MiB", "--json"],
        "exit 3",
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(json(&out)["exit_status"], 3);
    let out = run_sh(
        &["--gpu", "0", "--memory", "1GiB", "--core", "50"],
        "kill -TERM $$",
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(128 + 15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("killed by signal 15 (exit status 143)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("quota 50 % compute (hard), 1024 MiB memory"),
        "{stderr}"
    );
    assert_eq!(run_cgroups(), before, "no run cgroup left");
}

#[test]
fn run_falls_back_to_signals_without_a_cgroup_as_root() {
    let Some((_one, tmp)) = as_root() else {
        return;
    };
    let out = run_sh(
        &[
            "--cgroup-root",
            "/nonexistent-cgroupfs",
            "--gpu",
            "0",
            "--memory",
            "1GiB",
            "--core",
            "30",
            "--json",
        ],
        "sleep 1; exit 4",
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("holding the quota by stopping and continuing the process tree"),
        "{stderr}"
    );
    let r = json(&out);
    assert_eq!(r["held_by"], "signals");
    assert!(r["cgroup"].is_null());
}

#[test]
fn bad_flags_are_refused_before_anything_is_created() {
    let _one = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let before = run_cgroups();
    for (args, want) in [
        (&["--core", "33"][..], "--core 33 is not a multiple of 5"),
        (
            &["--gpu", "7"][..],
            "--gpu 7 does not exist on this node (4 GPUs: 0-3)",
        ),
        (
            &["--memory", "20GiB"][..],
            "--memory 20GiB exceeds the memory of GPU 0 (15360 MiB)",
        ),
        (
            &["--memory", "2GB"][..],
            "--memory \"2GB\" is not a memory size like 2GiB or 2048MiB",
        ),
    ] {
        let mut full = vec![];
        for (flag, default) in [("--gpu", "0"), ("--memory", "1GiB"), ("--core", "30")] {
            if !args.contains(&flag) {
                full.extend([flag, default]);
            }
        }
        full.extend(args);
        let out = run_sh(&full, "echo ran", tmp.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?}",
            out.status
        );
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "the command did not run");
    }
    // clap's own refusals: exit 2.
    let out = run(
        &[
            "--gpu", "0", "--memory", "1GiB", "--policy", "soft", "--", "true",
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--gpu", "0", "--memory", "1GiB"], tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(run_cgroups(), before, "no run cgroup created");
    assert!(!tmp.path().join("state").exists(), "no state created");
}

/// The command gets the in-container limiter's view of its quota: the fake driver (on
/// `LD_LIBRARY_PATH`, standing in for the NVIDIA driver) says 15 GiB, the command sees 2 GiB
/// and cannot allocate past it.
#[test]
fn run_gives_the_command_the_limiter_view_as_root() {
    let Some((_lock, tmp)) = as_root() else {
        return;
    };
    let driver = tmp.path().join("driver");
    std::fs::create_dir_all(&driver).unwrap();
    std::fs::copy(built("libfake_cuda.so"), driver.join("libcuda.so.1")).unwrap();
    let probe = built("gpu-probe");
    let config = write_config(tmp.path());
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .args([
            "--gpu-backend",
            "sim",
            "--gpu",
            "0",
            "--memory",
            "2GiB",
            "--",
        ])
        .arg(&probe)
        .args(["dlopen", "init", "info", "alloc:1536", "alloc:1024"])
        .env("LD_LIBRARY_PATH", &driver)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "init rc=0",
            "info rc=0 free_mib=2048 total_mib=2048",
            "alloc rc=0 id=0",
            "alloc rc=2"
        ]
    );
    assert!(run_cgroups().is_empty(), "{:?}", run_cgroups());
    // Outside the run nothing changed: the fake driver alone says 15 GiB.
    let out = Command::new(&probe)
        .args(["dlopen", "init", "info"])
        .env("LD_LIBRARY_PATH", &driver)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("total_mib=15360"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
