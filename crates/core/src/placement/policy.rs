//! Placement policies: how the engine ranks the nodes a pod fits on, and which of the node's
//! GPUs it takes. A policy sees one feasible node at a time ([`PlacementPolicy::score`]) and may keep
//! per-node caches, updated only for the node that changed ([`PlacementPolicy::node_changed`]).

use std::fmt;

use super::fgd::Fgd;
use super::gpushare::Gpushare;
use super::model::{GpuDemand, Request};
use super::state::{GpuSet, NodeState, by_free, lowest, with_taken};
use super::workload::Workload;

/// A node's score for a pod (higher is better) and the GPUs the pod would take there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub score: f64,
    pub gpus: GpuSet,
}

/// The engine caches scores: [`PlacementPolicy::score`] must depend only on the node (its id, state
/// and what [`PlacementPolicy::node_changed`] learnt about it) and the request, never on other nodes.
pub trait PlacementPolicy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Called with all nodes before the first decision and whenever nodes are added.
    fn init(&mut self, _nodes: &[NodeState]) {}
    /// Node `id` changed (a pod was placed there or left).
    fn node_changed(&mut self, _id: usize, _node: &NodeState) {}
    /// Scores node `id`, where `req` fits on the GPUs `fit` (empty for CPU-only pods; for a
    /// node labelled `ack.node.gpu.placement`, exactly the GPUs the label chose).
    fn score(&self, id: usize, node: &NodeState, req: &Request, fit: GpuSet) -> Choice;
    /// A term added to node `id`'s [`PlacementPolicy::score`] at every decision and never
    /// cached: what depends on cluster-wide state the policy keeps through
    /// [`PlacementPolicy::node_changed`] (a sum over many nodes), which the per-node score
    /// cache cannot hold. Called for every candidate of every decision, so it must be O(1).
    fn live(&self, _id: usize, _req: &Request) -> f64 {
        0.0
    }
}

/// The policies `gpushare simulate` and the scheduler know, by name.
pub const POLICIES: [&str; 5] = ["gpushare", "fgd", "bestfit", "binpack", "spread"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement policy {0:?} (known: gpushare, fgd, bestfit, binpack, spread)")]
pub struct UnknownPolicy(pub String);

/// Builds a policy by name. `workload` (typical pod shapes) feeds `fgd` and `gpushare`.
pub fn by_name(name: &str, workload: &Workload) -> Result<Box<dyn PlacementPolicy>, UnknownPolicy> {
    Ok(match name {
        "gpushare" => Box::new(Gpushare::new(workload.clone())),
        "fgd" => Box::new(Fgd::new(workload.clone())),
        "bestfit" => Box::new(BestFit::default()),
        "binpack" => Box::new(Pack { least: true }),
        "spread" => Box::new(Pack { least: false }),
        _ => return Err(UnknownPolicy(name.to_string())),
    })
}

impl fmt::Debug for dyn PlacementPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The usual GPU choice: the lowest-indexed idle GPUs for whole-GPU pods, the fitting GPUs
/// with the least free capacity for sharing pods.
pub fn packed_gpus(node: &NodeState, req: &Request, fit: GpuSet) -> GpuSet {
    match req.gpu {
        GpuDemand::None => GpuSet::EMPTY,
        GpuDemand::Whole { count } => lowest(fit, count),
        GpuDemand::Shared { count, .. } => by_free(node, fit, count, true),
    }
}

/// Free GPU capacity of `node` (per-mille of a GPU) after `req` took `gpus`.
pub fn free_after(node: &NodeState, req: &Request, gpus: GpuSet) -> u32 {
    let mode = node.mode();
    with_taken(&node.gpus, gpus, &req.gpu, |g| {
        g.iter().map(|g| g.free_milli(mode)).sum()
    })
}

/// `binpack` (ACK semantics) and `spread`: the fitting GPU with the least (most) free
/// capacity anywhere in the cluster; among equal GPUs the node with the least (most) free
/// GPU capacity. CPU-only pods: the node with the least (most) free CPU.
#[derive(Debug, Clone, Copy)]
pub struct Pack {
    pub least: bool,
}

impl PlacementPolicy for Pack {
    fn name(&self) -> &'static str {
        if self.least { "binpack" } else { "spread" }
    }

    fn score(&self, _id: usize, node: &NodeState, req: &Request, fit: GpuSet) -> Choice {
        let gpus = match req.gpu {
            GpuDemand::Shared { count, .. } => by_free(node, fit, count, self.least),
            _ => packed_gpus(node, req, fit),
        };
        let mode = node.mode();
        let key = match req.gpu {
            GpuDemand::None => (node.cpu_free - req.cpu_milli) as f64,
            _ => {
                let chosen: u32 = with_taken(&node.gpus, gpus, &req.gpu, |g| {
                    gpus.iter().map(|i| g[i].free_milli(mode)).sum()
                });
                chosen as f64 * 1e6 + free_after(node, req, gpus) as f64
            }
        };
        Choice {
            score: if self.least { -key } else { key },
            gpus,
        }
    }
}

/// `bestfit` as in the FGD paper's artifact: the node whose CPU and GPU left over after the
/// pod, each normalised by the largest node, is smallest; the score is truncated to an
/// integer out of 100, so ties (broken by node order) are common.
#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit {
    max_cpu: f64,
    max_gpu: f64,
}

impl PlacementPolicy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn init(&mut self, nodes: &[NodeState]) {
        self.max_cpu = nodes
            .iter()
            .map(|n| n.spec.cpu_milli)
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        self.max_gpu = nodes
            .iter()
            .map(|n| n.gpus.len() as u64 * 1000)
            .max()
            .unwrap_or(1)
            .max(1) as f64;
    }

    fn score(&self, _id: usize, node: &NodeState, req: &Request, fit: GpuSet) -> Choice {
        let gpus = packed_gpus(node, req, fit);
        let cpu_left = (node.cpu_free - req.cpu_milli) as f64;
        let gpu_left = free_after(node, req, gpus) as f64;
        let waste = 0.5 * cpu_left / self.max_cpu + 0.5 * gpu_left / self.max_gpu;
        Choice {
            score: ((1.0 - waste) * 100.0).trunc(),
            gpus,
        }
    }
}
