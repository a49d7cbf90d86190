//! One replay of a trace under one policy and seed, by the method of `bench/PACKING.md`:
//! pods sorted by name and shuffled, then drawn with replacement until the GPU demand would
//! pass the load limit; each pod placed once (a pod that fits nowhere fails, pods never
//! leave); after every attempt the allocated share of GPU capacity is recorded against the
//! arrived demand, binned by whole percent.

use std::time::Instant;

use super::rng::Rng;
use super::trace::TracePod;
use gpushare_core::placement::{
    Engine, GpuDemand, NodeSpec, NodeState, Placement, Request, ShapeLearner, UnknownPolicy,
    Workload, by_name,
};

/// A trace ready to replay.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: String,
    pub nodes: Vec<NodeSpec>,
    /// Sorted by name.
    pub pods: Vec<TracePod>,
    /// `pods[i].request()`.
    pub requests: Vec<Request>,
    /// Typical pod shapes of the original list.
    pub workload: Workload,
    /// GPU capacity in milli.
    pub capacity: u64,
}

impl Trace {
    /// `coverage`: share of the pods the typical shapes must cover (the reference uses 0.95).
    pub fn new(name: &str, nodes: Vec<NodeSpec>, mut pods: Vec<TracePod>, coverage: f64) -> Self {
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        let requests: Vec<Request> = pods.iter().map(TracePod::request).collect();
        let workload = Workload::from_requests(&requests, coverage);
        let capacity = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
        Trace {
            name: name.to_string(),
            nodes,
            pods,
            requests,
            workload,
            capacity,
        }
    }

    pub fn gpus(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }

    /// The arrival sequence for `seed` (indices into `pods`): all pods shuffled, then pods
    /// drawn uniformly with replacement while the total GPU demand stays within
    /// `max_load_pct` % of capacity; the first draw that would pass it is dropped and ends
    /// the sequence.
    pub fn arrivals(&self, seed: u64, max_load_pct: u32) -> Vec<usize> {
        let mut rng = Rng::new(seed, 0);
        let mut seq: Vec<usize> = (0..self.pods.len()).collect();
        rng.shuffle(&mut seq);
        let limit = self.capacity as u128 * max_load_pct as u128;
        let mut total: u128 = self.pods.iter().map(|p| p.gpu_demand() as u128 * 100).sum();
        if self.pods.is_empty() || self.pods.iter().all(|p| p.gpu_demand() == 0) {
            return seq;
        }
        while total < limit {
            let i = rng.below(self.pods.len() as u64) as usize;
            let d = self.pods[i].gpu_demand() as u128 * 100;
            if total + d > limit {
                break;
            }
            total += d;
            seq.push(i);
        }
        seq
    }

    /// A random node order for ties.
    pub fn tie_order(&self, seed: u64) -> Vec<usize> {
        Rng::new(seed, 1).permutation(self.nodes.len())
    }
}

/// The outcome of one replay.
#[derive(Debug, Clone)]
pub struct Run {
    pub policy: String,
    pub seed: u64,
    /// Index: arrived load in whole percent of capacity; value: mean allocated % of capacity
    /// over the attempts in that bin (`None`: no attempt landed there).
    pub allocated_pct: Vec<Option<f64>>,
    /// Nanoseconds per decision (decide + commit), one per attempt.
    pub decision_ns: Vec<u64>,
    pub attempts: usize,
    pub failed: usize,
    /// The node states at the load asked of [`replay_with_state`], and the pods that failed
    /// until then.
    pub state: Option<StateAt>,
}

/// What a replay looked like once every pod arriving within `state_at` % had been tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateAt {
    /// [`state_csv`].
    pub nodes: String,
    /// [`failed_csv`] of the pods that failed until then, in arrival order.
    pub failed: String,
}

impl Run {
    /// Unallocated GPU % at `load_pct` arrived load.
    pub fn unallocated_at(&self, load_pct: usize) -> Option<f64> {
        self.allocated_pct
            .get(load_pct)
            .copied()
            .flatten()
            .map(|a| 100.0 - a)
    }
}

/// How a replay runs beyond its trace, policy, seed and load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Keep the node states ([`state_csv`]) once every pod that arrives within this % of
    /// capacity has been tried (at the end if the replay stops below it).
    pub state_at: Option<u32>,
    /// Decide as behind kube-scheduler's node search ([`Engine::decide_within`]): the best of
    /// the first this many nodes that pass kube-scheduler's own filter, from where the last
    /// search stopped. `None`: the best of every node.
    pub search_nodes: Option<usize>,
    /// The typical shapes learned from the GPU pods placed so far, as the scheduler extender
    /// learns them ([`ShapeLearner`]: none at first), instead of the whole trace's.
    pub learn_shapes: bool,
    /// Ties to the node first by name (the extender's) instead of the seed's random order.
    pub ties_by_name: bool,
}

impl ReplayOptions {
    /// Deciding as the scheduler extender does (`simulate --as-extender`).
    pub fn as_extender(&self) -> bool {
        self.learn_shapes && self.ties_by_name
    }
}

/// Replays `trace` with `policy` for `seed`, up to `max_load_pct` % arrived load.
pub fn replay(
    trace: &Trace,
    policy: &str,
    seed: u64,
    max_load_pct: u32,
) -> Result<Run, UnknownPolicy> {
    replay_with(trace, policy, seed, max_load_pct, &ReplayOptions::default())
}

/// [`replay`], also keeping the node states ([`state_csv`]) once every pod that arrives
/// within `state_at` % of capacity has been tried (at the end if the replay stops below it).
pub fn replay_with_state(
    trace: &Trace,
    policy: &str,
    seed: u64,
    max_load_pct: u32,
    state_at: Option<u32>,
) -> Result<Run, UnknownPolicy> {
    let opts = ReplayOptions {
        state_at,
        ..ReplayOptions::default()
    };
    replay_with(trace, policy, seed, max_load_pct, &opts)
}

