//! `gpushare`, the default policy: FGD's fragmentation score, with its ties decided by what
//! FGD does not see.
//!
//! 1. Primary: FGD's integer score ⌊100 · σ(−ΔF/1000)⌋ ([`super::fgd`]), ΔF the change of the
//!    node's expected fragment over the workload's typical shapes. The integer truncation
//!    makes many placements equal. One change to FGD's ΔF: FGD counts all free GPU capacity
//!    as fragment for the shapes that can *never* use the node's GPUs (pods without GPUs,
//!    shapes asking for another GPU model or sharing mode), so a pod placed there lowers ΔF
//!    by that mass times what it takes. Where typical shapes ask for models, that mass is
//!    largest on the nodes of a small model pool (T4, P100, V100 when most constrained shapes
//!    ask for G2), and FGD fills those pools with pods that could run anywhere while the pods
//!    constrained to them fail (`--variant model:0.3` at 90–95 % arrived load). `gpushare`
//!    takes back half of that bonus ([`NEVER_WEIGHT`]); taking it all back sends too little
//!    to the small pools and fails multi-GPU pods at 110–130 % (the combined variant), and
//!    leaving out the pods without GPUs (whose share is the same on every node) made the
//!    `multigpu` variant worse (BENCHMARKS.md).
//! 2. Among them (a fraction of a point): the change ΔR of the *repeated* fragment
//!    ([`super::frag`]): the GPU capacity that copies of each typical shape could not use if
//!    they kept coming until the node's GPUs, CPU or memory ran out. It sees what a one-copy
//!    test misses: CPU (and host memory) running out before the GPUs do, which strands GPUs on
//!    CPU-poor nodes (8-GPU nodes with 12 cores per GPU, pods asking 10 cores per half GPU),
//!    and the remainder a shape leaves in every GPU.
//! 3. And a small price for opening an idle node: pods that fit as well on nodes already in
//!    use go there, which keeps whole idle nodes for multi-GPU pods.
//! 4. And a price for taking capacity on a *rare* node, ∝ ln(cluster GPUs / GPUs on nodes at
//!    least as capable: as many GPUs, as much CPU and memory, and the same model when some
//!    typical shape asks for one). A pod that fits on common nodes leaves the few nodes that
//!    can hold what the others cannot (8 GPUs with 120 cores, a GPU model that pods ask for)
//!    to those pods. Without it, at 90–95 % arrived load the packing tie-break filled those
//!    nodes first and `gpushare` refused model-constrained, CPU-heavy and 8-GPU pods earlier
//!    than `fgd`, whose random tie order spreads them (`gpushare simulate --variant`).
//! 5. Not a tie-break: a price in whole points for taking capacity in a GPU model pool whose
//!    share of the *captive* demand (typical shapes that accept only some models) exceeds its
//!    share of the cluster's free GPU capacity: [`PRESSURE_WEIGHT`] × (pressure − 1) per GPU
//!    taken ([`Pools::price`]). FGD's never-usable bonus (item 1) is static and largest on
//!    small pools, so pods that could run anywhere keep filling a small pool (8-GPU pods on
//!    the 39 G3 nodes) until the pods only it can hold fail: on
//!    `gpushare100+model:0.3,multigpu:0.3,cpuheavy:0.3`, seeds 100–119, 90 %, every extra
//!    failure against `fgd` was such a pod (BENCHMARKS.md). The pressure follows the pool's
//!    free capacity as it fills, so a pool pays nothing until it is short for its own pods.
//!    It depends on other nodes, so it is not part of the cached score but added at every
//!    decision ([`PlacementPolicy::live`]); a pod that accepts only one model pays the same on
//!    each of its nodes and is not moved.
//! 6. Remaining ties: the node order, as for every policy.
//!
//! Per node both fragments are kept current and a candidate costs O(shapes) ([`FragModel`]);
//! the pools' free capacity is kept current per node change and the price costs O(1).
//! The weights were chosen on the openb traces (seeds 42–51; the rarity weight on seeds 42–46
//! of the traces and their `--variant` stress variants) and checked on seeds 100–104; see the
//! README and BENCHMARKS.md.

use super::fgd::{best_choice, fgd_score};
use super::frag::{FragModel, gpu_size};
use super::model::{GpuDemand, Request};
use super::policy::{Choice, PlacementPolicy, free_after};
use super::state::{GpuSet, NodeState};
use super::workload::Workload;

