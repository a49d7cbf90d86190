//! The HTTP server every endpoint of ours runs on (the node's status endpoint, the scheduler
//! extender): an accept loop that survives accept errors (`EMFILE` included), a cap on open
//! connections, a deadline for a request's headers, for each request (body included) and for
//! a connection's whole life — so idle or slow clients cannot hold file descriptors or tasks
//! that the controller and the watches need.

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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 128,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            connection_lifetime: Duration::from_secs(300),
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
    let timeout = limits.request_timeout;
    let router = router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| request_deadline(timeout, req, next),
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Dropped with this function: open connections are then aborted.
    let mut connections = tokio::task::JoinSet::new();
    let accept = async {
        let mut last_error_log: Option<std::time::Instant> = None;
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    ACCEPT_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        tracing::warn!(error = %e, "accept failed; retrying");
                        last_error_log = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // At the cap, a new connection is closed at once: clients retry, and idle ones
            // cannot queue up behind the held ones.
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let router = router.clone();
            connections.spawn(async move {
                let _permit = permit;
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
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(limits.connection_lifetime, conn).await;
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
