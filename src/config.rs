//! Node agent configuration: a TOML file (or the `config` string the runtime passes to a
//! pre-installed plugin in `Configure`), overridden by command-line flags.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::deviceplugin::DevicePluginConfig;
use crate::throttle::controller::ThrottleConfig;
use gpushare_core::inventory::SimConfig;
use gpushare_core::request::ResourceNames;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    /// GPUs from NVML (the driver's libnvidia-ml.so.1).
    Nvml,
    /// Simulated GPUs described by `[sim]`.
    Sim,
}

/// How quotas are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// The cgroup-aware throttling controller (any NVIDIA node).
    #[default]
    Throttle,
    /// NVIDIA MPS: the driver enforces the thread percentage and pinned memory limit; one
    /// MPS control daemon per GPU, its pipe directory under `mps_pipe_root/<index>`.
    Mps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// Log file; stderr when unset. A pre-installed plugin's stderr goes nowhere, so set it.
    pub file: Option<PathBuf>,
    /// `tracing` filter, e.g. `info` or `gpushare=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            file: None,
            level: "info".into(),
        }
    }
}

/// Default dev root of simulated GPUs: never `/dev`, so a simulation cannot touch real nodes.
pub const SIM_DEV_ROOT: &str = "/run/gpushare/sim-dev";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Node name (for simulated UUIDs and logs); the host name when empty.
    pub node_name: String,
    /// NRI plugin name, `[a-zA-Z0-9_.+-]+`.
    pub plugin_name: String,
    /// NRI plugin index, exactly two digits.
    pub plugin_index: String,
    /// Runtime's NRI socket (external plugin mode).
    pub nri_socket: PathBuf,
    /// Connect to the runtime over NRI. `false` for runtimes without NRI, which reach the
    /// agent through `gpushare runtime` / `gpushare hook` and `[runtime_api]` only.
    pub nri: bool,
    /// How long a GPU container admitted over NRI may go without the runtime confirming it
    /// (NRI PostCreateContainer, StartContainer, StopContainer or RemoveContainer) before the
    /// agent looks for its cgroup, releasing it if there is none: CRI-O sends nothing when
    /// the OCI runtime's `create` fails after NRI admitted the container.
    pub nri_confirm_grace_ms: u64,
    pub gpu_backend: GpuBackend,
    /// Where the GPU device nodes are; `/dev` for NVML, [`SIM_DEV_ROOT`] for `sim`.
    pub dev_root: Option<PathBuf>,
    /// proc filesystem (for `/proc/devices`).
    pub proc_root: PathBuf,
    /// The NVML library (gpu_backend nvml): a file name for the dynamic loader, or a path.
    pub nvml_library: PathBuf,
    /// Also request NVIDIA's CDI devices.
    pub cdi: bool,
    pub enforcement: Enforcement,
    /// enforcement mps: one pipe directory per GPU index below this.
    pub mps_pipe_root: PathBuf,
    /// Refuse assigned containers that kubelet granted nothing (see `RequestRules`).
    pub require_grant: bool,
    /// Namespaces whose containers granted no GPU are left as they were created: their
    /// image's `NVIDIA_VISIBLE_DEVICES` (every GPU, say) is kept, not set to `void`, and a
    /// resync does not kill one created while no agent ran. For the GPU software that needs
    /// whole GPUs outside any quota (the NVIDIA device plugin, DCGM exporter, the GPU
    /// Operator's validators): list only namespaces where only administrators create pods.
    /// Empty by default: no container gets a GPU without a grant.
    pub passthrough_namespaces: Vec<String>,
    /// The agent's CPU niceness, set at start for all its threads (-20..19; `0` leaves it as
    /// started). It answers every container creation within the runtime's NRI timeout (2 s:
    /// containerd drops a plugin that misses it) and times every freeze of the containers it
    /// throttles, so it must not be starved by the containers it holds.
    pub nice: i32,
    /// `host:port` of the status endpoint (`/healthz`, `/metrics`); off when unset.
    pub status_listen: Option<String>,
    /// The status socket: `/healthz`, `/metrics`, `/registry` and `/inventory` for root only
    /// (mode 0600, callers' credentials checked); empty: off.
    pub status_socket: PathBuf,
    pub log: LogConfig,
    pub resources: ResourceNames,
    pub sim: SimConfig,
    pub limiter: LimiterConfig,
    pub throttle: ThrottleConfig,
    /// The kubelet device plugin (off by default).
    pub device_plugin: DevicePluginConfig,
    pub kubernetes: KubernetesConfig,
    /// The local API of the runtime-level modes (off by default).
    pub runtime_api: RuntimeApiConfig,
}

