//! The device plugin against an in-process fake kubelet (a tonic `Registration` server on a
//! tempdir socket) and, for the node sync, a mock API server. No root, no cluster.
//!
//! The fake kubelet records `Register` calls; the tests then dial each plugin socket as
//! kubelet does (`ListAndWatch`, `Allocate`), delete the sockets as a restarting kubelet does,
//! and check that the plugin registers again.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare::deviceplugin::api::device_plugin_client::DevicePluginClient;
use gpushare::deviceplugin::api::registration_server::{Registration, RegistrationServer};
use gpushare::deviceplugin::api::{
    self, AllocateRequest, ContainerAllocateRequest, Empty, RegisterRequest,
};
use gpushare::deviceplugin::endpoint::dial;
use gpushare::deviceplugin::{
    Agent, CoreMode, DevicePluginConfig, DevicePlugins, KUBELET_SOCKET, KubeAccess, ResourceKind,
    Settings,
};
use gpushare_core::inventory::{Inventory, SimConfig, sim_inventory};
use gpushare_core::request::ResourceNames;
use gpushare_core::request::node::{NODE_GPUS_ANNOTATION, NodeGpus};
use tokio::net::UnixListener;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

const MEM: &str = "aliyun.com/gpu-mem";
const CORE: &str = "aliyun.com/gpu-core.percentage";
const COUNT: &str = "aliyun.com/gpu-count";
/// Generous: registration normally takes milliseconds, re-registration about a second.
const WAIT: Duration = Duration::from_secs(10);

fn inventory() -> Inventory {
    // 4 GPUs × 15 GiB.
    Inventory::new(sim_inventory(&SimConfig::default(), "n1"))
}

fn socket(dir: &Path, kind: ResourceKind) -> PathBuf {
    dir.join(kind.socket_name())
}

/// `RUST_LOG=gpushare=debug cargo test --test device_plugin -- --nocapture` shows the agent's
/// logs.
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

// ---------------------------------------------------------------------------------------
// The fake kubelet.

struct Recorder(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

struct FakeKubelet {
    path: PathBuf,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    fn start(dir: &Path) -> FakeKubelet {
        init_logs();
        let path = dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the fake kubelet socket");
        let (tx, registrations) = mpsc::unbounded_channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let incoming = futures::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        let task = tokio::spawn(async move {
            Server::builder()
                .add_service(RegistrationServer::new(Recorder(tx)))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                })
                .await
                .expect("fake kubelet serves");
        });
        FakeKubelet {
            path,
            registrations,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The next `n` registrations, sorted by resource name.
    async fn next(&mut self, n: usize) -> Vec<RegisterRequest> {
        let mut got = vec![];
        let deadline = tokio::time::Instant::now() + WAIT;
        while got.len() < n {
            match tokio::time::timeout_at(deadline, self.registrations.recv()).await {
                Ok(Some(r)) => got.push(r),
                _ => panic!(
                    "expected {n} registrations within {WAIT:?}, got {}: {got:?}",
                    got.len()
                ),
            }
        }
        got.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        got
    }

    /// Asserts that nothing registers for `d`.
    async fn quiet(&mut self, d: Duration) {
        if let Ok(Some(r)) = tokio::time::timeout(d, self.registrations.recv()).await {
            panic!("unexpected registration {r:?}");
        }
    }

    /// Stops serving and removes `kubelet.sock`, as a kubelet going down leaves it gone.
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn names(regs: &[RegisterRequest]) -> Vec<(&str, &str)> {
    regs.iter()
        .map(|r| (r.resource_name.as_str(), r.endpoint.as_str()))
        .collect()
}

fn start_plugins(dir: &Path, core: bool) -> Arc<DevicePlugins> {
    let p = Arc::new(DevicePlugins::new(
        Settings::new(dir),
        &inventory(),
        &ResourceNames::default(),
    ));
    p.start(ResourceKind::Memory);
    p.start(ResourceKind::Count);
    if core {
        p.start(ResourceKind::Core);
    }
    p
}

async fn client(dir: &Path, kind: ResourceKind) -> DevicePluginClient<tonic::transport::Channel> {
    let path = socket(dir, kind);
    let channel = dial(&path)
        .await
        .unwrap_or_else(|e| panic!("dial {}: {e}", path.display()));
    DevicePluginClient::new(channel)
}

async fn first_list(dir: &Path, kind: ResourceKind) -> Vec<api::Device> {
    let mut c = client(dir, kind).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("ListAndWatch sends at once")
        .unwrap()
        .expect("a device list")
        .devices
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Registration.

#[tokio::test]
async fn registers_memory_core_and_count_with_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    let regs = kubelet.next(3).await;
    assert_eq!(
        names(&regs),
        [
            (CORE, "gpushare-core.sock"),
            (COUNT, "gpushare-count.sock"),
            (MEM, "gpushare-mem.sock"),
        ]
    );
    for r in &regs {
        assert_eq!(r.version, "v1beta1");
        let o = r.options.as_ref().expect("options");
        assert!(!o.pre_start_required && !o.get_preferred_allocation_available);
        assert!(dir.path().join(&r.endpoint).exists(), "{}", r.endpoint);
    }
    kubelet.quiet(Duration::from_millis(1500)).await;
    plugins.shutdown().await;
}

#[tokio::test]
async fn registers_memory_and_count_only_without_core() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), false);
    let regs = kubelet.next(2).await;
    assert_eq!(
        names(&regs),
        [(COUNT, "gpushare-count.sock"), (MEM, "gpushare-mem.sock")]
    );
    kubelet.quiet(Duration::from_millis(1500)).await;
    assert!(!socket(dir.path(), ResourceKind::Core).exists());
    plugins.shutdown().await;
}

