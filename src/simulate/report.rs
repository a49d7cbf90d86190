//! Aggregation over seeds, the printed table, the JSON document and the published reference
//! numbers (FGD paper artifact, `bench/PACKING.md`).

use serde_json::{Value, json};

use super::replay::{Run, Trace};

/// The arrived loads (percent of capacity) the table reports.
pub const LOADS: [usize; 5] = [90, 95, 100, 110, 130];

/// Median (mean of the middle two for an even count), min and max.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    fn json(&self) -> Value {
        json!({"median": round2(self.median), "min": round2(self.min), "max": round2(self.max)})
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Nearest-rank percentile of sorted `v`.
pub fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One policy over all seeds.
#[derive(Debug, Clone)]
pub struct PolicyResult {
    pub policy: String,
    /// Per entry of [`LOADS`].
    pub unallocated: Vec<Option<Stat>>,
    /// The seeds, ascending, and per entry of [`LOADS`] each seed's unallocated % (`None`:
    /// that run never reached the load), for comparisons seed by seed (`bench/pack_paired.py`).
    pub seeds: Vec<u64>,
    pub per_seed: Vec<Vec<Option<f64>>>,
    /// Per arrived load 0..=max (percent): unallocated % over seeds.
    pub curve: Vec<(usize, Stat)>,
    pub decision_p50_us: f64,
    pub decision_p99_us: f64,
    pub decision_max_us: f64,
    pub attempts: usize,
    pub failed: usize,
}

impl PolicyResult {
    pub fn from_runs(policy: &str, runs: &[Run]) -> Self {
        let at = |load: usize| -> Vec<f64> {
            runs.iter().filter_map(|r| r.unallocated_at(load)).collect()
        };
        let max_load = runs
            .iter()
            .map(|r| r.allocated_pct.len())
            .max()
            .unwrap_or(0);
        let mut ns: Vec<u64> = runs
            .iter()
            .flat_map(|r| r.decision_ns.iter().copied())
            .collect();
        ns.sort_unstable();
        let mut by_seed: Vec<&Run> = runs.iter().collect();
        by_seed.sort_by_key(|r| r.seed);
        PolicyResult {
            policy: policy.to_string(),
            unallocated: LOADS.iter().map(|&l| Stat::of(&at(l))).collect(),
            seeds: by_seed.iter().map(|r| r.seed).collect(),
            per_seed: LOADS
                .iter()
                .map(|&l| by_seed.iter().map(|r| r.unallocated_at(l)).collect())
                .collect(),
            curve: (0..max_load)
                .filter_map(|l| Stat::of(&at(l)).map(|s| (l, s)))
                .collect(),
            decision_p50_us: percentile(&ns, 0.50) as f64 / 1000.0,
            decision_p99_us: percentile(&ns, 0.99) as f64 / 1000.0,
            decision_max_us: ns.last().copied().unwrap_or(0) as f64 / 1000.0,
            attempts: runs.iter().map(|r| r.attempts).sum(),
            failed: runs.iter().map(|r| r.failed).sum(),
        }
    }

    pub fn json(&self) -> Value {
        let mut un = serde_json::Map::new();
        for ((l, s), v) in LOADS.iter().zip(&self.unallocated).zip(&self.per_seed) {
            if let Some(s) = s {
                let mut o = s.json();
                o["per_seed"] = json!(v.iter().map(|x| x.map(round2)).collect::<Vec<_>>());
                un.insert(l.to_string(), o);
            }
        }
        json!({
            "policy": self.policy,
            "seeds": self.seeds,
            "unallocated_pct": un,
            "decision_us": {
                "p50": round2(self.decision_p50_us),
                "p99": round2(self.decision_p99_us),
                "max": round2(self.decision_max_us),
            },
            "attempts": self.attempts,
            "failed": self.failed,
            "curve": {
                "load_pct": self.curve.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
                "median": self.curve.iter().map(|(_, s)| round2(s.median)).collect::<Vec<_>>(),
                "min": self.curve.iter().map(|(_, s)| round2(s.min)).collect::<Vec<_>>(),
                "max": self.curve.iter().map(|(_, s)| round2(s.max)).collect::<Vec<_>>(),
            },
        })
    }
}

