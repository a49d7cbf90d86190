//! The node agent's local status endpoint: `/healthz`, `/registry` (JSON), `/metrics`
//! (Prometheus text). A deliberately small HTTP/1.1 responder: GET only, one request per
//! connection.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::node::Node;

/// Prometheus text for the node.
pub fn metrics(node: &Node) -> String {
    let mut out = String::new();
    let s = &node.stats;
    let _ = writeln!(out, "# TYPE gpushare_nri_connected gauge");
    let _ = writeln!(
        out,
        "gpushare_nri_connected {}",
        s.connected.load(Ordering::Relaxed) as u8
    );
    let _ = writeln!(out, "# TYPE gpushare_create_container_total counter");
    for (result, v) in [
        ("gpu", &s.creates_gpu),
        ("passthrough", &s.creates_passthrough),
        ("refused", &s.creates_refused),
    ] {
        let _ = writeln!(
            out,
            "gpushare_create_container_total{{result=\"{result}\"}} {}",
            v.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(out, "# TYPE gpushare_synchronize_total counter");
    let _ = writeln!(
        out,
        "gpushare_synchronize_total {}",
        s.syncs.load(Ordering::Relaxed)
    );
    if let Some(state) = node.state() {
        let _ = writeln!(out, "# TYPE gpushare_gpu_memory_total_mib gauge");
        let _ = writeln!(out, "# TYPE gpushare_gpu_memory_assigned_mib gauge");
        let _ = writeln!(out, "# TYPE gpushare_gpu_core_assigned_percent gauge");
        let _ = writeln!(out, "# TYPE gpushare_gpu_containers gauge");
        for g in &state.inventory.gpus {
            let c = node.registry.committed(g.index, "");
            let l = format!("gpu=\"{}\",uuid=\"{}\"", g.index, g.uuid);
            let _ = writeln!(out, "gpushare_gpu_memory_total_mib{{{l}}} {}", g.memory_mib);
            let _ = writeln!(
                out,
                "gpushare_gpu_memory_assigned_mib{{{l}}} {}",
                c.memory_mib
            );
            let _ = writeln!(
                out,
                "gpushare_gpu_core_assigned_percent{{{l}}} {}",
                c.core_percent
            );
            let _ = writeln!(out, "gpushare_gpu_containers{{{l}}} {}", c.containers);
        }
    }
    if let Some(t) = node.throttle_stats() {
        let containers = t.containers.lock().expect("stats lock").clone();
        let mut gpu_util: std::collections::BTreeMap<u32, (f64, u64)> = Default::default();
        for (name, kind, help) in [
            (
                "gpushare_container_gpu_utilization_ratio",
                "gauge",
                "share of its GPU used in the last period",
            ),
            (
                "gpushare_container_gpu_core_quota_ratio",
                "gauge",
                "compute quota",
            ),
            (
                "gpushare_container_gpu_memory_used_bytes",
                "gauge",
                "GPU memory held",
            ),
            (
                "gpushare_container_gpu_memory_limit_bytes",
                "gauge",
                "GPU memory quota",
            ),
            (
                "gpushare_container_throttled_seconds_total",
                "counter",
                "time spent frozen by the controller",
            ),
            (
                "gpushare_container_freezes_total",
                "counter",
                "times frozen by the controller",
            ),
            (
                "gpushare_container_memory_limit_actions_total",
                "counter",
                "memory-quota actions taken",
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (id, c) in &containers {
                let l = format!(
                    "pod=\"{}\",container=\"{}\",id=\"{}\",gpu=\"{}\"",
                    c.pod,
                    c.container,
                    &id[..id.len().min(12)],
                    c.gpu
                );
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
                let _ = writeln!(out, "{name}{{{l}}} {v}");
            }
        }
        for c in containers.values() {
            let e = gpu_util.entry(c.gpu).or_default();
            e.0 += c.utilization;
            e.1 += c.memory_used_bytes;
        }
        let _ = writeln!(out, "# TYPE gpushare_gpu_utilization_ratio gauge");
        let _ = writeln!(out, "# TYPE gpushare_gpu_memory_used_bytes gauge");
        for (gpu, (u, m)) in &gpu_util {
            let _ = writeln!(
                out,
                "gpushare_gpu_utilization_ratio{{gpu=\"{gpu}\"}} {u:.4}"
            );
            let _ = writeln!(out, "gpushare_gpu_memory_used_bytes{{gpu=\"{gpu}\"}} {m}");
        }
        let _ = writeln!(out, "# TYPE gpushare_controller_loop_seconds gauge");
        let _ = writeln!(
            out,
            "gpushare_controller_loop_seconds {:.6}",
            *t.loop_seconds.lock().expect("stats lock")
        );
    }
    out
}

fn respond(status: &str, ctype: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn route(node: &Node, path: &str) -> String {
    match path {
        "/healthz" => {
            // Ready: connected to the runtime and the registry rebuilt from its Synchronize.
            let up = node.stats.connected.load(Ordering::Relaxed)
                && node.stats.synced.load(Ordering::Acquire);
            let body = if up {
                "ok\n"
            } else if node.stats.connected.load(Ordering::Relaxed) {
                "connected; registry not synchronized with the runtime yet\n"
            } else {
                "not connected to the runtime\n"
            };
            respond(
                if up {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                },
                "text/plain",
                body,
            )
        }
        "/registry" => {
            let body = serde_json::to_string_pretty(&node.registry.snapshot()).unwrap_or_default();
            respond("200 OK", "application/json", &(body + "\n"))
        }
        "/inventory" => {
            let body = serde_json::to_string_pretty(&node.state().as_deref()).unwrap_or_default();
            respond("200 OK", "application/json", &(body + "\n"))
        }
        "/metrics" => respond("200 OK", "text/plain; version=0.0.4", &metrics(node)),
        _ => respond("404 Not Found", "text/plain", "not found\n"),
    }
}

/// Serves the endpoint on `addr` until the task is dropped.
pub async fn serve(addr: &str, node: Arc<Node>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "status endpoint listening");
    loop {
        let (mut sock, _) = listener.accept().await?;
        let node = node.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            while n < buf.len() {
                match sock.read(&mut buf[n..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(m) => n += m,
                }
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let _ = sock.write_all(route(&node, path).as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
