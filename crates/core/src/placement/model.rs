//! Plain data the placement engine works on: nodes and their GPUs (with the two node labels),
//! and what a pod asks for.
//!
//! Units: memory in MiB; compute ("core") in per-mille of one GPU, so a GPU has 1000 and
//! `gpu-core.percentage: 30` is 300. Per-mille lets the trace replay place openb's
//! `gpu_milli` exactly; requests coming from pod limits are still checked to be a multiple of
//! 5 percent in [5, 100] ([`Request::from_quantities`]).

use std::collections::HashMap;

use crate::echo::Echo;
use crate::request::{
    GpuQuantities, MAX_MEMORY_MIB, RequestError, ResourceNames, validate_core_percent,
};

/// Compute capacity of one GPU in per-mille.
pub const CORE_MILLI_PER_GPU: u32 = 1000;
/// Most GPUs one node may have (GPU sets are bit masks).
pub const MAX_GPUS_PER_NODE: usize = 64;

/// Node label choosing how the node's GPUs are shared.
pub const SCHEDULE_LABEL: &str = "ack.node.gpu.schedule";
/// Node label choosing which GPU of the node a sharing pod gets.
pub const PLACEMENT_LABEL: &str = "ack.node.gpu.placement";

/// `ack.node.gpu.schedule`: how a node's GPUs are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleMode {
    /// Shared with memory and compute quotas: only pods that ask for `gpu-core.percentage`.
    CoreMem,
    /// Shared with memory isolation (cGPU): only pods without a compute quota.
    Cgpu,
    /// Shared without isolation: only pods without a compute quota.
    Share,
    /// Not shared: whole GPUs only (also what an unlabelled node is).
    Default,
}

impl ScheduleMode {
    pub fn parse(value: &str) -> Result<Self, LabelError> {
        match value {
            "core_mem" => Ok(ScheduleMode::CoreMem),
            "cgpu" => Ok(ScheduleMode::Cgpu),
            "share" => Ok(ScheduleMode::Share),
            "default" => Ok(ScheduleMode::Default),
            _ => Err(LabelError {
                label: SCHEDULE_LABEL,
                value: Echo::new(value),
                allowed: "core_mem, cgpu, share, default",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleMode::CoreMem => "core_mem",
            ScheduleMode::Cgpu => "cgpu",
            ScheduleMode::Share => "share",
            ScheduleMode::Default => "default",
        }
    }

    /// Pods sharing a GPU here carry a compute quota.
    pub fn shares_with_core(self) -> bool {
        self == ScheduleMode::CoreMem
    }

    /// Pods sharing a GPU here carry no compute quota.
    pub fn shares_memory_only(self) -> bool {
        matches!(self, ScheduleMode::Cgpu | ScheduleMode::Share)
    }
}

/// `ack.node.gpu.placement`: which fitting GPU of this node a sharing pod gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuPlacement {
    /// The fitting GPU with the least free capacity.
    Binpack,
    /// The fitting GPU with the most free capacity.
    Spread,
}

impl GpuPlacement {
    pub fn parse(value: &str) -> Result<Self, LabelError> {
        match value {
            "binpack" => Ok(GpuPlacement::Binpack),
            "spread" => Ok(GpuPlacement::Spread),
            _ => Err(LabelError {
                label: PLACEMENT_LABEL,
                value: Echo::new(value),
                allowed: "binpack, spread",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GpuPlacement::Binpack => "binpack",
            GpuPlacement::Spread => "spread",
        }
    }
}

/// A node label with a value we do not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node label {label}={value} is not one of {allowed}")]
pub struct LabelError {
    pub label: &'static str,
    pub value: Echo,
    pub allowed: &'static str,
}

/// A node with more GPUs than a GPU set holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node:#} has {count} GPUs, at most {MAX_GPUS_PER_NODE} are supported")]
pub struct TooManyGpus {
    pub node: Echo,
    pub count: usize,
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuSpec {
    pub memory_mib: u64,
    pub model: String,
    /// Unhealthy GPUs are never given to a pod.
    pub healthy: bool,
}

/// A node as the engine sees it. GPU `i` of `gpus` is the GPU with index `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: Vec<GpuSpec>,
    pub mode: ScheduleMode,
    /// `None`: the policy picks the GPU.
    pub placement: Option<GpuPlacement>,
}

impl NodeSpec {
    /// A node of `count` healthy GPUs of one model.
    pub fn uniform(
        name: impl Into<String>,
        cpu_milli: u64,
        memory_mib: u64,
        count: usize,
        gpu_memory_mib: u64,
        model: &str,
        mode: ScheduleMode,
    ) -> Self {
        NodeSpec {
            name: name.into(),
            cpu_milli,
            memory_mib,
            gpus: vec![
                GpuSpec {
                    memory_mib: gpu_memory_mib,
                    model: model.to_string(),
                    healthy: true,
                };
                count
            ],
            mode,
            placement: None,
        }
    }

    /// Reads the two node labels (absent schedule label: `default`, absent placement: policy).
    pub fn with_labels(mut self, labels: &HashMap<String, String>) -> Result<Self, LabelError> {
        self.mode = match labels.get(SCHEDULE_LABEL) {
            Some(v) => ScheduleMode::parse(v)?,
            None => ScheduleMode::Default,
        };
        self.placement = labels
            .get(PLACEMENT_LABEL)
            .map(|v| GpuPlacement::parse(v))
            .transpose()?;
        Ok(self)
    }

    /// Whether the engine can hold this node: at most [`MAX_GPUS_PER_NODE`] GPUs (GPU sets are
    /// 64-bit masks). Specs made from outside input are checked with this first.
    pub fn check_gpus(&self) -> Result<(), TooManyGpus> {
        if self.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(TooManyGpus {
                node: Echo::new(&self.name),
                count: self.gpus.len(),
            });
        }
        Ok(())
    }

    /// The node's GPU model (of its first GPU); "" without GPUs.
    pub fn model(&self) -> &str {
        self.gpus.first().map_or("", |g| g.model.as_str())
    }
}

/// What a pod needs from GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// CPU and memory only.
    None,
    /// `count` distinct GPUs of one node, each giving `memory_mib` and, with a compute quota,
    /// `core_milli`.
    Shared {
        count: u32,
        memory_mib: u64,
        core_milli: Option<u32>,
    },
    /// `count` distinct GPUs of one node that nobody else uses.
    Whole { count: u32 },
}

impl GpuDemand {
    pub fn count(&self) -> u32 {
        match *self {
            GpuDemand::None => 0,
            GpuDemand::Shared { count, .. } | GpuDemand::Whole { count } => count,
        }
    }
}

/// A pod's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    /// Allowed GPU models; empty: any.
    pub models: Vec<String>,
}

