//! Resource names, units and the quantities a pod asks for (`aliyun.com/gpu-mem: 2`,
//! `aliyun.com/gpu-core.percentage: 30`, `aliyun.com/gpu-count: 1`), plus what kubelet granted
//! through the device plugin (container annotations `gpushare.io/granted-*`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::RequestError;
use crate::echo::Echo;
use crate::placement::model::MAX_GPUS_PER_NODE;

/// The largest memory quota in MiB: one whose byte count still fits 64 bits (16 EiB), so that
/// MiB → bytes never wraps.
pub const MAX_MEMORY_MIB: u64 = u64::MAX >> 20;

/// Container annotation the device plugin returns from `Allocate` for the memory resource:
/// how many memory units kubelet accounted to the container.
pub const GRANTED_MEM_ANNOTATION: &str = "gpushare.io/granted-mem";
/// Same for the core resource (percent of one GPU).
pub const GRANTED_CORE_ANNOTATION: &str = "gpushare.io/granted-core";
/// Same for the GPU-count resource.
pub const GRANTED_COUNT_ANNOTATION: &str = "gpushare.io/granted-count";

/// Unit of the memory resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryUnit {
    GiB,
    MiB,
}

impl MemoryUnit {
    pub fn mib(self) -> u64 {
        match self {
            MemoryUnit::GiB => 1024,
            MemoryUnit::MiB => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemoryUnit::GiB => "GiB",
            MemoryUnit::MiB => "MiB",
        }
    }
}

impl std::fmt::Display for MemoryUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A memory unit name that is neither GiB nor MiB.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unit {0} is not GiB or MiB")]
pub struct UnknownUnit(pub Echo);

/// The one parser of memory-unit names (command lines; the config file's serde names are the
/// same `GiB` / `MiB`): `GiB`, `Gi`, `MiB`, `Mi`, any case.
impl std::str::FromStr for MemoryUnit {
    type Err = UnknownUnit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "gib" | "gi" => Ok(MemoryUnit::GiB),
            "mib" | "mi" => Ok(MemoryUnit::MiB),
            _ => Err(UnknownUnit(Echo::new(s))),
        }
    }
}

/// Names of the extended resources and the memory unit (configurable per cluster).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceNames {
    pub memory: String,
    pub core: String,
    pub count: String,
    pub memory_unit: MemoryUnit,
}

impl Default for ResourceNames {
    fn default() -> Self {
        ResourceNames {
            memory: "aliyun.com/gpu-mem".into(),
            core: "aliyun.com/gpu-core.percentage".into(),
            count: "aliyun.com/gpu-count".into(),
            memory_unit: MemoryUnit::GiB,
        }
    }
}

impl ResourceNames {
    /// The short form used in messages: `gpu-core.percentage` for `aliyun.com/gpu-core.percentage`.
    pub fn short(name: &str) -> &str {
        name.rsplit('/').next().unwrap_or(name)
    }
}

/// Checks a compute quota: a multiple of 5 in [5, 100].
pub fn validate_core_percent(field: &str, value: i64) -> Result<u32, RequestError> {
    if !(5..=100).contains(&value) {
        return Err(RequestError::CoreOutOfRange {
            field: field.to_string(),
            value,
        });
    }
    if value % 5 != 0 {
        return Err(RequestError::CoreNotMultipleOf5 {
            field: field.to_string(),
            value,
        });
    }
    Ok(value as u32)
}

/// What a container asks for (pod limits) or was granted (device-plugin annotations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GpuQuantities {
    /// Memory in units of [`ResourceNames::memory_unit`].
    pub memory_units: u64,
    /// Percent of one GPU, when a compute quota is asked for.
    pub core_percent: Option<u32>,
    /// Whole GPUs, when asked for.
    pub count: Option<u32>,
}

impl GpuQuantities {
    /// Memory in MiB. Exact for whatever [`parse_limits`] and [`parse_grant`] return (they
    /// refuse more than [`MAX_MEMORY_MIB`]); saturates for quantities built by hand.
    pub fn memory_mib(&self, unit: MemoryUnit) -> u64 {
        self.memory_units.saturating_mul(unit.mib())
    }

