//! TLS for the API, with rustls: a certificate chain and a private key from PEM files. Each
//! connection's handshake runs on its own task, bounded in time, so a client that never
//! finishes one holds up nobody else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::connections::{Capped, CappedListener};

/// How long a client may take to finish its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPTED_BACKLOG: usize = 64;
/// Handshakes under way at once: one more connection waits to be accepted.
const CONCURRENT_HANDSHAKES: usize = 256;

/// Where the API's certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate chain, PEM, leaf first.
    pub certificate: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub private_key: PathBuf,
}

impl TlsConfig {
    /// The rustls acceptor for this certificate and key; an error names the file at fault.
    pub(crate) fn acceptor(&self) -> Result<TlsAcceptor, String> {
        let shown = |path: &PathBuf| path.display().to_string();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.certificate)
            .and_then(|certs| certs.collect())
            .map_err(|e| format!("TLS certificate `{}`: {e}", shown(&self.certificate)))?;
        if chain.is_empty() {
            return Err(format!(
                "TLS certificate `{}` holds no certificate",
                shown(&self.certificate)
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.private_key)
            .map_err(|e| format!("TLS key `{}`: {e}", shown(&self.private_key)))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("TLS certificate and key do not fit together: {e}"))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// A TLS connection, holding its place among the open connections.
pub(crate) type Connection = TlsStream<Capped<TcpStream>>;

/// A listener that hands the server only connections that finished their handshake.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(Connection, SocketAddr)>,
    address: SocketAddr,
    _accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: CappedListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let address = axum::serve::Listener::local_addr(&listener)?;
        let (handshaken, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        let accepting = tokio::spawn(accept_all(listener, acceptor, handshaken));
        Ok(Self {
            accepted,
            address,
            _accepting: accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self._accepting.abort();
    }
}

async fn accept_all(
    mut listener: CappedListener,
    acceptor: TlsAcceptor,
    handshaken: mpsc::Sender<(Connection, SocketAddr)>,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_HANDSHAKES));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = axum::serve::Listener::accept(&mut listener).await;
        let (acceptor, handshaken) = (acceptor.clone(), handshaken.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let _ = handshaken.send((stream, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake not finished in time"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (the runtime is stopping): nothing more arrives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}
