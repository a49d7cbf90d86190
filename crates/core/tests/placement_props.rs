//! Property tests of the placement engine: random clusters and request streams, every policy,
//! pods arriving and leaving; an independent ledger checks that nothing is over-committed,
//! sharing modes never mix, model constraints hold, and a refused pod really fits nowhere.

use std::collections::HashMap;

use gpushare_core::placement::{
    Choice, Engine, GpuDemand, GpuSpec, NodeSpec, POLICIES, Placement, Request, ScheduleMode,
    Workload, by_name,
};
use proptest::prelude::*;

const MODELS: [&str; 3] = ["T4", "V100M16", "A10"];
const MODES: [ScheduleMode; 4] = [
    ScheduleMode::CoreMem,
    ScheduleMode::Cgpu,
    ScheduleMode::Share,
    ScheduleMode::Default,
];

fn node_strategy() -> impl Strategy<Value = NodeSpec> {
    (
        1u64..=64,
        0usize..=8,
        prop::sample::select(vec![8_000u64, 15_360, 16_000, 24_576]),
        0usize..MODELS.len(),
        0usize..MODES.len(),
        prop::collection::vec(prop::bool::weighted(0.9), 8),
        prop::option::of(prop::bool::ANY),
    )
        .prop_map(
            |(cpus, gpus, mem, model, mode, healthy, placement)| NodeSpec {
                name: String::new(),
                cpu_milli: cpus * 1000,
                memory_mib: cpus * 4096,
                gpus: (0..gpus)
                    .map(|i| GpuSpec {
                        memory_mib: mem,
                        model: MODELS[model].to_string(),
                        healthy: healthy[i],
                    })
                    .collect(),
                mode: MODES[mode],
                placement: placement.map(|b| {
                    if b {
                        gpushare_core::placement::GpuPlacement::Binpack
                    } else {
                        gpushare_core::placement::GpuPlacement::Spread
                    }
                }),
            },
        )
}

fn request_strategy() -> impl Strategy<Value = Request> {
    let gpu = prop_oneof![
        1 => Just(GpuDemand::None),
        4 => (1u32..=2, 1u64..=16, prop::option::of(1u32..=20)).prop_map(|(count, gib, core)| {
            GpuDemand::Shared { count, memory_mib: gib * 1024, core_milli: core.map(|c| c * 50) }
        }),
        2 => (1u32..=4).prop_map(|count| GpuDemand::Whole { count }),
    ];
    (
        0u64..=16,
        gpu,
        prop::collection::vec(0usize..MODELS.len(), 0..=2),
    )
        .prop_map(|(cpus, gpu, models)| Request {
            name: "p".into(),
            cpu_milli: cpus * 500,
            memory_mib: cpus * 1024,
            gpu,
            models: models.into_iter().map(|m| MODELS[m].to_string()).collect(),
        })
}

/// What the ledger recomputes for one GPU from the pods on it.
#[derive(Default, Clone, Debug)]
struct GpuUse {
    memory: u64,
    core: u32,
    pods: u32,
    whole: bool,
    core_pods: u32,
    memory_only_pods: u32,
}

