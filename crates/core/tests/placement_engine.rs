//! The engine's rules and choices on small hand-made clusters: each rejection reason, tie
//! order, GPU choice (binpack, spread, node labels, whole and multi-GPU pods), health, models.

use std::collections::HashMap;

use gpushare_core::placement::{
    Engine, GpuDemand, GpuPlacement, GpuSet, NodeSpec, POLICIES, Placement, Request, ScheduleMode,
    Workload, by_name,
};
use gpushare_core::request::{GpuQuantities, ResourceNames};

fn node(name: &str, gpus: usize, mode: ScheduleMode) -> NodeSpec {
    NodeSpec::uniform(name, 32_000, 128 << 10, gpus, 16_000, "T4", mode)
}

fn share(name: &str, mem: u64, core: Option<u32>) -> Request {
    Request {
        gpu: GpuDemand::Shared {
            count: 1,
            memory_mib: mem,
            core_milli: core,
        },
        ..Request::cpu_only(name, 1000, 1024)
    }
}

fn whole(name: &str, count: u32) -> Request {
    Request {
        gpu: GpuDemand::Whole { count },
        ..Request::cpu_only(name, 1000, 1024)
    }
}

fn engine(nodes: Vec<NodeSpec>, policy: &str) -> Engine {
    Engine::new(nodes, by_name(policy, &Workload::default()).unwrap())
}

fn gpus(s: GpuSet) -> Vec<usize> {
    s.iter().collect()
}

#[test]
fn every_rejection_reason_reaches_the_user() {
    let names = ResourceNames::default();
    let core_pod = Request::from_quantities(
        "train",
        1000,
        1024,
        Some(&GpuQuantities {
            memory_units: 4,
            core_percent: Some(30),
            count: None,
        }),
        &names,
    )
    .unwrap();
    let mem_pod = share("infer", 4096, None);
    let cases: Vec<(NodeSpec, Request, &str)> = vec![
        (
            node("a", 2, ScheduleMode::CoreMem),
            Request::cpu_only("big", 64_000, 0),
            "node a has 32000m CPU free, the pod needs 64000m",
        ),
        (
            node("a", 2, ScheduleMode::CoreMem),
            Request::cpu_only("fat", 0, 1 << 30),
            "MiB of memory free, the pod needs 1073741824 MiB",
        ),
        (
            node("a", 0, ScheduleMode::CoreMem),
            core_pod.clone(),
            "node a has no GPUs",
        ),
        (
            node("a", 2, ScheduleMode::CoreMem),
            core_pod.clone().with_models(["A10"]),
            "node a has T4 GPUs, the pod accepts only A10",
        ),
        (
            node("a", 2, ScheduleMode::Default),
            core_pod.clone(),
            "ack.node.gpu.schedule=default (whole GPUs only)",
        ),
        (
            node("a", 2, ScheduleMode::Cgpu),
            core_pod.clone(),
            "ack.node.gpu.schedule=cgpu (memory-only sharing); a pod with gpu-core.percentage needs a core_mem node",
        ),
        (
            node("a", 2, ScheduleMode::Share),
            core_pod.clone(),
            "ack.node.gpu.schedule=share (memory-only sharing)",
        ),
        (
            node("a", 2, ScheduleMode::CoreMem),
            mem_pod.clone(),
            "ack.node.gpu.schedule=core_mem (memory and compute quotas); a pod without gpu-core.percentage needs a cgpu or share node",
        ),
        (
            node("a", 2, ScheduleMode::CoreMem),
            whole("w", 4),
            "node a has 2 GPUs, the pod needs 4",
        ),
        (
            node("a", 2, ScheduleMode::CoreMem),
            share("s", 20_000, Some(100)),
            "node a has 0 GPU(s) with 20000 MiB and 10% compute free, the pod needs 1 (most memory free on one GPU: 16000 MiB)",
        ),
    ];
    for (n, r, want) in cases {
        let mut e = engine(vec![n], "gpushare");
        let u = e.decide(&r).unwrap_err();
        let msg = u.to_string();
        assert!(
            msg.starts_with(&format!("0/1 nodes can run pod {}: 1 ", r.name)),
            "{msg}"
        );
        assert!(msg.contains(want), "got {msg:?}, want {want:?}");
        let per_node = e.check(0, &r).unwrap_err().to_string();
        assert!(per_node.contains(want), "got {per_node:?}, want {want:?}");
    }
    // Whole GPUs taken: the next whole-GPU pod finds too few idle GPUs.
    let mut e = engine(vec![node("a", 2, ScheduleMode::CoreMem)], "binpack");
    e.place(&share("s", 1000, Some(100))).unwrap();
    let msg = e.decide(&whole("w", 2)).unwrap_err().to_string();
    assert!(
        msg.contains("node a has 1 idle GPU(s), the pod needs 2 whole GPU(s)"),
        "{msg}"
    );
    // Several nodes: counted per reason, first example of each.
    let mut e = engine(
        vec![
            node("a", 2, ScheduleMode::Cgpu),
            node("b", 2, ScheduleMode::Cgpu),
            node("c", 1, ScheduleMode::CoreMem),
        ],
        "fgd",
    );
    let msg = e
        .decide(&Request {
            gpu: GpuDemand::Shared {
                count: 2,
                memory_mib: 1,
                core_milli: Some(50),
            },
            ..Request::cpu_only("p", 0, 0)
        })
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("0/3 nodes can run pod p: 2 memory-only sharing"),
        "{msg}"
    );
    assert!(
        msg.contains("1 too few GPUs")
            && msg.contains("node a is labelled")
            && msg.contains("node c has 1 GPUs, the pod needs 2"),
        "{msg}"
    );
}