/// `[runtime_api]`: the local socket `gpushare runtime` (an OCI runtime wrapper) and
/// `gpushare hook` (OCI hooks) reach the agent on, for runtimes without NRI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeApiConfig {
    pub enabled: bool,
    /// A unix socket, mode 0600 (root only; callers' credentials are checked too).
    pub socket: PathBuf,
    /// runc state roots (`runc --root`) to rebuild the registry from at start, since there is
    /// no NRI Synchronize: containerd 1.6's is `/run/containerd/runc/k8s.io`.
    pub runc_roots: Vec<PathBuf>,
    /// The runc binary used to list those containers.
    pub runc: PathBuf,
    /// How long a container `gpushare hook precreate` got admitted may go without starting
    /// before the agent looks for it under `runc_roots`, releasing it if runc does not have
    /// it (its creation failed after the hook, and podman runs no poststop hook then).
    pub hook_grace_ms: u64,
}

impl Default for RuntimeApiConfig {
    fn default() -> Self {
        RuntimeApiConfig {
            enabled: false,
            socket: PathBuf::from(DEFAULT_RUNTIME_SOCKET),
            runc_roots: Vec::new(),
            runc: PathBuf::from("runc"),
            hook_grace_ms: 60_000,
        }
    }
}

/// Where the agent serves the runtime-level modes by default.
pub const DEFAULT_RUNTIME_SOCKET: &str = "/run/gpushare/runtime.sock";
/// Where the status socket is by default (`status_socket`).
pub const DEFAULT_STATUS_SOCKET: &str = "/run/gpushare/status.sock";

/// `[limiter]`: the in-container limiter (the GPU's memory seen as the quota, allocations over
/// it refused), injected into every GPU container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimiterConfig {
    /// Inject it. `false` opts the node out: containers then see the whole GPU's memory and
    /// only the controller's memory action holds them.
    pub enabled: bool,
    /// The shipped `libgpushare_limiter.so` on this host.
    pub library: PathBuf,
    /// `gpu_backend = "sim"` only: a directory with stand-in `libcuda.so.1` and
    /// `libnvidia-ml.so.1`, mounted into GPU containers the way the NVIDIA container toolkit
    /// mounts the real driver libraries (unset: none).
    pub driver_dir: Option<PathBuf>,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            enabled: true,
            library: PathBuf::from(gpushare_core::limiter::LIBRARY_PATH),
            driver_dir: None,
        }
    }
}

