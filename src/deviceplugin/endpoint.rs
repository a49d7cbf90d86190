//! One plugin endpoint's life: serve on a unix socket in the kubelet's device-plugin
//! directory, register with kubelet, and start over whenever kubelet restarts.
//!
//! A restarting kubelet deletes every plugin socket in its directory and recreates
//! `kubelet.sock`; a plugin must notice and register again. Every second the endpoint checks
//! that its socket file is still the one it bound (same device and inode) and that
//! `kubelet.sock` is still the one it registered with; if either changed it binds a fresh
//! socket and registers again. While kubelet is away, registration is retried with backoff.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Server};
use tracing::Instrument as _;

use super::api;
use super::api::device_plugin_server::DevicePluginServer;
use super::api::registration_client::RegistrationClient;
use super::resource::{ResourceSpec, Unhealthy};
use super::server::{self, DevicePluginService};
use crate::backoff::Backoff;

/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The device-plugin API version we speak.
pub const API_VERSION: &str = "v1beta1";

/// Where and how often.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The kubelet's device-plugin directory (`kubelet.sock` and our sockets).
    pub dir: PathBuf,
    /// How often to check that our socket and `kubelet.sock` are unchanged.
    pub poll: Duration,
    /// First and longest wait between registration (or bind) attempts.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Limit on one registration call (connect + RPC).
    pub register_timeout: Duration,
}

impl Settings {
    pub fn new(dir: impl Into<PathBuf>) -> Settings {
        Settings {
            dir: dir.into(),
            poll: Duration::from_secs(1),
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            register_timeout: Duration::from_secs(5),
        }
    }

    pub fn kubelet_socket(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot create the device-plugin directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove the stale device-plugin socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on device-plugin socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot connect to the kubelet socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("kubelet refused to register {resource} (endpoint {endpoint}): {status}")]
    Refused {
        resource: String,
        endpoint: String,
        status: tonic::Status,
    },
    #[error("registering {resource} with the kubelet socket {path} took longer than {timeout:?}")]
    Timeout {
        resource: String,
        path: PathBuf,
        timeout: Duration,
    },
}

/// Identity of a file: device, inode and change time (an inode number can be handed out
/// again at once to a recreated file; its change time cannot match to the nanosecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