/// Published medians of unallocated GPU % (FGD paper artifact): (policy, [(load, value)]).
pub fn published(trace: &str) -> Vec<(&'static str, Vec<(usize, f64)>)> {
    let at100 =
        |bestfit: f64, fgd: f64| vec![("BestFit", vec![(100, bestfit)]), ("FGD", vec![(100, fgd)])];
    match trace {
        "default" => vec![
            (
                "BestFit",
                vec![(95, 7.14), (100, 7.09), (110, 7.02), (130, 6.89)],
            ),
            (
                "FGD",
                vec![(95, 5.09), (100, 4.77), (110, 4.68), (130, 4.60)],
            ),
        ],
        "gpushare40" => at100(8.53, 6.05),
        "gpushare60" => at100(10.91, 8.70),
        "gpushare80" => at100(13.27, 10.91),
        "gpushare100" => at100(15.40, 13.36),
        _ => Vec::new(),
    }
}

/// The whole report of one trace.
#[derive(Debug, Clone)]
pub struct TraceReport {
    pub trace: String,
    pub nodes: usize,
    pub gpus: usize,
    pub pods: usize,
    pub shapes: usize,
    pub seeds: Vec<u64>,
    pub results: Vec<PolicyResult>,
    /// (policy, seed, node states and failed pods) of each replay, when asked for
    /// ([`super::run_variant`]'s `opts.state_at`).
    pub states: Vec<(String, u64, super::StateAt)>,
    /// The replays' `opts.search_nodes` (`None`: every node a candidate).
    pub search_nodes: Option<usize>,
    /// The replays' `opts.as_extender`.
    pub as_extender: bool,
}

impl TraceReport {
    pub fn new(trace: &Trace, seeds: Vec<u64>, results: Vec<PolicyResult>) -> Self {
        TraceReport {
            trace: trace.name.clone(),
            nodes: trace.nodes.len(),
            gpus: trace.gpus(),
            pods: trace.pods.len(),
            shapes: trace.workload.shapes.len(),
            seeds,
            results,
            states: Vec::new(),
            search_nodes: None,
            as_extender: false,
        }
    }

    pub fn json(&self) -> Value {
        let published: serde_json::Map<String, Value> = published(&self.trace)
            .into_iter()
            .map(|(p, v)| {
                let m: serde_json::Map<String, Value> = v
                    .into_iter()
                    .map(|(l, x)| (l.to_string(), json!(x)))
                    .collect();
                (p.to_string(), Value::Object(m))
            })
            .collect();
        json!({
            "trace": self.trace,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "pods": self.pods,
            "typical_shapes": self.shapes,
            "seeds": self.seeds,
            "search_nodes": self.search_nodes,
            "as_extender": self.as_extender,
            "results": self.results.iter().map(PolicyResult::json).collect::<Vec<_>>(),
            "published": published,
        })
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let seeds = match (self.seeds.first(), self.seeds.last()) {
            (Some(a), Some(b)) if a != b => format!("seeds {a}–{b} ({})", self.seeds.len()),
            (Some(a), _) => format!("seed {a}"),
            _ => "no seeds".into(),
        };
        s.push_str(&format!(
            "trace {}: {} nodes, {} GPUs, {} pods ({} typical shapes), {}\n",
            self.trace, self.nodes, self.gpus, self.pods, self.shapes, seeds
        ));
        s.push_str("unallocated GPU % at arrived load, median [min–max] over seeds; decision time per pod\n");
        s.push_str(&format!("{:<18}", "policy"));
        for l in LOADS {
            s.push_str(&format!("{:>20}", format!("{l}%")));
        }
        s.push_str(&format!("{:>22}\n", "p50 / p99 µs"));
        for r in &self.results {
            s.push_str(&format!("{:<18}", r.policy));
            for st in &r.unallocated {
                let cell = st.map_or("—".to_string(), |st| {
                    format!("{:.2} [{:.2}–{:.2}]", st.median, st.min, st.max)
                });
                s.push_str(&format!("{cell:>20}"));
            }
            s.push_str(&format!(
                "{:>22}\n",
                format!("{:.0} / {:.0}", r.decision_p50_us, r.decision_p99_us)
            ));
        }
        for (p, v) in published(&self.trace) {
            s.push_str(&format!("{:<18}", format!("published {p}")));
            for l in LOADS {
                let cell = v
                    .iter()
                    .find(|(x, _)| *x == l)
                    .map_or("—".to_string(), |(_, x)| format!("{x:.2}"));
                s.push_str(&format!("{cell:>20}"));
            }
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_percentiles() {
        let s = Stat::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        assert_eq!(Stat::of(&[5.0, 1.0, 3.0]).unwrap().median, 3.0);
        assert!(Stat::of(&[]).is_none());
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.99)), (50, 99));
        assert_eq!(percentile(&[7], 0.99), 7);
    }
}
