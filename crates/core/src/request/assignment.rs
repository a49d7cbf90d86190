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
//! Written only by the scheduler; parsed only here ([`Assignment::parse`]: syntax, then the
//! schema field by field, each error naming its path, e.g. `containers.main[0].corePercent`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::limits::{MAX_MEMORY_MIB, validate_core_percent};
use super::{MAX_ANNOTATION_BYTES, RequestError};
use crate::echo::Echo;
use crate::json::{self, Json, Path, Problem, SchemaError};
use crate::placement::model::MAX_GPUS_PER_NODE;
use crate::rfc3339;

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

impl GpuShare {
    fn from_tree(v: &Json, path: &Path) -> Result<GpuShare, RequestError> {
        let o = json::object(
            v,
            path,
            "a GPU share: an object with gpuIndex, memoryMiB and optionally gpuUuid, corePercent",
        )?;
        o.deny_unknown(path, &SHARE_FIELDS)?;
        let gpu_index = o.integer_field(path, "gpuIndex", 0, u32::MAX.into(), GPU_INDEX)? as u32;
        let gpu_uuid = match o.get("gpuUuid") {
            None => String::new(),
            Some(v) => json::string(v, &path.field("gpuUuid"), "a GPU UUID string")?.to_string(),
        };
        let memory = memory_mib_expected();
        let memory_mib =
            o.integer_field(path, "memoryMiB", 1, MAX_MEMORY_MIB.into(), &memory)? as u64;
        let core_percent = match o.get("corePercent") {
            None | Some(Json::Null) => None,
            Some(v) => {
                let path = path.field("corePercent");
                // Type and 64 bits here; the range and the multiple of 5 in the words every
                // compute quota is refused with ("… corePercent 0 is not in [5, 100]").
                let c = json::integer_as(v, &path, i64::MIN.into(), i64::MAX.into(), CORE_PERCENT)?
                    as i64;
                validate_core_percent(&format!("{ASSIGNMENT_ANNOTATION} {path}"), c)?;
                Some(c)
            }
        };
        Ok(GpuShare {
            gpu_index,
            gpu_uuid,
            memory_mib,
            core_percent,
        })
    }
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

/// What a GPU-share field takes (for the messages).
const GPU_INDEX: &str = "an integer in [0, 4294967295]";
const CORE_PERCENT: &str = "an integer in [5, 100], a multiple of 5";
const SHARE_FIELDS: [&str; 4] = ["gpuIndex", "gpuUuid", "memoryMiB", "corePercent"];

fn memory_mib_expected() -> String {
    format!("an integer in [1, {MAX_MEMORY_MIB}]")
}

impl Assignment {
    /// Parses the annotation value; checks syntax, schema and version (the node checks the
    /// rest against its inventory). Not JSON: [`RequestError::MalformedAssignment`]; JSON
    /// but not the schema: [`RequestError::AssignmentSchema`], naming the field path, the
    /// value (cut) and what was expected. Keys given twice are refused, not overwritten.
    pub fn parse(raw: &str) -> Result<Assignment, RequestError> {
        if raw.len() > MAX_ANNOTATION_BYTES {
            return Err(RequestError::AssignmentTooLarge { len: raw.len() });
        }
        let tree =
            json::parse(raw).map_err(|e| RequestError::MalformedAssignment { reason: e.0 })?;
        Assignment::from_tree(&tree)
    }

