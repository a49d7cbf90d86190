//! What each extended resource advertises and grants: device lists and `Allocate` answers.
//!
//! Pure: no IO. Kubelet counts extended resources in devices, so each resource is one device
//! per unit: per memory unit (GiB by default) of every GPU, per percent of every GPU's compute,
//! and per GPU. Device IDs are stable and readable (`gpu-mem-1-7`, `gpu-core-1-29`, `gpu-1`), so
//! kubelet's checkpoint survives an agent restart.

use std::collections::HashSet;

use super::api;
use gpushare_core::echo::Echo;
use gpushare_core::inventory::Inventory;
use gpushare_core::request::ResourceNames;
use gpushare_core::request::limits::{
    GRANTED_CORE_ANNOTATION, GRANTED_COUNT_ANNOTATION, GRANTED_MEM_ANNOTATION,
};

/// Device health values of the API (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go`).
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

pub use crate::gpu::health::Unhealthy;

/// Devices of one GPU for the core resource: one per percent.
pub const CORE_DEVICES_PER_GPU: u32 = 100;

/// The three resources; kubelet registers one resource per plugin endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    Memory,
    Core,
    Count,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 3] = [
        ResourceKind::Memory,
        ResourceKind::Core,
        ResourceKind::Count,
    ];

    /// The endpoint's socket file name in the kubelet's device-plugin directory.
    pub fn socket_name(self) -> &'static str {
        match self {
            ResourceKind::Memory => "gpushare-mem.sock",
            ResourceKind::Core => "gpushare-core.sock",
            ResourceKind::Count => "gpushare-count.sock",
        }
    }

    /// The container annotation `Allocate` returns: how many units kubelet granted.
    pub fn grant_annotation(self) -> &'static str {
        match self {
            ResourceKind::Memory => GRANTED_MEM_ANNOTATION,
            ResourceKind::Core => GRANTED_CORE_ANNOTATION,
            ResourceKind::Count => GRANTED_COUNT_ANNOTATION,
        }
    }

    /// The configured extended-resource name.
    pub fn resource_name(self, names: &ResourceNames) -> &str {
        match self {
            ResourceKind::Memory => &names.memory,
            ResourceKind::Core => &names.core,
            ResourceKind::Count => &names.count,
        }
    }

    /// Device ID of unit `n` of GPU `gpu`.
    pub fn device_id(self, gpu: u32, n: u32) -> String {
        match self {
            ResourceKind::Memory => format!("gpu-mem-{gpu}-{n}"),
            ResourceKind::Core => format!("gpu-core-{gpu}-{n}"),
            ResourceKind::Count => format!("gpu-{gpu}"),
        }
    }
}

impl std::fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResourceKind::Memory => "memory",
            ResourceKind::Core => "core",
            ResourceKind::Count => "count",
        })
    }
}

/// Why `Allocate` is refused (kubelet then fails the pod's admission with this message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("{resource}: container request {container} lists unknown device ID {id}")]
    UnknownDevice {
        resource: String,
        container: usize,
        id: Echo,
    },
    #[error("{resource}: container request {container} lists no device")]
    NoDevices { resource: String, container: usize },
}

/// One resource of this node: its devices, per GPU.
#[derive(Debug, Clone)]
pub struct ResourceSpec {
    pub kind: ResourceKind,
    pub resource_name: String,
    /// `(GPU index, device IDs of that GPU)`, ordered by index.
    gpus: Vec<(u32, Vec<String>)>,
    known: HashSet<String>,
}

impl ResourceSpec {
    pub fn new(kind: ResourceKind, inv: &Inventory, names: &ResourceNames) -> ResourceSpec {
        let unit_mib = names.memory_unit.mib();
        let gpus: Vec<(u32, Vec<String>)> = inv
            .gpus
            .iter()
            .map(|g| {
                let units = match kind {
                    ResourceKind::Memory => {
                        u32::try_from(g.memory_mib / unit_mib).unwrap_or(u32::MAX)
                    }
                    ResourceKind::Core => CORE_DEVICES_PER_GPU,
                    ResourceKind::Count => 1,
                };
                (
                    g.index,
                    (0..units).map(|n| kind.device_id(g.index, n)).collect(),
                )
            })
            .collect();
        let known = gpus
            .iter()
            .flat_map(|(_, ids)| ids.iter().cloned())
            .collect();
        ResourceSpec {
            kind,
            resource_name: kind.resource_name(names).to_string(),
            gpus,
            known,
        }
    }

    /// Number of devices (the capacity kubelet will report).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The device list for `ListAndWatch`: every unit of a GPU has that GPU's health.
    pub fn devices(&self, unhealthy: &Unhealthy) -> Vec<api::Device> {
        self.gpus
            .iter()
            .flat_map(|(gpu, ids)| {
                let health = if unhealthy.contains(gpu) {
                    UNHEALTHY
                } else {
                    HEALTHY
                };
                ids.iter().map(move |id| api::Device {
                    id: id.clone(),
                    health: health.to_string(),
                    topology: None,
                })
            })
            .collect()
    }

