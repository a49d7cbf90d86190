//! `fgd`: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23), re-implemented from the
//! paper's description and its artifact's scoring: place the pod where the node's expected
//! fragment ([`super::frag`]) grows least; the score is ⌊100 · sigmoid(−Δ/1000)⌋, so nodes
//! whose growth differs by little tie and the node order decides.
//!
//! Each node's current fragment is cached and recomputed only when the node changes.

use super::frag::FragModel;
use super::model::{GpuDemand, Request};
use super::policy::{Choice, PlacementPolicy, packed_gpus};
use super::state::{GpuSet, NodeState};
use super::workload::Workload;

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The artifact's integer score for a fragment change `before → after`.
pub fn fgd_score(before: f64, after: f64) -> f64 {
    (sigmoid((before - after) / 1000.0) * 100.0).trunc()
}

#[derive(Debug, Clone, Default)]
pub struct Fgd {
    workload: Workload,
    /// Each node's expected fragment, kept current.
    model: FragModel,
}

impl Fgd {
    pub fn new(workload: Workload) -> Self {
        Fgd {
            workload,
            ..Default::default()
        }
    }
}

/// Calls `f` once per distinct GPU state among `fit` (lowest index first): GPUs with equal free
/// memory and compute give equal results.
pub fn distinct_gpus(node: &NodeState, fit: GpuSet, mut f: impl FnMut(usize)) {
    let mut seen = GpuSet::EMPTY;
    for i in fit.iter() {
        let g = &node.gpus[i];
        let dup = seen.iter().any(|j| {
            let h = &node.gpus[j];
            h.memory_free == g.memory_free && h.core_free == g.core_free
        });
        if !dup {
            seen.insert(i);
            f(i);
        }
    }
}

/// The choice of a fragmentation-scored policy on one node: a one-GPU share tries each distinct
/// fitting GPU and keeps the best by `eval` (lowest index on ties); any other pod takes the
/// usual GPUs ([`packed_gpus`]).
pub fn best_choice(
    node: &NodeState,
    req: &Request,
    fit: GpuSet,
    eval: impl Fn(GpuSet) -> f64,
) -> Choice {
    if let GpuDemand::Shared { count: 1, .. } = req.gpu {
        let mut best = Choice {
            score: f64::NEG_INFINITY,
            gpus: GpuSet::EMPTY,
        };
        distinct_gpus(node, fit, |i| {
            let gpus = GpuSet::single(i);
            let score = eval(gpus);
            if score > best.score {
                best = Choice { score, gpus };
            }
        });
        return best;
    }
    let gpus = packed_gpus(node, req, fit);
    Choice {
        score: eval(gpus),
        gpus,
    }
}

impl PlacementPolicy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn init(&mut self, nodes: &[NodeState]) {
        self.model = FragModel::new(self.workload.clone(), nodes, false);
    }

    fn node_changed(&mut self, id: usize, node: &NodeState) {
        self.model.refresh(id, node);
    }

    fn score(&self, id: usize, node: &NodeState, req: &Request, fit: GpuSet) -> Choice {
        let before = self.model.current(id).fgd;
        best_choice(node, req, fit, |gpus| {
            fgd_score(before, self.model.after(id, node, req, gpus).fgd)
        })
    }
}
