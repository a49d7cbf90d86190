//! What `gpushare runtime` (the wrapper) and `gpushare hook` share as clients of the agent's
//! local API: their configuration (`/etc/gpushare/runtime.toml`) and the decision on a
//! container being created — asked of the agent and written into the container's spec,
//! failing closed: without the agent a GPU container is refused, never run unchecked.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::api::{self, CallError, Request, Response};
use super::oci::{self, BundleSpec};
use crate::config::DEFAULT_RUNTIME_SOCKET;
use gpushare_core::adjust;

/// Where the configuration is read from, unless `GPUSHARE_RUNTIME_CONFIG` names another file
/// (a missing default file means the defaults).
pub const DEFAULT_CONFIG: &str = "/etc/gpushare/runtime.toml";

/// `/etc/gpushare/runtime.toml`, read by the wrapper and by the hooks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// The wrapper's real OCI runtime: a path, or a name looked up on `PATH`.
    pub runtime: PathBuf,
    /// The agent's `[runtime_api] socket`.
    pub socket: PathBuf,
    /// How long to wait for the agent's answer.
    pub timeout_ms: u64,
    /// As the agent's `passthrough_namespaces`: a container granted no GPU in one of these
    /// Kubernetes namespaces (the runtime's `io.kubernetes.*` annotation of its pod) keeps its
    /// image's NVIDIA_* environment.
    pub passthrough_namespaces: Vec<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            runtime: PathBuf::from("runc"),
            socket: PathBuf::from(DEFAULT_RUNTIME_SOCKET),
            timeout_ms: 10_000,
            passthrough_namespaces: Vec::new(),
        }
    }
}

impl ClientConfig {
    pub fn load() -> Result<ClientConfig, String> {
        let (path, required) = match std::env::var_os("GPUSHARE_RUNTIME_CONFIG") {
            Some(p) => (PathBuf::from(p), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let cfg: ClientConfig = toml::from_str(&text)
                    .map_err(|e| format!("invalid config {}: {e}", path.display()))?;
                cfg.validate()
                    .map_err(|e| format!("invalid config {}: {e}", path.display()))?;
                Ok(cfg)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(ClientConfig::default())
            }
            Err(e) => Err(format!("cannot read config {}: {e}", path.display())),
        }
    }

    /// Every value is well formed (the agent's config rules).
    pub fn validate(&self) -> Result<(), String> {
        crate::config::check_passthrough_namespaces(&self.passthrough_namespaces)
            .map_err(|e| e.to_string())
    }

    /// One call to the agent.
    pub fn call(&self, req: &Request) -> Result<Response, CallError> {
        api::call(&self.socket, req, Duration::from_millis(self.timeout_ms))
    }
}

/// What became of a container being created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// The agent admitted it and has it on its books under the id given: the spec holds the
    /// adjustment, and whoever fails to create the container must `remove` it.
    Admitted,
    /// Not a GPU container; `neutralized`: its environment would have selected GPUs and the
    /// spec now says otherwise.
    NotGpu { neutralized: bool },
}

/// The decision on the container `id` whose spec `b` is, written into `b.json` (the caller
/// persists it). `Err`: the message to fail the creation with.
pub fn prepare(cfg: &ClientConfig, id: &str, b: &mut BundleSpec) -> Result<Prepared, String> {
    if b.is_sandbox() {
        return Ok(Prepared::NotGpu { neutralized: false });
    }
    if !oci::has_gpu_hint(b) {
        let env = b
            .spec
            .process()
            .as_ref()
            .and_then(|p| p.env().clone())
            .unwrap_or_default();
        return match adjust::neutralize_non_gpu(&env) {
            Some(_)
                if oci::pod_namespace(b)
                    .is_some_and(|ns| cfg.passthrough_namespaces.contains(&ns)) =>
            {
                Ok(Prepared::NotGpu { neutralized: false })
            }
            Some(adj) => {
                write(b, &adj)?;
                Ok(Prepared::NotGpu { neutralized: true })
            }
            None => Ok(Prepared::NotGpu { neutralized: false }),
        };
    }
    let req = Request::Create {
        id: id.to_string(),
        spec: b.json.clone(),
    };
    let resp = cfg.call(&req).map_err(|e| match e {
        // Fail closed: without the agent a GPU container gets no GPU and no quota.
        CallError::Unreachable { .. } | CallError::NoAnswer { .. } => {
            format!("gpushare: GPU containers are refused while {e}")
        }
    })?;
    if !resp.ok {
        return Err(resp.message);
    }
    let Some(adj) = &resp.adjustment else {
        return Ok(Prepared::NotGpu { neutralized: false });
    };
    if let Err(msg) = write(b, adj) {
        let _ = cfg.call(&Request::Remove { id: id.into() });
        return Err(msg);
    }
    Ok(Prepared::Admitted)
}