/// Share of FGD's never-usable-capacity bonus that `gpushare` takes back (item 1 above):
/// 0.5 on the variants' 20 seeds; 0.25, 0.75 and 1 left more cells worse than `fgd`.
const NEVER_WEIGHT: f64 = 0.5;
/// Points of primary score per per-mille of repeated-fragment growth (0.3 points per GPU).
const REPEATED_WEIGHT: f64 = 0.3 / 1000.0;
/// Repeated-fragment equivalent (per-mille of a GPU) of opening an idle node, per GPU of it.
const OPEN_IDLE_NODE_PER_GPU: f64 = 20.0;
/// Repeated-fragment equivalent of taking one per-mille of a GPU on a node, per unit of the
/// node's rarity ([`rarity`]): 0.2 per-mille per e-fold.
const RARITY_WEIGHT: f64 = 0.2;
/// Points per GPU taken, per unit of a model pool's pressure above 1 ([`Pools::price`]):
/// 2.5 on the 240 variant cells of seeds 42–61 and 100–119; 5 gained more on average but left
/// more cells with a median above `fgd`, 10 made one cell worse (BENCHMARKS.md, 2026-12-05).
const PRESSURE_WEIGHT: f64 = 2.5;

#[derive(Debug, Clone, Default)]
pub struct Gpushare {
    workload: Workload,
    model: FragModel,
    /// Per node: ln(cluster GPUs / GPUs on nodes at least as capable), see [`rarity`].
    rarity: Vec<f64>,
    pools: Pools,
}

impl Gpushare {
    pub fn new(workload: Workload) -> Self {
        Gpushare {
            workload,
            model: FragModel::default(),
            rarity: Vec::new(),
            pools: Pools::default(),
        }
    }
}

/// The GPU model pools (nodes by GPU model), the share of the *captive* GPU demand of each
/// (typical shapes that accept only some models, split evenly over the pools they accept) and
/// each pool's free GPU capacity, kept current from [`PlacementPolicy::node_changed`]
/// (item 5 of the module docs).
#[derive(Debug, Clone, Default)]
struct Pools {
    /// Per node: its pool (`None`: no GPUs).
    of: Vec<Option<u32>>,
    /// Per node: its free per-mille as last seen.
    node_free: Vec<u32>,
    /// Per pool: its share of the captive demand (the shares sum to 1).
    demand: Vec<f64>,
    /// Per pool: free per-mille.
    free: Vec<u64>,
    /// Per pool: the memory of its first GPU (to size shares of GPU memory).
    gpu_memory: Vec<u64>,
    total_free: u64,
}

impl Pools {
    fn new(nodes: &[NodeState], workload: &Workload) -> Self {
        let mut names: Vec<&str> = Vec::new();
        let mut p = Pools::default();
        for n in nodes {
            let f = n.free_milli();
            p.node_free.push(f);
            if n.gpus.is_empty() {
                p.of.push(None);
                continue;
            }
            let i = match names.iter().position(|&x| x == n.spec.model()) {
                Some(i) => i,
                None => {
                    names.push(n.spec.model());
                    p.free.push(0);
                    p.gpu_memory.push(n.spec.gpus[0].memory_mib);
                    names.len() - 1
                }
            };
            p.of.push(Some(i as u32));
            p.free[i] += f as u64;
            p.total_free += f as u64;
        }
        p.demand = vec![0.0; names.len()];
        for s in &workload.shapes {
            if s.models.is_empty() || s.gpu == GpuDemand::None {
                continue;
            }
            let pools: Vec<usize> = (0..names.len())
                .filter(|&i| s.models.iter().any(|m| m == names[i]))
                .collect();
            for &i in &pools {
                let taken = gpu_size(&s.gpu, p.gpu_memory[i]) as f64 * s.gpu.count() as f64;
                p.demand[i] += s.p * taken / pools.len() as f64;
            }
        }
        let total: f64 = p.demand.iter().sum();
        for d in &mut p.demand {
            // No captive demand at all: no price anywhere.
            *d = if total > 0.0 { *d / total } else { 0.0 };
        }
        p
    }

    fn changed(&mut self, id: usize, node: &NodeState) {
        let (Some(&Some(i)), Some(old)) = (self.of.get(id), self.node_free.get_mut(id)) else {
            return;
        };
        let f = node.free_milli();
        let i = i as usize;
        self.free[i] = self.free[i] + f as u64 - *old as u64;
        self.total_free = self.total_free + f as u64 - *old as u64;
        *old = f;
    }

