//! The node agent's status endpoint, served on 127.0.0.1:0 and on a socket in a temporary
//! directory (no root needed): routes, status codes, content types and the exact Prometheus
//! text.

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

/// Where a request goes: the TCP endpoint or the status socket.
trait Endpoint {
    async fn connect(&self) -> Box<dyn Stream>;
}
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

impl Endpoint for std::net::SocketAddr {
    async fn connect(&self) -> Box<dyn Stream> {
        Box::new(TcpStream::connect(self).await.unwrap())
    }
}
impl Endpoint for std::path::PathBuf {
    async fn connect(&self) -> Box<dyn Stream> {
        Box::new(tokio::net::UnixStream::connect(self).await.unwrap())
    }
}

/// One request on its own connection: (status code, content type, body).
async fn get(to: impl Endpoint, path: &str) -> (u16, String, String) {
    let mut sock = to.connect().await;
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

    // Pod names and cgroup paths of the node's containers: not for whoever reaches the port.
    for path in ["/registry", "/inventory"] {
        assert_eq!(
            get(addr, path).await,
            (
                403,
                "text/plain".into(),
                "served only on the agent's status socket (status_socket, root only)\n".into()
            ),
            "{path}"
        );
    }

    assert_eq!(
        get(addr, "/nope").await,
        (404, "text/plain".into(), "not found\n".into())
    );
    server.abort();
}

#[tokio::test]
async fn the_status_socket_answers_registry_and_inventory_and_is_its_owners_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let node = node();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run/status.sock");
    let listener = gpushare::runtime::api::bind("status", &sock).unwrap();
    let server = tokio::spawn(gpushare::status::serve_socket_on(listener, node.clone()));
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(sock.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());

    let (code, ctype, body) = get(sock.clone(), "/registry").await;
    assert_eq!((code, ctype.as_str()), (200, "application/json"));
    let want = serde_json::to_string_pretty(&node.registry.snapshot()).unwrap() + "\n";
    assert_eq!(body, want);

    let (code, ctype, body) = get(sock.clone(), "/inventory").await;
    assert_eq!((code, ctype.as_str()), (200, "application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node_name"], "n", "{body}");
    assert!(body.ends_with("}\n"));

    let (code, _, body) = get(sock.clone(), "/metrics").await;
    assert_eq!((code, body), (200, gpushare::status::metrics(&node)));
    assert_eq!(get(sock.clone(), "/healthz").await.0, 503);

    // Another user, even where the file modes let it connect, gets the connection closed
    // unanswered (its credentials are the kernel's).
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: another user's call needs root to switch users");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs this test as root"
        );
        server.abort();
        return;
    }
    std::fs::set_permissions(
        sock.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let answer = tokio::task::spawn_blocking(move || read_as_nobody(&sock))
        .await
        .unwrap();
    assert_eq!(
        answer,
        Ok(0),
        "bytes another user read (or the errno it met)"
    );
    server.abort();
}

/// In a forked child running as `nobody` (65534): connects to `sock`, sends a request and
/// reads; the child's exit status is the number of bytes it read (capped at 100), or 200 +
/// errno if it could not connect or send. Returns `Ok(bytes)` or `Err(errno)`.
fn read_as_nobody(sock: &std::path::Path) -> Result<i32, i32> {
    use std::io::{Read, Write};
    let req = b"GET /registry HTTP/1.1\r\nHost: status\r\nConnection: close\r\n\r\n";
    // SAFETY: the child only makes system calls (setuid, socket, write, read, _exit).
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = (|| {
                nix::unistd::setgid(nix::unistd::Gid::from_raw(65534))?;
                nix::unistd::setuid(nix::unistd::Uid::from_raw(65534))?;
                let mut s = std::os::unix::net::UnixStream::connect(sock)?;
                s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
                match s.write_all(req) {
                    Ok(()) => {}
                    // Closed before the request was sent: nothing answered.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
                    Err(e) => return Err(e),
                }
                let mut buf = [0u8; 100];
                let mut n = 0;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                        Err(e) => return Err(e),
                    }
                    if n >= 100 {
                        break;
                    }
                }
                Ok::<i32, std::io::Error>(n.min(100) as i32)
            })()
            .unwrap_or_else(|e| 200 + e.raw_os_error().unwrap_or(0).min(55));
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            match nix::sys::wait::waitpid(child, None).unwrap() {
                nix::sys::wait::WaitStatus::Exited(_, c) if c >= 200 => Err(c - 200),
                nix::sys::wait::WaitStatus::Exited(_, c) => Ok(c),
                other => panic!("child: {other:?}"),
            }
        }
    }
}