fn write(b: &mut BundleSpec, adj: &adjust::Adjustment) -> Result<(), String> {
    oci::apply(&mut b.json, adj).map_err(|e| format!("gpushare: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(annotations: serde_json::Value, env: &[&str]) -> BundleSpec {
        let json = json!({
            "ociVersion": "1.0.2",
            "process": {"cwd": "/", "user": {"uid": 0, "gid": 0}, "args": ["sh"], "env": env},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        });
        BundleSpec::parse("config.json".into(), &serde_json::to_vec(&json).unwrap()).unwrap()
    }

    fn nowhere() -> ClientConfig {
        ClientConfig {
            socket: PathBuf::from("/nonexistent/gpushare/runtime.sock"),
            ..ClientConfig::default()
        }
    }

    #[test]
    fn a_gpu_container_is_refused_without_the_agent() {
        let mut b = spec(json!({"gpushare.io/granted-mem": "2"}), &["PATH=/bin"]);
        let before = b.json.clone();
        let msg = prepare(&nowhere(), "c1", &mut b).unwrap_err();
        assert!(
            msg.starts_with(
                "gpushare: GPU containers are refused while the gpushare node agent is not \
                 reachable on /nonexistent/gpushare/runtime.sock"
            ),
            "{msg}"
        );
        assert_eq!(b.json, before, "nothing written");
    }

    #[test]
    fn other_containers_need_no_agent() {
        let mut b = spec(json!({}), &["PATH=/bin"]);
        let before = b.json.clone();
        assert_eq!(
            prepare(&nowhere(), "c2", &mut b),
            Ok(Prepared::NotGpu { neutralized: false })
        );
        assert_eq!(b.json, before);

        let mut b = spec(json!({}), &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]);
        assert_eq!(
            prepare(&nowhere(), "c3", &mut b),
            Ok(Prepared::NotGpu { neutralized: true })
        );
        assert_eq!(
            b.json["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"])
        );

        let mut b = spec(
            json!({"io.kubernetes.cri.container-type": "sandbox", "gpushare.io/assignment": "{}"}),
            &["NVIDIA_VISIBLE_DEVICES=all"],
        );
        assert_eq!(
            prepare(&nowhere(), "p1", &mut b),
            Ok(Prepared::NotGpu { neutralized: false }),
            "a pod's pause container is left alone"
        );
    }

    /// In a passthrough namespace a container granted no GPU keeps its image's environment;
    /// a GPU container there still needs the agent.
    #[test]
    fn a_passthrough_namespace_keeps_the_environment_of_containers_granted_no_gpu() {
        let cfg = ClientConfig {
            passthrough_namespaces: vec!["gpu-operator".into()],
            ..nowhere()
        };
        let env = [
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=all",
        ];
        let containerd = |ns: &str| json!({"io.kubernetes.cri.sandbox-id": "sb1", "io.kubernetes.cri.sandbox-namespace": ns});
        let mut b = spec(containerd("gpu-operator"), &env);
        let before = b.json.clone();
        assert_eq!(
            prepare(&cfg, "c1", &mut b),
            Ok(Prepared::NotGpu { neutralized: false })
        );
        assert_eq!(b.json, before);
        let crio = json!({"io.kubernetes.cri-o.SandboxID": "sb2", "io.kubernetes.pod.namespace": "gpu-operator"});
        assert_eq!(
            prepare(&cfg, "c2", &mut spec(crio, &env)),
            Ok(Prepared::NotGpu { neutralized: false })
        );
        // Elsewhere, without the runtime's own key, or with the other runtime's key naming
        // another namespace (a pod's annotation copied into the spec): neutralized.
        for ann in [
            containerd("default"),
            json!({"io.kubernetes.cri.sandbox-namespace": "gpu-operator"}),
            json!({"io.kubernetes.cri-o.SandboxID": "sb3", "io.kubernetes.pod.namespace": "default",
                   "io.kubernetes.cri.sandbox-namespace": "gpu-operator"}),
        ] {
            assert_eq!(
                prepare(&cfg, "c3", &mut spec(ann.clone(), &env)),
                Ok(Prepared::NotGpu { neutralized: true }),
                "{ann}"
            );
        }
        let mut b = spec(
            json!({"io.kubernetes.cri.sandbox-id": "sb1", "io.kubernetes.cri.sandbox-namespace": "gpu-operator",
                   "gpushare.io/granted-mem": "2"}),
            &env,
        );
        assert!(prepare(&cfg, "c3", &mut b).is_err(), "the agent decides");
        let bad = ClientConfig {
            passthrough_namespaces: vec!["GPU".into()],
            ..nowhere()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("\"GPU\" is not a namespace name")
        );
    }

    #[test]
    fn the_config_file() {
        let cfg: ClientConfig = toml::from_str("socket = \"/s\"\ntimeout_ms = 5").unwrap();
        assert_eq!(cfg.socket, PathBuf::from("/s"));
        assert_eq!(cfg.runtime, PathBuf::from("runc"));
        assert!(toml::from_str::<ClientConfig>("sockets = \"/s\"").is_err());
        let shipped: ClientConfig =
            toml::from_str(include_str!("../../install/runtime.toml")).unwrap();
        assert_eq!(
            shipped,
            ClientConfig::default(),
            "the example documents the defaults"
        );
    }
}
