//! The set of running plugin endpoints: memory and count always, core when advertised.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::endpoint::{self, Settings};
use super::resource::{ResourceKind, ResourceSpec, Unhealthy};
use gpushare_core::inventory::Inventory;
use gpushare_core::request::ResourceNames;

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The node's device-plugin endpoints, one per resource.
pub struct DevicePlugins {
    settings: Settings,
    specs: BTreeMap<ResourceKind, Arc<ResourceSpec>>,
    health: watch::Sender<Unhealthy>,
    running: Mutex<BTreeMap<ResourceKind, Running>>,
}

impl DevicePlugins {
    /// Describes the three resources of `inventory`; starts nothing.
    pub fn new(settings: Settings, inventory: &Inventory, names: &ResourceNames) -> DevicePlugins {
        let specs = ResourceKind::ALL
            .iter()
            .map(|k| (*k, Arc::new(ResourceSpec::new(*k, inventory, names))))
            .collect();
        DevicePlugins {
            settings,
            specs,
            health: watch::channel(Unhealthy::new()).0,
            running: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn spec(&self, kind: ResourceKind) -> &ResourceSpec {
        &self.specs[&kind]
    }

    /// Starts serving and registering `kind` (no-op when it runs already). Needs a Tokio
    /// runtime.
    pub fn start(&self, kind: ResourceKind) {
        let mut running = self.running.lock().expect("device plugin lock");
        if running.contains_key(&kind) {
            return;
        }
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(endpoint::run(
            self.specs[&kind].clone(),
            self.settings.clone(),
            self.health.subscribe(),
            stop_rx,
        ));
        running.insert(kind, Running { stop, task });
    }

    /// Stops `kind` and removes its socket; kubelet then drops the resource to 0.
    pub async fn stop(&self, kind: ResourceKind) {
        let r = self
            .running
            .lock()
            .expect("device plugin lock")
            .remove(&kind);
        if let Some(r) = r {
            let _ = r.stop.send(true);
            if let Err(e) = r.task.await {
                tracing::warn!(resource = %self.specs[&kind].resource_name, error = %e, "device-plugin task failed");
            }
        }
    }

    /// Advertises or withdraws the core resource.
    pub async fn set_core(&self, on: bool) {
        let was = self.is_running(ResourceKind::Core);
        if on == was {
            return;
        }
        let resource = &self.specs[&ResourceKind::Core].resource_name;
        if on {
            tracing::info!(resource = %resource, "advertising the core resource");
            self.start(ResourceKind::Core);
        } else {
            tracing::info!(resource = %resource, "withdrawing the core resource");
            self.stop(ResourceKind::Core).await;
        }
    }

    pub fn is_running(&self, kind: ResourceKind) -> bool {
        self.running
            .lock()
            .expect("device plugin lock")
            .contains_key(&kind)
    }

    /// The resources currently served.
    pub fn running(&self) -> Vec<ResourceKind> {
        self.running
            .lock()
            .expect("device plugin lock")
            .keys()
            .copied()
            .collect()
    }

    /// Marks GPUs unhealthy (all others healthy); every open `ListAndWatch` resends its list.
    pub fn set_unhealthy(&self, unhealthy: Unhealthy) {
        self.health.send_if_modified(|h| {
            if *h == unhealthy {
                return false;
            }
            tracing::info!(?unhealthy, "GPU health changed");
            *h = unhealthy;
            true
        });
    }

    /// Health as the endpoints (and the node annotation) see it.
    pub fn health(&self) -> watch::Receiver<Unhealthy> {
        self.health.subscribe()
    }

    /// Stops every endpoint and removes their sockets.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.running().into_iter().map(|k| self.stop(k))).await;
    }
}
