//! Fields of a `/proc/PID/stat` line. Field 2, the command name in parentheses, may hold
//! spaces and parentheses of its own, so the fields after it are counted from the last `)`.

/// The fields from field 3 (the state) on, or `None` when the line has no `)`.
pub fn after_comm(stat: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_ascii_whitespace())
}

/// Field 3: the state letter (`R`, `S`, `Z`, …).
pub fn state(stat: &str) -> Option<char> {
    after_comm(stat)?.next()?.chars().next()
}

/// Field 4: the parent's pid.
pub fn ppid(stat: &str) -> Option<u32> {
    after_comm(stat)?.nth(1)?.parse().ok()
}

/// Field 22: the start time, in clock ticks since boot.
pub fn start_time(stat: &str) -> Option<u64> {
    after_comm(stat)?.nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line of pid 7 with command name `comm` and start time `start`.
    fn line(comm: &str, start: u64) -> String {
        format!("7 ({comm}) S 1 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1 2")
    }

    #[test]
    fn fields_are_counted_after_the_last_parenthesis() {
        for (comm, start) in [
            ("a b", 42),
            ("x) S 1 2 3 (y", 43),
            (")", 44),
            ("a) b) (c", 45),
        ] {
            let l = line(comm, start);
            assert_eq!(start_time(&l), Some(start), "{l}");
            assert_eq!(state(&l), Some('S'), "{l}");
            assert_eq!(ppid(&l), Some(1), "{l}");
        }
        assert_eq!(start_time("7 (x) S 1 2"), None);
        assert_eq!(ppid("7 (x) S"), None);
        assert_eq!(state("7 (x)"), None);
        assert_eq!(ppid("7 (x) S one"), None);
        for garbage in ["no parens at all", ""] {
            assert_eq!(start_time(garbage), None);
            assert_eq!(state(garbage), None);
            assert_eq!(ppid(garbage), None);
        }
    }

    #[test]
    fn reads_this_process() {
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(start_time(&own).is_some(), "{own}");
        // The main thread waits for the test threads: running or sleeping.
        assert!(matches!(state(&own), Some('R' | 'S')), "{own}");
        assert_eq!(
            ppid(&own),
            Some(std::os::unix::process::parent_id()),
            "{own}"
        );
    }
}
