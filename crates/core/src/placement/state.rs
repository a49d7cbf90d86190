//! Per-node bookkeeping: what is free on each node and GPU, kept up to date incrementally as
//! pods are placed and leave, and the feasibility rules that decide whether a pod fits.

use super::model::{
    CORE_MILLI_PER_GPU, GpuDemand, MAX_GPUS_PER_NODE, NodeSpec, Request, ScheduleMode,
};
use super::reject::Why;

/// A set of GPU indices of one node: a 64-bit mask, so indexes are below
/// [`MAX_GPUS_PER_NODE`]; a larger index is never a member (inserting it does nothing), so
/// that no index can overflow the shift.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GpuSet(pub u64);

/// The bit of `index`, 0 beyond the mask.
fn bit(index: usize) -> u64 {
    if index < MAX_GPUS_PER_NODE {
        1 << index
    } else {
        0
    }
}

impl GpuSet {
    pub const EMPTY: GpuSet = GpuSet(0);

    pub fn single(index: usize) -> Self {
        GpuSet(bit(index))
    }

    pub fn insert(&mut self, index: usize) {
        self.0 |= bit(index);
    }

    pub fn contains(self, index: usize) -> bool {
        self.0 & bit(index) != 0
    }

    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Indices in increasing order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(i)
        })
    }
}

impl FromIterator<usize> for GpuSet {
    fn from_iter<T: IntoIterator<Item = usize>>(iter: T) -> Self {
        let mut s = GpuSet::EMPTY;
        for i in iter {
            s.insert(i);
        }
        s
    }
}

/// One GPU's free resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuState {
    /// Capacity.
    pub memory_mib: u64,
    pub memory_free: u64,
    /// Per-mille of the GPU's compute not yet promised.
    pub core_free: u32,
    pub healthy: bool,
    /// Pods using this GPU.
    pub pods: u32,
    /// What pods hold beyond the capacity (MiB, per-mille): allocations restored onto a GPU
    /// that has since shrunk (say, ECC turned on) or that were never this scheduler's
    /// decision. Given back first, so the free amounts stay what is really free.
    pub memory_over: u32,
    pub core_over: u32,
}

impl GpuState {
    /// A GPU with nothing (placeholder in fixed-size buffers).
    pub const ZERO: GpuState = GpuState {
        memory_mib: 0,
        memory_free: 0,
        core_free: 0,
        healthy: false,
        pods: 0,
        memory_over: 0,
        core_over: 0,
    };

    fn new(memory_mib: u64, healthy: bool) -> Self {
        GpuState {
            memory_mib,
            memory_free: memory_mib,
            core_free: CORE_MILLI_PER_GPU,
            healthy,
            pods: 0,
            memory_over: 0,
            core_over: 0,
        }
    }

    /// Nobody uses it and it can be used.
    pub fn is_idle(&self) -> bool {
        self.healthy && self.pods == 0
    }

    /// A share of `memory_mib` (and `core_milli`) fits.
    pub fn fits(&self, memory_mib: u64, core_milli: Option<u32>) -> bool {
        self.healthy
            && self.memory_free >= memory_mib
            && core_milli.is_none_or(|c| self.core_free >= c)
    }

    /// Free capacity in per-mille of the GPU, the scalar the policies compare GPUs by: the
    /// scarcer of memory and compute on `core_mem` nodes, memory elsewhere.
    pub fn free_milli(&self, mode: ScheduleMode) -> u32 {
        if !self.healthy || self.memory_mib == 0 {
            return 0;
        }
        let mem = (self.memory_free * CORE_MILLI_PER_GPU as u64 / self.memory_mib) as u32;
        if mode == ScheduleMode::CoreMem {
            mem.min(self.core_free)
        } else {
            mem
        }
    }