#[tokio::test]
async fn registers_once_the_kubelet_socket_appears() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = start_plugins(dir.path(), true);
    // No kubelet yet: the plugins serve (their socket appears; 10 s at most on a loaded
    // host) and retry the registration meanwhile.
    let t0 = std::time::Instant::now();
    while !socket(dir.path(), ResourceKind::Memory).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no plugin socket after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut kubelet = FakeKubelet::start(dir.path());
    let regs = kubelet.next(3).await;
    assert_eq!(regs.len(), 3);
    plugins.shutdown().await;
}

#[tokio::test]
async fn reregisters_after_a_kubelet_restart_deletes_the_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    kubelet.next(3).await;

    // What a restarting kubelet does: it goes away, deletes every socket in its directory,
    // and comes back with a new kubelet.sock.
    kubelet.stop().await;
    for kind in ResourceKind::ALL {
        std::fs::remove_file(socket(dir.path(), kind)).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut kubelet = FakeKubelet::start(dir.path());
    let started = std::time::Instant::now();
    let regs = kubelet.next(3).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "re-registered after {:?}",
        started.elapsed()
    );
    assert_eq!(
        names(&regs),
        [
            (CORE, "gpushare-core.sock"),
            (COUNT, "gpushare-count.sock"),
            (MEM, "gpushare-mem.sock"),
        ]
    );
    // The new sockets serve.
    assert_eq!(first_list(dir.path(), ResourceKind::Memory).await.len(), 60);
    kubelet.quiet(Duration::from_millis(1500)).await;
    plugins.shutdown().await;
}

#[tokio::test]
async fn reregisters_when_only_kubelet_sock_is_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), false);
    kubelet.next(2).await;
    kubelet.stop().await;
    let mut kubelet = FakeKubelet::start(dir.path());
    let regs = kubelet.next(2).await;
    assert_eq!(
        names(&regs),
        [(COUNT, "gpushare-count.sock"), (MEM, "gpushare-mem.sock")]
    );
    plugins.shutdown().await;
}

#[tokio::test]
async fn withdrawing_core_removes_its_socket_and_advertising_registers_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    kubelet.next(3).await;
    let mut c = client(dir.path(), ResourceKind::Core).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().devices.len(), 400);

    plugins.set_core(false).await;
    assert!(!socket(dir.path(), ResourceKind::Core).exists());
    assert_eq!(
        plugins.running(),
        [ResourceKind::Memory, ResourceKind::Count]
    );
    // kubelet's open ListAndWatch ends, so it marks the resource's devices unhealthy.
    let end = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("stream ends");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");

    plugins.set_core(true).await;
    let regs = kubelet.next(1).await;
    assert_eq!(names(&regs), [(CORE, "gpushare-core.sock")]);
    plugins.shutdown().await;
}

