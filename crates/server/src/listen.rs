//! Serving connections within limits, so that idle or slow clients cannot hold the API (250
//! idle connections once stopped it): at most [`Options::connections_max`] open at once (one
//! over the limit waits in the listen queue until another closes), and each closed once it has
//! sent no complete request head for [`Options::header_read_timeout`], idle keep-alive time
//! included. Each connection is hyper's HTTP/1 over the accepted socket, the router given the
//! peer's address as `ConnectInfo`.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::Options;

/// How long the server waits before accepting again after accepting failed (out of file
/// descriptors, say): a tight loop would only fail again.
const ACCEPT_RETRY: Duration = Duration::from_millis(500);

/// Serves `router` on `listener` within `options`' limits until `shutdown` resolves; requests in
/// flight finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let n_permits = u32::try_from(options.connections_max.max(1)).unwrap_or(u32::MAX);
    let permits = Arc::new(Semaphore::new(n_permits as usize));
    let (closing, closing_watch) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(options.header_read_timeout).keep_alive(true);
    let mut shutdown = pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.context("the connection limit's semaphore closed")?,
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an HTTP connection failed; trying again");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        spawn_connection(&http, stream, peer, router.clone(), permit, closing_watch.clone());
    }
    drop(listener);
    let _ = closing.send(true);
    // Every permit back is every connection closed, its requests answered.
    let _ = permits.acquire_many(n_permits).await;
    Ok(())
}

/// Serves one connection on its own task, holding `permit` until it closes; once `closing` turns
/// true it finishes the request in flight, if any, and closes.
fn spawn_connection(
    http: &hyper::server::conn::http1::Builder,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    router: Router,
    permit: tokio::sync::OwnedSemaphorePermit,
    mut closing: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |mut request: axum::http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let mut router = router.clone();
        async move { tower_service::Service::call(&mut router, request.map(axum::body::Body::new)).await }
    });
    let connection = http.serve_connection(TokioIo::new(stream), service);
    tokio::spawn(async move {
        let _permit = permit;
        let mut connection = pin!(connection);
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = closing.wait_for(|closing| *closing) => connection.as_mut().graceful_shutdown(),
        }
        let _ = connection.await;
    });
}
