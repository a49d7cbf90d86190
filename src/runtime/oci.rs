//! The OCI bundle side of the runtime-level modes: what a container's `config.json` says
//! (read with `oci-spec`), in the NRI form the node's decision takes, and the decision's
//! adjustment written back into the spec.
//!
//! The spec is edited as JSON, not re-serialized from `oci-spec`'s types: a field this
//! version of the crate does not know (a newer runtime's) must reach runc unchanged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;
use serde_json::{Map, Value, json};

use crate::nri::api::nri_api::{
    Container, ContainerState as NriState, LinuxContainer, LinuxDevice, PodSandbox,
};
use gpushare_core::adjust::Adjustment;
use gpushare_core::request::ASSIGNMENT_ANNOTATION;

/// The largest `config.json` read (a spec is a few KiB; annotations can add some).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Container annotations that carry kubelet's grant (`gpushare.io/granted-mem`, …).
pub const GRANT_PREFIX: &str = "gpushare.io/granted-";

/// The name `gpushare hook precreate` gives a container, which has no id yet at that stage:
/// the agent's books, its limiter files and the later hooks' calls are keyed on it.
pub const HANDLE_ANNOTATION: &str = "gpushare.io/handle";

/// The container name when the runtime gives none (podman without Kubernetes): the name the
/// assignment's single container carries by convention.
pub const DEFAULT_CONTAINER_NAME: &str = "main";