#[tokio::test]
async fn shutdown_removes_our_sockets_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    kubelet.next(3).await;
    plugins.shutdown().await;
    for kind in ResourceKind::ALL {
        assert!(!socket(dir.path(), kind).exists(), "{kind}");
    }
    assert!(dir.path().join(KUBELET_SOCKET).exists());
    assert!(plugins.running().is_empty());
}

// ---------------------------------------------------------------------------------------
// The DevicePlugin service, dialled as kubelet dials it.

#[tokio::test]
async fn list_and_watch_advertises_stable_healthy_devices() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    kubelet.next(3).await;

    let mem = first_list(dir.path(), ResourceKind::Memory).await;
    let core = first_list(dir.path(), ResourceKind::Core).await;
    let count = first_list(dir.path(), ResourceKind::Count).await;
    assert_eq!((mem.len(), core.len(), count.len()), (60, 400, 4));
    for d in mem.iter().chain(&core).chain(&count) {
        assert_eq!(d.health, "Healthy", "{}", d.id);
        assert!(d.id.len() <= 63, "{}", d.id);
    }
    let ids = |v: &[api::Device]| v.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&mem)[..2], ["gpu-mem-0-0", "gpu-mem-0-1"]);
    assert_eq!(ids(&mem)[59], "gpu-mem-3-14");
    assert_eq!(ids(&core)[130], "gpu-core-1-30");
    assert_eq!(ids(&count), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    assert_eq!(
        ids(&mem).into_iter().collect::<HashSet<_>>().len(),
        60,
        "IDs are unique"
    );
    // Stable: a second connection (or a restarted agent) lists the same IDs.
    assert_eq!(
        ids(&first_list(dir.path(), ResourceKind::Memory).await),
        ids(&mem)
    );

    // The stream stays open and quiet while nothing changes.
    let mut c = client(dir.path(), ResourceKind::Count).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.message())
            .await
            .is_err(),
        "no second list without a change"
    );
    plugins.shutdown().await;
}

#[tokio::test]
async fn list_and_watch_resends_when_gpu_health_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), false);
    kubelet.next(2).await;
    let mut c = client(dir.path(), ResourceKind::Memory).await;
    let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap().devices;
    assert!(first.iter().all(|d| d.health == "Healthy"));

    plugins.set_unhealthy([2].into());
    let second = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a new list")
        .unwrap()
        .unwrap()
        .devices;
    let sick: Vec<&str> = second
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(sick.len(), 15);
    assert!(
        sick.iter().all(|id| id.starts_with("gpu-mem-2-")),
        "{sick:?}"
    );

    plugins.set_unhealthy([].into());
    let third = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a new list")
        .unwrap()
        .unwrap()
        .devices;
    assert_eq!(third, first);
    plugins.shutdown().await;
}

fn allocate_request(containers: &[Vec<String>]) -> AllocateRequest {
    AllocateRequest {
        container_requests: containers
            .iter()
            .map(|ids| ContainerAllocateRequest {
                devices_ids: ids.clone(),
            })
            .collect(),
    }
}