    fn from_tree(tree: &Json) -> Result<Assignment, RequestError> {
        let root = Path::root();
        let top = json::object(tree, &root, "an object with version and containers")?;
        // The version first, so that a newer annotation says so rather than "unknown field".
        let version = top.version(&root)?;
        if version != ASSIGNMENT_VERSION {
            return Err(RequestError::UnsupportedVersion {
                value: version,
                supported: ASSIGNMENT_VERSION,
            });
        }
        top.deny_unknown(&root, &["version", "timestamp", "containers"])?;
        let timestamp = match top.get("timestamp") {
            None | Some(Json::Null) => None,
            Some(v) => {
                let path = root.field("timestamp");
                let s = json::string(v, &path, "an RFC 3339 date-time string")?;
                rfc3339::check(s).map_err(|why| {
                    SchemaError::new(
                        &path,
                        Problem::Invalid {
                            value: Echo::new(s),
                            expected: format!(
                                "an RFC 3339 date-time like 2026-11-29T19:00:00Z ({why})"
                            ),
                        },
                    )
                })?;
                Some(s.to_string())
            }
        };
        const CONTAINERS: &str = "an object of container name to list of GPU shares";
        let path = root.field("containers");
        let list = json::object(
            top.required(&root, "containers", CONTAINERS)?,
            &path,
            CONTAINERS,
        )?;
        let mut containers = BTreeMap::new();
        for (name, shares) in list.entries {
            let path = path.key(name);
            let items = json::array(shares, &path, "a list of GPU shares")?;
            if items.len() > MAX_GPUS_PER_NODE {
                return Err(SchemaError::new(
                    &path,
                    Problem::TooMany {
                        count: items.len(),
                        max: MAX_GPUS_PER_NODE,
                    },
                )
                .into());
            }
            let shares = items
                .iter()
                .enumerate()
                .map(|(i, item)| GpuShare::from_tree(item, &path.index(i)))
                .collect::<Result<Vec<_>, _>>()?;
            containers.insert(name.clone(), shares);
        }
        Ok(Assignment {
            version,
            timestamp,
            containers,
        })
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
        assert!(e.to_string().contains("unknown field \"gpu\""), "{e}");
        let e = Assignment::parse(r#"{"version":2,"containers":{}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpushare.io/assignment version 2 is not supported (this node reads version 1)"
        );
    }

