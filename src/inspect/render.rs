//! Text and JSON forms of a [`ClusterView`]. Pure.
//!
//! Memory totals are shown as whole units per GPU (floored, as the device plugin advertises
//! them: a GPU of 81559 MiB offers 79 GiB); allocations are exact, with one decimal when not a
//! whole unit.

use super::{ClusterView, NodeView};
use gpushare_core::request::lifecycle::ContainerRole;
use gpushare_core::request::limits::MemoryUnit;

/// An amount of memory in `unit`: whole when exact, else one decimal.
pub fn amount(mib: u64, unit: MemoryUnit) -> String {
    let u = unit.mib();
    if mib.is_multiple_of(u) {
        (mib / u).to_string()
    } else {
        format!("{:.1}", mib as f64 / u as f64)
    }
}

/// What a GPU of `mib` offers in whole `unit`s.
fn capacity_units(mib: u64, unit: MemoryUnit) -> u64 {
    mib / unit.mib()
}

fn node_memory_capacity(node: &NodeView, unit: MemoryUnit) -> u64 {
    node.gpus
        .iter()
        .map(|g| capacity_units(g.totals.memory_total_mib, unit))
        .sum()
}

fn percent(part: u64, whole: u64) -> u64 {
    (part * 100).checked_div(whole).unwrap_or(0)
}

/// `allocated/total (pct%)` for memory, percent of the shown capacity.
fn memory_ratio(allocated_mib: u64, capacity: u64, unit: MemoryUnit) -> String {
    format!(
        "{}/{} ({}%)",
        amount(allocated_mib, unit),
        capacity,
        percent(allocated_mib, capacity * unit.mib())
    )
}

fn core_ratio(allocated: u64, total: u64) -> String {
    format!("{allocated}/{total} ({}%)", percent(allocated, total))
}

