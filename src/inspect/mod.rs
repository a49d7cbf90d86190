//! `gpushare inspect`: what is allocated to whom, per node and GPU — the view operators know
//! from `kubectl inspect cgpu`.
//!
//! Pure at the core: [`build`] turns lists of Node and Pod objects into a [`ClusterView`], and
//! [`render`] turns that into the table, the per-GPU details or JSON. Only [`fetch`] talks to the
//! API server (one list of nodes, one of non-terminated pods); the command is `cmd::inspect`.
//!
//! Numbers come from what the scheduler assigned (pod annotation `gpushare.io/assignment`), not
//! from what pods request: that is what the node agent enforces. A pod counts on a GPU with
//! what it holds at once (`request::lifecycle`): its init containers' shares are listed, not
//! added to its app containers'. GPUs come from the node
//! annotation `gpushare.io/gpus`; a node that has only the memory resource allocatable (no agent
//! annotation yet) gets its GPUs inferred from the allocatable memory and count. Annotations,
//! labels and pod keys are read as the scheduler reads them ([`crate::kubeobjects`]).

pub mod render;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::kubeobjects::{self, PodKey};
use gpushare_core::echo::Echo;
use gpushare_core::placement::model::{MAX_GPUS_PER_NODE, PLACEMENT_LABEL, SCHEDULE_LABEL};
use gpushare_core::request::ASSIGNMENT_ANNOTATION;
use gpushare_core::request::lifecycle::{ContainerRole, peak_per_gpu};
use gpushare_core::request::limits::{GpuQuantities, ResourceNames};
use gpushare_core::request::node::NODE_GPUS_ANNOTATION;

/// Where a node's GPU list came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum GpuSource {
    /// The agent's `gpushare.io/gpus` annotation.
    Annotation,
    /// Inferred from the allocatable memory and count resources (no annotation).
    Allocatable,
}

/// Memory and compute of a GPU, a node or the cluster: what there is and what is allocated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    #[serde(rename = "memoryTotalMiB")]
    pub memory_total_mib: u64,
    #[serde(rename = "memoryAllocatedMiB")]
    pub memory_allocated_mib: u64,
    pub core_total: u64,
    pub core_allocated: u64,
}

impl Totals {
    /// The sum of `parts`.
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a Totals>) -> Totals {
        parts.into_iter().fold(Totals::default(), |a, t| Totals {
            memory_total_mib: a.memory_total_mib + t.memory_total_mib,
            memory_allocated_mib: a.memory_allocated_mib + t.memory_allocated_mib,
            core_total: a.core_total + t.core_total,
            core_allocated: a.core_allocated + t.core_allocated,
        })
    }
}

/// One container's share of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareView {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// `init` or `sidecar`; absent for app containers.
    #[serde(skip_serializing_if = "is_app")]
    pub role: ContainerRole,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Absent for memory-only shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_percent: Option<u64>,
}

fn is_app(r: &ContainerRole) -> bool {
    *r == ContainerRole::App
}

/// One GPU of a node and who holds shares of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub healthy: bool,
    #[serde(flatten)]
    pub totals: Totals,
    pub shares: Vec<ShareView>,
}

/// One GPU node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    /// InternalIP, else ExternalIP; empty when the node reports neither.
    pub address: String,
    /// Label `ack.node.gpu.schedule`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Label `ack.node.gpu.placement`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    pub gpu_source: GpuSource,
    pub gpus: Vec<GpuView>,
    #[serde(flatten)]
    pub totals: Totals,
    /// Problems seen on this node: unreadable annotations, pods with GPU resources but no
    /// assignment, over-committed GPUs.
    pub warnings: Vec<String>,
}

/// The whole cluster (or the nodes asked for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    #[serde(flatten)]
    pub totals: Totals,
    /// Problems not tied to one of the listed nodes (e.g. an assigned pod whose node is
    /// unknown). Empty when nodes were selected by name.
    pub warnings: Vec<String>,
}

/// Why the view cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error("node {0:?} not found")]
    NoSuchNode(String),
    #[error(
        "node {node:?} has no GPUs for gpushare (no {annotation} annotation and no {memory} allocatable)"
    )]
    NotAGpuNode {
        node: String,
        annotation: &'static str,
        memory: String,
    },
}

fn node_address(node: &Node) -> String {
    let addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    ["InternalIP", "ExternalIP"]
        .iter()
        .find_map(|t| addrs.iter().find(|a| a.type_ == *t))
        .map(|a| a.address.clone())
        .unwrap_or_default()
}

/// An allocatable GPU resource that is not a whole number (a warning, not counted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocatable {resource} {value} is not an integer in [0, {max}]")]
struct NotAnInteger {
    resource: String,
    value: Echo,
    max: u64,
}

/// An allocatable GPU resource: a whole number in `[0, max]` (no whitespace around it).
fn allocatable_int(node: &Node, resource: &str, max: u64) -> Option<Result<u64, NotAnInteger>> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    let v = q.0.parse::<u64>().ok().filter(|v| *v <= max);
    Some(v.ok_or_else(|| NotAnInteger {
        resource: resource.to_string(),
        value: Echo::new(&q.0),
        max,
    }))
}

