//! The agent's local API for the runtime-level modes: a unix socket only root can reach
//! (mode 0600, and each caller's credentials checked), one JSON request and one JSON answer
//! per connection, bounded in size and time.
//!
//! - `create {id, spec}`: the node's decision on the container whose OCI spec this is —
//!   the same `Node::admit` NRI's CreateContainer runs, so the same refusals and messages —
//!   answered with the adjustment to write into the spec (or none);
//! - `start {id}`, `remove {id}`: the container started / is gone.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::oci::{self, BundleSpec};
use super::pending::Pending;
use crate::node::Node;
use crate::nri::api::nri_api::{Container, ContainerState as NriState, PodSandbox};
use crate::nri::service::Handler;
use gpushare_core::adjust::Adjustment;

/// The largest request: a spec ([`oci::MAX_SPEC_BYTES`]) and its envelope.
pub const MAX_REQUEST_BYTES: u64 = oci::MAX_SPEC_BYTES + 4096;
/// How long a caller has to send its request, and the agent to answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Create { id: String, spec: serde_json::Value },
    Start { id: String },
    Remove { id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub ok: bool,
    /// `create`: what to write into the spec (none: leave it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<Adjustment>,
    /// Not ok: a refusal of the request (as opposed to a fault of the node).
    #[serde(default)]
    pub refusal: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Response {
    fn ok(adjustment: Option<Adjustment>) -> Response {
        Response {
            ok: true,
            adjustment,
            refusal: false,
            message: String::new(),
        }
    }

    fn error(refusal: bool, message: impl Into<String>) -> Response {
        Response {
            ok: false,
            adjustment: None,
            refusal,
            message: message.into(),
        }
    }
}

/// One request against the node. A container the precreate hook names by its handle is
/// watched (`pending`) until it starts.
pub fn handle(node: &Node, pending: &Pending, req: Request) -> Response {
    let (Request::Create { id, .. } | Request::Start { id } | Request::Remove { id }) = &req;
    if let Err(e) = check_id(id) {
        return Response::error(true, e);
    }
    match req {
        Request::Create { id, spec } => {
            let bytes = serde_json::to_vec(&spec).expect("a JSON value serializes");
            let b = match BundleSpec::parse(PathBuf::from("config.json"), &bytes) {
                Ok(b) => b,
                Err(e) => return Response::error(true, format!("gpushare: {e}")),
            };
            let (pod, ctr) = oci::describe(&id, &b, NriState::CONTAINER_CREATED, 0);
            match node.admit(&pod, &ctr) {
                Ok(adj) => {
                    if adj.is_some() && oci::handle(&b).as_deref() == Some(id.as_str()) {
                        pending.admitted(&id, std::time::Instant::now());
                    }
                    Response::ok(adj)
                }
                Err(e) => Response::error(e.code == ttrpc::Code::INVALID_ARGUMENT, e.message),
            }
        }
        Request::Start { id } => {
            pending.settled(&id);
            node.start_container(&PodSandbox::default(), &by_id(&id));
            Response::ok(None)
        }
        Request::Remove { id } => {
            pending.settled(&id);
            node.remove_container(&PodSandbox::default(), &by_id(&id));
            Response::ok(None)
        }
    }
}

pub fn by_id(id: &str) -> Container {
    Container {
        id: id.to_string(),
        ..Default::default()
    }
}

/// Container ids name directories of the agent's (limiter files): runc's own rule.
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
        && id != "."
        && id != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "gpushare: container id {} is not a valid runc id ([A-Za-z0-9_+.-], at most 1024)",
            gpushare_core::echo::Echo::new(id)
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{what} socket {}: {source}", path.display())]
    Socket {
        /// Which socket: `runtime_api`, `status`.
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Binds a root-only socket (`what` names it in errors: `runtime_api`, `status`): its
/// directory created 0700 if missing, a stale socket replaced, the socket itself 0600.
pub fn bind(what: &'static str, path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| ServeError::Socket {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    // Created 0600 from the start (no window in which another user could connect).
    let old = unsafe { libc::umask(0o177) };
    let listener = tokio::net::UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let listener = listener.map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serves `listener` for ever: root callers only, [`MAX_CONNECTIONS`] at a time.
pub async fn serve(listener: tokio::net::UnixListener, node: Arc<Node>, pending: Arc<Pending>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and the like: wait and go on, never end.
                tracing::warn!(error = %e, "runtime_api accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (node, pending) = (node.clone(), pending.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = serve_one(stream, &node, &pending).await {
                tracing::warn!(error = %e, "runtime_api connection");
            }
        });
    }
}

