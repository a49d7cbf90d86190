//! `gpushare inspect` without an API server: Node and Pod objects built here, the view and its
//! renderings checked exactly.

use gpushare::inspect::{ClusterView, GpuSource, InspectError, build, render};
use gpushare_core::request::limits::{MemoryUnit, ResourceNames};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

fn gpus_annotation(gpus: &[(u32, &str, u64, bool)]) -> String {
    let gpus: Vec<Value> = gpus
        .iter()
        .map(|(i, uuid, mib, healthy)| {
            json!({"index": i, "uuid": uuid, "model": "NVIDIA H200", "memoryMiB": mib, "healthy": healthy})
        })
        .collect();
    json!({"version": 1, "gpus": gpus}).to_string()
}

fn node(name: &str, ip: &str, annotations: Value, allocatable: Value, labels: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "status": {
            "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}],
            "allocatable": allocatable,
        }
    }))
    .unwrap()
}

/// node-a: 4 × 15 GiB, published by the agent, core_mem/binpack.
fn node_a() -> Node {
    let gpus: Vec<(u32, String)> = (0..4).map(|i| (i, format!("GPU-a{i}"))).collect();
    let gpus: Vec<(u32, &str, u64, bool)> = gpus
        .iter()
        .map(|(i, u)| (*i, u.as_str(), 15360, true))
        .collect();
    node(
        "node-a",
        "192.168.0.4",
        json!({"gpushare.io/gpus": gpus_annotation(&gpus)}),
        json!({"cpu": "8", "aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4", "aliyun.com/gpu-core.percentage": "400"}),
        json!({"ack.node.gpu.schedule": "core_mem", "ack.node.gpu.placement": "binpack"}),
    )
}

/// node-b: 2 × 80 GiB (81559 MiB: 79 GiB allocatable each), GPU 1 unhealthy.
fn node_b() -> Node {
    node(
        "node-b",
        "192.168.0.5",
        json!({"gpushare.io/gpus": gpus_annotation(&[(0, "GPU-b0", 81559, true), (1, "GPU-b1", 81559, false)])}),
        json!({"aliyun.com/gpu-mem": "158"}),
        json!({"ack.node.gpu.schedule": "cgpu"}),
    )
}

/// A CPU-only node: no annotation, no GPU allocatable.
fn cpu_node() -> Node {
    node(
        "cpu-1",
        "192.168.0.9",
        json!({}),
        json!({"cpu": "8"}),
        json!({}),
    )
}

/// A GPU pod: `shares` per container as (gpu index, uuid, MiB, core).
fn pod(
    name: &str,
    node: Option<&str>,
    phase: &str,
    shares: &[(&str, u32, &str, u64, Option<u32>)],
) -> Pod {
    let mut containers = serde_json::Map::new();
    for (ctr, idx, uuid, mib, core) in shares {
        let mut s = json!({"gpuIndex": idx, "memoryMiB": mib});
        if !uuid.is_empty() {
            s["gpuUuid"] = json!(uuid);
        }
        if let Some(c) = core {
            s["corePercent"] = json!(c);
        }
        containers
            .entry(ctr.to_string())
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .unwrap()
            .push(s);
    }
    let assignment = json!({"version": 1, "containers": containers}).to_string();
    let names: Vec<&str> = shares.iter().map(|s| s.0).collect();
    let mut names_dedup = names.clone();
    names_dedup.dedup();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {"gpushare.io/assignment": assignment}},
        "spec": {"nodeName": node, "containers": names_dedup.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()},
        "status": {"phase": phase},
    }))
    .unwrap()
}

fn cluster() -> (Vec<Node>, Vec<Pod>) {
    let pods = vec![
        pod(
            "train-0",
            Some("node-a"),
            "Running",
            &[("main", 0, "GPU-a0", 2048, Some(30))],
        ),
        pod(
            "train-1",
            Some("node-a"),
            "Running",
            &[("main", 0, "GPU-a0", 2048, Some(30))],
        ),
        // Two GPUs for one container, memory split evenly.
        pod(
            "multi",
            Some("node-a"),
            "Running",
            &[
                ("main", 1, "GPU-a1", 4096, Some(50)),
                ("main", 2, "GPU-a2", 4096, Some(50)),
            ],
        ),
        // Terminated: hold nothing.
        pod(
            "done",
            Some("node-a"),
            "Succeeded",
            &[("main", 3, "GPU-a3", 8192, Some(100))],
        ),
        pod(
            "crashed",
            Some("node-a"),
            "Failed",
            &[("main", 3, "GPU-a3", 8192, Some(100))],
        ),
        // Memory-only share, still Pending (bound, containers starting).
        pod(
            "infer",
            Some("node-b"),
            "Pending",
            &[("server", 0, "GPU-b0", 1536, None)],
        ),
        // Assigned, not yet bound: found by UUID.
        pod(
            "binding",
            None,
            "Pending",
            &[("main", 3, "GPU-a3", 1024, Some(10))],
        ),
    ];
    (vec![cpu_node(), node_b(), node_a()], pods)
}

