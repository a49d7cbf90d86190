//! What the node agent publishes about its GPUs on its Node object, for the scheduler and
//! `gpushare inspect`: the node annotation `gpushare.io/gpus` (schema version 1).
//!
//! ```json
//! {"version":1,"gpus":[{"index":0,"uuid":"GPU-…","model":"NVIDIA H200","memoryMiB":15360,"healthy":true}]}
//! ```
//!
//! Written only by `gpushare node` (device plugin); read by the scheduler extender, which
//! combines it with the node's `ack.node.gpu.schedule` / `ack.node.gpu.placement` labels.
//!
//! Also here: the pod annotations the scheduler writes besides `gpushare.io/assignment`, in
//! the form earlier ACK GPU-sharing tools read them.

use serde::{Deserialize, Serialize};

use crate::inventory::Inventory;

/// Node annotation carrying the GPU inventory.
pub const NODE_GPUS_ANNOTATION: &str = "gpushare.io/gpus";
/// The schema version this build reads and writes.
pub const NODE_GPUS_VERSION: u32 = 1;

/// ACK-compatible pod annotations written at bind time (informational; the node agent reads
/// only `gpushare.io/assignment`).
pub const ACK_GPU_MEM_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
pub const ACK_GPU_MEM_POD: &str = "ALIYUN_COM_GPU_MEM_POD";
pub const ACK_GPU_MEM_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";
pub const ACK_GPU_MEM_ASSIGNED: &str = "ALIYUN_COM_GPU_MEM_ASSIGNED";
pub const ACK_GPU_MEM_ASSUME_TIME: &str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME";

/// One GPU as the node publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpu {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub model: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default = "healthy_default")]
    pub healthy: bool,
}

fn healthy_default() -> bool {
    true
}

/// The whole annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    pub version: u32,
    pub gpus: Vec<NodeGpu>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeGpusError {
    #[error("node annotation gpushare.io/gpus is not valid JSON: {0}")]
    Malformed(String),
    #[error(
        "node annotation gpushare.io/gpus version {0} is not supported (this build reads version 1)"
    )]
    Version(u32),
    #[error("node annotation gpushare.io/gpus lists GPU index {0} twice")]
    DuplicateIndex(u32),
}

impl NodeGpus {
    /// From the agent's inventory; `unhealthy` lists GPU indexes to publish as unhealthy.
    pub fn from_inventory(inv: &Inventory, unhealthy: &[u32]) -> Self {
        NodeGpus {
            version: NODE_GPUS_VERSION,
            gpus: inv
                .gpus
                .iter()
                .map(|g| NodeGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    memory_mib: g.memory_mib,
                    healthy: !unhealthy.contains(&g.index),
                })
                .collect(),
        }
    }

    /// Parses and checks the annotation; GPUs come back ordered by index.
    pub fn parse(raw: &str) -> Result<Self, NodeGpusError> {
        let mut v: NodeGpus =
            serde_json::from_str(raw).map_err(|e| NodeGpusError::Malformed(e.to_string()))?;
        if v.version != NODE_GPUS_VERSION {
            return Err(NodeGpusError::Version(v.version));
        }
        v.gpus.sort_by_key(|g| g.index);
        if let Some(w) = v.gpus.windows(2).find(|w| w[0].index == w[1].index) {
            return Err(NodeGpusError::DuplicateIndex(w[0].index));
        }
        Ok(v)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("node GPUs serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::GpuInfo;

    #[test]
    fn round_trip_and_errors() {
        let inv = Inventory::new(vec![
            GpuInfo {
                index: 1,
                uuid: "GPU-b".into(),
                model: "sim".into(),
                memory_mib: 15360,
                minor: 1,
            },
            GpuInfo {
                index: 0,
                uuid: "GPU-a".into(),
                model: "sim".into(),
                memory_mib: 15360,
                minor: 0,
            },
        ]);
        let n = NodeGpus::from_inventory(&inv, &[1]);
        let raw = n.to_json();
        assert!(raw.contains(r#""memoryMiB":15360"#), "{raw}");
        let back = NodeGpus::parse(&raw).unwrap();
        assert_eq!(back, n);
        assert!(back.gpus[0].healthy && !back.gpus[1].healthy);
        assert_eq!(
            NodeGpus::parse(r#"{"version":2,"gpus":[]}"#).unwrap_err(),
            NodeGpusError::Version(2)
        );
        assert_eq!(
            NodeGpus::parse(
                r#"{"version":1,"gpus":[{"index":0,"memoryMiB":1},{"index":0,"memoryMiB":1}]}"#
            )
            .unwrap_err(),
            NodeGpusError::DuplicateIndex(0)
        );
        assert!(matches!(
            NodeGpus::parse("nope"),
            Err(NodeGpusError::Malformed(_))
        ));
    }
}
