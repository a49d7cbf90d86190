//! The openb trace files (Alibaba cluster-trace-gpu-v2023): node list and pod lists, CSV with
//! a header line. Columns are found by name; extra columns are ignored.

use std::path::{Path, PathBuf};

use gpushare_core::placement::model::MAX_GPUS_PER_NODE;
use gpushare_core::placement::{GpuDemand, NodeSpec, Request, ScheduleMode};

/// Memory of one trace GPU: the trace gives no GPU memory, and `gpu_milli` stands for the same
/// fraction of memory and of compute, so 16 MiB per milli keeps both exact.
pub const TRACE_GPU_MEMORY_MIB: u64 = 16_000;
const MIB_PER_MILLI: u64 = TRACE_GPU_MEMORY_MIB / 1000;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no header line")]
    Empty { path: PathBuf },
    #[error("{path}: no nodes")]
    NoNodes { path: PathBuf },
    #[error("{path}: column {column:?} is missing from the header")]
    MissingColumn { path: PathBuf, column: &'static str },
    #[error("{path} line {line}: {column} {value:?} is not a non-negative integer")]
    BadNumber {
        path: PathBuf,
        line: usize,
        column: &'static str,
        value: String,
    },
    #[error("{path} line {line}: {column} {gpus} is more than {MAX_GPUS_PER_NODE} GPUs")]
    TooManyGpus {
        path: PathBuf,
        line: usize,
        column: &'static str,
        gpus: u64,
    },
    #[error("{path} line {line}: {fields} fields, the header has {header}")]
    FieldCount {
        path: PathBuf,
        line: usize,
        fields: usize,
        header: usize,
    },
}

/// One pod of a pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Per GPU, clipped to [0, 1000].
    pub gpu_milli: u32,
    /// Accepted models; empty: any.
    pub gpu_spec: Vec<String>,
}

impl TracePod {
    /// GPU demand in milli: num_gpu × gpu_milli.
    pub fn gpu_demand(&self) -> u64 {
        self.num_gpu as u64 * self.gpu_milli as u64
    }

    /// The request the engine places: a sharing pod (one GPU, milli < 1000) takes that
    /// fraction of a GPU's memory and compute; any other GPU pod takes whole GPUs.
    pub fn request(&self) -> Request {
        let gpu = match (self.num_gpu, self.gpu_milli) {
            (0, _) => GpuDemand::None,
            (1, m) if m < 1000 => GpuDemand::Shared {
                count: 1,
                memory_mib: m as u64 * MIB_PER_MILLI,
                core_milli: Some(m),
            },
            (k, _) => GpuDemand::Whole { count: k },
        };
        Request {
            name: self.name.clone(),
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            gpu,
            models: self.gpu_spec.clone(),
        }
    }
}

struct Csv {
    path: PathBuf,
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Csv {
    fn read(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, head)) = lines.next() else {
            return Err(TraceError::Empty {
                path: path.to_path_buf(),
            });
        };
        let header: Vec<String> = split(head)
            .into_iter()
            .map(|s| s.trim().to_string())
            .collect();
        let mut rows = Vec::new();
        for (i, l) in lines {
            let fields = split(l);
            if fields.len() != header.len() {
                return Err(TraceError::FieldCount {
                    path: path.to_path_buf(),
                    line: i + 1,
                    fields: fields.len(),
                    header: header.len(),
                });
            }
            rows.push((i + 1, fields));
        }
        Ok(Csv {
            path: path.to_path_buf(),
            header,
            rows,
        })
    }

    fn col(&self, name: &'static str) -> Result<usize, TraceError> {
        self.optional_col(name).ok_or(TraceError::MissingColumn {
            path: self.path.clone(),
            column: name,
        })
    }

    /// A column a published trace may leave out (the openb multi-GPU pod lists carry only
    /// `name,cpu_milli,memory_mib,num_gpu,gpu_milli`).
    fn optional_col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    fn num(
        &self,
        line: usize,
        row: &[String],
        col: usize,
        name: &'static str,
    ) -> Result<u64, TraceError> {
        let raw = row[col].trim();
        raw.parse::<u64>().map_err(|_| TraceError::BadNumber {
            path: self.path.clone(),
            line,
            column: name,
            value: raw.to_string(),
        })
    }
}