/// [`replay`] with `opts`.
pub fn replay_with(
    trace: &Trace,
    policy: &str,
    seed: u64,
    max_load_pct: u32,
    opts: &ReplayOptions,
) -> Result<Run, UnknownPolicy> {
    let state_at = opts.state_at;
    let mut search_start = 0usize;
    let tie_order = if opts.ties_by_name {
        let mut order: Vec<usize> = (0..trace.nodes.len()).collect();
        order.sort_by(|&a, &b| trace.nodes[a].name.cmp(&trace.nodes[b].name));
        order
    } else {
        trace.tie_order(seed)
    };
    // The engine for `workload`'s typical shapes, empty.
    let engine_for = |workload: &Workload| -> Result<Engine, UnknownPolicy> {
        let mut engine = Engine::new(trace.nodes.clone(), by_name(policy, workload)?);
        engine.set_tie_order(tie_order.clone());
        Ok(engine)
    };
    let mut learner = opts.learn_shapes.then(ShapeLearner::default);
    let mut engine = match &learner {
        Some(l) => engine_for(&l.workload())?,
        None => engine_for(&trace.workload)?,
    };
    // What the engine holds, to commit again when the learned shapes rebuild it.
    let mut placed: Vec<(usize, Placement)> = Vec::new();
    let seq = trace.arrivals(seed, max_load_pct);
    let cap = trace.capacity as f64;
    let mut sums = vec![(0.0f64, 0u32); max_load_pct as usize + 2];
    let mut decision_ns = Vec::with_capacity(seq.len());
    let (mut arrived, mut allocated, mut failed) = (0u64, 0u64, 0usize);
    let state_limit = state_at.map(|l| trace.capacity as u128 * l as u128);
    let mut state = None;
    let mut failed_pods: Vec<usize> = Vec::new();
    for &i in &seq {
        let req = &trace.requests[i];
        let d = trace.pods[i].gpu_demand();
        if let Some(limit) = state_limit
            && state.is_none()
            && (arrived + d) as u128 * 100 > limit
        {
            state = Some(StateAt {
                nodes: state_csv(engine.nodes()),
                failed: failed_csv(trace, &failed_pods),
            });
        }
        let t = Instant::now();
        let decided = match opts.search_nodes {
            None => engine.decide(req),
            Some(window) => engine.decide_within(req, window, &mut search_start),
        };
        let ok = decided.is_ok();
        if let Ok(p) = decided {
            engine.commit(req, p);
            if let Some(l) = learner.as_mut() {
                placed.push((i, p));
                // The extender learns from the GPU pods it reserves, and rebuilds its engine
                // (before its next decision) when the shapes are due.
                if !matches!(req.gpu, GpuDemand::None) && l.record(req) {
                    engine = engine_for(&l.workload())?;
                    for &(j, q) in &placed {
                        engine.commit(&trace.requests[j], q);
                    }
                }
            }
        }
        decision_ns.push(t.elapsed().as_nanos() as u64);
        arrived += d;
        if ok {
            allocated += d;
        } else {
            failed += 1;
            if state_at.is_some() && state.is_none() {
                failed_pods.push(i);
            }
        }
        let bin = ((arrived as f64 / cap * 100.0).round() as usize).min(sums.len() - 1);
        sums[bin].0 += allocated as f64 / cap * 100.0;
        sums[bin].1 += 1;
    }
    Ok(Run {
        policy: policy.to_string(),
        seed,
        allocated_pct: sums
            .into_iter()
            .map(|(s, n)| (n > 0).then(|| s / n as f64))
            .collect(),
        decision_ns,
        attempts: seq.len(),
        failed,
        state: state_at.map(|_| {
            state.unwrap_or_else(|| StateAt {
                nodes: state_csv(engine.nodes()),
                failed: failed_csv(trace, &failed_pods),
            })
        }),
    })
}

/// One line per failed pod (`pods`: indices into `trace.pods`): `pod,cpu_milli,memory_mib,
/// num_gpu,gpu_milli,gpu_spec`, the models it accepts joined by `;` (empty: any).
pub fn failed_csv(trace: &Trace, pods: &[usize]) -> String {
    let mut out = String::from("pod,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for &i in pods {
        let p = &trace.pods[i];
        out += &format!(
            "{},{},{},{},{},{}\n",
            p.name,
            p.cpu_milli,
            p.memory_mib,
            p.num_gpu,
            p.gpu_milli,
            p.gpu_spec.join(";")
        );
    }
    out
}

/// One line per node: `node,gpus,model,cpu_milli,cpu_free_milli,memory_mib,memory_free_mib,
/// pods,gpu_free_milli`, the last the free per-mille of each GPU joined by `;` (what a pod
/// could still take: memory and compute, whichever is scarcer on a core+memory node).
pub fn state_csv(nodes: &[NodeState]) -> String {
    let mut out = String::from(
        "node,gpus,model,cpu_milli,cpu_free_milli,memory_mib,memory_free_mib,pods,gpu_free_milli\n",
    );
    for n in nodes {
        let mode = n.mode();
        let free: Vec<String> = n
            .gpus
            .iter()
            .map(|g| g.free_milli(mode).to_string())
            .collect();
        out += &format!(
            "{},{},{},{},{},{},{},{},{}\n",
            n.spec.name,
            n.gpus.len(),
            n.spec.model(),
            n.spec.cpu_milli,
            n.cpu_free,
            n.spec.memory_mib,
            n.memory_free,
            n.pods,
            free.join(";")
        );
    }
    out
}
