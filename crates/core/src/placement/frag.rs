//! Fragmentation measures over the workload's typical shapes, kept per node and updated
//! incrementally.
//!
//! - FGD's measure (Weng et al., USENIX ATC'23): for a shape that needs GPUs, may run on the
//!   node (model, sharing mode) and finds the CPU and enough GPUs it fits on, the fragment is
//!   the free capacity of the GPUs it does not fit on; for any other shape (CPU-only ones
//!   included) all free GPU capacity is a fragment. The node's value is the expectation over
//!   shapes.
//! - The *repeated* measure: the free GPU capacity that copies of a shape, placed until the
//!   node's GPUs or CPU run out, would leave unused (what the shape cannot use even if it kept
//!   coming), in expectation over shapes. Unlike FGD's it sees the remainder a shape leaves in
//!   every GPU and CPU running out before the GPUs do.
//!
//! Capacity is counted in per-mille of a GPU ([`GpuState::free_milli`]). Each node keeps a
//! summary per shape (GPUs the shape fits on, their free capacity, copies that fit); the value
//! after a hypothetical placement is derived from the summary and the GPUs that change, so a
//! candidate costs O(shapes), not O(shapes × GPUs).

use std::collections::HashMap;

use super::model::{CORE_MILLI_PER_GPU, GpuDemand, MAX_GPUS_PER_NODE, Request, ScheduleMode};
use super::state::{GpuSet, GpuState, NodeState};
use super::workload::{Shape, Workload};

/// A shape can use GPUs of `model` on a `mode` node at all.
pub fn usable_on(shape: &Shape, model: &str, mode: ScheduleMode) -> bool {
    let model_ok = shape.models.is_empty() || shape.models.iter().any(|m| m == model);
    let mode_ok = match shape.gpu {
        GpuDemand::None => false,
        GpuDemand::Whole { .. } => true,
        GpuDemand::Shared { core_milli, .. } => match mode {
            ScheduleMode::CoreMem => core_milli.is_some(),
            ScheduleMode::Cgpu | ScheduleMode::Share => core_milli.is_none(),
            ScheduleMode::Default => false,
        },
    };
    model_ok && mode_ok
}

/// `x / d` for a divisor fixed in advance, by one multiplication (the scoring loop divides by
/// each shape's request several times per candidate node; a hardware division costs tens of
/// cycles).
#[derive(Debug, Clone, Copy, Default)]
struct Divisor {
    d: u64,
    /// ⌈2⁶⁴ / d⌉ for d ≥ 2.
    magic: u64,
}

impl Divisor {
    fn new(d: u64) -> Self {
        let magic = if d >= 2 { u64::MAX / d + 1 } else { 0 };
        Divisor { d, magic }
    }

    /// `x.checked_div(d).unwrap_or(u64::MAX)`. Exact: with x, d < 2³², x·d < 2⁶⁴, which bounds
    /// the rounding error of ⌈2⁶⁴/d⌉ below 1/d; larger operands divide in hardware.
    #[inline]
    fn div(self, x: u64) -> u64 {
        if self.d < 2 {
            return if self.d == 1 { x } else { u64::MAX };
        }
        if (x | self.d) >> 32 != 0 {
            return x / self.d;
        }
        ((x as u128 * self.magic as u128) >> 64) as u64
    }
}

/// A shape that may use a kind of node.
#[derive(Debug, Clone)]
struct UsableShape {
    p: f64,
    cpu_milli: u64,
    /// A whole-GPU shape (else a share of `gpu_memory_mib` and `gpu_core_milli`).
    whole: bool,
    gpu_memory_mib: u64,
    /// 0: no compute asked.
    gpu_core_milli: u32,
    /// GPUs per copy.
    count: u32,
    /// Per-mille of one of this kind's GPUs a copy takes per GPU.
    size: u32,
    by_cpu: Divisor,
    by_memory: Divisor,
    by_gpu_memory: Divisor,
    by_gpu_core: Divisor,
    by_count: Divisor,
}

