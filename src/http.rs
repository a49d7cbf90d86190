//! The HTTP server every endpoint of ours runs on (the node's status endpoint, the scheduler
//! extender): an accept loop that survives accept errors (`EMFILE` included), a cap on open
//! connections, a deadline for a request's headers, for each request (body included) and for
//! a connection's whole life — so idle or slow clients cannot hold file descriptors or tasks
//! that the controller and the watches need. With a TLS config it serves HTTPS and, with
//! [`mtls_config`], accepts only clients whose certificate the given CA signed (the
//! scheduler extender: kube-scheduler's `tlsConfig`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Accept errors survived by every server of this process (file descriptors exhausted, …).
pub static ACCEPT_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bounds on what clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; a connection beyond them is closed as soon as accepted.
    pub max_connections: usize,
    /// From the start of a connection (or the end of the previous request) to a request's
    /// complete headers.
    pub header_timeout: Duration,
    /// One request, from its headers to the end of the response body's production (its
    /// body is read inside this deadline).
    pub request_timeout: Duration,
    /// A connection is closed after this long, however busy (keep-alive clients reconnect).
    pub connection_lifetime: Duration,
    /// Connections not yet authenticated from one peer address at once: a plain-HTTP
    /// connection for its whole life, a TLS one until its handshake (client certificate
    /// included) is done. Beyond it a new connection from that address is closed at once, so
    /// one client cannot hold every place. Over TLS the authenticated connections have
    /// `max_connections` places of their own, which unauthenticated ones never take.
    pub max_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 128,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            connection_lifetime: Duration::from_secs(300),
            max_per_peer: 32,
        }
    }
}

/// Connections per peer address, each counted while its [`PeerSlot`] lives.
#[derive(Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection's place in [`Peers`].
struct PeerSlot(Arc<Peers>, std::net::IpAddr);

impl Peers {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, cap: usize) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_default();
        if *n >= cap.max(1) {
            return None;
        }
        *n += 1;
        Some(PeerSlot(self.clone(), ip))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

async fn request_deadline(timeout: Duration, req: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("request not completed within {} s\n", timeout.as_secs()),
        )
            .into_response(),
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes (open
/// connections are then dropped). Never ends on an accept error: it logs (at most once a
/// second) and retries after a pause, so running out of file descriptors is survived.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_tls(listener, router, limits, None, shutdown).await
}

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {}: {err}", path.display())]
    Pem {
        what: &'static str,
        path: std::path::PathBuf,
        err: rustls_pki_types::pem::Error,
    },
    #[error("{what} {} holds no certificate", path.display())]
    Empty {
        what: &'static str,
        path: std::path::PathBuf,
    },
    #[error("client CA {}: {err}", path.display())]
    Ca {
        path: std::path::PathBuf,
        err: String,
    },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

fn certs(
    what: &'static str,
    path: &std::path::Path,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let pem = |err| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        err,
    };
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Mutual TLS: serve `cert`/`key` (PEM) and accept only clients presenting a certificate
/// that `client_ca` (PEM) signed, for client authentication.
pub fn mtls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs("certificate", cert)?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).map_err(|err| TlsError::Pem {
        what: "key",
        path: key.to_path_buf(),
        err,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in certs("client CA", client_ca)? {
        roots.add(ca).map_err(|e| TlsError::Ca {
            path: client_ca.to_path_buf(),
            err: e.to_string(),
        })?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| TlsError::Ca {
        path: client_ca.to_path_buf(),
        err: e.to_string(),
    })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// [`serve`], over TLS when `tls` is given (the handshake must finish within the header
/// deadline).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let timeout = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| request_deadline(timeout, req, next),
    ));
    // Places of connections not yet authenticated (every plain-HTTP one), and of those
    // through their TLS handshake.
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let authenticated = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = Arc::new(Peers::default());
    // Dropped with this function: open connections are then aborted.
    let mut connections = tokio::task::JoinSet::new();
    let accept = async {
        let mut last_error_log: Option<std::time::Instant> = None;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e, &mut last_error_log).await;
                    continue;
                }
            };
            // At the cap, a new connection is closed at once: clients retry, and idle ones
            // cannot queue up behind the held ones.
            let Some(slot) = peers.take(peer.ip(), limits.max_per_peer) else {
                drop(stream);
                continue;
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let router = router.clone();
            let acceptor = acceptor.clone();
            let authenticated = authenticated.clone();
            connections.spawn(async move {
                match acceptor {
                    None => {
                        let _held = (permit, slot);
                        serve_connection(stream, router, limits).await
                    }
                    Some(acceptor) => {
                        let tls =
                            tokio::time::timeout(limits.header_timeout, acceptor.accept(stream))
                                .await;
                        drop((permit, slot));
                        match tls {
                            Ok(Ok(tls)) => {
                                // Authenticated: a place of its own kind, or closed.
                                let Ok(_permit) = authenticated.try_acquire_owned() else {
                                    return;
                                };
                                serve_connection(tls, router, limits).await
                            }
                            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake refused"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        }
                    }
                }
            });
            // Reap finished connection tasks so the set does not grow.
            while connections.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => {}
    }
    Ok(())
}

/// Counts an accept error, logs it (at most once a second) and pauses before the retry.
async fn accept_failed(e: &std::io::Error, last_log: &mut Option<std::time::Instant>) {
    ACCEPT_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        tracing::warn!(error = %e, "accept failed; retrying");
        *last_log = Some(std::time::Instant::now());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serves `router` on a unix socket within `limits` (`max_per_peer` does not apply: every
/// caller is root) until `shutdown` completes. A connection whose peer is neither root nor
/// this process's own user (kernel credentials, `SO_PEERCRED`; the agent runs as root) is
/// closed unanswered, whatever the socket file's mode.
pub async fn serve_unix(
    listener: tokio::net::UnixListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let timeout = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| request_deadline(timeout, req, next),
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let accept = async {
        let mut last_error_log: Option<std::time::Instant> = None;
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e, &mut last_error_log).await;
                    continue;
                }
            };
            let own = nix::unistd::geteuid().as_raw();
            if !stream
                .peer_cred()
                .is_ok_and(|c| c.uid() == 0 || c.uid() == own)
            {
                tracing::debug!("unix socket caller is neither root nor this user: closed");
                continue;
            }
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                continue;
            };
            let router = router.clone();
            connections.spawn(async move {
                let _held = permit;
                serve_connection(stream, router, limits).await
            });
            while connections.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => {}
    }
    Ok(())
}

async fn serve_connection<I>(io: I, router: Router, limits: Limits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
        let router = router.clone();
        async move {
            Ok::<_, Infallible>(
                router
                    .oneshot(req.map(Body::new))
                    .await
                    .unwrap_or_else(|e| match e {}),
            )
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    let _ = tokio::time::timeout(limits.connection_lifetime, conn).await;
}
