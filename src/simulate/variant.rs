//! Stress variants of a trace (`gpushare simulate --variant`): the same pods with some of them
//! made harder to place, derived from the trace itself and deterministic per seed.
//!
//! A variant is a comma-separated list of `kind:F`, F a fraction in [0, 1]:
//!
//! - `model:F` — a fraction F of the GPU pods is constrained (`gpu_spec`) to one GPU model,
//!   drawn from the models of the node list weighted by their GPUs (among the models with a
//!   node that could hold the pod alone: enough GPUs, CPU and memory);
//! - `multigpu:F` — a fraction F of the GPU pods becomes whole-GPU pods of 2, 4 or 8 GPUs
//!   (equally likely; at most the largest node's GPU count), CPU and memory unchanged;
//! - `cpuheavy:F` — a fraction F of all pods asks for 4× its CPU, capped by the largest CPU
//!   of a node with enough GPUs for it;
//! - `none` — the trace as it is.
//!
//! The pods of each kind are a uniform sample of exactly round(F × eligible) pods, each kind
//! with its own random stream of the seed (so `model:0.3` picks the same pods alone and
//! combined). They apply in the order multigpu, model, cpuheavy. The typical shapes the
//! policies use are recomputed from the varied pod list.

use std::fmt;

use super::replay::Trace;
use super::rng::Rng;
use super::trace::TracePod;
use gpushare_core::placement::NodeSpec;

/// CPU multiplier of `cpuheavy`.
pub const CPU_FACTOR: u64 = 4;
/// GPU counts `multigpu` draws from.
pub const MULTI_GPU_COUNTS: [u32; 3] = [2, 4, 8];

/// One parsed `--variant` value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Variant {
    pub model: f64,
    pub multigpu: f64,
    pub cpuheavy: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VariantError {
    #[error("variant {spec:?}: {part:?} is not kind:F (kinds: model, multigpu, cpuheavy; or none)")]
    Syntax { spec: String, part: String },
    #[error("variant {spec:?}: unknown kind {kind:?} (known: model, multigpu, cpuheavy, none)")]
    UnknownKind { spec: String, kind: String },
    #[error("variant {spec:?}: {kind} fraction {value:?} is not a number in [0, 1]")]
    BadFraction {
        spec: String,
        kind: String,
        value: String,
    },
    #[error("variant {spec:?}: {kind} is given twice")]
    Repeated { spec: String, kind: String },
}

impl Variant {
    /// Parses `model:0.3,multigpu:0.2` (or `none`).
    pub fn parse(spec: &str) -> Result<Variant, VariantError> {
        let mut v = Variant::default();
        let mut seen: Vec<&str> = Vec::new();
        let trimmed = spec.trim();
        if trimmed == "none" {
            return Ok(v);
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            let Some((kind, value)) = part.split_once(':') else {
                return Err(VariantError::Syntax {
                    spec: spec.to_string(),
                    part: part.to_string(),
                });
            };
            let (kind, value) = (kind.trim(), value.trim());
            let slot = match kind {
                "model" => &mut v.model,
                "multigpu" => &mut v.multigpu,
                "cpuheavy" => &mut v.cpuheavy,
                _ => {
                    return Err(VariantError::UnknownKind {
                        spec: spec.to_string(),
                        kind: kind.to_string(),
                    });
                }
            };
            if seen.contains(&kind) {
                return Err(VariantError::Repeated {
                    spec: spec.to_string(),
                    kind: kind.to_string(),
                });
            }
            seen.push(kind);
            *slot = match value.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => f,
                _ => {
                    return Err(VariantError::BadFraction {
                        spec: spec.to_string(),
                        kind: kind.to_string(),
                        value: value.to_string(),
                    });
                }
            };
        }
        Ok(v)
    }

    pub fn is_none(&self) -> bool {
        *self == Variant::default()
    }

    /// `trace`'s pods varied for `seed` (the node list is unchanged), named
    /// `<trace>+<variant>`.
    pub fn apply(&self, trace: &Trace, seed: u64, coverage: f64) -> Trace {
        let mut pods = trace.pods.clone();
        let nodes = &trace.nodes;
        if self.multigpu > 0.0 {
            let max_gpus = nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0);
            let counts: Vec<u32> = MULTI_GPU_COUNTS
                .iter()
                .copied()
                .filter(|&c| c <= max_gpus)
                .collect();
            if !counts.is_empty() {
                let mut rng = Rng::new(seed, STREAM_MULTIGPU);
                for i in sample(&mut rng, &pods, self.multigpu, |p| p.num_gpu > 0) {
                    let c = counts[rng.below(counts.len() as u64) as usize];
                    pods[i].num_gpu = c;
                    pods[i].gpu_milli = 1000;
                }
            }
        }
        if self.model > 0.0 {
            let mut rng = Rng::new(seed, STREAM_MODEL);
            let models = model_gpus(nodes);
            for i in sample(&mut rng, &pods, self.model, |p| p.num_gpu > 0) {
                let p = &pods[i];
                let able: Vec<(&str, u64)> = models
                    .iter()
                    .filter(|(m, _)| {
                        nodes.iter().any(|n| {
                            n.model() == *m
                                && n.gpus.len() as u32 >= p.num_gpu
                                && n.cpu_milli >= p.cpu_milli
                                && n.memory_mib >= p.memory_mib
                        })
                    })
                    .map(|(m, g)| (m.as_str(), *g))
                    .collect();
                let total: u64 = able.iter().map(|(_, g)| g).sum();
                if total == 0 {
                    continue;
                }
                let mut r = rng.below(total);
                let mut pick = able[0].0;
                for (m, g) in &able {
                    if r < *g {
                        pick = m;
                        break;
                    }
                    r -= g;
                }
                pods[i].gpu_spec = vec![pick.to_string()];
            }
        }
        if self.cpuheavy > 0.0 {
            let mut rng = Rng::new(seed, STREAM_CPUHEAVY);
            for i in sample(&mut rng, &pods, self.cpuheavy, |_| true) {
                let p = &pods[i];
                let cap = nodes
                    .iter()
                    .filter(|n| n.gpus.len() as u32 >= p.num_gpu)
                    .map(|n| n.cpu_milli)
                    .max()
                    .unwrap_or(p.cpu_milli);
                let heavy = (p.cpu_milli * CPU_FACTOR).min(cap).max(p.cpu_milli);
                pods[i].cpu_milli = heavy;
            }
        }
        Trace::new(
            &format!("{}+{}", trace.name, self),
            nodes.clone(),
            pods,
            coverage,
        )
    }
}