#[tokio::test]
async fn allocate_returns_the_grant_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), true);
    kubelet.next(3).await;

    let mut mem = client(dir.path(), ResourceKind::Memory).await;
    let resp = mem
        .allocate(allocate_request(&[vec![
            "gpu-mem-1-0".into(),
            "gpu-mem-1-1".into(),
        ]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 1);
    let c = &resp.container_responses[0];
    assert_eq!(
        c.annotations,
        [("gpushare.io/granted-mem".to_string(), "2".to_string())].into()
    );
    assert!(c.envs.is_empty() && c.devices.is_empty() && c.mounts.is_empty());
    assert!(c.cdi_devices.is_empty());

    let mut core = client(dir.path(), ResourceKind::Core).await;
    let ids: Vec<String> = (0..30).map(|n| format!("gpu-core-0-{n}")).collect();
    let resp = core
        .allocate(allocate_request(&[ids]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].annotations["gpushare.io/granted-core"],
        "30"
    );

    // Several containers: one response each, in request order.
    let resp = mem
        .allocate(allocate_request(&[
            vec!["gpu-mem-0-0".into()],
            (0..5).map(|n| format!("gpu-mem-2-{n}")).collect(),
            vec!["gpu-mem-3-7".into(), "gpu-mem-3-8".into()],
        ]))
        .await
        .unwrap()
        .into_inner();
    let grants: Vec<&str> = resp
        .container_responses
        .iter()
        .map(|c| c.annotations["gpushare.io/granted-mem"].as_str())
        .collect();
    assert_eq!(grants, ["1", "5", "2"]);

    let mut count = client(dir.path(), ResourceKind::Count).await;
    let resp = count
        .allocate(allocate_request(&[vec!["gpu-3".into()]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].annotations["gpushare.io/granted-count"],
        "1"
    );
    plugins.shutdown().await;
}

#[tokio::test]
async fn allocate_refuses_devices_it_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), false);
    kubelet.next(2).await;
    let mut mem = client(dir.path(), ResourceKind::Memory).await;
    let err = mem
        .allocate(allocate_request(&[vec!["gpu-core-0-0".into()]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "aliyun.com/gpu-mem: container request 0 lists unknown device ID \"gpu-core-0-0\""
    );
    plugins.shutdown().await;
}

#[tokio::test]
async fn options_preferred_allocation_and_prestart_are_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let plugins = start_plugins(dir.path(), false);
    kubelet.next(2).await;
    let mut mem = client(dir.path(), ResourceKind::Memory).await;
    let o = mem
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(!o.pre_start_required && !o.get_preferred_allocation_available);
    let p = mem
        .get_preferred_allocation(api::PreferredAllocationRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(p.container_responses.is_empty());
    mem.pre_start_container(api::PreStartContainerRequest {
        devices_ids: vec!["gpu-mem-0-0".into()],
    })
    .await
    .unwrap();
    plugins.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// The node sync against a mock API server: one Node, list + watch + merge patch.

use gpushare::deviceplugin::nodesync::FIELD_MANAGER;
use kube::client::Body;
use tonic::codegen::http;

#[derive(Default)]
struct MockNode {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    rv: u64,
    patches: Vec<serde_json::Value>,
}

#[derive(Default)]
struct MockApi {
    node: Mutex<MockNode>,
    changed: Notify,
}

impl MockApi {
    fn node_json(n: &MockNode) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "resourceVersion": n.rv.to_string(),
                "labels": n.labels,
                "annotations": n.annotations,
            }
        })
    }

    fn update(&self, f: impl FnOnce(&mut MockNode)) {
        let mut n = self.node.lock().unwrap();
        f(&mut n);
        n.rv += 1;
        drop(n);
        self.changed.notify_waiters();
    }

    fn patches(&self) -> Vec<serde_json::Value> {
        self.node.lock().unwrap().patches.clone()
    }

    async fn handle(
        self: Arc<Self>,
        req: http::Request<Body>,
    ) -> Result<http::Response<Body>, Infallible> {
        let (parts, body) = req.into_parts();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let json = |status: u16, v: serde_json::Value| {
            Ok(http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&v).unwrap()))
                .unwrap())
        };
        match (parts.method.as_str(), parts.uri.path()) {
            ("GET", "/api/v1/nodes") if query.get("watch").map(String::as_str) == Some("true") => {
                let since: u64 = query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                loop {
                    let notified = self.changed.notified();
                    {
                        let n = self.node.lock().unwrap();
                        if n.rv > since {
                            let event = serde_json::json!({"type": "MODIFIED", "object": Self::node_json(&n)});
                            let mut line = serde_json::to_vec(&event).unwrap();
                            line.push(b'\n');
                            return Ok(http::Response::builder()
                                .status(200)
                                .header("content-type", "application/json")
                                .body(Body::from(line))
                                .unwrap());
                        }
                    }
                    notified.await;
                }
            }
            ("GET", "/api/v1/nodes") => {
                let n = self.node.lock().unwrap();
                json(
                    200,
                    serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "NodeList",
                        "metadata": {"resourceVersion": n.rv.to_string()},
                        "items": [Self::node_json(&n)],
                    }),
                )
            }
            ("PATCH", "/api/v1/nodes/n1") => {
                assert_eq!(
                    parts.headers["content-type"],
                    "application/merge-patch+json"
                );
                assert_eq!(query.get("fieldManager"), Some(&FIELD_MANAGER.to_string()));
                let bytes = body.collect_bytes().await.unwrap();
                let patch: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let mut node = serde_json::Value::Null;
                self.update(|n| {
                    if let Some(a) = patch["metadata"]["annotations"].as_object() {
                        for (k, v) in a {
                            n.annotations
                                .insert(k.clone(), v.as_str().unwrap().to_string());
                        }
                    }
                    n.patches.push(patch.clone());
                    node = Self::node_json(n);
                });
                json(200, node)
            }
            (m, p) => json(
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("mock API: no route for {m} {p}"), "reason": "NotFound", "code": 404}),
            ),
        }
    }
}

