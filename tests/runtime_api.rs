//! The agent's local API for the runtime-level modes, over a real unix socket: the decision a
//! GPU container gets is NRI's (same adjustment, same refusal text), `remove` takes it off the
//! books, and nobody but root gets through.

use std::sync::Arc;
use std::time::Duration;

use gpushare::node::{AgentState, Node};
use gpushare::runtime::api::{self, Request};
use serde_json::json;

fn spec(assignment: &str, granted_mem: &str, granted_core: &str) -> serde_json::Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"cwd": "/", "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": ["PATH=/bin"]},
        "root": {"path": "rootfs"},
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "main",
            "io.kubernetes.cri.sandbox-id": "sb1",
            "io.kubernetes.cri.sandbox-name": "p1",
            "io.kubernetes.cri.sandbox-namespace": "default",
            "io.kubernetes.cri.sandbox-uid": "u1",
            "gpushare.io/assignment": assignment,
            "gpushare.io/granted-mem": granted_mem,
            "gpushare.io/granted-core": granted_core,
        },
        "linux": {"cgroupsPath": "/k8s/c1"},
    })
}

fn assignment(gpu: u32, mem: u64, core: u32) -> String {
    format!(
        r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":{gpu},"memoryMiB":{mem},"corePercent":{core}}}]}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_api_gives_the_nri_decision_to_root_only() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/runtime.sock");
    let node = Arc::new(Node::new(AgentState::in_memory("test-node")));
    let listener = api::bind("runtime_api", &socket).unwrap();
    let pending = Arc::new(gpushare::runtime::pending::Pending::new(
        Duration::from_secs(60),
    ));
    tokio::spawn(api::serve(listener, node.clone(), pending));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is root's only");

    let call = |req: Request| {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || api::call(&socket, &req, Duration::from_secs(5)))
    };
    // Admitted: the adjustment NRI would give (GPU 1's device node, its env), registered.
    let r = call(Request::Create {
        id: "c1".into(),
        spec: spec(&assignment(1, 2048, 30), "2", "30"),
    })
    .await
    .unwrap()
    .unwrap();
    assert!(r.ok, "{r:?}");
    let adj = r.adjustment.expect("an adjustment");
    assert_eq!(adj.devices[0].path, "/dev/nvidia1");
    assert!(
        adj.env
            .contains(&("GPUSHARE_GPU_MEMORY_MIB".into(), "2048".into()))
    );
    assert_eq!(node.registry.snapshot().len(), 1);

    // Refused with the NRI path's message; nothing registered.
    let r = call(Request::Create {
        id: "c2".into(),
        spec: spec(&assignment(1, 2048, 33), "2", "33"),
    })
    .await
    .unwrap()
    .unwrap();
    assert!(!r.ok && r.refusal, "{r:?}");
    assert!(
        r.message
            .starts_with("gpushare: aliyun.com/gpu-core.percentage 33 is not a multiple of 5"),
        "{}",
        r.message
    );
    assert_eq!(node.registry.snapshot().len(), 1);

    // A container id that would name a directory outside the agent's.
    let r = call(Request::Create {
        id: "../x".into(),
        spec: spec(&assignment(1, 1024, 10), "1", "10"),
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        !r.ok && r.message.contains("is not a valid runc id"),
        "{r:?}"
    );

    // Removed: off the books.
    let r = call(Request::Remove { id: "c1".into() })
        .await
        .unwrap()
        .unwrap();
    assert!(r.ok);
    assert!(node.registry.snapshot().is_empty());

    // A request that is not one is refused with the reason.
    let raw = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::{BufRead, Write};
            let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            s.write_all(b"{\"op\":\"format_disk\"}\n").unwrap();
            let mut line = String::new();
            std::io::BufReader::new(s).read_line(&mut line).unwrap();
            line
        })
        .await
        .unwrap()
    };
    assert!(raw.contains("bad runtime API request"), "{raw}");

    // Not root: the socket's mode (and its directory's) keeps it out; the server would refuse
    // it too.
    if nix::unistd::geteuid().is_root() {
        let connect = format!(
            "import socket; socket.socket(socket.AF_UNIX).connect({:?})",
            socket.display().to_string()
        );
        let st = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "python3",
                "-c",
            ])
            .arg(&connect)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("setpriv (util-linux) and python3");
        assert!(!st.success(), "user nobody connected to the runtime socket");
    } else {
        eprintln!("not root: the non-root caller check needs root to switch users; skipped");
    }
}