#[test]
fn ties_go_to_the_first_node_in_tie_order() {
    for policy in POLICIES {
        let nodes = vec![
            node("a", 2, ScheduleMode::CoreMem),
            node("b", 2, ScheduleMode::CoreMem),
            node("c", 2, ScheduleMode::CoreMem),
        ];
        let mut e = engine(nodes, policy);
        assert_eq!(e.decide(&whole("w", 1)).unwrap().node, 0, "{policy}");
        e.set_tie_order(vec![2, 0, 1]);
        assert_eq!(e.decide(&whole("w", 1)).unwrap().node, 2, "{policy}");
        assert_eq!(e.policy_name(), policy);
    }
}

#[test]
fn binpack_and_spread_choose_by_free_capacity() {
    let nodes = vec![
        node("a", 4, ScheduleMode::CoreMem),
        node("b", 4, ScheduleMode::CoreMem),
    ];
    let small = share("s", 1600, Some(100));
    for (policy, want_node, want_gpu) in [("binpack", 1, 2), ("spread", 0, 0)] {
        let mut e = engine(nodes.clone(), policy);
        // a: GPU 1 has 900 left; b: GPU 2 has 400 left.
        e.commit(
            &share("x", 1600, Some(100)),
            gpushare_core::placement::Placement {
                node: 0,
                gpus: GpuSet::single(1),
            },
        );
        e.commit(
            &share("y", 9600, Some(600)),
            gpushare_core::placement::Placement {
                node: 1,
                gpus: GpuSet::single(2),
            },
        );
        let p = e.decide(&small).unwrap();
        assert_eq!(
            (p.node, gpus(p.gpus)),
            (want_node, vec![want_gpu]),
            "{policy}"
        );
    }
}

#[test]
fn node_label_picks_the_gpu() {
    let mut a = node("a", 4, ScheduleMode::CoreMem);
    let labels = HashMap::from([
        ("ack.node.gpu.schedule".to_string(), "core_mem".to_string()),
        ("ack.node.gpu.placement".to_string(), "spread".to_string()),
    ]);
    a = a.with_labels(&labels).unwrap();
    assert_eq!(a.placement, Some(GpuPlacement::Spread));
    let mut e = engine(vec![a], "binpack");
    let first = e.place(&share("s1", 1600, Some(100))).unwrap();
    assert_eq!(gpus(first.gpus), vec![0]);
    // binpack would reuse GPU 0; the label spreads to an idle GPU.
    let second = e.place(&share("s2", 1600, Some(100))).unwrap();
    assert_eq!(gpus(second.gpus), vec![1]);
}