async fn serve_one(
    mut stream: tokio::net::UnixStream,
    node: &Arc<Node>,
    pending: &Arc<Pending>,
) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    if cred.uid() != 0 {
        tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), "runtime_api: caller is not root; refused");
        let r = Response::error(true, "gpushare: only root may use the runtime API");
        return write_response(&mut stream, &r).await;
    }
    let mut line = Vec::new();
    let read = async {
        let mut reader = tokio::io::BufReader::new((&mut stream).take(MAX_REQUEST_BYTES + 1));
        reader.read_until(b'\n', &mut line).await
    };
    match tokio::time::timeout(IO_TIMEOUT, read).await {
        Ok(r) => {
            r?;
        }
        Err(_) => return Ok(()),
    }
    let resp = if line.len() as u64 > MAX_REQUEST_BYTES {
        Response::error(
            true,
            format!("gpushare: request larger than {MAX_REQUEST_BYTES} bytes"),
        )
    } else {
        match serde_json::from_slice::<Request>(&line) {
            Ok(req) => {
                let (node, pending) = (node.clone(), pending.clone());
                tokio::task::spawn_blocking(move || handle(&node, &pending, req))
                    .await
                    .unwrap_or_else(|e| Response::error(false, format!("gpushare: {e}")))
            }
            Err(e) => Response::error(true, format!("gpushare: bad runtime API request: {e}")),
        }
    };
    match tokio::time::timeout(IO_TIMEOUT, write_response(&mut stream, &resp)).await {
        // A notification's sender (`notify`) does not wait for the answer.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

async fn write_response(stream: &mut tokio::net::UnixStream, r: &Response) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(r).expect("a response serializes");
    bytes.push(b'\n');
    stream.write_all(&bytes).await
}

