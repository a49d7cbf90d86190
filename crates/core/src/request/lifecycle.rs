//! What a pod holds of a GPU at once, given when its containers run (Kubernetes' pod
//! lifecycle). Regular init containers run one at a time, to completion, before the app
//! containers; an init container with `restartPolicy: Always` (a native sidecar) starts in
//! its turn and runs alongside everything after it, to the pod's end. So a pod holds at most
//! `max(app containers + sidecars, max over init containers i of (i + sidecars before i))`:
//! Kubernetes' effective request, taken here per GPU for memory and for compute separately.
//!
//! The scheduler places a pod by it ([`peak`] of the pod's limits) and rebuilds its books from
//! the assignment by it ([`peak_per_gpu`]), so both agree; `gpushare inspect` counts it too.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ASSIGNMENT_ANNOTATION, Assignment, RequestError};

/// When a container of a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerRole {
    /// A regular init container: runs alone (beside the sidecars started before it) and ends
    /// before the next one starts.
    Init,
    /// An init container with `restartPolicy: Always`: runs from its turn to the pod's end.
    Sidecar,
    /// A container of `spec.containers`: runs with the others and the sidecars.
    App,
}

impl ContainerRole {
    /// Runs to the pod's end (what the node must hold for as long as the pod runs).
    pub fn is_long_running(self) -> bool {
        !matches!(self, ContainerRole::Init)
    }
}

/// What a container or a pod takes of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    pub memory_mib: u64,
    /// Percent of the GPU; 0 without a compute quota.
    pub core_percent: u32,
}

impl Amount {
    /// Both sums, or `None` when the memory sum does not fit 64 bits (core saturates: every
    /// share is at most 100, and a sum over 100 is refused by every caller anyway).
    fn checked_add(self, o: Amount) -> Option<Amount> {
        Some(Amount {
            memory_mib: self.memory_mib.checked_add(o.memory_mib)?,
            core_percent: self.core_percent.saturating_add(o.core_percent),
        })
    }

    fn max(self, o: Amount) -> Amount {
        Amount {
            memory_mib: self.memory_mib.max(o.memory_mib),
            core_percent: self.core_percent.max(o.core_percent),
        }
    }
}

/// The most a pod holds at once, from its containers in pod order (`spec.initContainers` in
/// their order, then `spec.containers`): see the module doc. `None` when a memory sum does
/// not fit 64 bits.
pub fn peak(containers: impl IntoIterator<Item = (ContainerRole, Amount)>) -> Option<Amount> {
    let mut sidecars = Amount::default();
    let mut apps = Amount::default();
    let mut inits = Amount::default();
    for (role, a) in containers {
        match role {
            ContainerRole::Init => inits = inits.max(sidecars.checked_add(a)?),
            ContainerRole::Sidecar => sidecars = sidecars.checked_add(a)?,
            ContainerRole::App => apps = apps.checked_add(a)?,
        }
    }
    Some(sidecars.checked_add(apps)?.max(inits))
}