/// A request that cannot be placed anywhere because it is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error(transparent)]
    Field(#[from] RequestError),
    #[error("{field} {total_mib} MiB cannot be split evenly over {count_field}={count}")]
    UnevenMemory {
        field: String,
        total_mib: u64,
        count_field: String,
        count: u32,
    },
    #[error(
        "{field} {total} cannot be split evenly over {count_field}={count} (each GPU's share must be a multiple of 5)"
    )]
    UnevenCore {
        field: String,
        total: u32,
        count_field: String,
        count: u32,
    },
    #[error("{field} must be positive")]
    ZeroCount { field: String },
}

impl Request {
    /// CPU and memory only.
    pub fn cpu_only(name: impl Into<String>, cpu_milli: u64, memory_mib: u64) -> Self {
        Request {
            name: name.into(),
            cpu_milli,
            memory_mib,
            gpu: GpuDemand::None,
            models: Vec::new(),
        }
    }

    /// Builds the request of a pod from its parsed GPU limits (`None`: no GPU). Memory and
    /// compute are totals over `gpu-count` GPUs (as kubelet accounts them) and are split
    /// evenly; each GPU's compute share must itself be a multiple of 5 percent.
    pub fn from_quantities(
        name: impl Into<String>,
        cpu_milli: u64,
        memory_mib: u64,
        gpu: Option<&GpuQuantities>,
        names: &ResourceNames,
    ) -> Result<Self, InvalidRequest> {
        let mut req = Request::cpu_only(name, cpu_milli, memory_mib);
        let Some(q) = gpu else { return Ok(req) };
        let count = q.count.unwrap_or(1);
        if count == 0 {
            return Err(InvalidRequest::ZeroCount {
                field: names.count.clone(),
            });
        }
        // Checked: the parsers bound the units, a quantity built by hand is not.
        let total_mib = q
            .memory_units
            .checked_mul(names.memory_unit.mib())
            .filter(|&mib| mib <= MAX_MEMORY_MIB)
            .ok_or_else(|| {
                let max = GpuQuantities::max_memory_units(names.memory_unit);
                RequestError::OutOfRange {
                    field: names.memory.clone(),
                    value: Echo::new(&q.memory_units.to_string()),
                    expected: format!("an integer in [1, {max}]"),
                }
            })?;
        if total_mib == 0 {
            return Err(RequestError::NotPositive {
                field: names.memory.clone(),
                value: 0,
            }
            .into());
        }
        if total_mib % count as u64 != 0 {
            return Err(InvalidRequest::UnevenMemory {
                field: names.memory.clone(),
                total_mib,
                count_field: names.count.clone(),
                count,
            });
        }
        let core_milli = match q.core_percent {
            None => None,
            Some(total) => {
                let total = validate_core_percent(&names.core, total as i64)?;
                if total % count != 0
                    || validate_core_percent(&names.core, (total / count) as i64).is_err()
                {
                    return Err(InvalidRequest::UnevenCore {
                        field: names.core.clone(),
                        total,
                        count_field: names.count.clone(),
                        count,
                    });
                }
                Some(total / count * 10)
            }
        };
        req.gpu = GpuDemand::Shared {
            count,
            memory_mib: total_mib / count as u64,
            core_milli,
        };
        Ok(req)
    }