/// `[kubernetes]`: how the node agent reaches the API server (node annotation, node labels).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// kubeconfig file; unset: `$KUBECONFIG`, else `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<PathBuf>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_name: String::new(),
            plugin_name: "gpushare".into(),
            plugin_index: "10".into(),
            nri_socket: PathBuf::from("/var/run/nri/nri.sock"),
            nri: true,
            nri_confirm_grace_ms: 60_000,
            gpu_backend: GpuBackend::Nvml,
            dev_root: None,
            proc_root: PathBuf::from("/proc"),
            nvml_library: PathBuf::from("libnvidia-ml.so.1"),
            cdi: false,
            enforcement: Enforcement::Throttle,
            mps_pipe_root: PathBuf::from("/run/gpushare/mps"),
            require_grant: true,
            passthrough_namespaces: Vec::new(),
            nice: -10,
            status_listen: None,
            status_socket: PathBuf::from(DEFAULT_STATUS_SOCKET),
            log: LogConfig::default(),
            resources: ResourceNames::default(),
            sim: SimConfig::default(),
            limiter: LimiterConfig::default(),
            throttle: ThrottleConfig::default(),
            device_plugin: DevicePluginConfig::default(),
            kubernetes: KubernetesConfig::default(),
            runtime_api: RuntimeApiConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config{origin}: {reason}")]
    Parse { origin: String, reason: String },
    #[error(
        "nri = false and [runtime_api] enabled = false: the agent would hear of no container (enable one)"
    )]
    NoRuntimeLink,
    #[error(
        "[runtime_api] runc_roots rebuild the registry where there is no NRI; with nri = true the runtime's Synchronize does (set nri = false, or remove runc_roots)"
    )]
    RuncRootsWithNri,
    #[error(
        "nri = false and [runtime_api] runc_roots is empty: without NRI the registry is rebuilt from runc's state at start, so a restarted agent would forget the running GPU containers (unthrottled, uncounted); set runc_roots (--runc-root): containerd 1.6 /run/containerd/runc/k8s.io, podman as root /run/runc"
    )]
    NoRuncRoots,
    #[error("plugin_name {0:?} must match [a-zA-Z0-9_.+-]+")]
    PluginName(String),
    #[error("plugin_index {0:?} must be exactly two digits")]
    PluginIndex(String),
    #[error(
        "dev_root {0:?} cannot be /dev with gpu_backend sim (it would create device nodes on the host)"
    )]
    SimOnHostDev(PathBuf),
    #[error("status_socket {0:?} must be an absolute path (or empty: no status socket)")]
    StatusSocketRelative(PathBuf),
    #[error(
        "passthrough_namespaces: {0:?} is not a namespace name (a DNS-1123 label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit)"
    )]
    PassthroughNamespace(String),
}

/// Every name in a `passthrough_namespaces` list (the agent's, `runtime.toml`'s) is a
/// namespace name, a DNS-1123 label.
pub fn check_passthrough_namespaces(list: &[String]) -> Result<(), ConfigError> {
    match list
        .iter()
        .find(|ns| !crate::scheduler::server::is_dns_label(ns))
    {
        Some(ns) => Err(ConfigError::PassthroughNamespace(ns.clone())),
        None => Ok(()),
    }
}

