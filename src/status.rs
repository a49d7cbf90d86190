//! The node agent's status endpoint: `/healthz` and `/metrics` (Prometheus text) on TCP
//! (`status_listen`, for kubelet's probes and Prometheus), and those with `/registry` and
//! `/inventory` (JSON: every GPU container's pod, cgroup path and shares; the GPUs and their
//! device nodes) on a unix socket only root reaches (`status_socket`), served with axum like
//! the scheduler extender. On TCP those two answer 403: whoever reaches the port (a pod, when
//! it listens on the node's addresses) learns nothing of the node's other containers.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any};
use tokio::net::TcpListener;

use crate::metrics::{CONTENT_TYPE, Kind, PromText};
use crate::node::{Node, REFUSAL_REASONS};

/// Per-container series of the throttling controller: name, type, help.
const CONTAINER_FAMILIES: [(&str, Kind, &str); 7] = [
    (
        "gpushare_container_gpu_utilization_ratio",
        Kind::Gauge,
        "share of its GPU used in the last period",
    ),
    (
        "gpushare_container_gpu_core_quota_ratio",
        Kind::Gauge,
        "compute quota",
    ),
    (
        "gpushare_container_gpu_memory_used_bytes",
        Kind::Gauge,
        "GPU memory held",
    ),
    (
        "gpushare_container_gpu_memory_limit_bytes",
        Kind::Gauge,
        "GPU memory quota",
    ),
    (
        "gpushare_container_throttled_seconds_total",
        Kind::Counter,
        "time spent frozen by the controller",
    ),
    (
        "gpushare_container_freezes_total",
        Kind::Counter,
        "times frozen by the controller",
    ),
    (
        "gpushare_container_memory_limit_actions_total",
        Kind::Counter,
        "memory-quota actions taken",
    ),
];

/// Prometheus text for the node.
pub fn metrics(node: &Node) -> String {
    let mut m = PromText::new();
    let s = &node.stats;
    m.family("gpushare_nri_connected", Kind::Gauge)
        .sample(&[], s.connected.load(Ordering::Relaxed) as u8)
        .family("gpushare_create_container_total", Kind::Counter);
    for (result, v) in [
        ("gpu", &s.creates_gpu),
        ("passthrough", &s.creates_passthrough),
        ("neutralized", &s.creates_neutralized),
        ("exempt", &s.creates_exempt),
        ("refused", &s.creates_refused),
    ] {
        m.sample(&[("result", result)], v.load(Ordering::Relaxed));
    }
    m.family("gpushare_create_container_refused_total", Kind::Counter);
    for (reason, v) in REFUSAL_REASONS.iter().zip(&s.refused_by) {
        m.sample(&[("reason", reason)], v.load(Ordering::Relaxed));
    }
    m.family("gpushare_synchronize_total", Kind::Counter)
        .sample(&[], s.syncs.load(Ordering::Relaxed))
        .family("gpushare_killed_unadjusted_containers_total", Kind::Counter)
        .sample(&[], s.killed_unadjusted.load(Ordering::Relaxed))
        .family("gpushare_unaccounted_containers", Kind::Gauge)
        .sample(
            &[],
            node.unaccounted.lock().expect("unaccounted lock").len() as u64,
        );
    if let Some(state) = node.state() {
        for name in [
            "gpushare_gpu_memory_total_mib",
            "gpushare_gpu_memory_assigned_mib",
            "gpushare_gpu_core_assigned_percent",
            "gpushare_gpu_containers",
        ] {
            m.family(name, Kind::Gauge);
        }
        for g in &state.inventory.gpus {
            let c = node.registry.committed(g.index, "");
            let index = g.index.to_string();
            let l = [("gpu", index.as_str()), ("uuid", g.uuid.as_str())];
            m.sample_of("gpushare_gpu_memory_total_mib", &l, g.memory_mib)
                .sample_of("gpushare_gpu_memory_assigned_mib", &l, c.memory_mib)
                .sample_of("gpushare_gpu_core_assigned_percent", &l, c.core_percent)
                .sample_of("gpushare_gpu_containers", &l, c.containers);
        }
    }
    if let Some(t) = node.throttle_stats() {
        let containers = t.containers.lock().expect("stats lock").clone();
        for (name, kind, help) in CONTAINER_FAMILIES {
            m.help(name, help).family(name, kind);
            for (id, c) in &containers {
                let gpu = c.gpu.to_string();
                let l = [
                    ("pod", c.pod.as_str()),
                    ("container", c.container.as_str()),
                    ("id", &id[..id.len().min(12)]),
                    ("gpu", gpu.as_str()),
                ];
                let v = match name {
                    "gpushare_container_gpu_utilization_ratio" => format!("{:.4}", c.utilization),
                    "gpushare_container_gpu_core_quota_ratio" => {
                        format!("{:.2}", c.quota_percent.map_or(1.0, |q| q as f64 / 100.0))
                    }
                    "gpushare_container_gpu_memory_used_bytes" => c.memory_used_bytes.to_string(),
                    "gpushare_container_gpu_memory_limit_bytes" => c.memory_limit_bytes.to_string(),
                    "gpushare_container_throttled_seconds_total" => {
                        format!("{:.3}", c.throttled_seconds)
                    }
                    "gpushare_container_freezes_total" => c.freezes.to_string(),
                    _ => c.memory_actions.to_string(),
                };
                m.sample(&l, v);
            }
        }
        let mut gpu_util: std::collections::BTreeMap<u32, (f64, u64)> = Default::default();
        for c in containers.values() {
            let e = gpu_util.entry(c.gpu).or_default();
            e.0 += c.utilization;
            e.1 += c.memory_used_bytes;
        }
        m.family("gpushare_gpu_utilization_ratio", Kind::Gauge)
            .family("gpushare_gpu_memory_used_bytes", Kind::Gauge);
        for (gpu, (u, mem)) in &gpu_util {
            let gpu = gpu.to_string();
            let l = [("gpu", gpu.as_str())];
            m.sample_of("gpushare_gpu_utilization_ratio", &l, format!("{u:.4}"))
                .sample_of("gpushare_gpu_memory_used_bytes", &l, mem);
        }
        m.family("gpushare_controller_loop_seconds", Kind::Gauge)
            .sample(
                &[],
                format!("{:.6}", *t.loop_seconds.lock().expect("stats lock")),
            );
        let sampled = t.sample_nanos.load(std::sync::atomic::Ordering::Relaxed);
        m.family("gpushare_controller_sample_seconds_total", Kind::Counter)
            .sample(&[], format!("{:.6}", sampled as f64 / 1e9));
    }
    m.finish()
}

