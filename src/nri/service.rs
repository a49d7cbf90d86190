//! Thin adapter from the generated NRI Plugin service to a [`Handler`]: protocol plumbing
//! only (event masks, split sync, StateChange fallback, error mapping), no policy.

use std::sync::Arc;

use async_trait::async_trait;
use ttrpc::r#async::TtrpcContext;

use super::api::nri_api::{
    ConfigureRequest, ConfigureResponse, Container, ContainerAdjustment, CreateContainerRequest,
    CreateContainerResponse, Empty, Event, PodSandbox, PostCreateContainerRequest,
    PostCreateContainerResponse, RemoveContainerRequest, RemoveContainerResponse,
    StartContainerRequest, StartContainerResponse, StateChangeEvent, StopContainerRequest,
    StopContainerResponse, SynchronizeRequest, SynchronizeResponse, UpdateContainerRequest,
    UpdateContainerResponse,
};
use super::api::nri_api_ttrpc::Plugin;

/// A refusal or failure of a handler; the message reaches the runtime's caller verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub code: ttrpc::Code,
    pub message: String,
}

impl HandlerError {
    pub fn invalid(message: impl Into<String>) -> Self {
        HandlerError {
            code: ttrpc::Code::INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        HandlerError {
            code: ttrpc::Code::INTERNAL,
            message: message.into(),
        }
    }
}

impl From<HandlerError> for ttrpc::Error {
    fn from(e: HandlerError) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code, e.message))
    }
}

/// The events the handler wants, as NRI numbers them.
pub fn event_mask(events: &[Event]) -> i32 {
    events
        .iter()
        .map(|e| 1i32 << ((*e as i32) - 1))
        .fold(0, |a, b| a | b)
}

/// What a plugin implements. Synchronous: handlers decide from memory, they never block.
pub trait Handler: Send + Sync + 'static {
    /// Returns the events to subscribe to (see [`event_mask`]).
    fn configure(&self, req: &ConfigureRequest) -> Result<i32, HandlerError>;
    /// One chunk of the runtime's state; `req.more` says whether more chunks follow.
    fn synchronize(&self, req: &SynchronizeRequest) -> Result<(), HandlerError>;
    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Option<ContainerAdjustment>, HandlerError>;
    /// The runtime created the container (default: nothing to do).
    fn post_create_container(&self, _pod: &PodSandbox, _ctr: &Container) {}
    fn start_container(&self, pod: &PodSandbox, ctr: &Container);
    fn update_container(&self, pod: &PodSandbox, ctr: &Container) -> Result<(), HandlerError>;
    fn stop_container(&self, pod: &PodSandbox, ctr: &Container);
    fn remove_container(&self, pod: &PodSandbox, ctr: &Container);
    /// Called when the runtime connection comes up or goes down.
    fn connected(&self, _up: bool) {}
}

pub struct NriPluginService<H> {
    handler: Arc<H>,
}

impl<H> NriPluginService<H> {
    pub fn new(handler: Arc<H>) -> Self {
        NriPluginService { handler }
    }
}

#[async_trait]
impl<H: Handler> Plugin for NriPluginService<H> {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: ConfigureRequest,
    ) -> ttrpc::Result<ConfigureResponse> {
        let events = self.handler.configure(&req)?;
        Ok(ConfigureResponse {
            events,
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: SynchronizeRequest,
    ) -> ttrpc::Result<SynchronizeResponse> {
        self.handler.synchronize(&req)?;
        // Split sync: acknowledge each chunk with `more` echoed and no updates.
        Ok(SynchronizeResponse {
            more: req.more,
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: Empty) -> ttrpc::Result<Empty> {
        Ok(Empty::default())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: CreateContainerRequest,
    ) -> ttrpc::Result<CreateContainerResponse> {
        let adjust = self.handler.create_container(&req.pod, &req.container)?;
        Ok(CreateContainerResponse {
            adjust: adjust.into(),
            ..Default::default()
        })
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: PostCreateContainerRequest,
    ) -> ttrpc::Result<PostCreateContainerResponse> {
        self.handler.post_create_container(&req.pod, &req.container);
        Ok(PostCreateContainerResponse::default())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: StartContainerRequest,
    ) -> ttrpc::Result<StartContainerResponse> {
        self.handler.start_container(&req.pod, &req.container);
        Ok(StartContainerResponse::default())
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: UpdateContainerRequest,
    ) -> ttrpc::Result<UpdateContainerResponse> {
        self.handler.update_container(&req.pod, &req.container)?;
        Ok(UpdateContainerResponse::default())
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: StopContainerRequest,
    ) -> ttrpc::Result<StopContainerResponse> {
        self.handler.stop_container(&req.pod, &req.container);
        Ok(StopContainerResponse::default())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: RemoveContainerRequest,
    ) -> ttrpc::Result<RemoveContainerResponse> {
        self.handler.remove_container(&req.pod, &req.container);
        Ok(RemoveContainerResponse::default())
    }

    /// Older runtimes (NRI v0.8: containerd 1.7, 2.0, 2.1) deliver these events here.
    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: StateChangeEvent,
    ) -> ttrpc::Result<Empty> {
        let (pod, ctr) = (&req.pod, &req.container);
        match req.event.enum_value() {
            Ok(Event::POST_CREATE_CONTAINER) => self.handler.post_create_container(pod, ctr),
            Ok(Event::START_CONTAINER) => self.handler.start_container(pod, ctr),
            Ok(Event::STOP_CONTAINER) => self.handler.stop_container(pod, ctr),
            Ok(Event::REMOVE_CONTAINER) => self.handler.remove_container(pod, ctr),
            other => tracing::debug!(event = ?other, "ignoring state change"),
        }
        Ok(Empty::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_mask_uses_event_minus_one() {
        assert_eq!(event_mask(&[Event::RUN_POD_SANDBOX]), 1);
        assert_eq!(event_mask(&[Event::CREATE_CONTAINER]), 1 << 3);
        assert_eq!(
            event_mask(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER]),
            (1 << 3) | (1 << 10)
        );
    }
}
