//! The request contract, parsed and validated in one place: pod limits and the device
//! plugin's grant ([`limits`]), the scheduler's assignment annotation ([`assignment`]), what
//! a pod holds at once given when its containers run ([`lifecycle`]), and
//! [`container_request`], which decides what one container gets on this node.
//!
//! Pure: no IO. Every error names the field and the value.

pub mod assignment;
pub mod lifecycle;
pub mod limits;
pub mod node;

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

pub use assignment::{ASSIGNMENT_ANNOTATION, ASSIGNMENT_VERSION, Assignment, GpuShare};

/// The most bytes all of a Kubernetes object's annotations may take together
/// (`TotalAnnotationSizeLimitB`): an annotation value longer than this cannot come from the
/// API server, and is refused before it is parsed.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;
pub use limits::{
    GpuQuantities, MAX_MEMORY_MIB, MemoryUnit, ResourceNames, parse_memory_mib,
    validate_core_percent,
};

use crate::echo::Echo;
use crate::inventory::Inventory;
use crate::json::SchemaError;

/// Why a request is refused. Messages reach `crictl create` / kubelet events verbatim.
///
/// Values that came from outside (annotation and limit values, container names, UUIDs) are
/// held as [`Echo`]s: shown whole when short, else cut with their length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{field} {value} is not in [5, 100]")]
    CoreOutOfRange { field: String, value: i64 },
    #[error("{field} {value} is not a multiple of 5")]
    CoreNotMultipleOf5 { field: String, value: i64 },
    #[error("{field} {value} is not an integer")]
    NotAnInteger { field: String, value: Echo },
    #[error("{field} {value} has leading or trailing whitespace: expected {expected}")]
    Whitespace {
        field: String,
        value: Echo,
        expected: &'static str,
    },
    #[error("{field} {value} is out of range: expected {expected}")]
    OutOfRange {
        field: String,
        value: Echo,
        expected: String,
    },
    #[error("{field} {value} must be positive")]
    NotPositive { field: String, value: i64 },
    #[error("{field} {value} is not a memory size like 2GiB or 2048MiB")]
    NotAMemorySize { field: String, value: Echo },
    #[error("{core_field} is requested without {memory_field}")]
    CoreWithoutMemory {
        core_field: String,
        memory_field: String,
    },
    /// Larger than Kubernetes lets all of an object's annotations be.
    #[error(
        "gpushare.io/assignment is {len} bytes, more than the {MAX_ANNOTATION_BYTES} bytes Kubernetes allows for all of an object's annotations"
    )]
    AssignmentTooLarge { len: usize },
    /// Not JSON at all (a syntax error).
    #[error("gpushare.io/assignment is not valid JSON: {reason}")]
    MalformedAssignment { reason: String },
    /// JSON, but a field is not what the schema takes (the path names it).
    #[error("gpushare.io/assignment {0}")]
    AssignmentSchema(SchemaError),
    #[error(
        "gpushare.io/assignment version {value} is not supported (this node reads version {supported})"
    )]
    UnsupportedVersion { value: u32, supported: u32 },
    #[error(
        "container {container} was granted {memory_field}={units} but the pod has no gpushare.io/assignment annotation (not placed by the gpushare scheduler?)"
    )]
    MissingAssignment {
        container: Echo,
        memory_field: String,
        units: u64,
    },
    #[error("gpushare.io/assignment has no entry for container {container}")]
    NoEntryForContainer { container: Echo },
    #[error("gpushare.io/assignment entry for container {container} lists no GPU")]
    EmptyEntry { container: Echo },
    #[error(
        "gpushare.io/assignment assigns GPU {gpu_index} to container {container} but kubelet granted it no {memory_field} (container annotation gpushare.io/granted-mem is missing)"
    )]
    NotGranted {
        container: Echo,
        gpu_index: u32,
        memory_field: String,
    },
    #[error("gpushare.io/assignment gpuIndex {value} does not exist on this node ({available})")]
    NoSuchGpu { value: u32, available: String },
    #[error("gpushare.io/assignment gpuIndex {index} appears twice for container {container}")]
    DuplicateGpu { container: Echo, index: u32 },
    #[error("gpushare.io/assignment gpuUuid {value} does not match GPU {index} ({actual})")]
    UuidMismatch {
        value: Echo,
        index: u32,
        actual: String,
    },
    #[error("gpushare.io/assignment memoryMiB {value} must be positive")]
    ZeroMemory { value: u64 },
    #[error(
        "gpushare.io/assignment memoryMiB {value} exceeds the memory of GPU {index} ({gpu_mib} MiB)"
    )]
    MemoryExceedsGpu {
        value: u64,
        index: u32,
        gpu_mib: u64,
    },
    #[error(
        "gpushare.io/assignment gives container {container} {assigned_mib} MiB but kubelet granted {memory_field}={units} ({granted_mib} MiB)"
    )]
    MemoryMismatch {
        container: Echo,
        assigned_mib: u64,
        memory_field: String,
        units: u64,
        granted_mib: u64,
    },
    #[error(
        "gpushare.io/assignment gives container {container} corePercent {assigned} but kubelet granted {core_field}={granted}"
    )]
    CoreMismatch {
        container: Echo,
        assigned: String,
        core_field: String,
        granted: String,
    },
    #[error(
        "gpushare.io/assignment gives container {container} {assigned} GPUs but kubelet granted {count_field}={granted}"
    )]
    CountMismatch {
        container: Echo,
        assigned: usize,
        count_field: String,
        granted: u32,
    },
    #[error(
        "gpushare.io/assignment spreads container {container} over {assigned} GPUs but kubelet granted no {count_field}: without a count a container gets exactly one GPU"
    )]
    SpreadWithoutCount {
        container: Echo,
        assigned: usize,
        count_field: String,
    },
    /// Values that are each in range add up to more than 64 bits hold.
    #[error("{what} adds up to more than {max}")]
    SumTooLarge { what: String, max: u64 },
}

