//! A cap on open connections: the listener takes one more only when one of
//! `max_connections` places is free, and a connection holds its place until it closes. Idle
//! or slow clients can then occupy the API's places, but never the process's file
//! descriptors, which the store needs too.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection, with its place.
pub(crate) struct Capped<S> {
    stream: S,
    _place: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A TCP listener that accepts only while a place is free.
pub(crate) struct CappedListener {
    listener: TcpListener,
    places: Arc<Semaphore>,
}

impl CappedListener {
    pub(crate) fn new(listener: TcpListener, max_connections: usize) -> Self {
        Self {
            listener,
            places: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = Capped<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed: acquiring fails only if it were.
        let Ok(place) = self.places.clone().acquire_owned().await else {
            return std::future::pending().await;
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    let capped = Capped {
                        stream,
                        _place: place,
                    };
                    return (capped, peer);
                }
                Err(error) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}
