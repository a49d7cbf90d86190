//! What the tests of the guardian process share: knowing when it has started.

use std::time::{Duration, Instant};

/// Waits (10 s at most) until process `pid` ignores SIGHUP, SIGINT and SIGTERM (its `SigIgn`
/// mask in /proc): the guardian's first step. A fixed sleep is too short on a loaded host,
/// where the signals would reach a guardian that has not started yet.
pub fn ignores_termination_signals(pid: u32) {
    use nix::sys::signal::Signal::{SIGHUP, SIGINT, SIGTERM};
    // Bit n - 1 of the mask stands for signal n.
    let want = [SIGHUP, SIGINT, SIGTERM]
        .iter()
        .fold(0u64, |m, &s| m | 1 << (s as i32 - 1));
    let t0 = Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let ignored = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .unwrap();
        if ignored & want == want {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the guardian does not ignore the termination signals: SigIgn {ignored:x}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
