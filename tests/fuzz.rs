//! Fuzzing every parser of outside input (see `fuzz_support` for the generator and the shared
//! properties: no panic, no input over 100 ms, every rejection message non-empty, at most 512
//! characters and naming a field or what was malformed). One test per target, plus the replay
//! of `tests/fuzz-corpus/`:
//!
//! - `assignment` — the pod annotation `gpushare.io/assignment` (`Assignment::parse`), and
//!   what it feeds: `container_request` on a 4-GPU node with and without a grant, the
//!   scheduler's `demand_of_assignment`;
//! - `grant` — the device plugin's grant annotations and a pod's limits (`parse_grant`,
//!   `parse_limits`, `Request::from_quantities`, `parse_memory_mib`);
//! - `node_gpus` — the node annotation `gpushare.io/gpus` (`NodeGpus::parse`), then the
//!   scheduler's `node_spec`, a cluster that takes the node, filter and reserve on it;
//! - `limits_file` — the limiter's limits file (`LimitsFile::parse`);
//! - `extender` — the scheduler extender's `filter`, `prioritize` and `bind` bodies, decoded
//!   and run through the extender's decisions (filter, prioritize, reserve, bind);
//! - `nri_mux` — the NRI multiplexer's frame decoder, fed in random chunks.
//!
//! `GPUSHARE_FUZZ_CASES=N` sets the inputs per target (default a few thousand, for
//! `cargo test`); `make fuzz` runs 1,000,000 per target and prints one line per target.

mod fuzz_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use fuzz_support::{Outcome, Report, Rng, Target, cases, corpus, exercise, fnv, fuzz, seed};
use gpushare::kubeobjects::PodKey;
use gpushare::kubeobjects::container_roles;
use gpushare::nri::mux::{FrameDecoder, HEADER_LEN, MAX_IN_PAYLOAD, encode_frames};
use gpushare::scheduler::cache::Cluster;
use gpushare::scheduler::podreq::demand_of_assignment;
use gpushare::scheduler::server::{Annotations, ApiError, Binder, Extender};
use gpushare::scheduler::wire::{ExtenderArgs, ExtenderBindingArgs, decode};
use gpushare_core::inventory::{Inventory, SimConfig, sim_inventory};
use gpushare_core::limiter::LimitsFile;
use gpushare_core::placement::Request;
use gpushare_core::request::limits::{
    GRANTED_CORE_ANNOTATION, GRANTED_COUNT_ANNOTATION, GRANTED_MEM_ANNOTATION, parse_grant,
    parse_limits,
};
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus};
use gpushare_core::request::{
    ASSIGNMENT_ANNOTATION, Assignment, MAX_ANNOTATION_BYTES, MAX_MEMORY_MIB, MemoryUnit,
    RequestRules, ResourceNames, container_request, parse_memory_mib,
};
use gpushare_core::rfc3339::check as rfc3339_check;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn run_target(mut target: Target<'_>) -> Report {
    let report = fuzz(&mut target, cases(), seed());
    println!("{}", report.summary());
    // (The summary line is printed above; the message must not repeat it: `make fuzz` greps.)
    assert!(
        report.clean(),
        "fuzz target {} failed: {} panics, {} hangs, {} bad messages\n  {}",
        report.target,
        report.panics,
        report.hangs,
        report.bad_messages,
        report.failures.join("\n  ")
    );
    report
}

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

// --- assignment ---------------------------------------------------------------------------

const ASSIGNMENT_DICT: &[&str] = &[
    "version",
    "timestamp",
    "containers",
    "main",
    "sidecar",
    "gpuIndex",
    "gpuUuid",
    "memoryMiB",
    "corePercent",
];