/// The TCP endpoint's routes (any method, as before axum): `/healthz`, `/metrics`; `/registry`
/// and `/inventory` are 403 (the status socket's only); anything else is 404 `not found`.
pub fn router(node: Arc<Node>) -> Router {
    routes(node, any(socket_only), any(socket_only))
}

/// The status socket's routes: the TCP endpoint's, `/registry` and `/inventory` answered.
pub fn socket_router(node: Arc<Node>) -> Router {
    routes(node, any(registry), any(inventory))
}

fn routes(
    node: Arc<Node>,
    registry: MethodRouter<Arc<Node>>,
    inventory: MethodRouter<Arc<Node>>,
) -> Router {
    Router::new()
        .route("/healthz", any(healthz))
        .route("/registry", registry)
        .route("/inventory", inventory)
        .route("/metrics", any(metrics_route))
        .fallback(not_found)
        .with_state(node)
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Pretty JSON and a newline.
fn json(value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_string_pretty(value).unwrap_or_default();
    text(StatusCode::OK, "application/json", body + "\n")
}

async fn healthz(State(node): State<Arc<Node>>) -> Response {
    // Ready: connected to the runtime and the registry rebuilt from its Synchronize.
    let connected = node.stats.connected.load(Ordering::Relaxed);
    let (status, body) = if connected && node.stats.synced.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n")
    } else if connected {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "connected; registry not synchronized with the runtime yet\n",
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the runtime\n",
        )
    };
    text(status, "text/plain", body.to_string())
}

async fn registry(State(node): State<Arc<Node>>) -> Response {
    json(&node.registry.snapshot())
}

async fn inventory(State(node): State<Arc<Node>>) -> Response {
    json(&node.state().as_deref())
}

async fn metrics_route(State(node): State<Arc<Node>>) -> Response {
    text(StatusCode::OK, CONTENT_TYPE, metrics(&node))
}

async fn socket_only() -> Response {
    text(
        StatusCode::FORBIDDEN,
        "text/plain",
        "served only on the agent's status socket (status_socket, root only)\n".into(),
    )
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into())
}

/// Serves the endpoint on `addr` until the task is dropped.
pub async fn serve(addr: &str, node: Arc<Node>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "status endpoint listening");
    serve_on(listener, node).await
}

/// Serves the endpoint on `listener` until the task is dropped, within
/// [`crate::http::Limits::default`] (128 connections, 10 s for headers, 30 s a request) and
/// 8 connections per client address: its clients (kubelet's probes, Prometheus) need few, and
/// no pod can hold the places the liveness probe needs.
pub async fn serve_on(listener: TcpListener, node: Arc<Node>) -> std::io::Result<()> {
    crate::http::serve(
        listener,
        router(node),
        crate::http::Limits {
            max_per_peer: STATUS_MAX_PER_PEER,
            ..crate::http::Limits::default()
        },
        std::future::pending(),
    )
    .await
}

/// Serves the status socket at `path` (its directory made 0700 if missing, a stale socket
/// replaced, the socket 0600; callers other than root are closed unanswered) until the task is
/// dropped.
pub async fn serve_socket(path: &std::path::Path, node: Arc<Node>) -> anyhow::Result<()> {
    let listener = crate::runtime::api::bind("status", path)?;
    tracing::info!(path = %path.display(), "status socket listening");
    serve_socket_on(listener, node).await?;
    Ok(())
}

/// Serves the status socket on `listener` until the task is dropped (128 connections, the
/// deadlines of [`crate::http::Limits::default`]).
pub async fn serve_socket_on(
    listener: tokio::net::UnixListener,
    node: Arc<Node>,
) -> std::io::Result<()> {
    crate::http::serve_unix(
        listener,
        socket_router(node),
        crate::http::Limits::default(),
        std::future::pending(),
    )
    .await
}

/// Connections one client address may hold on the status endpoint.
pub const STATUS_MAX_PER_PEER: usize = 8;
