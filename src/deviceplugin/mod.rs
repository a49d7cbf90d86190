//! The kubelet device plugin (API v1beta1 over gRPC): advertises the node's GPU memory, core
//! percentage and GPU count as extended resources and returns the grant annotations from
//! `Allocate`.
//!
//! - [`resource`]: device lists and `Allocate` answers (pure);
//! - [`server`]: the `DevicePlugin` gRPC service, a thin adapter;
//! - [`endpoint`]: one resource's socket, registration with kubelet, re-registration after a
//!   kubelet restart;
//! - [`plugins`]: the set of running endpoints (core advertised or withdrawn);
//! - [`nodesync`]: the node annotation `gpushare.io/gpus` and, for `core = auto`, the node
//!   label `ack.node.gpu.schedule`;
//! - [`Agent`]: all of it, as `gpushare node --device-plugin` runs it.

/// Generated from `protos/deviceplugin_v1beta1.proto` (see build.rs).
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

pub mod endpoint;
pub mod nodesync;
pub mod plugins;
pub mod resource;
pub mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use endpoint::{KUBELET_SOCKET, Settings};
pub use nodesync::KubeAccess;
pub use plugins::DevicePlugins;
pub use resource::{ResourceKind, ResourceSpec, Unhealthy};

use gpushare_core::inventory::Inventory;
use gpushare_core::request::ResourceNames;

/// More devices than this in one list risk kubelet's 4 MiB message limit.
const LARGE_DEVICE_LIST: usize = 100_000;

/// The kubelet's default device-plugin directory.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Whether the core-percentage resource is advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CoreMode {
    /// When the Node is labelled `ack.node.gpu.schedule=core_mem` (followed while running).
    #[default]
    Auto,
    /// Always.
    #[value(name = "true")]
    Always,
    /// Never.
    #[value(name = "false")]
    Never,
}

impl CoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CoreMode::Auto => "auto",
            CoreMode::Always => "true",
            CoreMode::Never => "false",
        }
    }
}

impl Serialize for CoreMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CoreMode {
    /// `"auto"`, `true`/`"true"` or `false`/`"false"`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CoreMode;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"auto\", true or false")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<CoreMode, E> {
                Ok(if v { CoreMode::Always } else { CoreMode::Never })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CoreMode, E> {
                match v {
                    "auto" => Ok(CoreMode::Auto),
                    "true" => Ok(CoreMode::Always),
                    "false" => Ok(CoreMode::Never),
                    _ => Err(E::custom(format!(
                        "device_plugin.core {v:?} is not one of auto, true, false"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[device_plugin]` in the node config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicePluginConfig {
    /// Run the device plugin and publish the node's GPUs (`--device-plugin`).
    pub enabled: bool,
    /// The kubelet's device-plugin directory: `kubelet.sock` and our sockets.
    pub dir: PathBuf,
    /// Advertise `gpu-core.percentage`: auto (node label `ack.node.gpu.schedule=core_mem`),
    /// true or false.
    pub core: CoreMode,
}

impl Default for DevicePluginConfig {
    fn default() -> Self {
        DevicePluginConfig {
            enabled: false,
            dir: PathBuf::from(DEFAULT_DIR),
            core: CoreMode::Auto,
        }
    }
}

/// The running device plugin of `gpushare node`: the endpoints, plus the node sync when the
/// API server is reachable.
pub struct Agent {
    plugins: Arc<DevicePlugins>,
    tasks: Vec<JoinHandle<()>>,
}

impl Agent {
    /// Starts the memory and count endpoints, the core endpoint per `cfg.core`, and (with
    /// `kube`) the node sync. Never fails: what cannot be reached is retried in the background.
    pub fn start(
        cfg: &DevicePluginConfig,
        settings: Settings,
        names: &ResourceNames,
        node_name: &str,
        inventory: &Inventory,
        kube: Option<KubeAccess>,
    ) -> Agent {
        let plugins = Arc::new(DevicePlugins::new(settings, inventory, names));
        tracing::info!(
            dir = %plugins.settings().dir.display(),
            core = cfg.core.as_str(),
            memory_devices = plugins.spec(ResourceKind::Memory).len(),
            gpus = inventory.len(),
            "device plugin starting"
        );
        let memory_devices = plugins.spec(ResourceKind::Memory).len();
        if memory_devices > LARGE_DEVICE_LIST {
            // kubelet's gRPC client receives at most 4 MiB per message (~25 bytes a device).
            tracing::warn!(
                memory_devices,
                "the memory resource has very many devices; kubelet may refuse its list (use memory_unit = \"GiB\")"
            );
        }
        plugins.start(ResourceKind::Memory);
        plugins.start(ResourceKind::Count);
        let mut tasks = vec![];
        let core_tx = match cfg.core {
            CoreMode::Always => {
                plugins.start(ResourceKind::Core);
                None
            }
            CoreMode::Never => None,
            CoreMode::Auto => {
                if kube.is_none() {
                    tracing::warn!(
                        "device_plugin.core = auto without API access: the core resource is not advertised"
                    );
                }
                let (tx, mut rx) = watch::channel(false);
                let p = plugins.clone();
                tasks.push(tokio::spawn(async move {
                    while rx.changed().await.is_ok() {
                        let on = *rx.borrow_and_update();
                        p.set_core(on).await;
                    }
                }));
                Some(tx)
            }
        };
        if let Some(access) = kube {
            let sync = nodesync::NodeSync {
                node_name: node_name.to_string(),
                inventory: inventory.clone(),
                health: plugins.health(),
                core: core_tx,
                retry_max: Duration::from_secs(60),
            };
            tasks.push(tokio::spawn(nodesync::run(sync, access)));
        }
        Agent { plugins, tasks }
    }

    pub fn plugins(&self) -> &DevicePlugins {
        &self.plugins
    }

    /// The plugins, shared (for tasks that outlive a borrow, like the health poller).
    pub fn plugins_handle(&self) -> Arc<DevicePlugins> {
        self.plugins.clone()
    }

    /// Stops the node sync and every endpoint, removing our sockets.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        self.plugins.shutdown().await;
        tracing::info!("device plugin stopped; sockets removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Wrap {
        device_plugin: DevicePluginConfig,
    }

    #[test]
    fn core_mode_reads_auto_and_booleans() {
        for (text, want) in [
            ("core = \"auto\"", CoreMode::Auto),
            ("core = true", CoreMode::Always),
            ("core = \"false\"", CoreMode::Never),
        ] {
            let w: Wrap = toml::from_str(&format!("[device_plugin]\n{text}")).unwrap();
            assert_eq!(w.device_plugin.core, want, "{text}");
        }
        let e = toml::from_str::<Wrap>("[device_plugin]\ncore = \"yes\"")
            .err()
            .unwrap();
        assert!(e.to_string().contains("device_plugin.core \"yes\""), "{e}");
        let w: Wrap = toml::from_str("[device_plugin]\nenabled = true").unwrap();
        assert_eq!(w.device_plugin.dir, PathBuf::from(DEFAULT_DIR));
        assert_eq!(w.device_plugin.core, CoreMode::Auto);
        let text = toml::to_string(&DevicePluginConfig::default()).unwrap();
        assert!(text.contains("core = \"auto\""), "{text}");
    }
}