fn view() -> ClusterView {
    let (nodes, pods) = cluster();
    build(&nodes, &pods, &ResourceNames::default(), &[]).unwrap()
}

#[test]
fn allocations_sum_per_gpu_and_node() {
    let v = view();
    let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-a", "node-b"], "CPU-only node skipped, sorted");
    let a = &v.nodes[0];
    let per_gpu: Vec<(u64, u64)> = a
        .gpus
        .iter()
        .map(|g| (g.totals.memory_allocated_mib, g.totals.core_allocated))
        .collect();
    assert_eq!(per_gpu, [(4096, 60), (4096, 50), (4096, 50), (1024, 10)]);
    assert_eq!(
        (a.totals.memory_allocated_mib, a.totals.memory_total_mib),
        (13312, 61440)
    );
    assert_eq!((a.totals.core_allocated, a.totals.core_total), (170, 400));
    assert_eq!(a.address, "192.168.0.4");
    assert_eq!(a.schedule.as_deref(), Some("core_mem"));
    assert_eq!(a.gpu_source, GpuSource::Annotation);
    let b = &v.nodes[1];
    assert_eq!(
        (b.totals.memory_allocated_mib, b.totals.core_allocated),
        (1536, 0)
    );
    assert_eq!(b.gpus[0].shares[0].core_percent, None);
    assert_eq!(
        (
            v.totals.memory_allocated_mib,
            v.totals.core_allocated,
            v.totals.core_total
        ),
        (14848, 170, 600)
    );
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn terminated_pods_are_excluded() {
    let v = view();
    let pods: Vec<&str> = v
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().flat_map(|g| g.shares.iter()))
        .map(|s| s.pod.as_str())
        .collect();
    assert!(
        !pods.contains(&"done") && !pods.contains(&"crashed"),
        "{pods:?}"
    );
    assert_eq!(v.nodes[0].gpus[3].shares.len(), 1);
    assert_eq!(v.nodes[0].gpus[3].shares[0].pod, "binding");
}

#[test]
fn multi_gpu_assignment_counts_on_each_gpu() {
    let v = view();
    let a = &v.nodes[0];
    for i in [1, 2] {
        let s = &a.gpus[i].shares;
        assert_eq!(s.len(), 1);
        assert_eq!(
            (
                s[0].pod.as_str(),
                s[0].container.as_str(),
                s[0].memory_mib,
                s[0].core_percent
            ),
            ("multi", "main", 4096, Some(50))
        );
    }
}

/// A pod with an init container (4 GiB / 50 %), a sidecar (1 GiB / 10 %, started before it)
/// and an app container (2 GiB / 30 %) on GPU 0: it holds 5 GiB / 60 % (the sidecar runs
/// with either), not the 7 GiB / 90 % its shares add up to; each share is listed.
#[test]
fn init_containers_count_with_what_runs_at_once() {
    let share = |mib: u64, core: u32| json!([{"gpuIndex": 0, "gpuUuid": "GPU-a0", "memoryMiB": mib, "corePercent": core}]);
    let assignment = json!({"version": 1, "containers": {
        "proxy": share(1024, 10), "prep": share(4096, 50), "main": share(2048, 30),
    }})
    .to_string();
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "staged", "namespace": "default",
                     "annotations": {"gpushare.io/assignment": assignment}},
        "spec": {"nodeName": "node-a",
                 "initContainers": [{"name": "proxy", "restartPolicy": "Always"}, {"name": "prep"}],
                 "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    let v = build(&[node_a()], &[p], &ResourceNames::default(), &[]).unwrap();
    let g0 = &v.nodes[0].gpus[0];
    assert_eq!(
        (g0.totals.memory_allocated_mib, g0.totals.core_allocated),
        (5120, 60)
    );
    assert_eq!(g0.shares.len(), 3);
    let out = render::details(&v, MemoryUnit::GiB);
    for row in [
        "0    default/staged  main             2            30\n",
        "0    default/staged  prep (init)      4            50\n",
        "0    default/staged  proxy (sidecar)  1            10\n",
    ] {
        assert!(out.contains(row), "{row:?} in\n{out}");
    }
    let j: Value = serde_json::from_str(&render::json(&v)).unwrap();
    let shares = &j["nodes"][0]["gpus"][0]["shares"];
    assert_eq!(shares[0]["container"], "main");
    assert!(shares[0].get("role").is_none());
    assert_eq!(shares[1]["role"], "init");
    assert_eq!(shares[2]["role"], "sidecar");
    assert_eq!(j["nodes"][0]["gpus"][0]["memoryAllocatedMiB"], 5120);
}