#[test]
fn whole_multi_gpu_health_and_models() {
    let mut n = node("a", 4, ScheduleMode::CoreMem);
    n.gpus[0].healthy = false;
    n.gpus[3].model = "A10".into();
    let mut e = engine(vec![n], "gpushare");
    // Whole GPUs: lowest healthy idle ones.
    let w = e.place(&whole("w", 2)).unwrap();
    assert_eq!(gpus(w.gpus), vec![1, 2]);
    let grants = w.grants(&e.nodes()[0], &whole("w", 2));
    assert!(grants.iter().all(|g| g.whole && g.memory_mib == 16_000));
    // Only GPU 3 is left, and it is an A10.
    let t4_only = share("t4", 1000, Some(100)).with_models(["T4"]);
    let msg = e.decide(&t4_only).unwrap_err().to_string();
    assert!(msg.contains("0 GPU(s) with 1000 MiB"), "{msg}");
    let a10 = share("a10", 1000, Some(100)).with_models(["A10"]);
    assert_eq!(gpus(e.place(&a10).unwrap().gpus), vec![3]);
    e.release(&whole("w", 2), w);
    // A two-GPU share: two distinct GPUs, each with half the memory.
    let names = ResourceNames::default();
    let two = Request::from_quantities(
        "two",
        0,
        0,
        Some(&GpuQuantities {
            memory_units: 8,
            core_percent: Some(40),
            count: Some(2),
        }),
        &names,
    )
    .unwrap();
    let p = e.place(&two).unwrap();
    assert_eq!(p.gpus.len(), 2);
    let g = p.grants(&e.nodes()[0], &two);
    assert!(
        g.iter()
            .all(|g| g.memory_mib == 4096 && g.core_milli == Some(200) && !g.whole),
        "{g:?}"
    );
    assert!(!p.gpus.contains(0), "unhealthy GPU 0 used");
}

#[test]
fn decide_does_not_change_state_and_release_restores_it() {
    let mut e = engine(vec![node("a", 2, ScheduleMode::Cgpu)], "fgd");
    let before: Vec<_> = e.nodes().to_vec();
    let r = share("m", 4096, None);
    let p = e.decide(&r).unwrap();
    assert_eq!(e.nodes(), &before[..]);
    e.commit(&r, p);
    assert_ne!(e.nodes(), &before[..]);
    e.release(&r, p);
    assert_eq!(e.nodes(), &before[..]);
    assert_eq!(e.node_id("a"), Some(0));
    assert!(
        by_name("firstfit", &Workload::default())
            .unwrap_err()
            .to_string()
            .contains("unknown placement policy \"firstfit\"")
    );
}

fn trace_share(name: &str, cpu_cores: u64, milli: u32) -> Request {
    Request {
        gpu: GpuDemand::Shared {
            count: 1,
            memory_mib: milli as u64 * 16,
            core_milli: Some(milli),
        },
        ..Request::cpu_only(name, cpu_cores * 1000, 0)
    }
}

#[test]
fn gpushare_sees_cpu_running_out_where_fgd_ties() {
    // Typical pods: half a GPU with 10 cores, half a GPU with 8 cores.
    let x = trace_share("x", 10, 500);
    let y = trace_share("y", 8, 500);
    let w = Workload::from_requests(&[x.clone(), y], 1.0);
    let nodes = vec![
        NodeSpec::uniform(
            "cpu-poor",
            32_000,
            1 << 20,
            2,
            16_000,
            "T4",
            ScheduleMode::CoreMem,
        ),
        NodeSpec::uniform(
            "cpu-rich",
            100_000,
            1 << 20,
            2,
            16_000,
            "T4",
            ScheduleMode::CoreMem,
        ),
    ];
    // After x the CPU-poor node keeps 22 cores: FGD's one-copy test still passes for both
    // shapes, so FGD scores both nodes alike and takes the first. But only two 8-core pods
    // fit there beside three free half GPUs, which the repeated measure counts.
    let mut fgd = Engine::new(nodes.clone(), by_name("fgd", &w).unwrap());
    assert_eq!(fgd.decide(&x).unwrap().node, 0);
    let mut gs = Engine::new(nodes, by_name("gpushare", &w).unwrap());
    assert_eq!(gs.decide(&x).unwrap().node, 1);
}