    /// The largest memory quantity, in units of `unit`, that the parsers accept.
    pub fn max_memory_units(unit: MemoryUnit) -> u64 {
        MAX_MEMORY_MIB / unit.mib()
    }
}

/// The one parser of memory sizes on command lines (`gpushare run --memory`): a positive
/// integer and a [`MemoryUnit`] name (`2GiB`, `2048MiB`, `2 Gi`), at most [`MAX_MEMORY_MIB`];
/// MiB. `field` names the flag in the error.
pub fn parse_memory_mib(field: &str, raw: &str) -> Result<u64, RequestError> {
    const EXPECTED: &str = "a memory size like 2GiB or 2048MiB";
    let bad = || RequestError::NotAMemorySize {
        field: field.to_string(),
        value: Echo::new(raw),
    };
    if raw.trim() != raw {
        return Err(RequestError::Whitespace {
            field: field.to_string(),
            value: Echo::new(raw),
            expected: EXPECTED,
        });
    }
    let split = raw.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = raw.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let unit: MemoryUnit = unit.trim_start().parse().map_err(|_| bad())?;
    let too_big = || RequestError::OutOfRange {
        field: field.to_string(),
        value: Echo::new(raw),
        expected: format!("a memory size in [1, {MAX_MEMORY_MIB}] MiB"),
    };
    // All digits: a failed parse is an overflow.
    let number: u64 = number.parse().map_err(|_| too_big())?;
    match number.checked_mul(unit.mib()) {
        Some(0) => Err(RequestError::NotPositive {
            field: field.to_string(),
            value: 0,
        }),
        Some(mib) if mib <= MAX_MEMORY_MIB => Ok(mib),
        _ => Err(too_big()),
    }
}

/// A decimal integer, exactly: no whitespace around it (`" 2"` is refused, naming the value),
/// an optional sign, digits only — or a whole number the way the API server writes a
/// resource quantity back (it stores `16000` as `16k`): digits with one suffix of `k`, `M`,
/// `G`, `T`, `P`, `E` (powers of 1000), `Ki` … `Ei` (powers of 1024) or an exponent `e3` /
/// `E3`. Values that do not fit `i64` are out of range; `range` is what the field takes, for
/// that message (the caller checks the range itself).
fn parse_int(field: &str, raw: &str, range: (i64, i64)) -> Result<i64, RequestError> {
    if raw.trim() != raw {
        return Err(RequestError::Whitespace {
            field: field.to_string(),
            value: Echo::new(raw),
            expected: "an integer",
        });
    }
    let not_integer = || RequestError::NotAnInteger {
        field: field.to_string(),
        value: Echo::new(raw),
    };
    let signed = raw.strip_prefix(['-', '+']).unwrap_or(raw);
    let end = signed
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(signed.len());
    let (digits, suffix) = signed.split_at(end);
    if digits.is_empty() {
        return Err(not_integer());
    }
    let scale = quantity_scale(suffix).ok_or_else(not_integer)?;
    // All digits: a failed parse is an overflow.
    let n: i64 = raw[..raw.len() - suffix.len()]
        .parse()
        .map_err(|_| out_of_range(field, raw, range))?;
    n.checked_mul(scale)
        .ok_or_else(|| out_of_range(field, raw, range))
}

/// The factor of a Kubernetes quantity suffix on a whole number (`None`: not one).
fn quantity_scale(suffix: &str) -> Option<i64> {
    let pow = |base: i64, n: u32| base.checked_pow(n);
    match suffix {
        "" => Some(1),
        "k" => pow(1000, 1),
        "M" => pow(1000, 2),
        "G" => pow(1000, 3),
        "T" => pow(1000, 4),
        "P" => pow(1000, 5),
        "E" => pow(1000, 6),
        "Ki" => pow(1024, 1),
        "Mi" => pow(1024, 2),
        "Gi" => pow(1024, 3),
        "Ti" => pow(1024, 4),
        "Pi" => pow(1024, 5),
        "Ei" => pow(1024, 6),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            if exp.is_empty() || exp.len() > 2 || !exp.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            pow(10, exp.parse().ok()?)
        }
    }
}

