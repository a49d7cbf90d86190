//! The guardian process (`gpushare guardian`) as the node agent starts it, and the state
//! directory lock. No root needed: the guardian thaws a cgroup-v1-shaped directory in a
//! tempdir.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare::throttle::guardian::StateLock;

mod guardian_support;
use guardian_support::ignores_termination_signals;

/// One at a time: a process spawned by one test holds a copy of the other's lock descriptor
/// between its fork and its exec (the descriptor is close-on-exec).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn wait_exit(child: &mut std::process::Child, within: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Under systemd's default `KillMode=control-group` the guardian gets SIGTERM in the same
/// instant as the agent: it must ignore it, outlive the agent, and thaw.
#[test]
fn the_guardian_ignores_termination_signals_until_it_has_thawed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path().join("cg");
    std::fs::create_dir(&cg).unwrap();
    std::fs::write(cg.join("freezer.state"), "FROZEN").unwrap();
    let list = dir.path().join("guardian.list");
    std::fs::write(&list, format!("{}\n", cg.display())).unwrap();
    let mut guardian = Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .args(["guardian", "--list"])
        .arg(&list)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    ignores_termination_signals(guardian.id());
    let pid = nix::unistd::Pid::from_raw(guardian.id() as i32);
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        nix::sys::signal::kill(pid, sig).unwrap();
    }
    assert!(
        !wait_exit(&mut guardian, Duration::from_millis(500)),
        "the guardian died of a termination signal before the agent"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("freezer.state")).unwrap(),
        "FROZEN"
    );
    // The agent dies: its end of the pipe closes.
    let mut stdin = guardian.stdin.take().unwrap();
    stdin.write_all(b"x").unwrap();
    drop(stdin);
    assert!(
        wait_exit(&mut guardian, Duration::from_secs(10)),
        "guardian did not exit"
    );
    assert_eq!(
        std::fs::read_to_string(cg.join("freezer.state")).unwrap(),
        "THAWED"
    );
}

#[test]
fn one_agent_per_state_directory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let lock = StateLock::take(dir.path()).unwrap();
    let e = match StateLock::take(dir.path()) {
        Ok(_) => panic!("a second lock on the same state directory"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        e,
        format!(
            "{}/agent.lock is held by another gpushare process (pid {}); one agent per state directory",
            dir.path().display(),
            std::process::id()
        )
    );
    drop(lock);
    StateLock::take(dir.path()).expect("free again once the holder is gone");
}

/// The guardian in a container of its own (`--watch STATE_DIR`, the chart's `guardian`
/// container): it leaves what is frozen alone while an agent holds the state lock, thaws the
/// moment that agent is gone, waits for the next one and thaws again when it goes; a
/// termination signal ends it only after the agent has gone and it has thawed.
#[test]
fn a_watching_guardian_thaws_each_time_the_agent_is_gone() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path().join("cg");
    std::fs::create_dir(&cg).unwrap();
    let state = cg.join("freezer.state");
    std::fs::write(&state, "FROZEN").unwrap();
    std::fs::write(
        dir.path().join("guardian.list"),
        format!("{}\n", cg.display()),
    )
    .unwrap();
    let frozen = || std::fs::read_to_string(&state).unwrap() == "FROZEN";
    let thawed_within = |d: Duration| {
        let t0 = Instant::now();
        while t0.elapsed() < d {
            if !frozen() {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    };

    let agent = StateLock::take(dir.path()).unwrap();
    let mut guardian = Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .args(["guardian", "--watch"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(frozen(), "thawed while the agent holds the lock");

    drop(agent);
    let took = thawed_within(Duration::from_secs(2)).expect("not thawed after the agent went");
    eprintln!("thawed {took:?} after the first agent went");

    // The next agent takes the lock (the guardian holds a shared one only for moments) and
    // freezes again; a termination signal does not end the guardian while it runs.
    let agent = StateLock::take(dir.path()).expect("the next agent takes the lock");
    std::fs::write(&state, "FROZEN").unwrap();
    let pid = nix::unistd::Pid::from_raw(guardian.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(
        !wait_exit(&mut guardian, Duration::from_millis(500)),
        "the guardian ended on SIGTERM while the agent ran"
    );
    assert!(frozen(), "thawed while the next agent holds the lock");

    drop(agent);
    let took = thawed_within(Duration::from_secs(2)).expect("not thawed after the next agent went");
    eprintln!("thawed {took:?} after the next agent went");
    assert!(
        wait_exit(&mut guardian, Duration::from_secs(2)),
        "the guardian did not end after the agent went and it thawed"
    );
    assert!(guardian.wait().unwrap().success());
}
