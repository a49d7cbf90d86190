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
use crate::json::{self, Json, Path, SchemaError};
use crate::placement::model::MAX_GPUS_PER_NODE;
use crate::request::{MAX_ANNOTATION_BYTES, MAX_MEMORY_MIB};

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

impl NodeGpu {
    fn from_tree(v: &Json, path: &Path) -> Result<NodeGpu, SchemaError> {
        let o = json::object(v, path, "a GPU: an object with index and memoryMiB")?;
        let index = json::integer(
            o.required(path, "index", "an integer in [0, 4294967295]")?,
            &path.field("index"),
            0,
            u32::MAX.into(),
        )? as u32;
        let text = |key: &str| -> Result<String, SchemaError> {
            match o.get(key) {
                None => Ok(String::new()),
                Some(v) => Ok(json::string(v, &path.field(key), "a string")?.to_string()),
            }
        };
        let memory = format!("an integer in [0, {MAX_MEMORY_MIB}]");
        let memory_mib =
            o.integer_field(path, "memoryMiB", 0, MAX_MEMORY_MIB.into(), &memory)? as u64;
        let healthy = match o.get("healthy") {
            None => true,
            Some(v) => json::boolean(v, &path.field("healthy"))?,
        };
        Ok(NodeGpu {
            index,
            uuid: text("uuid")?,
            model: text("model")?,
            memory_mib,
            healthy,
        })
    }
}

/// The whole annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    pub version: u32,
    pub gpus: Vec<NodeGpu>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeGpusError {
    /// Larger than Kubernetes lets all of an object's annotations be.
    #[error(
        "node annotation gpushare.io/gpus is {0} bytes, more than the {MAX_ANNOTATION_BYTES} bytes Kubernetes allows for all of an object's annotations"
    )]
    TooLarge(usize),
    /// Not JSON at all (a syntax error).
    #[error("node annotation gpushare.io/gpus is not valid JSON: {0}")]
    Malformed(String),
    /// JSON, but a field is not what the schema takes (the path names it).
    #[error("node annotation gpushare.io/gpus {0}")]
    Schema(SchemaError),
    #[error(
        "node annotation gpushare.io/gpus version {0} is not supported (this build reads version 1)"
    )]
    Version(u32),
    #[error("node annotation gpushare.io/gpus lists GPU index {0} twice")]
    DuplicateIndex(u32),
    /// GPU sets are 64-bit masks (the placement engine's [`MAX_GPUS_PER_NODE`]).
    #[error(
        "node annotation gpushare.io/gpus lists {0} GPUs, at most {MAX_GPUS_PER_NODE} are supported"
    )]
    TooManyGpus(usize),
}

impl From<SchemaError> for NodeGpusError {
    fn from(e: SchemaError) -> Self {
        NodeGpusError::Schema(e)
    }
}

impl NodeGpus {
    /// `count` identical healthy GPUs, uuids `GPU-0`, `GPU-1`, … (a test node).
    pub fn uniform(count: u32, model: &str, memory_mib: u64) -> Self {
        NodeGpus {
            version: NODE_GPUS_VERSION,
            gpus: (0..count)
                .map(|index| NodeGpu {
                    index,
                    uuid: format!("GPU-{index}"),
                    model: model.into(),
                    memory_mib,
                    healthy: true,
                })
                .collect(),
        }
    }

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

    /// Parses and checks the annotation; GPUs come back ordered by index. Unknown fields
    /// are ignored (a newer agent may publish more); keys given twice and more than
    /// [`MAX_GPUS_PER_NODE`] GPUs are refused.
    pub fn parse(raw: &str) -> Result<Self, NodeGpusError> {
        if raw.len() > MAX_ANNOTATION_BYTES {
            return Err(NodeGpusError::TooLarge(raw.len()));
        }
        let tree = json::parse(raw).map_err(|e| NodeGpusError::Malformed(e.0))?;
        let root = Path::root();
        let top = json::object(&tree, &root, "an object with version and gpus")?;
        let version = top.version(&root)?;
        if version != NODE_GPUS_VERSION {
            return Err(NodeGpusError::Version(version));
        }
        let path = root.field("gpus");
        let items = json::array(
            top.required(&root, "gpus", "a list of GPUs")?,
            &path,
            "a list of GPUs",
        )?;
        if items.len() > MAX_GPUS_PER_NODE {
            return Err(NodeGpusError::TooManyGpus(items.len()));
        }
        let mut gpus = items
            .iter()
            .enumerate()
            .map(|(i, v)| NodeGpu::from_tree(v, &path.index(i)))
            .collect::<Result<Vec<_>, _>>()?;
        gpus.sort_by_key(|g| g.index);
        if let Some(w) = gpus.windows(2).find(|w| w[0].index == w[1].index) {
            return Err(NodeGpusError::DuplicateIndex(w[0].index));
        }
        Ok(NodeGpus { version, gpus })
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

    fn gpus(n: u32) -> String {
        NodeGpus::uniform(n, "sim", 15360).to_json()
    }

    /// Hardening item 8: GPU sets are 64-bit masks; a node annotation listing more than 64
    /// GPUs is refused by the parser (the scheduler's engine used to panic on it).
    #[test]
    fn more_than_64_gpus_are_refused() {
        assert_eq!(NodeGpus::parse(&gpus(64)).unwrap().gpus.len(), 64);
        assert_eq!(
            NodeGpus::parse(&gpus(65)).unwrap_err().to_string(),
            "node annotation gpushare.io/gpus lists 65 GPUs, at most 64 are supported"
        );
    }

    /// Hardening items 1, 2 and 4 for the node annotation: field paths, cut values, no
    /// duplicate keys.
    #[test]
    fn schema_errors_name_the_field() {
        let err = |raw: &str| NodeGpus::parse(raw).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"version":1,"gpus":[{"index":0,"memoryMiB":"15360"}]}"#),
            "node annotation gpushare.io/gpus gpus[0].memoryMiB is the string \"15360\": expected an integer in [0, 17592186044415]"
        );
        assert_eq!(
            err(r#"{"version":1,"gpus":[{"index":0,"index":1,"memoryMiB":1}]}"#),
            "node annotation gpushare.io/gpus gpus[0] has the key \"index\" twice"
        );
        let big = "x".repeat(200 << 10);
        let e = err(&format!(
            r#"{{"version":1,"gpus":[{{"index":0,"memoryMiB":1,"healthy":"{big}"}}]}}"#
        ));
        assert!(e.len() < 200 && e.contains("(204800 bytes)"), "{e}");
        let e = err(&format!(r#"{{"version":1,"gpus":[]}}{big}{big}"#));
        assert_eq!(
            e,
            "node annotation gpushare.io/gpus is 409623 bytes, more than the 262144 bytes Kubernetes allows for all of an object's annotations"
        );
        assert!(err("nope").starts_with("node annotation gpushare.io/gpus is not valid JSON: "));
    }
}