/// The GPUs of `node`, from its annotation or, failing that, its allocatable resources.
/// `Ok(None)`: not a GPU node. Warnings are pushed to `warnings`.
fn node_gpus(
    node: &Node,
    names: &ResourceNames,
    warnings: &mut Vec<String>,
) -> Option<(GpuSource, Vec<GpuView>)> {
    let gpu = |index, uuid, model, healthy, memory_mib| GpuView {
        index,
        uuid,
        model,
        healthy,
        totals: Totals {
            memory_total_mib: memory_mib,
            core_total: 100,
            ..Totals::default()
        },
        shares: Vec::new(),
    };
    if let Some(gpus) = kubeobjects::node_gpus(node) {
        match gpus {
            Ok(g) => {
                let gpus = g
                    .gpus
                    .into_iter()
                    .map(|g| gpu(g.index, g.uuid, g.model, g.healthy, g.memory_mib))
                    .collect();
                return Some((GpuSource::Annotation, gpus));
            }
            Err(e) => warnings.push(e.to_string()),
        }
    }
    let max_units = GpuQuantities::max_memory_units(names.memory_unit);
    let memory_units = match allocatable_int(node, &names.memory, max_units)? {
        Ok(0) => return None,
        Ok(v) => v,
        Err(e) => {
            warnings.push(e.to_string());
            return None;
        }
    };
    // At most as many GPUs as a node may have: the view makes one entry per GPU.
    let count = match allocatable_int(node, &names.count, MAX_GPUS_PER_NODE as u64) {
        Some(Ok(c)) if c > 0 => c,
        Some(Err(e)) => {
            warnings.push(e.to_string());
            1
        }
        _ => 1,
    };
    // Exact: memory_units ≤ MAX_MEMORY_MIB / unit.
    let per_gpu = memory_units.saturating_mul(names.memory_unit.mib()) / count;
    let gpus = (0..count as u32)
        .map(|i| gpu(i, String::new(), String::new(), true, per_gpu))
        .collect();
    Some((GpuSource::Allocatable, gpus))
}

/// GPU resources a container asks for, as `name=value` pairs (limits, else requests).
fn gpu_requests(pod: &Pod, names: &ResourceNames) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        let Some(res) = &c.resources else { continue };
        for name in [&names.memory, &names.core, &names.count] {
            let v = res
                .limits
                .as_ref()
                .and_then(|l| l.get(name))
                .or_else(|| res.requests.as_ref().and_then(|r| r.get(name)));
            if let Some(v) = v
                && v.0 != "0"
            {
                out.push(format!("{name}={} (container {:?})", v.0, c.name));
            }
        }
    }
    out
}

