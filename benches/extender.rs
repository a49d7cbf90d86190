//! Scheduler-extender benchmark (prints numbers, gates nothing): a synthetic cluster of
//! 5,000 nodes × 8 GPUs (80 GiB, `core_mem`, binpack) in the extender's cache.
//!
//! 1. filter + prioritize round trips over HTTP on loopback (the real axum server, one
//!    keep-alive connection, the candidate list = every node, as kube-scheduler sends it with
//!    `nodeCacheCapable`), p50 / p99 / max;
//! 2. binds per second: concurrent `bind` calls (reserve, annotate, bind) with an in-memory
//!    API stand-in, then a check that no GPU is over-committed.
//!
//! The warmer runs as in `gpushare scheduler` (it keeps the recent pods' request shapes
//! scored); the bench reports how long it took to catch up after the binds, and times a
//! request shape no pod had before (every candidate scored in the filter) separately.
//!
//! `cargo bench --bench extender` (env: BENCH_NODES, BENCH_ROUNDS, BENCH_BINDS).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gpushare::kubeobjects::PodKey;
use gpushare::scheduler::cache::Cluster;
use gpushare::scheduler::server::{Annotations, ApiError, Binder, Extender, router};
use gpushare::scheduler::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, NodeName,
};
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpu, NodeGpus};
use gpushare_core::request::{ASSIGNMENT_ANNOTATION, ResourceNames};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node(i: usize) -> Node {
    let gpus = NodeGpus {
        version: 1,
        gpus: (0..8)
            .map(|g| NodeGpu {
                index: g,
                uuid: format!("GPU-{i}-{g}"),
                model: "H200".into(),
                memory_mib: 80 * 1024,
                healthy: true,
            })
            .collect(),
    };
    Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{i:05}")),
            labels: Some(
                [
                    ("ack.node.gpu.schedule".to_string(), "core_mem".to_string()),
                    ("ack.node.gpu.placement".to_string(), "binpack".to_string()),
                ]
                .into(),
            ),
            annotations: Some([(NODE_GPUS_ANNOTATION.to_string(), gpus.to_json())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Deterministic pseudo-random shapes: memory 1–16 GiB, core 5–50 %.
fn pod(i: usize) -> Pod {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
    shaped_pod(i, 1 + x % 16, 5 * (1 + (x / 16) % 10))
}

/// A pod of `mem` GiB and `core` % of one GPU.
fn shaped_pod(i: usize, mem: u64, core: u64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{i:06}")),
            namespace: Some("bench".into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(
                        [
                            ("aliyun.com/gpu-mem".to_string(), Quantity(mem.to_string())),
                            (
                                "aliyun.com/gpu-core.percentage".to_string(),
                                Quantity(core.to_string()),
                            ),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The API server stand-in for bind: pods by name; annotate and bind only record.
struct MemoryApi {
    pods: HashMap<String, Pod>,
    /// Pod name → assignment JSON.
    assignments: std::sync::Mutex<HashMap<String, String>>,
    /// (pod name, node) of every binding.
    bound: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl Binder for MemoryApi {
    async fn get_pod(&self, pod: &PodKey) -> Result<Pod, ApiError> {
        self.pods
            .get(&pod.name)
            .cloned()
            .ok_or_else(|| ApiError::GetPod {
                pod: pod.clone(),
                source: "no such pod".into(),
            })
    }
    async fn bind(
        &self,
        pod: &PodKey,
        _uid: &str,
        node: &str,
        a: &Annotations,
    ) -> Result<(), ApiError> {
        if let Some(v) = a.get(ASSIGNMENT_ANNOTATION) {
            self.assignments
                .lock()
                .unwrap()
                .insert(pod.name.clone(), v.clone());
        }
        self.bound
            .lock()
            .unwrap()
            .push((pod.name.clone(), node.to_string()));
        Ok(())
    }
}

/// The client's view of a filter answer: the passing nodes.
#[derive(serde::Deserialize)]
struct FilterNames<'a> {
    #[serde(rename = "NodeNames", borrow)]
    node_names: Vec<NodeName<'a>>,
}

/// A prioritize request (serialized as [`ExtenderArgs`]).
#[derive(serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct PrioritizeArgs<'a> {
    pod: Option<&'a Pod>,
    nodes: Option<()>,
    node_names: Vec<&'a str>,
}

/// One entry of a prioritize answer.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(dead_code)]
struct Host<'a> {
    #[serde(borrow)]
    host: NodeName<'a>,
    score: i64,
}

async fn post(conn: &mut BufReader<tokio::net::TcpStream>, path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.get_mut().write_all(head.as_bytes()).await.unwrap();
    conn.get_mut().write_all(body).await.unwrap();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        conn.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut buf = vec![0; len];
    conn.read_exact(&mut buf).await.unwrap();
    buf
}

/// The candidate counts measured: every node, and a tenth of them (at least 100).
fn candidate_counts(names: &[String]) -> [usize; 2] {
    [names.len(), (names.len() / 10).max(100).min(names.len())]
}

/// Round `r`'s candidate list: `n` names from a start that moves with the round.
fn candidate_list(names: &[String], r: usize, n: usize) -> Vec<String> {
    let start = (r * 997) % names.len();
    names.iter().cycle().skip(start).take(n).cloned().collect()
}

/// One latency row of the JSON report (`lat` sorted).
fn latency_json(candidates: usize, lat: &[f64]) -> serde_json::Value {
    serde_json::json!({"candidates": candidates, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": lat[lat.len() - 1]})
}

fn pct(v: &[f64], p: f64) -> f64 {
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env("BENCH_NODES", 5000);
    let rounds = env("BENCH_ROUNDS", 300);
    let binds = env("BENCH_BINDS", 20000);
    let t = Instant::now();
    let mut cluster = Cluster::new(
        "gpushare",
        ResourceNames::default(),
        Duration::from_secs(300),
    );
    let node_objs: Vec<Node> = (0..nodes).map(node).collect();
    for n in &node_objs {
        cluster.set_node_deferred(n);
    }
    cluster.flush();
    let pods: HashMap<String, Pod> = (0..binds + rounds)
        .map(|i| {
            let p = pod(i);
            (p.metadata.name.clone().unwrap(), p)
        })
        .collect();
    let api = Arc::new(MemoryApi {
        pods: pods.clone(),
        assignments: Default::default(),
        bound: Default::default(),
    });
    let ext = Arc::new(Extender::new(cluster, api.clone()));
    ext.synced_nodes.store(true, Ordering::Release);
    ext.synced_pods.store(true, Ordering::Release);
    tokio::spawn(ext.clone().warm());
    println!(
        "cluster: {nodes} nodes × 8 GPUs (80 GiB, core_mem, binpack) loaded in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // 2 first: binds fill the cluster to a realistic level before filter is timed.
    let t = Instant::now();
    let names: Vec<String> = node_objs
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    let workers = 16;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let ext = ext.clone();
        let names = names.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0usize;
            let mut i = w;
            while i < binds {
                // Pick a node like the scheduler would: the extender's best-ranked node is
                // not needed for throughput; spread the binds over the cluster.
                let node = &names[(i * 7919) % names.len()];
                let r = ext
                    .bind(&ExtenderBindingArgs {
                        pod_name: format!("pod-{i:06}"),
                        pod_namespace: "bench".into(),
                        pod_uid: format!("uid-{i}"),
                        node: node.clone(),
                    })
                    .await;
                if r.error.is_empty() {
                    ok += 1;
                }
                i += workers;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    // Over-commit, from what was written to the "API server": the assignments of bound pods,
    // summed per node and GPU (80 GiB, 100 % each).
    let (over, used_gpus) = {
        let assignments = api.assignments.lock().unwrap();
        let bound = api.bound.lock().unwrap();
        let mut per_gpu: HashMap<(String, u32), (u64, i64)> = HashMap::new();
        for (pod, node) in bound.iter() {
            let a = gpushare_core::request::Assignment::parse(&assignments[pod]).unwrap();
            for share in a.containers.values().flatten() {
                let e = per_gpu.entry((node.clone(), share.gpu_index)).or_default();
                e.0 += share.memory_mib;
                e.1 += share.core_percent.unwrap_or(0);
            }
        }
        let over = per_gpu
            .values()
            .filter(|(m, c)| *m > 80 * 1024 || *c > 100)
            .count();
        (over, per_gpu.len())
    };
    println!(
        "bind: {binds} binds by {workers} concurrent callers in {secs:.2} s = {:.0} binds/s ({ok} placed, {} refused as full); over-committed GPUs: {over}; GPUs in use: {used_gpus}",
        binds as f64 / secs,
        binds - ok
    );

    // The warmer catching up with the binds (the last shapes refresh rebuilt the engine, and
    // every bind since changed a node).
    let t = Instant::now();
    while !ext.cluster.lock().unwrap().warmed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let caught_up = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "warmer (it runs beside the binds): every recent request shape scored on every node {caught_up:.0} ms after the binds"
    );

    // A request shape no pod had (17–26 GiB): the filter scores every candidate itself.
    let mut tn = Vec::new();
    for r in 0..50 {
        let args = ExtenderArgs {
            pod: Some(shaped_pod(
                binds + rounds + r,
                17 + r as u64 / 5,
                5 * (1 + r as u64 % 5),
            )),
            nodes: None,
            node_names: Some(names.clone()),
        };
        let t = Instant::now();
        ext.filter(&args);
        tn.push(t.elapsed().as_secs_f64() * 1e3);
    }
    tn.sort_by(|a, b| a.total_cmp(b));
    println!(
        "in process: filter of a request shape no pod had before (every candidate scored): p50 {:.2} / p99 {:.2} ms",
        pct(&tn, 0.5),
        pct(&tn, 0.99)
    );

    // In process (no HTTP, no JSON): where the time goes.
    let (mut tf, mut tp) = (Vec::new(), Vec::new());
    for r in 0..rounds.min(100) {
        let args = ExtenderArgs {
            pod: Some(pod(binds + r)),
            nodes: None,
            node_names: Some(names.clone()),
        };
        let t = Instant::now();
        let f = ext.filter(&args);
        tf.push(t.elapsed().as_secs_f64() * 1e3);
        let args = ExtenderArgs {
            node_names: f.node_names,
            ..args
        };
        let t = Instant::now();
        ext.prioritize(&args);
        tp.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // JSON alone: decode the 5,000-name request, encode the filter result.
    let args = ExtenderArgs {
        pod: Some(pod(binds)),
        nodes: None,
        node_names: Some(names.clone()),
    };
    let body = serde_json::to_vec(&args).unwrap();
    let mut tj = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let a: ExtenderArgs = serde_json::from_slice(&body).unwrap();
        let r = ext.filter(&a);
        let out = serde_json::to_vec(&r).unwrap();
        std::hint::black_box(out);
        tj.push(t.elapsed().as_secs_f64() * 1e3);
    }
    tj.sort_by(|a, b| a.total_cmp(b));
    println!(
        "in process with JSON: decode + filter + encode p50 {:.2} ms ({} bytes in)",
        pct(&tj, 0.5),
        body.len()
    );
    // The server's whole share of a round trip, without HTTP: the handlers' bodies in, JSON
    // out, filter then prioritize.
    let mut ts = Vec::new();
    for r in 0..rounds.min(100) {
        let args = ExtenderArgs {
            pod: Some(pod(binds + r)),
            nodes: None,
            node_names: Some(names.clone()),
        };
        let body = serde_json::to_vec(&args).unwrap();
        let t = Instant::now();
        let f = ext.filter_body_json(&body);
        let passed: ExtenderFilterResult = serde_json::from_slice(&f).unwrap();
        let t_client = Instant::now();
        let body2 = serde_json::to_vec(&ExtenderArgs {
            pod: args.pod,
            nodes: None,
            node_names: passed.node_names,
        })
        .unwrap();
        let client = t_client.elapsed();
        let p = ext.prioritize_body_json(&body2).unwrap();
        std::hint::black_box(p);
        ts.push((t.elapsed() - client).as_secs_f64() * 1e3);
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    println!(
        "in process with JSON: filter + prioritize bodies (decode, decide, encode) p50 {:.2} / p99 {:.2} ms",
        pct(&ts, 0.5),
        pct(&ts, 0.99)
    );
    tf.sort_by(|a, b| a.total_cmp(b));
    tp.sort_by(|a, b| a.total_cmp(b));
    println!(
        "in process: filter p50 {:.2} / p99 {:.2} ms, prioritize p50 {:.2} / p99 {:.2} ms",
        pct(&tf, 0.5),
        pct(&tf, 0.99),
        pct(&tp, 0.5),
        pct(&tp, 0.99)
    );

    // 1: filter + prioritize over HTTP.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = ext.clone();
    tokio::spawn(async move { axum::serve(listener, router(served)).await });
    let mut conn = BufReader::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    conn.get_mut().set_nodelay(true).unwrap();
    let mut results = Vec::new();
    let mut filter_only = Vec::new();
    for candidates in candidate_counts(&names) {
        let mut lat = Vec::new();
        let mut lat_client = Vec::new();
        let mut fit = 0usize;
        for r in 0..rounds {
            let cand = candidate_list(&names, r, candidates);
            let args = ExtenderArgs {
                pod: Some(pod(binds + r)),
                nodes: None,
                node_names: Some(cand),
            };
            let body = serde_json::to_vec(&args).unwrap();
            // The client decodes the answers into their types (borrowing the names, as a
            // client may) and sends prioritize the nodes filter passed.
            let t = Instant::now();
            let f = post(&mut conn, "/filter", &body).await;
            let t_client = Instant::now();
            let f: FilterNames = serde_json::from_slice(&f).unwrap();
            let passed: Vec<&str> = f.node_names.iter().map(|n| &*n.0).collect();
            let n_passed = passed.len();
            let body2 = serde_json::to_vec(&PrioritizeArgs {
                pod: args.pod.as_ref(),
                nodes: None,
                node_names: passed,
            })
            .unwrap();
            let mut client = t_client.elapsed();
            let p = post(&mut conn, "/prioritize", &body2).await;
            let t_client = Instant::now();
            let p: Vec<Host> = serde_json::from_slice(&p).unwrap();
            client += t_client.elapsed();
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            lat_client.push(client.as_secs_f64() * 1e3);
            assert_eq!(p.len(), n_passed);
            fit += n_passed;
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        lat_client.sort_by(|a, b| a.total_cmp(b));
        println!(
            "filter+prioritize over HTTP, {candidates} candidate nodes: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {rounds} pods (on average {} nodes passed filter)",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            lat[lat.len() - 1],
            fit / rounds.max(1)
        );
        println!(
            "  of which the client's JSON (decode the filter answer, encode the prioritize request, decode its answer): p50 {:.2} ms",
            pct(&lat_client, 0.5)
        );
        results.push(latency_json(candidates, &lat));
    }

    // 1b: the shipped default, `--filter-best 1`: filter answers the policy's best node, so
    // kube-scheduler binds it without calling prioritize — one round trip per pod.
    // The pods (and shapes) of the rounds above, so the engine's score
    // cache holds their scores for every node (filter reserves nothing): the path of a pod
    // whose shape the extender has seen since the nodes last changed. A shape no pod had
    // costs a scoring of every candidate: the "no pod had before" figure above.
    ext.set_filter_best(1);
    for candidates in candidate_counts(&names) {
        let mut lat = Vec::new();
        for r in 0..rounds {
            let cand = candidate_list(&names, r, candidates);
            let body = serde_json::to_vec(&ExtenderArgs {
                pod: Some(pod(binds + r)),
                nodes: None,
                node_names: Some(cand),
            })
            .unwrap();
            let t = Instant::now();
            let f = post(&mut conn, "/filter", &body).await;
            let f: FilterNames = serde_json::from_slice(&f).unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(f.node_names.len(), 1, "filter-best 1 answers one node");
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        println!(
            "filter with --filter-best 1 (the default; no prioritize) over HTTP, {candidates} candidate nodes, shapes seen before: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {rounds} pods",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            lat[lat.len() - 1],
        );
        filter_only.push(latency_json(candidates, &lat));
    }
    let json = serde_json::json!({
        "nodes": nodes, "gpus_per_node": 8,
        "filter_prioritize_ms": results,
        "filter_best1_ms": filter_only,
        "warmer_caught_up_ms": caught_up,
        "new_shape_filter_ms": latency_json(names.len(), &tn),
        "binds_per_s": binds as f64 / secs, "binds": binds, "placed": ok, "over_committed_gpus": over,
    });
    std::fs::create_dir_all("target/bench").ok();
    std::fs::write("target/bench/extender.json", json.to_string() + "\n").ok();
    println!("wrote target/bench/extender.json");
}