fn assignment_seeds() -> Vec<Vec<u8>> {
    let uuid = sim_inventory(&SimConfig::default(), "fuzz")[1].uuid.clone();
    [
        json!({"version":1,"timestamp":"2026-11-29T19:00:00Z","containers":{"main":[{"gpuIndex":1,"gpuUuid":uuid,"memoryMiB":2048,"corePercent":30}]}}),
        json!({"version":1,"containers":{"main":[{"gpuIndex":0,"memoryMiB":4096},{"gpuIndex":3,"memoryMiB":4096}]}}),
        json!({"version":1,"containers":{"a":[{"gpuIndex":2,"memoryMiB":1024,"corePercent":20}],"b":[{"gpuIndex":2,"memoryMiB":2048,"corePercent":10}]}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

fn assignment_target<'a>() -> Target<'a> {
    let inv = Inventory::new(sim_inventory(&SimConfig::default(), "fuzz"));
    let strict = RequestRules::default();
    let lax = RequestRules {
        require_grant: false,
        ..Default::default()
    };
    let grants: Vec<HashMap<String, String>> = vec![
        HashMap::new(),
        [(GRANTED_MEM_ANNOTATION.to_string(), "2".to_string())].into(),
        [
            (GRANTED_MEM_ANNOTATION.to_string(), "8".to_string()),
            (GRANTED_CORE_ANNOTATION.to_string(), "30".to_string()),
            (GRANTED_COUNT_ANNOTATION.to_string(), "2".to_string()),
        ]
        .into(),
    ];
    Target {
        name: "assignment",
        seeds: assignment_seeds(),
        dict: ASSIGNMENT_DICT,
        markers: &[
            "gpushare.io/assignment",
            "aliyun.com/gpu-",
            "gpushare.io/granted",
        ],
        json: true,
        run: Box::new(move |input| {
            let mut out = Outcome::default();
            let raw = text(input);
            match Assignment::parse(&raw) {
                Err(e) => out.reject(e),
                Ok(a) => {
                    out.accepted = true;
                    // What the parser accepts is what the contract says.
                    assert_eq!(a.version, 1);
                    if let Some(ts) = &a.timestamp {
                        assert_eq!(rfc3339_check(ts), Ok(()), "{ts}");
                    }
                    for shares in a.containers.values() {
                        assert!(shares.len() <= 64);
                        for s in shares {
                            assert!((1..=MAX_MEMORY_MIB).contains(&s.memory_mib));
                            if let Some(c) = s.core_percent {
                                assert!((5..=100).contains(&c) && c % 5 == 0, "{c}");
                            }
                        }
                    }
                    // It round-trips.
                    assert_eq!(Assignment::parse(&a.to_json()).as_ref(), Ok(&a));
                    if let Err(e) = demand_of_assignment(&a, &[]) {
                        out.reject(e);
                    }
                    // What the node does with it: two containers' requests (each parses the
                    // annotation again, as each CreateContainer does), one of them by a
                    // grant chosen by the input.
                    let pod = HashMap::from([(ASSIGNMENT_ANNOTATION.to_string(), raw)]);
                    let first = a.containers.keys().next().map_or("main", String::as_str);
                    let pick = (fnv(input) % grants.len() as u64) as usize;
                    for (name, i) in [(first, pick), ("absent", 0)] {
                        let rules = if i == 0 { &lax } else { &strict };
                        match container_request(&pod, name, &grants[i], &inv, rules) {
                            Err(e) => out.reject(e),
                            Ok(Some(r)) => {
                                assert!(!r.gpus.is_empty());
                                for g in &r.gpus {
                                    assert!(g.memory_mib <= g.gpu_memory_mib);
                                }
                            }
                            Ok(None) => {}
                        }
                    }
                }
            }
            out
        }),
    }
}

#[test]
fn fuzz_assignment() {
    run_target(assignment_target());
}

// --- grant and limits ---------------------------------------------------------------------

const GRANT_DICT: &[&str] = &["mem", "core", "count", "unit"];

fn grant_seeds() -> Vec<Vec<u8>> {
    [
        json!({"mem":"2","core":"30"}),
        json!({"mem":"8","core":"40","count":"2"}),
        json!({"mem":"512","unit":"MiB","count":"1"}),
        json!({"mem":"2GiB"}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

/// The grant target's input: an object of annotation values (a non-string value is used as its
/// JSON text), or anything else as the memory value itself. (Only a small input starting with
/// `{` is decoded as the object: the harness's own JSON decoding is not what is measured.)
fn grant_values(input: &[u8]) -> (Option<String>, Option<String>, Option<String>, MemoryUnit) {
    let as_text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let object = input.first() == Some(&b'{') && input.len() <= MAX_ANNOTATION_BYTES;
    let parsed = if object {
        serde_json::from_slice::<serde_json::Value>(input).ok()
    } else {
        None
    };
    match parsed {
        Some(serde_json::Value::Object(m)) => (
            m.get("mem").map(as_text),
            m.get("core").map(as_text),
            m.get("count").map(as_text),
            match m.get("unit") {
                Some(serde_json::Value::String(u)) if u == "MiB" => MemoryUnit::MiB,
                _ => MemoryUnit::GiB,
            },
        ),
        _ => (Some(text(input)), None, None, MemoryUnit::GiB),
    }
}

fn grant_target<'a>() -> Target<'a> {
    Target {
        name: "grant",
        seeds: grant_seeds(),
        dict: GRANT_DICT,
        markers: &["aliyun.com/gpu-", "--memory"],
        json: true,
        run: Box::new(|input| {
            let mut out = Outcome::default();
            let (mem, core, count, unit) = grant_values(input);
            let names = ResourceNames {
                memory_unit: unit,
                ..Default::default()
            };
            let mut grant = HashMap::new();
            let mut limits = HashMap::new();
            for (ann, res, v) in [
                (GRANTED_MEM_ANNOTATION, &names.memory, &mem),
                (GRANTED_CORE_ANNOTATION, &names.core, &core),
                (GRANTED_COUNT_ANNOTATION, &names.count, &count),
            ] {
                if let Some(v) = v {
                    grant.insert(ann.to_string(), v.clone());
                    limits.insert(res.clone(), v.clone());
                }
            }
            for parsed in [parse_grant(&grant, &names), parse_limits(&limits, &names)] {
                match parsed {
                    Err(e) => out.reject(e),
                    Ok(None) => {}
                    Ok(Some(q)) => {
                        out.accepted = true;
                        // Accepted quantities convert to MiB and bytes without wrapping.
                        let mib = q.memory_units.checked_mul(unit.mib()).expect("MiB fit");
                        assert!(mib <= MAX_MEMORY_MIB && mib.checked_mul(1 << 20).is_some());
                        assert!(q.count.is_none_or(|c| (1..=64).contains(&c)));
                        match Request::from_quantities("p", 0, 0, Some(&q), &names) {
                            Err(e) => out.reject(e),
                            Ok(r) => assert!(r.gpu.count() >= 1),
                        }
                    }
                }
            }
            if let Some(m) = &mem {
                match parse_memory_mib("--memory", m) {
                    Err(e) => out.reject(e),
                    Ok(mib) => assert!((1..=MAX_MEMORY_MIB).contains(&mib)),
                }
            }
            out
        }),
    }
}

#[test]
fn fuzz_grant() {
    run_target(grant_target());
}

// --- node annotation ----------------------------------------------------------------------

const NODE_DICT: &[&str] = &[
    "version",
    "gpus",
    "index",
    "uuid",
    "model",
    "memoryMiB",
    "healthy",
];

fn node_seeds() -> Vec<Vec<u8>> {
    let gpus = |n: u32| json!({"version":1,"gpus":(0..n).map(|i| json!({"index":i,"uuid":format!("GPU-{i}"),"model":"NVIDIA H200","memoryMiB":15360,"healthy":i != 1})).collect::<Vec<_>>()});
    [gpus(1), gpus(4), gpus(8)]
        .iter()
        .map(|v| v.to_string().into_bytes())
        .collect()
}

fn gpu_node(name: &str, annotation: String) -> Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {NODE_GPUS_ANNOTATION: annotation},
            "labels": {"ack.node.gpu.schedule": "core_mem", "ack.node.gpu.placement": "binpack"},
        }
    }))
    .expect("node")
}

fn gpu_pod(name: &str, mem: &str, core: Option<&str>) -> Pod {
    let mut limits = serde_json::Map::new();
    limits.insert("aliyun.com/gpu-mem".into(), json!(mem));
    if let Some(c) = core {
        limits.insert("aliyun.com/gpu-core.percentage".into(), json!(c));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }))
    .expect("pod")
}

