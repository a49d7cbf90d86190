//! The extender's view of the cluster: GPU nodes (from their `gpushare.io/gpus` annotation
//! and `ack.node.gpu.*` labels) and every GPU pod's allocation, in a placement [`Engine`].
//!
//! Allocations are *assumed* from the moment `bind` reserves them until the pod is seen bound
//! (then *bound*), and released when binding fails, the pod terminates or goes away, or an
//! assumed pod is not seen bound within the assume TTL. After a restart the cache is rebuilt
//! from the pods' `gpushare.io/assignment` annotations, read with the pods' specs (an init
//! container's share does not add to the others', as at placement). Pure (no IO): the watch
//! loop and the HTTP handlers call in.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::podreq::{InvalidPod, PodDemand, demand_of_assignment, pod_demand};
use super::wire::{ExtenderFilterResult, FilterAnswer, HostPriority, MAX_SCORE};
use crate::kubeobjects::{self, pod_key};
use gpushare_core::echo::Echo;
use gpushare_core::placement::model::{LabelError, TooManyGpus};
use gpushare_core::placement::reject::KIND_LABELS;
use gpushare_core::placement::{
    Engine, GpuDemand, GpuSet, GpuSpec, NodeSpec, Placement, Reject, Request, RequestKey, Why,
    by_name,
};
use gpushare_core::placement::{ShapeLearner, Workload, model::ScheduleMode};
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpusError};
use gpushare_core::request::{
    ASSIGNMENT_ANNOTATION, Assignment, MAX_ANNOTATION_BYTES, ResourceNames,
};

/// What is allocated on one GPU. Serialized as the array
/// `[memory allocated MiB, memory MiB, core allocated per-mille, pods]` (`/allocations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUsage {
    pub memory_allocated_mib: u64,
    pub memory_mib: u64,
    pub core_allocated_milli: u32,
    pub pods: u32,
}

impl serde::Serialize for GpuUsage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (
            self.memory_allocated_mib,
            self.memory_mib,
            self.core_allocated_milli,
            self.pods,
        )
            .serialize(s)
    }
}

/// Large enough for any node: kube-scheduler itself checks CPU and memory.
const UNLIMITED: u64 = u64::MAX / 4;

/// One pod's GPU allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub pod: String,
    pub node: String,
    pub gpus: Vec<u32>,
    pub demand: GpuDemand,
    /// The pod's CPU (milli) and memory (MiB) requests ([`kubeobjects::pod_requests`]).
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub bound: bool,
    /// When it was assumed (meaningless once bound).
    pub since: Instant,
}

/// What `reserve` hands back: the assignment to write and the allocation it holds.
#[derive(Debug, Clone)]
pub struct Reserved {
    pub assignment: Assignment,
    pub allocation: Allocation,
}

/// Why gpushare cannot place on a node (each one a refusal: the node is not, or not yet, fit for
/// gpushare). Node names are shown cut ([`Echo`]): a bind request may name anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("node {node:#} has no GPUs published by gpushare (annotation {NODE_GPUS_ANNOTATION})")]
    NoGpus { node: Echo },
    #[error("node {node:#}: {source}")]
    Gpus { node: Echo, source: NodeGpusError },
    #[error(
        "node {node:#}: annotation {NODE_GPUS_ANNOTATION} lists GPU index {found} where {expected} was expected (indexes must be 0..n)"
    )]
    Index {
        node: Echo,
        found: u32,
        expected: usize,
    },
    #[error("node {node:#}: {source}")]
    Labels { node: Echo, source: LabelError },
    #[error(transparent)]
    TooManyGpus(#[from] TooManyGpus),
    #[error("node {node:#} is not known to gpushare")]
    Unknown { node: Echo },
}

/// Why `reserve` holds nothing: every variant is a refusal (the pod does not fit the node, or
/// its request is invalid).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error(transparent)]
    Invalid(#[from] InvalidPod),
    #[error("pod {pod:#} asks for no GPU resource")]
    NoGpu { pod: Echo },
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("{0}")]
    Unfit(Reject),
    #[error(
        "pod {pod:#}: its {ASSIGNMENT_ANNOTATION} would be {len} bytes, more than the {MAX_ANNOTATION_BYTES} bytes an annotation may take"
    )]
    AssignmentTooLarge { pod: Echo, len: usize },
}

pub struct Cluster {
    names: ResourceNames,
    policy: String,
    /// Every node seen: its spec, or why gpushare cannot place on it.
    nodes: BTreeMap<String, Result<NodeSpec, NodeError>>,
    /// GPU UUIDs per node (for the assignment).
    uuids: HashMap<String, Vec<(u32, String)>>,
    engine: Engine,
    /// By pod UID.
    allocations: HashMap<String, Allocation>,
    assume_ttl: Duration,
    /// Requests of recent GPU pods (the typical shapes of the `gpushare` and `fgd` policies).
    recent: ShapeLearner,
    /// Bound pods without GPUs, by UID: node, CPU (milli) and memory (MiB) they take, so the
    /// engine sees each node's CPU and memory as kube-scheduler does.
    host_pods: HashMap<String, (String, u64, u64)>,
    rebuilds: u64,
    /// How many typical shapes the engine decides with (the last rebuild's).
    shapes: usize,
    /// Node changes not yet in the engine.
    pending: bool,
    /// Bumped on every change of the engine or the node set.
    generation: u64,
    /// The node ids of the latest filters' passing nodes, for the prioritize that follows
    /// (kube-scheduler sends it the nodes filter passed, in the same order).
    passed: PassedMemo,
    /// Filter keeps only this many of the fitting nodes, the policy's best (0: all).
    filter_best: usize,
    /// The request shapes kept scored ahead of their pods ([`Cluster::warm_step`]).
    warm: Warm,
}

/// The warmer's work: the frequent request shapes of the recent pods, and how far the
/// current pass over them has come.
#[derive(Debug, Default)]
struct Warm {
    keys: Vec<Request>,
    /// The next shape and node to look at.
    key: usize,
    node: usize,
    /// The cluster generation the current pass started at, and the last one a whole pass
    /// found unchanged (nothing left to score until the cluster changes).
    pass_generation: u64,
    done: Option<u64>,
}

/// At most this many request shapes are kept scored ahead (the score cache holds 256).
const WARM_KEYS: usize = 192;

/// The distinct request shapes of `requests` (the engine's score cache's [`RequestKey`]s),
/// most frequent first (earliest first among equals), as many as make 99 % of them, at most
/// [`WARM_KEYS`].
fn warm_keys(requests: &[Request]) -> Vec<Request> {
    let mut counts: HashMap<RequestKey, (usize, usize)> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        counts.entry(RequestKey::of(r)).or_insert((0, i)).0 += 1;
    }
    let mut keys: Vec<(usize, usize)> = counts.into_values().collect();
    keys.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let want = requests.len() * 99 / 100;
    let mut covered = 0;
    keys.into_iter()
        .take_while(|&(count, _)| {
            let more = covered < want.max(1);
            covered += count;
            more
        })
        .take(WARM_KEYS)
        .map(|(_, i)| requests[i].clone())
        .collect()
}

/// How many filters' passing nodes are remembered for their prioritize.
const PASSED_MEMO: usize = 4;

/// What a filter passed: by pod UID and the cluster generation it was decided at.
#[derive(Debug, Default)]
struct PassedMemo {
    entries: std::collections::VecDeque<Passed>,
}

#[derive(Debug)]
struct Passed {
    uid: String,
    generation: u64,
    /// Engine node ids of the passing nodes, in the order filter answered them.
    ids: Vec<u32>,
}

impl PassedMemo {
    fn remember(&mut self, p: Passed) {
        self.entries.retain(|e| e.uid != p.uid);
        if self.entries.len() >= PASSED_MEMO {
            self.entries.pop_front();
        }
        self.entries.push_back(p);
    }