/// Left-aligned columns, two spaces apart, no trailing spaces.
fn align(rows: &[Vec<String>]) -> Vec<String> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < r.len() {
                    let pad = widths[i] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

fn cluster_footer(view: &ClusterView, unit: MemoryUnit) -> [String; 2] {
    let capacity: u64 = view
        .nodes
        .iter()
        .map(|n| node_memory_capacity(n, unit))
        .sum();
    [
        format!(
            "Allocated/Total GPU Memory In Cluster: {}",
            memory_ratio(view.totals.memory_allocated_mib, capacity, unit)
        ),
        format!(
            "Allocated/Total GPU Core In Cluster: {}",
            core_ratio(view.totals.core_allocated, view.totals.core_total)
        ),
    ]
}

/// The default view, one row per node:
///
/// ```text
/// NAME    IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU Memory(GiB)  GPU Core(%)
/// node-a  10.0.0.1   4/15                   2/15                   6/30             90/200
/// ----------------------------------------------------------------------------------------------
/// Allocated/Total GPU Memory In Cluster: 6/30 (20%)
/// Allocated/Total GPU Core In Cluster: 90/200 (45%)
/// ```
///
/// A GPU a node does not have shows `-`; an unhealthy GPU is marked `*`.
pub fn table(view: &ClusterView, unit: MemoryUnit) -> String {
    let columns = view
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(|g| g.index as usize + 1))
        .max()
        .unwrap_or(0);
    let mut header = vec!["NAME".to_string(), "IPADDRESS".to_string()];
    header.extend((0..columns).map(|i| format!("GPU{i}(Allocated/Total)")));
    header.push(format!("GPU Memory({})", unit.name()));
    header.push("GPU Core(%)".to_string());
    let mut rows = vec![header];
    let mut unhealthy = false;
    for n in &view.nodes {
        let mut row = vec![
            n.name.clone(),
            if n.address.is_empty() {
                "-".to_string()
            } else {
                n.address.clone()
            },
        ];
        for i in 0..columns {
            let cell = match n.gpus.iter().find(|g| g.index as usize == i) {
                Some(g) => {
                    unhealthy |= !g.healthy;
                    format!(
                        "{}/{}{}",
                        amount(g.totals.memory_allocated_mib, unit),
                        capacity_units(g.totals.memory_total_mib, unit),
                        if g.healthy { "" } else { "*" }
                    )
                }
                None => "-".to_string(),
            };
            row.push(cell);
        }
        row.push(format!(
            "{}/{}",
            amount(n.totals.memory_allocated_mib, unit),
            node_memory_capacity(n, unit)
        ));
        row.push(format!(
            "{}/{}",
            n.totals.core_allocated, n.totals.core_total
        ));
        rows.push(row);
    }
    let lines = align(&rows);
    let width = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for l in &lines {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(&"-".repeat(width));
    out.push('\n');
    for l in cluster_footer(view, unit) {
        out.push_str(&l);
        out.push('\n');
    }
    if unhealthy {
        out.push_str("* unhealthy GPU\n");
    }
    out
}

/// Per node: its labels, one row per GPU (model, UUID, health, memory and core), one row per
/// container share of a GPU (init containers and sidecars marked), the node's totals and
/// warnings; then the cluster totals.
pub fn details(view: &ClusterView, unit: MemoryUnit) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mem_header = format!("MEMORY({})", unit.name());
    let mut out = String::new();
    for n in &view.nodes {
        let head = [
            vec!["NAME:".to_string(), n.name.clone()],
            vec!["IPADDRESS:".to_string(), dash(&n.address)],
            vec![
                "SCHEDULE:".to_string(),
                dash(n.schedule.as_deref().unwrap_or_default()),
            ],
            vec![
                "PLACEMENT:".to_string(),
                dash(n.placement.as_deref().unwrap_or_default()),
            ],
        ];
        for l in align(&head) {
            out.push_str(&l);
            out.push('\n');
        }
        out.push('\n');

        let mut gpus = vec![vec![
            "GPU".to_string(),
            "MODEL".to_string(),
            "UUID".to_string(),
            "HEALTH".to_string(),
            mem_header.clone(),
            "CORE(%)".to_string(),
        ]];
        for g in &n.gpus {
            gpus.push(vec![
                g.index.to_string(),
                dash(&g.model),
                dash(&g.uuid),
                if g.healthy { "Healthy" } else { "Unhealthy" }.to_string(),
                format!(
                    "{}/{}",
                    amount(g.totals.memory_allocated_mib, unit),
                    capacity_units(g.totals.memory_total_mib, unit)
                ),
                format!("{}/{}", g.totals.core_allocated, g.totals.core_total),
            ]);
        }
        for l in align(&gpus) {
            out.push_str(&l);
            out.push('\n');
        }
        out.push('\n');

        let mut shares = vec![vec![
            "GPU".to_string(),
            "POD".to_string(),
            "CONTAINER".to_string(),
            mem_header.clone(),
            "CORE(%)".to_string(),
        ]];
        for g in &n.gpus {
            for s in &g.shares {
                shares.push(vec![
                    g.index.to_string(),
                    format!("{}/{}", s.namespace, s.pod),
                    match s.role {
                        ContainerRole::App => s.container.clone(),
                        ContainerRole::Init => format!("{} (init)", s.container),
                        ContainerRole::Sidecar => format!("{} (sidecar)", s.container),
                    },
                    amount(s.memory_mib, unit),
                    s.core_percent.map_or("-".to_string(), |c| c.to_string()),
                ]);
            }
        }
        if shares.len() == 1 {
            out.push_str("no pods hold GPU shares on this node\n");
        } else {
            for l in align(&shares) {
                out.push_str(&l);
                out.push('\n');
            }
        }
        out.push('\n');
        out.push_str(&format!(
            "Allocated/Total GPU Memory: {}\n",
            memory_ratio(
                n.totals.memory_allocated_mib,
                node_memory_capacity(n, unit),
                unit
            )
        ));
        out.push_str(&format!(
            "Allocated/Total GPU Core: {}\n",
            core_ratio(n.totals.core_allocated, n.totals.core_total)
        ));
        for w in &n.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out.push_str(&"-".repeat(72));
        out.push('\n');
    }
    for l in cluster_footer(view, unit) {
        out.push_str(&l);
        out.push('\n');
    }
    for w in &view.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

/// The view as pretty-printed JSON (memory in MiB), ending in a newline.
pub fn json(view: &ClusterView) -> String {
    let mut s = serde_json::to_string_pretty(view).expect("inspect view serializes");
    s.push('\n');
    s
}

/// Every warning of the view, node warnings prefixed with the node name.
pub fn all_warnings(view: &ClusterView) -> Vec<String> {
    view.nodes
        .iter()
        .flat_map(|n| {
            n.warnings
                .iter()
                .map(move |w| format!("node {}: {w}", n.name))
        })
        .chain(view.warnings.iter().cloned())
        .collect()
}
