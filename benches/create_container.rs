//! CreateContainer handling time inside the plugin. Prints numbers; never gates anything.
//!
//! Run with `cargo bench --bench create_container` (optionally `-- N` for N timed requests
//! per case, default 10000). Cases:
//!
//! * `handler`: `Handler::create_container` on a `Node` called directly (request parsing,
//!   over-commit check, adjustment, registry insert). Each GPU container is removed again
//!   (untimed) so the registry never fills the GPU. The `sim backend` case adds what
//!   `--gpu-backend sim` does on top (a declaration directory per container, in a temporary
//!   directory; removed again, untimed); the other cases use a node without it.
//! * `round trip`: the same request as the runtime sends it, over a real unix socketpair
//!   through the plugin's multiplexer and ttrpc server (`serve_connection`), with this
//!   program playing the runtime exactly as `tests/nri_session.rs` does. The plugin runs on
//!   its own 2-worker tokio runtime (as `gpushare node` does), the "runtime" on a separate
//!   current-thread one, so the two sides behave like two processes.
//!
//! Every case is first run without a `tracing` subscriber, then again with the agent's own
//! logging installed (`gpushare::cmd::logging::init`, info level, text, to a file), since the
//! agent logs one line per admitted GPU container.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare::config::LogConfig;
use gpushare::node::{AgentState, Node, SimNode};
use gpushare::nri::api::nri_api::*;
use gpushare::nri::plugin::{Registration, serve_connection};
use gpushare::nri::runtime_side::RuntimeSide;
use gpushare::nri::service::Handler;
use gpushare_core::request::ASSIGNMENT_ANNOTATION;
use tokio::net::UnixStream;

const DEFAULT_N: usize = 10_000;
const WARMUP: usize = 1_000;

/// The node of `tests/nri_session.rs`; with `sim_dir`, the sim backend's extra work too
/// (a declaration directory per GPU container, a CPU pin and a bind mount).
fn node_state(sim_dir: Option<&Path>) -> AgentState {
    AgentState {
        sim: sim_dir.map(|dir| SimNode {
            dir: dir.to_path_buf(),
            ncpu: 2,
        }),
        ..AgentState::in_memory("bench-node")
    }
}

/// A pod as kubelet + containerd present it: the usual kubelet labels/annotations plus,
/// for a GPU pod, the assignment the device plugin wrote.
fn pod(id: &str, gpu: bool) -> PodSandbox {
    let mut annotations = HashMap::from([
        ("io.kubernetes.cri.sandbox-id".to_string(), id.to_string()),
        (
            "io.kubernetes.cri.sandbox-name".to_string(),
            format!("pod-{id}"),
        ),
        (
            "io.kubernetes.cri.sandbox-namespace".to_string(),
            "default".to_string(),
        ),
        ("kubernetes.io/config.source".to_string(), "api".to_string()),
    ]);
    if gpu {
        annotations.insert(
            ASSIGNMENT_ANNOTATION.to_string(),
            r#"{"version":1,"containers":{"main":[{"gpuIndex":1,"memoryMiB":2048,"corePercent":30}]}}"#
                .to_string(),
        );
    }
    PodSandbox {
        id: id.into(),
        name: format!("pod-{id}"),
        uid: format!("uid-{id}"),
        namespace: "default".into(),
        labels: HashMap::from([
            ("io.kubernetes.pod.name".to_string(), format!("pod-{id}")),
            (
                "io.kubernetes.pod.namespace".to_string(),
                "default".to_string(),
            ),
        ]),
        annotations,
        ..Default::default()
    }
}

fn ctr(id: &str, pod: &str, gpu: bool) -> Container {
    let mut annotations = HashMap::from([(
        "io.kubernetes.container.restartCount".to_string(),
        "0".to_string(),
    )]);
    if gpu {
        annotations.insert("gpushare.io/granted-mem".to_string(), "2".to_string());
        annotations.insert("gpushare.io/granted-core".to_string(), "30".to_string());
    }
    Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: "main".into(),
        annotations,
        args: vec!["/bin/sleep".into(), "3600".into()],
        env: vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            "HOSTNAME=bench".into(),
        ],
        state: ContainerState::CONTAINER_CREATED.into(),
        linux: Some(LinuxContainer {
            cgroups_path: format!("/kubepods/pod-{pod}/{id}"),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

/// Nearest-rank percentiles of one case, in microseconds.
struct Stats {
    case: String,
    n: usize,
    mean: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

fn stats(case: &str, mut samples: Vec<Duration>) -> Stats {
    samples.sort_unstable();
    let n = samples.len();
    let us = |d: Duration| d.as_nanos() as f64 / 1000.0;
    let rank = |p: f64| us(samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1]);
    Stats {
        case: case.to_string(),
        n,
        mean: samples.iter().map(|d| us(*d)).sum::<f64>() / n as f64,
        p50: rank(0.50),
        p99: rank(0.99),
        max: us(samples[n - 1]),
    }
}

fn print_table(rows: &[Stats]) {
    println!(
        "{:<50} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "case", "n", "mean µs", "p50 µs", "p99 µs", "max µs"
    );
    for r in rows {
        println!(
            "{:<50} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            r.case, r.n, r.mean, r.p50, r.p99, r.max
        );
    }
}

/// `Handler::create_container` called directly; GPU containers are removed again, untimed.
fn bench_handler(node: &Node, gpu: bool, n: usize, tag: &str) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..WARMUP + n {
        let pid = format!("{tag}-p{i}");
        let (p, c) = (pod(&pid, gpu), ctr(&format!("{tag}-c{i}"), &pid, gpu));
        let t = Instant::now();
        let adj = node.create_container(&p, &c);
        let elapsed = t.elapsed();
        let adj = adj.expect("create admitted");
        assert_eq!(
            adj.is_some(),
            gpu,
            "GPU containers are adjusted, others not"
        );
        if gpu {
            node.remove_container(&p, &c);
        }
        if i >= WARMUP {
            samples.push(elapsed);
        }
    }
    assert!(node.registry.snapshot().is_empty(), "registry drained");
    samples
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64)
}

