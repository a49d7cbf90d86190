//! Host PID → container, through `/proc/PID/cgroup`.
//!
//! NVML reports the host PIDs using a GPU; the controller needs to know which container each
//! belongs to. The process's cgroup (the freezer hierarchy's on v1, the unified one on v2) is
//! matched against the containers' normalized cgroup paths; a process in a sub-cgroup of a
//! container's cgroup belongs to that container. Results, negative ones too, are cached per
//! (PID, start time), so a recycled PID is looked up afresh.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use gpushare_core::procstat;

use super::cgroup::{CgroupFs, CgroupVersion};

/// The cgroup path of the freezer hierarchy (v1, line `N:…freezer…:/path`) or of the unified
/// hierarchy (v2, line `0::/path`) in the content of `/proc/PID/cgroup`. A trailing
/// ` (deleted)` (cgroup removed while the process lives) is dropped.
pub fn parse_proc_cgroup(content: &str, version: CgroupVersion) -> Option<PathBuf> {
    content.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let wanted = match version {
            CgroupVersion::V1 => controllers.split(',').any(|c| c == "freezer"),
            CgroupVersion::V2 => id == "0" && controllers.is_empty(),
        };
        if !wanted || path.is_empty() {
            return None;
        }
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        Some(PathBuf::from(path))
    })
}

/// Cache of host PID → container id, keyed on (PID, start time).
#[derive(Debug)]
pub struct PidMap {
    proc_root: PathBuf,
    version: CgroupVersion,
    cache: HashMap<u32, (u64, Option<String>)>,
}

impl PidMap {
    /// `proc_root` is `/proc` in production; `version` selects which line of
    /// `/proc/PID/cgroup` is matched (the freezer's on v1, the unified one on v2).
    pub fn new(proc_root: impl Into<PathBuf>, version: CgroupVersion) -> Self {
        Self {
            proc_root: proc_root.into(),
            version,
            cache: HashMap::new(),
        }
    }

    /// Container id of host PID `pid`, given `containers`: normalized relative cgroup path
    /// (as [`CgroupFs::relative_path`] gives) → container id. A process in a sub-cgroup of a
    /// container's cgroup belongs to it (the deepest matching ancestor wins). `None` for a
    /// process of no listed container, or one that is gone.
    ///
    /// Cached per (pid, starttime), negative results too: call [`invalidate`](Self::invalidate)
    /// when `containers` changes.
    pub fn container_of(
        &mut self,
        pid: u32,
        containers: &HashMap<PathBuf, String>,
    ) -> Option<String> {
        let dir = self.proc_root.join(pid.to_string());
        let start = read_starttime(&dir)?;
        if let Some((cached_start, id)) = self.cache.get(&pid)
            && *cached_start == start
        {
            return id.clone();
        }
        let content = fs::read_to_string(dir.join("cgroup")).ok()?;
        // The PID may have been recycled between the two reads: only trust (and cache) the
        // answer when the start time is unchanged.
        if read_starttime(&dir)? != start {
            return None;
        }
        let id =
            parse_proc_cgroup(&content, self.version).and_then(|path| lookup(&path, containers));
        self.cache.insert(pid, (start, id.clone()));
        id
    }

    /// Drops cache entries for PIDs not in `live` (call once per sampling round with the PIDs
    /// NVML reported).
    pub fn retain(&mut self, live: &HashSet<u32>) {
        self.cache.retain(|pid, _| live.contains(pid));
    }

    /// Clears the cache (call when the container set changes).
    pub fn invalidate(&mut self) {
        self.cache.clear();
    }