    /// What `demand` takes of this GPU: memory and core per-mille (a whole GPU: all of
    /// it); `None` when it asks for no GPU.
    fn cost(&self, demand: &GpuDemand) -> Option<(u64, u32)> {
        match *demand {
            GpuDemand::None => None,
            GpuDemand::Shared {
                memory_mib,
                core_milli,
                ..
            } => Some((memory_mib, core_milli.unwrap_or(0))),
            GpuDemand::Whole { .. } => Some((self.memory_mib, CORE_MILLI_PER_GPU)),
        }
    }

    /// Gives this GPU's part of `demand` to a pod.
    pub fn take(&mut self, demand: &GpuDemand) {
        if let Some((memory_mib, core_milli)) = self.cost(demand) {
            // A scheduler restoring allocations it did not decide (annotations written before
            // a restart, a GPU that shrank since) must not wrap: what it restores fills the
            // GPU, and the rest is kept as over-commitment until it is given back.
            let mem_over = memory_mib.saturating_sub(self.memory_free);
            let core_over = core_milli.saturating_sub(self.core_free);
            self.memory_free = self.memory_free.saturating_sub(memory_mib);
            self.core_free = self.core_free.saturating_sub(core_milli);
            self.memory_over = self
                .memory_over
                .saturating_add(u32::try_from(mem_over).unwrap_or(u32::MAX));
            self.core_over = self.core_over.saturating_add(core_over);
            self.pods += 1;
        }
    }

    /// Returns what [`GpuState::take`] gave.
    pub fn give_back(&mut self, demand: &GpuDemand) {
        if let Some((memory_mib, core_milli)) = self.cost(demand) {
            let pay = |over: &mut u32, amount: u64| -> u64 {
                let paid = amount.min(u64::from(*over));
                *over -= paid as u32;
                amount - paid
            };
            let memory_mib = pay(&mut self.memory_over, memory_mib);
            let core_milli = pay(&mut self.core_over, u64::from(core_milli)) as u32;
            self.memory_free = (self.memory_free + memory_mib).min(self.memory_mib);
            self.core_free = (self.core_free + core_milli).min(CORE_MILLI_PER_GPU);
            self.pods = self.pods.saturating_sub(1);
        }
    }
}

/// One node's free resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub spec: NodeSpec,
    pub cpu_free: u64,
    pub memory_free: u64,
    pub gpus: Vec<GpuState>,
    pub pods: u32,
}

impl NodeState {
    /// Panics on a node with more than [`MAX_GPUS_PER_NODE`] GPUs: a spec built from outside
    /// input (the node annotation, a trace file) is checked first ([`NodeSpec::check_gpus`]).
    pub fn new(spec: NodeSpec) -> Self {
        if let Err(e) = spec.check_gpus() {
            panic!("{e}");
        }
        NodeState {
            cpu_free: spec.cpu_milli,
            memory_free: spec.memory_mib,
            gpus: spec
                .gpus
                .iter()
                .map(|g| GpuState::new(g.memory_mib, g.healthy))
                .collect(),
            pods: 0,
            spec,
        }
    }

    pub fn mode(&self) -> ScheduleMode {
        self.spec.mode
    }

    /// Free GPU capacity of the node in per-mille of a GPU.
    pub fn free_milli(&self) -> u32 {
        let mode = self.mode();
        self.gpus.iter().map(|g| g.free_milli(mode)).sum()
    }