    /// The ids of `names` as filter passed them for pod `uid` at `generation`: only if they
    /// are exactly the nodes passed, in the same order (each name is checked against the
    /// engine's name of its id).
    fn ids_of<N: AsRef<str>>(
        &self,
        uid: &str,
        generation: u64,
        names: &[N],
        engine: &Engine,
    ) -> Option<Vec<Option<usize>>> {
        let p = self
            .entries
            .iter()
            .find(|e| e.uid == uid && e.generation == generation)?;
        if p.ids.len() != names.len() {
            return None;
        }
        let nodes = engine.nodes();
        names
            .iter()
            .zip(&p.ids)
            .map(|(n, &id)| {
                let id = id as usize;
                (nodes.get(id)?.spec.name == n.as_ref()).then_some(Some(id))
            })
            .collect()
    }
}

fn engine_for(
    nodes: &BTreeMap<String, Result<NodeSpec, NodeError>>,
    policy: &str,
    workload: &Workload,
) -> Engine {
    let specs: Vec<NodeSpec> = nodes.values().filter_map(|n| n.clone().ok()).collect();
    let p = by_name(policy, workload).expect("policy checked at start-up");
    let mut engine = Engine::new(specs, p);
    // A request shape not scored since many nodes changed (a new shape, or any shape after
    // the typical shapes were refreshed) is scored on every core.
    engine.set_threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    engine
}

/// A node's spec for the engine, from its labels and GPU annotation.
pub fn node_spec(node: &Node) -> Result<(NodeSpec, Vec<(u32, String)>), NodeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let echo = Echo::new(&name);
    let gpus = match kubeobjects::node_gpus(node) {
        None => return Err(NodeError::NoGpus { node: echo }),
        Some(Err(source)) => return Err(NodeError::Gpus { node: echo, source }),
        Some(Ok(g)) => g,
    };
    // The engine numbers GPUs 0..n; the annotation's indexes must be that.
    for (i, g) in gpus.gpus.iter().enumerate() {
        if g.index as usize != i {
            return Err(NodeError::Index {
                node: echo,
                found: g.index,
                expected: i,
            });
        }
    }
    // CPU and memory as kube-scheduler sees them (it filters on them too); a node that
    // publishes none is not limited by them here.
    let (cpu, memory) = kubeobjects::node_allocatable(node);
    let spec = NodeSpec {
        name: name.clone(),
        cpu_milli: cpu.unwrap_or(UNLIMITED),
        memory_mib: memory.unwrap_or(UNLIMITED),
        gpus: gpus
            .gpus
            .iter()
            .map(|g| GpuSpec {
                memory_mib: g.memory_mib,
                model: g.model.clone(),
                healthy: g.healthy,
            })
            .collect(),
        mode: ScheduleMode::Default,
        placement: None,
    }
    .with_labels(&kubeobjects::node_labels(node))
    .map_err(|source| NodeError::Labels { node: echo, source })?;
    // The annotation's parser already bounds the GPUs; the engine must never see more.
    spec.check_gpus()?;
    let uuids = gpus
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.clone()))
        .collect();
    Ok((spec, uuids))
}

/// Every reason a filter rules a node out for: the engine's [`KIND_LABELS`] (same indices as
/// [`Why::kind`]), then a pod whose request is invalid, a node whose GPU annotation is, a node
/// not known yet.
pub const FILTER_REASONS: [&str; 13] = [
    KIND_LABELS[0],
    KIND_LABELS[1],
    KIND_LABELS[2],
    KIND_LABELS[3],
    KIND_LABELS[4],
    KIND_LABELS[5],
    KIND_LABELS[6],
    KIND_LABELS[7],
    KIND_LABELS[8],
    KIND_LABELS[9],
    "invalid_pod",
    "invalid_node",
    "unknown_node",
];
const INVALID_POD: usize = KIND_LABELS.len();
const INVALID_NODE: usize = INVALID_POD + 1;
const UNKNOWN_NODE: usize = INVALID_POD + 2;

/// Rejections that preemption cannot fix (the node can never take the pod).
fn unresolvable(why: &Why) -> bool {
    matches!(
        why,
        Why::NoGpus
            | Why::Model
            | Why::ExclusiveNode
            | Why::CoreOnMemoryOnlyNode
            | Why::MemoryOnlyOnCoreNode
            | Why::TooFewGpus { .. }
    )
}

impl Cluster {
    pub fn new(policy: &str, names: ResourceNames, assume_ttl: Duration) -> Self {
        let nodes = BTreeMap::new();
        Cluster {
            engine: engine_for(&nodes, policy, &Workload::default()),
            names,
            policy: policy.to_string(),
            nodes,
            uuids: HashMap::new(),
            allocations: HashMap::new(),
            assume_ttl,
            recent: ShapeLearner::default(),
            host_pods: HashMap::new(),
            rebuilds: 0,
            shapes: 0,
            pending: false,
            generation: 0,
            passed: PassedMemo::default(),
            filter_best: 0,
            warm: Warm::default(),
        }
    }

    /// Filter answers only the `n` nodes the policy ranks best among those that fit (0: every
    /// fitting node). With 1, kube-scheduler places the pod there without scoring or calling
    /// prioritize: the policy's decision exactly, and one HTTP call and kube-scheduler's
    /// scoring less per pod; kube-scheduler's soft preferences (preferred affinity,
    /// `ScheduleAnyway` spread) then no longer break the policy's ties.
    pub fn set_filter_best(&mut self, n: usize) {
        self.filter_best = n;
    }

    pub fn names(&self) -> &ResourceNames {
        &self.names
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn allocations(&self) -> impl Iterator<Item = (&String, &Allocation)> {
        self.allocations.iter()
    }

    pub fn rebuilds(&self) -> u64 {
        self.rebuilds
    }

    /// How many requests the typical shapes are drawn from (the pods found at start-up and
    /// those reserved since, the last [`ShapeLearner::WINDOW`]).
    pub fn learned_requests(&self) -> usize {
        self.recent.recent().len()
    }

    /// How many typical shapes the engine decides with.
    pub fn typical_shapes(&self) -> usize {
        self.shapes
    }

    /// Nodes gpushare can place on.
    pub fn gpu_nodes(&self) -> usize {
        self.nodes.values().filter(|n| n.is_ok()).count()
    }

    /// Builds the engine anew from the nodes and re-applies every allocation.
    fn rebuild(&mut self) {
        self.rebuilds += 1;
        self.generation += 1;
        self.pending = false;
        let workload = self.recent.workload();
        self.shapes = workload.shapes.len();
        self.engine = engine_for(&self.nodes, &self.policy, &workload);
        self.warm = Warm {
            keys: warm_keys(self.recent.recent()),
            ..Warm::default()
        };
        let allocs: Vec<Allocation> = self.allocations.values().cloned().collect();
        for a in allocs {
            self.apply(&a);
        }
        let hosts: Vec<(String, u64, u64)> = self.host_pods.values().cloned().collect();
        for (node, cpu, mem) in hosts {
            self.host_commit(&node, cpu, mem, true);
        }
    }

    /// Takes `a` in the engine (when its node is known).
    fn apply(&mut self, a: &Allocation) {
        self.generation += 1;
        if let Some(p) = self.placement_of(a) {
            self.engine.commit(&request_of(a), p);
        }
    }

    /// Takes (`take`) or gives back the CPU and memory of a pod without GPUs on `node`.
    fn host_commit(&mut self, node: &str, cpu_milli: u64, memory_mib: u64, take: bool) {
        self.generation += 1;
        if let Some(id) = self.engine.node_id(node) {
            let req = Request::cpu_only(String::new(), cpu_milli, memory_mib);
            let p = Placement {
                node: id,
                gpus: GpuSet::EMPTY,
            };
            if take {
                self.engine.commit(&req, p);
            } else {
                self.engine.release(&req, p);
            }
        }
    }

    fn unapply(&mut self, a: &Allocation) {
        self.generation += 1;
        if let Some(p) = self.placement_of(a) {
            self.engine.release(&request_of(a), p);
        }
    }

    fn placement_of(&self, a: &Allocation) -> Option<Placement> {
        let id = self.engine.node_id(&a.node)?;
        let n = self.engine.nodes()[id].gpus.len();
        if a.gpus.iter().any(|&g| g as usize >= n) {
            return None;
        }
        Some(Placement {
            node: id,
            gpus: a.gpus.iter().map(|&g| g as usize).collect::<GpuSet>(),
        })
    }

    /// A node was added or changed.
    pub fn set_node(&mut self, node: &Node) {
        if self.set_node_deferred(node) {
            self.rebuild();
        }
    }

    /// Like [`Cluster::set_node`] without rebuilding the engine (for the initial list: call
    /// [`Cluster::flush`] after the batch). Returns whether a rebuild is due.
    pub fn set_node_deferred(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.clone() else {
            return false;
        };
        let entry = node_spec(node);
        let uuids = entry.as_ref().map(|(_, u)| u.clone()).unwrap_or_default();
        let spec = entry.map(|(s, _)| s);
        if self.nodes.get(&name) == Some(&spec) {
            self.uuids.insert(name, uuids);
            return false;
        }
        if let Err(e) = &spec {
            tracing::debug!(node = %name, "not a gpushare node: {e}");
        }
        self.nodes.insert(name.clone(), spec);
        self.uuids.insert(name, uuids);
        self.pending = true;
        self.generation += 1;
        true
    }

    /// Rebuilds the engine if deferred node changes are pending.
    pub fn flush(&mut self) {
        if self.pending {
            self.rebuild();
        }
    }

    pub fn remove_node(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.uuids.remove(name);
            self.rebuild();
        }
    }

