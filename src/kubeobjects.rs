//! How gpushare reads Kubernetes Node and Pod objects, in one place for the scheduler's cache
//! (`scheduler::cache`) and `gpushare inspect` (`inspect::build`): a node's GPUs (annotation `gpushare.io/gpus`) and labels; a pod's
//! key, whether it still holds what it was given, its node, its containers in pod order with
//! when each runs, and its assignment (`gpushare.io/assignment`). Pure: what each caller makes of a missing or unreadable value
//! (a refusal, a warning) stays with the caller.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Node, Pod};

use gpushare_core::request::lifecycle::ContainerRole;
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus, NodeGpusError};
use gpushare_core::request::{ASSIGNMENT_ANNOTATION, Assignment, RequestError};

/// Where Kubernetes puts an object that names no namespace.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A pod's `namespace/name`; ordered by namespace, then name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pod's key; a pod without `metadata.namespace` is in [`DEFAULT_NAMESPACE`].
pub fn pod_key(pod: &Pod) -> PodKey {
    PodKey {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

/// Whether the pod still holds what it was given (phase not Succeeded/Failed).
pub fn is_active(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The node the pod is bound to (`spec.nodeName`, when set and not empty).
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The pod's containers in pod order (`spec.initContainers`, then `spec.containers`), each
/// with when it runs: an init container with `restartPolicy: Always` is a sidecar.
pub fn pod_containers(pod: &Pod) -> impl Iterator<Item = (ContainerRole, &Container)> {
    let spec = pod.spec.as_ref();
    let init = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten());
    let app = spec.into_iter().flat_map(|s| s.containers.iter());
    init.map(|c| {
        let role = if c.restart_policy.as_deref() == Some("Always") {
            ContainerRole::Sidecar
        } else {
            ContainerRole::Init
        };
        (role, c)
    })
    .chain(app.map(|c| (ContainerRole::App, c)))
}

/// A Kubernetes quantity (`500m`, `2`, `1.5`, `4Gi`, `1e3`) in its base unit; `None` when it
/// is not one.
pub fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.len() > 1 && (e.starts_with('e') || e.starts_with('E')) => {
            10f64.powi(e[1..].parse::<i32>().ok()?.clamp(-30, 30))
        }
        _ => return None,
    };
    let v = v * scale;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// `v` rounded up to a whole number, forgiving the float error of a decimal fraction
/// (`0.1` CPU is 100 milli, not 101).
fn ceil_whole(v: f64) -> u64 {
    let r = v.round();
    if (v - r).abs() < 1e-6 {
        r as u64
    } else {
        v.ceil() as u64
    }
}

/// A container's CPU (milli) and memory (MiB) requests, as the scheduler counts them
/// (requests; limits where a request is absent; unparsable or absent: 0).
fn container_requests(c: &Container) -> (u64, u64) {
    let Some(r) = &c.resources else {
        return (0, 0);
    };
    let get = |name: &str| {
        r.requests
            .as_ref()
            .and_then(|m| m.get(name))
            .or_else(|| r.limits.as_ref().and_then(|m| m.get(name)))
            .and_then(|q| quantity(&q.0))
            .unwrap_or(0.0)
    };
    (
        ceil_whole(get("cpu") * 1000.0),
        ceil_whole(get("memory") / (1024.0 * 1024.0)),
    )
}

/// The pod's effective CPU (milli) and memory (MiB) requests, as kube-scheduler computes
/// them: app containers and sidecars together; each init container with the sidecars
/// started before it; the larger of the two, plus the pod's overhead.
pub fn pod_requests(pod: &Pod) -> (u64, u64) {
    let (mut run, mut init_peak, mut sidecars) = ((0u64, 0u64), (0u64, 0u64), (0u64, 0u64));
    for (role, c) in pod_containers(pod) {
        let (cpu, mem) = container_requests(c);
        match role {
            ContainerRole::Sidecar => {
                sidecars = (sidecars.0 + cpu, sidecars.1 + mem);
                init_peak = (init_peak.0.max(sidecars.0), init_peak.1.max(sidecars.1));
            }
            ContainerRole::Init => {
                init_peak = (
                    init_peak.0.max(sidecars.0 + cpu),
                    init_peak.1.max(sidecars.1 + mem),
                );
            }
            ContainerRole::App => run = (run.0 + cpu, run.1 + mem),
        }
    }
    run = (run.0 + sidecars.0, run.1 + sidecars.1);
    let overhead = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .map_or((0, 0), |o| {
            let get = |n: &str| o.get(n).and_then(|q| quantity(&q.0)).unwrap_or(0.0);
            (
                ceil_whole(get("cpu") * 1000.0),
                ceil_whole(get("memory") / (1024.0 * 1024.0)),
            )
        });
    (
        run.0.max(init_peak.0) + overhead.0,
        run.1.max(init_peak.1) + overhead.1,
    )
}

/// A node's allocatable CPU (milli) and memory (MiB), each `None` when not published.
pub fn node_allocatable(node: &Node) -> (Option<u64>, Option<u64>) {
    let a = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |n: &str| a.and_then(|a| a.get(n)).and_then(|q| quantity(&q.0));
    (
        get("cpu").map(|v| ceil_whole(v * 1000.0)),
        // Rounded down: a pod must never be placed on memory the node does not have.
        get("memory").map(|v| (v / (1024.0 * 1024.0) + 1e-9).floor() as u64),
    )
}

/// The names of the pod's containers in pod order, each with when it runs.
pub fn container_roles(pod: &Pod) -> Vec<(&str, ContainerRole)> {
    pod_containers(pod)
        .map(|(role, c)| (c.name.as_str(), role))
        .collect()
}

/// The pod's `gpushare.io/assignment`: `None` without the annotation.
pub fn pod_assignment(pod: &Pod) -> Option<Result<Assignment, RequestError>> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
        .map(|raw| Assignment::parse(raw))
}

