//! What a pod asks for, read from its containers' limits, and the assignment a placement
//! gives it. A pod's GPU containers are placed together: one container may take `gpu-count`
//! GPUs; several GPU containers (each `gpu-count` 1) share one GPU, each with its own share.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::kubeobjects::pod_key;
use gpushare_core::echo::Echo;
use gpushare_core::placement::{GpuDemand, InvalidRequest, Request};
use gpushare_core::request::limits::parse_limits;
use gpushare_core::request::{
    ASSIGNMENT_ANNOTATION, ASSIGNMENT_VERSION, Assignment, GpuShare, RequestError, ResourceNames,
};

/// One GPU container's share (per GPU it gets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerShare {
    pub name: String,
    pub count: u32,
    pub memory_mib: u64,
    /// Percent of each GPU; `None` without a compute quota.
    pub core_percent: Option<u32>,
}

/// What the placement engine sees for the pod, and how to split it back per container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDemand {
    pub request: Request,
    pub containers: Vec<ContainerShare>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("container {container}: {source}")]
    Container {
        container: Echo,
        source: InvalidRequest,
    },
    #[error(
        "containers {a} and {b} both ask for GPUs and {a} asks for {count_field}={count}; several GPU containers in one pod must each take one GPU (they share it)"
    )]
    SeveralMultiGpu {
        a: Echo,
        b: Echo,
        count_field: String,
        count: u32,
    },
    #[error(
        "container {with} asks for {core_field} and container {without} does not; the GPU containers of one pod must all have a compute quota or none"
    )]
    MixedCore {
        with: Echo,
        without: Echo,
        core_field: String,
    },
    #[error("the pod has two containers named {name} (container names must be unique)")]
    DuplicateContainer { name: Echo },
    #[error("the GPU containers of the pod ask for {field} adding up to more than {max}")]
    SumTooLarge { field: String, max: u64 },
    #[error(
        "the GPU containers of the pod ask for {core_field} {total} in all, more than one GPU (100)"
    )]
    CoreOverOneGpu { core_field: String, total: u32 },
}

/// A pod whose GPU request is refused, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod:#}: {source}")]
pub struct InvalidPod {
    pub pod: Echo,
    pub source: Box<PodError>,
}

