//! The plugin's whole NRI session over a real unix socket pair, with the test playing the
//! runtime through the same multiplexer and ttrpc stack: registration, configure, split
//! synchronize with messages far larger than one frame, create/remove, refusals, and the
//! StateChange form older runtimes use. (The real runtimes are exercised by `make e2e`.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpushare::node::{AgentState, Node};
use gpushare::nri::api::nri_api::*;
use gpushare::nri::plugin::{Registration, serve_connection};
use gpushare::nri::runtime_side::RuntimeSide;
use gpushare_core::request::ASSIGNMENT_ANNOTATION;
use tokio::net::UnixStream;

fn pod(id: &str, assignment: Option<String>) -> PodSandbox {
    let mut annotations = HashMap::new();
    if let Some(a) = assignment {
        annotations.insert(ASSIGNMENT_ANNOTATION.to_string(), a);
    }
    PodSandbox {
        id: id.into(),
        name: format!("pod-{id}"),
        uid: format!("uid-{id}"),
        namespace: "default".into(),
        annotations,
        ..Default::default()
    }
}

fn ctr(id: &str, pod: &str, granted_mem: Option<&str>, granted_core: Option<&str>) -> Container {
    let mut annotations = HashMap::new();
    if let Some(m) = granted_mem {
        annotations.insert("gpushare.io/granted-mem".to_string(), m.to_string());
    }
    if let Some(c) = granted_core {
        annotations.insert("gpushare.io/granted-core".to_string(), c.to_string());
    }
    Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: "main".into(),
        annotations,
        state: ContainerState::CONTAINER_RUNNING.into(),
        // As the agent adjusts a GPU container: with the device nodes (all four here).
        linux: Some(LinuxContainer {
            cgroups_path: format!("/k8s/{id}"),
            devices: (0..4)
                .map(|minor| LinuxDevice {
                    path: format!("/dev/nvidia{minor}"),
                    type_: "c".into(),
                    major: 195,
                    minor,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

/// A GPU container as the runtime creates it when no agent is there to adjust it.
fn unadjusted(id: &str, pod: &str, granted_mem: &str, granted_core: &str) -> Container {
    let mut c = ctr(id, pod, Some(granted_mem), Some(granted_core));
    c.linux.as_mut().unwrap().devices.clear();
    c
}

fn assignment(gpu: u32, mem: u64, core: u32) -> String {
    format!(
        r#"{{"version":1,"containers":{{"main":[{{"gpuIndex":{gpu},"memoryMiB":{mem},"corePercent":{core}}}]}}}}"#
    )
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64)
}

#[tokio::test]
async fn full_session_over_the_multiplexer() {
    let (plugin_end, runtime_end) = UnixStream::pair().unwrap();
    let node = Arc::new(Node::new(AgentState::in_memory("test-node")));
    let reg = Registration {
        name: "gpushare".into(),
        index: "10".into(),
    };
    let plugin_task = {
        let node = node.clone();
        tokio::spawn(async move { serve_connection(plugin_end, &reg, node).await })
    };

    // The runtime side: serve Runtime on connection 2, call Plugin on connection 1.
    let mut side = RuntimeSide::start(runtime_end).await.unwrap();
    let registered = tokio::time::timeout(Duration::from_secs(5), side.registrations.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            registered.plugin_name.as_str(),
            registered.plugin_idx.as_str()
        ),
        ("gpushare", "10")
    );

    let conf = side
        .plugin
        .configure(ctx(), &ConfigureRequest::default())
        .await
        .unwrap();
    // CreateContainer(4), PostCreateContainer(5), StartContainer(6), UpdateContainer(8),
    // StopContainer(10), RemoveContainer(11): bits 3, 4, 5, 7, 9, 10.
    assert_eq!(
        conf.events,
        (1 << 3) | (1 << 4) | (1 << 5) | (1 << 7) | (1 << 9) | (1 << 10)
    );

    // Split synchronize; the first chunk carries ~2 MiB of annotations (hundreds of frames).
    let mut big = pod("p1", Some(assignment(1, 2048, 30)));
    big.annotations
        .insert("example.com/bulk".into(), "x".repeat(2 << 20));
    let chunk1 = SynchronizeRequest {
        pods: vec![big, pod("p2", Some(assignment(2, 4096, 50)))],
        containers: vec![ctr("c1", "p1", Some("2"), Some("30"))],
        more: true,
        ..Default::default()
    };
    let r = side.plugin.synchronize(ctx(), &chunk1).await.unwrap();
    assert!(r.more, "chunk answers echo more");
    assert!(
        node.registry.snapshot().is_empty(),
        "registry waits for the last chunk"
    );
    let chunk2 = SynchronizeRequest {
        pods: vec![pod("p2", Some(assignment(2, 4096, 50)))],
        containers: vec![ctr("c2", "p2", Some("4"), Some("50"))],
        more: false,
        ..Default::default()
    };
    let r = side.plugin.synchronize(ctx(), &chunk2).await.unwrap();
    assert!(!r.more);
    let ids: Vec<String> = node.registry.snapshot().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["c1", "c2"]);

    // A GPU container gets its GPU only.
    let p3 = pod("p3", Some(assignment(1, 3072, 40)));
    let resp = side
        .plugin
        .create_container(
            ctx(),
            &CreateContainerRequest {
                pod: Some(p3.clone()).into(),
                container: Some(ctr("c3", "p3", Some("3"), Some("40"))).into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let devices: Vec<String> = resp
        .adjust
        .linux
        .devices
        .iter()
        .map(|d| d.path.clone())
        .collect();
    assert_eq!(
        devices,
        [
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
    let env: HashMap<String, String> = resp
        .adjust
        .env
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    assert_eq!(env["GPUSHARE_GPU_CORE_PERCENT"], "40");
    assert_eq!(env["GPUSHARE_GPU_MEMORY_MIB"], "3072");
    assert_eq!(node.registry.committed(1, "").core_percent, 70);

    // Over-commit of GPU 1's compute (30 + 40 held, 40 more asked) is refused, by name.
    let err = side
        .plugin
        .create_container(
            ctx(),
            &CreateContainerRequest {
                pod: Some(pod("p4", Some(assignment(1, 1024, 40)))).into(),
                container: Some(ctr("c4", "p4", Some("1"), Some("40"))).into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("GPU 1 compute would be over-committed: 70% held by 2 container(s)"),
        "{err}"
    );

    // A container without GPU requests is passed through untouched.
    let resp = side
        .plugin
        .create_container(
            ctx(),
            &CreateContainerRequest {
                pod: Some(pod("p5", None)).into(),
                container: Some(ctr("c5", "p5", None, None)).into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(resp.adjust.into_option(), None);

    // Removal through the StateChange form (NRI v0.8 runtimes) and the per-event RPC.
    side.plugin
        .state_change(
            ctx(),
            &StateChangeEvent {
                event: Event::REMOVE_CONTAINER.into(),
                pod: Some(p3).into(),
                container: Some(ctr("c3", "p3", None, None)).into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    side.plugin
        .remove_container(
            ctx(),
            &RemoveContainerRequest {
                pod: Some(pod("p1", None)).into(),
                container: Some(ctr("c1", "p1", None, None)).into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let ids: Vec<String> = node.registry.snapshot().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["c2"]);

    // The runtime goes away: the plugin's session ends with the reason.
    side.close().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), plugin_task)
        .await
        .expect("session ends when the runtime closes")
        .unwrap()
        .unwrap();
    assert!(!reason.is_empty());
}

/// Fail closed: with quotas configured, a GPU container is refused (Internal, with the reason)
/// until the throttling controller runs; a container without a GPU is not affected.
#[test]
fn gpu_containers_are_refused_while_quotas_cannot_be_enforced() {
    use gpushare::nri::service::Handler;
    let mut state = AgentState::in_memory("test-node");
    state.enforce_quotas = true;
    let node = Node::new(state);
    let gpu_pod = pod("p1", Some(assignment(1, 2048, 30)));
    let gpu_ctr = ctr("c1", "p1", Some("2"), Some("30"));

    let e = node.create_container(&gpu_pod, &gpu_ctr).unwrap_err();
    assert_eq!(e.code, ttrpc::Code::INTERNAL);
    assert_eq!(
        e.message,
        "gpushare: GPU containers are refused on this node until its quotas can be enforced: the throttling controller has not started"
    );
    assert!(node.registry.snapshot().is_empty(), "nothing registered");

    node.enforcement_failed("the throttling controller cannot start: no freezer");
    let e = node.create_container(&gpu_pod, &gpu_ctr).unwrap_err();
    assert!(e.message.ends_with(": no freezer"), "{}", e.message);

    let plain = node
        .create_container(&pod("p2", None), &ctr("c2", "p2", None, None))
        .unwrap();
    assert!(plain.is_none(), "a container without a GPU passes through");
}

#[test]
fn a_running_container_that_cannot_be_accounted_keeps_new_ones_out() {
    use gpushare::nri::service::Handler;
    let node = Node::new(AgentState::in_memory("test-node"));
    // At a resync, one running GPU container is fine and one names a GPU this node does
    // not have (a config change since it was created): it stays on the books.
    let good = pod("p1", Some(assignment(1, 2048, 30)));
    let bad = pod("p2", Some(assignment(9, 2048, 30)));
    let sync = SynchronizeRequest {
        pods: vec![good.clone(), bad.clone()],
        containers: vec![
            ctr("c1", "p1", Some("2"), Some("30")),
            ctr("c2", "p2", Some("2"), Some("30")),
        ],
        ..Default::default()
    };
    node.synchronize(&sync).unwrap();
    assert_eq!(node.registry.snapshot().len(), 1);
    assert_eq!(node.unaccounted.lock().unwrap().len(), 1);
    let e = node
        .create_container(
            &pod("p3", Some(assignment(0, 1024, 10))),
            &ctr("c3", "p3", Some("1"), Some("10")),
        )
        .unwrap_err();
    assert_eq!(e.code, ttrpc::Code::INVALID_ARGUMENT);
    assert!(
        e.message.starts_with(
            "gpushare: GPU containers are refused on this node while 1 running GPU container(s) cannot be accounted (container c2: "
        ),
        "{}",
        e.message
    );
    assert_eq!(node.registry.snapshot().len(), 1, "nothing registered");
    // Containers without a GPU are not affected.
    assert!(
        node.create_container(&pod("p4", None), &ctr("c4", "p4", None, None))
            .unwrap()
            .is_none()
    );
    // Once it is gone, GPU containers are admitted again.
    node.remove_container(&bad, &ctr("c2", "p2", Some("2"), Some("30")));
    assert!(node.unaccounted.lock().unwrap().is_empty());
    node.create_container(
        &pod("p3", Some(assignment(0, 1024, 10))),
        &ctr("c3", "p3", Some("1"), Some("10")),
    )
    .unwrap()
    .expect("admitted");
}

#[test]
fn every_gpu_is_advertised_unhealthy_while_quotas_cannot_be_enforced() {
    let mut state = AgentState::in_memory("test-node");
    state.enforce_quotas = true;
    let node = Node::new(state);
    let all = [0, 1, 2, 3];
    // No controller: kubelet must not admit GPU pods here.
    assert_eq!(
        node.advertised_unhealthy([2].into(), &all),
        [0, 1, 2, 3].into()
    );
    // Quotas not enforced on this node (throttle off): the GPUs' own health only.
    let node = Node::new(AgentState::in_memory("test-node"));
    assert_eq!(node.advertised_unhealthy([2].into(), &all), [2].into());
}

/// A GPU container created while the agent was gone (the runtime skips a plugin that is not
/// there, even mid-creation) has no device node and no limiter: at the resync it is killed,
/// so that it is created again through the agent; where it cannot be killed it is
/// unaccounted and keeps new GPU containers out.
#[test]
fn a_gpu_container_created_without_the_agent_is_killed_at_the_resync() {
    use gpushare::nri::service::Handler;
    use gpushare::throttle::controller::{ControllerLink, ThrottleStats};
    use gpushare::throttle::fixture;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    let p1 = pod("p1", Some(assignment(1, 2048, 30)));
    let sync = SynchronizeRequest {
        pods: vec![p1.clone()],
        containers: vec![unadjusted("c1", "p1", "2", "30")],
        ..Default::default()
    };
    let p2 = pod("p2", Some(assignment(1, 1024, 10)));
    let c2 = ctr("c2", "p2", Some("1"), Some("10"));

    // No controller on this node: it cannot be killed, so it is unaccounted.
    let node = Node::new(AgentState::in_memory("test-node"));
    node.synchronize(&sync).unwrap();
    assert_eq!(
        node.unaccounted.lock().unwrap()["c1"],
        "created without the agent's adjustment (no device node /dev/nvidia1) and cannot be killed: no throttling controller runs on this node, and no cgroup filesystem was found"
    );
    let e = node.create_container(&p2, &c2).unwrap_err();
    assert!(
        e.message
            .contains("cannot be accounted (container c1: created without the agent's adjustment"),
        "{}",
        e.message
    );

    // With one: every process of its cgroup gets SIGKILL, it is on the books as stopped, and
    // new GPU containers are admitted.
    let tmp = tempfile::tempdir().unwrap();
    let fs = fixture::fake_v1(tmp.path(), &["k8s/c1"]);
    let mut victim = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    fixture::put(
        &tmp.path().join("freezer/k8s/c1/cgroup.procs"),
        &format!("{}\n", victim.id()),
    );
    let node = Node::new(AgentState::in_memory("test-node"));
    node.attach(
        Arc::new(ThrottleStats::default()),
        Arc::new(ControllerLink::new(fs)),
        Arc::new(AtomicBool::new(true)),
    );
    node.synchronize(&sync).unwrap();
    let status = victim.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "killed: {status:?}");
    assert!(node.unaccounted.lock().unwrap().is_empty());
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 1);
    let rec = node.registry.get("c1").expect("on the books");
    assert_eq!(rec.state, gpushare::registry::ContainerState::Stopped);
    assert!(
        gpushare::status::metrics(&node)
            .contains("gpushare_killed_unadjusted_containers_total 1\n")
    );
    node.create_container(&p2, &c2).unwrap().expect("admitted");

    // A container the agent adjusted is left alone.
    let node = Node::new(AgentState::in_memory("test-node"));
    node.synchronize(&SynchronizeRequest {
        pods: vec![p1],
        containers: vec![ctr("c1", "p1", Some("2"), Some("30"))],
        ..Default::default()
    })
    .unwrap();
    assert!(node.unaccounted.lock().unwrap().is_empty());
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 0);
}

/// A container granted no GPU whose image selects every GPU (`NVIDIA_VISIBLE_DEVICES=all`).
fn cuda_image_ctr(id: &str, pod: &str, env: &[&str]) -> Container {
    let mut c = ctr(id, pod, None, None);
    c.linux.as_mut().unwrap().devices.clear();
    c.env = env.iter().map(|s| s.to_string()).collect();
    c
}

fn in_namespace(mut p: PodSandbox, namespace: &str) -> PodSandbox {
    p.namespace = namespace.into();
    p
}

/// In a `passthrough_namespaces` namespace (the DCGM exporter's, say) a container granted no
/// GPU keeps the NVIDIA_* environment its image has, repeated or not; everywhere else it gets
/// `NVIDIA_VISIBLE_DEVICES=void`; a GPU container there is adjusted as anywhere.
#[test]
fn a_container_granted_no_gpu_keeps_its_gpu_environment_only_in_a_passthrough_namespace() {
    use gpushare::nri::service::Handler;
    use std::sync::atomic::Ordering;

    let mut state = AgentState::in_memory("test-node");
    state.passthrough_namespaces = ["gpu-operator".to_string()].into();
    let node = Node::new(state);
    let all = [
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=all",
    ];
    let exempt = in_namespace(pod("p1", None), "gpu-operator");
    assert!(
        node.create_container(&exempt, &cuda_image_ctr("c1", "p1", &all))
            .unwrap()
            .is_none(),
        "left as created"
    );
    let twice = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"];
    assert!(
        node.create_container(&exempt, &cuda_image_ctr("c2", "p1", &twice))
            .unwrap()
            .is_none(),
        "a repeated variable is not refused where nothing is adjusted"
    );
    assert_eq!(node.stats.creates_exempt.load(Ordering::Relaxed), 2);
    assert!(
        gpushare::status::metrics(&node)
            .contains("gpushare_create_container_total{result=\"exempt\"} 2\n")
    );

    let adj = node
        .create_container(&pod("p2", None), &cuda_image_ctr("c3", "p2", &all))
        .unwrap()
        .expect("neutralized outside the namespace");
    let env: HashMap<String, String> = adj
        .env
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "void");
    assert_eq!(env["NVIDIA_DRIVER_CAPABILITIES"], "");
    let e = node
        .create_container(&pod("p2", None), &cuda_image_ctr("c4", "p2", &twice))
        .unwrap_err();
    assert!(
        e.message.contains("sets NVIDIA_VISIBLE_DEVICES 2 times"),
        "{}",
        e.message
    );

    let gpu_pod = in_namespace(pod("p3", Some(assignment(2, 1024, 10))), "gpu-operator");
    let mut gpu = ctr("c5", "p3", Some("1"), Some("10"));
    gpu.env = all.iter().map(|s| s.to_string()).collect();
    let adj = node
        .create_container(&gpu_pod, &gpu)
        .unwrap()
        .expect("a GPU container is adjusted in any namespace");
    let visible = adj.env.iter().find(|kv| kv.key == "NVIDIA_VISIBLE_DEVICES");
    assert_ne!(
        visible.map(|kv| kv.value.as_str()),
        Some("all"),
        "{visible:?}"
    );
    assert!(adj.linux.as_ref().is_some_and(|l| !l.devices.is_empty()));
    assert_eq!(node.stats.creates_exempt.load(Ordering::Relaxed), 2);
}

/// A container granted no GPU, created while the agent was gone with its image's
/// `NVIDIA_VISIBLE_DEVICES=all` (a runtime that reads it gives it every GPU): killed at the
/// resync, every process of its cgroup tree (one in a cgroup it made itself), so that it is
/// created again through the agent; one not started yet (no task before its start, on
/// containerd) at its start. Killed too: a sidecar of a GPU pod in a passthrough namespace,
/// which its creation would have neutralized. Left alone: one the agent neutralized, one with
/// no GPU environment, one in a passthrough namespace, a stopped one. Where it cannot be
/// killed (neither a controller nor a cgroup filesystem) it is unaccounted and keeps new GPU
/// containers out; without a controller the node's cgroup filesystem kills it.
#[test]
fn a_container_granted_no_gpu_created_with_every_gpu_without_the_agent_is_killed_at_the_resync() {
    use gpushare::nri::service::Handler;
    use gpushare::throttle::fixture;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::Ordering;

    let all = ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.4.1"];
    let mut stopped = cuda_image_ctr("n4", "p1", &all);
    stopped.state = ContainerState::CONTAINER_STOPPED.into();
    let mut created = cuda_image_ctr("n6", "p1", &all);
    created.state = ContainerState::CONTAINER_CREATED.into();
    let mut sidecar = cuda_image_ctr("n7", "p3", &all);
    sidecar.name = "side".into();
    let gpu_pod = in_namespace(pod("p3", Some(assignment(2, 1024, 10))), "gpu-operator");
    let sync = SynchronizeRequest {
        pods: vec![
            pod("p1", None),
            in_namespace(pod("p2", None), "gpu-operator"),
            gpu_pod.clone(),
        ],
        containers: vec![
            cuda_image_ctr("n1", "p1", &all),
            cuda_image_ctr(
                "n2",
                "p1",
                &["NVIDIA_VISIBLE_DEVICES=void", "CUDA_VERSION=12.4.1"],
            ),
            cuda_image_ctr("n3", "p2", &all),
            stopped,
            cuda_image_ctr("n5", "p1", &["PATH=/bin"]),
            created.clone(),
            sidecar,
        ],
        ..Default::default()
    };
    let state = || {
        let mut s = AgentState::in_memory("test-node");
        s.passthrough_namespaces = ["gpu-operator".to_string()].into();
        s
    };

    // No controller on this node: they cannot be killed, so they are unaccounted.
    let node = Node::new(state());
    node.synchronize(&sync).unwrap();
    let unaccounted = node.unaccounted.lock().unwrap().clone();
    assert_eq!(
        unaccounted.keys().collect::<Vec<_>>(),
        ["n1", "n7"],
        "{unaccounted:?}"
    );
    assert_eq!(
        unaccounted["n1"],
        "created without the agent's adjustment (granted no GPU, its NVIDIA_VISIBLE_DEVICES \"all\" and not void) and cannot be killed: no throttling controller runs on this node, and no cgroup filesystem was found"
    );
    let e = node
        .create_container(
            &pod("p9", Some(assignment(1, 1024, 10))),
            &ctr("c9", "p9", Some("1"), Some("10")),
        )
        .unwrap_err();
    assert!(
        e.message.contains("container n1: created without"),
        "{}",
        e.message
    );

    // Without a controller but with the node's cgroup filesystem (`--no-throttle`): n1's
    // and n7's processes get SIGKILL (n1's in a cgroup below its own); n6's at its start;
    // the others' keep running.
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = [
        ("n1", "k8s/n1/inner"),
        ("n2", "k8s/n2"),
        ("n3", "k8s/n3"),
        ("n4", "k8s/n4"),
        ("n5", "k8s/n5"),
        ("n6", "k8s/n6"),
        ("n7", "k8s/n7"),
    ];
    let mut rels: Vec<&str> = cgroups.iter().map(|(_, rel)| *rel).collect();
    rels.push("k8s/n1");
    let fs = fixture::fake_v1(tmp.path(), &rels);
    let mut procs: HashMap<&str, std::process::Child> = cgroups
        .iter()
        .map(|(id, rel)| {
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap();
            fixture::put(
                &tmp.path().join(format!("freezer/{rel}/cgroup.procs")),
                &format!("{}\n", child.id()),
            );
            (*id, child)
        })
        .collect();
    let mut with_fs = state();
    with_fs.cgroups = Some(fs);
    let node = Node::new(with_fs);
    node.synchronize(&sync).unwrap();
    for id in ["n1", "n7"] {
        let status = procs.get_mut(id).unwrap().wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{id} killed: {status:?}");
    }
    for id in ["n2", "n3", "n4", "n5", "n6"] {
        let p = procs.get_mut(id).unwrap();
        assert!(p.try_wait().unwrap().is_none(), "{id} left running");
    }
    assert!(node.unaccounted.lock().unwrap().is_empty());
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 2);
    assert!(
        node.registry.get("n1").is_none(),
        "no GPU: not on the books"
    );

    node.start_container(&pod("p1", None), &created);
    let status = procs.get_mut("n6").unwrap().wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "n6 killed at its start: {status:?}"
    );
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 3);
    for id in ["n2", "n3", "n4", "n5"] {
        let p = procs.get_mut(id).unwrap();
        assert!(p.try_wait().unwrap().is_none(), "{id} left running");
        p.kill().unwrap();
        p.wait().unwrap();
    }
}

/// A GPU container found at the resync without its device nodes before it started (on
/// containerd it has no task, so nothing to kill yet) is killed at its start, and is on the
/// books as stopped, not running.
#[test]
fn a_gpu_container_created_without_the_agent_and_not_started_is_killed_at_its_start() {
    use gpushare::nri::service::Handler;
    use gpushare::throttle::controller::{ControllerLink, ThrottleStats};
    use gpushare::throttle::fixture;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::{AtomicBool, Ordering};

    let p1 = pod("p1", Some(assignment(1, 2048, 30)));
    let mut c1 = unadjusted("c1", "p1", "2", "30");
    c1.state = ContainerState::CONTAINER_CREATED.into();
    let tmp = tempfile::tempdir().unwrap();
    let fs = fixture::fake_v1(tmp.path(), &["k8s/c1"]);
    let node = Node::new(AgentState::in_memory("test-node"));
    node.attach(
        Arc::new(ThrottleStats::default()),
        Arc::new(ControllerLink::new(fs)),
        Arc::new(AtomicBool::new(true)),
    );
    node.synchronize(&SynchronizeRequest {
        pods: vec![p1.clone()],
        containers: vec![c1.clone()],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 0);
    assert_eq!(
        node.registry.get("c1").unwrap().state,
        gpushare::registry::ContainerState::Created
    );
    // `runc create` made its cgroup and first process: now it has something to kill.
    let mut init = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    fixture::put(
        &tmp.path().join("freezer/k8s/c1/cgroup.procs"),
        &format!("{}\n", init.id()),
    );
    node.start_container(&p1, &c1);
    let status = init.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "killed at its start: {status:?}");
    assert_eq!(node.stats.killed_unadjusted.load(Ordering::Relaxed), 1);
    assert_eq!(
        node.registry.get("c1").unwrap().state,
        gpushare::registry::ContainerState::Stopped
    );
}