impl UsableShape {
    fn new(s: &Shape, gpu_memory_mib: u64) -> Self {
        let (whole, mem, core) = match s.gpu {
            GpuDemand::Shared {
                memory_mib,
                core_milli,
                ..
            } => (false, memory_mib, core_milli.unwrap_or(0)),
            _ => (true, 0, 0),
        };
        let count = s.gpu.count().max(1);
        UsableShape {
            p: s.p,
            cpu_milli: s.cpu_milli,
            whole,
            gpu_memory_mib: mem,
            gpu_core_milli: core,
            count,
            size: gpu_size(&s.gpu, gpu_memory_mib),
            by_cpu: Divisor::new(s.cpu_milli),
            by_memory: Divisor::new(s.memory_mib),
            by_gpu_memory: Divisor::new(mem),
            by_gpu_core: Divisor::new(core as u64),
            by_count: Divisor::new(count as u64),
        }
    }

    #[inline]
    fn fits(&self, g: &GpuState) -> bool {
        if self.whole {
            g.is_idle()
        } else {
            g.healthy && g.memory_free >= self.gpu_memory_mib && g.core_free >= self.gpu_core_milli
        }
    }

    /// Copies (of one GPU's part) that fit on `g`.
    #[inline]
    fn copies(&self, g: &GpuState) -> u16 {
        if self.whole {
            return g.is_idle() as u16;
        }
        if !g.healthy {
            return 0;
        }
        let by_mem = self.by_gpu_memory.div(g.memory_free);
        let by_core = self.by_gpu_core.div(g.core_free as u64);
        by_mem.min(by_core).min(CORE_MILLI_PER_GPU as u64) as u16
    }
}

/// The shapes as seen from one kind of node (GPU model, sharing mode, GPU memory).
#[derive(Debug, Clone, Default)]
struct Kind {
    /// Total probability of the shapes that can never use this node's GPUs.
    never: f64,
    usable: Vec<UsableShape>,
}

/// Per node and usable shape: GPUs the shape fits on, free capacity of the others, copies.
/// 16 bits each: a node has at most [`super::model::MAX_GPUS_PER_NODE`] (64) GPUs of at
/// most 1000 per-mille, so every sum stays below 65,536; six bytes a shape keep the scoring
/// loop's reads of a node's sums to a few cache lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ShapeSum {
    fit: u16,
    small: u16,
    copies: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Summary {
    total: u64,
    cpu_free: u64,
    memory_free: u64,
    per: Vec<ShapeSum>,
}

/// A node's expected fragment under both measures, in per-mille of a GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Frag {
    pub fgd: f64,
    pub repeated: f64,
}

/// At most this many GPUs change in [`FragModel::after`]'s incremental path.
const MAX_CHANGED: usize = 8;

/// A GPU a hypothetical placement changes.
#[derive(Debug, Clone, Copy)]
struct Changed {
    before: GpuState,
    after: GpuState,
    free_before: u16,
    free_after: u16,
}

impl Default for Changed {
    fn default() -> Self {
        Changed {
            before: GpuState::ZERO,
            after: GpuState::ZERO,
            free_before: 0,
            free_after: 0,
        }
    }
}

/// Per-node fragment bookkeeping for one workload.
#[derive(Debug, Clone, Default)]
pub struct FragModel {
    pub workload: Workload,
    /// Keep the repeated measure too (FGD needs only its own).
    repeated: bool,
    kinds: Vec<Kind>,
    /// Node id → index into `kinds`.
    node_kind: Vec<u32>,
    summaries: Vec<Summary>,
    current: Vec<Frag>,
}

pub fn gpu_size(gpu: &GpuDemand, gpu_memory_mib: u64) -> u32 {
    match *gpu {
        GpuDemand::None => 0,
        GpuDemand::Whole { .. } => CORE_MILLI_PER_GPU,
        GpuDemand::Shared {
            memory_mib,
            core_milli,
            ..
        } => {
            let mem = (memory_mib * CORE_MILLI_PER_GPU as u64)
                .checked_div(gpu_memory_mib)
                .unwrap_or(0) as u32;
            mem.max(core_milli.unwrap_or(0))
                .clamp(1, CORE_MILLI_PER_GPU)
        }
    }
}

