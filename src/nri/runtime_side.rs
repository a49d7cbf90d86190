//! The runtime's side of an NRI session, as containerd plays it: serve the Runtime service
//! on logical connection 2 (it takes the plugin's RegisterPlugin), call the Plugin service on
//! connection 1. The session tests and the CreateContainer benchmark drive the real plugin
//! with it; the product never runs it.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt as _;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use ttrpc::r#async::transport::{Listener, Socket};

use super::api::nri_api::{Empty, RegisterPluginRequest};
use super::api::nri_api_ttrpc::{PluginClient, Runtime, create_runtime};
use super::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// The Runtime service: records every registration.
struct Registrations(mpsc::UnboundedSender<RegisterPluginRequest>);

#[async_trait]
impl Runtime for Registrations {
    async fn register_plugin(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        let _ = self.0.send(req);
        Ok(Empty::default())
    }
}

/// One runtime-side session over `stream`.
pub struct RuntimeSide {
    /// Calls into the plugin (Configure, Synchronize, CreateContainer, …).
    pub plugin: PluginClient,
    /// The plugin's RegisterPlugin requests, in order.
    pub registrations: mpsc::UnboundedReceiver<RegisterPluginRequest>,
    server: ttrpc::r#async::Server,
    mux: Mux,
}

impl RuntimeSide {
    /// Starts serving the Runtime service on `stream` (the runtime's end of the socket).
    pub async fn start(stream: UnixStream) -> std::io::Result<RuntimeSide> {
        let mut mux = Mux::start(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let (tx, registrations) = mpsc::unbounded_channel();
        let rt_conn = mux.take(RUNTIME_SERVICE_CONN).expect("runtime connection");
        let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(rt_conn) })
            .chain(futures::stream::pending());
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(Listener::new(accepted))
            .register_service(create_runtime(Arc::new(Registrations(tx))));
        server.start().await.map_err(std::io::Error::other)?;
        let plugin = PluginClient::new(ttrpc::r#async::Client::new(Socket::new(
            mux.take(PLUGIN_SERVICE_CONN).expect("plugin connection"),
        )));
        Ok(RuntimeSide {
            plugin,
            registrations,
            server,
            mux,
        })
    }

    /// Closes the session as a runtime that goes away does: the plugin's session ends.
    pub async fn close(mut self) -> std::io::Result<()> {
        self.server
            .shutdown()
            .await
            .map_err(std::io::Error::other)?;
        drop(self.plugin);
        drop(self.mux);
        Ok(())
    }
}