    /// Replaces the node set (after a watch restart).
    pub fn retain_nodes(&mut self, names: &std::collections::HashSet<String>) {
        let before = self.nodes.len();
        self.nodes.retain(|n, _| names.contains(n));
        self.uuids.retain(|n, _| names.contains(n));
        if self.nodes.len() != before || self.pending {
            self.rebuild();
        }
    }

    /// A pod as the watch sees it: bound with an assignment → its allocation is bound (made
    /// from the annotation when the cache did not assume it, e.g. after a restart);
    /// terminated → released.
    pub fn observe_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        // A pod being deleted keeps its GPUs until it has terminated.
        if !kubeobjects::is_active(pod) {
            self.forget_pod(&uid);
            return;
        }
        let Some(node) = kubeobjects::pod_node(pod) else {
            return;
        };
        let (cpu_milli, memory_mib) = kubeobjects::pod_requests(pod);
        let Some(assignment) = kubeobjects::pod_assignment(pod) else {
            // Not a GPU pod: only its CPU and memory (a pod's requests do not change once
            // bound, but its node is taken as last seen).
            if self.host_pods.get(&uid).map(|h| h.0.as_str()) != Some(node) {
                self.forget_pod(&uid);
                self.host_commit(node, cpu_milli, memory_mib, true);
                self.host_pods
                    .insert(uid, (node.to_string(), cpu_milli, memory_mib));
            }
            return;
        };
        let Ok(a) = assignment else {
            tracing::warn!(pod = %pod_key(pod), "unreadable {ASSIGNMENT_ANNOTATION}: ignored");
            return;
        };
        // Seen without GPUs before: its CPU and memory are counted below, with its GPUs.
        if let Some((node, cpu, mem)) = self.host_pods.remove(&uid) {
            self.host_commit(&node, cpu, mem, false);
        }
        // Init containers are told from the pod's spec: their shares do not add up.
        let roles = kubeobjects::container_roles(pod);
        let Ok((gpus, demand)) = demand_of_assignment(&a, &roles) else {
            return;
        };
        let alloc = Allocation {
            pod: pod_key(pod).to_string(),
            node: node.to_string(),
            gpus,
            demand,
            cpu_milli,
            memory_mib,
            bound: true,
            since: Instant::now(),
        };
        match self.allocations.get(&uid) {
            Some(old) if old.node == alloc.node && old.gpus == alloc.gpus => {
                self.allocations.get_mut(&uid).expect("present").bound = true;
            }
            Some(old) => {
                let old = old.clone();
                self.unapply(&old);
                self.apply(&alloc);
                self.allocations.insert(uid, alloc);
            }
            None => {
                self.apply(&alloc);
                self.allocations.insert(uid, alloc);
            }
        }
    }

    /// The pod list is in (the pod watch's initial list). When nothing was learned yet (at
    /// start-up), the pods found holding GPUs seed the typical shapes: the next decision
    /// rebuilds the engine with them, and the extender's own reservations join them.
    pub fn pods_listed(&mut self) {
        if !self.recent.recent().is_empty() || self.allocations.is_empty() {
            return;
        }
        let mut found: Vec<&Allocation> = self.allocations.values().collect();
        // In pod name order (beyond the window, which pods it keeps is arbitrary).
        found.sort_by(|a, b| a.pod.cmp(&b.pod));
        let requests: Vec<Request> = found.into_iter().map(request_of).collect();
        self.recent.seed(requests);
        self.pending = true;
    }

    /// Whether the cache holds resources for pod `uid` (reserved by a bind, or seen bound by
    /// the watch).
    pub fn holds(&self, uid: &str) -> bool {
        self.allocations.contains_key(uid) || self.host_pods.contains_key(uid)
    }

    /// The pod is gone (deleted, terminated or binding failed).
    pub fn forget_pod(&mut self, uid: &str) {
        if let Some(a) = self.allocations.remove(uid) {
            self.unapply(&a);
        }
        if let Some((node, cpu, mem)) = self.host_pods.remove(uid) {
            self.host_commit(&node, cpu, mem, false);
        }
    }

    /// After a watch restart: forgets bound allocations of pods no longer listed.
    pub fn retain_pods(&mut self, uids: &std::collections::HashSet<String>) {
        let gone: Vec<String> = self
            .allocations
            .iter()
            .filter(|(u, a)| a.bound && !uids.contains(*u))
            .map(|(u, _)| u.clone())
            .chain(
                self.host_pods
                    .keys()
                    .filter(|u| !uids.contains(*u))
                    .cloned(),
            )
            .collect();
        for u in gone {
            self.forget_pod(&u);
        }
    }

    /// Releases assumed allocations older than the TTL; returns the pods released.
    pub fn expire_assumed(&mut self, now: Instant) -> Vec<String> {
        let old: Vec<String> = self
            .allocations
            .iter()
            .filter(|(_, a)| !a.bound && now.duration_since(a.since) > self.assume_ttl)
            .map(|(u, _)| u.clone())
            .collect();
        let mut pods = Vec::new();
        for u in old {
            if let Some(a) = self.allocations.get(&u) {
                pods.push(a.pod.clone());
            }
            self.forget_pod(&u);
        }
        pods
    }

    fn demand(&self, pod: &Pod) -> Result<Option<PodDemand>, InvalidPod> {
        let mut d = pod_demand(pod, &self.names).map_err(|source| InvalidPod {
            pod: Echo::new(&pod_key(pod).to_string()),
            source: Box::new(source),
        })?;
        if let Some(d) = &mut d {
            (d.request.cpu_milli, d.request.memory_mib) = kubeobjects::pod_requests(pod);
        }
        Ok(d)
    }

    /// `filter`: which of `names` can take the pod, and why the others cannot.
    pub fn filter(&mut self, pod: &Pod, names: &[String]) -> ExtenderFilterResult {
        self.filter_counted(pod, names, &mut |_| {})
    }

    /// [`Cluster::filter`], telling `rejected` the reason (an index into [`FILTER_REASONS`])
    /// of each node it rules out.
    pub fn filter_counted(
        &mut self,
        pod: &Pod,
        names: &[String],
        rejected: &mut dyn FnMut(usize),
    ) -> ExtenderFilterResult {
        self.filter_answer(pod, names, rejected).into_owned()
    }

    /// [`Cluster::filter_counted`] with the answer borrowing the names. The nodes that pass
    /// are scored for the pod on the way (through the engine's score cache, which the
    /// prioritize that follows reads) and their ids remembered for that prioritize.
    pub fn filter_answer<'a, N: AsRef<str>>(
        &mut self,
        pod: &Pod,
        names: &'a [N],
        rejected: &mut dyn FnMut(usize),
    ) -> FilterAnswer<'a> {
        // Node changes listed after a watch restart reach the engine before any decision.
        self.flush();
        let mut out = FilterAnswer::default();
        let demand = match self.demand(pod) {
            Ok(Some(d)) => d,
            // Not ours: every node passes (or the best, ranked as prioritize ranks it).
            Ok(None) => {
                let mut ok: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
                if self.filter_best > 0 && ok.len() > self.filter_best {
                    let ids: Vec<Option<usize>> =
                        ok.iter().map(|n| self.engine.node_id(n)).collect();
                    let request = self.host_request(pod);
                    let scores = self.raw_scores(&request, &ids);
                    let keep =
                        best_by_id(&scores, |i| ids[i].unwrap_or(usize::MAX), self.filter_best);
                    ok = keep.iter().map(|&i| ok[i]).collect();
                }
                out.node_names = Some(ok);
                return out;
            }
            Err(e) => {
                let e = e.to_string();
                for n in names {
                    out.failed_and_unresolvable_nodes
                        .insert(n.as_ref(), e.clone());
                    rejected(INVALID_POD);
                }
                out.node_names = Some(Vec::new());
                return out;
            }
        };
        let req = &demand.request;
        let mut ok = Vec::with_capacity(names.len());
        let mut ids = Vec::with_capacity(names.len());
        let mut scorer = self.engine.scorer(req);
        // Every good node is in the engine: one hash lookup on the common path.
        let found: Vec<Option<usize>> = names
            .iter()
            .map(|n| scorer.engine().node_id(n.as_ref()))
            .collect();
        scorer.prepare(found.iter().flatten().copied());
        for (n, &found) in names.iter().zip(&found) {
            let n = n.as_ref();
            let verdict = match found {
                // The pod fits exactly where the policy has a score for it.
                Some(id) if scorer.choice(id).is_some() => Ok(id),
                Some(id) => match scorer.engine().check(id, req) {
                    Ok(_) => Ok(id),
                    Err(r) => Err((r.to_string(), unresolvable(&r.why), r.why.kind())),
                },
                None => Err(match self.nodes.get(n) {
                    Some(Err(e)) => (e.to_string(), true, INVALID_NODE),
                    _ => (
                        format!("node {:#} is not known to gpushare yet", Echo::new(n)),
                        false,
                        UNKNOWN_NODE,
                    ),
                }),
            };
            match verdict {
                Ok(id) => {
                    ok.push(n);
                    ids.push(id as u32);
                }
                Err((msg, true, reason)) => {
                    out.failed_and_unresolvable_nodes.insert(n, msg);
                    rejected(reason);
                }
                Err((msg, false, reason)) => {
                    out.failed_nodes.insert(n, msg);
                    rejected(reason);
                }
            }
        }
        if self.filter_best > 0 && ok.len() > self.filter_best {
            // Scored on the way above (the engine's cache): no new work.
            let scores: Vec<Option<f64>> = ids
                .iter()
                .map(|&id| scorer.choice(id as usize).map(|c| c.score))
                .collect();
            let keep = best_by_id(&scores, |i| ids[i] as usize, self.filter_best);
            ok = keep.iter().map(|&i| ok[i]).collect();
            ids = keep.iter().map(|&i| ids[i]).collect();
        }
        if let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
            self.passed.remember(Passed {
                uid: uid.to_string(),
                generation: self.generation,
                ids,
            });
        }
        out.node_names = Some(ok);
        out
    }

    /// `prioritize`: the policy's preference among `names`, as 0..=10 by rank (best 10).
    pub fn prioritize(&mut self, pod: &Pod, names: &[String]) -> Vec<HostPriority> {
        let scores = self.priorities(pod, names);
        names
            .iter()
            .zip(scores)
            .map(|(n, score)| HostPriority {
                host: n.clone(),
                score,
            })
            .collect()
    }

    /// [`Cluster::prioritize`]'s scores, in the order of `names`.
    pub fn priorities<N: AsRef<str>>(&mut self, pod: &Pod, names: &[N]) -> Vec<i64> {
        self.flush();
        let request = match self.demand(pod) {
            Ok(Some(demand)) => demand.request,
            // A pod without GPUs (asked when the extender manages every pod): ranked by
            // the same policy, which keeps it off the CPU and memory that GPUs need; a node
            // without gpushare GPUs is the best place for it.
            Ok(None) => self.host_request(pod),
            Err(_) => return vec![0; names.len()],
        };
        // The nodes filter passed for this pod, unchanged since: their ids are known.
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let ids = self
            .passed
            .ids_of(uid, self.generation, names, &self.engine)
            .unwrap_or_else(|| {
                names
                    .iter()
                    .map(|n| self.engine.node_id(n.as_ref()))
                    .collect()
            });
        let scores = self.raw_scores(&request, &ids);
        let mut distinct: Vec<f64> = scores.iter().flatten().copied().collect();
        // `total_cmp` is a total order whose equal values are identical: unstable is stable.
        distinct.sort_unstable_by(|a, b| b.total_cmp(a));
        distinct.dedup();
        let levels = distinct.len().max(1) as i64;
        scores
            .into_iter()
            .map(|s| {
                s.map_or(0, |s| {
                    // `distinct` is sorted descending: the rank is how many scores beat `s`.
                    let rank = distinct.partition_point(|&d| d > s) as i64;
                    MAX_SCORE - rank * MAX_SCORE / levels
                })
            })
            .collect()
    }

    /// The request of a pod without GPUs: its CPU and memory.
    fn host_request(&self, pod: &Pod) -> Request {
        let (cpu, mem) = kubeobjects::pod_requests(pod);
        Request::cpu_only(pod_key(pod).to_string(), cpu, mem)
    }

    /// The policy's score of `request` on each node (`None`: it does not fit); a pod without
    /// GPUs is best on a node that is not gpushare's (`ids` `None`).
    fn raw_scores(&mut self, request: &Request, ids: &[Option<usize>]) -> Vec<Option<f64>> {
        let cpu_only = request.gpu == GpuDemand::None;
        let mut scorer = self.engine.scorer(request);
        scorer.prepare(ids.iter().flatten().copied());
        ids.iter()
            .map(|id| match id {
                Some(id) => scorer.choice(*id).map(|c| c.score),
                None if cpu_only => Some(f64::INFINITY),
                None => None,
            })
            .collect()
    }

    /// A pod without GPUs being bound to `node`: its CPU and memory are held there until the
    /// watch sees it (or [`Cluster::forget_pod`]).
    pub fn assume_host(&mut self, pod: &Pod, node: &str) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        self.forget_pod(&uid);
        let (cpu, mem) = kubeobjects::pod_requests(pod);
        self.host_commit(node, cpu, mem, true);
        self.host_pods.insert(uid, (node.to_string(), cpu, mem));
    }

    /// `bind`, first half: picks the pod's GPUs on `node` and holds them (assumed).
    pub fn reserve(
        &mut self,
        pod: &Pod,
        node: &str,
        timestamp: String,
    ) -> Result<Reserved, ReserveError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(demand) = self.demand(pod)? else {
            return Err(ReserveError::NoGpu {
                pod: Echo::new(&pod_key(pod).to_string()),
            });
        };
        // A retried bind: give back what an earlier attempt held.
        self.forget_pod(&uid);
        self.flush();
        let Some(id) = self.engine.node_id(node) else {
            return Err(match self.nodes.get(node) {
                Some(Err(e)) => e.clone(),
                _ => NodeError::Unknown {
                    node: Echo::new(node),
                },
            }
            .into());
        };
        let choice = self
            .engine
            .evaluate(id, &demand.request)
            .map_err(ReserveError::Unfit)?;
        let uuids = self.uuids.get(node).cloned().unwrap_or_default();
        let gpus: Vec<(u32, String)> = choice
            .gpus
            .iter()
            .map(|i| {
                let uuid = uuids
                    .iter()
                    .find(|(x, _)| *x as usize == i)
                    .map(|(_, u)| u.clone())
                    .unwrap_or_default();
                (i as u32, uuid)
            })
            .collect();
        // What bind writes must be what the node can read: no larger than an annotation may
        // be (a pod from a request body may have container names no API server admits).
        let assignment = demand.assignment(&gpus, timestamp);
        let len = assignment.to_json().len();
        if len > MAX_ANNOTATION_BYTES {
            return Err(ReserveError::AssignmentTooLarge {
                pod: Echo::new(&pod_key(pod).to_string()),
                len,
            });
        }
        let p = Placement {
            node: id,
            gpus: choice.gpus,
        };
        self.engine.commit(&demand.request, p);
        self.generation += 1;
        let allocation = Allocation {
            pod: pod_key(pod).to_string(),
            node: node.to_string(),
            gpus: gpus.iter().map(|(i, _)| *i).collect(),
            demand: demand.request.gpu,
            cpu_milli: demand.request.cpu_milli,
            memory_mib: demand.request.memory_mib,
            bound: false,
            since: Instant::now(),
        };
        self.allocations.insert(uid, allocation.clone());
        if self.recent.record(&demand.request) {
            // Picked up by the next decision's flush: the engine is rebuilt with the shapes.
            self.pending = true;
        }
        Ok(Reserved {
            assignment,
            allocation,
        })
    }

    /// Scores up to `nodes` nodes for the frequent request shapes of the recent pods, where
    /// their cached scores are stale, so that a filter for such a pod finds its scores ready:
    /// after the engine is rebuilt (the typical shapes refreshed, a node changed) every score
    /// is stale, and scoring 5,000 nodes for one shape takes milliseconds. Call it while the
    /// extender is idle, a little at a time (each call holds the cluster); `true`: there is
    /// more to do now, `false`: every such shape is scored on every node as the cluster
    /// stands.
    pub fn warm_step(&mut self, nodes: usize) -> bool {
        self.flush();
        let n = self.engine.nodes().len();
        if n == 0 || self.warmed() {
            return false;
        }
        let w = &mut self.warm;
        if w.key >= w.keys.len() {
            if w.pass_generation == self.generation {
                w.done = Some(self.generation);
                return false;
            }
            // The cluster changed during the pass: another (only changed nodes are scored).
            w.key = 0;
            w.node = 0;
        }
        if w.key == 0 && w.node == 0 {
            w.pass_generation = self.generation;
        }
        let end = (w.node + nodes.max(1)).min(n);
        self.engine.scorer(&w.keys[w.key]).prepare(w.node..end);
        w.node = end;
        if end == n {
            w.key += 1;
            w.node = 0;
        }
        true
    }

    /// Whether the warmer has nothing to do: every frequent shape is scored on every node as
    /// the cluster stands ([`Cluster::warm_step`] returned `false` since the last change).
    pub fn warmed(&self) -> bool {
        self.warm.keys.is_empty() || self.warm.done == Some(self.generation)
    }

    /// Per node and GPU: what is allocated ([`GpuUsage`]).
    pub fn usage(&self) -> Vec<(String, Vec<GpuUsage>)> {
        self.engine
            .nodes()
            .iter()
            .map(|n| {
                (
                    n.spec.name.clone(),
                    n.gpus
                        .iter()
                        .map(|g| GpuUsage {
                            memory_allocated_mib: g.memory_mib - g.memory_free,
                            memory_mib: g.memory_mib,
                            core_allocated_milli: 1000 - g.core_free,
                            pods: g.pods,
                        })
                        .collect(),
                )
            })
            .collect()
    }
}