fn mock_client(api: Arc<MockApi>) -> kube::Client {
    let svc = tower::service_fn(move |req: http::Request<Body>| api.clone().handle(req));
    kube::Client::new(svc, "default")
}

fn published(api: &MockApi) -> Option<NodeGpus> {
    let n = api.node.lock().unwrap();
    n.annotations
        .get(NODE_GPUS_ANNOTATION)
        .map(|raw| NodeGpus::parse(raw).expect("published annotation parses"))
}

#[tokio::test]
async fn core_auto_follows_the_node_label_and_the_gpus_annotation_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let api = Arc::new(MockApi::default());
    api.update(|n| {
        n.labels
            .insert("ack.node.gpu.schedule".into(), "core_mem".into());
    });
    let cfg = DevicePluginConfig {
        enabled: true,
        dir: dir.path().to_path_buf(),
        core: CoreMode::Auto,
    };
    let agent = Agent::start(
        &cfg,
        Settings::new(dir.path()),
        &ResourceNames::default(),
        "n1",
        &inventory(),
        Some(KubeAccess::Client(mock_client(api.clone()))),
    );

    // core_mem: all three resources.
    let regs = kubelet.next(3).await;
    assert_eq!(regs[0].resource_name, CORE);
    // The inventory is on the node.
    wait_until("gpushare.io/gpus is published", || {
        published(&api).is_some()
    })
    .await;
    let want = NodeGpus::from_inventory(&inventory(), &[]);
    assert_eq!(published(&api).unwrap(), want);
    assert_eq!(want.gpus.len(), 4);

    // Relabelled to memory-only sharing: the core resource is withdrawn.
    api.update(|n| {
        n.labels
            .insert("ack.node.gpu.schedule".into(), "cgpu".into());
    });
    let core_sock = socket(dir.path(), ResourceKind::Core);
    wait_until("the core socket is removed", || !core_sock.exists()).await;
    assert!(!agent.plugins().is_running(ResourceKind::Core));
    assert!(socket(dir.path(), ResourceKind::Memory).exists());

    // And back: advertised again.
    api.update(|n| {
        n.labels
            .insert("ack.node.gpu.schedule".into(), "core_mem".into());
    });
    let regs = kubelet.next(1).await;
    assert_eq!(names(&regs), [(CORE, "gpushare-core.sock")]);

    // GPU health changes are published.
    agent.plugins().set_unhealthy([3].into());
    wait_until("GPU 3 is published unhealthy", || {
        published(&api).is_some_and(|g| !g.gpus[3].healthy)
    })
    .await;

    // Someone else overwrites the annotation: it is published again.
    let before = api.patches().len();
    api.update(|n| {
        n.annotations.insert(
            NODE_GPUS_ANNOTATION.into(),
            "{\"version\":1,\"gpus\":[]}".into(),
        );
    });
    wait_until("the annotation is restored", || {
        published(&api).is_some_and(|g| g.gpus.len() == 4)
    })
    .await;
    assert!(api.patches().len() > before);

    agent.shutdown().await;
    for kind in ResourceKind::ALL {
        assert!(!socket(dir.path(), kind).exists(), "{kind}");
    }
}

#[tokio::test]
async fn core_auto_on_an_unlabelled_node_advertises_memory_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let api = Arc::new(MockApi::default());
    api.update(|_| {});
    let agent = Agent::start(
        &DevicePluginConfig {
            enabled: true,
            dir: dir.path().to_path_buf(),
            core: CoreMode::Auto,
        },
        Settings::new(dir.path()),
        &ResourceNames::default(),
        "n1",
        &inventory(),
        Some(KubeAccess::Client(mock_client(api.clone()))),
    );
    let regs = kubelet.next(2).await;
    assert_eq!(
        names(&regs),
        [(COUNT, "gpushare-count.sock"), (MEM, "gpushare-mem.sock")]
    );
    wait_until("gpushare.io/gpus is published", || {
        published(&api).is_some()
    })
    .await;
    kubelet.quiet(Duration::from_millis(1500)).await;
    agent.shutdown().await;
}