fn out_of_range(field: &str, raw: &str, (lo, hi): (i64, i64)) -> RequestError {
    RequestError::OutOfRange {
        field: field.to_string(),
        value: Echo::new(raw),
        expected: format!("an integer in [{lo}, {hi}]"),
    }
}

/// Parses a container's resource limits (as the API server stores them: decimal strings).
/// Returns `None` when the container asks for no GPU resource at all.
pub fn parse_limits(
    limits: &HashMap<String, String>,
    names: &ResourceNames,
) -> Result<Option<GpuQuantities>, RequestError> {
    parse_quantities(
        limits.get(&names.memory).map(String::as_str),
        limits.get(&names.core).map(String::as_str),
        limits.get(&names.count).map(String::as_str),
        names,
    )
}

/// Parses the device plugin's grant annotations on a container.
pub fn parse_grant(
    annotations: &HashMap<String, String>,
    names: &ResourceNames,
) -> Result<Option<GpuQuantities>, RequestError> {
    parse_quantities(
        annotations.get(GRANTED_MEM_ANNOTATION).map(String::as_str),
        annotations.get(GRANTED_CORE_ANNOTATION).map(String::as_str),
        annotations
            .get(GRANTED_COUNT_ANNOTATION)
            .map(String::as_str),
        names,
    )
}