#[test]
fn table_has_the_kubectl_inspect_cgpu_shape() {
    let out = render::table(&view(), MemoryUnit::GiB);
    let want = "\
NAME    IPADDRESS    GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU2(Allocated/Total)  GPU3(Allocated/Total)  GPU Memory(GiB)  GPU Core(%)
node-a  192.168.0.4  4/15                   4/15                   4/15                   1/15                   13/60            170/400
node-b  192.168.0.5  1.5/79                 0/79*                  -                      -                      1.5/158          0/200
---------------------------------------------------------------------------------------------------------------------------------------------
Allocated/Total GPU Memory In Cluster: 14.5/218 (6%)
Allocated/Total GPU Core In Cluster: 170/600 (28%)
* unhealthy GPU
";
    assert_eq!(out, want, "\n{out}");
}

#[test]
fn footer_of_the_user_story() {
    // 4 × 15 GiB; three 2 GiB / 30 % pods → 6/60 (10%), 90/400 (22%).
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            pod(
                &format!("job-{i}"),
                Some("node-a"),
                "Running",
                &[("main", i, "", 2048, Some(30))],
            )
        })
        .collect();
    let v = build(&[node_a()], &pods, &ResourceNames::default(), &[]).unwrap();
    let out = render::table(&v, MemoryUnit::GiB);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "NAME    IPADDRESS    GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU2(Allocated/Total)  GPU3(Allocated/Total)  GPU Memory(GiB)  GPU Core(%)"
    );
    assert_eq!(
        lines[1],
        "node-a  192.168.0.4  2/15                   2/15                   2/15                   0/15                   6/60             90/400"
    );
    assert!(lines[2].chars().all(|c| c == '-'));
    assert_eq!(
        lines[3],
        "Allocated/Total GPU Memory In Cluster: 6/60 (10%)"
    );
    assert_eq!(
        lines[4],
        "Allocated/Total GPU Core In Cluster: 90/400 (22%)"
    );
    assert_eq!(lines.len(), 5);
}

#[test]
fn memory_in_mib() {
    let out = render::table(&view(), MemoryUnit::MiB);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].ends_with("GPU Memory(MiB)  GPU Core(%)"), "{out}");
    assert!(
        lines[1].starts_with("node-a  192.168.0.4  4096/15360"),
        "{out}"
    );
    assert!(
        out.contains("Allocated/Total GPU Memory In Cluster: 14848/224558 (6%)"),
        "{out}"
    );
}

#[test]
fn details_list_each_gpu_and_its_pods() {
    let out = render::details(&view(), MemoryUnit::GiB);
    let want = "\
NAME:       node-a
IPADDRESS:  192.168.0.4
SCHEDULE:   core_mem
PLACEMENT:  binpack

GPU  MODEL        UUID    HEALTH   MEMORY(GiB)  CORE(%)
0    NVIDIA H200  GPU-a0  Healthy  4/15         60/100
1    NVIDIA H200  GPU-a1  Healthy  4/15         50/100
2    NVIDIA H200  GPU-a2  Healthy  4/15         50/100
3    NVIDIA H200  GPU-a3  Healthy  1/15         10/100

GPU  POD              CONTAINER  MEMORY(GiB)  CORE(%)
0    default/train-0  main       2            30
0    default/train-1  main       2            30
1    default/multi    main       4            50
2    default/multi    main       4            50
3    default/binding  main       1            10

Allocated/Total GPU Memory: 13/60 (21%)
Allocated/Total GPU Core: 170/400 (42%)
------------------------------------------------------------------------
NAME:       node-b
IPADDRESS:  192.168.0.5
SCHEDULE:   cgpu
PLACEMENT:  -

GPU  MODEL        UUID    HEALTH     MEMORY(GiB)  CORE(%)
0    NVIDIA H200  GPU-b0  Healthy    1.5/79       0/100
1    NVIDIA H200  GPU-b1  Unhealthy  0/79         0/100

GPU  POD            CONTAINER  MEMORY(GiB)  CORE(%)
0    default/infer  server     1.5          -

Allocated/Total GPU Memory: 1.5/158 (0%)
Allocated/Total GPU Core: 0/200 (0%)
------------------------------------------------------------------------
Allocated/Total GPU Memory In Cluster: 14.5/218 (6%)
Allocated/Total GPU Core In Cluster: 170/600 (28%)
";
    assert_eq!(out, want, "\n{out}");
}

