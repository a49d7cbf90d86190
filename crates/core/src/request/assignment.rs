//! The scheduler's pod annotation `gpushare.io/assignment` (schema version 1):
//!
//! ```json
//! {
//!   "version": 1,
//!   "timestamp": "2026-11-29T19:00:00Z",
//!   "containers": {
//!     "main": [ { "gpuIndex": 1, "gpuUuid": "GPU-…", "memoryMiB": 2048, "corePercent": 30 } ]
//!   }
//! }
//! ```
//!
//! Written only by the scheduler; parsed only here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::RequestError;

/// Pod annotation key of the assignment.
pub const ASSIGNMENT_ANNOTATION: &str = "gpushare.io/assignment";
/// The schema version this build reads and writes.
pub const ASSIGNMENT_VERSION: u32 = 1;

/// One GPU share given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuShare {
    pub gpu_index: u32,
    /// UUID of the GPU at `gpu_index`; checked against the node's inventory when present.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu_uuid: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Compute quota in percent of the GPU; absent for memory-only shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_percent: Option<i64>,
}

/// The whole annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    pub containers: BTreeMap<String, Vec<GpuShare>>,
}

impl Assignment {
    /// Parses the annotation value; checks only syntax and version (the node checks the rest
    /// against its inventory).
    pub fn parse(raw: &str) -> Result<Assignment, RequestError> {
        let a: Assignment =
            serde_json::from_str(raw).map_err(|e| RequestError::MalformedAssignment {
                reason: e.to_string(),
            })?;
        if a.version != ASSIGNMENT_VERSION {
            return Err(RequestError::UnsupportedVersion {
                value: a.version,
                supported: ASSIGNMENT_VERSION,
            });
        }
        Ok(a)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("assignment serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documented_example() {
        let a = Assignment::parse(
            r#"{"version":1,"timestamp":"2026-11-29T19:00:00Z","containers":{"main":[{"gpuIndex":1,"gpuUuid":"GPU-x","memoryMiB":2048,"corePercent":30}]}}"#,
        )
        .unwrap();
        let share = &a.containers["main"][0];
        assert_eq!(
            (share.gpu_index, share.memory_mib, share.core_percent),
            (1, 2048, Some(30))
        );
        assert_eq!(Assignment::parse(&a.to_json()).unwrap(), a);
    }

    #[test]
    fn rejects_malformed_unknown_fields_and_versions() {
        let e = Assignment::parse("{not json").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("gpushare.io/assignment is not valid JSON"),
            "{e}"
        );
        let e = Assignment::parse(
            r#"{"version":1,"containers":{"c":[{"gpuIndex":0,"memoryMiB":1,"gpu":2}]}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `gpu`"), "{e}");
        let e = Assignment::parse(r#"{"version":2,"containers":{}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpushare.io/assignment version 2 is not supported (this node reads version 1)"
        );
    }
}
