//! What a pod asks for, read from its containers' limits, and the assignment a placement
//! gives it. A pod's GPU containers are placed together, init containers included:
//! - the containers that run together to the pod's end (app containers and native sidecars):
//!   one of them may take `gpu-count` GPUs; several (each `gpu-count` 1) share one GPU, each
//!   with its own share;
//! - an init container runs on the pod's GPUs: its `gpu-count` must be the pod's;
//! - all of them have a compute quota, or none does;
//! - the pod takes what it holds at once ([`lifecycle::peak`]): an init container's share is
//!   not added to the app containers' (they never run together), a sidecar's is.
//!
//! Every GPU container gets its own entry in the assignment, on all of the pod's GPUs.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::kubeobjects::{pod_containers, pod_key};
use gpushare_core::echo::Echo;
use gpushare_core::placement::{GpuDemand, InvalidRequest, Request};
use gpushare_core::request::lifecycle::{self, Amount, ContainerRole};
use gpushare_core::request::limits::parse_limits;
use gpushare_core::request::{
    ASSIGNMENT_VERSION, Assignment, GpuShare, RequestError, ResourceNames,
};

/// One GPU container's share (per GPU it gets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerShare {
    pub name: String,
    pub role: ContainerRole,
    pub count: u32,
    pub memory_mib: u64,
    /// Percent of each GPU; `None` without a compute quota.
    pub core_percent: Option<u32>,
}

impl ContainerShare {
    fn amount(&self) -> Amount {
        Amount {
            memory_mib: self.memory_mib,
            core_percent: self.core_percent.unwrap_or(0),
        }
    }
}