const STREAM_MULTIGPU: u64 = 101;
const STREAM_MODEL: u64 = 102;
const STREAM_CPUHEAVY: u64 = 103;

/// Exactly round(`fraction` × eligible) indices of `pods` among those `eligible`, uniformly.
fn sample(
    rng: &mut Rng,
    pods: &[TracePod],
    fraction: f64,
    eligible: impl Fn(&TracePod) -> bool,
) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..pods.len()).filter(|&i| eligible(&pods[i])).collect();
    let n = (fraction * idx.len() as f64).round() as usize;
    rng.shuffle(&mut idx);
    idx.truncate(n);
    idx.sort_unstable();
    idx
}

/// The node list's GPU models and their GPU counts, by name.
fn model_gpus(nodes: &[NodeSpec]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    for n in nodes {
        let m = n.model();
        if n.gpus.is_empty() || m.is_empty() {
            continue;
        }
        match v.iter_mut().find(|(x, _)| x == m) {
            Some(e) => e.1 += n.gpus.len() as u64,
            None => v.push((m.to_string(), n.gpus.len() as u64)),
        }
    }
    v.sort();
    v
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("model", self.model),
            ("multigpu", self.multigpu),
            ("cpuheavy", self.cpuheavy),
        ]
        .iter()
        .filter(|(_, x)| *x > 0.0)
        .map(|(k, x)| format!("{k}:{x}"))
        .collect();
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::trace::TRACE_GPU_MEMORY_MIB;
    use gpushare_core::placement::ScheduleMode;

    fn trace() -> Trace {
        let mut nodes = Vec::new();
        for i in 0..20 {
            let (gpus, cpu, model) = match i % 4 {
                0 => (8, 96_000, "G2"),
                1 => (2, 64_000, "P100"),
                2 => (4, 32_000, "T4"),
                _ => (8, 128_000, "V100M32"),
            };
            nodes.push(NodeSpec::uniform(
                format!("n{i:02}"),
                cpu,
                262_144,
                gpus,
                TRACE_GPU_MEMORY_MIB,
                model,
                ScheduleMode::CoreMem,
            ));
        }
        let pods = (0..1000)
            .map(|i| TracePod {
                name: format!("p{i:04}"),
                cpu_milli: 4000 + (i % 7) * 1000,
                memory_mib: 8192,
                num_gpu: if i % 5 == 0 { 0 } else { 1 },
                gpu_milli: if i % 5 == 0 {
                    0
                } else {
                    250 + (i % 4) as u32 * 250
                },
                gpu_spec: Vec::new(),
            })
            .collect();
        Trace::new("t", nodes, pods, 0.95)
    }

    #[test]
    fn parse_accepts_fractions_and_names_bad_values() {
        let v = Variant::parse("model:0.3, multigpu:0.2,cpuheavy:0.1").unwrap();
        assert_eq!((v.model, v.multigpu, v.cpuheavy), (0.3, 0.2, 0.1));
        assert_eq!(v.to_string(), "model:0.3,multigpu:0.2,cpuheavy:0.1");
        assert!(Variant::parse("none").unwrap().is_none());
        let e = Variant::parse("model:2").unwrap_err().to_string();
        assert_eq!(
            e,
            "variant \"model:2\": model fraction \"2\" is not a number in [0, 1]"
        );
        let e = Variant::parse("multigpu:x").unwrap_err().to_string();
        assert!(e.contains("multigpu fraction \"x\""), "{e}");
        let e = Variant::parse("model:-0.1").unwrap_err().to_string();
        assert!(e.contains("\"-0.1\""), "{e}");
        let e = Variant::parse("gpu:0.3").unwrap_err().to_string();
        assert!(e.contains("unknown kind \"gpu\""), "{e}");
        let e = Variant::parse("model").unwrap_err().to_string();
        assert!(e.contains("\"model\" is not kind:F"), "{e}");
        let e = Variant::parse("model:0.1,model:0.2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("model is given twice"), "{e}");
        assert!(Variant::parse("").is_err());
    }

    #[test]
    fn apply_is_deterministic_per_seed() {
        let t = trace();
        let v = Variant::parse("model:0.3,multigpu:0.3,cpuheavy:0.3").unwrap();
        let a = v.apply(&t, 42, 0.95);
        assert_eq!(a.pods, v.apply(&t, 42, 0.95).pods);
        assert_ne!(a.pods, v.apply(&t, 43, 0.95).pods);
        assert_eq!(a.name, "t+model:0.3,multigpu:0.3,cpuheavy:0.3");
        assert_eq!(a.nodes, t.nodes);
        assert_eq!(Variant::default().apply(&t, 42, 0.95).pods, t.pods);
        // Each kind has its own stream: model:0.3 alone picks the same pods.
        let alone = Variant::parse("model:0.3").unwrap().apply(&t, 42, 0.95);
        let picked = |x: &Trace| -> Vec<usize> {
            (0..x.pods.len())
                .filter(|&i| !x.pods[i].gpu_spec.is_empty())
                .collect()
        };
        let both = Variant::parse("model:0.3,cpuheavy:0.3")
            .unwrap()
            .apply(&t, 42, 0.95);
        assert_eq!(picked(&alone), picked(&both));
    }

    #[test]
    fn apply_changes_the_given_fractions() {
        let t = trace();
        let gpu_pods = t.pods.iter().filter(|p| p.num_gpu > 0).count();
        assert_eq!(gpu_pods, 800);
        let m = Variant::parse("model:0.3").unwrap().apply(&t, 7, 0.95);
        let constrained: Vec<&TracePod> =
            m.pods.iter().filter(|p| !p.gpu_spec.is_empty()).collect();
        assert_eq!(constrained.len(), 240);
        assert!(
            constrained
                .iter()
                .all(|p| p.num_gpu > 0 && p.gpu_spec.len() == 1)
        );
        // Weighted by GPUs: G2 and V100M32 have 40 each, T4 20, P100 10 (of 110).
        let count = |m: &str| constrained.iter().filter(|p| p.gpu_spec[0] == m).count();
        assert!(count("G2") > count("P100") * 2, "{}", count("P100"));
        assert!(count("P100") > 0);
        // Only the constraint changed.
        for (a, b) in m.pods.iter().zip(&t.pods) {
            assert_eq!(
                (a.cpu_milli, a.num_gpu, a.gpu_milli),
                (b.cpu_milli, b.num_gpu, b.gpu_milli)
            );
        }

        let g = Variant::parse("multigpu:0.25").unwrap().apply(&t, 7, 0.95);
        let multi: Vec<&TracePod> = g.pods.iter().filter(|p| p.num_gpu > 1).collect();
        assert_eq!(multi.len(), 200);
        assert!(
            multi
                .iter()
                .all(|p| p.gpu_milli == 1000 && [2, 4, 8].contains(&p.num_gpu))
        );
        for c in [2, 4, 8] {
            assert!(multi.iter().any(|p| p.num_gpu == c), "no {c}-GPU pod");
        }
        assert_eq!(g.pods.iter().filter(|p| p.num_gpu == 0).count(), 200);

        let c = Variant::parse("cpuheavy:0.5").unwrap().apply(&t, 7, 0.95);
        let heavy = c
            .pods
            .iter()
            .zip(&t.pods)
            .filter(|(a, b)| a.cpu_milli != b.cpu_milli)
            .count();
        assert_eq!(heavy, 500);
        for (a, b) in c.pods.iter().zip(&t.pods) {
            assert!(a.cpu_milli == b.cpu_milli || a.cpu_milli == b.cpu_milli * 4);
        }
        // Capped by the largest node: 40 000 × 4 would be 160 000 > 128 000.
        let mut big = t.clone();
        big.pods[0].cpu_milli = 40_000;
        let c = Variant::parse("cpuheavy:1").unwrap().apply(&big, 7, 0.95);
        assert_eq!(c.pods[0].cpu_milli, 128_000);
    }
}