    /// Points a GPU pod pays for taking capacity on node `id`: [`PRESSURE_WEIGHT`] per GPU it
    /// takes, times how far the pool's share of the captive demand exceeds its share of the
    /// free capacity (pressure − 1, none below 1).
    fn price(&self, id: usize, req: &Request) -> f64 {
        let Some(&Some(i)) = self.of.get(id) else {
            return 0.0;
        };
        let i = i as usize;
        if req.gpu == GpuDemand::None || self.demand[i] == 0.0 {
            return 0.0;
        }
        let share = self.free[i].max(1) as f64 / self.total_free.max(1) as f64;
        let over = self.demand[i] / share - 1.0;
        if over <= 0.0 {
            return 0.0;
        }
        let taken = gpu_size(&req.gpu, self.gpu_memory[i]) as f64 * req.gpu.count() as f64;
        PRESSURE_WEIGHT * over * taken / 1000.0
    }
}

impl PlacementPolicy for Gpushare {
    fn name(&self) -> &'static str {
        "gpushare"
    }

    fn init(&mut self, nodes: &[NodeState]) {
        self.model = FragModel::new(self.workload.clone(), nodes, true);
        self.rarity = rarity(nodes, &self.workload);
        self.pools = Pools::new(nodes, &self.workload);
    }

    fn node_changed(&mut self, id: usize, node: &NodeState) {
        self.model.refresh(id, node);
        self.pools.changed(id, node);
    }

    fn live(&self, id: usize, req: &Request) -> f64 {
        -self.pools.price(id, req)
    }

    fn score(&self, id: usize, node: &NodeState, req: &Request, fit: GpuSet) -> Choice {
        let before = self.model.current(id);
        let opens = if node.pods == 0 && req.gpu != GpuDemand::None {
            OPEN_IDLE_NODE_PER_GPU * node.gpus.len() as f64
        } else {
            0.0
        };
        let rare = RARITY_WEIGHT * self.rarity.get(id).copied().unwrap_or(0.0);
        let never = NEVER_WEIGHT * self.model.never(id);
        let eval = |gpus: GpuSet| -> f64 {
            let after = self.model.after(id, node, req, gpus);
            let taken = node.free_milli() - free_after(node, req, gpus);
            let price = opens + rare * taken as f64;
            fgd_score(before.fgd, after.fgd + never * taken as f64)
                - REPEATED_WEIGHT * (after.repeated - before.repeated + price)
        };
        best_choice(node, req, fit, eval)
    }
}