fn limits_of(c: &Container) -> std::collections::HashMap<String, String> {
    let Some(r) = &c.resources else {
        return Default::default();
    };
    // Extended resources: requests must equal limits; a container may state either.
    let mut out: std::collections::HashMap<String, String> = r
        .requests
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in r.limits.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// The pod's GPU demand; `Ok(None)` for a pod without GPU resources.
pub fn pod_demand(pod: &Pod, names: &ResourceNames) -> Result<Option<PodDemand>, PodError> {
    let name = pod_key(pod).to_string();
    let mut shares: Vec<ContainerShare> = Vec::new();
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    let mut seen = std::collections::HashSet::new();
    for c in containers {
        // The API server refuses such a pod; an extender request may still carry one.
        if !seen.insert(c.name.as_str()) {
            return Err(PodError::DuplicateContainer {
                name: Echo::new(&c.name),
            });
        }
        let err = |source: InvalidRequest| PodError::Container {
            container: Echo::new(&c.name),
            source,
        };
        let Some(q) = parse_limits(&limits_of(c), names).map_err(|e| err(e.into()))? else {
            continue;
        };
        let req = Request::from_quantities(&name, 0, 0, Some(&q), names).map_err(err)?;
        let GpuDemand::Shared {
            count,
            memory_mib,
            core_milli,
        } = req.gpu
        else {
            continue;
        };
        shares.push(ContainerShare {
            name: c.name.clone(),
            count,
            memory_mib,
            core_percent: core_milli.map(|m| m / 10),
        });
    }
    let Some(first) = shares.first() else {
        return Ok(None);
    };
    if shares.len() > 1 {
        if let Some(multi) = shares.iter().find(|s| s.count > 1)
            && let Some(other) = shares.iter().find(|s| s.name != multi.name)
        {
            return Err(PodError::SeveralMultiGpu {
                a: Echo::new(&multi.name),
                b: Echo::new(&other.name),
                count_field: names.count.clone(),
                count: multi.count,
            });
        }
        if let (Some(with), Some(without)) = (
            shares.iter().find(|s| s.core_percent.is_some()),
            shares.iter().find(|s| s.core_percent.is_none()),
        ) {
            return Err(PodError::MixedCore {
                with: Echo::new(&with.name),
                without: Echo::new(&without.name),
                core_field: names.core.clone(),
            });
        }
    }
    // Checked: each share is bounded, their number is not (a pod of many containers).
    let memory_mib = shares
        .iter()
        .try_fold(0u64, |acc, s| acc.checked_add(s.memory_mib))
        .ok_or_else(|| PodError::SumTooLarge {
            field: names.memory.clone(),
            max: u64::MAX,
        })?;
    let core: Option<u32> = first.core_percent.map(|_| {
        shares
            .iter()
            .filter_map(|s| s.core_percent)
            .fold(0, u32::saturating_add)
    });
    if let Some(total) = core
        && total > 100
    {
        return Err(PodError::CoreOverOneGpu {
            core_field: names.core.clone(),
            total,
        });
    }
    let mut request = Request::cpu_only(name, 0, 0);
    request.gpu = GpuDemand::Shared {
        count: first.count,
        memory_mib,
        core_milli: core.map(|c| c * 10),
    };
    Ok(Some(PodDemand {
        request,
        containers: shares,
    }))
}

impl PodDemand {
    /// The assignment for GPUs `gpus` (index, UUID) of the chosen node.
    pub fn assignment(&self, gpus: &[(u32, String)], timestamp: String) -> Assignment {
        let containers = self
            .containers
            .iter()
            .map(|c| {
                let shares = gpus
                    .iter()
                    .map(|(index, uuid)| GpuShare {
                        gpu_index: *index,
                        gpu_uuid: uuid.clone(),
                        memory_mib: c.memory_mib,
                        core_percent: c.core_percent.map(i64::from),
                    })
                    .collect();
                (c.name.clone(), shares)
            })
            .collect();
        Assignment {
            version: ASSIGNMENT_VERSION,
            timestamp: Some(timestamp),
            containers,
        }
    }
}

/// What an existing assignment takes from each GPU: (GPU indexes, the engine's demand).
/// Used to rebuild the cache from pods' annotations after a restart.
pub fn demand_of_assignment(a: &Assignment) -> Result<(Vec<u32>, GpuDemand), RequestError> {
    let mut per_gpu: std::collections::BTreeMap<u32, (u64, Option<u32>)> = Default::default();
    for shares in a.containers.values() {
        for s in shares {
            let e = per_gpu.entry(s.gpu_index).or_insert((0, None));
            // Checked: the annotation bounds each share, not how many there are.
            e.0 =
                e.0.checked_add(s.memory_mib)
                    .ok_or_else(|| RequestError::SumTooLarge {
                        what: format!("{ASSIGNMENT_ANNOTATION} memoryMiB on GPU {}", s.gpu_index),
                        max: u64::MAX,
                    })?;
            if let Some(c) = s.core_percent {
                e.1 = Some(e.1.unwrap_or(0).saturating_add(c.clamp(0, 100) as u32));
            }
        }
    }
    // The engine takes the same amount from each GPU of a pod: the largest.
    let memory_mib = per_gpu.values().map(|v| v.0).max().unwrap_or(0);
    let core = per_gpu.values().filter_map(|v| v.1).max();
    let gpus: Vec<u32> = per_gpu.keys().copied().collect();
    let demand = GpuDemand::Shared {
        count: gpus.len() as u32,
        memory_mib,
        core_milli: core.map(|c| c.min(100) * 10),
    };
    Ok((gpus, demand))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    pub fn pod(containers: &[(&str, &[(&str, &str)])]) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .map(|(n, limits)| Container {
                        name: n.to_string(),
                        resources: Some(ResourceRequirements {
                            limits: Some(
                                limits
                                    .iter()
                                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                                    .collect(),
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const MEM: &str = "aliyun.com/gpu-mem";
    const CORE: &str = "aliyun.com/gpu-core.percentage";
    const COUNT: &str = "aliyun.com/gpu-count";

    /// The demand of a pod that asks for GPUs.
    fn gpu_demand(p: &Pod) -> PodDemand {
        pod_demand(p, &ResourceNames::default()).unwrap().unwrap()
    }

    fn shared(count: u32, memory_mib: u64, core_milli: Option<u32>) -> GpuDemand {
        GpuDemand::Shared {
            count,
            memory_mib,
            core_milli,
        }
    }

    #[test]
    fn demands() {
        let n = ResourceNames::default();
        assert_eq!(
            pod_demand(&pod(&[("c", &[("cpu", "1")])]), &n).unwrap(),
            None
        );
        let d = gpu_demand(&pod(&[("main", &[(MEM, "2"), (CORE, "30")])]));
        assert_eq!(d.request.gpu, shared(1, 2048, Some(300)));
        assert_eq!(d.request.name, "ns/p");
        let a = d.assignment(&[(1, "GPU-1".into())], "t".into());
        assert_eq!(
            a.to_json(),
            r#"{"version":1,"timestamp":"t","containers":{"main":[{"gpuIndex":1,"gpuUuid":"GPU-1","memoryMiB":2048,"corePercent":30}]}}"#
        );
        // Two containers share one GPU.
        let d = gpu_demand(&pod(&[
            ("a", &[(MEM, "2"), (CORE, "30")]),
            ("side", &[("cpu", "1")]),
            ("b", &[(MEM, "1"), (CORE, "20")]),
        ]));
        assert_eq!(d.request.gpu, shared(1, 3072, Some(500)));
        let (gpus, demand) =
            demand_of_assignment(&d.assignment(&[(0, String::new())], "t".into())).unwrap();
        assert_eq!((gpus, demand), (vec![0], d.request.gpu));
        // Multi-GPU container: memory split over the GPUs.
        let d = gpu_demand(&pod(&[("m", &[(MEM, "8"), (COUNT, "2")])]));
        let a = d.assignment(&[(0, String::new()), (3, String::new())], "t".into());
        assert_eq!(a.containers["m"].len(), 2);
        assert_eq!(a.containers["m"][1].memory_mib, 4096);
        assert_eq!(
            demand_of_assignment(&a).unwrap(),
            (vec![0, 3], shared(2, 4096, None))
        );
    }

    #[test]
    fn refusals_name_the_container_and_field() {
        let n = ResourceNames::default();
        let e = pod_demand(&pod(&[("main", &[(MEM, "2"), (CORE, "33")])]), &n).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"container "main": aliyun.com/gpu-core.percentage 33 is not a multiple of 5"#
        );
        let e = pod_demand(
            &pod(&[("a", &[(MEM, "2"), (CORE, "30")]), ("b", &[(MEM, "2")])]),
            &n,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("all have a compute quota or none"),
            "{e}"
        );
        let e = pod_demand(
            &pod(&[
                ("a", &[(MEM, "2"), (CORE, "60")]),
                ("b", &[(MEM, "2"), (CORE, "60")]),
            ]),
            &n,
        )
        .unwrap_err();
        assert!(e.to_string().contains("120 in all"), "{e}");
        let e = pod_demand(
            &pod(&[("a", &[(MEM, "4"), (COUNT, "2")]), ("b", &[(MEM, "2")])]),
            &n,
        )
        .unwrap_err();
        assert!(e.to_string().contains("aliyun.com/gpu-count=2"), "{e}");
    }

    /// Hardening item 7: what an assignment takes from a GPU is summed with checked
    /// arithmetic; an annotation whose memory or compute adds up past 64 bits is an error.
    #[test]
    fn assignment_sums_do_not_wrap() {
        let share = |gpu_index, memory_mib, core_percent| GpuShare {
            gpu_index,
            gpu_uuid: String::new(),
            memory_mib,
            core_percent,
        };
        let a = Assignment {
            version: 1,
            timestamp: None,
            containers: [
                ("a".to_string(), vec![share(0, u64::MAX / 2 + 1, None)]),
                ("b".to_string(), vec![share(0, u64::MAX / 2 + 1, None)]),
            ]
            .into(),
        };
        let e = demand_of_assignment(&a).unwrap_err().to_string();
        assert_eq!(
            e,
            "gpushare.io/assignment memoryMiB on GPU 0 adds up to more than 18446744073709551615"
        );
    }

    /// Found by fuzzing the extender: two containers of one name, one of them asking for two
    /// GPUs, panicked in `pod_demand` ("two"); such a pod is now refused, naming the name.
    #[test]
    fn duplicate_container_names_are_refused() {
        let n = ResourceNames::default();
        let e = pod_demand(
            &pod(&[
                ("main", &[(MEM, "8"), (COUNT, "2")]),
                ("main", &[(MEM, "8"), (COUNT, "2")]),
            ]),
            &n,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"the pod has two containers named "main" (container names must be unique)"#
        );
    }

    /// Hardening items 5 and 6 through the extender: a pod's limits with whitespace or an
    /// overflowing value are refused naming the container, field and value.
    #[test]
    fn pod_limits_with_whitespace_or_overflow_are_refused() {
        let n = ResourceNames::default();
        let e = pod_demand(&pod(&[("main", &[(MEM, " 2")])]), &n).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"container "main": aliyun.com/gpu-mem " 2" has leading or trailing whitespace: expected an integer"#
        );
        let e = pod_demand(&pod(&[("main", &[(MEM, "99999999999999999999")])]), &n).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"container "main": aliyun.com/gpu-mem "99999999999999999999" is out of range: expected an integer in [1, 17179869183]"#
        );
    }
}