    fn share(fields: &str) -> String {
        format!(r#"{{"version":1,"containers":{{"main":[{{{fields}}}]}}}}"#)
    }

    fn err(raw: &str) -> String {
        Assignment::parse(raw).unwrap_err().to_string()
    }

    /// Hardening item 2: schema errors name the field path, the value and what was expected,
    /// and are not labelled "not valid JSON".
    #[test]
    fn schema_errors_name_the_field_path_value_and_expectation() {
        for (raw, want) in [
            (
                share(r#""gpuIndex":1,"memoryMiB":2048,"corePercent":30.0"#),
                "gpushare.io/assignment containers.main[0].corePercent 30.0 is not an integer: expected an integer in [5, 100], a multiple of 5",
            ),
            (
                share(r#""gpuIndex":"1","memoryMiB":2048"#),
                "gpushare.io/assignment containers.main[0].gpuIndex is the string \"1\": expected an integer in [0, 4294967295]",
            ),
            (
                share(r#""gpuIndex":1,"memoryMiB":-2048"#),
                "gpushare.io/assignment containers.main[0].memoryMiB -2048 is out of range: expected an integer in [1, 17592186044415]",
            ),
            (
                share(r#""gpuIndex":1"#),
                "gpushare.io/assignment containers.main[0] has no memoryMiB: expected an integer in [1, 17592186044415]",
            ),
            (
                share(r#""gpuIndex":1,"memoryMiB":2048,"corePercent":33"#),
                "gpushare.io/assignment containers.main[0].corePercent 33 is not a multiple of 5",
            ),
            (
                share(r#""gpuIndex":1,"memoryMiB":2048,"gpu":2"#),
                "gpushare.io/assignment containers.main[0] has an unknown field \"gpu\" (known: gpuIndex, gpuUuid, memoryMiB, corePercent)",
            ),
            (
                r#"{"version":1,"containers":[]}"#.to_string(),
                "gpushare.io/assignment containers is an array: expected an object of container name to list of GPU shares",
            ),
            (
                r#"{"version":1,"containers":{"main":{}}}"#.to_string(),
                "gpushare.io/assignment containers.main is an object: expected a list of GPU shares",
            ),
            (
                r#"{"version":"1","containers":{}}"#.to_string(),
                "gpushare.io/assignment version is the string \"1\": expected the integer 1",
            ),
            (
                "[]".to_string(),
                "gpushare.io/assignment is an array: expected an object with version and containers",
            ),
        ] {
            assert_eq!(err(&raw), want, "{raw}");
            assert!(!want.contains("valid JSON"));
        }
        assert_eq!(
            err("{not json"),
            "gpushare.io/assignment is not valid JSON: key must be a string at line 1 column 2"
        );
    }

    /// Hardening item 3: `timestamp` must be an RFC 3339 date-time.
    #[test]
    fn timestamp_must_be_rfc3339() {
        let with = |ts: &str| format!(r#"{{"version":1,"timestamp":{ts},"containers":{{}}}}"#);
        for ok in [
            r#""2026-11-29T19:00:00Z""#,
            r#""2026-11-29T19:00:00.5+01:00""#,
            "null",
        ] {
            assert!(Assignment::parse(&with(ok)).is_ok(), "{ok}");
        }
        for (bad, want) in [
            (
                r#""yesterday""#,
                "gpushare.io/assignment timestamp \"yesterday\" is not an RFC 3339 date-time like 2026-11-29T19:00:00Z (the year is not 4 digits at byte 0)",
            ),
            (
                r#""2026-02-30T19:00:00Z""#,
                "gpushare.io/assignment timestamp \"2026-02-30T19:00:00Z\" is not an RFC 3339 date-time like 2026-11-29T19:00:00Z (day 30 is not in 01-28 for 2026-02)",
            ),
            (
                "5",
                "gpushare.io/assignment timestamp is 5: expected an RFC 3339 date-time string",
            ),
        ] {
            assert_eq!(err(&with(bad)), want, "{bad}");
        }
    }

    /// Hardening item 4: a key given twice is refused, naming it (serde_json would keep the
    /// last one).
    #[test]
    fn duplicate_keys_are_refused() {
        let e = err(
            r#"{"version":1,"containers":{"main":[{"gpuIndex":0,"memoryMiB":1024}],"main":[{"gpuIndex":1,"memoryMiB":15360}]}}"#,
        );
        assert_eq!(
            e,
            "gpushare.io/assignment containers has the key \"main\" twice"
        );
        let e = err(&share(r#""gpuIndex":0,"gpuIndex":1,"memoryMiB":1024"#));
        assert_eq!(
            e,
            "gpushare.io/assignment containers.main[0] has the key \"gpuIndex\" twice"
        );
        let e = err(r#"{"version":1,"version":1,"containers":{}}"#);
        assert_eq!(e, "gpushare.io/assignment has the key \"version\" twice");
    }

    /// An annotation larger than Kubernetes allows is refused before it is parsed.
    #[test]
    fn oversized_annotations_are_refused_unparsed() {
        let pad = " ".repeat(MAX_ANNOTATION_BYTES);
        let e = err(&format!(r#"{{"version":1,"containers":{{}}}}{pad}"#));
        assert_eq!(
            e,
            "gpushare.io/assignment is 262173 bytes, more than the 262144 bytes Kubernetes allows for all of an object's annotations"
        );
        let fits = format!(r#"{{"version":1,"containers":{{}}}}{}"#, &pad[29..]);
        assert_eq!(fits.len(), MAX_ANNOTATION_BYTES);
        assert!(Assignment::parse(&fits).is_ok());
    }

    /// Hardening item 5: an integer too large is out of range, with the range.
    #[test]
    fn overflowing_integers_are_out_of_range() {
        assert_eq!(
            err(&share(r#""gpuIndex":1,"memoryMiB":99999999999999999999"#)),
            "gpushare.io/assignment containers.main[0].memoryMiB 1e20 is out of range: expected an integer in [1, 17592186044415]"
        );
        assert_eq!(
            err(&share(r#""gpuIndex":4294967296,"memoryMiB":1"#)),
            "gpushare.io/assignment containers.main[0].gpuIndex 4294967296 is out of range: expected an integer in [0, 4294967295]"
        );
        assert_eq!(
            err(&share(
                r#""gpuIndex":0,"memoryMiB":1,"corePercent":-99999999999999999999"#
            )),
            "gpushare.io/assignment containers.main[0].corePercent -1e20 is out of range: expected an integer in [5, 100], a multiple of 5"
        );
        assert_eq!(
            err(r#"{"version":4294967297,"containers":{}}"#),
            "gpushare.io/assignment version 4294967297 is out of range: expected the integer 1"
        );
    }
}
