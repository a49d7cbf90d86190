//! The node agent's status endpoint, served on 127.0.0.1:0 (no root): routes, status codes,
//! content types and the exact Prometheus text.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpushare::node::{AgentState, Node};
use gpushare::throttle::cgroup::{CgroupFs, CgroupVersion};
use gpushare::throttle::controller::{ContainerStats, ControllerLink, ThrottleStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn node() -> Arc<Node> {
    let node = Arc::new(Node::new(AgentState::in_memory("n")));
    node.stats.creates_gpu.fetch_add(3, Ordering::Relaxed);
    node.stats.creates_refused.fetch_add(1, Ordering::Relaxed);
    node.stats.refused_by[2].fetch_add(1, Ordering::Relaxed);
    node.stats.syncs.fetch_add(2, Ordering::Relaxed);
    let stats = ThrottleStats::default();
    stats.containers.lock().unwrap().insert(
        "0123456789abcdef".into(),
        ContainerStats {
            pod: "ml/train-0".into(),
            container: "main".into(),
            gpu: 1,
            quota_percent: Some(30),
            utilization: 0.25,
            memory_used_bytes: 1 << 30,
            memory_limit_bytes: 2 << 30,
            throttled_seconds: 1.5,
            freezes: 4,
            memory_actions: 0,
        },
    );
    *stats.loop_seconds.lock().unwrap() = 0.000125;
    stats
        .sample_nanos
        .store(2_500_000, std::sync::atomic::Ordering::Relaxed);
    let link = ControllerLink::new(CgroupFs::new("/nonexistent", CgroupVersion::V2));
    node.attach(
        Arc::new(stats),
        Arc::new(link),
        Arc::new(std::sync::atomic::AtomicBool::new(true)),
    );
    node
}

#[test]
fn metrics_text_is_exact() {
    assert_eq!(
        gpushare::status::metrics(&node()),
        include_str!("golden/status_metrics.txt")
    );
}

/// One request on its own connection: (status code, content type, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: status\r\nConnection: close\r\n\r\n");
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    sock.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_string)
        })
        .unwrap_or_default();
    (code, ctype, body.to_string())
}

#[tokio::test]
async fn routes_answer_as_before() {
    let node = node();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(gpushare::status::serve_on(listener, node.clone()));

    let not_connected = (
        503,
        "text/plain".into(),
        "not connected to the runtime\n".into(),
    );
    assert_eq!(get(addr, "/healthz").await, not_connected);
    node.stats.connected.store(true, Ordering::Relaxed);
    let (code, _, body) = get(addr, "/healthz").await;
    assert_eq!(
        (code, body.as_str()),
        (
            503,
            "connected; registry not synchronized with the runtime yet\n"
        )
    );
    node.stats.synced.store(true, Ordering::Release);
    assert_eq!(
        get(addr, "/healthz").await,
        (200, "text/plain".into(), "ok\n".into())
    );

    let (code, ctype, body) = get(addr, "/metrics").await;
    assert_eq!((code, ctype.as_str()), (200, "text/plain; version=0.0.4"));
    assert_eq!(body, gpushare::status::metrics(&node));

    let (code, ctype, body) = get(addr, "/registry").await;
    assert_eq!((code, ctype.as_str()), (200, "application/json"));
    let want = serde_json::to_string_pretty(&node.registry.snapshot()).unwrap() + "\n";
    assert_eq!(body, want);

    let (code, ctype, body) = get(addr, "/inventory").await;
    assert_eq!((code, ctype.as_str()), (200, "application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node_name"], "n", "{body}");
    assert!(body.ends_with("}\n"));

    assert_eq!(
        get(addr, "/nope").await,
        (404, "text/plain".into(), "not found\n".into())
    );
    server.abort();
}
