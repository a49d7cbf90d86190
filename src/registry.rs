//! The node's registry of GPU containers: who has which GPU share, and where its cgroup is.
//! Filled by CreateContainer, rebuilt from Synchronize after (re)connecting, pruned by
//! RemoveContainer. The throttling controller reads it.

use std::collections::BTreeMap;
use std::sync::RwLock;

use serde::Serialize;

use gpushare_core::request::AssignedGpu;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    Created,
    Running,
    Stopped,
    Unknown,
}

/// One GPU container known to the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRecord {
    pub id: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub container_name: String,
    /// The container's cgroup path as the runtime reports it (cgroupfs path or systemd
    /// `slice:prefix:name` form).
    pub cgroups_path: String,
    pub pid: u32,
    pub state: ContainerState,
    pub gpus: Vec<AssignedGpu>,
}

/// Memory and core committed on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Committed {
    pub memory_mib: u64,
    pub core_percent: u32,
    pub containers: usize,
}

#[derive(Debug, Default)]
pub struct Registry {
    inner: RwLock<BTreeMap<String, ContainerRecord>>,
    /// Bumped (under the write lock) by every change, so a reader can tell that nothing
    /// changed since its last snapshot without taking one.
    generation: std::sync::atomic::AtomicU64,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The write lock, with the generation bumped: whoever takes it may change the map.
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, ContainerRecord>> {
        let guard = self.inner.write().expect("registry lock");
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        guard
    }

    /// Changes with every write; equal values mean equal contents (read it before taking the
    /// snapshot it stands for).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn upsert(&self, rec: ContainerRecord) {
        self.write().insert(rec.id.clone(), rec);
    }

    pub fn remove(&self, id: &str) -> Option<ContainerRecord> {
        self.write().remove(id)
    }

    pub fn set_state(&self, id: &str, state: ContainerState) {
        if let Some(r) = self.write().get_mut(id) {
            r.state = state;
        }
    }

    /// Replaces the whole registry (after a complete Synchronize).
    pub fn replace_all(&self, records: Vec<ContainerRecord>) {
        let map = records.into_iter().map(|r| (r.id.clone(), r)).collect();
        *self.write() = map;
    }

    pub fn get(&self, id: &str) -> Option<ContainerRecord> {
        self.inner.read().expect("registry lock").get(id).cloned()
    }

    pub fn snapshot(&self) -> Vec<ContainerRecord> {
        self.inner
            .read()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }

    /// What containers other than `except` that are not stopped hold on GPU `index`. A
    /// stopped container holds nothing: containerd sends StopContainer when a task exits by
    /// itself too, so a finished init container frees its share for the app containers after
    /// it (the scheduler placed the pod for the larger of the two, not their sum).
    pub fn committed(&self, index: u32, except: &str) -> Committed {
        let inner = self.inner.read().expect("registry lock");
        let mut c = Committed::default();
        for r in inner.values() {
            if r.id == except || r.state == ContainerState::Stopped {
                continue;
            }
            // Saturating: records come from validated requests, but a sum must never wrap
            // into room that is not there.
            for g in r.gpus.iter().filter(|g| g.index == index) {
                c.memory_mib = c.memory_mib.saturating_add(g.memory_mib);
                c.core_percent = c.core_percent.saturating_add(g.core_percent.unwrap_or(0));
                c.containers += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        id: &str,
        gpu: u32,
        mem: u64,
        core: Option<u32>,
        state: ContainerState,
    ) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            pod_namespace: "default".into(),
            pod_name: "p".into(),
            pod_uid: "u".into(),
            container_name: "c".into(),
            cgroups_path: "/k8s/x".into(),
            pid: 0,
            state,
            gpus: vec![AssignedGpu {
                index: gpu,
                uuid: "GPU-x".into(),
                minor: gpu,
                memory_mib: mem,
                gpu_memory_mib: 15360,
                core_percent: core,
            }],
        }
    }

    #[test]
    fn committed_sums_live_containers_on_one_gpu() {
        // Hardening item 7: sums saturate instead of wrapping (or panicking).
        let big = Registry::new();
        big.upsert(rec(
            "x",
            0,
            u64::MAX,
            Some(u32::MAX),
            ContainerState::Running,
        ));
        big.upsert(rec("y", 0, 2, Some(2), ContainerState::Running));
        let c = big.committed(0, "");
        assert_eq!((c.memory_mib, c.core_percent), (u64::MAX, u32::MAX));

        let r = Registry::new();
        r.upsert(rec("a", 1, 2048, Some(30), ContainerState::Running));
        r.upsert(rec("b", 1, 1024, None, ContainerState::Created));
        r.upsert(rec("c", 1, 4096, Some(50), ContainerState::Stopped));
        r.upsert(rec("d", 2, 8192, Some(50), ContainerState::Running));
        assert_eq!(
            r.committed(1, ""),
            Committed {
                memory_mib: 3072,
                core_percent: 30,
                containers: 2
            }
        );
        assert_eq!(r.committed(1, "a").memory_mib, 1024);
        r.replace_all(vec![rec("z", 1, 1, None, ContainerState::Running)]);
        assert_eq!(r.snapshot().len(), 1);
        assert!(r.remove("z").is_some());
        assert!(r.snapshot().is_empty());
    }

    #[test]
    fn every_change_bumps_the_generation_and_reads_do_not() {
        let r = Registry::new();
        let mut seen = vec![r.generation()];
        r.upsert(rec("a", 1, 2048, Some(30), ContainerState::Created));
        seen.push(r.generation());
        r.set_state("a", ContainerState::Running);
        seen.push(r.generation());
        let _ = (r.snapshot(), r.get("a"), r.committed(1, ""));
        assert_eq!(r.generation(), seen[2], "reads change nothing");
        r.remove("a");
        seen.push(r.generation());
        r.replace_all(vec![]);
        seen.push(r.generation());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    }
}