/// What the pod of assignment `a` holds of each GPU it names, by [`peak`]. `roles`: the pod's
/// containers in pod order; an entry of `a` for a container not among them counts as an app
/// container (never less than it takes). Compute shares are taken in [0, 100].
pub fn peak_per_gpu(
    a: &Assignment,
    roles: &[(&str, ContainerRole)],
) -> Result<BTreeMap<u32, Amount>, RequestError> {
    let known = |name: &str| roles.iter().any(|(n, _)| *n == name);
    let order = roles.iter().copied().chain(
        a.containers
            .keys()
            .filter(|n| !known(n))
            .map(|n| (n.as_str(), ContainerRole::App)),
    );
    let mut per_gpu: BTreeMap<u32, Vec<(ContainerRole, Amount)>> = BTreeMap::new();
    for (name, role) in order {
        for s in a.containers.get(name).into_iter().flatten() {
            per_gpu.entry(s.gpu_index).or_default().push((
                role,
                Amount {
                    memory_mib: s.memory_mib,
                    core_percent: s.core_percent.map_or(0, |c| c.clamp(0, 100) as u32),
                },
            ));
        }
    }
    per_gpu
        .into_iter()
        .map(|(gpu, holds)| {
            // Checked: the annotation bounds each share, not how many there are.
            let p = peak(holds).ok_or_else(|| RequestError::SumTooLarge {
                what: format!("{ASSIGNMENT_ANNOTATION} memoryMiB on GPU {gpu}"),
                max: u64::MAX,
            })?;
            Ok((gpu, p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::ContainerRole::{App, Init, Sidecar};
    use super::*;
    use crate::request::GpuShare;

    fn amt(memory_mib: u64, core_percent: u32) -> Amount {
        Amount {
            memory_mib,
            core_percent,
        }
    }

    #[test]
    fn init_containers_take_the_max_not_the_sum() {
        // Init 4 GiB, app 2 GiB: 4 GiB.
        assert_eq!(
            peak([(Init, amt(4096, 0)), (App, amt(2048, 0))]),
            Some(amt(4096, 0))
        );
        // Memory and compute each by itself: init 1 GiB / 50 %, app 2 GiB / 30 %.
        assert_eq!(
            peak([(Init, amt(1024, 50)), (App, amt(2048, 30))]),
            Some(amt(2048, 50))
        );
        // Two init containers run one after the other.
        assert_eq!(
            peak([
                (Init, amt(3072, 20)),
                (Init, amt(1024, 40)),
                (App, amt(1024, 10))
            ]),
            Some(amt(3072, 40))
        );
        // App containers add up.
        assert_eq!(
            peak([(App, amt(1024, 10)), (App, amt(2048, 20))]),
            Some(amt(3072, 30))
        );
        assert_eq!(peak([]), Some(Amount::default()));
    }

    #[test]
    fn sidecars_run_alongside_what_comes_after_them() {
        // Sidecar 1 GiB, then init 2 GiB, then app 2 GiB: 1 + 2 at both times.
        assert_eq!(
            peak([
                (Sidecar, amt(1024, 10)),
                (Init, amt(2048, 20)),
                (App, amt(2048, 20))
            ]),
            Some(amt(3072, 30))
        );
        // An init container before the sidecar runs without it.
        assert_eq!(
            peak([
                (Init, amt(4096, 60)),
                (Sidecar, amt(1024, 10)),
                (App, amt(2048, 20))
            ]),
            Some(amt(4096, 60))
        );
        // An init container after the sidecar runs with it.
        assert_eq!(
            peak([
                (Sidecar, amt(1024, 10)),
                (Init, amt(4096, 60)),
                (App, amt(2048, 20))
            ]),
            Some(amt(5120, 70))
        );
    }

    #[test]
    fn memory_sums_that_do_not_fit_are_none() {
        assert_eq!(
            peak([(App, amt(u64::MAX, 0)), (App, amt(1, 0))]),
            None,
            "apps"
        );
        assert_eq!(
            peak([(Sidecar, amt(u64::MAX, 0)), (Init, amt(1, 0))]),
            None,
            "sidecar + init"
        );
        // Init containers do not add up: no overflow.
        assert_eq!(
            peak([(Init, amt(u64::MAX, 0)), (Init, amt(u64::MAX, 0))]),
            Some(amt(u64::MAX, 0))
        );
    }

    fn share(gpu_index: u32, memory_mib: u64, core: Option<i64>) -> GpuShare {
        GpuShare {
            gpu_index,
            gpu_uuid: String::new(),
            memory_mib,
            core_percent: core,
        }
    }

    #[test]
    fn per_gpu_from_an_assignment_and_the_roles() {
        let a = Assignment {
            version: 1,
            timestamp: None,
            containers: [
                ("prep".to_string(), vec![share(1, 4096, Some(50))]),
                ("main".to_string(), vec![share(1, 2048, Some(30))]),
            ]
            .into(),
        };
        let roles = [("prep", Init), ("main", App)];
        assert_eq!(
            peak_per_gpu(&a, &roles).unwrap(),
            BTreeMap::from([(1, amt(4096, 50))])
        );
        // Without the pod's spec every container counts as an app container.
        assert_eq!(
            peak_per_gpu(&a, &[]).unwrap(),
            BTreeMap::from([(1, amt(6144, 80))])
        );
        // Several GPUs: each by itself.
        let a = Assignment {
            version: 1,
            timestamp: None,
            containers: [
                (
                    "prep".to_string(),
                    vec![share(0, 4096, None), share(2, 4096, None)],
                ),
                (
                    "main".to_string(),
                    vec![share(0, 2048, None), share(2, 2048, None)],
                ),
            ]
            .into(),
        };
        assert_eq!(
            peak_per_gpu(&a, &roles).unwrap(),
            BTreeMap::from([(0, amt(4096, 0)), (2, amt(4096, 0))])
        );
    }
}
