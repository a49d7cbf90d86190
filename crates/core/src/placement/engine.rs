//! The placement engine: the cluster's per-node state, a policy, and the decision loop
//! (feasibility, then the policy's score, highest wins, ties to the earlier node in the tie
//! order). Deciding reads only; committing updates the one node that changed and tells the
//! policy, so no decision rescans or rebuilds cluster-wide state.

use std::collections::HashMap;

use super::model::{GpuDemand, GpuPlacement, GpuSpec, NodeSpec, Request, ScheduleMode};
use super::policy::{Choice, PlacementPolicy};
use super::reject::{KINDS, Reject, Unschedulable, Why};
use super::state::{GpuSet, GpuState, NodeState, by_free};

/// Where a pod goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Node id (index into [`Engine::nodes`]).
    pub node: usize,
    pub gpus: GpuSet,
}

/// One GPU a placed pod got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedGpu {
    pub index: u32,
    pub memory_mib: u64,
    /// Per-mille of the GPU; `None` for memory-only shares.
    pub core_milli: Option<u32>,
    /// The whole GPU.
    pub whole: bool,
}

impl Placement {
    /// What each GPU gives the pod (for the assignment annotation).
    pub fn grants(&self, node: &NodeState, req: &Request) -> Vec<PlacedGpu> {
        self.gpus
            .iter()
            .map(|i| match req.gpu {
                GpuDemand::Shared {
                    memory_mib,
                    core_milli,
                    ..
                } => PlacedGpu {
                    index: i as u32,
                    memory_mib,
                    core_milli,
                    whole: false,
                },
                _ => PlacedGpu {
                    index: i as u32,
                    memory_mib: node.gpus[i].memory_mib,
                    core_milli: Some(1000),
                    whole: true,
                },
            })
            .collect()
    }
}

pub struct Engine {
    nodes: Vec<NodeState>,
    /// Bumped whenever the node changes; cached scores of older versions are stale.
    versions: Vec<u32>,
    /// Node ids in tie-break order.
    order: Vec<usize>,
    /// Each node id's place in `order`.
    rank: Vec<usize>,
    by_name: HashMap<String, usize, BuildNameHasher>,
    policy: Box<dyn PlacementPolicy>,
    cache: ScoreCache,
    /// Threads [`Scorer::prepare`] may score on (1: the caller's only), and the fewest nodes
    /// to score that are worth a thread.
    threads: usize,
    nodes_per_thread: usize,
}

/// Default of [`Engine::set_nodes_per_thread`].
const PARALLEL_MIN_NODES: usize = 512;

/// The hash of the node-name index: FxHash (rustc's), several times faster than the default
/// SipHash on names of a few dozen bytes, and a filter looks up every candidate. The keys are
/// the cluster's own node names; a looked-up name only reads the table.
#[derive(Debug, Clone, Copy, Default)]
struct NameHasher(u64);

impl NameHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type BuildNameHasher = std::hash::BuildHasherDefault<NameHasher>;

/// What identifies a request for the policies: equal keys get equal scores on a node (the
/// score cache keeps one slot per key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestKey {
    cpu_milli: u64,
    memory_mib: u64,
    gpu: GpuDemand,
    models: Vec<String>,
}

impl RequestKey {
    pub fn of(r: &Request) -> Self {
        RequestKey {
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            gpu: r.gpu,
            models: r.models.clone(),
        }
    }
}

/// A node's cached score for one request key; `version` 0: none.
#[derive(Debug, Clone, Copy, Default)]
struct Cached {
    version: u32,
    /// `None`: the request did not fit.
    choice: Option<Choice>,
}

/// Per request key, each node's last score: a decision re-scores only the nodes that changed
/// since the last request with the same key.
#[derive(Debug, Default)]
struct ScoreCache {
    keys: HashMap<RequestKey, usize>,
    slots: Vec<(u64, Vec<Cached>)>,
    clock: u64,
}

/// Request keys whose scores are kept (least recently used ones give way).
const CACHED_KEYS: usize = 256;