/// Sends `req` without waiting for the answer: the request is in the socket's buffer when
/// this returns, and the agent handles it after the caller has gone (peer credentials are
/// taken at connect, so the check still holds). For notifications on a container's hot path
/// (`start`), where the caller has nothing to do with the answer.
pub fn notify(socket: &Path, req: &Request, timeout: Duration) -> Result<(), CallError> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(|source| {
        CallError::Unreachable {
            socket: socket.to_path_buf(),
            source,
        }
    })?;
    let mut bytes = serde_json::to_vec(req).expect("a request serializes");
    bytes.push(b'\n');
    stream
        .set_write_timeout(Some(timeout))
        .and_then(|_| stream.write_all(&bytes))
        .map_err(|e| CallError::NoAnswer {
            socket: socket.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Why a call did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the gpushare node agent is not reachable on {}: {source}", socket.display())]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("the gpushare node agent on {} did not answer: {reason}", socket.display())]
    NoAnswer { socket: PathBuf, reason: String },
}

/// One call, blocking (the wrapper and the hook are short-lived processes).
pub fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<Response, CallError> {
    let unreachable = |source| CallError::Unreachable {
        socket: socket.to_path_buf(),
        source,
    };
    let no_answer = |reason: String| CallError::NoAnswer {
        socket: socket.to_path_buf(),
        reason,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(unreachable)?;
    let mut bytes = serde_json::to_vec(req).expect("a request serializes");
    bytes.push(b'\n');
    stream
        .write_all(&bytes)
        .map_err(|e| no_answer(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| no_answer(e.to_string()))?;
    serde_json::from_str(&line).map_err(|e| no_answer(format!("bad answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::AgentState;
    use serde_json::json;
    use std::time::Instant;

    fn spec(annotations: serde_json::Value) -> serde_json::Value {
        json!({
            "ociVersion": "1.0.2",
            "process": {"cwd": "/", "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": []},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        })
    }

    fn gpu(core: u32, handle: Option<&str>) -> serde_json::Value {
        let mut a = json!({
            "gpushare.io/assignment": format!(
                r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":1,"memoryMiB":2048,"corePercent":{core}}}]}}}}"#
            ),
            "gpushare.io/granted-mem": "2",
            "gpushare.io/granted-core": core.to_string(),
        });
        if let Some(h) = handle {
            a[oci::HANDLE_ANNOTATION] = json!(h);
        }
        spec(a)
    }

    #[test]
    fn the_hooks_containers_are_watched_until_they_start() {
        let node = Node::new(AgentState::in_memory("n"));
        let pending = Pending::new(Duration::ZERO);
        let create = |id: &str, spec| {
            handle(
                &node,
                &pending,
                Request::Create {
                    id: id.into(),
                    spec,
                },
            )
        };
        let r = create("hook-1", gpu(30, Some("hook-1")));
        assert!(r.ok && r.adjustment.is_some(), "{r:?}");
        let r = create("runc-id", gpu(30, None));
        assert!(r.ok, "{r:?}");
        assert_eq!(
            pending.due(Instant::now()),
            vec!["hook-1"],
            "the wrapper's containers are not the hook's"
        );
        assert!(
            handle(
                &node,
                &pending,
                Request::Start {
                    id: "hook-1".into()
                }
            )
            .ok
        );
        assert!(pending.due(Instant::now()).is_empty());
        assert!(node.registry.get("hook-1").is_some());
        assert!(
            handle(
                &node,
                &pending,
                Request::Remove {
                    id: "hook-1".into()
                }
            )
            .ok
        );
        assert!(node.registry.get("hook-1").is_none());
    }

    #[test]
    fn refusals_are_the_nodes_and_ids_are_checked() {
        let node = Node::new(AgentState::in_memory("n"));
        let pending = Pending::new(Duration::ZERO);
        let r = handle(
            &node,
            &pending,
            Request::Create {
                id: "hook-2".into(),
                spec: gpu(33, Some("hook-2")),
            },
        );
        assert!(!r.ok && r.refusal);
        assert!(
            r.message
                .contains("aliyun.com/gpu-core.percentage 33 is not a multiple of 5"),
            "{}",
            r.message
        );
        assert!(
            pending.due(Instant::now()).is_empty(),
            "refused: not watched"
        );
        for req in [
            Request::Remove { id: "../x".into() },
            Request::Start { id: String::new() },
        ] {
            let r = handle(&node, &pending, req);
            assert!(
                !r.ok && r.refusal && r.message.contains("not a valid runc id"),
                "{r:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_notification_is_handled_after_its_sender_is_gone() {
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var("CI").is_err(), "CI runs the tests as root");
            eprintln!("SKIP: the runtime API serves root callers only; run as root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("runtime.sock");
        let node = Arc::new(Node::new(AgentState::in_memory("n")));
        let pending = Arc::new(Pending::new(Duration::ZERO));
        tokio::spawn(serve(
            bind("runtime_api", &sock).unwrap(),
            node.clone(),
            pending,
        ));
        let s = sock.clone();
        let created = tokio::task::spawn_blocking(move || {
            let req = Request::Create {
                id: "c1".into(),
                spec: gpu(30, None),
            };
            let r = call(&s, &req, Duration::from_secs(5)).unwrap();
            notify(
                &s,
                &Request::Start { id: "c1".into() },
                Duration::from_secs(5),
            )
            .unwrap();
            r
        })
        .await
        .unwrap();
        assert!(created.ok && created.adjustment.is_some(), "{created:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while node.registry.get("c1").map(|r| r.state)
            != Some(crate::registry::ContainerState::Running)
        {
            assert!(
                Instant::now() < deadline,
                "start not handled: {:?}",
                node.registry.get("c1")
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let err = notify(
            &dir.path().join("none.sock"),
            &Request::Start { id: "c1".into() },
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(err, CallError::Unreachable { .. }), "{err}");
    }
}