    /// GPUs nobody uses.
    pub fn idle_gpus(&self) -> GpuSet {
        self.gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.is_idle())
            .map(|(i, _)| i)
            .collect()
    }

    /// The feasibility rules. `Ok`: the GPUs the pod could use here (the fitting GPUs for a
    /// sharing pod, the idle GPUs for a whole-GPU pod, none for a CPU-only pod).
    pub fn check(&self, req: &Request) -> Result<GpuSet, Why> {
        if self.cpu_free < req.cpu_milli {
            return Err(Why::Cpu {
                free: self.cpu_free,
                need: req.cpu_milli,
            });
        }
        if self.memory_free < req.memory_mib {
            return Err(Why::Memory {
                free: self.memory_free,
                need: req.memory_mib,
            });
        }
        let need = req.gpu.count();
        if matches!(req.gpu, GpuDemand::None) {
            return Ok(GpuSet::EMPTY);
        }
        if self.gpus.is_empty() {
            return Err(Why::NoGpus);
        }
        // GPUs of a model the pod accepts.
        let allowed: GpuSet = if req.models.is_empty() {
            (0..self.gpus.len()).collect()
        } else {
            let a: GpuSet = (self.spec.gpus.iter().enumerate())
                .filter(|(_, g)| req.allows_model(&g.model))
                .map(|(i, _)| i)
                .collect();
            if a.is_empty() {
                return Err(Why::Model);
            }
            a
        };
        if need as usize > self.gpus.len() {
            return Err(Why::TooFewGpus {
                have: self.gpus.len() as u32,
                need,
            });
        }
        match req.gpu {
            GpuDemand::None => unreachable!(),
            GpuDemand::Shared {
                memory_mib,
                core_milli,
                ..
            } => {
                match (self.mode(), core_milli) {
                    (ScheduleMode::Default, _) => return Err(Why::ExclusiveNode),
                    (ScheduleMode::CoreMem, None) => return Err(Why::MemoryOnlyOnCoreNode),
                    (ScheduleMode::Cgpu | ScheduleMode::Share, Some(_)) => {
                        return Err(Why::CoreOnMemoryOnlyNode);
                    }
                    _ => {}
                }
                let mut fit = GpuSet::EMPTY;
                let mut most_free = 0;
                for (i, g) in self.gpus.iter().enumerate() {
                    if allowed.contains(i) && g.fits(memory_mib, core_milli) {
                        fit.insert(i);
                    }
                    if g.healthy {
                        most_free = most_free.max(g.memory_free);
                    }
                }
                if fit.len() < need {
                    return Err(Why::GpuShortage {
                        need,
                        fitting: fit.len(),
                        memory_mib,
                        core_milli,
                        most_free_mib: most_free,
                    });
                }
                Ok(fit)
            }
            GpuDemand::Whole { .. } => {
                let idle = GpuSet(self.idle_gpus().0 & allowed.0);
                if idle.len() < need {
                    return Err(Why::WholeShortage {
                        need,
                        idle: idle.len(),
                    });
                }
                Ok(idle)
            }
        }
    }

    /// What kube-scheduler's own filter sees of the pod's fit before an extender is asked:
    /// the node's totals — free CPU and memory, the sum of its GPUs' free memory (and
    /// compute) as one extended resource, its GPU model by label — not whether one GPU has
    /// room. Every node that [`NodeState::check`] accepts passes; a node whose free GPU
    /// memory is split over several GPUs may pass here and fail there.
    pub fn fits_in_total(&self, req: &Request) -> bool {
        if self.cpu_free < req.cpu_milli || self.memory_free < req.memory_mib {
            return false;
        }
        let need = req.gpu.count() as u64;
        if matches!(req.gpu, GpuDemand::None) {
            return true;
        }
        if !req.models.is_empty() && !self.spec.gpus.iter().any(|g| req.allows_model(&g.model)) {
            return false;
        }
        let healthy = || self.gpus.iter().filter(|g| g.healthy);
        let memory_free: u64 = healthy().map(|g| g.memory_free).sum();
        match req.gpu {
            GpuDemand::None => true,
            GpuDemand::Shared {
                memory_mib,
                core_milli,
                ..
            } => {
                let core_free: u64 = healthy().map(|g| g.core_free as u64).sum();
                memory_free >= need * memory_mib
                    && core_milli.is_none_or(|c| core_free >= need * c as u64)
            }
            GpuDemand::Whole { .. } => {
                // gpu-count k and all of those GPUs' memory (the largest GPU's, a bound).
                let per_gpu = healthy().map(|g| g.memory_mib).max().unwrap_or(0);
                healthy().count() as u64 >= need && memory_free >= need * per_gpu
            }
        }
    }

    /// Gives `gpus` (chosen among what [`NodeState::check`] returned) and the node's CPU and
    /// memory to the pod.
    pub fn take(&mut self, req: &Request, gpus: GpuSet) {
        debug_assert_eq!(gpus.len(), req.gpu.count());
        self.cpu_free = self.cpu_free.saturating_sub(req.cpu_milli);
        self.memory_free = self.memory_free.saturating_sub(req.memory_mib);
        self.pods += 1;
        for i in gpus.iter() {
            self.gpus[i].take(&req.gpu);
        }
    }

    /// Returns what [`NodeState::take`] gave.
    pub fn give_back(&mut self, req: &Request, gpus: GpuSet) {
        self.cpu_free = (self.cpu_free + req.cpu_milli).min(self.spec.cpu_milli);
        self.memory_free = (self.memory_free + req.memory_mib).min(self.spec.memory_mib);
        self.pods = self.pods.saturating_sub(1);
        for i in gpus.iter() {
            self.gpus[i].give_back(&req.gpu);
        }
    }
}