/// Builds the view from every Node and Pod the caller listed. `only`: node names to keep
/// (empty: all GPU nodes); each must exist and be a GPU node.
pub fn build(
    nodes: &[Node],
    pods: &[Pod],
    names: &ResourceNames,
    only: &[String],
) -> Result<ClusterView, InspectError> {
    let mut views: BTreeMap<String, NodeView> = BTreeMap::new();
    let mut cluster_warnings = Vec::new();
    let mut all_names = Vec::new();
    for node in nodes {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        all_names.push(name.clone());
        let mut warnings = Vec::new();
        let Some((gpu_source, gpus)) = node_gpus(node, names, &mut warnings) else {
            if !warnings.is_empty() {
                cluster_warnings.extend(warnings.into_iter().map(|w| format!("node {name}: {w}")));
            }
            continue;
        };
        let label = |k: &str| kubeobjects::node_label(node, k).map(str::to_string);
        views.insert(
            name.clone(),
            NodeView {
                address: node_address(node),
                schedule: label(SCHEDULE_LABEL),
                placement: label(PLACEMENT_LABEL),
                name,
                gpu_source,
                gpus,
                totals: Totals::default(),
                warnings,
            },
        );
    }
    // A pod assigned but not yet bound has no nodeName; its GPUs' UUIDs still name the node.
    let by_uuid: HashMap<String, String> = views
        .values()
        .flat_map(|n| {
            n.gpus
                .iter()
                .filter(|g| !g.uuid.is_empty())
                .map(|g| (g.uuid.clone(), n.name.clone()))
        })
        .collect();

    let mut pods: Vec<(PodKey, &Pod)> = pods
        .iter()
        .filter(|p| kubeobjects::is_active(p))
        .map(|p| (kubeobjects::pod_key(p), p))
        .collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, pod) in pods {
        let who = format!("pod {key}");
        let node_name = kubeobjects::pod_node(pod).map(str::to_string);
        let Some(assignment) = kubeobjects::pod_assignment(pod) else {
            // Bound without an assignment: kubelet accounts its GPU resources, we cannot say
            // which GPU they are on.
            if let Some(n) = node_name.as_ref().and_then(|n| views.get_mut(n)) {
                let asks = gpu_requests(pod, names);
                if !asks.is_empty() {
                    n.warnings.push(format!(
                        "{who} requests {} but has no {ASSIGNMENT_ANNOTATION} annotation; not counted",
                        asks.join(", ")
                    ));
                }
            }
            continue;
        };
        let assignment = match assignment {
            Ok(a) => a,
            Err(e) => {
                let w = format!("{who}: {e}; not counted");
                match node_name.as_ref().and_then(|n| views.get_mut(n)) {
                    Some(n) => n.warnings.push(w),
                    None => cluster_warnings.push(w),
                }
                continue;
            }
        };
        let node_name = node_name.or_else(|| {
            assignment
                .containers
                .values()
                .flatten()
                .find_map(|s| by_uuid.get(&s.gpu_uuid).cloned())
        });
        let Some(node_name) = node_name else {
            cluster_warnings.push(format!(
                "{who} is assigned GPUs but not bound, and no node has its GPUs' UUIDs; not counted"
            ));
            continue;
        };
        let Some(view) = views.get_mut(&node_name) else {
            cluster_warnings.push(format!(
                "{who} is assigned GPUs on node {node_name}, which publishes no GPUs; not counted"
            ));
            continue;
        };
        let roles = kubeobjects::container_roles(pod);
        let role_of = |name: &str| {
            roles
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(ContainerRole::App, |(_, r)| *r)
        };
        for (container, shares) in &assignment.containers {
            for share in shares {
                let Some(gpu) = view.gpus.iter_mut().find(|g| g.index == share.gpu_index) else {
                    view.warnings.push(format!(
                        "{who} container {container:?} is assigned GPU {} which node {node_name} does not have; not counted",
                        share.gpu_index
                    ));
                    continue;
                };
                let core_percent = match share.core_percent {
                    Some(c) if !(0..=100).contains(&c) => {
                        let counted = c.clamp(0, 100);
                        view.warnings.push(format!(
                            "{who} container {container:?} has corePercent {c} on GPU {}; counted as {counted}",
                            share.gpu_index
                        ));
                        Some(counted as u64)
                    }
                    c => c.map(|c| c as u64),
                };
                gpu.shares.push(ShareView {
                    namespace: key.namespace.clone(),
                    pod: key.name.clone(),
                    container: container.clone(),
                    role: role_of(container),
                    memory_mib: share.memory_mib,
                    core_percent,
                });
            }
        }
        // What the pod holds of each GPU at once (init containers do not add up).
        let held = match peak_per_gpu(&assignment, &roles) {
            Ok(h) => h,
            Err(e) => {
                view.warnings.push(format!("{who}: {e}; not counted"));
                continue;
            }
        };
        for (index, amount) in held {
            if let Some(gpu) = view.gpus.iter_mut().find(|g| g.index == index) {
                gpu.totals.memory_allocated_mib += amount.memory_mib;
                gpu.totals.core_allocated += u64::from(amount.core_percent);
            }
        }
    }

    for n in views.values_mut() {
        for g in &n.gpus {
            let t = &g.totals;
            if t.memory_allocated_mib > t.memory_total_mib {
                n.warnings.push(format!(
                    "GPU {} memory is over-committed: {} MiB allocated of {} MiB",
                    g.index, t.memory_allocated_mib, t.memory_total_mib
                ));
            }
            if t.core_allocated > t.core_total {
                n.warnings.push(format!(
                    "GPU {} compute is over-committed: {}% allocated of {}%",
                    g.index, t.core_allocated, t.core_total
                ));
            }
        }
        n.totals = Totals::sum(n.gpus.iter().map(|g| &g.totals));
    }

    let nodes: Vec<NodeView> = if only.is_empty() {
        views.into_values().collect()
    } else {
        cluster_warnings.clear();
        let mut picked = Vec::with_capacity(only.len());
        for name in only {
            if picked.iter().any(|n: &NodeView| &n.name == name) {
                continue;
            }
            match views.remove(name) {
                Some(v) => picked.push(v),
                None if all_names.contains(name) => {
                    return Err(InspectError::NotAGpuNode {
                        node: name.clone(),
                        annotation: NODE_GPUS_ANNOTATION,
                        memory: names.memory.clone(),
                    });
                }
                None => return Err(InspectError::NoSuchNode(name.clone())),
            }
        }
        picked
    };
    Ok(ClusterView {
        totals: Totals::sum(nodes.iter().map(|n| &n.totals)),
        nodes,
        warnings: cluster_warnings,
    })
}

/// Lists every object of `api`, page by page.
async fn list_all<K>(api: &Api<K>, lp: ListParams) -> kube::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut lp = lp.limit(500);
    loop {
        let page = api.list(&lp).await?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// Why the API server's objects could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot list nodes: {0}")]
    Nodes(kube::Error),
    #[error("cannot list pods: {0}")]
    Pods(kube::Error),
}

/// Reads nodes and non-terminated pods from the API server.
pub async fn fetch(client: kube::Client) -> Result<(Vec<Node>, Vec<Pod>), FetchError> {
    let nodes = list_all(&Api::<Node>::all(client.clone()), ListParams::default())
        .await
        .map_err(FetchError::Nodes)?;
    let pods = list_all(
        &Api::<Pod>::all(client),
        ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
    )
    .await
    .map_err(FetchError::Pods)?;
    Ok((nodes, pods))
}
