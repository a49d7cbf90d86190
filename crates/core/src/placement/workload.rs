//! The "typical pods" of a workload: the most frequent request shapes and how likely each is,
//! which the fragmentation-aware policies use to judge what a node's free GPU capacity is
//! still good for.

use std::collections::HashMap;

use super::model::{CORE_MILLI_PER_GPU, GpuDemand, Request};

/// One request shape and its probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub cpu_milli: u64,
    /// Mean host memory of the pods of this shape.
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    /// Accepted GPU models; empty: any.
    pub models: Vec<String>,
    pub p: f64,
}

impl Shape {
    /// GPU per-mille the shape takes from each of its GPUs (for ordering and reports).
    pub fn gpu_milli(&self) -> u32 {
        match self.gpu {
            GpuDemand::None => 0,
            GpuDemand::Whole { .. } => CORE_MILLI_PER_GPU,
            GpuDemand::Shared { core_milli, .. } => core_milli.unwrap_or(0),
        }
    }
}

/// Typical shapes, most frequent first, probabilities summing to 1 (empty: nothing known).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub shapes: Vec<Shape>,
}

type Key = (u64, u32, u64, u32, bool, Vec<String>);

fn key(r: &Request) -> Key {
    let (milli, mem, count, whole) = match r.gpu {
        GpuDemand::None => (0, 0, 0, false),
        GpuDemand::Whole { count } => (CORE_MILLI_PER_GPU, 0, count, true),
        GpuDemand::Shared {
            count,
            memory_mib,
            core_milli,
        } => (core_milli.unwrap_or(0), memory_mib, count, false),
    };
    let mut models = r.models.clone();
    models.sort();
    (r.cpu_milli, milli, mem, count, whole, models)
}

impl Workload {
    /// Groups `requests` by shape (CPU, GPU demand, accepted models), sorts the shapes by
    /// frequency (then by CPU, GPU share, GPU count, models, all descending, so equal counts
    /// order the same way every time), keeps the shortest prefix that covers `coverage`
    /// (0–1) of the requests and renormalises it.
    pub fn from_requests<'a>(
        requests: impl IntoIterator<Item = &'a Request>,
        coverage: f64,
    ) -> Self {
        let mut counts: HashMap<Key, (usize, &'a Request, u64)> = HashMap::new();
        let mut total = 0usize;
        for r in requests {
            let e = counts.entry(key(r)).or_insert((0, r, 0));
            e.0 += 1;
            e.2 += r.memory_mib;
            total += 1;
        }
        if total == 0 {
            return Workload::default();
        }
        let mut v: Vec<(Key, usize, &Request, u64)> = counts
            .into_iter()
            .map(|(k, (c, r, m))| (k, c, r, m / c as u64))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let want = coverage.clamp(0.0, 1.0) * total as f64;
        let mut kept = 0usize;
        let mut n = 0;
        while n < v.len() && (kept as f64) < want {
            kept += v[n].1;
            n += 1;
        }
        let shapes = v[..n]
            .iter()
            .map(|(_, c, r, m)| Shape {
                cpu_milli: r.cpu_milli,
                memory_mib: *m,
                gpu: r.gpu,
                models: r.models.clone(),
                p: *c as f64 / kept as f64,
            })
            .collect();
        Workload { shapes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::model::tests::share;

    #[test]
    fn keeps_the_most_frequent_shapes_covering_the_threshold() {
        let mut reqs = Vec::new();
        reqs.extend(std::iter::repeat_n(share(4000, 500), 6));
        reqs.extend(std::iter::repeat_n(Request::cpu_only("c", 8000, 0), 3));
        reqs.push(share(1000, 250));
        let w = Workload::from_requests(&reqs, 0.9);
        assert_eq!(w.shapes.len(), 2);
        assert_eq!(w.shapes[0].gpu_milli(), 500);
        assert!((w.shapes[0].p - 6.0 / 9.0).abs() < 1e-12);
        assert_eq!(w.shapes[1].gpu, GpuDemand::None);
        let all = Workload::from_requests(&reqs, 1.0);
        assert_eq!(all.shapes.len(), 3);
        let sum: f64 = all.shapes.iter().map(|s| s.p).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        assert!(Workload::from_requests(&[], 0.95).shapes.is_empty());
    }

    #[test]
    fn equal_counts_order_by_shape_descending() {
        let reqs = [share(1000, 250), share(1000, 500), share(2000, 100)];
        let w = Workload::from_requests(&reqs, 1.0);
        let order: Vec<(u64, u32)> = w
            .shapes
            .iter()
            .map(|s| (s.cpu_milli, s.gpu_milli()))
            .collect();
        assert_eq!(order, vec![(2000, 100), (1000, 500), (1000, 250)]);
    }
}