    /// Number of cached PIDs.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

fn read_starttime(pid_dir: &Path) -> Option<u64> {
    procstat::start_time(&fs::read_to_string(pid_dir.join("stat")).ok()?)
}

/// The container owning cgroup `path` (absolute, as in `/proc/PID/cgroup`): the deepest of
/// its ancestors (itself included) listed in `containers`.
fn lookup(path: &Path, containers: &HashMap<PathBuf, String>) -> Option<String> {
    let path = path.to_str()?;
    if let Some(rest) = outside_own_namespace(path) {
        return lookup_by_suffix(&rest, containers);
    }
    let rel = CgroupFs::relative_path(path).ok()?;
    rel.ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .find_map(|a| containers.get(a).cloned())
}

/// For a process outside the reader's cgroup namespace, the components of its path below
/// the `..` steps. The kernel shows another process's cgroup relative to the reader's
/// namespace root: an agent in a container of its own cgroup namespace (cgroup v2, a
/// container that is not privileged) reads `/../../kubepods.slice/…/cri-containerd-ID.scope`
/// for the others. `None` for a path inside the namespace (or the root).
fn outside_own_namespace(path: &str) -> Option<Vec<&str>> {
    let mut parts = path.split('/').filter(|c| !c.is_empty()).peekable();
    if parts.peek() != Some(&"..") {
        return None;
    }
    Some(parts.skip_while(|c| *c == "..").collect())
}

/// [`lookup`] for a path known only below an unknown ancestor: the deepest of its ancestors
/// that ends exactly one container's path. A container's own cgroup (its leaf names the
/// container) is unique, so its suffix is too; an ancestor that ends several (or none) is
/// passed over.
fn lookup_by_suffix(rest: &[&str], containers: &HashMap<PathBuf, String>) -> Option<String> {
    (1..=rest.len()).rev().find_map(|k| {
        let tail = &rest[..k];
        let mut found = containers.iter().filter(|(p, _)| {
            let comps: Vec<&str> = p.iter().filter_map(|c| c.to_str()).collect();
            comps.len() >= tail.len() && comps[comps.len() - tail.len()..] == *tail
        });
        match (found.next(), found.next()) {
            (Some((_, id)), None) => Some(id.clone()),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use tempfile::TempDir;

    const V1_SAMPLE: &str = "\
12:hugetlb:/
11:freezer:/kubepods/burstable/pod1/abc
10:cpu,cpuacct:/kubepods/burstable/pod1/abc
9:name=systemd:/kubepods/burstable/pod1/abc
1:memory:/kubepods/burstable/pod1/abc
0::/
";

    const V2_SAMPLE: &str = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope\n";

    fn stat_line(pid: u32, comm: &str, start: u64) -> String {
        format!(
            "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 {start} 1234567 100 18446744073709551615\n"
        )
    }

    struct FakeProc {
        dir: TempDir,
    }

    impl FakeProc {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn set(&self, pid: u32, start: u64, cgroup: &str) {
            let d = self.dir.path().join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("stat"), stat_line(pid, "python3 (worker) x", start)).unwrap();
            fs::write(d.join("cgroup"), cgroup).unwrap();
        }

        fn remove(&self, pid: u32) {
            fs::remove_dir_all(self.dir.path().join(pid.to_string())).unwrap();
        }
    }

    fn v1_line(path: &str) -> String {
        format!("11:freezer:{path}\n10:cpu,cpuacct:/elsewhere\n0::/\n")
    }

    fn containers(entries: &[(&str, &str)]) -> HashMap<PathBuf, String> {
        entries
            .iter()
            .map(|(path, id)| (CgroupFs::relative_path(path).unwrap(), id.to_string()))
            .collect()
    }

    #[test]
    fn parse_proc_cgroup_v1_and_v2() {
        assert_eq!(
            parse_proc_cgroup(V1_SAMPLE, CgroupVersion::V1),
            Some(PathBuf::from("/kubepods/burstable/pod1/abc"))
        );
        // Hybrid host: the unified line is there too.
        assert_eq!(
            parse_proc_cgroup(V1_SAMPLE, CgroupVersion::V2),
            Some(PathBuf::from("/"))
        );
        assert_eq!(
            parse_proc_cgroup(V2_SAMPLE, CgroupVersion::V2),
            Some(PathBuf::from(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
            ))
        );
        assert_eq!(parse_proc_cgroup(V2_SAMPLE, CgroupVersion::V1), None);
        // freezer co-mounted with another controller; ':' inside the path.
        assert_eq!(
            parse_proc_cgroup("4:cpu,freezer:/a/b:c\n", CgroupVersion::V1),
            Some(PathBuf::from("/a/b:c"))
        );
        // Not fooled by a controller whose name merely contains "freezer".
        assert_eq!(
            parse_proc_cgroup("4:name=freezerx:/a\n", CgroupVersion::V1),
            None
        );
        assert_eq!(
            parse_proc_cgroup("0::/gone/abc (deleted)\n", CgroupVersion::V2),
            Some(PathBuf::from("/gone/abc"))
        );
        assert_eq!(parse_proc_cgroup("", CgroupVersion::V1), None);
        assert_eq!(parse_proc_cgroup("garbage\n", CgroupVersion::V2), None);
    }

    #[test]
    fn maps_pids_to_containers_incl_sub_cgroups() {
        let proc = FakeProc::new();
        let map_of = containers(&[
            ("/kubepods/burstable/pod1/abc", "abc"),
            ("kubepods-burstable-pod2.slice:cri-containerd:def", "def"),
        ]);
        proc.set(100, 1000, &v1_line("/kubepods/burstable/pod1/abc"));
        proc.set(
            101,
            1001,
            &v1_line("/kubepods/burstable/pod1/abc/sub/deeper"),
        );
        proc.set(102, 1002, &v1_line("/kubepods/burstable/pod1"));
        proc.set(103, 1003, &v1_line("/kubepods/burstable/pod1/abcd"));
        proc.set(104, 1004, &v1_line("/"));
        proc.set(
            105,
            1005,
            &v1_line("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2.slice/cri-containerd-def.scope"),
        );
        let mut pm = PidMap::new(proc.dir.path(), CgroupVersion::V1);
        assert_eq!(pm.container_of(100, &map_of).as_deref(), Some("abc"));
        assert_eq!(pm.container_of(101, &map_of).as_deref(), Some("abc"));
        assert_eq!(pm.container_of(102, &map_of), None, "parent of a container");
        assert_eq!(
            pm.container_of(103, &map_of),
            None,
            "prefix is not an ancestor"
        );
        assert_eq!(pm.container_of(104, &map_of), None, "root cgroup");
        assert_eq!(pm.container_of(105, &map_of).as_deref(), Some("def"));
        assert_eq!(pm.container_of(999, &map_of), None, "no such process");
        assert_eq!(pm.len(), 6, "gone processes are not cached");
    }

    /// The agent in a container with a cgroup namespace of its own (cgroup v2, not
    /// privileged) reads the others' cgroups through `..`: they are found by the end of
    /// their path.
    #[test]
    fn v2_from_inside_a_cgroup_namespace() {
        let proc = FakeProc::new();
        let leaf =
            "kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope";
        proc.set(300, 7, &format!("0::/../../{leaf}\n"));
        proc.set(301, 8, &format!("0::/../../{leaf}/worker\n"));
        proc.set(
            302,
            9,
            "0::/../../kubepods-burstable.slice/kubepods-burstable-pod1.slice\n",
        );
        proc.set(303, 10, "0::/..\n");
        proc.set(304, 11, "0::/../../other.slice/cri-containerd-abc.scope\n");
        let map_of = containers(&[
            (&format!("/kubepods.slice/{leaf}"), "abc"),
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2.slice/cri-containerd-def.scope",
                "def",
            ),
        ]);
        let mut pm = PidMap::new(proc.dir.path(), CgroupVersion::V2);
        assert_eq!(pm.container_of(300, &map_of).as_deref(), Some("abc"));
        assert_eq!(
            pm.container_of(301, &map_of).as_deref(),
            Some("abc"),
            "a sub-cgroup"
        );
        assert_eq!(pm.container_of(302, &map_of), None, "the pod's cgroup");
        assert_eq!(
            pm.container_of(303, &map_of),
            None,
            "an ancestor of the agent"
        );
        assert_eq!(
            pm.container_of(304, &map_of),
            None,
            "the leaf's name under another parent is not the container"
        );
        // Two containers ending alike: neither is guessed.
        let twins = containers(&[
            ("/a/x/cri-containerd-abc.scope", "one"),
            ("/b/x/cri-containerd-abc.scope", "two"),
        ]);
        proc.set(305, 12, "0::/../x/cri-containerd-abc.scope\n");
        assert_eq!(pm.container_of(305, &twins), None);
        assert_eq!(
            outside_own_namespace("/kubepods.slice/a"),
            None,
            "inside the namespace"
        );
        assert_eq!(outside_own_namespace("/../..a/b"), Some(vec!["..a", "b"]));
    }

    #[test]
    fn v2_uses_the_unified_line() {
        let proc = FakeProc::new();
        proc.set(
            200,
            5,
            "11:freezer:/\n0::/gpushare-e2e/try.1/poduid-gpod/cid1/init\n",
        );
        let map_of = containers(&[("/gpushare-e2e/try.1/poduid-gpod/cid1", "cid1")]);
        let mut v2 = PidMap::new(proc.dir.path(), CgroupVersion::V2);
        assert_eq!(v2.container_of(200, &map_of).as_deref(), Some("cid1"));
        let mut v1 = PidMap::new(proc.dir.path(), CgroupVersion::V1);
        assert_eq!(v1.container_of(200, &map_of), None);
    }

    #[test]
    fn deepest_listed_ancestor_wins() {
        let proc = FakeProc::new();
        proc.set(1, 1, &v1_line("/a/b/c/d"));
        let map_of = containers(&[("/a", "outer"), ("/a/b/c", "inner")]);
        let mut pm = PidMap::new(proc.dir.path(), CgroupVersion::V1);
        assert_eq!(pm.container_of(1, &map_of).as_deref(), Some("inner"));
    }

    #[test]
    fn cache_is_keyed_on_starttime_and_holds_negatives() {
        let proc = FakeProc::new();
        let map_of = containers(&[("/k/pod/abc", "abc"), ("/k/pod/xyz", "xyz")]);
        let mut pm = PidMap::new(proc.dir.path(), CgroupVersion::V1);
        proc.set(300, 10, &v1_line("/k/pod/abc"));
        assert_eq!(pm.container_of(300, &map_of).as_deref(), Some("abc"));
        // Same process (same start time): the cached answer, /proc is not read again.
        proc.set(300, 10, &v1_line("/k/pod/xyz"));
        assert_eq!(pm.container_of(300, &map_of).as_deref(), Some("abc"));
        // PID reused by a new process (new start time): looked up again.
        proc.set(300, 11, &v1_line("/k/pod/xyz"));
        assert_eq!(pm.container_of(300, &map_of).as_deref(), Some("xyz"));
        // Reused by a process of no container: a cached negative.
        proc.set(300, 12, &v1_line("/system.slice/sshd.service"));
        assert_eq!(pm.container_of(300, &map_of), None);
        let more = containers(&[("/system.slice/sshd.service", "sshd")]);
        assert_eq!(pm.container_of(300, &more), None, "negative result cached");
        pm.invalidate();
        assert!(pm.is_empty());
        assert_eq!(pm.container_of(300, &more).as_deref(), Some("sshd"));
        // A process that exited is not answered from the cache.
        proc.remove(300);
        assert_eq!(pm.container_of(300, &more), None);
    }

    #[test]
    fn retain_drops_dead_pids() {
        let proc = FakeProc::new();
        let map_of = containers(&[("/k/abc", "abc")]);
        let mut pm = PidMap::new(proc.dir.path(), CgroupVersion::V1);
        for pid in [1, 2, 3] {
            proc.set(pid, 100 + u64::from(pid), &v1_line("/k/abc"));
            assert_eq!(pm.container_of(pid, &map_of).as_deref(), Some("abc"));
        }
        assert_eq!(pm.len(), 3);
        pm.retain(&HashSet::from([2, 42]));
        assert_eq!(pm.len(), 1);
        assert_eq!(pm.container_of(2, &map_of).as_deref(), Some("abc"));
        pm.retain(&HashSet::new());
        assert!(pm.is_empty());
    }

    #[test]
    fn real_proc_self_is_in_no_listed_container() {
        let map_of = containers(&[("/gpushare-no-such/cgroup", "x")]);
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let mut pm = PidMap::new("/proc", version);
            assert_eq!(pm.container_of(std::process::id(), &map_of), None);
        }
    }
}