/// Runs `f` on a copy of `gpus` in which `taken` gave their part of `demand` to a pod.
pub fn with_taken<R>(
    gpus: &[GpuState],
    taken: GpuSet,
    demand: &GpuDemand,
    f: impl FnOnce(&[GpuState]) -> R,
) -> R {
    const SMALL: usize = 8;
    if gpus.len() <= SMALL {
        let mut buf = [GpuState::ZERO; SMALL];
        buf[..gpus.len()].copy_from_slice(gpus);
        for i in taken.iter() {
            buf[i].take(demand);
        }
        f(&buf[..gpus.len()])
    } else {
        let mut v = gpus.to_vec();
        for i in taken.iter() {
            v[i].take(demand);
        }
        f(&v)
    }
}

/// The `count` lowest-indexed GPUs of `set`.
pub fn lowest(set: GpuSet, count: u32) -> GpuSet {
    set.iter().take(count as usize).collect()
}

/// The `count` GPUs of `set` with the least (`least = true`) or most free capacity, lowest
/// index first among equals.
pub fn by_free(node: &NodeState, set: GpuSet, count: u32, least: bool) -> GpuSet {
    let mode = node.mode();
    if count == 1 {
        let mut best: Option<(usize, u32)> = None;
        for i in set.iter() {
            let f = node.gpus[i].free_milli(mode);
            let better = match best {
                None => true,
                Some((_, b)) => {
                    if least {
                        f < b
                    } else {
                        f > b
                    }
                }
            };
            if better {
                best = Some((i, f));
            }
        }
        return best.map_or(GpuSet::EMPTY, |(i, _)| GpuSet::single(i));
    }
    let mut v: Vec<(u32, usize)> = set
        .iter()
        .map(|i| (node.gpus[i].free_milli(mode), i))
        .collect();
    if least {
        v.sort();
    } else {
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    }
    v.into_iter().take(count as usize).map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(mode: ScheduleMode) -> NodeState {
        NodeState::new(NodeSpec::uniform("n", 8000, 64 << 10, 4, 16000, "T4", mode))
    }

    fn shared(mem: u64, core: Option<u32>, count: u32) -> Request {
        Request {
            gpu: GpuDemand::Shared {
                count,
                memory_mib: mem,
                core_milli: core,
            },
            ..Request::cpu_only("p", 1000, 1024)
        }
    }

    /// Allocations restored onto a GPU that shrank since (15360 → 15000 MiB: A 10240 and
    /// B 5120 hold 360 MiB more than there is): when A leaves, what is free is what B leaves,
    /// 9880 MiB, not A's whole 10240. The same for compute.
    #[test]
    fn giving_back_on_an_over_committed_gpu_frees_only_what_is_there() {
        let mut g = GpuState::new(15000, true);
        let share = |memory_mib, core_milli| GpuDemand::Shared {
            count: 1,
            memory_mib,
            core_milli: Some(core_milli),
        };
        let (a, b) = (share(10240, 700), share(5120, 400));
        g.take(&a);
        g.take(&b);
        assert_eq!((g.memory_free, g.core_free), (0, 0));
        g.give_back(&a);
        assert_eq!((g.memory_free, g.core_free), (9880, 600));
        g.give_back(&b);
        assert_eq!((g.memory_free, g.core_free), (15000, 1000));
        assert_eq!(g, GpuState::new(15000, true), "nothing left over");
        // Within capacity nothing changes: take and give back are exact.
        g.take(&b);
        assert_eq!(g.memory_free, 9880);
        g.give_back(&b);
        assert_eq!(g, GpuState::new(15000, true));
    }

    #[test]
    fn gpu_set_basics() {
        let s: GpuSet = [3, 0, 5].into_iter().collect();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 3, 5]);
        assert_eq!(s.len(), 3);
        assert!(s.contains(3) && !s.contains(1));
        assert_eq!(lowest(s, 2).iter().collect::<Vec<_>>(), vec![0, 3]);
    }

    /// Hardening item 8: a GPU index beyond the 64-bit mask is never in a set (no shift
    /// overflow), and a node with more than 64 GPUs is refused by `NodeSpec::check_gpus`.
    #[test]
    fn indexes_beyond_the_mask_are_not_members() {
        let mut s = GpuSet::single(64);
        assert!(s.is_empty());
        s.insert(200);
        assert!(s.is_empty() && !s.contains(64) && !s.contains(usize::MAX));
        let big = NodeSpec::uniform("n", 1, 1, 65, 16000, "T4", ScheduleMode::CoreMem);
        assert_eq!(
            big.check_gpus().unwrap_err().to_string(),
            "node n has 65 GPUs, at most 64 are supported"
        );
        assert!(
            NodeSpec::uniform("n", 1, 1, 64, 1, "T4", ScheduleMode::CoreMem)
                .check_gpus()
                .is_ok()
        );
    }

    #[test]
    fn take_and_give_back_restore_the_node() {
        let mut n = node(ScheduleMode::CoreMem);
        let before = n.clone();
        let r = shared(4000, Some(300), 2);
        let fit = n.check(&r).unwrap();
        assert_eq!(fit.len(), 4);
        let gpus = lowest(fit, 2);
        n.take(&r, gpus);
        assert_eq!(n.gpus[0].memory_free, 12000);
        assert_eq!(n.gpus[1].core_free, 700);
        assert_eq!(n.gpus[0].free_milli(ScheduleMode::CoreMem), 700);
        assert_eq!(n.free_milli(), 700 * 2 + 2000);
        let w = Request {
            gpu: GpuDemand::Whole { count: 2 },
            ..Request::cpu_only("w", 0, 0)
        };
        let idle = n.check(&w).unwrap();
        assert_eq!(idle.iter().collect::<Vec<_>>(), vec![2, 3]);
        n.take(&w, idle);
        assert_eq!(n.free_milli(), 1400);
        n.give_back(&w, idle);
        n.give_back(&r, gpus);
        assert_eq!(n, before);
    }

    #[test]
    fn memory_only_share_keeps_compute() {
        let mut n = node(ScheduleMode::Cgpu);
        let r = shared(8000, None, 1);
        n.take(&r, GpuSet::single(0));
        assert_eq!(n.gpus[0].core_free, 1000);
        assert_eq!(n.gpus[0].free_milli(ScheduleMode::Cgpu), 500);
    }

    #[test]
    fn gpu_choice_by_free_capacity() {
        let mut n = node(ScheduleMode::CoreMem);
        n.take(&shared(1600, Some(100), 1), GpuSet::single(1));
        n.take(&shared(3200, Some(200), 1), GpuSet::single(2));
        let all = GpuSet(0b1111);
        assert_eq!(by_free(&n, all, 1, true), GpuSet::single(2));
        assert_eq!(by_free(&n, all, 1, false), GpuSet::single(0));
        assert_eq!(by_free(&n, all, 2, true), GpuSet(0b0110));
        assert_eq!(by_free(&n, all, 2, false), GpuSet(0b1001));
    }
}