/// How rare each node's capability is: ln(total GPUs / GPUs on nodes at least as capable:
/// as many GPUs or more, as much CPU and memory or more, and, when some typical shape asks
/// for a GPU model, the same model).
pub fn rarity(nodes: &[NodeState], workload: &Workload) -> Vec<f64> {
    let by_model = workload.shapes.iter().any(|s| !s.models.is_empty());
    // Distinct (GPUs, CPU, memory, model) and their GPUs: O(kinds²), not O(nodes²), for the
    // scheduler's engine rebuilds on large clusters.
    let key = |n: &NodeState| {
        let model = if by_model { n.spec.model() } else { "" };
        (
            n.gpus.len(),
            n.spec.cpu_milli,
            n.spec.memory_mib,
            model.to_string(),
        )
    };
    let mut kinds: Vec<((usize, u64, u64, String), usize)> = Vec::new();
    for n in nodes {
        let k = key(n);
        match kinds.iter_mut().find(|(x, _)| *x == k) {
            Some(e) => e.1 += n.gpus.len(),
            None => kinds.push((k, n.gpus.len())),
        }
    }
    let total: usize = nodes.iter().map(|n| n.gpus.len()).sum();
    let of_kind: Vec<f64> = kinds
        .iter()
        .map(|(k, _)| {
            let covered: usize = kinds
                .iter()
                .filter(|(m, _)| m.0 >= k.0 && m.1 >= k.1 && m.2 >= k.2 && m.3 == k.3)
                .map(|(_, g)| g)
                .sum();
            (total as f64 / covered.max(1) as f64).ln()
        })
        .collect();
    nodes
        .iter()
        .map(|n| {
            if n.gpus.is_empty() {
                return 0.0;
            }
            let k = key(n);
            let i = kinds
                .iter()
                .position(|(x, _)| *x == k)
                .expect("every node has a kind");
            of_kind[i]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::engine::Engine;
    use crate::placement::fgd::Fgd;
    use crate::placement::model::{NodeSpec, ScheduleMode};
    use crate::placement::workload::Shape;

    fn node(name: &str, gpus: usize, cpu: u64, model: &str) -> NodeState {
        NodeState::new(NodeSpec::uniform(
            name,
            cpu,
            1 << 20,
            gpus,
            16_000,
            model,
            ScheduleMode::CoreMem,
        ))
    }

    /// Four common 8-GPU G2 nodes (ids 0–3), then `last` (id 4).
    fn four_g2_and(last: NodeState) -> Vec<NodeState> {
        let mut nodes: Vec<NodeState> = (0..4)
            .map(|i| node(&format!("g{i}"), 8, 96_000, "G2"))
            .collect();
        nodes.push(last);
        nodes
    }

    /// A typical shape of one whole GPU and 4 cores, accepting `models` (empty: any).
    fn one_gpu_shape(models: &[&str], p: f64) -> Shape {
        Shape {
            cpu_milli: 4000,
            memory_mib: 0,
            gpu: GpuDemand::Whole { count: 1 },
            models: models.iter().map(|m| m.to_string()).collect(),
            p,
        }
    }

    fn one_gpu_request(name: &str) -> Request {
        Request {
            gpu: GpuDemand::Whole { count: 1 },
            ..Request::cpu_only(name, 4000, 0)
        }
    }

    /// Policy `p`'s score for `req` on each of `ids`.
    fn scores(
        p: &dyn PlacementPolicy,
        nodes: &[NodeState],
        req: &Request,
        ids: [usize; 2],
    ) -> [f64; 2] {
        ids.map(|id| {
            let fit = nodes[id].check(req).unwrap();
            p.score(id, &nodes[id], req, fit).score
        })
    }

    #[test]
    fn rarity_counts_gpus_on_nodes_at_least_as_capable() {
        // 8 common 8-GPU nodes (96 cores), 1 big one (128 cores), 4 small T4 nodes.
        let mut nodes: Vec<NodeState> = (0..8)
            .map(|i| node(&format!("g{i}"), 8, 96_000, "G2"))
            .collect();
        nodes.push(node("big", 8, 128_000, "G3"));
        nodes.extend((0..4).map(|i| node(&format!("t{i}"), 2, 32_000, "T4")));
        let total: f64 = 8.0 * 8.0 + 8.0 + 8.0;
        let any = Workload::default();
        let r = rarity(&nodes, &any);
        // A common node: the 9 eight-GPU nodes cover it; the big one only itself.
        assert!((r[0] - (total / 72.0).ln()).abs() < 1e-12, "{r:?}");
        assert!((r[8] - (total / 8.0).ln()).abs() < 1e-12);
        // A small node: every node has as many GPUs, CPU and memory or more.
        assert!(r[9].abs() < 1e-12);
        // With a typical shape asking for a model, only nodes of the same model count.
        let by_model = Workload {
            shapes: vec![one_gpu_shape(&["T4"], 1.0)],
        };
        let r = rarity(&nodes, &by_model);
        assert!((r[0] - (total / 64.0).ln()).abs() < 1e-12);
        assert!((r[9] - (total / 8.0).ln()).abs() < 1e-12);
    }

    #[test]
    fn a_pod_that_fits_anywhere_leaves_the_rare_node() {
        let nodes = four_g2_and(node("big", 8, 128_000, "G2"));
        // Both kinds hold the same pod, so fragments tie; the rare node costs more.
        let w = Workload {
            shapes: vec![one_gpu_shape(&[], 1.0)],
        };
        let mut p = Gpushare::new(w);
        p.init(&nodes);
        let [common, big] = scores(&p, &nodes, &one_gpu_request("w"), [0, 4]);
        assert!(common > big, "{common} vs {big}");
    }

    #[test]
    fn never_usable_capacity_does_not_pull_free_pods_onto_a_small_model_pool() {
        // 4 G2 nodes and one T4 node; some shapes ask for G2 (never usable on the T4 node),
        // fewer ask for T4 (never usable on G2 nodes).
        let nodes = four_g2_and(node("t4", 8, 96_000, "T4"));
        let w = Workload {
            shapes: vec![
                one_gpu_shape(&[], 0.92),
                one_gpu_shape(&["G2"], 0.06),
                one_gpu_shape(&["T4"], 0.02),
            ],
        };
        let req = one_gpu_request("free");
        // FGD: the T4 node's free GPUs are fragment for the G2 shapes (6 %), so taking one
        // lowers ΔF by 60 against 20 on a G2 node: the unconstrained pod goes to the T4 pool.
        let mut fgd = Fgd::new(w.clone());
        fgd.init(&nodes);
        let [g2, t4] = scores(&fgd, &nodes, &req, [0, 4]);
        assert!(t4 > g2, "fgd: G2 {g2} vs T4 {t4}");
        // gpushare takes back half of that bonus: the primary scores tie and the T4 node,
        // rare for the shapes that ask for it, costs more.
        let mut gs = Gpushare::new(w);
        gs.init(&nodes);
        let [g2, t4] = scores(&gs, &nodes, &req, [0, 4]);
        assert!(g2 > t4, "gpushare: G2 {g2} vs T4 {t4}");
        assert_eq!(g2.round(), t4.round(), "primary scores tie");
    }

    /// `g2` nodes of 8 G2 GPUs (ids 0…), then one node of 8 G3 GPUs; typical shapes: one
    /// GPU of any model (40 %), of G2 (40 %), of G3 (20 %).
    fn g2_and_g3(g2: usize) -> (Vec<NodeState>, Workload) {
        let mut nodes: Vec<NodeState> = (0..g2)
            .map(|i| node(&format!("g{i}"), 8, 96_000, "G2"))
            .collect();
        nodes.push(node("g3", 8, 96_000, "G3"));
        let w = Workload {
            shapes: vec![
                one_gpu_shape(&[], 0.4),
                one_gpu_shape(&["G2"], 0.4),
                one_gpu_shape(&["G3"], 0.2),
            ],
        };
        (nodes, w)
    }

    #[test]
    fn a_free_pod_leaves_a_model_pool_pressed_beyond_its_share_of_the_free_capacity() {
        // The G3 node's GPUs are never usable by the G2 shapes (40 %), a G2 node's by the G3
        // shapes (20 %): FGD's primary score prefers G3 (54 against 52 with half the bonus
        // taken back), for the unconstrained pod too.
        let req = one_gpu_request("free");
        let (nodes, w) = g2_and_g3(8);
        let mut gs = Gpushare::new(w.clone());
        gs.init(&nodes);
        let [g2, g3] = scores(&gs, &nodes, &req, [0, 8]);
        assert!(g3 > g2 + 1.5, "cached scores: G2 {g2} vs G3 {g3}");
        // G3 holds a third of the captive demand (0.2 of 0.6) and a ninth of the free GPUs:
        // pressure 3, so 2.5 · 2 points per GPU, and G2 (2/3 of the demand, 8/9 of the
        // capacity) pays nothing.
        assert!(gs.live(0, &req).abs() < 1e-12);
        let price = -gs.live(8, &req);
        assert!((price - 2.5 * 2.0).abs() < 1e-9, "{price}");
        assert!(g3 - price < g2, "live: G2 {g2} vs G3 {}", g3 - price);
        // Through the engine, every decision path adds it.
        let specs: Vec<NodeSpec> = nodes.iter().map(|n| n.spec.clone()).collect();
        let mut e = Engine::new(specs, Box::new(Gpushare::new(w.clone())));
        assert_eq!(e.decide(&req).unwrap().node, 0);
        assert_eq!(e.decide_fresh(&req).unwrap().node, 0);
        let mut start = 7;
        assert_eq!(e.decide_within(&req, 2, &mut start).unwrap().node, 7);
        let s = e.scores(&req);
        assert!(s[8].unwrap().score < s[0].unwrap().score, "{s:?}");
        assert!((e.evaluate(8, &req).unwrap().score - s[8].unwrap().score).abs() < 1e-12);
        // A G3-only pod still goes to G3: the price is the same on every node it may use.
        let only_g3 = one_gpu_request("g3").with_models(["G3"]);
        assert_eq!(e.place(&only_g3).unwrap().node, 8);
        // The price follows the pool's free capacity: 7 of 71 free GPUs now.
        let price = -e.scores(&req)[8].unwrap().score + g3;
        let want = 2.5 * ((1.0 / 3.0) / (7.0 / 71.0) - 1.0);
        assert!((price - want).abs() < 0.2, "{price} vs {want}");
        // Where the small pool holds no less of the free capacity than of the captive demand
        // (2 G2 nodes and the G3 node: a third each), it pays nothing and the pod takes it.
        let (nodes, w) = g2_and_g3(2);
        let mut gs = Gpushare::new(w.clone());
        gs.init(&nodes);
        assert_eq!(gs.live(2, &req), 0.0);
        let specs: Vec<NodeSpec> = nodes.iter().map(|n| n.spec.clone()).collect();
        let mut e = Engine::new(specs, Box::new(Gpushare::new(w)));
        assert_eq!(e.decide(&req).unwrap().node, 2);
        // Without any shape asking for a model there is no price.
        let mut gs = Gpushare::new(Workload {
            shapes: vec![one_gpu_shape(&[], 1.0)],
        });
        gs.init(&nodes);
        assert_eq!(gs.live(2, &req), 0.0);
    }
}
