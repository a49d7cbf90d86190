//! `gpushare simulate`: replays cluster traces through the placement engine and reports how
//! much GPU capacity each policy leaves unallocated (method: `bench/PACKING.md`).
//!
//! ```text
//! gpushare simulate --nodes openb_node_list_gpu_node.csv \
//!     --pods openb_pod_list_default.csv --policy gpushare,fgd,bestfit --seeds 10 [--json]
//! ```
//!
//! Prints one table per trace (or, with `--json`, one JSON document per trace and line),
//! writes `<out>/<trace>.json` (the same document, with the curves) and the plot
//! `<out>/pack.png` (or `--plot FILE`).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::simulate;
use crate::simulate::Variant;

fn parse_variant(s: &str) -> Result<Variant, String> {
    Variant::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Node list CSV (sn, cpu_milli, memory_mib, gpu, model).
    #[arg(long)]
    pub nodes: PathBuf,
    /// Pod list CSV(s) (name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec], …); one
    /// trace each. Repeat the flag or separate with commas.
    #[arg(long, required = true, value_delimiter = ',')]
    pub pods: Vec<PathBuf>,
    /// Policies to compare, comma-separated (gpushare, fgd, bestfit, binpack, spread).
    #[arg(long, value_delimiter = ',', default_value = "gpushare,fgd,bestfit")]
    pub policy: Vec<String>,
    /// Number of seeds (runs per policy and trace).
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// First seed (the reference artifact used 42–51).
    #[arg(long, default_value_t = 42)]
    pub seed_base: u64,
    /// Replay until the arrived GPU demand reaches this percent of capacity.
    #[arg(long, default_value_t = 130)]
    pub max_load: u32,
    /// Share of pods the typical shapes cover (fgd, gpushare).
    #[arg(long, default_value_t = 0.95)]
    pub typical_coverage: f64,
    /// Print JSON (one document per trace and line) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Where `<trace>.json` files go.
    #[arg(long, default_value = "target/bench/pack")]
    pub out: PathBuf,
    /// The PNG plot (unallocated % vs arrived load); default `<out>/pack.png`.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Stress variants of each pod list, replayed instead of the list as it is (repeat the
    /// flag for several; `none` is the list as it is). A variant is comma-separated `kind:F`,
    /// F a fraction in [0, 1]: `model:F` constrains F of the GPU pods to one GPU model (drawn
    /// from the node list's models, weighted by their GPUs); `multigpu:F` turns F of the GPU
    /// pods into whole-GPU pods of 2, 4 or 8 GPUs; `cpuheavy:F` multiplies the CPU request of
    /// F of all pods by 4 (capped by the largest node). Deterministic per seed, e.g.
    /// `--variant model:0.3 --variant model:0.3,multigpu:0.3,cpuheavy:0.3`.
    #[arg(long = "variant", value_name = "SPEC", value_parser = parse_variant)]
    pub variants: Vec<Variant>,
    /// Also write each replay's node states once every pod arriving within this % of
    /// capacity has been tried, to `<out>/<trace>.<policy>.<seed>.state.csv` (columns: node,
    /// gpus, model, cpu_milli, cpu_free_milli, memory_mib, memory_free_mib, pods,
    /// gpu_free_milli — each GPU's free per-mille, `;`-separated): where the unallocated
    /// capacity sits; and the pods that failed until then to `<…>.<seed>.failed.csv` (pod,
    /// cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec — its models `;`-separated).
    #[arg(long, value_name = "LOAD")]
    pub state_at: Option<u32>,
    /// Decide as a kube-scheduler with an extender does: kube-scheduler stops its node search
    /// at this many nodes that pass its own filter (the nodes' CPU, memory, GPU model and
    /// total free GPU memory and compute; `percentageOfNodesToScore`, at least 100), each
    /// search starting where the last stopped, and the policy chooses among those where the
    /// pod fits. Unset: the policy chooses among every node.
    #[arg(long, value_name = "N")]
    pub search_nodes: Option<usize>,
    /// Decide as the scheduler extender does, to predict a real cluster: the policy's
    /// typical shapes are learned from the GPU pods placed so far (none at first; refreshed
    /// after 8, 16, … 2,048 pods, then every 2,048, from the last 4,096) instead of taken
    /// from the whole pod list, and ties go to the node first by name instead of a random
    /// node order per seed.
    #[arg(long)]
    pub as_extender: bool,
    /// Replays run in parallel (decision times are cleanest with 1).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
}

/// The `simulate` subcommand.
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seeds > 0, "--seeds must be at least 1");
    anyhow::ensure!(
        (1..=1000).contains(&args.max_load),
        "--max-load {} is not in [1, 1000]",
        args.max_load
    );
    if let Some(at) = args.state_at {
        anyhow::ensure!(
            (1..=args.max_load).contains(&at),
            "--state-at {at} is not in [1, --max-load {}]",
            args.max_load
        );
    }
    anyhow::ensure!(
        args.search_nodes != Some(0),
        "--search-nodes 0: kube-scheduler looks for at least one node"
    );
    let opts = simulate::ReplayOptions {
        state_at: args.state_at,
        search_nodes: args.search_nodes,
        learn_shapes: args.as_extender,
        ties_by_name: args.as_extender,
    };
    let seeds: Vec<u64> = (0..args.seeds).map(|i| args.seed_base + i).collect();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut written = Vec::new();
    let mut reports = Vec::new();
    let variants = if args.variants.is_empty() {
        vec![Variant::default()]
    } else {
        args.variants.clone()
    };
    for pods in &args.pods {
        let trace = simulate::load_trace(&args.nodes, pods, args.typical_coverage)?;
        for variant in &variants {
            let report = simulate::run_variant(
                &trace,
                variant,
                args.typical_coverage,
                &args.policy,
                &seeds,
                args.max_load,
                args.jobs,
                &opts,
            )?;
            emit(args, report, &mut written, &mut reports)?;
        }
    }
    let png = args
        .plot
        .clone()
        .unwrap_or_else(|| args.out.join("pack.png"));
    simulate::plot::write_png(&reports, &png)?;
    written.push(png.display().to_string());
    // With --json, stdout carries only the documents.
    let hint = format!("wrote {}", written.join(", "));
    if args.json {
        eprintln!("{hint}");
    } else {
        println!("{hint}");
    }
    Ok(())
}

/// Writes `<out>/<trace>.json` and prints the report (table or JSON line).
fn emit(
    args: &SimulateArgs,
    report: simulate::TraceReport,
    written: &mut Vec<String>,
    reports: &mut Vec<simulate::TraceReport>,
) -> anyhow::Result<()> {
    let doc = report.json();
    // Variant names carry ':' and ','; file names get '=' and '_' instead.
    let stem = report.trace.replace(':', "=").replace(',', "_");
    for (policy, seed, state) in &report.states {
        for (kind, csv) in [("state", &state.nodes), ("failed", &state.failed)] {
            let file = args.out.join(format!("{stem}.{policy}.{seed}.{kind}.csv"));
            std::fs::write(&file, csv)
                .with_context(|| format!("cannot write {}", file.display()))?;
            written.push(file.display().to_string());
        }
    }
    let file = args.out.join(format!("{stem}.json"));
    std::fs::write(&file, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("cannot write {}", file.display()))?;
    if args.json {
        println!("{}", serde_json::to_string(&doc)?);
    } else {
        println!("{}", report.table());
    }
    written.push(file.display().to_string());
    reports.push(report);
    Ok(())
}
