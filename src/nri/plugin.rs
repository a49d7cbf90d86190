//! NRI plugin lifecycle: connect (external plugin) or take the runtime's socket (pre-installed
//! plugin), serve the Plugin service on connection 1, register on connection 2, and stay until
//! the runtime goes away; an external plugin then reconnects with backoff.

use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixStream;
use ttrpc::r#async::transport::{Listener, Socket};

use super::api::nri_api::RegisterPluginRequest;
use super::api::nri_api_ttrpc::{RuntimeClient, create_plugin};
use super::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::service::{Handler, NriPluginService};
use crate::backoff::Backoff;

/// NRI API version of the vendored `api.proto` (see protos/SOURCES).
pub const NRI_API_VERSION: &str = "v0.12.5";

/// How the plugin names itself to the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub name: String,
    pub index: String,
}

/// How long RegisterPlugin may take (the runtime's own registration timeout is 5 s).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a runtime connection could not be served.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot start the plugin service: {0}")]
    Serve(ttrpc::Error),
    #[error("RegisterPlugin {index}-{name} failed: {source}")]
    Register {
        index: String,
        name: String,
        source: ttrpc::Error,
    },
    #[error("the runtime's plugin socket: {0}")]
    Socket(#[from] std::io::Error),
}

/// Serves one runtime connection until it closes. Returns why it ended.
pub async fn serve_connection<H: Handler>(
    stream: UnixStream,
    reg: &Registration,
    handler: Arc<H>,
) -> Result<String, PluginError> {
    let mut mux = Mux::start(stream, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
    let closed = mux.closed();
    let plugin_conn = mux.take(PLUGIN_SERVICE_CONN).expect("plugin connection");
    let runtime_conn = mux.take(RUNTIME_SERVICE_CONN).expect("runtime connection");

    // One accepted "connection" (the logical connection 1), then nothing more.
    let accepted = futures::stream::once(async move { Ok::<_, std::io::Error>(plugin_conn) })
        .chain(futures::stream::pending());
    let service = create_plugin(Arc::new(NriPluginService::new(handler.clone())));
    let mut server = ttrpc::r#async::Server::new()
        .add_listener(Listener::new(accepted))
        .register_service(service);
    server.start().await.map_err(PluginError::Serve)?;

    let client = RuntimeClient::new(ttrpc::r#async::Client::new(Socket::new(runtime_conn)));
    let req = RegisterPluginRequest {
        plugin_name: reg.name.clone(),
        plugin_idx: reg.index.clone(),
        NRI_version: NRI_API_VERSION.to_string(),
        ..Default::default()
    };
    let ctx = ttrpc::context::with_timeout(REGISTER_TIMEOUT.as_nanos() as i64);
    let registered = tokio::select! {
        r = client.register_plugin(ctx, &req) => r.map(|_| ()),
        reason = closed.clone().wait() => {
            Err(ttrpc::Error::Others(format!("connection closed during registration: {reason}")))
        }
    };
    if let Err(e) = registered {
        let _ = server.shutdown().await;
        return Err(PluginError::Register {
            index: reg.index.clone(),
            name: reg.name.clone(),
            source: e,
        });
    }
    tracing::info!(plugin = %reg.name, index = %reg.index, "registered with the runtime");
    handler.connected(true);
    let reason = closed.wait().await;
    handler.connected(false);
    let _ = server.shutdown().await;
    Ok(reason)
}

use futures::StreamExt as _;

/// External plugin: connect to `socket`, serve, and reconnect with backoff (0.2 s doubling
/// to 1 s) whenever the runtime restarts. Runs until the task is dropped. The cap is short:
/// while the agent is not registered, GPU containers are created unchecked, and a connect
/// attempt to a local socket costs nothing.
pub async fn run_external<H: Handler>(socket: &Path, reg: Registration, handler: Arc<H>) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
    loop {
        match UnixStream::connect(socket).await {
            Ok(stream) => {
                tracing::info!(socket = %socket.display(), "connected to the runtime");
                match serve_connection(stream, &reg, handler.clone()).await {
                    Ok(reason) => {
                        tracing::warn!(%reason, "runtime connection ended; reconnecting");
                        backoff.reset();
                    }
                    Err(e) => tracing::error!(error = %e, "runtime connection failed"),
                }
            }
            Err(e) => {
                tracing::debug!(socket = %socket.display(), error = %e, "runtime not reachable")
            }
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// Pre-installed plugin: the runtime started us with one end of a socketpair on `fd`.
/// Returns when the runtime closes it (the runtime starts us again when it restarts).
pub async fn run_preinstalled<H: Handler>(
    fd: RawFd,
    reg: Registration,
    handler: Arc<H>,
) -> Result<String, PluginError> {
    // SAFETY: the runtime hands this fd to us and nothing else in the process owns it.
    let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    std_stream.set_nonblocking(true)?;
    let stream = UnixStream::from_std(std_stream)?;
    serve_connection(stream, &reg, handler).await
}