impl ScoreCache {
    /// The slot of `req`'s key, made (or recycled) if new.
    fn slot(&mut self, req: &Request, nodes: usize) -> usize {
        self.clock += 1;
        let key = RequestKey::of(req);
        if let Some(&s) = self.keys.get(&key) {
            self.slots[s].0 = self.clock;
            return s;
        }
        let s = if self.slots.len() < CACHED_KEYS {
            self.slots
                .push((self.clock, vec![Cached::default(); nodes]));
            self.slots.len() - 1
        } else {
            let s = (0..self.slots.len())
                .min_by_key(|&s| self.slots[s].0)
                .expect("slots");
            self.keys.retain(|_, v| *v != s);
            self.slots[s].0 = self.clock;
            self.slots[s]
                .1
                .iter_mut()
                .for_each(|c| *c = Cached::default());
            s
        };
        self.keys.insert(key, s);
        s
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("nodes", &self.nodes.len())
            .field("policy", &self.policy.name())
            .finish()
    }
}

impl Engine {
    /// An empty cluster of `nodes`; ties go to the node listed first.
    pub fn new(nodes: Vec<NodeSpec>, mut policy: Box<dyn PlacementPolicy>) -> Self {
        let nodes: Vec<NodeState> = nodes.into_iter().map(NodeState::new).collect();
        policy.init(&nodes);
        Engine {
            versions: vec![1; nodes.len()],
            cache: ScoreCache::default(),
            order: (0..nodes.len()).collect(),
            rank: (0..nodes.len()).collect(),
            by_name: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.spec.name.clone(), i))
                .collect(),
            nodes,
            policy,
            threads: 1,
            nodes_per_thread: PARALLEL_MIN_NODES,
        }
    }

    /// Lets [`Scorer::prepare`] score on up to `threads` threads (the scheduler's filter, for
    /// a request shape whose scores are stale on many nodes). Decisions are the same on any
    /// number of threads; `gpushare simulate` stays on one, so its decision times are one
    /// core's.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// The fewest distinct nodes to score that are worth another thread (default 512; a
    /// thread costs tens of microseconds to start, a node a microsecond or two to score).
    pub fn set_nodes_per_thread(&mut self, nodes: usize) {
        self.nodes_per_thread = nodes.max(1);
    }

    /// Sets the tie-break order: `order` lists every node id once, preferred first.
    pub fn set_tie_order(&mut self, order: Vec<usize>) {
        assert_eq!(
            order.len(),
            self.nodes.len(),
            "tie order must list every node"
        );
        for (place, &id) in order.iter().enumerate() {
            self.rank[id] = place;
        }
        self.order = order;
    }

    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    pub fn node_id(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Whether `req` fits on node `id` now, and if not, why.
    pub fn check(&self, id: usize, req: &Request) -> Result<GpuSet, Reject> {
        let node = &self.nodes[id];
        node.check(req).map_err(|why| self.reject(id, req, why))
    }

    /// Node `id`'s score for `req` and the GPUs it would take there (the policy's choice, or
    /// the node's `ack.node.gpu.placement`), or why it does not fit. Read only.
    pub fn evaluate(&self, id: usize, req: &Request) -> Result<Choice, Reject> {
        let node = &self.nodes[id];
        node.check(req).map_err(|why| self.reject(id, req, why))?;
        let c = score(node, id, req, self.policy.as_ref());
        Ok(self.live(id, req, c).expect("the pod fits on the node"))
    }

    /// A cached (or freshly computed) score with the policy's uncached term added
    /// ([`PlacementPolicy::live`]): what every decision compares.
    fn live(&self, id: usize, req: &Request, c: Option<Choice>) -> Option<Choice> {
        c.map(|c| Choice {
            score: c.score + self.policy.live(id, req),
            gpus: c.gpus,
        })
    }

    fn reject(&self, id: usize, req: &Request, why: Why) -> Reject {
        let node = &self.nodes[id];
        Reject {
            node: node.spec.name.clone(),
            mode: node.mode(),
            model: node.spec.model().to_string(),
            allowed: req.models.clone(),
            why,
        }
    }

    /// The best node and GPUs for `req`, without placing it. Only nodes that changed since a
    /// request of the same shape was last decided are scored again.
    pub fn decide(&mut self, req: &Request) -> Result<Placement, Unschedulable> {
        let slot = self.refresh(req);
        let cached = &self.cache.slots[slot].1;
        self.pick(req, |id| cached[id].choice)
    }

    /// [`Engine::decide`] as behind kube-scheduler's node search: from node id `*start` on
    /// (wrapping), the first `window` nodes that pass kube-scheduler's own filter
    /// ([`NodeState::fits_in_total`]) are the candidates, and the best of those where the pod
    /// fits is chosen (ties: the earlier in the tie order); `*start` then moves past the
    /// nodes looked at, as kube-scheduler's next search starts where this one stopped.
    pub fn decide_within(
        &mut self,
        req: &Request,
        window: usize,
        start: &mut usize,
    ) -> Result<Placement, Unschedulable> {
        let n = self.nodes.len();
        if n == 0 {
            return Err(self.unschedulable(req));
        }
        let (mut found, mut looked) = (0usize, 0usize);
        let mut best: Option<(Choice, usize)> = None;
        let mut scorer = self.scorer(req);
        while looked < n && found < window.max(1) {
            let id = (*start + looked) % n;
            looked += 1;
            if !scorer.engine().nodes[id].fits_in_total(req) {
                continue;
            }
            found += 1;
            if let Some(c) = scorer.choice(id) {
                let rank = &scorer.engine().rank;
                if best.is_none_or(|(b, bid)| {
                    c.score > b.score || (c.score == b.score && rank[id] < rank[bid])
                }) {
                    best = Some((c, id));
                }
            }
        }
        *start = (*start + looked) % n;
        self.placed_or_why(req, best)
    }

    /// Every node's score for `req` (`None`: it does not fit), indexed by node id, through the
    /// same score cache as [`Engine::decide`].
    pub fn scores(&mut self, req: &Request) -> Vec<Option<Choice>> {
        let slot = self.refresh(req);
        let cached = &self.cache.slots[slot].1;
        (0..cached.len())
            .map(|id| self.live(id, req, cached[id].choice))
            .collect()
    }

    /// A view of the score cache for `req`'s shape that scores nodes one at a time, on
    /// demand: only the nodes asked for (and changed since their cached score) are scored
    /// again. [`Scorer::choice`] is what [`Engine::scores`] has at that node id.
    pub fn scorer<'a>(&'a mut self, req: &'a Request) -> Scorer<'a> {
        let slot = self.cache.slot(req, self.nodes.len());
        Scorer {
            engine: self,
            slot,
            req,
        }
    }

    /// How many nodes' cached scores for `req`'s shape are missing or stale (read only).
    pub fn stale_nodes(&self, req: &Request) -> usize {
        match self.cache.keys.get(&RequestKey::of(req)) {
            Some(&slot) => self.cache.slots[slot]
                .1
                .iter()
                .zip(&self.versions)
                .filter(|(c, v)| c.version != **v)
                .count(),
            None => self.nodes.len(),
        }
    }

    /// What [`Engine::decide`] returns, computed from scratch without the score cache (read
    /// only; slower).
    pub fn decide_fresh(&self, req: &Request) -> Result<Placement, Unschedulable> {
        self.pick(req, |id| {
            score(&self.nodes[id], id, req, self.policy.as_ref())
        })
    }

    /// The cache slot of `req`'s shape, with every node changed since its last use scored
    /// again.
    fn refresh(&mut self, req: &Request) -> usize {
        let n = self.nodes.len();
        let mut scorer = self.scorer(req);
        scorer.prepare(0..n);
        scorer.slot
    }

    /// The highest-scoring node (ties: the earlier in the tie order).
    fn pick(
        &self,
        req: &Request,
        choice: impl Fn(usize) -> Option<Choice>,
    ) -> Result<Placement, Unschedulable> {
        let mut best: Option<(Choice, usize)> = None;
        for &id in &self.order {
            if let Some(c) = self.live(id, req, choice(id))
                && best.is_none_or(|(b, _)| c.score > b.score)
            {
                best = Some((c, id));
            }
        }
        self.placed_or_why(req, best)
    }

    /// The chosen node's placement, or why none takes `req`.
    fn placed_or_why(
        &self,
        req: &Request,
        best: Option<(Choice, usize)>,
    ) -> Result<Placement, Unschedulable> {
        match best {
            Some((c, id)) => Ok(Placement {
                node: id,
                gpus: c.gpus,
            }),
            None => Err(self.unschedulable(req)),
        }
    }

    /// Why no node takes `req`: each node's reason, counted, with the first of each kind.
    fn unschedulable(&self, req: &Request) -> Unschedulable {
        let mut counts = [0usize; KINDS.len()];
        let mut first: [Option<(usize, Why)>; KINDS.len()] = [None; KINDS.len()];
        for &id in &self.order {
            if let Err(why) = self.nodes[id].check(req) {
                let k = why.kind();
                counts[k] += 1;
                first[k].get_or_insert((id, why));
            }
        }
        Unschedulable {
            pod: req.name.clone(),
            nodes: self.nodes.len(),
            counts: (0..KINDS.len())
                .filter(|&k| counts[k] > 0)
                .map(|k| (KINDS[k], counts[k]))
                .collect(),
            examples: first
                .iter()
                .flatten()
                .map(|&(id, why)| self.reject(id, req, why))
                .collect(),
        }
    }

    /// Places `req` as decided (the placement must come from [`Engine::decide`] on the
    /// current state).
    pub fn commit(&mut self, req: &Request, p: Placement) {
        let node = &mut self.nodes[p.node];
        node.take(req, p.gpus);
        self.versions[p.node] = self.versions[p.node].wrapping_add(1).max(1);
        self.policy.node_changed(p.node, node);
    }

    /// Decides and commits.
    pub fn place(&mut self, req: &Request) -> Result<Placement, Unschedulable> {
        let p = self.decide(req)?;
        self.commit(req, p);
        Ok(p)
    }

    /// A placed pod left.
    pub fn release(&mut self, req: &Request, p: Placement) {
        let node = &mut self.nodes[p.node];
        node.give_back(req, p.gpus);
        self.versions[p.node] = self.versions[p.node].wrapping_add(1).max(1);
        self.policy.node_changed(p.node, node);
    }
}