/// What the placement engine sees for the pod, and how to split it back per container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDemand {
    pub request: Request,
    /// In pod order (init containers, then app containers).
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
        "containers {a} and {b} both ask for GPUs and {a} asks for {count_field}={count}; several GPU containers running together in one pod must each take one GPU (they share it)"
    )]
    SeveralMultiGpu {
        a: Echo,
        b: Echo,
        count_field: String,
        count: u32,
    },
    #[error(
        "init container {init} asks for {count_field}={count} but the pod takes {pod_count} GPU(s) (container {other}); an init container runs on the pod's GPUs and must ask for as many"
    )]
    InitCount {
        init: Echo,
        count_field: String,
        count: u32,
        pod_count: u32,
        other: Echo,
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
        "the GPU containers of the pod ask for {core_field} {total} at once, more than one GPU (100)"
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
    let mut seen = std::collections::HashSet::new();
    for (role, c) in pod_containers(pod) {
        // The API server refuses such a pod (init and app containers share one name space);
        // an extender request may still carry one.
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
            role,
            count,
            memory_mib,
            core_percent: core_milli.map(|m| m / 10),
        });
    }
    let Some(first) = shares.first() else {
        return Ok(None);
    };
    let long_running: Vec<&ContainerShare> =
        shares.iter().filter(|s| s.role.is_long_running()).collect();
    if long_running.len() > 1
        && let Some(multi) = long_running.iter().find(|s| s.count > 1)
        && let Some(other) = long_running.iter().find(|s| s.name != multi.name)
    {
        return Err(PodError::SeveralMultiGpu {
            a: Echo::new(&multi.name),
            b: Echo::new(&other.name),
            count_field: names.count.clone(),
            count: multi.count,
        });
    }
    // The pod's GPUs: those of the containers that run to its end, else of its first init
    // container.
    let reference = long_running.first().copied().unwrap_or(first);
    let count = reference.count;
    if let Some(init) = shares
        .iter()
        .find(|s| s.role == ContainerRole::Init && s.count != count)
    {
        return Err(PodError::InitCount {
            init: Echo::new(&init.name),
            count_field: names.count.clone(),
            count: init.count,
            pod_count: count,
            other: Echo::new(&reference.name),
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
    // Checked: each share is bounded, their number is not (a pod of many containers).
    let peak = lifecycle::peak(shares.iter().map(|s| (s.role, s.amount()))).ok_or_else(|| {
        PodError::SumTooLarge {
            field: names.memory.clone(),
            max: u64::MAX,
        }
    })?;
    let core = first.core_percent.map(|_| peak.core_percent);
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
        count,
        memory_mib: peak.memory_mib,
        core_milli: core.map(|c| c * 10),
    };
    Ok(Some(PodDemand {
        request,
        containers: shares,
    }))
}

impl PodDemand {
    /// The assignment for GPUs `gpus` (index, UUID) of the chosen node: every GPU container,
    /// init containers and sidecars included, gets its share on each of them.
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

/// What an existing assignment takes from each GPU: (GPU indexes, the engine's demand), the
/// pod holding on each GPU what its containers hold at once. `roles`: the pod's containers in
/// pod order ([`crate::kubeobjects::container_roles`]); an entry for a container not among
/// them counts as an app container. Used to rebuild the cache from pods' annotations after a
/// restart: the same demand the placement took.
pub fn demand_of_assignment(
    a: &Assignment,
    roles: &[(&str, ContainerRole)],
) -> Result<(Vec<u32>, GpuDemand), RequestError> {
    let per_gpu = lifecycle::peak_per_gpu(a, roles)?;
    // The engine takes the same amount from each GPU of a pod: the largest.
    let memory_mib = per_gpu.values().map(|p| p.memory_mib).max().unwrap_or(0);
    let any_core = a
        .containers
        .values()
        .flatten()
        .any(|s| s.core_percent.is_some());
    let core = any_core.then(|| per_gpu.values().map(|p| p.core_percent).max().unwrap_or(0));
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

    fn ctr(name: &str, limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.to_string(),
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
        }
    }

    pub fn pod(containers: &[(&str, &[(&str, &str)])]) -> Pod {
        pod_with_init(&[], containers)
    }

    /// Init container: (name, is a sidecar (`restartPolicy: Always`), limits).
    type Init<'a> = (&'a str, bool, &'a [(&'a str, &'a str)]);

    /// A pod with init containers `init` in that order and app containers `containers`.
    fn pod_with_init(init: &[Init], containers: &[(&str, &[(&str, &str)])]) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(
                    init.iter()
                        .map(|(n, sidecar, limits)| Container {
                            restart_policy: sidecar.then(|| "Always".to_string()),
                            ..ctr(n, limits)
                        })
                        .collect(),
                ),
                containers: containers.iter().map(|(n, l)| ctr(n, l)).collect(),
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
            demand_of_assignment(&d.assignment(&[(0, String::new())], "t".into()), &[]).unwrap();
        assert_eq!((gpus, demand), (vec![0], d.request.gpu));
        // Multi-GPU container: memory split over the GPUs.
        let d = gpu_demand(&pod(&[("m", &[(MEM, "8"), (COUNT, "2")])]));
        let a = d.assignment(&[(0, String::new()), (3, String::new())], "t".into());
        assert_eq!(a.containers["m"].len(), 2);
        assert_eq!(a.containers["m"][1].memory_mib, 4096);
        assert_eq!(
            demand_of_assignment(&a, &[]).unwrap(),
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
        assert!(e.to_string().contains("120 at once"), "{e}");
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
        let e = demand_of_assignment(&a, &[]).unwrap_err().to_string();
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

    /// The demand an assignment gives back with the pod's roles: what the cache rebuilds
    /// after a restart must be what the placement took.
    fn rebuilt(p: &Pod, d: &PodDemand, gpus: &[(u32, String)]) -> (Vec<u32>, GpuDemand) {
        let roles = crate::kubeobjects::container_roles(p);
        demand_of_assignment(&d.assignment(gpus, "t".into()), &roles).unwrap()
    }

    #[test]
    fn an_init_container_takes_the_max_not_the_sum() {
        // Init 4 GiB, app 2 GiB: the pod takes 4 GiB.
        let p = pod_with_init(
            &[("prep", false, &[(MEM, "4")])],
            &[("main", &[(MEM, "2")])],
        );
        let d = gpu_demand(&p);
        assert_eq!(d.request.gpu, shared(1, 4096, None));
        // Both have an entry on the pod's GPU, each with its own share.
        let a = d.assignment(&[(2, "GPU-2".into())], "t".into());
        assert_eq!(
            a.to_json(),
            r#"{"version":1,"timestamp":"t","containers":{"main":[{"gpuIndex":2,"gpuUuid":"GPU-2","memoryMiB":2048}],"prep":[{"gpuIndex":2,"gpuUuid":"GPU-2","memoryMiB":4096}]}}"#
        );
        assert_eq!(
            rebuilt(&p, &d, &[(2, String::new())]),
            (vec![2], d.request.gpu)
        );
        // Read without the pod's spec, both count as app containers: never less.
        assert_eq!(
            demand_of_assignment(&a, &[]).unwrap(),
            (vec![2], shared(1, 6144, None))
        );

        // Compute by itself: init 1 GiB / 50 %, app 2 GiB / 30 % → 2 GiB / 50 %.
        let p = pod_with_init(
            &[("prep", false, &[(MEM, "1"), (CORE, "50")])],
            &[("main", &[(MEM, "2"), (CORE, "30")])],
        );
        let d = gpu_demand(&p);
        assert_eq!(d.request.gpu, shared(1, 2048, Some(500)));
        assert_eq!(
            rebuilt(&p, &d, &[(0, String::new())]),
            (vec![0], d.request.gpu)
        );
        // Init containers run one at a time; 60 + 50 % is no refusal.
        let p = pod_with_init(
            &[
                ("a", false, &[(MEM, "3"), (CORE, "60")]),
                ("b", false, &[(MEM, "1"), (CORE, "50")]),
            ],
            &[("main", &[(MEM, "2"), (CORE, "40")])],
        );
        assert_eq!(gpu_demand(&p).request.gpu, shared(1, 3072, Some(600)));
        // A GPU init container in a pod whose app containers ask for none.
        let p = pod_with_init(
            &[("prep", false, &[(MEM, "2"), (CORE, "20")])],
            &[("main", &[("cpu", "1")])],
        );
        let d = gpu_demand(&p);
        assert_eq!(d.request.gpu, shared(1, 2048, Some(200)));
        let a = d.assignment(&[(0, String::new())], "t".into());
        assert_eq!(a.containers.keys().collect::<Vec<_>>(), ["prep"]);
    }

    #[test]
    fn a_sidecar_runs_alongside_what_comes_after_it() {
        // Sidecar 1 GiB, then init 2 GiB, then app 2 GiB: 1 + 2 at either time → 3 GiB.
        let p = pod_with_init(
            &[
                ("proxy", true, &[(MEM, "1"), (CORE, "10")]),
                ("prep", false, &[(MEM, "2"), (CORE, "20")]),
            ],
            &[("main", &[(MEM, "2"), (CORE, "30")])],
        );
        let d = gpu_demand(&p);
        assert_eq!(d.request.gpu, shared(1, 3072, Some(400)));
        let a = d.assignment(&[(1, String::new())], "t".into());
        assert_eq!(a.containers.len(), 3);
        assert_eq!(a.containers["proxy"][0].memory_mib, 1024);
        assert_eq!(
            rebuilt(&p, &d, &[(1, String::new())]),
            (vec![1], d.request.gpu)
        );
        // A sidecar counts among the containers that share one GPU.
        let e = pod_demand(
            &pod_with_init(
                &[("proxy", true, &[(MEM, "4"), (COUNT, "2")])],
                &[("main", &[(MEM, "2")])],
            ),
            &ResourceNames::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(r#"containers "proxy" and "main""#),
            "{e}"
        );
        // Sidecar + app over one GPU's compute is refused.
        let e = pod_demand(
            &pod_with_init(
                &[("proxy", true, &[(MEM, "1"), (CORE, "60")])],
                &[("main", &[(MEM, "1"), (CORE, "50")])],
            ),
            &ResourceNames::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("110 at once"), "{e}");
    }

    #[test]
    fn an_init_container_takes_the_pods_gpu_count() {
        let n = ResourceNames::default();
        let e = pod_demand(
            &pod_with_init(
                &[("prep", false, &[(MEM, "4"), (COUNT, "2")])],
                &[("main", &[(MEM, "2")])],
            ),
            &n,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"init container "prep" asks for aliyun.com/gpu-count=2 but the pod takes 1 GPU(s) (container "main"); an init container runs on the pod's GPUs and must ask for as many"#
        );
        // Without a long-running GPU container the first init container sets the count.
        let e = pod_demand(
            &pod_with_init(
                &[
                    ("a", false, &[(MEM, "4"), (COUNT, "2")]),
                    ("b", false, &[(MEM, "2")]),
                ],
                &[("main", &[])],
            ),
            &n,
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                r#"init container "b" asks for aliyun.com/gpu-count=1 but the pod takes 2 GPU(s) (container "a")"#
            ),
            "{e}"
        );
        // The same count: an entry on each of the pod's GPUs.
        let p = pod_with_init(
            &[("prep", false, &[(MEM, "8"), (COUNT, "2")])],
            &[("main", &[(MEM, "4"), (COUNT, "2")])],
        );
        let d = gpu_demand(&p);
        assert_eq!(d.request.gpu, shared(2, 4096, None));
        let gpus = [(0, String::new()), (3, String::new())];
        let a = d.assignment(&gpus, "t".into());
        assert_eq!(a.containers["prep"].len(), 2);
        assert_eq!(a.containers["prep"][1].memory_mib, 4096);
        assert_eq!(a.containers["main"][1].memory_mib, 2048);
        assert_eq!(rebuilt(&p, &d, &gpus), (vec![0, 3], d.request.gpu));
    }

    #[test]
    fn init_containers_keep_the_pods_rules() {
        let n = ResourceNames::default();
        // Compute quota on all or none, init containers included.
        let e = pod_demand(
            &pod_with_init(
                &[("prep", false, &[(MEM, "2")])],
                &[("main", &[(MEM, "2"), (CORE, "30")])],
            ),
            &n,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(r#"container "main" asks for aliyun.com/gpu-core.percentage and container "prep" does not"#),
            "{e}"
        );
        // Names are unique across init and app containers.
        let e = pod_demand(
            &pod_with_init(
                &[("main", false, &[(MEM, "2")])],
                &[("main", &[(MEM, "2")])],
            ),
            &n,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"the pod has two containers named "main" (container names must be unique)"#
        );
        // An init container's own limits are checked, naming it.
        let e = pod_demand(
            &pod_with_init(&[("prep", false, &[(MEM, "2"), (CORE, "33")])], &[]),
            &n,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"container "prep": aliyun.com/gpu-core.percentage 33 is not a multiple of 5"#
        );
    }
}