#[test]
fn json_carries_the_same_data_in_mib() {
    let v: Value = serde_json::from_str(&render::json(&view())).unwrap();
    assert_eq!(v["memoryAllocatedMiB"], 14848);
    assert_eq!(v["coreTotal"], 600);
    let a = &v["nodes"][0];
    assert_eq!(a["name"], "node-a");
    assert_eq!(a["schedule"], "core_mem");
    assert_eq!(a["gpuSource"], "annotation");
    let g0 = &a["gpus"][0];
    assert_eq!(g0["uuid"], "GPU-a0");
    assert_eq!(g0["memoryTotalMiB"], 15360);
    assert_eq!(g0["memoryAllocatedMiB"], 4096);
    assert_eq!(g0["coreAllocated"], 60);
    assert_eq!(
        g0["shares"][0],
        json!({"namespace": "default", "pod": "train-0", "container": "main", "memoryMiB": 2048, "corePercent": 30})
    );
    assert!(v["nodes"][1]["gpus"][0]["shares"][0]["corePercent"].is_null());
    assert_eq!(v["nodes"][1]["gpus"][1]["healthy"], false);
}

#[test]
fn json_keys_keep_their_order() {
    let out = render::json(&view());
    let at = |from: usize, key: &str| from + out[from..].find(&format!("\"{key}\"")).unwrap();
    let mut pos = 0;
    for key in [
        "nodes",
        "name",
        "address",
        "schedule",
        "placement",
        "gpuSource",
        "gpus",
        "index",
        "uuid",
        "model",
        "healthy",
        "memoryTotalMiB",
        "memoryAllocatedMiB",
        "coreTotal",
        "coreAllocated",
        "shares",
    ] {
        let next = at(pos, key);
        assert!(next >= pos, "{key} out of order in\n{out}");
        pos = next;
    }
    // The cluster's totals come after its nodes, before its warnings.
    assert!(
        out.ends_with(
            "  ],\n  \"memoryTotalMiB\": 224558,\n  \"memoryAllocatedMiB\": 14848,\n  \"coreTotal\": 600,\n  \"coreAllocated\": 170,\n  \"warnings\": []\n}\n"
        ),
        "{out}"
    );
}

#[test]
fn nodes_without_gpus_are_skipped_and_named_nodes_checked() {
    let (nodes, pods) = cluster();
    let names = ResourceNames::default();
    let v = build(&nodes, &pods, &names, &["node-b".to_string()]).unwrap();
    assert_eq!(v.nodes.len(), 1);
    assert_eq!(
        (v.totals.memory_allocated_mib, v.totals.core_total),
        (1536, 200)
    );
    assert_eq!(
        build(&nodes, &pods, &names, &["cpu-1".to_string()])
            .unwrap_err()
            .to_string(),
        "node \"cpu-1\" has no GPUs for gpushare (no gpushare.io/gpus annotation and no aliyun.com/gpu-mem allocatable)"
    );
    assert_eq!(
        build(&nodes, &pods, &names, &["nope".to_string()]).unwrap_err(),
        InspectError::NoSuchNode("nope".into())
    );
    let empty = build(&[cpu_node()], &[], &names, &[]).unwrap();
    assert!(empty.nodes.is_empty());
    let out = render::table(&empty, MemoryUnit::GiB);
    assert!(
        out.ends_with(
            "Allocated/Total GPU Memory In Cluster: 0/0 (0%)\nAllocated/Total GPU Core In Cluster: 0/0 (0%)\n"
        ),
        "{out}"
    );
}

#[test]
fn node_with_only_allocatable_gets_inferred_gpus() {
    let n = node(
        "legacy",
        "10.0.0.7",
        json!({}),
        json!({"aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": "2"}),
        json!({}),
    );
    let p = pod(
        "old",
        Some("legacy"),
        "Running",
        &[("main", 1, "", 4096, None)],
    );
    let v = build(&[n], &[p], &ResourceNames::default(), &[]).unwrap();
    let l = &v.nodes[0];
    assert_eq!(l.gpu_source, GpuSource::Allocatable);
    let gpus: Vec<(u32, u64, u64)> = l
        .gpus
        .iter()
        .map(|g| {
            (
                g.index,
                g.totals.memory_total_mib,
                g.totals.memory_allocated_mib,
            )
        })
        .collect();
    assert_eq!(gpus, [(0, 16384, 0), (1, 16384, 4096)]);
    let out = render::details(&v, MemoryUnit::GiB);
    assert!(out.contains("0    -      -     Healthy  0/16"), "{out}");
}

