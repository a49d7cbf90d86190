//! `gpushare run`: flags, config and the report; the work is in [`crate::run`].

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use clap::builder::TypedValueParser as _;

use crate::config::{GpuBackend, NodeConfig};
use crate::gpu::Backend;
use crate::run::{HeldBy, RunReport, RunRequest};
use gpushare_core::control::ComputePolicy;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// GPU index.
    #[arg(long)]
    pub gpu: u32,
    /// Memory quota: 2GiB, 2048MiB, …
    #[arg(long)]
    pub memory: String,
    /// Compute quota in percent of the GPU, a multiple of 5 in [5, 100] (none: no cap).
    #[arg(long, allow_negative_numbers = true)]
    pub core: Option<i64>,
    /// hard: the cap holds even alone on the GPU; burst: idle time may be used.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(ComputePolicy::NAMES)
        .map(|s| s.parse::<ComputePolicy>().expect("a listed name")))]
    pub policy: Option<ComputePolicy>,
    /// Node config file (GPU backend, sim GPUs, [throttle]); defaults otherwise.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub gpu_backend: Option<GpuBackend>,
    /// cgroupfs root (default: the config's, /sys/fs/cgroup).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// The in-container limiter library (default: the config's `[limiter] library`).
    #[arg(long)]
    pub limiter_library: Option<PathBuf>,
    /// Run without the in-container limiter (CUDA sees the whole GPU's memory; only the
    /// controller's memory action holds the quota).
    #[arg(long)]
    pub no_limiter: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

/// Runs the command and exits with its exit status (128 + signal when killed by one).
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let mut cfg = match &args.config {
        Some(p) => NodeConfig::load(p)?,
        None => NodeConfig::default(),
    };
    if let Some(backend) = args.gpu_backend {
        cfg.gpu_backend = backend;
    }
    if let Some(root) = &args.cgroup_root {
        cfg.throttle.cgroup_root = root.clone();
    }
    if let Some(lib) = &args.limiter_library {
        cfg.limiter.library = lib.clone();
    }
    cfg.limiter.enabled &= !args.no_limiter;
    cfg.validate()?;
    let policy = args.policy.unwrap_or(cfg.throttle.policy);
    let backend = Backend::open(&cfg)
        .with_context(|| format!("cannot open the {:?} GPU backend", cfg.gpu_backend))?;
    let request = RunRequest::validate(args.gpu, &args.memory, args.core, &backend.inventory)?;
    let exe = std::env::current_exe().context("cannot find our own executable for the guardian")?;
    let report = crate::run::run(
        &cfg,
        backend,
        &request,
        policy,
        &args.command,
        Some(&exe),
        |reason| {
            eprintln!(
                "gpushare run: {reason}; holding the quota by stopping and continuing the process tree (SIGSTOP/SIGCONT)"
            )
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        eprint!("{}", render(&report));
    }
    std::process::exit(report.exit_status)
}

/// The human report (on stderr, after the command's own output).
fn render(r: &RunReport) -> String {
    let core = r
        .quota_core_percent
        .map_or("no compute cap".to_string(), |c| {
            format!("{c} % compute ({})", r.policy)
        });
    let achieved = r
        .achieved_percent
        .map_or("not measured".to_string(), |a| format!("{a:.1} %"));
    let held = match r.held_by {
        HeldBy::Freezer => "the cgroup freezer",
        HeldBy::Signals => "SIGSTOP/SIGCONT (no cgroup freezer)",
    };
    let end = match r.signal {
        Some(sig) => format!("killed by signal {sig} (exit status {})", r.exit_status),
        None => format!("exit status {}", r.exit_status),
    };
    format!(
        "gpushare run: GPU {} ({}), quota {core}, {} MiB memory\n\
         gpushare run: achieved utilization {achieved}, peak memory {:.0} MiB, ran {:.1} s, \
         held by {held} ({} freezes, {:.1} s throttled); {end}\n",
        r.gpu,
        match r.backend {
            GpuBackend::Sim => "sim",
            GpuBackend::Nvml => "nvml",
        },
        r.quota_memory_mib,
        r.peak_memory_mib,
        r.run_seconds,
        r.freezes,
        r.throttled_seconds,
    )
}