fn node_gpus_target<'a>() -> Target<'a> {
    let mut cluster = Cluster::new(
        "gpushare",
        ResourceNames::default(),
        Duration::from_secs(60),
    );
    let pod = gpu_pod("p", "2", Some("30"));
    Target {
        name: "node_gpus",
        seeds: node_seeds(),
        dict: NODE_DICT,
        markers: &["gpushare.io/gpus", "node "],
        json: true,
        run: Box::new(move |input| {
            let mut out = Outcome::default();
            let raw = text(input);
            match NodeGpus::parse(&raw) {
                Err(e) => out.reject(e),
                Ok(g) => {
                    out.accepted = true;
                    assert!(g.gpus.len() <= 64);
                    assert!(g.gpus.windows(2).all(|w| w[0].index < w[1].index));
                    assert_eq!(NodeGpus::parse(&g.to_json()).as_ref(), Ok(&g));
                }
            }
            // What the scheduler's node watch makes of a node carrying it (set_node parses it
            // again, as the watch does), then a filter and a reservation on it.
            let node = gpu_node("fz", raw);
            cluster.set_node(&node);
            let r = cluster.filter(&pod, &["fz".to_string()]);
            for msg in r
                .failed_nodes
                .values()
                .chain(r.failed_and_unresolvable_nodes.values())
            {
                out.reject(msg);
            }
            match cluster.reserve(&pod, "fz", "2026-11-29T19:00:00Z".into()) {
                Err(e) => out.reject(e),
                Ok(res) => {
                    assert_eq!(
                        Assignment::parse(&res.assignment.to_json()).ok().as_ref(),
                        Some(&res.assignment)
                    );
                }
            }
            cluster.forget_pod("uid-p");
            out
        }),
    }
}

