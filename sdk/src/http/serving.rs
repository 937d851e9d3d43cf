//! The accept loop: each connection served by hyper's HTTP/1 server with a bound on how long a
//! request's head may take to arrive (axum's `serve` sets none, so a client sending its
//! headers a byte at a time held a connection place for as long as it liked), and a graceful
//! shutdown that lets requests in flight finish.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tower_service::Service as _;

/// Serves `app` on every connection `listener` accepts until `shutdown` resolves, then waits
/// for the connections' requests in flight. A connection whose request head does not arrive
/// within `header_read_timeout` is closed (an idle keep-alive connection too).
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) where
    L: Listener<Addr = SocketAddr>,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            // A router is cheap to clone (its routes are shared) and always ready.
            app.clone().call(request.map(axum::body::Body::new))
        });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let connection = http.serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}
