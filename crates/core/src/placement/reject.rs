//! Why a pod does not fit: per node ([`Why`], cheap to produce while scanning, turned into a
//! readable [`Reject`] only when reported) and for the whole cluster ([`Unschedulable`]).

use std::fmt;

use super::model::{SCHEDULE_LABEL, ScheduleMode};

/// Why one node cannot take a pod (numbers only; see [`Reject`] for the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Cpu {
        free: u64,
        need: u64,
    },
    Memory {
        free: u64,
        need: u64,
    },
    NoGpus,
    /// None of the node's GPUs is of a model the pod accepts.
    Model,
    /// A sharing pod on a `default` (whole-GPU) node.
    ExclusiveNode,
    /// A pod with a compute quota on a `cgpu`/`share` node.
    CoreOnMemoryOnlyNode,
    /// A pod without a compute quota on a `core_mem` node.
    MemoryOnlyOnCoreNode,
    TooFewGpus {
        have: u32,
        need: u32,
    },
    /// Fewer than `need` GPUs have the share free.
    GpuShortage {
        need: u32,
        fitting: u32,
        memory_mib: u64,
        core_milli: Option<u32>,
        most_free_mib: u64,
    },
    /// Fewer than `need` GPUs are idle.
    WholeShortage {
        need: u32,
        idle: u32,
    },
}

/// Short names of the kinds of [`Why`], in the order of [`Why::kind`].
pub const KINDS: [&str; 10] = [
    "too little free CPU",
    "too little free memory",
    "no GPUs",
    "no GPU of an accepted model",
    "whole GPUs only (schedule=default)",
    "memory-only sharing (schedule=cgpu/share), the pod has a compute quota",
    "sharing with compute quotas (schedule=core_mem), the pod has none",
    "too few GPUs",
    "too few GPUs with the share free",
    "too few idle GPUs",
];

/// [`KINDS`] as metric label values (the extender's
/// `gpushare_extender_filter_rejections_total{reason}`).
pub const KIND_LABELS: [&str; 10] = [
    "cpu",
    "memory",
    "no_gpus",
    "model",
    "exclusive_node",
    "core_on_memory_only_node",
    "memory_only_on_core_node",
    "too_few_gpus",
    "gpu_shortage",
    "whole_shortage",
];

impl Why {
    /// Index into [`KINDS`] and [`KIND_LABELS`].
    pub fn kind(&self) -> usize {
        match self {
            Why::Cpu { .. } => 0,
            Why::Memory { .. } => 1,
            Why::NoGpus => 2,
            Why::Model => 3,
            Why::ExclusiveNode => 4,
            Why::CoreOnMemoryOnlyNode => 5,
            Why::MemoryOnlyOnCoreNode => 6,
            Why::TooFewGpus { .. } => 7,
            Why::GpuShortage { .. } => 8,
            Why::WholeShortage { .. } => 9,
        }
    }
}

/// Percent with one decimal when needed: 300 → "30%", 465 → "46.5%".
pub fn percent(milli: u32) -> String {
    if milli.is_multiple_of(10) {
        format!("{}%", milli / 10)
    } else {
        format!("{}.{}%", milli / 10, milli % 10)
    }
}

/// One node's refusal, with what a user needs to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub node: String,
    pub mode: ScheduleMode,
    /// The node's GPU model.
    pub model: String,
    /// The pod's accepted models.
    pub allowed: Vec<String>,
    pub why: Why,
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = &self.node;
        match self.why {
            Why::Cpu { free, need } => {
                write!(f, "node {n} has {free}m CPU free, the pod needs {need}m")
            }
            Why::Memory { free, need } => write!(
                f,
                "node {n} has {free} MiB of memory free, the pod needs {need} MiB"
            ),
            Why::NoGpus => write!(f, "node {n} has no GPUs"),
            Why::Model => write!(
                f,
                "node {n} has {} GPUs, the pod accepts only {}",
                self.model,
                self.allowed.join(", ")
            ),
            Why::ExclusiveNode => write!(
                f,
                "node {n} is labelled {SCHEDULE_LABEL}=default (whole GPUs only); a pod that shares a GPU needs a core_mem, cgpu or share node"
            ),
            Why::CoreOnMemoryOnlyNode => write!(
                f,
                "node {n} is labelled {SCHEDULE_LABEL}={} (memory-only sharing); a pod with gpu-core.percentage needs a core_mem node",
                self.mode.as_str()
            ),
            Why::MemoryOnlyOnCoreNode => write!(
                f,
                "node {n} is labelled {SCHEDULE_LABEL}=core_mem (memory and compute quotas); a pod without gpu-core.percentage needs a cgpu or share node"
            ),
            Why::TooFewGpus { have, need } => {
                write!(f, "node {n} has {have} GPUs, the pod needs {need}")
            }
            Why::GpuShortage {
                need,
                fitting,
                memory_mib,
                core_milli,
                most_free_mib,
            } => {
                let core =
                    core_milli.map_or(String::new(), |c| format!(" and {} compute", percent(c)));
                write!(
                    f,
                    "node {n} has {fitting} GPU(s) with {memory_mib} MiB{core} free, the pod needs {need} (most memory free on one GPU: {most_free_mib} MiB)"
                )
            }
            Why::WholeShortage { need, idle } => write!(
                f,
                "node {n} has {idle} idle GPU(s), the pod needs {need} whole GPU(s)"
            ),
        }
    }
}