impl From<SchemaError> for RequestError {
    fn from(e: SchemaError) -> Self {
        RequestError::AssignmentSchema(e)
    }
}

/// How strictly the node checks requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRules {
    pub names: ResourceNames,
    /// Require the device plugin's grant for any assigned container. Without it, a pod could
    /// obtain a GPU by writing the assignment annotation itself.
    pub require_grant: bool,
}

impl Default for RequestRules {
    fn default() -> Self {
        RequestRules {
            names: ResourceNames::default(),
            require_grant: true,
        }
    }
}

/// One GPU a container gets, validated against this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AssignedGpu {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
    pub memory_mib: u64,
    /// GPU total memory (for the ACK-compatible environment).
    pub gpu_memory_mib: u64,
    pub core_percent: Option<u32>,
}

/// What one container gets on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerRequest {
    pub gpus: Vec<AssignedGpu>,
}

impl ContainerRequest {
    /// Memory over all its GPUs; saturates (each share is at most a GPU's memory, so a real
    /// request never comes near).
    pub fn memory_mib(&self) -> u64 {
        self.gpus
            .iter()
            .fold(0u64, |acc, g| acc.saturating_add(g.memory_mib))
    }
}

/// Decides what container `container` of a pod gets. `Ok(None)`: the container asks for no
/// GPU and is left untouched. Cheap for that case: two map lookups.
pub fn container_request(
    pod_annotations: &HashMap<String, String>,
    container: &str,
    container_annotations: &HashMap<String, String>,
    inventory: &Inventory,
    rules: &RequestRules,
) -> Result<Option<ContainerRequest>, RequestError> {
    let names = &rules.names;
    let grant = limits::parse_grant(container_annotations, names)?;
    let raw = pod_annotations.get(ASSIGNMENT_ANNOTATION);
    let (grant, raw) = match (grant, raw) {
        (None, None) => return Ok(None),
        (Some(g), None) => {
            return Err(RequestError::MissingAssignment {
                container: Echo::new(container),
                memory_field: names.memory.clone(),
                units: g.memory_units,
            });
        }
        (g, Some(raw)) => (g, raw),
    };
    let assignment = Assignment::parse(raw)?;
    let Some(shares) = assignment.containers.get(container) else {
        return match grant {
            // The pod has GPU containers, this one is not among them.
            None => Ok(None),
            Some(_) => Err(RequestError::NoEntryForContainer {
                container: Echo::new(container),
            }),
        };
    };
    if shares.is_empty() {
        return Err(RequestError::EmptyEntry {
            container: Echo::new(container),
        });
    }
    let mut gpus = Vec::with_capacity(shares.len());
    let mut seen = BTreeSet::new();
    for share in shares {
        let Some(gpu) = inventory.get(share.gpu_index) else {
            return Err(RequestError::NoSuchGpu {
                value: share.gpu_index,
                available: inventory.describe(),
            });
        };
        if !seen.insert(share.gpu_index) {
            return Err(RequestError::DuplicateGpu {
                container: Echo::new(container),
                index: share.gpu_index,
            });
        }
        if !share.gpu_uuid.is_empty() && share.gpu_uuid != gpu.uuid {
            return Err(RequestError::UuidMismatch {
                value: Echo::new(&share.gpu_uuid),
                index: gpu.index,
                actual: gpu.uuid.clone(),
            });
        }
        if share.memory_mib == 0 {
            return Err(RequestError::ZeroMemory { value: 0 });
        }
        if share.memory_mib > gpu.memory_mib {
            return Err(RequestError::MemoryExceedsGpu {
                value: share.memory_mib,
                index: gpu.index,
                gpu_mib: gpu.memory_mib,
            });
        }
        let core_percent = share
            .core_percent
            .map(|c| validate_core_percent("gpushare.io/assignment corePercent", c))
            .transpose()?;
        gpus.push(AssignedGpu {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
            memory_mib: share.memory_mib,
            gpu_memory_mib: gpu.memory_mib,
            core_percent,
        });
    }
    let request = ContainerRequest { gpus };
    match grant {
        Some(g) => cross_check(container, &request, &g, names)?,
        None if rules.require_grant => {
            return Err(RequestError::NotGranted {
                container: Echo::new(container),
                gpu_index: request.gpus[0].index,
                memory_field: names.memory.clone(),
            });
        }
        None => {}
    }
    Ok(Some(request))
}