/// The score cache of one request shape, filled on demand ([`Engine::scorer`]).
pub struct Scorer<'a> {
    engine: &'a mut Engine,
    slot: usize,
    req: &'a Request,
}

impl Scorer<'_> {
    /// Node `id`'s score for the request (`None`: it does not fit), from the cache when the
    /// node has not changed since it was scored.
    pub fn choice(&mut self, id: usize) -> Option<Choice> {
        let e = &mut *self.engine;
        let version = e.versions[id];
        let entry = &mut e.cache.slots[self.slot].1[id];
        if entry.version != version {
            *entry = Cached {
                version,
                choice: score(&e.nodes[id], id, self.req, e.policy.as_ref()),
            };
        }
        let c = entry.choice;
        e.live(id, self.req, c)
    }

    pub fn engine(&self) -> &Engine {
        self.engine
    }

    /// Scores the nodes `ids` whose cached score is stale, on up to [`Engine::set_threads`]
    /// threads when there are many, so that [`Scorer::choice`] then reads them from the
    /// cache. Unknown ids are skipped; what each node scores is what [`Scorer::choice`]
    /// would compute.
    pub fn prepare(&mut self, ids: impl IntoIterator<Item = usize>) {
        let e = &mut *self.engine;
        let n = e.nodes.len();
        let cached = &e.cache.slots[self.slot].1;
        let stale: Vec<usize> = ids
            .into_iter()
            .filter(|&id| id < n && cached[id].version != e.versions[id])
            .collect();
        let threads = (e.threads, e.nodes_per_thread);
        let scored = score_many(&e.nodes, &stale, self.req, e.policy.as_ref(), threads);
        let entries = &mut e.cache.slots[self.slot].1;
        for (&id, choice) in stale.iter().zip(scored) {
            entries[id] = Cached {
                version: e.versions[id],
                choice,
            };
        }
    }
}