/// The GPUs the node agent published (`gpushare.io/gpus`): `None` without the annotation.
pub fn node_gpus(node: &Node) -> Option<Result<NodeGpus, NodeGpusError>> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_GPUS_ANNOTATION))
        .map(|raw| NodeGpus::parse(raw))
}

/// One label of the node.
pub fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Every label of the node.
pub fn node_labels(node: &Node) -> HashMap<String, String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn quantities_in_every_form() {
        for (q, want) in [
            ("500m", 0.5),
            ("2", 2.0),
            ("1.5", 1.5),
            ("0.1", 0.1),
            ("4Gi", 4.0 * 1024.0 * 1024.0 * 1024.0),
            ("512Mi", 512.0 * 1024.0 * 1024.0),
            ("1e3", 1000.0),
            ("1E3", 1000.0),
            ("16k", 16000.0),
            ("2M", 2e6),
        ] {
            let v = quantity(q).unwrap_or_else(|| panic!("{q}"));
            assert!((v - want).abs() <= want * 1e-12, "{q}: {v} != {want}");
        }
        for bad in ["", "x", "1x", "1.2.3", "-1", "1e", "Mi"] {
            assert_eq!(quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn pod_requests_as_kube_scheduler_counts_them() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let c = |name: &str, cpu: &str, mem: &str, sidecar: bool| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_string()),
            resources: Some(ResourceRequirements {
                requests: Some(
                    [
                        ("cpu".to_string(), Quantity(cpu.into())),
                        ("memory".to_string(), Quantity(mem.into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut p = Pod {
            spec: Some(PodSpec {
                containers: vec![c("a", "100m", "64Mi", false), c("b", "0.1", "1Gi", false)],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_requests(&p), (200, 1088));
        // A big init container: the larger of init and run.
        p.spec.as_mut().unwrap().init_containers = Some(vec![
            c("side", "50m", "32Mi", true),
            c("init", "2", "10Mi", false),
        ]);
        // Run: 200 + 50 sidecar; init: 2000 + 50 (the sidecar started before it).
        assert_eq!(pod_requests(&p), (2050, 1088 + 32));
        // Limits stand for absent requests; no resources count nothing.
        p.spec.as_mut().unwrap().init_containers = None;
        p.spec.as_mut().unwrap().containers = vec![
            Container {
                name: "l".into(),
                resources: Some(ResourceRequirements {
                    limits: Some([("cpu".to_string(), Quantity("3".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Container {
                name: "n".into(),
                ..Default::default()
            },
        ];
        p.spec.as_mut().unwrap().overhead =
            Some([("cpu".to_string(), Quantity("250m".into()))].into());
        assert_eq!(pod_requests(&p), (3250, 0));
    }

    #[test]
    fn pods_without_a_namespace_are_in_default() {
        let mut p = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(pod_key(&p).to_string(), "default/p");
        p.metadata.namespace = Some("ml".into());
        assert_eq!(pod_key(&p).to_string(), "ml/p");
        assert!(is_active(&p));
        assert_eq!(pod_node(&p), None);
        assert!(pod_assignment(&p).is_none());
        p.spec = Some(PodSpec {
            node_name: Some(String::new()),
            ..Default::default()
        });
        assert_eq!(pod_node(&p), None);
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert!(!is_active(&p));
    }

    #[test]
    fn init_containers_come_first_and_restartable_ones_are_sidecars() {
        let c = |name: &str, restart: Option<&str>| Container {
            name: name.into(),
            restart_policy: restart.map(str::to_string),
            ..Default::default()
        };
        let p = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    c("prep", None),
                    c("proxy", Some("Always")),
                    c("warm", None),
                ]),
                containers: vec![c("main", None)],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            container_roles(&p),
            [
                ("prep", ContainerRole::Init),
                ("proxy", ContainerRole::Sidecar),
                ("warm", ContainerRole::Init),
                ("main", ContainerRole::App),
            ]
        );
        assert!(container_roles(&Pod::default()).is_empty());
    }
}