/// Splits one CSV line; fields may be double-quoted (with `""` for a quote).
fn split(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Reads a node list (`sn, cpu_milli, memory_mib, gpu, model`). Every node shares its GPUs
/// with compute quotas (`core_mem`), as the trace's pods all carry a GPU fraction.
pub fn read_nodes(path: &Path) -> Result<Vec<NodeSpec>, TraceError> {
    let csv = Csv::read(path)?;
    let (sn, cpu, mem, gpu, model) = (
        csv.col("sn")?,
        csv.col("cpu_milli")?,
        csv.col("memory_mib")?,
        csv.col("gpu")?,
        csv.col("model")?,
    );
    csv.rows
        .iter()
        .map(|(line, r)| {
            // Bounded before anything is allocated for them (GPU sets are 64-bit masks).
            let gpus = csv.num(*line, r, gpu, "gpu")?;
            if gpus > MAX_GPUS_PER_NODE as u64 {
                return Err(TraceError::TooManyGpus {
                    path: csv.path.clone(),
                    line: *line,
                    column: "gpu",
                    gpus,
                });
            }
            Ok(NodeSpec::uniform(
                r[sn].trim(),
                csv.num(*line, r, cpu, "cpu_milli")?,
                csv.num(*line, r, mem, "memory_mib")?,
                gpus as usize,
                TRACE_GPU_MEMORY_MIB,
                r[model].trim(),
                ScheduleMode::CoreMem,
            ))
        })
        .collect()
}

/// Reads a pod list (`name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec], …`). A
/// missing `gpu_spec` column means every pod takes any GPU model, as an empty field does.
pub fn read_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    let csv = Csv::read(path)?;
    let (name, cpu, mem, num, milli) = (
        csv.col("name")?,
        csv.col("cpu_milli")?,
        csv.col("memory_mib")?,
        csv.col("num_gpu")?,
        csv.col("gpu_milli")?,
    );
    let spec = csv.optional_col("gpu_spec");
    csv.rows
        .iter()
        .map(|(line, r)| {
            // Bounded as a node's GPU count is (a wider value used to wrap to a small one).
            let num_gpu = csv.num(*line, r, num, "num_gpu")?;
            if num_gpu > MAX_GPUS_PER_NODE as u64 {
                return Err(TraceError::TooManyGpus {
                    path: csv.path.clone(),
                    line: *line,
                    column: "num_gpu",
                    gpus: num_gpu,
                });
            }
            Ok(TracePod {
                name: r[name].trim().to_string(),
                cpu_milli: csv.num(*line, r, cpu, "cpu_milli")?,
                memory_mib: csv.num(*line, r, mem, "memory_mib")?,
                num_gpu: num_gpu as u32,
                gpu_milli: csv.num(*line, r, milli, "gpu_milli")?.min(1000) as u32,
                gpu_spec: spec
                    .map(|c| {
                        r[c].split('|')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The trace's name from a pod-list file name: `openb_pod_list_gpushare40.csv` → `gpushare40`.
pub fn trace_name(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    stem.strip_prefix("openb_pod_list_")
        .unwrap_or(stem)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_quoted_fields() {
        assert_eq!(split("a,\"b,c\",,\"d\"\"e\""), vec!["a", "b,c", "", "d\"e"]);
    }

    #[test]
    fn reads_files_and_names_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = dir.path().join("nodes.csv");
        std::fs::write(
            &nodes,
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n",
        )
        .unwrap();
        let n = read_nodes(&nodes).unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(
            (n[0].gpus.len(), n[0].model(), n[0].mode),
            (2, "P100", ScheduleMode::CoreMem)
        );
        let pods = dir.path().join("openb_pod_list_x.csv");
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
             p0,12000,16384,1,460,,LS\np1,1000,10,2,1000,V100M16|V100M32,BE\np2,1,1,0,0,,LS\np3,1,1,1,1500,,LS\n",
        )
        .unwrap();
        let p = read_pods(&pods).unwrap();
        assert_eq!(trace_name(&pods), "x");
        assert_eq!(
            p[0].request().gpu,
            GpuDemand::Shared {
                count: 1,
                memory_mib: 460 * 16,
                core_milli: Some(460)
            }
        );
        assert_eq!(p[1].request().gpu, GpuDemand::Whole { count: 2 });
        assert_eq!(p[1].gpu_spec, vec!["V100M16", "V100M32"]);
        assert_eq!(p[2].request().gpu, GpuDemand::None);
        assert_eq!(
            (p[3].gpu_milli, p[3].request().gpu),
            (1000, GpuDemand::Whole { count: 1 })
        );
        assert_eq!(p[1].gpu_demand(), 2000);
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,x,1,0,0,\n",
        )
        .unwrap();
        let e = read_pods(&pods).unwrap_err().to_string();
        assert!(
            e.ends_with("line 2: cpu_milli \"x\" is not a non-negative integer"),
            "{e}"
        );
        // The openb multi-GPU pod lists as published: no gpu_spec (nor qos, phase, times).
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,8000,30000,8,1000\np1,1,1,1,250\n",
        )
        .unwrap();
        let p = read_pods(&pods).unwrap();
        assert_eq!(p[0].request().gpu, GpuDemand::Whole { count: 8 });
        assert!(p[0].gpu_spec.is_empty() && p[1].gpu_spec.is_empty());
        assert_eq!(p[1].gpu_demand(), 250);
        // A GPU count that does not fit a node is an error naming the column, not a wrap.
        std::fs::write(
            &pods,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,4294967297,1000\n",
        )
        .unwrap();
        let e = read_pods(&pods).unwrap_err().to_string();
        assert!(
            e.ends_with("line 2: num_gpu 4294967297 is more than 64 GPUs"),
            "{e}"
        );
        std::fs::write(&pods, "name,cpu_milli\np,1\n").unwrap();
        let e = read_pods(&pods).unwrap_err().to_string();
        assert!(e.contains("column \"memory_mib\" is missing"), "{e}");
        // Hardening item 8: more GPUs than a node may have is an error of the file, before
        // anything is allocated for them (the engine used to panic on 65).
        for gpus in ["65", "1000000000000"] {
            std::fs::write(
                &nodes,
                format!("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,{gpus},P100\n"),
            )
            .unwrap();
            let e = read_nodes(&nodes).unwrap_err().to_string();
            assert!(
                e.ends_with(&format!("line 2: gpu {gpus} is more than 64 GPUs")),
                "{e}"
            );
        }
    }
}