/// The identity of the file at `path`; `None` when it does not exist.
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| FileId {
        dev: m.dev(),
        ino: m.ino(),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// A gRPC channel to a unix socket (the kubelet's, or — in tests, as kubelet does — a
/// plugin's). The URI is a placeholder: the connector dials `path`.
pub async fn dial(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Calls `Registration.Register` on `kubelet.sock` for `spec`, served at `endpoint` (a socket
/// file name in the same directory).
pub async fn register(
    settings: &Settings,
    spec: &ResourceSpec,
    endpoint: &str,
) -> Result<(), EndpointError> {
    let path = settings.kubelet_socket();
    let call = async {
        let channel = dial(&path).await.map_err(|source| EndpointError::Connect {
            path: path.clone(),
            source,
        })?;
        RegistrationClient::new(channel)
            .register(api::RegisterRequest {
                version: API_VERSION.to_string(),
                endpoint: endpoint.to_string(),
                resource_name: spec.resource_name.clone(),
                options: Some(server::options()),
            })
            .await
            .map_err(|status| EndpointError::Refused {
                resource: spec.resource_name.clone(),
                endpoint: endpoint.to_string(),
                status,
            })?;
        Ok(())
    };
    match tokio::time::timeout(settings.register_timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(EndpointError::Timeout {
            resource: spec.resource_name.clone(),
            path,
            timeout: settings.register_timeout,
        }),
    }
}

/// Binds `path`, replacing a socket left there by an earlier run. Creates the directory when
/// the agent starts before kubelet ever ran (kubelet creates it too, and keeps it).
fn bind(path: &Path) -> Result<UnixListener, EndpointError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| EndpointError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(EndpointError::RemoveStale {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    UnixListener::bind(path).map_err(|source| EndpointError::Bind {
        path: path.to_path_buf(),
        source,
    })
}

/// Sleeps `d`; true when `stop` was raised meanwhile (or its sender is gone).
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    // wait_for also ends (with an error) when the sender is gone: that is a stop too.
    tokio::time::timeout(d, stop.wait_for(|s| *s)).await.is_ok()
}

/// Why one generation (bind → register → watch) ended.
enum End {
    Stop,
    Restart(&'static str),
}

/// Runs the endpoint of `spec` until `stop` is raised; then removes its socket.
pub async fn run(
    spec: Arc<ResourceSpec>,
    settings: Settings,
    health: watch::Receiver<Unhealthy>,
    stop: watch::Receiver<bool>,
) {
    let span = tracing::info_span!(
        "device_plugin",
        resource = %spec.resource_name,
        socket = %settings.dir.join(spec.kind.socket_name()).display()
    );
    run_endpoint(spec, settings, health, stop)
        .instrument(span)
        .await
}

async fn run_endpoint(
    spec: Arc<ResourceSpec>,
    settings: Settings,
    health: watch::Receiver<Unhealthy>,
    mut stop: watch::Receiver<bool>,
) {
    let endpoint = spec.kind.socket_name();
    let path = settings.dir.join(endpoint);
    let kubelet = settings.kubelet_socket();
    let mut backoff = Backoff::new(settings.retry_min, settings.retry_max);
    let resource = spec.resource_name.clone();
    loop {
        if *stop.borrow() {
            break;
        }
        let listener = match bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot serve the device plugin; retrying");
                if sleep_or_stop(backoff.next_wait(), &mut stop).await {
                    break;
                }
                continue;
            }
        };
        let ours = file_id(&path);
        let (gen_stop, gen_stop_rx) = watch::channel(false);
        let service = DevicePluginService::new(spec.clone(), health.clone(), gen_stop_rx.clone());
        let mut server = tokio::spawn(serve(listener, service, gen_stop_rx, resource.clone()));

        let end = 'generation: {
            // Register, retrying while kubelet is away.
            let mut last_error = String::new();
            let kubelet_id = loop {
                if file_id(&path) != ours {
                    break 'generation End::Restart("our socket was removed before registration");
                }
                match register(&settings, &spec, endpoint).await {
                    Ok(()) => {
                        tracing::info!(
                            endpoint,
                            devices = spec.len(),
                            kubelet = %kubelet.display(),
                            "registered with kubelet"
                        );
                        backoff.reset();
                        break file_id(&kubelet);
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        if msg != last_error {
                            tracing::warn!(error = %msg, "kubelet registration failed; retrying with backoff");
                            last_error = msg;
                        } else {
                            tracing::debug!(error = %msg, "kubelet registration failed again");
                        }
                    }
                }
                if sleep_or_stop(backoff.next_wait(), &mut stop).await {
                    break 'generation End::Stop;
                }
            };
            // Registered: watch for a kubelet restart.
            loop {
                if sleep_or_stop(settings.poll, &mut stop).await {
                    break End::Stop;
                }
                if file_id(&path) != ours {
                    break End::Restart("our socket was removed (kubelet restarted?)");
                }
                let now = file_id(&kubelet);
                if now.is_some() && now != kubelet_id {
                    break End::Restart("kubelet.sock was recreated (kubelet restarted)");
                }
            }
        };

        let _ = gen_stop.send(true);
        match tokio::time::timeout(Duration::from_secs(2), &mut server).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "device-plugin server task failed"),
            Err(_) => {
                tracing::warn!("device-plugin server did not stop within 2 s; aborting it");
                server.abort();
            }
        }
        match end {
            End::Stop => {
                if ours.is_some()
                    && file_id(&path) == ours
                    && let Err(e) = std::fs::remove_file(&path)
                {
                    tracing::warn!(error = %e, "cannot remove our socket");
                }
                break;
            }
            End::Restart(why) => {
                tracing::info!(reason = why, "serving a new socket and registering again");
            }
        }
    }
    tracing::info!("device plugin stopped");
}

/// Serves `service` on `listener` until `stop` is raised.
async fn serve(
    listener: UnixListener,
    service: DevicePluginService,
    mut stop: watch::Receiver<bool>,
    resource: String,
) {
    let incoming = futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        if r.is_err() {
            // Do not spin on a persistent accept error (e.g. out of file descriptors).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some((r, l))
    });
    let r = Server::builder()
        .add_service(DevicePluginServer::new(service))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = r {
        tracing::error!(resource = %resource, error = %e, "device-plugin gRPC server failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_id_changes_when_a_file_is_recreated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.sock");
        assert_eq!(file_id(&p), None);
        std::fs::write(&p, "a").unwrap();
        let a = file_id(&p);
        assert!(a.is_some());
        assert_eq!(file_id(&p), a);
        std::fs::remove_file(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        std::fs::write(&p, "b").unwrap();
        assert_ne!(file_id(&p), a);
    }
}