fn parse_quantities(
    mem: Option<&str>,
    core: Option<&str>,
    count: Option<&str>,
    names: &ResourceNames,
) -> Result<Option<GpuQuantities>, RequestError> {
    if mem.is_none() && core.is_none() && count.is_none() {
        return Ok(None);
    }
    let max_units =
        i64::try_from(GpuQuantities::max_memory_units(names.memory_unit)).unwrap_or(i64::MAX);
    let memory_units = match mem {
        Some(raw) => {
            let v = parse_int(&names.memory, raw, (1, max_units))?;
            if v <= 0 {
                return Err(RequestError::NotPositive {
                    field: names.memory.clone(),
                    value: v,
                });
            }
            // Beyond it, MiB or bytes would not fit 64 bits.
            if v > max_units {
                return Err(out_of_range(&names.memory, raw, (1, max_units)));
            }
            v as u64
        }
        None => {
            // A compute quota without memory cannot be placed on a shared GPU.
            return Err(RequestError::CoreWithoutMemory {
                core_field: names.core.clone(),
                memory_field: names.memory.clone(),
            });
        }
    };
    let core_percent = core
        .map(|raw| {
            parse_int(&names.core, raw, (5, 100))
                .and_then(|v| validate_core_percent(&names.core, v))
        })
        .transpose()?;
    let count = count
        .map(|raw| {
            let range = (1, MAX_GPUS_PER_NODE as i64);
            let v = parse_int(&names.count, raw, range)?;
            if v <= 0 {
                Err(RequestError::NotPositive {
                    field: names.count.clone(),
                    value: v,
                })
            } else if v > range.1 {
                // No node has more GPUs (and `as u32` must not truncate).
                Err(out_of_range(&names.count, raw, range))
            } else {
                Ok(v as u32)
            }
        })
        .transpose()?;
    Ok(Some(GpuQuantities {
        memory_units,
        core_percent,
        count,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn core_must_be_multiple_of_5_in_range() {
        for ok in [5, 30, 100] {
            assert_eq!(validate_core_percent("c", ok).unwrap(), ok as u32);
        }
        let e = validate_core_percent("aliyun.com/gpu-core.percentage", 33).unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-core.percentage 33 is not a multiple of 5"
        );
        for bad in [0, -5, 105, 4] {
            let e = validate_core_percent("c", bad).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("c {bad} is not in [5, 100]")),
                "{e}"
            );
        }
    }

    #[test]
    fn limits_parse_and_no_gpu_is_none() {
        let names = ResourceNames::default();
        assert_eq!(parse_limits(&map(&[("cpu", "2")]), &names).unwrap(), None);
        let q = parse_limits(
            &map(&[
                ("aliyun.com/gpu-mem", "2"),
                ("aliyun.com/gpu-core.percentage", "30"),
            ]),
            &names,
        )
        .unwrap()
        .unwrap();
        assert_eq!(q.memory_units, 2);
        assert_eq!(q.memory_mib(names.memory_unit), 2048);
        assert_eq!(q.core_percent, Some(30));
        assert_eq!(q.count, None);
    }

    #[test]
    fn bad_limits_name_field_and_value() {
        let names = ResourceNames::default();
        let e = parse_limits(&map(&[("aliyun.com/gpu-mem", "two")]), &names).unwrap_err();
        assert_eq!(
            e.to_string(),
            "aliyun.com/gpu-mem \"two\" is not an integer"
        );
        let e = parse_limits(&map(&[("aliyun.com/gpu-mem", "0")]), &names).unwrap_err();
        assert_eq!(e.to_string(), "aliyun.com/gpu-mem 0 must be positive");
        let e =
            parse_limits(&map(&[("aliyun.com/gpu-core.percentage", "30")]), &names).unwrap_err();
        assert!(e.to_string().contains("without aliyun.com/gpu-mem"), "{e}");
    }

    #[test]
    fn grant_uses_annotations_and_configured_unit() {
        let names = ResourceNames {
            memory_unit: MemoryUnit::MiB,
            ..Default::default()
        };
        let g = parse_grant(
            &map(&[
                (GRANTED_MEM_ANNOTATION, "512"),
                (GRANTED_COUNT_ANNOTATION, "1"),
            ]),
            &names,
        )
        .unwrap()
        .unwrap();
        assert_eq!(g.memory_mib(names.memory_unit), 512);
        assert_eq!(g.count, Some(1));
    }

    #[test]
    fn memory_sizes_parse_to_mib_and_errors_name_the_flag() {
        for (raw, mib) in [
            ("2GiB", 2048),
            ("2048MiB", 2048),
            ("1Gi", 1024),
            ("512mi", 512),
            ("3 GiB", 3072),
        ] {
            assert_eq!(parse_memory_mib("--memory", raw).unwrap(), mib, "{raw}");
        }
        for raw in ["2", "GiB", "2GB", "2.5GiB", "-1GiB", ""] {
            let e = parse_memory_mib("--memory", raw).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("--memory {raw:?} is not a memory size like 2GiB or 2048MiB")
            );
        }
        let e = parse_memory_mib("--memory", "0GiB").unwrap_err();
        assert_eq!(e.to_string(), "--memory 0 must be positive");
    }

    fn grant_err(kv: &[(&str, &str)]) -> String {
        parse_grant(&map(kv), &ResourceNames::default())
            .unwrap_err()
            .to_string()
    }

    /// Hardening item 5: an integer too large for its field is out of range, with the range
    /// (not "not an integer"), and a count that does not fit is not truncated.
    #[test]
    fn overflowing_quantities_are_out_of_range() {
        assert_eq!(
            grant_err(&[(GRANTED_MEM_ANNOTATION, "99999999999999999999")]),
            "aliyun.com/gpu-mem \"99999999999999999999\" is out of range: expected an integer in [1, 17179869183]"
        );
        assert_eq!(
            grant_err(&[
                (GRANTED_MEM_ANNOTATION, "1"),
                (GRANTED_CORE_ANNOTATION, "-99999999999999999999")
            ]),
            "aliyun.com/gpu-core.percentage \"-99999999999999999999\" is out of range: expected an integer in [5, 100]"
        );
        assert_eq!(
            grant_err(&[
                (GRANTED_MEM_ANNOTATION, "1"),
                (GRANTED_COUNT_ANNOTATION, "4294967297")
            ]),
            "aliyun.com/gpu-count \"4294967297\" is out of range: expected an integer in [1, 64]"
        );
        assert_eq!(
            parse_memory_mib("--memory", "99999999999999999999GiB")
                .unwrap_err()
                .to_string(),
            "--memory \"99999999999999999999GiB\" is out of range: expected a memory size in [1, 17592186044415] MiB"
        );
    }

    /// Hardening item 6: leading or trailing whitespace is refused, naming the value.
    #[test]
    fn whitespace_around_a_quantity_is_refused() {
        for raw in [" 2", "2 ", "\t2", "2\n"] {
            assert_eq!(
                grant_err(&[(GRANTED_MEM_ANNOTATION, raw)]),
                format!(
                    "aliyun.com/gpu-mem {raw:?} has leading or trailing whitespace: expected an integer"
                ),
            );
        }
        assert_eq!(
            grant_err(&[
                (GRANTED_MEM_ANNOTATION, "2"),
                (GRANTED_CORE_ANNOTATION, "30 ")
            ]),
            "aliyun.com/gpu-core.percentage \"30 \" has leading or trailing whitespace: expected an integer"
        );
        let names = ResourceNames::default();
        let e = parse_limits(&map(&[("aliyun.com/gpu-mem", " 2")]), &names).unwrap_err();
        assert!(e.to_string().contains("whitespace"), "{e}");
        assert_eq!(
            parse_memory_mib("--memory", " 3GiB")
                .unwrap_err()
                .to_string(),
            "--memory \" 3GiB\" has leading or trailing whitespace: expected a memory size like 2GiB or 2048MiB"
        );
    }

    /// Hardening item 7: memory in units × the unit, and MiB × 2^20, cannot wrap: a grant whose
    /// MiB or bytes do not fit 64 bits is refused.
    #[test]
    fn memory_that_overflows_in_mib_or_bytes_is_refused() {
        // 2^54 GiB: fits i64, ×1024 does not fit u64.
        assert_eq!(
            grant_err(&[(GRANTED_MEM_ANNOTATION, "18014398509481984")]),
            "aliyun.com/gpu-mem \"18014398509481984\" is out of range: expected an integer in [1, 17179869183]"
        );
        // The largest accepted grant, in MiB and in bytes, fits.
        let g = parse_grant(
            &map(&[(GRANTED_MEM_ANNOTATION, "17179869183")]),
            &ResourceNames::default(),
        )
        .unwrap()
        .unwrap();
        let mib = g.memory_mib(MemoryUnit::GiB);
        assert!(mib.checked_mul(1 << 20).is_some(), "{mib}");
        // Built by hand beyond what the parser accepts: saturates, never wraps.
        let q = GpuQuantities {
            memory_units: u64::MAX,
            ..Default::default()
        };
        assert_eq!(q.memory_mib(MemoryUnit::GiB), u64::MAX);
    }

    /// The API server writes a quantity back in its canonical form: `16000` MiB of a
    /// memory resource counted in MiB comes back as `16k`.
    #[test]
    fn whole_quantities_in_the_api_servers_form_are_integers() {
        let names = ResourceNames {
            memory_unit: MemoryUnit::MiB,
            ..ResourceNames::default()
        };
        let limits = |mem: &str| -> HashMap<String, String> {
            [(names.memory.clone(), mem.to_string())].into()
        };
        for (raw, mib) in [
            ("16k", 16_000),
            ("16000", 16_000),
            ("2Ki", 2048),
            ("2e3", 2000),
        ] {
            let q = parse_limits(&limits(raw), &names).unwrap().unwrap();
            assert_eq!(q.memory_units, mib, "{raw}");
        }
        for raw in ["1.5k", "16kb", "k", "2e", "2e123", "two"] {
            let e = parse_limits(&limits(raw), &names).unwrap_err().to_string();
            assert!(
                e.contains("is not an integer") || e.contains("out of range"),
                "{raw}: {e}"
            );
        }
        let e = parse_limits(&limits("9E"), &names).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    }
}