#[test]
fn problems_become_warnings_not_numbers() {
    let mut bad = pod(
        "forged",
        Some("node-a"),
        "Running",
        &[("main", 0, "", 1024, None)],
    );
    bad.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("gpushare.io/assignment".into(), "{\"version\":1,".into());
    let unassigned: Pod = serde_json::from_value(json!({
        "metadata": {"name": "raw", "namespace": "ml"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    let ghost = pod(
        "ghost",
        None,
        "Pending",
        &[("main", 0, "GPU-nowhere", 1024, None)],
    );
    let wrong_gpu = pod(
        "wrong",
        Some("node-a"),
        "Running",
        &[("main", 9, "", 1024, None)],
    );
    let heavy: Vec<Pod> = (0..3)
        .map(|i| {
            pod(
                &format!("heavy-{i}"),
                Some("node-a"),
                "Running",
                &[("main", 2, "", 6144, Some(40))],
            )
        })
        .collect();
    let mut pods = vec![bad, unassigned, ghost, wrong_gpu];
    pods.extend(heavy);
    let v = build(&[node_a()], &pods, &ResourceNames::default(), &[]).unwrap();
    let a = &v.nodes[0];
    assert_eq!(a.totals.memory_allocated_mib, 3 * 6144);
    let w = render::all_warnings(&v);
    let want = [
        "node node-a: pod default/forged: gpushare.io/assignment is not valid JSON: EOF while parsing a value at line 1 column 13; not counted",
        "node node-a: pod default/wrong container \"main\" is assigned GPU 9 which node node-a does not have; not counted",
        "node node-a: pod ml/raw requests aliyun.com/gpu-mem=3 (container \"c\") but has no gpushare.io/assignment annotation; not counted",
        "node node-a: GPU 2 memory is over-committed: 18432 MiB allocated of 15360 MiB",
        "node node-a: GPU 2 compute is over-committed: 120% allocated of 100%",
        "pod default/ghost is assigned GPUs but not bound, and no node has its GPUs' UUIDs; not counted",
    ];
    assert_eq!(w, want);
    let out = render::details(&v, MemoryUnit::GiB);
    assert!(
        out.contains("warning: GPU 2 compute is over-committed: 120% allocated of 100%\n"),
        "{out}"
    );
}

#[test]
fn unit_flag_parses() {
    assert_eq!("GiB".parse::<MemoryUnit>(), Ok(MemoryUnit::GiB));
    assert_eq!("mib".parse::<MemoryUnit>(), Ok(MemoryUnit::MiB));
    assert_eq!(
        "GB".parse::<MemoryUnit>().unwrap_err().to_string(),
        "unit \"GB\" is not GiB or MiB"
    );
}

#[test]
fn command_line() {
    use clap::Parser;
    use gpushare::cmd::inspect::InspectArgs;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: InspectArgs,
    }
    let a = Cli::try_parse_from(["inspect", "-d", "--unit", "MiB", "node-a", "node-b"])
        .unwrap()
        .args;
    assert!(a.details && !a.json);
    assert_eq!(a.unit, MemoryUnit::MiB);
    assert_eq!(a.resource_names().unwrap(), ResourceNames::default());
    assert_eq!(a.nodes, ["node-a", "node-b"]);
    let a = Cli::try_parse_from(["inspect", "--json", "--memory-unit", "MiB"])
        .unwrap()
        .args;
    assert!(a.json && a.nodes.is_empty());
    assert_eq!(a.unit, MemoryUnit::GiB);
    assert_eq!(a.resource_names().unwrap().memory_unit, MemoryUnit::MiB);
    let a = Cli::try_parse_from(["inspect", "--memory-resource", "example.com/vgpu-mem"])
        .unwrap()
        .args;
    assert_eq!(a.resource_names().unwrap().memory, "example.com/vgpu-mem");
    let e = Cli::try_parse_from(["inspect", "--json", "-d"]).unwrap_err();
    assert!(e.to_string().contains("cannot be used with"), "{e}");
    let e = Cli::try_parse_from(["inspect", "--unit", "GB"]).unwrap_err();
    assert!(
        e.to_string().contains("unit \"GB\" is not GiB or MiB"),
        "{e}"
    );
}