    /// One response per container request, in order, each carrying the grant annotation
    /// (`gpushare.io/granted-mem: "2"` for two memory devices). No env, mounts or devices:
    /// the NRI plugin injects the GPU the scheduler assigned, checked against this grant.
    pub fn allocate(
        &self,
        req: &api::AllocateRequest,
    ) -> Result<api::AllocateResponse, AllocateError> {
        let mut container_responses = Vec::with_capacity(req.container_requests.len());
        for (i, c) in req.container_requests.iter().enumerate() {
            if c.devices_ids.is_empty() {
                return Err(AllocateError::NoDevices {
                    resource: self.resource_name.clone(),
                    container: i,
                });
            }
            if let Some(id) = c.devices_ids.iter().find(|id| !self.known.contains(*id)) {
                return Err(AllocateError::UnknownDevice {
                    resource: self.resource_name.clone(),
                    container: i,
                    id: Echo::new(id),
                });
            }
            let units = c.devices_ids.iter().collect::<HashSet<_>>().len();
            container_responses.push(api::ContainerAllocateResponse {
                annotations: [(self.kind.grant_annotation().to_string(), units.to_string())].into(),
                ..Default::default()
            });
        }
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::inventory::{SimConfig, sim_inventory};
    use gpushare_core::request::MemoryUnit;

    fn four_by_15gib() -> Inventory {
        Inventory::new(sim_inventory(&SimConfig::default(), "n"))
    }

    #[test]
    fn device_counts_match_capacity() {
        let inv = four_by_15gib();
        let names = ResourceNames::default();
        let lens: Vec<usize> = ResourceKind::ALL
            .iter()
            .map(|k| ResourceSpec::new(*k, &inv, &names).len())
            .collect();
        assert_eq!(lens, vec![60, 400, 4]);
        let mib = ResourceNames {
            memory_unit: MemoryUnit::MiB,
            ..Default::default()
        };
        assert_eq!(
            ResourceSpec::new(ResourceKind::Memory, &inv, &mib).len(),
            4 * 15360
        );
    }

    #[test]
    fn ids_are_stable_readable_and_follow_gpu_health() {
        let inv = four_by_15gib();
        let spec = ResourceSpec::new(ResourceKind::Memory, &inv, &Default::default());
        let devs = spec.devices(&Unhealthy::new());
        assert_eq!(devs[0].id, "gpu-mem-0-0");
        assert_eq!(devs[14].id, "gpu-mem-0-14");
        assert_eq!(devs[15].id, "gpu-mem-1-0");
        assert!(devs.iter().all(|d| d.health == HEALTHY));
        let again = ResourceSpec::new(ResourceKind::Memory, &inv, &Default::default());
        assert_eq!(again.devices(&Unhealthy::new()), devs);

        let sick = spec.devices(&[1].into());
        let unhealthy: Vec<&str> = sick
            .iter()
            .filter(|d| d.health == UNHEALTHY)
            .map(|d| d.id.as_str())
            .collect();
        assert_eq!(unhealthy.len(), 15);
        assert!(unhealthy.iter().all(|id| id.starts_with("gpu-mem-1-")));

        let count = ResourceSpec::new(ResourceKind::Count, &inv, &Default::default());
        let ids: Vec<String> = count
            .devices(&Unhealthy::new())
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(ids, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
        let core = ResourceSpec::new(ResourceKind::Core, &inv, &Default::default());
        assert_eq!(core.devices(&Unhealthy::new())[399].id, "gpu-core-3-99");
    }

    fn request(containers: &[&[&str]]) -> api::AllocateRequest {
        api::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| api::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn allocate_grants_the_device_count_per_container_in_order() {
        let inv = four_by_15gib();
        let mem = ResourceSpec::new(ResourceKind::Memory, &inv, &Default::default());
        let resp = mem
            .allocate(&request(&[
                &["gpu-mem-0-0", "gpu-mem-0-1"],
                &["gpu-mem-2-3"],
                &["gpu-mem-1-0", "gpu-mem-1-1", "gpu-mem-3-14"],
            ]))
            .unwrap();
        let grants: Vec<&str> = resp
            .container_responses
            .iter()
            .map(|c| c.annotations[GRANTED_MEM_ANNOTATION].as_str())
            .collect();
        assert_eq!(grants, ["2", "1", "3"]);
        let c = &resp.container_responses[0];
        assert!(c.envs.is_empty() && c.devices.is_empty() && c.mounts.is_empty());
        assert_eq!(c.annotations.len(), 1);

        let core = ResourceSpec::new(ResourceKind::Core, &inv, &Default::default());
        let ids: Vec<String> = (0..30).map(|n| format!("gpu-core-2-{n}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let resp = core.allocate(&request(&[&ids])).unwrap();
        assert_eq!(
            resp.container_responses[0].annotations[GRANTED_CORE_ANNOTATION],
            "30"
        );
        let count = ResourceSpec::new(ResourceKind::Count, &inv, &Default::default());
        let resp = count.allocate(&request(&[&["gpu-0", "gpu-3"]])).unwrap();
        assert_eq!(
            resp.container_responses[0].annotations[GRANTED_COUNT_ANNOTATION],
            "2"
        );
    }

    #[test]
    fn allocate_refuses_devices_it_does_not_serve() {
        let inv = four_by_15gib();
        let mem = ResourceSpec::new(ResourceKind::Memory, &inv, &Default::default());
        let e = mem
            .allocate(&request(&[&["gpu-mem-0-0"], &["gpu-mem-0-15"]]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-mem: container request 1 lists unknown device ID \"gpu-mem-0-15\""
        );
        let e = mem.allocate(&request(&[&[]])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-mem: container request 0 lists no device"
        );
    }
}