impl FragModel {
    /// Summaries of all `nodes`; `repeated`: also keep the repeated measure.
    pub fn new(workload: Workload, nodes: &[NodeState], repeated: bool) -> Self {
        let mut m = FragModel {
            workload,
            repeated,
            ..Default::default()
        };
        let mut seen: HashMap<(String, ScheduleMode, u64), u32> = HashMap::new();
        for (id, n) in nodes.iter().enumerate() {
            let gpu_mem = n.gpus.first().map_or(0, |g| g.memory_mib);
            let k = (n.spec.model().to_string(), n.mode(), gpu_mem);
            let kind = match seen.get(&k) {
                Some(&kind) => kind,
                None => {
                    let kind = m.kinds.len() as u32;
                    m.kinds.push(m.kind_for(&k.0, k.1, gpu_mem));
                    seen.insert(k, kind);
                    kind
                }
            };
            m.node_kind.push(kind);
            m.summaries.push(Summary::default());
            m.current.push(Frag::default());
            m.refresh(id, n);
        }
        m
    }

    fn kind_for(&self, model: &str, mode: ScheduleMode, gpu_memory_mib: u64) -> Kind {
        let mut k = Kind::default();
        for s in &self.workload.shapes {
            if usable_on(s, model, mode) {
                k.usable.push(UsableShape::new(s, gpu_memory_mib));
            } else {
                k.never += s.p;
            }
        }
        k
    }

    fn kind(&self, id: usize) -> &Kind {
        &self.kinds[self.node_kind[id] as usize]
    }

    /// Recomputes node `id`'s summary (after it changed).
    pub fn refresh(&mut self, id: usize, node: &NodeState) {
        let kind = self.kind(id);
        let sum = summarize(kind, node, self.repeated);
        let f = value(kind, &sum, self.repeated, |i| sum.per[i]);
        self.summaries[id] = sum;
        self.current[id] = f;
    }

    /// Total probability of the shapes that can never use node `id`'s GPUs.
    pub fn never(&self, id: usize) -> f64 {
        self.kind(id).never
    }

    /// Node `id`'s current value.
    pub fn current(&self, id: usize) -> Frag {
        self.current[id]
    }

    /// Node `id`'s value if a pod of `cpu_milli` and `demand` took `gpus`.
    pub fn after(&self, id: usize, node: &NodeState, req: &Request, gpus: GpuSet) -> Frag {
        let (cpu_milli, memory_mib, demand) = (req.cpu_milli, req.memory_mib, &req.gpu);
        if gpus.len() as usize > MAX_CHANGED {
            // Rare (more than 8 GPUs changing): recompute from scratch.
            let mut copy = node.clone();
            copy.take(req, gpus);
            return self.from_scratch(id, &copy);
        }
        let kind = self.kind(id);
        let sum = &self.summaries[id];
        let mode = node.mode();
        // The GPUs that change: before and after, and their free capacity.
        let mut changed = [Changed::default(); MAX_CHANGED];
        let mut n = 0;
        let mut total = sum.total;
        for i in gpus.iter() {
            let before = node.gpus[i];
            let mut after = before;
            after.take(demand);
            let c = Changed {
                before,
                after,
                free_before: before.free_milli(mode) as u16,
                free_after: after.free_milli(mode) as u16,
            };
            total -= (c.free_before - c.free_after) as u64;
            changed[n] = c;
            n += 1;
        }
        let changed = &changed[..n];
        let after_sum = Summary {
            total,
            cpu_free: sum.cpu_free - cpu_milli,
            memory_free: sum.memory_free - memory_mib,
            per: Vec::new(),
        };
        let repeated = self.repeated;
        value(kind, &after_sum, repeated, |si| {
            let s = &kind.usable[si];
            let mut acc = sum.per[si];
            for c in changed {
                if s.fits(&c.before) {
                    acc.fit -= 1;
                } else {
                    acc.small -= c.free_before;
                }
                if s.fits(&c.after) {
                    acc.fit += 1;
                } else {
                    acc.small += c.free_after;
                }
                if repeated {
                    acc.copies = acc.copies + s.copies(&c.after) - s.copies(&c.before);
                }
            }
            acc
        })
    }