#[test]
fn fuzz_node_gpus() {
    run_target(node_gpus_target());
}

// --- limits file --------------------------------------------------------------------------

fn limits_target<'a>() -> Target<'a> {
    let seeds = [
        json!({"version":1,"gpus":[{"index":0,"uuid":"GPU-00000000-0000-4000-8000-000000000000","memory_limit_bytes":2147483648u64}]}),
        json!({"version":1,"gpus":[{"index":0,"uuid":"GPU-a","memory_limit_bytes":1},{"index":3,"uuid":"GPU-b","memory_limit_bytes":4294967296u64}]}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    Target {
        name: "limits_file",
        seeds,
        dict: &["version", "gpus", "index", "uuid", "memory_limit_bytes"],
        markers: &["limits file"],
        json: true,
        run: Box::new(|input| {
            let mut out = Outcome::default();
            match LimitsFile::parse(&text(input)) {
                Err(e) => out.reject(e),
                Ok(f) => {
                    out.accepted = true;
                    assert!(!f.gpus.is_empty() && f.gpus.len() <= 16);
                    assert_eq!(LimitsFile::parse(&f.render()).as_ref(), Ok(&f));
                }
            }
            out
        }),
    }
}

#[test]
fn fuzz_limits_file() {
    run_target(limits_target());
}

// --- scheduler extender -------------------------------------------------------------------

/// The API server, for bind: any pod asked for is a 2 GiB / 30 % GPU pod; writes succeed.
struct FakeApi;

#[async_trait]
impl Binder for FakeApi {
    async fn get_pod(&self, pod: &PodKey) -> Result<Pod, ApiError> {
        let mut p = gpu_pod(&pod.name, "2", Some("30"));
        p.metadata.namespace = Some(pod.namespace.clone());
        p.metadata.uid = Some("uid-bind".into());
        Ok(p)
    }
    async fn bind(&self, _: &PodKey, _: &str, _: &str, _: &Annotations) -> Result<(), ApiError> {
        Ok(())
    }
}

const EXTENDER_DICT: &[&str] = &[
    "Pod",
    "Nodes",
    "NodeNames",
    "PodName",
    "PodNamespace",
    "PodUID",
    "Node",
    "metadata",
    "name",
    "namespace",
    "uid",
    "annotations",
    "spec",
    "containers",
    "initContainers",
    "restartPolicy",
    "Always",
    "resources",
    "limits",
    "requests",
    "aliyun.com/gpu-mem",
    "aliyun.com/gpu-core.percentage",
    "aliyun.com/gpu-count",
    "nodeName",
    "items",
    "a",
    "m",
];

fn extender_seeds() -> Vec<Vec<u8>> {
    let pod = |mem: &str, core: Option<&str>, count: Option<&str>| {
        let mut limits = serde_json::Map::new();
        limits.insert("aliyun.com/gpu-mem".into(), json!(mem));
        if let Some(c) = core {
            limits.insert("aliyun.com/gpu-core.percentage".into(), json!(c));
        }
        if let Some(c) = count {
            limits.insert("aliyun.com/gpu-count".into(), json!(c));
        }
        json!({"metadata":{"name":"p","namespace":"default","uid":"u-1"},"spec":{"containers":[{"name":"main","resources":{"limits":limits}},{"name":"side","resources":{"requests":{"cpu":"1"}}}]}})
    };
    [
        json!({"Pod":pod("2",Some("30"),None),"NodeNames":["a","m","x","unknown"]}),
        json!({"Pod":pod("8",Some("40"),Some("2")),"Nodes":{"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"m"}}]}}),
        json!({"Pod":pod("2",None,None),"NodeNames":["m","a"]}),
        json!({"PodName":"p","PodNamespace":"default","PodUID":"uid-bind","Node":"a"}),
        // GPU init container and sidecar: the pod takes what runs at once.
        json!({"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u-2"},"spec":{
            "initContainers":[
                {"name":"proxy","restartPolicy":"Always","resources":{"limits":{"aliyun.com/gpu-mem":"1","aliyun.com/gpu-core.percentage":"10"}}},
                {"name":"prep","resources":{"limits":{"aliyun.com/gpu-mem":"4","aliyun.com/gpu-core.percentage":"50"}}}],
            "containers":[{"name":"main","resources":{"limits":{"aliyun.com/gpu-mem":"2","aliyun.com/gpu-core.percentage":"30"}}}]}},
            "NodeNames":["a"]}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect()
}

fn extender_target<'a>() -> Target<'a> {
    let mut cluster = Cluster::new(
        "gpushare",
        ResourceNames::default(),
        Duration::from_secs(60),
    );
    let annotation = |n: u32| {
        NodeGpus::parse(
            &json!({"version":1,"gpus":(0..n).map(|i| json!({"index":i,"uuid":format!("GPU-{i}"),"memoryMiB":15360})).collect::<Vec<_>>()})
                .to_string(),
        )
        .expect("annotation")
        .to_json()
    };
    cluster.set_node(&gpu_node("a", annotation(4)));
    let mut m = gpu_node("m", annotation(2));
    m.metadata.labels = Some([("ack.node.gpu.schedule".to_string(), "cgpu".to_string())].into());
    cluster.set_node(&m);
    cluster.set_node(&gpu_node("x", "not json".into()));
    let ext = Arc::new(Extender::new(cluster, Arc::new(FakeApi)));
    ext.synced_nodes.store(true, Ordering::Release);
    ext.synced_pods.store(true, Ordering::Release);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    Target {
        name: "extender",
        seeds: extender_seeds(),
        dict: EXTENDER_DICT,
        markers: &[
            "filter:",
            "prioritize:",
            "bind:",
            "node ",
            "pod ",
            "container ",
        ],
        json: true,
        run: Box::new(move |input| {
            // One request per input, as kube-scheduler sends them: the verb by the input's
            // hash (bind bodies are the seeds with PodName).
            let mut out = Outcome::default();
            let bind_like = input.windows(7).any(|w| w == b"PodName");
            let verb = if bind_like && !fnv(input).is_multiple_of(4) {
                2
            } else {
                fnv(input) % 3
            };
            match verb {
                0 => {
                    // What filter_body does (decode, then filter; a decoding error is the
                    // answer's Error), decoding once.
                    let args = match decode::<ExtenderArgs>("filter", input) {
                        Err(e) => {
                            out.reject(e);
                            return out;
                        }
                        Ok(args) => args,
                    };
                    out.accepted = true;
                    let r = ext.filter(&args);
                    if !r.error.is_empty() {
                        out.reject(&r.error);
                    }
                    let failed = r.failed_nodes.values();
                    for msg in failed.chain(r.failed_and_unresolvable_nodes.values()) {
                        out.reject(msg);
                    }
                    // The decision bind takes on the same pod: reserve it on node a; what
                    // bind would write must re-parse.
                    if let Some(pod) = args.pod {
                        let mut c = ext.cluster.lock().unwrap_or_else(|e| e.into_inner());
                        match c.reserve(&pod, "a", "2026-11-29T19:00:00Z".into()) {
                            Err(e) => out.reject(e),
                            Ok(res) => {
                                let back = Assignment::parse(&res.assignment.to_json());
                                assert_eq!(back.as_ref(), Ok(&res.assignment));
                                // Read back with the pod's spec, as the cache rebuilds
                                // it: the demand the placement took.
                                let roles = container_roles(&pod);
                                let (gpus, demand) = demand_of_assignment(&res.assignment, &roles)
                                    .expect("what we wrote");
                                assert_eq!(gpus, res.allocation.gpus);
                                assert_eq!(demand, res.allocation.demand);
                            }
                        }
                        c.forget_pod(&pod.metadata.uid.clone().unwrap_or_default());
                    }
                }
                1 => match ext.prioritize_body(input) {
                    Err(e) => out.reject(e),
                    Ok(p) => {
                        out.accepted = true;
                        assert!(p.iter().all(|h| (0..=10).contains(&h.score)));
                    }
                },
                _ => match ExtenderBindingArgs::decode(input) {
                    Err(e) => out.reject(e),
                    Ok(args) => {
                        out.accepted = true;
                        let answer = rt.block_on(ext.bind(&args));
                        if !answer.error.is_empty() {
                            out.reject(answer.error);
                        }
                        ext.cluster
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .forget_pod("uid-bind");
                    }
                },
            }
            out
        }),
    }
}

#[test]
fn fuzz_extender() {
    run_target(extender_target());
}

// --- NRI multiplexer ----------------------------------------------------------------------

fn mux_seeds() -> Vec<Vec<u8>> {
    let mut a = Vec::new();
    encode_frames(1, b"hello", 4096, &mut a);
    encode_frames(2, &[7u8; 5000], 4096, &mut a);
    let mut b = Vec::new();
    encode_frames(1, &[1u8; 300], 100, &mut b);
    encode_frames(9, b"unknown connection", 4096, &mut b);
    encode_frames(1, b"", 4096, &mut b);
    let mut c = Vec::new();
    c.extend_from_slice(&1u32.to_be_bytes());
    c.extend_from_slice(&(MAX_IN_PAYLOAD as u32).to_be_bytes());
    let mut d = Vec::new();
    d.extend_from_slice(&0u32.to_be_bytes());
    d.extend_from_slice(&1u32.to_be_bytes());
    d.push(0);
    vec![a, b, c, d]
}

/// Header fields worth planting: lengths around the inbound limit, connection 0 and the ends.
const MUX_FIELDS: &[u32] = &[
    0,
    1,
    2,
    3,
    4096,
    MAX_IN_PAYLOAD as u32 - 1,
    MAX_IN_PAYLOAD as u32,
    MAX_IN_PAYLOAD as u32 + 1,
    u32::MAX,
    0x8000_0000,
];

fn mux_target<'a>() -> Target<'a> {
    Target {
        name: "nri_mux",
        seeds: mux_seeds(),
        dict: &[],
        markers: &["frame", "connection"],
        json: false,
        run: Box::new(|input| {
            let mut out = Outcome::default();
            // Structure: with one input in four, header words are planted at frame offsets.
            let mut data = input.to_vec();
            let mut rng = Rng::new(fnv(input));
            if rng.one_in(4) && data.len() >= HEADER_LEN {
                let at = rng.below(data.len() - HEADER_LEN + 1) & !3;
                let word = rng.pick(MUX_FIELDS).to_be_bytes();
                data[at..at + 4].copy_from_slice(&word);
            }
            let mut dec = FrameDecoder::new();
            let (mut pushed, mut taken) = (0usize, 0usize);
            let mut pos = 0;
            'feed: while pos < data.len() {
                let most = if rng.one_in(2) { 16 } else { 9000 };
                let step = 1 + rng.below(most);
                let end = (pos + step).min(data.len());
                dec.push(&data[pos..end]);
                pushed += end - pos;
                pos = end;
                loop {
                    match dec.next_frame() {
                        Ok(Some((conn, payload))) => {
                            assert_ne!(conn, 0);
                            assert!(payload.len() <= MAX_IN_PAYLOAD);
                            taken += HEADER_LEN + payload.len();
                            out.accepted = true;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            out.reject(e);
                            break 'feed;
                        }
                    }
                }
                assert_eq!(taken + dec.pending(), pushed);
            }
            out
        }),
    }
}

#[test]
fn fuzz_nri_mux() {
    run_target(mux_target());
}

// --- the corpus ---------------------------------------------------------------------------

/// Every kept input (seeds and former failures) still passes every property.
#[test]
fn fuzz_corpus_replays_clean() {
    let targets = [
        assignment_target(),
        grant_target(),
        node_gpus_target(),
        limits_target(),
        extender_target(),
        mux_target(),
    ];
    let mut failures = Vec::new();
    let mut replayed = 0;
    for mut t in targets {
        let mut report = Report {
            target: t.name,
            ..Default::default()
        };
        let seeds = t.seeds.clone();
        for (name, input) in corpus(t.name).into_iter().chain(
            seeds
                .into_iter()
                .map(|s| ("(built-in seed)".to_string(), s)),
        ) {
            replayed += 1;
            if let Err(why) = exercise(&mut t, &mut report, &input) {
                failures.push(format!("{}/{name}: {why}", t.name));
            }
        }
    }
    assert!(replayed > 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