/// The indices of the `n` best of `scores` (a missing score is worst), in the order of
/// `node_id(index)`. Among equal scores the lowest node id (name order) is kept: the
/// simulator's node order (`--as-extender`), not kube-scheduler's list order.
fn best_by_id(scores: &[Option<f64>], node_id: impl Fn(usize) -> usize, n: usize) -> Vec<usize> {
    let mut by_id: Vec<usize> = (0..scores.len()).collect();
    by_id.sort_by_key(|&i| node_id(i));
    let key = |i: usize| scores[i].unwrap_or(f64::NEG_INFINITY);
    // Stable: equal scores stay in id order.
    let mut best = by_id.clone();
    best.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    let mut keep = vec![false; scores.len()];
    for &i in best.iter().take(n) {
        keep[i] = true;
    }
    by_id.retain(|&i| keep[i]);
    by_id
}

fn request_of(a: &Allocation) -> Request {
    let mut r = Request::cpu_only(a.pod.clone(), a.cpu_milli, a.memory_mib);
    r.gpu = a.demand;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::request::node::NodeGpus;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, gpus: u32, mode: &str, placement: &str) -> Node {
        let inv = NodeGpus {
            version: 1,
            gpus: (0..gpus)
                .map(|i| gpushare_core::request::node::NodeGpu {
                    index: i,
                    uuid: format!("GPU-{name}-{i}"),
                    model: "sim".into(),
                    memory_mib: 15 * 1024,
                    healthy: true,
                })
                .collect(),
        };
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [
                        ("ack.node.gpu.schedule".to_string(), mode.to_string()),
                        ("ack.node.gpu.placement".to_string(), placement.to_string()),
                    ]
                    .into(),
                ),
                annotations: Some([(NODE_GPUS_ANNOTATION.to_string(), inv.to_json())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(name: &str, mem: &str, core: Option<&str>) -> Pod {
        let mut limits = vec![("aliyun.com/gpu-mem".to_string(), Quantity(mem.into()))];
        if let Some(c) = core {
            limits.push((
                "aliyun.com/gpu-core.percentage".to_string(),
                Quantity(c.into()),
            ));
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(limits.into_iter().collect()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn bound(mut p: Pod, node: &str, a: &Assignment) -> Pod {
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        p.metadata.annotations = Some([(ASSIGNMENT_ANNOTATION.to_string(), a.to_json())].into());
        p
    }

    /// A valid RFC 3339 timestamp (the assignment's `timestamp` is checked when read back).
    const TS: &str = "2026-11-29T19:00:00Z";

    /// A cache with `policy`, the default resource names and a 60 s assume TTL.
    fn cluster(policy: &str) -> Cluster {
        Cluster::new(policy, ResourceNames::default(), Duration::from_secs(60))
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn filter_reasons_and_binpack_reservations() {
        let mut c = cluster("gpushare");
        c.set_node(&node("a", 4, "core_mem", "binpack"));
        c.set_node(&node("m", 2, "cgpu", "binpack"));
        let mut plain = node("x", 0, "core_mem", "binpack");
        plain.metadata.annotations = None;
        c.set_node(&plain);
        let p = pod("p1", "2", Some("30"));
        let mut reasons = Vec::new();
        let mut count = |r: usize| reasons.push(FILTER_REASONS[r]);
        let r = c.filter_counted(&p, &names(&["a", "m", "x", "unknown"]), &mut count);
        // The reasons the extender's metric counts, one per node ruled out.
        assert_eq!(
            reasons,
            ["core_on_memory_only_node", "invalid_node", "unknown_node"]
        );
        assert_eq!(r.node_names.as_deref(), Some(&names(&["a"])[..]));
        assert!(
            r.failed_and_unresolvable_nodes["m"].contains("schedule=cgpu"),
            "{r:?}"
        );
        assert!(r.failed_and_unresolvable_nodes["x"].contains("gpushare.io/gpus"));
        assert!(r.failed_nodes["unknown"].contains("not known"));
        // Memory-only pod: not on the core_mem node.
        let mut reasons = Vec::new();
        let mut count = |r: usize| reasons.push(FILTER_REASONS[r]);
        let r = c.filter_counted(&pod("m1", "2", None), &names(&["a", "m"]), &mut count);
        assert_eq!(reasons, ["memory_only_on_core_node"]);
        assert_eq!(r.node_names.as_deref(), Some(&names(&["m"])[..]));
        assert!(
            r.failed_and_unresolvable_nodes["a"].contains("needs a cgpu or share node"),
            "{r:?}"
        );
        // Invalid: every node fails with the reason.
        let mut reasons = Vec::new();
        let mut count = |r: usize| reasons.push(FILTER_REASONS[r]);
        let r = c.filter_counted(&pod("bad", "2", Some("33")), &names(&["a"]), &mut count);
        assert_eq!(reasons, ["invalid_pod"]);
        assert!(
            r.failed_and_unresolvable_nodes["a"].contains("33 is not a multiple of 5"),
            "{r:?}"
        );
        // Binpack: three 30 % pods share GPU 0, the fourth goes to GPU 1.
        let mut gpus = Vec::new();
        for i in 0..4 {
            let res = c
                .reserve(&pod(&format!("q{i}"), "2", Some("30")), "a", TS.into())
                .unwrap();
            gpus.push(res.allocation.gpus[0]);
        }
        assert_eq!(gpus, [0, 0, 0, 1]);
        let usage = c.usage();
        let a = usage.iter().find(|(n, _)| n == "a").unwrap();
        assert_eq!(
            a.1[0],
            GpuUsage {
                memory_allocated_mib: 6144,
                memory_mib: 15360,
                core_allocated_milli: 900,
                pods: 3
            }
        );
        assert_eq!(
            serde_json::to_string(&a.1[0]).unwrap(),
            "[6144,15360,900,3]"
        );
    }

    #[test]
    fn typical_shapes_follow_the_pods_reserved() {
        let mut c = cluster("gpushare");
        for (n, gpus) in [("a", 1), ("b", 1), ("z", 8)] {
            c.set_node(&node(n, gpus, "share", "binpack"));
        }
        // a keeps 14 GiB free, b 8 GiB.
        c.reserve(&pod("one", "1", None), "a", TS.into()).unwrap();
        c.reserve(&pod("seven", "7", None), "b", TS.into()).unwrap();
        let next = pod("next", "7", None);
        let ab = names(&["a", "b"]);
        let rebuilds = c.rebuilds();
        for i in 0..5 {
            c.reserve(&pod(&format!("eight{i}"), "8", None), "z", TS.into())
                .unwrap();
        }
        // Seven pods reserved, no shapes yet: both nodes are equally good for a 7 GiB pod.
        let p = c.priorities(&next, &ab);
        assert_eq!(p[0], p[1], "{p:?}");
        assert_eq!(c.rebuilds(), rebuilds);
        // The eighth refreshes the shapes (mostly 8 GiB pods): a 7 GiB pod now goes where
        // it spoils no room for an 8 GiB one.
        c.reserve(&pod("eight5", "8", None), "z", TS.into())
            .unwrap();
        let p = c.priorities(&next, &ab);
        assert_eq!(c.rebuilds(), rebuilds + 1);
        assert!(p[1] > p[0], "{p:?}");
        // The allocations survived the rebuild.
        let used: u64 = c
            .usage()
            .iter()
            .flat_map(|(_, g)| g.iter().map(|g| g.memory_allocated_mib))
            .sum();
        assert_eq!(used, (1 + 7 + 6 * 8) * 1024);
    }

    #[test]
    fn after_a_restart_the_pods_found_seed_the_typical_shapes() {
        let listed = || {
            let mut c = cluster("gpushare");
            for (n, gpus) in [("a", 1), ("b", 1), ("z", 8)] {
                c.set_node(&node(n, gpus, "share", "binpack"));
            }
            c
        };
        let mut c = listed();
        // As above: a keeps 14 GiB free, b 8 GiB, and six 8 GiB pods make 8 GiB the
        // typical shape.
        let mut placed = vec![(pod("one", "1", None), "a"), (pod("seven", "7", None), "b")];
        placed.extend((0..6).map(|i| (pod(&format!("eight{i}"), "8", None), "z")));
        let placed: Vec<Pod> = placed
            .into_iter()
            .map(|(p, n)| {
                let r = c.reserve(&p, n, TS.into()).unwrap();
                bound(p, n, &r.assignment)
            })
            .collect();
        let next = pod("next", "7", None);
        let ab = names(&["a", "b"]);
        let p = c.priorities(&next, &ab);
        assert!(p[1] > p[0], "{p:?}");

        // A new extender lists the nodes, then the pods: it knows the shapes at once.
        let mut d = listed();
        for p in &placed {
            d.observe_pod(p);
        }
        assert_eq!((d.learned_requests(), d.typical_shapes()), (0, 0));
        d.pods_listed();
        assert_eq!(d.learned_requests(), 8);
        assert_eq!(c.usage(), d.usage());
        let p = d.priorities(&next, &ab);
        assert!(p[1] > p[0], "the shapes of the pods found: {p:?}");
        // Its own first reservations (1 GiB pods) refresh the shapes with the pods found,
        // not instead of them.
        let rebuilds = d.rebuilds();
        for i in 0..8 {
            d.reserve(&pod(&format!("small{i}"), "1", None), "z", TS.into())
                .unwrap();
        }
        let p = d.priorities(&next, &ab);
        assert_eq!(d.rebuilds(), rebuilds + 1);
        assert!(p[1] > p[0], "8 GiB pods still typical: {p:?}");
        assert!(d.typical_shapes() >= 2, "{}", d.typical_shapes());
        // Listing again (a watch restart) seeds nothing more.
        d.pods_listed();
        assert_eq!(d.learned_requests(), 16);
    }

    #[test]
    fn the_warmer_scores_the_frequent_shapes_ahead_and_rescores_only_changes() {
        let mut c = cluster("gpushare");
        let nodes: Vec<String> = (0..40).map(|i| format!("n{i:02}")).collect();
        for n in &nodes {
            c.set_node(&node(n, 2, "share", "binpack"));
        }
        // Nothing reserved yet: no shapes to warm.
        assert!(!c.warm_step(16));
        // Eight 8 GiB pods: the eighth refreshes the shapes (a rebuild, every score stale),
        // and the warmer keeps their shape scored.
        for (i, n) in nodes.iter().take(8).enumerate() {
            c.reserve(&pod(&format!("p{i}"), "8", None), n, TS.into())
                .unwrap();
        }
        let eight = c.demand(&pod("x", "8", None)).unwrap().unwrap().request;
        let five = c.demand(&pod("y", "5", None)).unwrap().unwrap().request;
        assert_eq!(c.engine().stale_nodes(&eight), 40);
        let mut steps = 0;
        while c.warm_step(16) {
            steps += 1;
            assert!(steps < 100, "the warmer never finishes");
        }
        // 40 nodes in slices of 16: three steps for the one shape, then the pass is checked.
        assert_eq!(steps, 3);
        assert_eq!(c.engine().stale_nodes(&eight), 0);
        // A shape no recent pod had is left to its filter.
        assert_eq!(c.engine().stale_nodes(&five), 40);
        // Nothing changed: nothing to do.
        assert!(!c.warm_step(16));
        // One reservation changes one node: one score is stale, and the warmer mends it.
        c.reserve(&pod("p8", "8", None), &nodes[9], TS.into())
            .unwrap();
        assert_eq!(c.engine().stale_nodes(&eight), 1);
        while c.warm_step(16) {}
        assert_eq!(c.engine().stale_nodes(&eight), 0);
        // What the warmer cached is what scoring afresh gives.
        let best = c.filter(&pod("x", "8", None), &nodes);
        let mut fresh = cluster("gpushare");
        for n in &nodes {
            fresh.set_node(&node(n, 2, "share", "binpack"));
        }
        for (i, n) in (0..8).chain([9]).enumerate() {
            fresh
                .reserve(&pod(&format!("p{i}"), "8", None), &nodes[n], TS.into())
                .unwrap();
        }
        assert_eq!(best, fresh.filter(&pod("x", "8", None), &nodes));
    }

    #[test]
    fn cpu_and_memory_are_counted_as_kube_scheduler_does() {
        use k8s_openapi::api::core::v1::NodeStatus;
        let mut c = cluster("gpushare");
        for n in ["a", "b"] {
            let mut nd = node(n, 1, "core_mem", "binpack");
            nd.status = Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_string(), Quantity("4".into())),
                        ("memory".to_string(), Quantity("8Gi".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            });
            c.set_node(&nd);
        }
        let with_cpu = |mut p: Pod, cpu: &str| {
            let r = p.spec.as_mut().unwrap().containers[0]
                .resources
                .as_mut()
                .unwrap();
            r.requests = Some([("cpu".to_string(), Quantity(cpu.into()))].into());
            p
        };
        // A pod without GPUs, bound to a, takes 3 of its 4 CPUs.
        let mut busy = with_cpu(pod("busy", "1", None), "3");
        busy.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits = None;
        busy.spec.as_mut().unwrap().node_name = Some("a".into());
        c.observe_pod(&busy);
        let gpu = with_cpu(pod("g", "2", Some("30")), "1500m");
        let mut reasons = Vec::new();
        let r = c.filter_counted(&gpu, &names(&["a", "b"]), &mut |k| {
            reasons.push(FILTER_REASONS[k])
        });
        assert_eq!(r.node_names.as_deref(), Some(&names(&["b"])[..]), "{r:?}");
        assert_eq!(reasons, ["cpu"]);
        // It finishes: a takes the pod again.
        busy.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        c.observe_pod(&busy);
        let r = c.filter(&gpu, &names(&["a", "b"]));
        assert_eq!(r.node_names.as_deref(), Some(&names(&["a", "b"])[..]));
        // A reserved GPU pod holds its CPU too, also across a rebuild: two 1.5-CPU pods fit a
        // node's 4 CPUs, a third does not.
        for i in 0..2 {
            c.reserve(
                &with_cpu(pod(&format!("g{i}"), "2", Some("30")), "1500m"),
                "a",
                TS.into(),
            )
            .unwrap();
        }
        c.set_node(&node("c", 1, "core_mem", "binpack"));
        let e = c
            .reserve(
                &with_cpu(pod("g3", "2", Some("30")), "1500m"),
                "a",
                TS.into(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("CPU"), "{e}");
    }

    #[test]
    fn pods_without_gpus_are_ranked_away_from_the_cpu_gpus_need() {
        use k8s_openapi::api::core::v1::NodeStatus;
        let mut c = cluster("gpushare");
        for (n, gpus, cpu) in [("a", 1, "4"), ("b", 1, "4"), ("z", 8, "100")] {
            let mut nd = node(n, gpus, "core_mem", "binpack");
            nd.status = Some(NodeStatus {
                allocatable: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                ..Default::default()
            });
            c.set_node(&nd);
        }
        let with_cpu = |mut p: Pod, cpu: &str| {
            p.spec.as_mut().unwrap().containers[0]
                .resources
                .as_mut()
                .unwrap()
                .requests = Some([("cpu".to_string(), Quantity(cpu.into()))].into());
            p
        };
        // b's GPU is taken whole; GPU pods ask 2 CPUs (the typical shapes, after 8 pods).
        c.reserve(
            &with_cpu(pod("full", "15", Some("100")), "1"),
            "b",
            TS.into(),
        )
        .unwrap();
        for i in 0..7 {
            c.reserve(
                &with_cpu(pod(&format!("g{i}"), "2", Some("30")), "2"),
                "z",
                TS.into(),
            )
            .unwrap();
        }
        // A 3-CPU pod without GPUs: on a it would leave 1 CPU beside an idle GPU (stranded);
        // on b nothing is stranded; a node without gpushare GPUs (x) is best.
        let mut plain = with_cpu(pod("plain", "1", None), "3");
        plain.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits = None;
        let p = c.priorities(&plain, &names(&["a", "b", "x"]));
        assert!(p[1] > p[0] && p[2] >= p[1], "{p:?}");
    }

    #[test]
    fn never_overcommits_and_survives_restart() {
        let mut c = cluster("binpack");
        c.set_node(&node("a", 2, "core_mem", "binpack"));
        let mut placed = Vec::new();
        for i in 0..10 {
            let p = pod(&format!("p{i}"), "4", Some("40"));
            match c.reserve(&p, "a", TS.into()) {
                Ok(r) => placed.push((p, r)),
                Err(e) => assert!(
                    e.to_string().contains("too few GPUs") || e.to_string().contains("GPU"),
                    "{e}"
                ),
            }
        }
        // 2 GPUs × min(15 GiB / 4, 100 % / 40 %) = 2 × 2.
        assert_eq!(placed.len(), 4);
        for g in &c.usage()[0].1 {
            assert!(
                g.memory_allocated_mib <= g.memory_mib && g.core_allocated_milli <= 1000,
                "{g:?}"
            );
        }
        // Restart: a new cache rebuilt from the bound pods' annotations holds the same.
        let mut d = cluster("binpack");
        d.set_node(&node("a", 2, "core_mem", "binpack"));
        for (p, r) in &placed {
            d.observe_pod(&bound(p.clone(), "a", &r.assignment));
        }
        assert_eq!(c.usage(), d.usage());
        assert!(
            d.reserve(&pod("late", "4", Some("40")), "a", TS.into())
                .is_err()
        );
        // A pod finishing gives its share back.
        let (p, r) = &placed[0];
        let mut done = bound(p.clone(), "a", &r.assignment);
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        d.observe_pod(&done);
        assert!(
            d.reserve(&pod("late", "4", Some("40")), "a", TS.into())
                .is_ok()
        );
        // Assumed allocations expire when never seen bound.
        let mut e = Cluster::new(
            "binpack",
            ResourceNames::default(),
            Duration::from_millis(0),
        );
        e.set_node(&node("a", 1, "core_mem", "binpack"));
        e.reserve(&pod("x", "15", Some("100")), "a", TS.into())
            .unwrap();
        assert!(
            e.reserve(&pod("y", "1", Some("5")), "a", TS.into())
                .is_err()
        );
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(e.expire_assumed(Instant::now()), ["default/x"]);
        assert!(e.reserve(&pod("y", "1", Some("5")), "a", TS.into()).is_ok());
    }

    #[test]
    fn node_changes_keep_allocations() {
        let mut c = cluster("gpushare");
        c.set_node(&node("a", 2, "core_mem", "binpack"));
        c.reserve(&pod("p", "8", Some("50")), "a", TS.into())
            .unwrap();
        // A second node joins: the engine is rebuilt with the allocation re-applied.
        c.set_node(&node("b", 2, "core_mem", "spread"));
        let a = c.usage().into_iter().find(|(n, _)| n == "a").unwrap();
        assert_eq!(
            a.1[0].memory_allocated_mib + a.1[1].memory_allocated_mib,
            8192
        );
        let pr = c.prioritize(&pod("q", "2", Some("10")), &names(&["a", "b"]));
        assert_eq!(pr.len(), 2);
        assert!(pr.iter().all(|h| (0..=MAX_SCORE).contains(&h.score)));
        assert!(pr.iter().any(|h| h.score == MAX_SCORE));
        // A node listed after a watch restart (deferred) is usable at once: decisions flush.
        c.set_node_deferred(&node("c", 1, "core_mem", "binpack"));
        let r = c.filter(&pod("q", "2", Some("10")), &names(&["c"]));
        assert_eq!(r.node_names.as_deref(), Some(&names(&["c"])[..]), "{r:?}");
        c.set_node_deferred(&node("d", 1, "core_mem", "binpack"));
        assert_eq!(
            c.reserve(&pod("r", "2", Some("10")), "d", TS.into())
                .unwrap()
                .allocation
                .gpus,
            [0]
        );
        // Relabelling to cgpu: the node no longer takes core pods.
        c.set_node(&node("a", 2, "cgpu", "binpack"));
        let r = c.filter(&pod("q", "2", Some("10")), &names(&["a"]));
        assert!(r.failed_and_unresolvable_nodes.contains_key("a"));
    }

    /// A pod with a GPU init container holds the larger of the init and the app shares, at
    /// placement and after a restart alike (the annotation is read with the pod's spec).
    #[test]
    fn init_containers_rebuild_to_what_was_placed() {
        let with_init = |name: &str| {
            let mut p = pod(name, "2", Some("30"));
            let mut init = p.spec.as_ref().unwrap().containers[0].clone();
            init.name = "prep".into();
            init.resources = Some(ResourceRequirements {
                limits: Some(
                    [
                        ("aliyun.com/gpu-mem".to_string(), Quantity("4".into())),
                        (
                            "aliyun.com/gpu-core.percentage".to_string(),
                            Quantity("50".into()),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            });
            p.spec.as_mut().unwrap().init_containers = Some(vec![init]);
            p
        };
        let mut c = cluster("binpack");
        c.set_node(&node("a", 1, "core_mem", "binpack"));
        let p = with_init("p");
        let r = c.reserve(&p, "a", TS.into()).unwrap();
        assert_eq!(
            r.assignment.containers.keys().collect::<Vec<_>>(),
            ["main", "prep"]
        );
        let held = GpuUsage {
            memory_allocated_mib: 4096,
            memory_mib: 15360,
            core_allocated_milli: 500,
            pods: 1,
        };
        assert_eq!(c.usage()[0].1, [held]);
        let mut d = cluster("binpack");
        d.set_node(&node("a", 1, "core_mem", "binpack"));
        d.observe_pod(&bound(p.clone(), "a", &r.assignment));
        assert_eq!(d.usage(), c.usage());
        // What is left is what the max leaves (the sum, 6 GiB and 80 %, would leave less).
        assert!(
            d.reserve(&pod("q", "11", Some("50")), "a", TS.into())
                .is_ok()
        );
    }

    /// Hardening item 8: a node publishing more than 64 GPUs used to panic the node watch
    /// (the engine's GPU sets are 64-bit masks); it is now a node gpushare cannot place on,
    /// with the reason.
    #[test]
    fn a_node_with_65_gpus_is_refused_not_a_panic() {
        let mut c = cluster("gpushare");
        c.set_node(&node("big", 65, "core_mem", "binpack"));
        c.set_node(&node("a", 64, "core_mem", "binpack"));
        let r = c.filter(&pod("p", "2", Some("30")), &names(&["big", "a"]));
        assert_eq!(r.node_names.as_deref(), Some(&names(&["a"])[..]));
        assert_eq!(
            r.failed_and_unresolvable_nodes["big"],
            "node big: node annotation gpushare.io/gpus lists 65 GPUs, at most 64 are supported"
        );
    }

    /// Found by fuzzing the extender: a pod (from a request body) whose container names are
    /// 64 KiB each got an assignment the node refuses as too large; reserve now refuses it
    /// and holds nothing.
    #[test]
    fn an_assignment_the_node_cannot_read_is_not_reserved() {
        let mut c = cluster("gpushare");
        c.set_node(&node("a", 1, "core_mem", "binpack"));
        let mut p = pod("p", "2", Some("30"));
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].name = "\0".repeat(64 << 10);
        let e = c.reserve(&p, "a", TS.into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod default/p: its gpushare.io/assignment would be 393353 bytes, more than the 262144 bytes an annotation may take"
        );
        assert_eq!(c.usage()[0].1[0].memory_allocated_mib, 0);
        assert_eq!(c.allocations().count(), 0);
    }

    /// Prioritize reads the node ids filter passed for the same pod: its answer is what a
    /// prioritize alone answers, for the list filter passed, for any other list, and after the
    /// cluster changed in between.
    #[test]
    fn filter_best_answers_the_nodes_prioritize_ranks_first() {
        let mk = |best| {
            let mut c = cluster("gpushare");
            c.set_filter_best(best);
            c.set_node(&node("a", 2, "core_mem", "binpack"));
            c.set_node(&node("b", 2, "core_mem", "spread"));
            c.set_node(&node("c", 4, "core_mem", "binpack"));
            c.reserve(&pod("x", "8", Some("50")), "a", TS.into())
                .unwrap();
            c
        };
        let q = pod("q", "2", Some("10"));
        let all = names(&["c", "a", "b", "zz"]);
        let ranked = mk(0).prioritize(&q, &names(&["c", "a", "b"]));
        let top = ranked.iter().map(|h| h.score).max().unwrap();
        assert!(ranked.iter().any(|h| h.score < top), "{ranked:?}");
        let one = mk(1).filter(&q, &all);
        let best = one.node_names.unwrap();
        assert_eq!(best.len(), 1, "{best:?}");
        assert!(
            ranked.iter().any(|h| h.host == best[0] && h.score == top),
            "{best:?} {ranked:?}"
        );
        // The unknown node is still refused with its reason; the others are simply not
        // offered (kube-scheduler takes a node the answer leaves out as filtered away).
        assert!(one.failed_nodes.contains_key("zz"));
        // More than fit: every fitting node.
        let three = mk(5).filter(&q, &all).node_names.unwrap();
        assert_eq!(three, names(&["c", "a", "b"]));
        // A pod without GPUs: the best of the names, a node that is not gpushare's first.
        let mut plain = pod("plain", "1", None);
        plain.spec.as_mut().unwrap().containers[0].resources = None;
        let p = mk(1).filter(&plain, &names(&["a", "other"]));
        assert_eq!(p.node_names.unwrap(), names(&["other"]));
        // Among equal nodes, the first by name, whatever kube-scheduler's order.
        let mut twins = cluster("gpushare");
        twins.set_filter_best(1);
        for n in ["n1", "n2", "n0"] {
            twins.set_node(&node(n, 2, "core_mem", "binpack"));
        }
        let p = twins.filter(&plain, &names(&["n2", "n0", "n1"]));
        assert_eq!(p.node_names.unwrap(), names(&["n0"]));
        let p = twins.filter(&q, &names(&["n2", "n1", "n0"]));
        assert_eq!(p.node_names.unwrap(), names(&["n0"]));
    }

    #[test]
    fn prioritize_after_filter_matches_prioritize_alone() {
        let mk = || {
            let mut c = cluster("gpushare");
            c.set_node(&node("a", 2, "core_mem", "binpack"));
            c.set_node(&node("b", 2, "core_mem", "spread"));
            c.set_node(&node("c", 4, "core_mem", "binpack"));
            c.reserve(&pod("x", "8", Some("50")), "a", TS.into())
                .unwrap();
            c
        };
        let (mut c, mut d) = (mk(), mk());
        let q = pod("q", "2", Some("10"));
        let all = names(&["c", "a", "b", "zz"]);
        let passed = c.filter(&q, &all).node_names.unwrap();
        assert_eq!(passed, names(&["c", "a", "b"]));
        let want = d.prioritize(&q, &passed);
        assert_eq!(c.prioritize(&q, &passed), want);
        assert!(want.iter().any(|h| h.score != want[0].score), "{want:?}");
        for other in [
            names(&["b", "a", "c"]),
            names(&["c", "a"]),
            names(&["c", "a", "zz"]),
        ] {
            assert_eq!(c.prioritize(&q, &other), d.prioritize(&q, &other));
        }
        // A reservation between filter and prioritize.
        c.filter(&q, &all);
        for e in [&mut c, &mut d] {
            e.reserve(&pod("y", "14", Some("90")), "c", TS.into())
                .unwrap();
        }
        assert_eq!(c.prioritize(&q, &passed), d.prioritize(&q, &passed));
        // A node added: the engine is rebuilt and its node ids change.
        c.filter(&q, &all);
        for e in [&mut c, &mut d] {
            e.set_node(&node("0", 1, "core_mem", "binpack"));
        }
        assert_eq!(c.prioritize(&q, &passed), d.prioritize(&q, &passed));
        // Another pod's filter does not answer for this one.
        c.filter(&pod("r", "1", Some("5")), &names(&["a", "b", "c"]));
        assert_eq!(c.prioritize(&q, &passed), d.prioritize(&q, &passed));
    }

    /// Hardening item 1: node names from a filter request are shown cut.
    #[test]
    fn unknown_node_names_are_echoed_cut() {
        let mut c = cluster("gpushare");
        c.set_node(&node("a", 1, "core_mem", "binpack"));
        let big = "n".repeat(1 << 20);
        let r = c.filter(&pod("p", "2", Some("30")), std::slice::from_ref(&big));
        let msg = &r.failed_nodes[&big];
        assert!(
            msg.len() < 150 && msg.contains("(1048576 bytes)"),
            "{}",
            &msg[..150]
        );
    }
}
