//! `gpushare simulate`: replays cluster traces through the placement engine and reports how
//! much GPU capacity each policy leaves unallocated (method: `bench/PACKING.md`).
//!
//! The command itself (flags, output files) is `cmd::simulate`; this module is the method:
//! trace files ([`trace`]), the replay ([`replay`]), the report ([`report`]) and the plot
//! ([`plot`]).

pub mod plot;
pub mod replay;
pub mod report;
pub mod rng;
pub mod trace;
pub mod variant;

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpushare_core::placement::{POLICIES, UnknownPolicy};
pub use replay::{
    ReplayOptions, Run, StateAt, Trace, failed_csv, replay, replay_with, replay_with_state,
    state_csv,
};
pub use report::{PolicyResult, TraceReport};
pub use trace::TraceError;
pub use variant::{Variant, VariantError};

/// Runs every (policy, seed) of `trace`, `jobs` at a time.
pub fn run_trace(
    trace: &Trace,
    policies: &[String],
    seeds: &[u64],
    max_load: u32,
    jobs: usize,
) -> Result<TraceReport, UnknownPolicy> {
    let per_seed: Vec<&Trace> = seeds.iter().map(|_| trace).collect();
    let opts = ReplayOptions::default();
    run_seeds(trace, &per_seed, policies, seeds, max_load, jobs, &opts)
}

/// Runs every (policy, seed) of `variant` of `trace` (each seed replays its own variant,
/// [`Variant::apply`]), `jobs` at a time; `coverage` as in [`load_trace`]. With
/// `opts.state_at`, the report also keeps each replay's node states at that load
/// ([`TraceReport::states`]).
#[allow(clippy::too_many_arguments)]
pub fn run_variant(
    trace: &Trace,
    variant: &Variant,
    coverage: f64,
    policies: &[String],
    seeds: &[u64],
    max_load: u32,
    jobs: usize,
    opts: &ReplayOptions,
) -> Result<TraceReport, UnknownPolicy> {
    if variant.is_none() {
        let per_seed: Vec<&Trace> = seeds.iter().map(|_| trace).collect();
        return run_seeds(trace, &per_seed, policies, seeds, max_load, jobs, opts);
    }
    let varied: Vec<Trace> = seeds
        .iter()
        .map(|&s| variant.apply(trace, s, coverage))
        .collect();
    let per_seed: Vec<&Trace> = varied.iter().collect();
    let mut report = run_seeds(&varied[0], &per_seed, policies, seeds, max_load, jobs, opts)?;
    report.shapes = varied
        .iter()
        .map(|t| t.workload.shapes.len())
        .max()
        .unwrap_or(0);
    Ok(report)
}

/// `per_seed[i]`: the trace seed `seeds[i]` replays; `trace` names the report.
fn run_seeds(
    trace: &Trace,
    per_seed: &[&Trace],
    policies: &[String],
    seeds: &[u64],
    max_load: u32,
    jobs: usize,
    opts: &ReplayOptions,
) -> Result<TraceReport, UnknownPolicy> {
    for p in policies {
        if !POLICIES.contains(&p.as_str()) {
            return Err(UnknownPolicy(p.clone()));
        }
    }
    let work: Vec<(usize, usize)> = (0..policies.len())
        .flat_map(|p| (0..seeds.len()).map(move |s| (p, s)))
        .collect();
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Run>>> = Mutex::new(vec![None; work.len()]);
    let error: Mutex<Option<UnknownPolicy>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, work.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(p, s)) = work.get(i) else { break };
                    match replay_with(per_seed[s], &policies[p], seeds[s], max_load, opts) {
                        Ok(run) => done.lock().expect("results lock")[i] = Some(run),
                        Err(e) => *error.lock().expect("error lock") = Some(e),
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().expect("error lock") {
        return Err(e);
    }
    let mut runs: Vec<Run> = done
        .into_inner()
        .expect("results lock")
        .into_iter()
        .flatten()
        .collect();
    let states = runs
        .iter_mut()
        .filter_map(|r| Some((r.policy.clone(), r.seed, r.state.take()?)))
        .collect();
    let results = policies
        .iter()
        .map(|p| {
            let mine: Vec<Run> = runs.iter().filter(|r| &r.policy == p).cloned().collect();
            PolicyResult::from_runs(p, &mine)
        })
        .collect();
    let mut report = TraceReport::new(trace, seeds.to_vec(), results);
    report.states = states;
    report.search_nodes = opts.search_nodes;
    report.as_extender = opts.as_extender();
    Ok(report)
}

/// Loads one trace.
pub fn load_trace(nodes: &Path, pods: &Path, coverage: f64) -> Result<Trace, TraceError> {
    let node_specs = trace::read_nodes(nodes)?;
    let pod_list = trace::read_pods(pods)?;
    if node_specs.is_empty() {
        return Err(TraceError::NoNodes {
            path: nodes.to_path_buf(),
        });
    }
    Ok(Trace::new(
        &trace::trace_name(pods),
        node_specs,
        pod_list,
        coverage,
    ))
}