/// The full round trip: the "runtime" (this function, on a current-thread runtime) calls
/// CreateContainer over the multiplexed socketpair; the plugin answers from its own runtime.
fn bench_round_trip(
    plugin_rt: &tokio::runtime::Runtime,
    node: Arc<Node>,
    cases: &[(&str, bool)],
    n: usize,
) -> Vec<Stats> {
    let (plugin_end, runtime_end) = std::os::unix::net::UnixStream::pair().unwrap();
    plugin_end.set_nonblocking(true).unwrap();
    runtime_end.set_nonblocking(true).unwrap();
    let plugin_task = {
        let node = node.clone();
        plugin_rt.spawn(async move {
            let stream = UnixStream::from_std(plugin_end).unwrap();
            let reg = Registration {
                name: "gpushare".into(),
                index: "10".into(),
            };
            serve_connection(stream, &reg, node).await
        })
    };

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = client_rt.block_on(async move {
        let stream = UnixStream::from_std(runtime_end).unwrap();
        let mut side = RuntimeSide::start(stream).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), side.registrations.recv())
            .await
            .expect("plugin registers")
            .unwrap();
        side.plugin
            .configure(ctx(), &ConfigureRequest::default())
            .await
            .unwrap();
        side.plugin
            .synchronize(ctx(), &SynchronizeRequest::default())
            .await
            .unwrap();

        let mut rows = vec![];
        for &(case, gpu) in cases {
            let mut samples = Vec::with_capacity(n);
            for i in 0..WARMUP + n {
                let pid = format!("rt-{case}-p{i}");
                let req = CreateContainerRequest {
                    pod: Some(pod(&pid, gpu)).into(),
                    container: Some(ctr(&format!("rt-{case}-c{i}"), &pid, gpu)).into(),
                    ..Default::default()
                };
                let t = Instant::now();
                let resp = side.plugin.create_container(ctx(), &req).await;
                let elapsed = t.elapsed();
                let resp = resp.expect("create admitted");
                assert_eq!(resp.adjust.is_some(), gpu);
                if gpu {
                    side.plugin
                        .remove_container(
                            ctx(),
                            &RemoveContainerRequest {
                                pod: req.pod.clone(),
                                container: req.container.clone(),
                                ..Default::default()
                            },
                        )
                        .await
                        .unwrap();
                }
                if i >= WARMUP {
                    samples.push(elapsed);
                }
            }
            rows.push(stats(case, samples));
        }
        side.close().await.unwrap();
        rows
    });
    // Tasks of a current-thread runtime only run inside `block_on`: dropping it closes the
    // runtime's end of the socket, which ends the plugin's session.
    drop(client_rt);
    let reason = plugin_rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), plugin_task).await })
        .expect("plugin session ends when the runtime closes")
        .unwrap()
        .unwrap();
    assert!(!reason.is_empty());
    assert!(node.registry.snapshot().is_empty(), "registry drained");
    rows
}

fn main() {
    // `cargo bench` passes `--bench`; a bare number sets the requests per case.
    let n = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(DEFAULT_N);
    // Like `gpushare node`: a multi-thread runtime with 2 workers.
    let plugin_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log_dir = tempfile::tempdir().unwrap();

    let mut rows = vec![];
    for logging in [false, true] {
        let suffix = if logging { ", agent logging" } else { "" };
        if logging {
            gpushare::cmd::logging::init(&LogConfig {
                file: Some(log_dir.path().join("agent.log")),
                ..Default::default()
            })
            .unwrap();
        }
        let tag = if logging { "log" } else { "nolog" };
        let sim_node = Node::new(node_state(Some(&log_dir.path().join(format!("sim-{tag}")))));
        let sim = bench_handler(&sim_node, true, n, &format!("{tag}-sim"));
        rows.push(stats(
            &format!("handler, GPU container, sim backend{suffix}"),
            sim,
        ));
        let node = Arc::new(Node::new(node_state(None)));
        let gpu = bench_handler(&node, true, n, &format!("{tag}-gpu"));
        rows.push(stats(&format!("handler, GPU container{suffix}"), gpu));
        let plain = bench_handler(&node, false, n, &format!("{tag}-plain"));
        rows.push(stats(
            &format!("handler, non-GPU (passthrough){suffix}"),
            plain,
        ));
        let gpu_case = format!("round trip, GPU container{suffix}");
        let plain_case = format!("round trip, non-GPU (passthrough){suffix}");
        rows.extend(bench_round_trip(
            &plugin_rt,
            node,
            &[(&gpu_case, true), (&plain_case, false)],
            n,
        ));
    }
    let log_bytes = std::fs::metadata(log_dir.path().join("agent.log"))
        .map(|m| m.len())
        .unwrap_or(0);

    println!(
        "CreateContainer handling time, {n} timed requests per case after {WARMUP} warm-up; \
         {} CPUs",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    print_table(&rows);
    println!("(agent log written during the logging cases: {log_bytes} bytes)");
    let worst = rows
        .iter()
        .filter(|r| r.case.starts_with("round trip"))
        .map(|r| r.p99)
        .fold(0.0, f64::max);
    println!(
        "goal: p99 <= 200 µs in the plugin; worst round-trip p99 {worst:.1} µs: {}",
        if worst <= 200.0 { "met" } else { "NOT met" }
    );
}