    /// Both measures computed from scratch for a node in the given state (a check of the
    /// incremental bookkeeping).
    pub fn from_scratch(&self, id: usize, node: &NodeState) -> Frag {
        let kind = self.kind(id);
        let sum = summarize(kind, node, self.repeated);
        value(kind, &sum, self.repeated, |i| sum.per[i])
    }
}

/// A node's sums per usable shape.
fn summarize(kind: &Kind, node: &NodeState, repeated: bool) -> Summary {
    let mode = node.mode();
    // Specs from outside input are checked for at most 64 GPUs; the sums fit 16 bits then.
    let gpus = &node.gpus[..node.gpus.len().min(MAX_GPUS_PER_NODE)];
    let free: Vec<u16> = gpus.iter().map(|g| g.free_milli(mode) as u16).collect();
    let mut sum = Summary {
        total: free.iter().map(|&f| f as u64).sum(),
        cpu_free: node.cpu_free,
        memory_free: node.memory_free,
        per: vec![ShapeSum::default(); kind.usable.len()],
    };
    for (s, acc) in kind.usable.iter().zip(sum.per.iter_mut()) {
        for (g, &f) in gpus.iter().zip(&free) {
            if s.fits(g) {
                acc.fit += 1;
            } else {
                acc.small += f;
            }
            if repeated {
                acc.copies += s.copies(g);
            }
        }
    }
    sum
}