    pub fn with_models<I: IntoIterator<Item = S>, S: Into<String>>(mut self, models: I) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// The node's GPUs are of a model this pod accepts.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-GPU share of `milli` per-mille (memory and core) with `cpu` millicores: the
    /// placement tests' typical pod.
    pub(crate) fn share(cpu: u64, milli: u32) -> Request {
        Request {
            gpu: GpuDemand::Shared {
                count: 1,
                memory_mib: milli as u64 * 16,
                core_milli: Some(milli),
            },
            ..Request::cpu_only("p", cpu, 0)
        }
    }
    use crate::request::MemoryUnit;

    fn q(mem: u64, core: Option<u32>, count: Option<u32>) -> GpuQuantities {
        GpuQuantities {
            memory_units: mem,
            core_percent: core,
            count,
        }
    }

    /// Hardening item 7: units × the unit is checked; a quantity built by hand beyond what
    /// the parsers accept is an error, not a wrapped (or panicking) product.
    #[test]
    fn memory_that_overflows_in_mib_is_an_error() {
        let names = ResourceNames::default();
        let e = Request::from_quantities("p", 0, 0, Some(&q(u64::MAX, None, None)), &names)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-mem \"18446744073709551615\" is out of range: expected an integer in [1, 17179869183]"
        );
        let max = GpuQuantities::max_memory_units(names.memory_unit);
        assert!(Request::from_quantities("p", 0, 0, Some(&q(max, None, None)), &names).is_ok());
    }

    /// Hardening item 1: a label value is shown cut.
    #[test]
    fn long_label_values_are_cut() {
        let e = ScheduleMode::parse(&"x".repeat(1 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            e.len() < 200 && e.contains("(1048576 bytes)"),
            "{}",
            &e[..200]
        );
    }

    #[test]
    fn labels_parse_and_unknown_values_are_named() {
        let labels = HashMap::from([
            (SCHEDULE_LABEL.to_string(), "core_mem".to_string()),
            (PLACEMENT_LABEL.to_string(), "spread".to_string()),
        ]);
        let n = NodeSpec::uniform("n", 1000, 1000, 1, 100, "T4", ScheduleMode::Default)
            .with_labels(&labels)
            .unwrap();
        assert_eq!(n.mode, ScheduleMode::CoreMem);
        assert_eq!(n.placement, Some(GpuPlacement::Spread));
        let n = n.with_labels(&HashMap::new()).unwrap();
        assert_eq!((n.mode, n.placement), (ScheduleMode::Default, None));
        let e = ScheduleMode::parse("mps").unwrap_err();
        assert_eq!(
            e.to_string(),
            "node label ack.node.gpu.schedule=\"mps\" is not one of core_mem, cgpu, share, default"
        );
        assert!(GpuPlacement::parse("pack").is_err());
        for m in ["core_mem", "cgpu", "share", "default"] {
            assert_eq!(ScheduleMode::parse(m).unwrap().as_str(), m);
        }
    }

    #[test]
    fn request_from_limits_splits_evenly_and_checks_core() {
        let names = ResourceNames::default();
        let r =
            Request::from_quantities("p", 1000, 512, Some(&q(4, Some(30), None)), &names).unwrap();
        assert_eq!(
            r.gpu,
            GpuDemand::Shared {
                count: 1,
                memory_mib: 4096,
                core_milli: Some(300)
            }
        );
        let r =
            Request::from_quantities("p", 0, 0, Some(&q(8, Some(20), Some(2))), &names).unwrap();
        assert_eq!(
            r.gpu,
            GpuDemand::Shared {
                count: 2,
                memory_mib: 4096,
                core_milli: Some(100)
            }
        );
        let r = Request::from_quantities("p", 0, 0, Some(&q(2, None, None)), &names).unwrap();
        assert_eq!(
            r.gpu,
            GpuDemand::Shared {
                count: 1,
                memory_mib: 2048,
                core_milli: None
            }
        );
        assert_eq!(
            Request::from_quantities("p", 0, 0, None, &names)
                .unwrap()
                .gpu,
            GpuDemand::None
        );
        let e =
            Request::from_quantities("p", 0, 0, Some(&q(2, Some(33), None)), &names).unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-core.percentage 33 is not a multiple of 5"
        );
        let e = Request::from_quantities("p", 0, 0, Some(&q(2, Some(30), Some(4))), &names)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot be split evenly over aliyun.com/gpu-count=4"),
            "{e}"
        );
        let mib = ResourceNames {
            memory_unit: MemoryUnit::MiB,
            ..Default::default()
        };
        let e =
            Request::from_quantities("p", 0, 0, Some(&q(1001, None, Some(2))), &mib).unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-mem 1001 MiB cannot be split evenly over aliyun.com/gpu-count=2"
        );
        let e =
            Request::from_quantities("p", 0, 0, Some(&q(2, None, Some(0))), &names).unwrap_err();
        assert!(e.to_string().contains("must be positive"), "{e}");
    }

    #[test]
    fn models() {
        let r = Request::cpu_only("p", 1, 1);
        assert!(r.allows_model("T4"));
        let r = r.with_models(["V100M16", "V100M32"]);
        assert!(r.allows_model("V100M32") && !r.allows_model("T4"));
    }
}