/// The assignment must give exactly what kubelet accounted, or the node's books and the
/// scheduler's disagree and GPUs get over-committed.
fn cross_check(
    container: &str,
    req: &ContainerRequest,
    grant: &GpuQuantities,
    names: &ResourceNames,
) -> Result<(), RequestError> {
    let granted_mib = grant.memory_mib(names.memory_unit);
    let assigned_mib = req
        .gpus
        .iter()
        .try_fold(0u64, |acc, g| acc.checked_add(g.memory_mib))
        .ok_or_else(|| RequestError::SumTooLarge {
            what: format!(
                "gpushare.io/assignment memoryMiB of container {}",
                Echo::new(container)
            ),
            max: u64::MAX,
        })?;
    if assigned_mib != granted_mib {
        return Err(RequestError::MemoryMismatch {
            container: Echo::new(container),
            assigned_mib,
            memory_field: names.memory.clone(),
            units: grant.memory_units,
            granted_mib,
        });
    }
    // Each share is at most 100 and a container has at most 64: no u32 overflow, but checked
    // all the same (a share built by hand is not bounded).
    let assigned_core: Option<u32> = req
        .gpus
        .iter()
        .map(|g| g.core_percent)
        .try_fold(0u32, |acc, c| c.map(|c| acc.saturating_add(c)));
    let any_core = req.gpus.iter().any(|g| g.core_percent.is_some());
    let fmt = |c: Option<u32>| c.map_or("none".to_string(), |c| c.to_string());
    if (any_core || grant.core_percent.is_some()) && assigned_core != grant.core_percent {
        return Err(RequestError::CoreMismatch {
            container: Echo::new(container),
            assigned: fmt(if any_core { assigned_core } else { None }),
            core_field: names.core.clone(),
            granted: fmt(grant.core_percent),
        });
    }
    // Without a granted count a container holds exactly one GPU: 4 GiB / 20 % must not be
    // spread over four GPUs at 1 GiB / 5 % each.
    if grant.count.is_none() && req.gpus.len() != 1 {
        return Err(RequestError::SpreadWithoutCount {
            container: Echo::new(container),
            assigned: req.gpus.len(),
            count_field: names.count.clone(),
        });
    }
    if let Some(count) = grant.count
        && count as usize != req.gpus.len()
    {
        return Err(RequestError::CountMismatch {
            container: Echo::new(container),
            assigned: req.gpus.len(),
            count_field: names.count.clone(),
            granted: count,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::limits::{GRANTED_CORE_ANNOTATION, GRANTED_MEM_ANNOTATION};
    use super::*;
    use crate::inventory::{SimConfig, sim_inventory as inventory};
    use proptest::prelude::*;

    fn inv() -> Inventory {
        Inventory::new(inventory(&SimConfig::default(), "n"))
    }

    fn pod(assignment: &str) -> HashMap<String, String> {
        HashMap::from([(ASSIGNMENT_ANNOTATION.to_string(), assignment.to_string())])
    }

    fn granted(mem: &str, core: Option<&str>) -> HashMap<String, String> {
        let mut m = HashMap::from([(GRANTED_MEM_ANNOTATION.to_string(), mem.to_string())]);
        if let Some(c) = core {
            m.insert(GRANTED_CORE_ANNOTATION.to_string(), c.to_string());
        }
        m
    }

    fn one(idx: i64, mem: u64, core: &str) -> String {
        format!(
            r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":{idx},"memoryMiB":{mem}{core}}}]}}}}"#
        )
    }

    fn req(
        pod_ann: &str,
        ctr: HashMap<String, String>,
    ) -> Result<Option<ContainerRequest>, RequestError> {
        container_request(
            &pod(pod_ann),
            "main",
            &ctr,
            &inv(),
            &RequestRules::default(),
        )
    }

    #[test]
    fn valid_request_gets_the_assigned_gpu() {
        let r = req(
            &one(1, 2048, r#","corePercent":30"#),
            granted("2", Some("30")),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert_eq!(
            (g.index, g.minor, g.memory_mib, g.core_percent),
            (1, 1, 2048, Some(30))
        );
        assert_eq!(g.uuid, inv().get(1).unwrap().uuid);
        assert_eq!(g.gpu_memory_mib, 15360);
    }

    #[test]
    fn a_grant_without_a_count_is_one_gpu_not_a_spread() {
        // 4 GiB / 20 % granted, spread over four GPUs at 1 GiB / 5 % each: refused.
        let spread = r#"{"version":1,"containers":{"main":[{"gpuIndex":0,"memoryMiB":1024,"corePercent":5},{"gpuIndex":1,"memoryMiB":1024,"corePercent":5},{"gpuIndex":2,"memoryMiB":1024,"corePercent":5},{"gpuIndex":3,"memoryMiB":1024,"corePercent":5}]}}"#;
        let e = req(spread, granted("4", Some("20"))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpushare.io/assignment spreads container \"main\" over 4 GPUs but kubelet granted no aliyun.com/gpu-count: without a count a container gets exactly one GPU"
        );
        // With the count granted it is what kubelet accounted.
        let mut g = granted("4", Some("20"));
        g.insert(
            super::limits::GRANTED_COUNT_ANNOTATION.to_string(),
            "4".to_string(),
        );
        assert_eq!(req(spread, g).unwrap().unwrap().gpus.len(), 4);
    }

    #[test]
    fn no_gpu_request_is_untouched() {
        let none = container_request(
            &HashMap::new(),
            "main",
            &HashMap::new(),
            &inv(),
            &RequestRules::default(),
        );
        assert_eq!(none, Ok(None));
        // A sidecar of a GPU pod: the pod has an assignment, this container has no entry.
        let r = container_request(
            &pod(&one(1, 2048, "")),
            "sidecar",
            &HashMap::new(),
            &inv(),
            &RequestRules::default(),
        );
        assert_eq!(r, Ok(None));
    }

    #[test]
    fn each_bad_input_names_the_problem() {
        let cases: Vec<(String, HashMap<String, String>, &str)> = vec![
            (one(1, 2048, r#","corePercent":33"#), granted("2", Some("33")), "aliyun.com/gpu-core.percentage 33 is not a multiple of 5"),
            (one(1, 2048, r#","corePercent":33"#), granted("2", None), "corePercent 33 is not a multiple of 5"),
            (one(1, 2048, r#","corePercent":0"#), granted("2", None), "corePercent 0 is not in [5, 100]"),
            (one(1, 2048, r#","corePercent":105"#), granted("2", None), "corePercent 105 is not in [5, 100]"),
            (one(7, 2048, ""), granted("2", None), "gpuIndex 7 does not exist on this node (4 GPUs: 0-3)"),
            (one(1, 20480, ""), granted("20", None), "memoryMiB 20480 exceeds the memory of GPU 1 (15360 MiB)"),
            ("{\"version\":1,".to_string(), granted("2", None), "gpushare.io/assignment is not valid JSON"),
            (one(1, 4096, ""), granted("2", None), "gives container \"main\" 4096 MiB but kubelet granted aliyun.com/gpu-mem=2 (2048 MiB)"),
            (one(1, 2048, r#","corePercent":30"#), granted("2", Some("40")), "corePercent 30 but kubelet granted aliyun.com/gpu-core.percentage=40"),
            (one(1, 2048, ""), granted("2", Some("40")), "corePercent none but kubelet granted aliyun.com/gpu-core.percentage=40"),
            (one(1, 2048, ""), HashMap::new(), "granted it no aliyun.com/gpu-mem"),
            (r#"{"version":1,"containers":{"other":[]}}"#.to_string(), granted("2", None), "no entry for container \"main\""),
            (r#"{"version":1,"containers":{"main":[]}}"#.to_string(), granted("2", None), "lists no GPU"),
            (r#"{"version":1,"containers":{"main":[{"gpuIndex":1,"gpuUuid":"GPU-bogus","memoryMiB":2048}]}}"#.to_string(), granted("2", None), "gpuUuid \"GPU-bogus\" does not match GPU 1"),
        ];
        for (ann, ctr, want) in cases {
            let e = req(&ann, ctr).unwrap_err();
            assert!(e.to_string().contains(want), "{ann}: got {e}, want {want}");
        }
        let e = container_request(
            &HashMap::new(),
            "main",
            &granted("2", None),
            &inv(),
            &RequestRules::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("granted aliyun.com/gpu-mem=2 but the pod has no gpushare.io/assignment"),
            "{e}"
        );
    }

    /// Hardening item 1: a refusal shows an outside value cut to a prefix and its length.
    #[test]
    fn refusals_echo_long_values_cut() {
        let big = "a".repeat(1 << 20);
        let cut = format!("\"{}…\" (1048576 bytes)", "a".repeat(64));
        let e = req(&one(1, 2048, ""), granted(&big, None))
            .unwrap_err()
            .to_string();
        assert_eq!(e, format!("aliyun.com/gpu-mem {cut} is not an integer"));
        // Inside an annotation: under the 256 KiB Kubernetes allows.
        let mid = "a".repeat(200 << 10);
        let mid_cut = format!("\"{}…\" (204800 bytes)", "a".repeat(64));
        let ann = format!(
            r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":1,"gpuUuid":"{mid}","memoryMiB":2048}}]}}}}"#
        );
        let e = req(&ann, granted("2", None)).unwrap_err().to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..200]);
        assert!(
            e.starts_with(&format!(
                "gpushare.io/assignment gpuUuid {mid_cut} does not match GPU 1"
            )),
            "{e}"
        );
        let e = container_request(
            &pod(&one(1, 2048, "")),
            &big,
            &granted("2", None),
            &inv(),
            &RequestRules::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            format!("gpushare.io/assignment has no entry for container {cut}")
        );
        let ann = format!(
            r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":"{mid}","memoryMiB":2048}}]}}}}"#
        );
        let e = req(&ann, granted("2", None)).unwrap_err().to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..200]);
        let ann = format!(r#"{{"version":1,"containers":{{"{mid}":[]}}}}"#);
        let e = container_request(
            &pod(&ann),
            &mid,
            &granted("2", None),
            &inv(),
            &RequestRules::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..200]);
    }

    proptest! {
        /// Whatever the core value, the request is accepted iff it is a multiple of 5 in
        /// [5, 100], and an accepted request carries exactly that value.
        #[test]
        fn core_accepted_iff_valid(core in -20i64..130) {
            let r = req(&one(0, 1024, &format!(r#","corePercent":{core}"#)), granted("1", Some(&core.to_string())));
            let valid = (5..=100).contains(&core) && core % 5 == 0;
            prop_assert_eq!(r.is_ok(), valid);
            if valid {
                prop_assert_eq!(r.unwrap().unwrap().gpus[0].core_percent, Some(core as u32));
            }
        }

        /// Memory is accepted iff it fits the GPU and matches the grant.
        #[test]
        fn memory_accepted_iff_fits(units in 1u64..20) {
            let r = req(&one(2, units * 1024, ""), granted(&units.to_string(), None));
            prop_assert_eq!(r.is_ok(), units <= 15);
        }

        /// The parser never panics on arbitrary annotation text.
        #[test]
        fn arbitrary_annotation_never_panics(s in ".{0,200}") {
            let _ = req(&s, granted("1", None));
        }
    }
}