/// No node can take the pod: how many nodes refused for each reason, and the first refusal
/// of each kind in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    pub pod: String,
    pub nodes: usize,
    /// (kind from [`KINDS`], how many nodes)
    pub counts: Vec<(&'static str, usize)>,
    pub examples: Vec<Reject>,
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes can run pod {}", self.nodes, self.pod)?;
        if self.counts.is_empty() {
            return Ok(());
        }
        let parts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, c)| format!("{c} {k}"))
            .collect();
        write!(f, ": {}", parts.join(", "))?;
        for e in &self.examples {
            write!(f, "; {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unschedulable {}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(why: Why) -> String {
        Reject {
            node: "n1".into(),
            mode: ScheduleMode::Cgpu,
            model: "T4".into(),
            allowed: vec!["V100M16".into(), "V100M32".into()],
            why,
        }
        .to_string()
    }

    #[test]
    fn every_reason_reads_well() {
        let cases = [
            (
                Why::Cpu {
                    free: 2000,
                    need: 4000,
                },
                "node n1 has 2000m CPU free, the pod needs 4000m",
            ),
            (
                Why::Memory {
                    free: 100,
                    need: 200,
                },
                "node n1 has 100 MiB of memory free, the pod needs 200 MiB",
            ),
            (Why::NoGpus, "node n1 has no GPUs"),
            (
                Why::Model,
                "node n1 has T4 GPUs, the pod accepts only V100M16, V100M32",
            ),
            (
                Why::ExclusiveNode,
                "labelled ack.node.gpu.schedule=default (whole GPUs only)",
            ),
            (
                Why::CoreOnMemoryOnlyNode,
                "labelled ack.node.gpu.schedule=cgpu (memory-only sharing); a pod with gpu-core.percentage needs a core_mem node",
            ),
            (
                Why::MemoryOnlyOnCoreNode,
                "a pod without gpu-core.percentage needs a cgpu or share node",
            ),
            (
                Why::TooFewGpus { have: 2, need: 4 },
                "node n1 has 2 GPUs, the pod needs 4",
            ),
            (
                Why::GpuShortage {
                    need: 2,
                    fitting: 1,
                    memory_mib: 4096,
                    core_milli: Some(300),
                    most_free_mib: 8192,
                },
                "node n1 has 1 GPU(s) with 4096 MiB and 30% compute free, the pod needs 2 (most memory free on one GPU: 8192 MiB)",
            ),
            (
                Why::WholeShortage { need: 8, idle: 3 },
                "node n1 has 3 idle GPU(s), the pod needs 8 whole GPU(s)",
            ),
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for (why, want) in cases {
            let got = r(why);
            assert!(got.contains(want), "got {got:?}, want {want:?}");
            kinds.insert(why.kind());
        }
        assert_eq!(kinds.len(), KINDS.len());
        assert_eq!(percent(465), "46.5%");
    }

    #[test]
    fn cluster_summary() {
        let u = Unschedulable {
            pod: "p".into(),
            nodes: 3,
            counts: vec![(KINDS[0], 2), (KINDS[7], 1)],
            examples: vec![],
        };
        assert_eq!(
            u.to_string(),
            "0/3 nodes can run pod p: 2 too little free CPU, 1 too few GPUs"
        );
    }
}