/// Below this many nodes to score, [`score_many`] scores each: looking for equal nodes costs
/// a hash of each node's state, a tenth of scoring one.
const DEDUP_MIN_NODES: usize = 32;

/// A node as scoring sees it: its state and spec but not its name. Policies score nodes
/// equal in this alike ([`PlacementPolicy::score`] depends on the node's spec and state,
/// not its name or id, beyond the order of ties).
struct Unnamed<'a>(&'a NodeState);

/// What [`Unnamed`] compares and hashes: the node's free resources and pod count, and its
/// spec but for the name.
type UnnamedKey<'a> = (
    (u64, u64, u32, &'a [GpuState]),
    (u64, u64, &'a [GpuSpec], ScheduleMode, Option<GpuPlacement>),
);

impl Unnamed<'_> {
    fn key(&self) -> UnnamedKey<'_> {
        let (n, s) = (self.0, &self.0.spec);
        (
            (n.cpu_free, n.memory_free, n.pods, &n.gpus),
            (s.cpu_milli, s.memory_mib, &s.gpus, s.mode, s.placement),
        )
    }
}

impl std::hash::Hash for Unnamed<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

impl PartialEq for Unnamed<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Unnamed<'_> {}

/// The scores of nodes `ids` for `req`, in order: each distinct node (equal but for the name,
/// [`Unnamed`]) scored once, on up to `threads.0` threads, one per `threads.1` nodes to score.
/// Idle nodes of one kind, or nodes filled alike, are common in a large cluster.
fn score_many(
    nodes: &[NodeState],
    ids: &[usize],
    req: &Request,
    policy: &dyn PlacementPolicy,
    (threads, per_thread): (usize, usize),
) -> Vec<Option<Choice>> {
    let run = |ids: &[usize]| -> Vec<Option<Choice>> {
        ids.iter()
            .map(|&id| score(&nodes[id], id, req, policy))
            .collect()
    };
    if ids.len() < DEDUP_MIN_NODES {
        return run(ids);
    }
    let mut first: HashMap<Unnamed<'_>, usize, BuildNameHasher> =
        HashMap::with_capacity_and_hasher(ids.len(), Default::default());
    let mut distinct: Vec<usize> = Vec::new();
    let which: Vec<usize> = ids
        .iter()
        .map(|&id| {
            *first.entry(Unnamed(&nodes[id])).or_insert_with(|| {
                distinct.push(id);
                distinct.len() - 1
            })
        })
        .collect();
    let threads = threads.min(distinct.len() / per_thread).max(1);
    let scored: Vec<Option<Choice>> = if threads == 1 {
        run(&distinct)
    } else {
        let mut chunks = distinct.chunks(distinct.len().div_ceil(threads));
        let mine = chunks.next().unwrap_or_default();
        std::thread::scope(|scope| {
            // The caller scores the first chunk while the other threads score the rest.
            let others: Vec<_> = chunks.map(|ids| scope.spawn(move || run(ids))).collect();
            let mut all = run(mine);
            for h in others {
                all.extend(h.join().expect("a scoring thread panicked"));
            }
            all
        })
    };
    which.into_iter().map(|i| scored[i]).collect()
}

/// Node `id`'s score for `req` (`None`: it does not fit).
fn score(
    node: &NodeState,
    id: usize,
    req: &Request,
    policy: &dyn PlacementPolicy,
) -> Option<Choice> {
    let mut fit = node.check(req).ok()?;
    // The node's ack.node.gpu.placement label picks the GPUs itself.
    if let (Some(p), GpuDemand::Shared { count, .. }) = (node.spec.placement, req.gpu) {
        fit = by_free(node, fit, count, p == GpuPlacement::Binpack);
    }
    Some(policy.score(id, node, req, fit))
}
