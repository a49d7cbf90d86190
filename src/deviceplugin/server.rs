//! The `DevicePlugin` gRPC service of one resource: a thin adapter over [`ResourceSpec`].

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::api;
use super::api::device_plugin_server::DevicePlugin;
use super::resource::{ResourceSpec, Unhealthy};

/// Serves one resource. `stop` ends every open `ListAndWatch` stream, so a server can shut
/// down gracefully although kubelet keeps that stream open for the plugin's whole life.
pub struct DevicePluginService {
    spec: Arc<ResourceSpec>,
    health: watch::Receiver<Unhealthy>,
    stop: watch::Receiver<bool>,
}

impl DevicePluginService {
    pub fn new(
        spec: Arc<ResourceSpec>,
        health: watch::Receiver<Unhealthy>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        DevicePluginService { spec, health, stop }
    }
}

/// The options this plugin registers with: no PreStartContainer, no preferred allocation.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: false,
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

struct WatchState {
    spec: Arc<ResourceSpec>,
    health: watch::Receiver<Unhealthy>,
    stop: watch::Receiver<bool>,
    last: Option<Vec<api::Device>>,
}

/// Sends the device list at once, then again whenever it changes (a GPU's health); ends when
/// the server stops or the health source goes away.
fn device_stream(state: WatchState) -> DeviceStream {
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        loop {
            if *s.stop.borrow() {
                return None;
            }
            let devices = s.spec.devices(&s.health.borrow_and_update());
            if s.last.as_ref() != Some(&devices) {
                tracing::debug!(
                    resource = %s.spec.resource_name,
                    devices = devices.len(),
                    unhealthy = devices.iter().filter(|d| d.health != super::resource::HEALTHY).count(),
                    "ListAndWatch: sending the device list"
                );
                s.last = Some(devices.clone());
                return Some((Ok(api::ListAndWatchResponse { devices }), s));
            }
            tokio::select! {
                changed = s.health.changed() => if changed.is_err() { return None },
                _ = s.stop.changed() => {}
            }
        }
    }))
}

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        tracing::info!(resource = %self.spec.resource_name, devices = self.spec.len(), "kubelet opened ListAndWatch");
        Ok(Response::new(device_stream(WatchState {
            spec: self.spec.clone(),
            health: self.health.clone(),
            stop: self.stop.clone(),
            last: None,
        })))
    }

    async fn get_preferred_allocation(
        &self,
        _request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Ok(Response::new(api::PreferredAllocationResponse::default()))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let req = request.into_inner();
        match self.spec.allocate(&req) {
            Ok(resp) => {
                let key = self.spec.kind.grant_annotation();
                let grants: Vec<&str> = resp
                    .container_responses
                    .iter()
                    .filter_map(|c| c.annotations.get(key).map(String::as_str))
                    .collect();
                tracing::info!(resource = %self.spec.resource_name, ?grants, "Allocate");
                Ok(Response::new(resp))
            }
            Err(e) => {
                tracing::warn!(resource = %self.spec.resource_name, error = %e, "Allocate refused");
                Err(Status::invalid_argument(e.to_string()))
            }
        }
    }

    async fn pre_start_container(
        &self,
        _request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