/// Recomputes every node's usage from the placed pods and checks the rules.
fn check_ledger(nodes: &[NodeSpec], placed: &[(Request, Placement)]) {
    let mut cpu = vec![0u64; nodes.len()];
    let mut mem = vec![0u64; nodes.len()];
    let mut gpus: HashMap<(usize, usize), GpuUse> = HashMap::new();
    for (r, p) in placed {
        let n = &nodes[p.node];
        cpu[p.node] += r.cpu_milli;
        mem[p.node] += r.memory_mib;
        assert_eq!(p.gpus.len(), r.gpu.count(), "GPU count of {r:?}");
        for i in p.gpus.iter() {
            let spec = &n.gpus[i];
            assert!(spec.healthy, "unhealthy GPU {i} of {} used", n.name);
            assert!(
                r.allows_model(&spec.model),
                "model {} given to {r:?}",
                spec.model
            );
            let u = gpus.entry((p.node, i)).or_default();
            u.pods += 1;
            match r.gpu {
                GpuDemand::Whole { .. } => u.whole = true,
                GpuDemand::Shared {
                    memory_mib,
                    core_milli,
                    ..
                } => {
                    u.memory += memory_mib;
                    match core_milli {
                        Some(c) => {
                            u.core += c;
                            u.core_pods += 1;
                            assert_eq!(n.mode, ScheduleMode::CoreMem, "core pod on {:?}", n.mode);
                        }
                        None => {
                            u.memory_only_pods += 1;
                            assert!(
                                matches!(n.mode, ScheduleMode::Cgpu | ScheduleMode::Share),
                                "memory-only share on {:?}",
                                n.mode
                            );
                        }
                    }
                }
                GpuDemand::None => unreachable!(),
            }
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        assert!(cpu[i] <= n.cpu_milli, "CPU over-committed on {}", n.name);
        assert!(
            mem[i] <= n.memory_mib,
            "memory over-committed on {}",
            n.name
        );
    }
    let mut node_kinds: HashMap<usize, (u32, u32)> = HashMap::new();
    for (&(node, gpu), u) in &gpus {
        let spec = &nodes[node].gpus[gpu];
        assert!(u.memory <= spec.memory_mib, "GPU memory over-committed");
        assert!(u.core <= 1000, "GPU compute over-committed");
        if u.whole {
            assert_eq!(u.pods, 1, "a whole GPU is shared");
        }
        let k = node_kinds.entry(node).or_default();
        k.0 += u.core_pods;
        k.1 += u.memory_only_pods;
    }
    for (node, (core, memory_only)) in node_kinds {
        assert!(
            core == 0 || memory_only == 0,
            "node {} mixes memory-only and memory+core pods",
            nodes[node].name
        );
    }
}

/// The ledger's view of whether `r` fits on node `id`.
fn fits_somewhere(nodes: &[NodeSpec], placed: &[(Request, Placement)], r: &Request) -> bool {
    (0..nodes.len()).any(|id| {
        let n = &nodes[id];
        let mine: Vec<&(Request, Placement)> =
            placed.iter().filter(|(_, p)| p.node == id).collect();
        let cpu: u64 = mine.iter().map(|(q, _)| q.cpu_milli).sum();
        let mem: u64 = mine.iter().map(|(q, _)| q.memory_mib).sum();
        if cpu + r.cpu_milli > n.cpu_milli || mem + r.memory_mib > n.memory_mib {
            return false;
        }
        let gpu_ok = |i: usize, pred: &dyn Fn(u64, u32, u32) -> bool| {
            let spec = &n.gpus[i];
            if !spec.healthy || !r.allows_model(&spec.model) {
                return false;
            }
            let (mut m, mut c, mut pods) = (0u64, 0u32, 0u32);
            for (q, p) in &mine {
                if p.gpus.contains(i) {
                    pods += 1;
                    match q.gpu {
                        GpuDemand::Whole { .. } => {
                            m = spec.memory_mib;
                            c = 1000;
                        }
                        GpuDemand::Shared {
                            memory_mib,
                            core_milli,
                            ..
                        } => {
                            m += memory_mib;
                            c += core_milli.unwrap_or(0);
                        }
                        GpuDemand::None => {}
                    }
                }
            }
            pred(spec.memory_mib - m, 1000 - c, pods)
        };
        match r.gpu {
            GpuDemand::None => true,
            GpuDemand::Whole { count } => {
                (0..n.gpus.len())
                    .filter(|&i| gpu_ok(i, &|_, _, pods| pods == 0))
                    .count()
                    >= count as usize
            }
            GpuDemand::Shared {
                count,
                memory_mib,
                core_milli,
            } => {
                let mode_ok = match core_milli {
                    Some(_) => n.mode == ScheduleMode::CoreMem,
                    None => matches!(n.mode, ScheduleMode::Cgpu | ScheduleMode::Share),
                };
                mode_ok
                    && (0..n.gpus.len())
                        .filter(|&i| {
                            gpu_ok(i, &|m, c, _| {
                                m >= memory_mib && core_milli.is_none_or(|x| c >= x)
                            })
                        })
                        .count()
                        >= count as usize
            }
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_never_break_the_rules(
        mut nodes in prop::collection::vec(node_strategy(), 1..12),
        pool in prop::collection::vec(request_strategy(), 1..8),
        picks in prop::collection::vec(0usize..8, 1..80),
        leave in prop::collection::vec(prop::bool::weighted(0.15), 80),
        policy in 0usize..POLICIES.len(),
        order_seed in any::<u64>(),
    ) {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
        }
        // Requests repeat (as shapes do in real workloads), so the score cache gets hits.
        let reqs: Vec<Request> = picks.iter().map(|&i| pool[i % pool.len()].clone()).collect();
        let workload = Workload::from_requests(&reqs, 0.95);
        let mut e = Engine::new(nodes.clone(), by_name(POLICIES[policy], &workload).unwrap());
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.rotate_left(order_seed as usize % nodes.len());
        e.set_tie_order(order);
        let mut placed: Vec<(Request, Placement)> = Vec::new();
        for (k, r) in reqs.iter().enumerate() {
            // Scoring some nodes on demand (as the extender's filter does) is scoring them
            // afresh, and finds exactly the nodes the pod fits on.
            let some: Vec<usize> = (k % 2..nodes.len()).step_by(2).collect();
            let on_demand: Vec<Option<Choice>> = {
                let mut s = e.scorer(r);
                some.iter().map(|&id| s.choice(id)).collect()
            };
            for (&id, c) in some.iter().zip(&on_demand) {
                prop_assert_eq!(c, &e.evaluate(id, r).ok());
                prop_assert_eq!(c.is_some(), e.check(id, r).is_ok());
            }
            // The score cache changes nothing.
            let fresh = e.decide_fresh(r);
            prop_assert_eq!(e.decide(r), fresh);
            match e.place(r) {
                Ok(p) => {
                    placed.push((r.clone(), p));
                    check_ledger(&nodes, &placed);
                }
                Err(u) => {
                    prop_assert!(!fits_somewhere(&nodes, &placed, r), "refused but fits: {r:?}: {u}");
                    let prefix = format!("0/{} nodes can run pod p", nodes.len());
                    prop_assert!(u.to_string().starts_with(&prefix), "{}", u);
                    let refused: usize = u.counts.iter().map(|(_, c)| c).sum();
                    prop_assert_eq!(refused, nodes.len());
                }
            }
            if leave[k] && !placed.is_empty() {
                let (r, p) = placed.remove(k % placed.len());
                e.release(&r, p);
            }
        }
        // Everything leaves: the engine is back to an empty cluster.
        for (r, p) in placed.drain(..) {
            e.release(&r, p);
        }
        for (n, s) in e.nodes().iter().zip(&nodes) {
            prop_assert_eq!(n.cpu_free, s.cpu_milli);
            prop_assert_eq!(n.memory_free, s.memory_mib);
            prop_assert!(n.gpus.iter().all(|g| g.pods == 0 && g.memory_free == g.memory_mib && g.core_free == 1000));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Large clusters of few node kinds: scoring many stale nodes at once scores each
    /// distinct node once (nodes equal but for the name share a score) and may run on
    /// several threads; either way every node's score is the one it gets alone.
    #[test]
    fn scoring_equal_nodes_once_and_on_threads_changes_no_score(
        kinds in prop::collection::vec(node_strategy(), 1..4),
        copies in 40usize..120,
        pool in prop::collection::vec(request_strategy(), 1..6),
        picks in prop::collection::vec(0usize..6, 1..60),
        threads in 1usize..4,
    ) {
        let nodes: Vec<NodeSpec> = (0..copies)
            .map(|i| NodeSpec { name: format!("n{i}"), ..kinds[i % kinds.len()].clone() })
            .collect();
        let reqs: Vec<Request> = picks.iter().map(|&i| pool[i % pool.len()].clone()).collect();
        let workload = Workload::from_requests(&reqs, 0.95);
        for policy in POLICIES {
            let mut e = Engine::new(nodes.clone(), by_name(policy, &workload).unwrap());
            e.set_threads(threads);
            e.set_nodes_per_thread(8);
            for (k, r) in reqs.iter().enumerate() {
                if k % 3 == 0 {
                    // On demand, the extender's way: every node prepared, then read.
                    let mut s = e.scorer(r);
                    s.prepare(0..copies);
                    let got: Vec<Option<Choice>> = (0..copies).map(|id| s.choice(id)).collect();
                    for (id, c) in got.iter().enumerate() {
                        prop_assert_eq!(c, &e.evaluate(id, r).ok(), "{} node {}", policy, id);
                    }
                }
                let scores = e.scores(r);
                for (id, c) in scores.iter().enumerate() {
                    prop_assert_eq!(c, &e.evaluate(id, r).ok(), "{} node {}", policy, id);
                }
                let fresh = e.decide_fresh(r);
                prop_assert_eq!(e.decide(r), fresh);
                let _ = e.place(r);
            }
        }
    }
}
