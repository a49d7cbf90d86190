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

/// The typical shapes as the scheduler extender learns them while it places pods: from the
/// GPU pods it reserved, after those it found bound at start-up ([`ShapeLearner::seed`]; the
/// last [`ShapeLearner::WINDOW`] at most), refreshed after the 8th,
/// 16th, 32nd … reservation while the window fills (the first pods change the estimate
/// most), then every half window. A refresh rebuilds the extender's engine, so it is kept
/// rare. `gpushare simulate --as-extender` learns the same way.
#[derive(Debug, Clone, Default)]
pub struct ShapeLearner {
    recent: Vec<Request>,
    reserved: u64,
}

impl ShapeLearner {
    /// How many recent requests the typical shapes are drawn from.
    pub const WINDOW: usize = 4096;

    /// The share of the recent requests the typical shapes cover.
    pub const COVERAGE: f64 = 0.95;

    /// Records a reserved GPU pod's request. True when the typical shapes are due for a
    /// refresh ([`ShapeLearner::workload`]).
    pub fn record(&mut self, r: &Request) -> bool {
        self.recent.push(r.clone());
        if self.recent.len() > Self::WINDOW {
            self.recent.drain(..Self::WINDOW / 2);
        }
        self.reserved += 1;
        Self::due(self.reserved)
    }

    /// Takes `requests` as recent ones without counting them as reservations (the refresh
    /// cadence is unchanged): the pods the extender finds holding GPUs when it starts, the
    /// best guess of the workload until its own reservations refresh the shapes. The window
    /// keeps the last [`ShapeLearner::WINDOW`] of them.
    pub fn seed(&mut self, requests: impl IntoIterator<Item = Request>) {
        self.recent.extend(requests);
        let over = self.recent.len().saturating_sub(Self::WINDOW);
        self.recent.drain(..over);
    }

    /// Whether the shapes are refreshed after the `n`-th reservation.
    pub fn due(n: u64) -> bool {
        let half = (Self::WINDOW / 2) as u64;
        if n < half {
            n >= 8 && n.is_power_of_two()
        } else {
            n.is_multiple_of(half)
        }
    }

    /// The requests the shapes are drawn from, oldest first.
    pub fn recent(&self) -> &[Request] {
        &self.recent
    }

    /// The typical shapes of the recent requests ([`Workload::from_requests`] with
    /// [`ShapeLearner::COVERAGE`]).
    pub fn workload(&self) -> Workload {
        Workload::from_requests(&self.recent, Self::COVERAGE)
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
    fn learned_shapes_are_refreshed_often_at_first_then_every_half_window() {
        let due: Vec<u64> = (1..=6144).filter(|&n| ShapeLearner::due(n)).collect();
        assert_eq!(due, [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144]);
        let mut l = ShapeLearner::default();
        assert!(l.workload().shapes.is_empty(), "nothing known at first");
        let mut refreshes = Vec::new();
        for n in 1..=ShapeLearner::WINDOW as u64 + 1 {
            // 500-milli shares first, then 250-milli ones.
            let r = if n <= 2048 {
                share(4000, 500)
            } else {
                share(2000, 250)
            };
            if l.record(&r) {
                refreshes.push(n);
            }
        }
        assert_eq!(refreshes, [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]);
        // Past the window, the older half is dropped: only the recent 250-milli pods remain.
        assert_eq!(l.recent().len(), ShapeLearner::WINDOW / 2 + 1);
        let w = l.workload();
        assert_eq!(w.shapes.len(), 1, "{w:?}");
        assert_eq!(w.shapes[0].gpu_milli(), 250);
    }

    #[test]
    fn seeded_requests_count_as_recent_but_not_as_reservations() {
        let mut l = ShapeLearner::default();
        l.seed(std::iter::repeat_n(
            share(4000, 500),
            ShapeLearner::WINDOW + 10,
        ));
        assert_eq!(l.recent().len(), ShapeLearner::WINDOW, "the window holds");
        assert_eq!(l.workload().shapes[0].gpu_milli(), 500);
        // The first refresh still comes with the 8th reservation, over seeded and own pods.
        let due: Vec<bool> = (0..8).map(|_| l.record(&share(2000, 250))).collect();
        assert_eq!(due, [false, false, false, false, false, false, false, true]);
        assert_eq!(l.recent().len(), ShapeLearner::WINDOW / 2 + 8);
        let w = l.workload();
        assert_eq!(w.shapes[0].gpu_milli(), 500, "{w:?}");
    }

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