#[test]
fn gpushare_keeps_idle_nodes_idle_when_it_can() {
    let one = whole("w", 1);
    let w = Workload::from_requests(std::slice::from_ref(&one), 1.0);
    let nodes = vec![
        node("idle", 2, ScheduleMode::CoreMem),
        node("used", 2, ScheduleMode::CoreMem),
    ];
    for (policy, want) in [("fgd", 0), ("gpushare", 1)] {
        let mut e = Engine::new(nodes.clone(), by_name(policy, &w).unwrap());
        e.commit(
            &one,
            gpushare_core::placement::Placement {
                node: 1,
                gpus: GpuSet::single(0),
            },
        );
        assert_eq!(e.decide(&one).unwrap().node, want, "{policy}");
    }
}

#[test]
fn a_search_window_chooses_among_the_nodes_kube_scheduler_found() {
    // binpack prefers the fullest GPU. a, b, c, d: two 16 GB GPUs each.
    let nodes = ["a", "b", "c", "d"].map(|n| node(n, 2, ScheduleMode::Share));
    let mut e = engine(nodes.to_vec(), "binpack");
    // b: one GPU with 4 GB free (12 GB taken), the other idle; d: both GPUs with 6 GB free,
    // 12 GB in total but no GPU with 8 GB.
    let b = e.node_id("b").unwrap();
    let d = e.node_id("d").unwrap();
    let on = |node: usize, gpu: usize| Placement {
        node,
        gpus: GpuSet::single(gpu),
    };
    e.commit(&share("fill", 12_000, None), on(b, 0));
    e.commit(&share("ten", 10_000, None), on(d, 0));
    e.commit(&share("ten", 10_000, None), on(d, 1));
    let small = share("small", 4_000, None);
    let big = share("big", 8_000, None);
    assert!(e.nodes()[d].fits_in_total(&big), "12 GB free in total");
    assert!(e.nodes()[d].check(&big).is_err(), "no GPU with 8 GB");

    // The whole cluster: binpack's best for 4 GB is b's fullest GPU.
    assert_eq!(e.decide(&small).unwrap().node, b);
    // A window of one from a: a is all kube-scheduler found, so a, and the next search
    // starts at b.
    let mut start = 0;
    assert_eq!(e.decide_within(&small, 1, &mut start).unwrap().node, 0);
    assert_eq!(start, 1);
    assert_eq!(e.decide_within(&small, 1, &mut start).unwrap().node, b);
    assert_eq!(start, 2);
    // From d with a window of one: d passes kube-scheduler's totals but no GPU takes 8 GB,
    // so the pod is unschedulable this time, though a, b and c would take it.
    let mut start = d;
    assert!(e.decide_within(&big, 1, &mut start).is_err());
    assert_eq!(start, 0, "the search wrapped past d");
    // A window of two from d: d, then a.
    let mut start = d;
    assert_eq!(e.decide_within(&big, 2, &mut start).unwrap().node, 0);
    // A window as large as the cluster decides as the whole cluster does.
    for s in 0..4 {
        let mut start = s;
        assert_eq!(
            e.decide_within(&small, 4, &mut start).unwrap(),
            e.decide(&small).unwrap()
        );
        assert_eq!(start, s, "every node looked at: back where it started");
    }
    // Nodes that fail kube-scheduler's own filter are skipped, not counted.
    let huge = Request::cpu_only("huge", 20_000, 1024);
    e.commit(
        &huge,
        Placement {
            node: 0,
            gpus: GpuSet::EMPTY,
        },
    );
    let cpu_heavy = Request {
        cpu_milli: 16_000,
        ..small.clone()
    };
    let mut start = 0;
    assert_eq!(e.decide_within(&cpu_heavy, 1, &mut start).unwrap().node, 1);
    assert_eq!(start, 2, "a (out of CPU) and b looked at");
}