/// Both measures (the repeated one only if `repeated`) of a node with free capacity
/// `sum.total`, CPU `sum.cpu_free` and memory `sum.memory_free`; `per(i)` yields shape `i`'s
/// sums.
fn value(kind: &Kind, sum: &Summary, repeated: bool, per: impl Fn(usize) -> ShapeSum) -> Frag {
    let total = sum.total;
    if total == 0 {
        return Frag::default();
    }
    let never = kind.never * total as f64;
    let mut f = Frag {
        fgd: never,
        repeated: if repeated { never } else { 0.0 },
    };
    // Sums below 2⁶³ convert to f64 in one instruction as i64 (the same value as from u64).
    let total_f = total as i64 as f64;
    for (i, s) in kind.usable.iter().enumerate() {
        let acc = per(i);
        if sum.cpu_free < s.cpu_milli {
            f.fgd += s.p * total_f;
            if repeated {
                f.repeated += s.p * total_f;
            }
            continue;
        }
        let fgd = if acc.fit as u32 >= s.count {
            acc.small as f64
        } else {
            total_f
        };
        f.fgd += s.p * fgd;
        if !repeated {
            continue;
        }
        let by_cpu = s.by_cpu.div(sum.cpu_free);
        let by_mem = s.by_memory.div(sum.memory_free);
        let copies = s.by_count.div(acc.copies as u64).min(by_cpu).min(by_mem);
        let used = copies.saturating_mul(s.count as u64 * s.size as u64);
        f.repeated += s.p * total.saturating_sub(used) as i64 as f64;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::model::NodeSpec;
    use crate::placement::model::tests::share;
    use crate::placement::state::lowest;

    fn whole(cpu: u64, count: u32) -> Request {
        Request {
            gpu: GpuDemand::Whole { count },
            ..Request::cpu_only("w", cpu, 0)
        }
    }

    fn node(gpus: usize, cpu: u64) -> NodeState {
        NodeState::new(NodeSpec::uniform(
            "n",
            cpu,
            1 << 20,
            gpus,
            16_000,
            "T4",
            ScheduleMode::CoreMem,
        ))
    }

    #[test]
    fn divisor_matches_hardware_division() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let edges = [
            0u64,
            1,
            2,
            3,
            7,
            999,
            1000,
            1024,
            81_920,
            (1 << 32) - 1,
            1 << 32,
        ];
        let mut divisors: Vec<u64> = edges.to_vec();
        divisors.extend((0..200).map(|_| next() >> (next() % 64)));
        let mut xs: Vec<u64> = edges.to_vec();
        xs.extend([u64::MAX, u64::MAX - 1, (1 << 32) + 5]);
        xs.extend((0..2000).map(|_| next() >> (next() % 64)));
        for &d in &divisors {
            let div = Divisor::new(d);
            for &x in &xs {
                assert_eq!(
                    div.div(x),
                    x.checked_div(d).unwrap_or(u64::MAX),
                    "{x} / {d}"
                );
            }
            // Around multiples of d, where rounding would show.
            for k in [1u64, 2, 3, 1000, 65_535] {
                let Some(m) = k.checked_mul(d).filter(|&m| m < 1 << 32) else {
                    continue;
                };
                for x in [m, m.saturating_sub(1), m + 1] {
                    if d < 1 << 32 && x < 1 << 32 {
                        assert_eq!(div.div(x), x.checked_div(d).unwrap_or(u64::MAX));
                    }
                }
            }
        }
    }

    #[test]
    fn fgd_measure_by_hand() {
        // Shapes: 50 % a 500-milli share (2 CPUs), 25 % one whole GPU, 25 % CPU-only.
        let reqs = [
            share(2000, 500),
            share(2000, 500),
            whole(1000, 1),
            Request::cpu_only("c", 1000, 0),
        ];
        let w = Workload::from_requests(&reqs, 1.0);
        let mut n = node(2, 8000);
        // GPU 0: 300 left; GPU 1 idle.
        n.take(&share(1000, 700), GpuSet::single(0));
        let m = FragModel::new(w, std::slice::from_ref(&n), true);
        let f = m.current(0);
        // total 1300; share: GPU 0 too small → 300; whole: fits on GPU 1 → 300; CPU-only → 1300.
        assert!(
            (f.fgd - (0.5 * 300.0 + 0.25 * 300.0 + 0.25 * 1300.0)).abs() < 1e-9,
            "{f:?}"
        );
        // repeated: share: 2 copies (GPU 1), CPU allows 3 → uses 1000, leaves 300;
        // whole: 1 copy → leaves 300; CPU-only: 1300.
        assert!((f.repeated - (0.5 * 300.0 + 0.25 * 300.0 + 0.25 * 1300.0)).abs() < 1e-9);
        // With 3 CPUs left only one share copy fits: it leaves 800.
        let mut low = n.clone();
        low.cpu_free = 3000;
        let f = m.from_scratch(0, &low);
        assert!(
            (f.repeated - (0.5 * 800.0 + 0.25 * 300.0 + 0.25 * 1300.0)).abs() < 1e-9,
            "{f:?}"
        );
        assert!((f.fgd - (0.5 * 300.0 + 0.25 * 300.0 + 0.25 * 1300.0)).abs() < 1e-9);
    }

    #[test]
    fn incremental_value_matches_recomputation() {
        let reqs = [
            share(2000, 500),
            share(1000, 250),
            share(4000, 810),
            whole(8000, 1),
            whole(16000, 2),
            Request::cpu_only("c", 3000, 0),
        ];
        let w = Workload::from_requests(&reqs, 1.0);
        let mut n = node(4, 32_000);
        let mut m = FragModel::new(w, std::slice::from_ref(&n), true);
        let steps = [
            share(2000, 500),
            share(1000, 250),
            whole(8000, 1),
            share(4000, 810),
            share(1000, 250),
            share(2000, 500),
        ];
        for r in &steps {
            let fit = n.check(r).unwrap();
            for i in fit.iter() {
                let gpus = match r.gpu {
                    GpuDemand::Whole { count } => lowest(fit, count),
                    _ => GpuSet::single(i),
                };
                let mut copy = n.clone();
                copy.take(r, gpus);
                let want = m.from_scratch(0, &copy);
                let got = m.after(0, &n, r, gpus);
                assert!(
                    (want.fgd - got.fgd).abs() < 1e-9
                        && (want.repeated - got.repeated).abs() < 1e-9,
                    "{want:?} vs {got:?}"
                );
            }
            let gpus = crate::placement::policy::packed_gpus(&n, r, fit);
            n.take(r, gpus);
            m.refresh(0, &n);
        }
    }
}