/// Annotations the runtimes put on a container's spec, per field, first found wins:
/// containerd's CRI (`io.kubernetes.cri.*`), CRI-O (`io.kubernetes.*`).
const POD_NAME: &[&str] = &["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
const POD_NAMESPACE: &[&str] = &[
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD_UID: &[&str] = &["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];
const POD_ID: &[&str] = &[
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri-o.SandboxID",
];
const CONTAINER_NAME: &[&str] = &[
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];
/// containerd: `sandbox` for a pod's pause container, `container` otherwise.
const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {MAX_SPEC_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not a valid OCI runtime spec: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A bundle's `config.json`: the typed view and the JSON it came from.
#[derive(Debug, Clone)]
pub struct BundleSpec {
    pub path: PathBuf,
    pub spec: Spec,
    pub json: Value,
}

impl BundleSpec {
    /// Reads `dir/config.json` (bounded, not following a symlink).
    pub fn load(dir: &Path) -> Result<BundleSpec, BundleError> {
        let path = dir.join("config.json");
        let bytes = read_bounded(&path)?;
        BundleSpec::parse(path, &bytes)
    }

    /// A spec from its bytes (`path` names it in errors).
    pub fn parse(path: PathBuf, bytes: &[u8]) -> Result<BundleSpec, BundleError> {
        let invalid = |reason: String| BundleError::Invalid {
            path: path.clone(),
            reason,
        };
        let json: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if !json.is_object() {
            return Err(invalid("not a JSON object".into()));
        }
        let spec: Spec =
            serde_json::from_value(json.clone()).map_err(|e| invalid(e.to_string()))?;
        Ok(BundleSpec { path, spec, json })
    }

    /// Writes the JSON back in place: a new file renamed over the old one, so runc never
    /// reads half of it.
    pub fn save(&self) -> Result<(), BundleError> {
        let write = |source| BundleError::Write {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("json.gpushare-tmp");
        let bytes = serde_json::to_vec(&self.json).expect("a JSON value serializes");
        std::fs::write(&tmp, bytes).map_err(write)?;
        std::fs::rename(&tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            write(e)
        })
    }

    pub fn annotations(&self) -> HashMap<String, String> {
        self.spec.annotations().clone().unwrap_or_default()
    }

    /// A pod's pause container (containerd marks it), never a GPU container.
    pub fn is_sandbox(&self) -> bool {
        self.annotations()
            .get(CONTAINER_TYPE)
            .is_some_and(|t| t == "sandbox")
    }
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, BundleError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read = |source| BundleError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(read)?;
    let mut bytes = Vec::new();
    f.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(BundleError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn first(ann: &HashMap<String, String>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| ann.get(*k).cloned())
}

/// The container in the form NRI gives it, for the node's decision. Only what the runtime
/// is configured to pass counts: the pod's `gpushare.io/assignment` as a pod annotation
/// (containerd `pod_annotations`), kubelet's `gpushare.io/granted-*` as container
/// annotations (`container_annotations`) — nothing else of the spec's annotations.
pub fn describe(id: &str, b: &BundleSpec, state: NriState, pid: u32) -> (PodSandbox, Container) {
    let ann = b.annotations();
    let pod_id = first(&ann, POD_ID).unwrap_or_else(|| id.to_string());
    let mut pod_annotations = HashMap::new();
    if let Some(a) = ann.get(ASSIGNMENT_ANNOTATION) {
        pod_annotations.insert(ASSIGNMENT_ANNOTATION.to_string(), a.clone());
    }
    let container_annotations: HashMap<String, String> = ann
        .iter()
        .filter(|(k, _)| k.starts_with(GRANT_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let pod = PodSandbox {
        id: pod_id.clone(),
        name: first(&ann, POD_NAME).unwrap_or_default(),
        namespace: first(&ann, POD_NAMESPACE).unwrap_or_default(),
        uid: first(&ann, POD_UID).unwrap_or_default(),
        annotations: pod_annotations,
        ..Default::default()
    };
    let linux = b.spec.linux().as_ref();
    let ctr = Container {
        id: id.to_string(),
        pod_sandbox_id: pod_id,
        name: first(&ann, CONTAINER_NAME).unwrap_or_else(|| DEFAULT_CONTAINER_NAME.into()),
        annotations: container_annotations,
        state: state.into(),
        pid,
        env: b
            .spec
            .process()
            .as_ref()
            .and_then(|p| p.env().clone())
            .unwrap_or_default(),
        linux: Some(LinuxContainer {
            cgroups_path: linux
                .and_then(|l| l.cgroups_path().as_ref())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            devices: linux
                .and_then(|l| l.devices().as_ref())
                .into_iter()
                .flatten()
                .map(|d| LinuxDevice {
                    path: d.path().to_string_lossy().into_owned(),
                    type_: "c".into(),
                    major: d.major(),
                    minor: d.minor(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    };
    (pod, ctr)
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("config.json: {field} is not {expected}")]
pub struct ApplyError {
    pub field: &'static str,
    pub expected: &'static str,
}

/// `json[key]` as an object, created when absent.
fn object<'a>(
    json: &'a mut Map<String, Value>,
    key: &str,
    field: &'static str,
) -> Result<&'a mut Map<String, Value>, ApplyError> {
    json.entry(key)
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or(ApplyError {
            field,
            expected: "an object",
        })
}

/// `json[key]` as an array, created when absent.
fn array<'a>(
    json: &'a mut Map<String, Value>,
    key: &str,
    field: &'static str,
) -> Result<&'a mut Vec<Value>, ApplyError> {
    json.entry(key)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or(ApplyError {
            field,
            expected: "an array",
        })
}

/// Writes `adj` into the spec: environment (set, and the cleared variables removed — an
/// OCI spec can remove what NRI cannot), device nodes with their device-cgroup rules, bind
/// mounts and the CPU set.
pub fn apply(json: &mut Value, adj: &Adjustment) -> Result<(), ApplyError> {
    let root = json.as_object_mut().ok_or(ApplyError {
        field: "the spec",
        expected: "an object",
    })?;
    {
        let process = object(root, "process", "process")?;
        let env = array(process, "env", "process.env")?;
        let drop: std::collections::HashSet<&str> = adj
            .env
            .iter()
            .map(|(k, _)| k.as_str())
            .chain(adj.clear_env.iter().map(String::as_str))
            .collect();
        env.retain(|v| {
            v.as_str()
                .is_none_or(|kv| !drop.contains(kv.split_once('=').map_or(kv, |(k, _)| k)))
        });
        env.extend(
            adj.env
                .iter()
                .map(|(k, v)| Value::String(format!("{k}={v}"))),
        );
    }
    {
        let linux = object(root, "linux", "linux")?;
        let devices = array(linux, "devices", "linux.devices")?;
        for d in &adj.devices {
            devices.retain(|v| v.get("path").and_then(Value::as_str) != Some(d.path.as_str()));
            devices.push(json!({
                "path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                "fileMode": d.file_mode, "uid": 0, "gid": 0,
            }));
        }
        let resources = object(linux, "resources", "linux.resources")?;
        let rules = array(resources, "devices", "linux.resources.devices")?;
        for d in &adj.devices {
            rules.push(json!({
                "allow": true, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm",
            }));
        }
        if let Some(cpus) = &adj.cpuset {
            let cpu = object(resources, "cpu", "linux.resources.cpu")?;
            cpu.insert("cpus".into(), Value::String(cpus.clone()));
        }
    }
    let mounts = array(root, "mounts", "mounts")?;
    for m in &adj.mounts {
        mounts.push(json!({
            "destination": m.destination, "type": "bind", "source": m.source,
            "options": ["rbind", if m.read_only { "ro" } else { "rw" }],
        }));
    }
    Ok(())
}

/// The precreate hook's handle on this container, if it has one.
pub fn handle(b: &BundleSpec) -> Option<String> {
    b.annotations().get(HANDLE_ANNOTATION).cloned()
}

/// The Kubernetes namespace of the container's pod, as the runtime annotates it: `None`
/// unless the runtime's own key (containerd's where its sandbox id is there, CRI-O's where
/// its is) names one, and where the spec carries both runtimes' keys (a pod's annotations
/// copied into it, say) unless they agree.
pub fn pod_namespace(b: &BundleSpec) -> Option<String> {
    let ann = b.annotations();
    let own = if ann.contains_key(POD_ID[0]) {
        POD_NAMESPACE[0]
    } else if ann.contains_key(POD_ID[1]) {
        POD_NAMESPACE[1]
    } else {
        return None;
    };
    let ns = ann.get(own)?;
    POD_NAMESPACE
        .iter()
        .filter_map(|k| ann.get(*k))
        .all(|other| other == ns)
        .then(|| ns.clone())
}

/// Whether the spec asks for a GPU at all (the decision is the agent's; a container without
/// either annotation is not a GPU container).
pub fn has_gpu_hint(b: &BundleSpec) -> bool {
    b.annotations()
        .keys()
        .any(|k| k == ASSIGNMENT_ANNOTATION || k.starts_with(GRANT_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_core::adjust::Mount;
    use gpushare_core::inventory::DeviceNode;

    fn spec(annotations: Value) -> BundleSpec {
        let json = json!({
            "ociVersion": "1.0.2",
            "process": {"cwd": "/", "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "KEEP=1"]},
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": {"cgroupsPath": "/k8s/c1", "resources": {"devices": [{"allow": false, "access": "rwm"}]}},
            "someFutureField": {"kept": true},
        });
        BundleSpec::parse("config.json".into(), &serde_json::to_vec(&json).unwrap()).unwrap()
    }

    #[test]
    fn describes_a_cri_container_with_only_what_counts() {
        let b = spec(json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "trainer",
            "io.kubernetes.cri.sandbox-id": "sb1",
            "io.kubernetes.cri.sandbox-name": "p",
            "io.kubernetes.cri.sandbox-namespace": "ns",
            "io.kubernetes.cri.sandbox-uid": "u1",
            "gpushare.io/assignment": "{}",
            "gpushare.io/granted-mem": "2",
            "example.com/other": "x",
        }));
        let (pod, ctr) = describe("c1", &b, NriState::CONTAINER_CREATED, 0);
        assert_eq!(
            (
                pod.id.as_str(),
                pod.name.as_str(),
                pod.namespace.as_str(),
                pod.uid.as_str()
            ),
            ("sb1", "p", "ns", "u1")
        );
        assert_eq!(pod.annotations.len(), 1);
        assert_eq!(ctr.name, "trainer");
        assert_eq!(ctr.pod_sandbox_id, "sb1");
        assert_eq!(ctr.annotations.len(), 1);
        assert_eq!(ctr.annotations["gpushare.io/granted-mem"], "2");
        assert_eq!(ctr.linux.cgroups_path, "/k8s/c1");
        assert_eq!(ctr.env.len(), 3);
        assert!(has_gpu_hint(&b));
        assert!(!b.is_sandbox());
        assert!(!has_gpu_hint(&spec(json!({"example.com/other": "x"}))));
    }

    #[test]
    fn applies_env_devices_mounts_and_keeps_unknown_fields() {
        let mut b = spec(json!({}));
        let adj = Adjustment {
            devices: vec![DeviceNode {
                path: "/dev/nvidia1".into(),
                major: 195,
                minor: 1,
                file_mode: 0o666,
            }],
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "GPU-1".into())],
            clear_env: vec!["KEEP".into()],
            cdi_devices: vec![],
            mounts: vec![Mount::ro("/host/lib.so", "/lib.so")],
            cpuset: Some("1".into()),
        };
        apply(&mut b.json, &adj).unwrap();
        assert_eq!(
            b.json["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-1"])
        );
        assert_eq!(b.json["linux"]["devices"][0]["path"], "/dev/nvidia1");
        assert_eq!(b.json["linux"]["devices"][0]["major"], 195);
        let rules = b.json["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 2, "the deny-all rule stays first");
        assert_eq!(rules[1]["minor"], 1);
        assert_eq!(rules[1]["allow"], true);
        assert_eq!(b.json["linux"]["resources"]["cpu"]["cpus"], "1");
        assert_eq!(b.json["mounts"][0]["options"], json!(["rbind", "ro"]));
        assert_eq!(b.json["someFutureField"], json!({"kept": true}));
        // Still a valid spec.
        BundleSpec::parse("x".into(), &serde_json::to_vec(&b.json).unwrap()).unwrap();
    }

    /// Unlike NRI, the spec is written here: every copy of an adjusted variable goes, and
    /// the adjustment's value is the only one left.
    #[test]
    fn every_copy_of_an_adjusted_variable_is_replaced() {
        let mut b = spec(json!({}));
        b.json["process"]["env"] = json!([
            "NVIDIA_VISIBLE_DEVICES=all",
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute"
        ]);
        let adj = Adjustment {
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "void".into())],
            clear_env: vec!["NVIDIA_DRIVER_CAPABILITIES".into()],
            ..Adjustment::default()
        };
        apply(&mut b.json, &adj).unwrap();
        assert_eq!(
            b.json["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"])
        );
    }

    #[test]
    fn bad_specs_are_named() {
        let e = BundleSpec::parse("/b/config.json".into(), b"[1]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/b/config.json is not a valid OCI runtime spec: not a JSON object"
        );
        let mut v = json!({"process": {"env": "PATH=/bin"}});
        assert_eq!(
            apply(&mut v, &Adjustment::default())
                .unwrap_err()
                .to_string(),
            "config.json: process.env is not an array"
        );
    }
}