impl NodeConfig {
    pub fn from_toml(text: &str, origin: &str) -> Result<NodeConfig, ConfigError> {
        let cfg: NodeConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: if origin.is_empty() {
                String::new()
            } else {
                format!(" {origin}")
            },
            reason: e.to_string(),
        })?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.plugin_name.is_empty()
            && self
                .plugin_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b));
        if !name_ok {
            return Err(ConfigError::PluginName(self.plugin_name.clone()));
        }
        if self.plugin_index.len() != 2 || !self.plugin_index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ConfigError::PluginIndex(self.plugin_index.clone()));
        }
        if self.gpu_backend == GpuBackend::Sim && self.dev_root() == Path::new("/dev") {
            return Err(ConfigError::SimOnHostDev(self.dev_root()));
        }
        if !self.status_socket.as_os_str().is_empty() && !self.status_socket.is_absolute() {
            return Err(ConfigError::StatusSocketRelative(
                self.status_socket.clone(),
            ));
        }
        check_passthrough_namespaces(&self.passthrough_namespaces)?;
        if !self.nri && !self.runtime_api.enabled {
            return Err(ConfigError::NoRuntimeLink);
        }
        if self.nri && !self.runtime_api.runc_roots.is_empty() {
            return Err(ConfigError::RuncRootsWithNri);
        }
        if !self.nri && self.runtime_api.runc_roots.is_empty() {
            return Err(ConfigError::NoRuncRoots);
        }
        Ok(())
    }

    /// The throttle section with the backend's defaults filled in (the memory backstop's
    /// context allowance: 768 MiB per process with NVML, 0 for simulated GPUs).
    pub fn throttle_config(&self) -> ThrottleConfig {
        let mut t = self.throttle.clone();
        t.context_allowance_mib
            .get_or_insert(match self.gpu_backend {
                GpuBackend::Nvml => 768,
                GpuBackend::Sim => 0,
            });
        t
    }

    /// Where simulated containers' declaration directories live.
    pub fn sim_dir(&self) -> PathBuf {
        self.throttle.state_dir.join("sim")
    }

    pub fn dev_root(&self) -> PathBuf {
        match (&self.dev_root, self.gpu_backend) {
            (Some(p), _) => p.clone(),
            (None, GpuBackend::Sim) => PathBuf::from(SIM_DEV_ROOT),
            (None, GpuBackend::Nvml) => PathBuf::from("/dev"),
        }
    }

    /// `node_name`, else `$NODE_NAME` (a DaemonSet sets it from `spec.nodeName`), else the host
    /// name.
    pub fn node_name(&self) -> String {
        if !self.node_name.is_empty() {
            return self.node_name.clone();
        }
        if let Ok(n) = std::env::var("NODE_NAME")
            && !n.is_empty()
        {
            return n;
        }
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "node".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_file_and_defaults() {
        let cfg = NodeConfig::from_toml(
            r#"
            plugin_index = "05"
            gpu_backend = "sim"
            status_listen = "127.0.0.1:9402"
            [log]
            format = "json"
            [resources]
            memory_unit = "MiB"
            [sim]
            count = 2
            memory_mib = 8192
            "#,
            "test",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.plugin_name, "gpushare");
        assert_eq!(cfg.sim.count, 2);
        assert_eq!(cfg.dev_root(), PathBuf::from(SIM_DEV_ROOT));
        assert_eq!(cfg.log.format, LogFormat::Json);
        assert_eq!(cfg.resources.memory, "aliyun.com/gpu-mem");
    }

    #[test]
    fn bad_values_are_named() {
        let e = NodeConfig::from_toml("plugin_idx = \"1\"", "f.toml").unwrap_err();
        assert!(e.to_string().contains("invalid config f.toml"), "{e}");
        assert!(e.to_string().contains("plugin_idx"), "{e}");
        let cfg = NodeConfig {
            plugin_index: "1".into(),
            ..Default::default()
        };
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "plugin_index \"1\" must be exactly two digits"
        );
        let cfg = NodeConfig {
            plugin_name: "gpu share".into(),
            ..Default::default()
        };
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("\"gpu share\"")
        );
        let cfg = NodeConfig {
            gpu_backend: GpuBackend::Sim,
            dev_root: Some("/dev".into()),
            ..Default::default()
        };
        assert!(cfg.validate().is_err());
        let cfg = NodeConfig {
            passthrough_namespaces: vec!["gpu-operator".into(), "Kube_System".into()],
            ..Default::default()
        };
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .starts_with("passthrough_namespaces: \"Kube_System\" is not a namespace name"),
        );
        // Without NRI, the registry's only source at start is runc's state.
        let mut cfg = NodeConfig {
            nri: false,
            ..Default::default()
        };
        cfg.runtime_api.enabled = true;
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .starts_with("nri = false and [runtime_api] runc_roots is empty"),
        );
        cfg.runtime_api.runc_roots = vec!["/run/runc".into()];
        cfg.validate().unwrap();
        let cfg = NodeConfig::from_toml("status_socket = \"run/status.sock\"", "f.toml").unwrap();
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "status_socket \"run/status.sock\" must be an absolute path (or empty: no status socket)"
        );
        let cfg = NodeConfig::from_toml("status_socket = \"\"", "f.toml").unwrap();
        cfg.validate().unwrap();
    }
}

#[cfg(test)]
mod shipped {
    use super::*;

    #[test]
    fn the_shipped_example_config_parses_and_validates() {
        let cfg = NodeConfig::from_toml(include_str!("../install/node.toml"), "install/node.toml")
            .unwrap();
        cfg.validate().unwrap();
        assert_eq!(
            cfg,
            NodeConfig::default(),
            "the example documents the defaults"
        );
    }
}
